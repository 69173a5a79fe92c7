"""Row tiles: how a kernel loads all heads of an edge's row, and how big the tiles are.

An edge's ``k_j`` / ``v_j`` come in as one contiguous ``H * W`` row (a
``[BLOCK_E, BLOCK_H, BLOCK_W]`` tile), so its ``col`` is loaded once for every
head, rather than ``H`` programs that each reload ``col`` and gather
``W``-long pieces. The host picks the block sizes from the head shape and
the plan (:func:`_blocks`).
"""

from __future__ import annotations

import os
from typing import NamedTuple

import triton
import triton.language as tl

from ..chunks import TritonPlan

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
# Scalars Triton must not specialise on (== 1, multiple of 16): a new seed, or
# a new graph size, must not compile a new kernel.
_NO_SPECIALISE = ["n_seg", "n_slots", "seed_lo", "seed_hi", "drop_offset", "drop_threshold"]


@triton.jit
def _rows(rows, emask, hs, hmask, W: tl.constexpr, BLOCK_W: tl.constexpr, H):
    """Offsets and mask of ``[BLOCK_E, BLOCK_H, BLOCK_W]``: all heads of the rows
    ``rows`` of an ``[*, H, W]`` tensor, one contiguous ``H * W`` row per edge."""
    ws = tl.arange(0, BLOCK_W)
    mask = emask[:, None, None] & hmask[None, :, None] & (ws < W)[None, None, :]
    offs = rows[:, None, None] * (H * W) + hs[None, :, None] * W + ws[None, None, :]
    return offs, mask


@triton.jit
def _load_rows(base_ptr, rows, emask, hs, hmask, W: tl.constexpr, BLOCK_W: tl.constexpr, H):
    offs, mask = _rows(rows, emask, hs, hmask, W, BLOCK_W, H)
    return tl.load(base_ptr + offs, mask=mask, other=0.0)


class _Blocks(NamedTuple):
    block_e: int
    block_h: int
    block_c: int
    block_cv: int
    num_warps: int
    block_f: int = 1


def _block_e(num_edges: int, n: int, tile: int, chunk: int | None) -> int:
    """Edges per tile: ``[BLOCK_E, H, C]`` tiles of about 4096 elements on a GPU
    (the k and v tiles then fit the registers of 4 warps), no longer than the
    mean degree needs or the chunk; 8 rows under the interpreter, which pays per op."""
    cap = 8 if _INTERPRET else max(2, 4096 // tile)
    if chunk is not None:
        cap = min(cap, max(2, triton.next_power_of_2(chunk)))
    mean = -(-num_edges // max(n, 1))
    return min(max(triton.next_power_of_2(max(mean, 1)), 2), cap)


def _tile(h: int, c: int, cv: int) -> tuple[int, int, int, int]:
    block_h = triton.next_power_of_2(max(h, 1))
    block_c, block_cv = triton.next_power_of_2(max(c, 1)), triton.next_power_of_2(max(cv, 1))
    return block_h, block_c, block_cv, block_h * max(block_c, block_cv)


def _blocks(pl: TritonPlan, h: int, c: int, cv: int, block_e: int | None, f: int = 0) -> _Blocks:
    """Block sizes of one launch; ``f`` the edge-feature width (0 without them)."""
    block_h, block_c, block_cv, tile = _tile(h, c, cv)
    # The edge features' [BLOCK_E, BLOCK_H, BLOCK_F] products count like a row tile.
    block_f = triton.next_power_of_2(max(f, 1))
    tile = max(tile, block_h * block_f)
    if block_e is None:
        block_e = _block_e(pl.num_edges, pl.num_rows, tile, pl.chunk)
    if block_e < 1 or block_e & (block_e - 1):
        raise ValueError(f"Expected 'block_e' a power of two, got {block_e}")
    num_warps = 4 if block_e * tile <= 4096 else 8
    return _Blocks(block_e, block_h, block_c, block_cv, num_warps, block_f)


@triton.jit
def _load_feats(ea_ptr, edges, emask, F: tl.constexpr, BLOCK_F: tl.constexpr):
    """The raw edge features ``[BLOCK_E, BLOCK_F]`` of the CSR positions ``edges``
    (one contiguous ``F`` row per edge, shared by every head). ``fs < F`` masks the
    padding to ``BLOCK_F``, ``emask`` the block's tail; both load 0, so they add
    nothing to a score or a sum."""
    fs = tl.arange(0, BLOCK_F)
    mask = emask[:, None] & (fs < F)[None, :]
    return tl.load(ea_ptr + edges[:, None] * F + fs[None, :], mask=mask, other=0.0)


@triton.jit
def _load_head_feats(base_ptr, i, hs, hmask, H, F: tl.constexpr, BLOCK_F: tl.constexpr):
    """Row ``i`` ``[BLOCK_H, BLOCK_F]`` of an ``[N, H, F]`` tensor (``edge_query``,
    ``grad_edge_out``); padded heads and features load 0."""
    fs = tl.arange(0, BLOCK_F)
    mask = hmask[:, None] & (fs < F)[None, :]
    return tl.load(base_ptr + i * (H * F) + hs[:, None] * F + fs[None, :], mask=mask, other=0.0)
