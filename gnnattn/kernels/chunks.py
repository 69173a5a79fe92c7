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

:func:`chunk_plan` is torch on the device and never copies to the host: grid
sizes are upper bounds known from ``N`` and ``E`` alone (``N + E // CHUNK``
slots; at most ``2 * (E // CHUNK)`` chunks belong to split segments, since a
segment longer than ``CHUNK`` has at most twice ``L // CHUNK`` chunks), and
slots past the real work carry a sentinel the kernels skip.

:func:`plan` is what a graph keeps per CSR: the checks (made here, once, with
host synchronisations) and the chunk plan. Its chunk size depends on nothing
but the graph (not on the head count, the head dims or the dtype), so one
plan per CSR serves every layer and every call. :func:`chunk_range` is the
kernels' common prologue: from a slot, its segment and edge range.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from .common import acc_dtype, check_index, check_ptr

__all__ = [
    "DEFAULT_CHUNK",
    "ChunkPlan",
    "TritonPlan",
    "acc_tl",
    "check_grid",
    "chunk_plan",
    "chunk_range",
    "plan",
    "plan_from_tensors",
    "plan_tensors",
]

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

#: Edges per chunk of a plan made without ``chunk=``: typical targets finish
#: in one program, hubs are spread over many. 64 under the interpreter, which
#: pays per op, so that the tests' small graphs still split.
DEFAULT_CHUNK = 64 if _INTERPRET else 256


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


def check_grid(slots: int) -> None:
    """Raise unless a launch of ``slots`` programs fits the grid's first axis."""
    if slots >= 2**31:
        raise ValueError(
            f"Expected fewer than 2**31 work slots (segments + edges / chunk), got {slots}; "
            f"pass a larger chunk"
        )


class TritonPlan(NamedTuple):
    """A checked CSR and its chunk plan: what the Triton kernels need per graph.

    Made by :func:`plan`, once per graph and layout (the destination CSR, or
    the transposed one for the ``dk``/``dv`` pass); it depends on nothing
    else, so a caller keys it on the CSR alone.

    Attributes:
        ptr: ``[N + 1]`` int64 CSR pointers, contiguous.
        col: ``[E]`` int32 or int64 column ids, contiguous, in ``[0, num_cols)``.
        num_cols: the bound the ids were checked against.
        chunk: the most edges one program walks.
        chunks: the cut (:func:`chunk_plan` with ``chunk``).
    """

    ptr: Tensor
    col: Tensor
    num_cols: int
    chunk: int
    chunks: ChunkPlan

    @property
    def num_rows(self) -> int:
        return self.ptr.numel() - 1

    @property
    def num_edges(self) -> int:
        return self.col.numel()


def plan(
    ptr: Tensor,
    col: Tensor,
    num_cols: int,
    *,
    perm: Tensor | None = None,
    chunk: int | None = None,
) -> TritonPlan:
    """Check a CSR once and cut it into chunks for the kernels.

    The only function here that reads index values on the host (the checks
    of :func:`~gnnattn.kernels.common.check_ptr` and
    :func:`~gnnattn.kernels.common.check_index`); the kernels given its
    result check shapes alone.

    Args:
        ptr: ``[N + 1]`` int64 CSR pointers.
        col: ``[E]`` int32 or int64 column ids (sources; targets for the
            transposed CSR).
        num_cols: ids must be in ``[0, num_cols)``.
        perm: for a transposed CSR, its ``tperm`` (CSR position of each
            entry), checked to lie in ``[0, E)`` once here, as every
            kernel module's ``plan`` does.
        chunk: the most edges one program walks (default
            :data:`DEFAULT_CHUNK`); the same for every head count and dtype.

    Raises:
        TypeError, ValueError: on a malformed ``ptr`` or ids out of range.

    Example:
        >>> p = plan(torch.tensor([0, 2, 2, 3]), torch.tensor([1, 0, 1]), 2, chunk=4)
        >>> p.num_rows, p.num_edges, p.chunks.grid
        (3, 3, 3)
    """
    check_index(col, num_cols)
    check_ptr(ptr, col.numel())
    if perm is not None:
        check_index(perm, col.numel(), "perm")
    if col.device != ptr.device:
        raise ValueError(f"Expected 'col' on the device of 'ptr' ({ptr.device}), got {col.device}")
    chunk = DEFAULT_CHUNK if chunk is None else chunk
    if not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"Expected 'chunk' a positive int, got {chunk!r}")
    ptr, col = ptr.contiguous(), col.contiguous()
    chunks = chunk_plan(ptr, col.numel(), chunk)
    check_grid(chunks.grid)
    return TritonPlan(ptr, col, int(num_cols), chunk, chunks)


def plan_tensors(
    ptr: Tensor, col: Tensor, num_cols: int, *, perm: Tensor | None = None, check: bool = True
) -> Tensor:
    """:func:`plan` as the operators take it: the chunk tables ``chunk_ptr``,
    ``chunk_seg``, ``split`` and ``rank`` in one int64 tensor, at
    :data:`DEFAULT_CHUNK` (their lengths follow from ``N`` and ``E``, so the
    device is never read for them), each padded to an even length. The indices
    are checked (a host read) unless ``check=False``, for indices known to be
    valid."""
    if check:
        ch = plan(ptr, col, num_cols, perm=perm).chunks
    else:
        ch = chunk_plan(ptr.contiguous(), col.numel(), DEFAULT_CHUNK)
        check_grid(ch.grid)
    tables = [ch.chunk_ptr, ch.chunk_seg, ch.split, ch.rank]
    return torch.cat([torch.nn.functional.pad(t, (0, t.numel() & 1)) for t in tables])


def plan_from_tensors(
    ptr: Tensor, col: Tensor, num_cols: int, packed: Tensor, *, perm: Tensor | None = None
) -> TritonPlan:
    """The :class:`TritonPlan` of :func:`plan_tensors`' result (views; nothing is read on
    the host)."""
    n, e = ptr.numel() - 1, col.numel()
    grid, split_grid = n + e // DEFAULT_CHUNK, 2 * (e // DEFAULT_CHUNK) + 1
    sizes = [n + 1, grid, split_grid, grid]
    # Each table starts at a multiple of 16 bytes: Triton keys its compiled kernels on
    # their pointers' 16-byte alignment, which would otherwise follow the parity of N
    # and E and compile each kernel up to four times as graphs change.
    padded = packed.split([x + (x & 1) for x in sizes])
    chunk_ptr, chunk_seg, split, rank = (t[:x] for t, x in zip(padded, sizes, strict=True))
    chunks = ChunkPlan(chunk_ptr, chunk_seg, grid, split, rank, split_grid)
    return TritonPlan(ptr.contiguous(), col.contiguous(), int(num_cols), DEFAULT_CHUNK, chunks)


def acc_tl(dtype: torch.dtype) -> tl.dtype:
    """The Triton twin of :func:`~gnnattn.kernels.common.acc_dtype`."""
    return tl.float64 if acc_dtype(dtype) == torch.float64 else tl.float32


@triton.jit
def chunk_range(slot, n_slots, ptr_ptr, chunk_ptr_ptr, chunk_seg_ptr, n_seg, CHUNK: tl.constexpr):
    """The prologue of every chunk walk: the slot's segment, edge range and split flag.

    Returns ``(seg, start, end, split)``: the segment (``n_seg`` for a slot
    past the work, which the caller skips), its edges ``start:end`` (at most
    ``CHUNK``) and whether the segment has more than one chunk. Slots at or
    past ``n_slots`` read as sentinels; the loads stay in bounds for them.
    """
    seg = tl.load(chunk_seg_ptr + slot, mask=slot < n_slots, other=n_seg)
    s = tl.minimum(seg, n_seg - 1)  # a sentinel's reads stay in bounds (unused)
    c0 = tl.load(chunk_ptr_ptr + s)
    split = tl.load(chunk_ptr_ptr + s + 1) - c0 > 1
    start = tl.load(ptr_ptr + s) + (slot - c0) * CHUNK
    end = tl.minimum(start + CHUNK, tl.load(ptr_ptr + s + 1))
    return seg, start, end, split
