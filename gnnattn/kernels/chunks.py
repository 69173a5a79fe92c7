"""Work plans for the Triton kernels: CSR segments cut into chunks, split segments listed.

Every Triton kernel in :mod:`gnnattn.kernels` walks the segments of a CSR
(the incoming edges of a target, or in the ``dk``/``dv`` pass the outgoing
edges of a source). A segment of ``L`` edges is cut into
``max(1, ceil(L / CHUNK))`` chunks and each chunk is one grid slot, so a hub
with millions of edges is spread over many programs instead of serialising
one (FlashDecoding's split-K; DF-GNN's super-node scheduling). A chunk of a
segment that has only one finishes its segment in place; the chunks of a
*split* segment leave partial results, which a combine kernel merges once per
segment (linear in the number of chunks) before, for the softmax, a last pass
over the split chunks only.

Everything here is torch on the device and never copies to the host: grid
sizes are upper bounds known from ``N`` and ``E`` alone (``N + E // CHUNK``
slots; at most ``2 * (E // CHUNK)`` chunks belong to split segments, since a
segment longer than ``CHUNK`` has at most twice ``L // CHUNK`` chunks), and
slots past the real work carry a sentinel the kernels skip.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

__all__ = ["ChunkPlan", "chunk_plan"]


class ChunkPlan(NamedTuple):
    """How a CSR is cut into chunks (all tensors int64 on the CSR's device).

    Attributes:
        chunk_ptr: ``[N + 1]``; the chunks of segment ``i`` are the slots
            ``chunk_ptr[i]:chunk_ptr[i + 1]`` (an empty segment has one).
        chunk_seg: ``[grid]``; the segment of each slot, ``N`` past the last.
        grid: the number of slots, a multiple of the slots per program.
        split: ``[split_grid]``; the slots of the chunks of split segments,
            in order, then ``grid`` (a sentinel) up to the bound.
        rank: ``[grid]``; the position of a slot in ``split``, or -1: where a
            split chunk keeps its partials (arrays of ``split_grid`` rows).
        split_grid: the length of ``split``, ``2 * (E // CHUNK) + 1``.
    """

    chunk_ptr: Tensor
    chunk_seg: Tensor
    grid: int
    split: Tensor
    rank: Tensor
    split_grid: int


def chunk_plan(ptr: Tensor, num_edges: int, chunk: int, slots_per_program: int = 1) -> ChunkPlan:
    """Cut every CSR segment of ``ptr`` into chunks of at most ``chunk`` edges.

    Args:
        ptr: ``[N + 1]`` int64 CSR pointers.
        num_edges: ``E = ptr[-1]``, passed so that nothing syncs with the device.
        chunk: the most edges one chunk holds.
        slots_per_program: the grid is rounded up to a multiple of this.

    Example:
        >>> p = chunk_plan(torch.tensor([0, 0, 5, 6]), 6, 2)
        >>> p.chunk_ptr.tolist(), p.chunk_seg.tolist(), p.grid
        ([0, 1, 4, 5], [0, 1, 1, 1, 2, 3], 6)
        >>> p.split.tolist(), p.rank.tolist()
        ([1, 2, 3, 6, 6, 6, 6], [-1, 0, 1, 2, -1, -1])
    """
    n = ptr.numel() - 1
    dev = ptr.device
    counts = ptr.diff()
    n_chunks = torch.clamp((counts + (chunk - 1)) // chunk, min=1)  # (N,)
    chunk_ptr = torch.zeros(n + 1, dtype=torch.int64, device=dev)
    torch.cumsum(n_chunks, 0, out=chunk_ptr[1:])
    grid = n + num_edges // chunk
    grid = -(-grid // slots_per_program) * slots_per_program
    slots = torch.arange(grid, dtype=torch.int64, device=dev)
    chunk_seg = torch.searchsorted(chunk_ptr, slots, right=True) - 1  # (grid,), N past the end
    # Chunks of split segments, compacted without a host sync: each one's rank
    # is a running count; the others are scattered into a dump slot.
    per_slot = torch.cat([n_chunks, n_chunks.new_zeros(1)])[chunk_seg]  # (grid,)
    is_split = per_slot > 1
    split_grid = 2 * (num_edges // chunk) + 1
    rank = torch.where(is_split, torch.cumsum(is_split, 0) - 1, -1)  # (grid,)
    dest = torch.where(is_split, rank, split_grid)
    split = torch.full((split_grid + 1,), grid, dtype=torch.int64, device=dev)
    split.scatter_(0, dest, slots)
    return ChunkPlan(chunk_ptr, chunk_seg, grid, split[:split_grid], rank, split_grid)
