"""Triton segment softmax over a destination-sorted CSR graph, forward and backward.

Implements :func:`gnnattn.kernels.reference.segment_softmax_fwd` and
:func:`~gnnattn.kernels.reference.segment_softmax_bwd` for ``src`` ``[E, H]``
(``[E]`` and ``[E, ...]`` are viewed as ``[E, H]``) and ``ptr`` int64 ``[N + 1]``.
float16/bfloat16/float32 inputs reduce in float32 (float64 in float64); the
result has the input's dtype.

Work split across programs
--------------------------
Every segment (the incoming edges of one target) is cut into chunks of at
most ``CHUNK = BLOCK_E * SPLIT_BLOCKS`` edges by
:func:`gnnattn.kernels.chunks.chunk_plan` (or of the ``chunk`` of a ``plan=``
from :func:`gnnattn.kernels.chunks.plan`, made once per graph); one chunk is one grid slot, so a
hub of a power-law graph is spread over many programs instead of serialising
the launch. A program takes ``SLOTS`` consecutive slots (several small
segments per program, so each moves about 2K elements; one under the
interpreter) for a ``BLOCK_H``-wide block of heads. The defaults are
``BLOCK_E = clamp(next_pow2(E / N), 16, 2048 // BLOCK_H)`` (32 at most under
the interpreter) and ``SPLIT_BLOCKS = 8``; ``num_warps`` is sized to the tile
(256 elements a warp, 1 to 8). ``block_e`` and ``split_blocks`` can be passed.

* Pass 1 (``_softmax_fwd_chunk``): one read of the chunk with an online
  max/sum (running max ``m``, sum rescaled by ``exp(m_old - m_new)``). A
  segment of one chunk is finished in the same program (normalise and write);
  a split segment's chunk stores its partial ``(m, s)`` per head.
* Combine (``_softmax_combine``), launched only when a segment can be split
  (``E > CHUNK``), over the list of split chunks only: the program of each
  split segment's first chunk merges the segment's partials once
  (``M = max m_c``, ``S = sum s_c exp(m_c - M)``): linear in the chunks.
* Pass 2 (``_softmax_fwd_split``), over the split chunks only: each
  normalises its rows with its segment's ``(M, S)``.

The backward has the same three steps with the partial ``sum_seg(g * y)``
instead of ``(m, s)``, then ``dx = y * (g - sum_seg(g * y))``. Grid sizes are
bounds known without a host sync (:mod:`gnnattn.kernels.chunks`).

Masks
-----
* ``rows < end``: the tail of the last block of a chunk (the next segment's
  rows, or past ``E``). Masked loads read ``-inf`` for the forward (it takes
  part in no max and ``exp`` makes it 0) and ``0`` for the backward.
* ``heads < H``: the head padding of ``BLOCK_H`` (``H`` need not be a power
  of two).
* ``seg < N`` (a scalar branch): the grid slots past the last chunk.
* Empty or all ``-inf`` segments: the running max stays ``-inf``; the kernels
  then shift by 0 instead of by the max, as the reference does (``-inf - -inf``
  would be NaN), so every ``exp`` is 0, the sum is 0 and the division is by 1:
  all-zero weights and gradients, never NaN.
* NaN: only a sum that *equals* 0 is replaced by 1 (``s == 0``, not
  ``s > 0``, which a NaN sum fails): a NaN score makes its segment's sum NaN
  and every weight of that segment NaN, as in
  :func:`~gnnattn.kernels.reference.segment_softmax`.

All offsets are int64 (``ptr`` is int64 and the program id is widened before
use), so ``E * H`` may pass ``2**31``.

Memory traffic per element
--------------------------
Forward: a chunk that fits in one ``BLOCK_E`` tile (every segment of at most
``BLOCK_E`` edges) is read once and kept in registers, so the kernel moves
``2 * itemsize`` bytes per element (8 for float32), the minimum. Longer chunks are
read twice (statistics, then normalise); the second read of a chunk of at most
``CHUNK * H * itemsize`` bytes is meant to come from L2. Backward: ``y`` and
``g`` read (twice beyond one tile), ``dx`` written: ``3 * itemsize`` in the best
case. The partials cost ``O(chunks * H)`` floats, next to nothing. Loops over a
chunk are ``while`` loops (see below), which Triton does not software-pipeline;
latency is hidden by the many programs in flight instead.

Why ``while`` and not ``range``: Triton 3.6's interpreter turns a loaded
loop bound into a Python ``int`` with ``int(ndarray)`` of a one-element 1-D
array, which NumPy 2 rejects; a ``while`` loop goes through ``bool`` instead,
which it handles, and compiles to ``scf.while``.

Tested under ``TRITON_INTERPRET=1`` on CPU against the reference (split and
unsplit segments, all ``-inf`` across a split, fp16 logits near 6e4); the
tests also compile every kernel for sm_90 offline (that they lower, and that
no float32 scalar reaches a float64 kernel). ``.ci/gpu`` runs them on a GPU
(the H200 figures are in ``docs/gpu.md``). Compiled kernels do not bounds-check: without
a ``plan=`` the host entry points check ``ptr`` (from 0 to ``E``,
non-decreasing; a host synchronisation) before any launch; with one they
check shapes only and never synchronise.
"""

from __future__ import annotations

import math
import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from . import reference
from .chunks import ChunkPlan, TritonPlan, acc_tl, chunk_plan, chunk_range
from .common import acc_dtype, check_ptr

__all__ = ["segment_softmax_bwd", "segment_softmax_fwd"]

# The graph's sizes: Triton would specialise on a value of 1 or a multiple of 16,
# compiling the kernels anew as graphs change.
_NO_SPECIALISE = ["n_seg", "n_slots"]

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit(do_not_specialize=_NO_SPECIALISE)
def _softmax_fwd_chunk(
    x_ptr,  # [E, H] input scores
    y_ptr,  # [E, H] output weights (input dtype)
    ptr_ptr,  # [N + 1] int64 CSR pointers
    chunk_ptr_ptr,  # [N + 1] int64: the chunks of segment i are chunk_ptr[i]:chunk_ptr[i+1]
    chunk_seg_ptr,  # [G] int64: the segment of each chunk slot (N past the last chunk)
    rank_ptr,  # [G] int64: where a split chunk keeps its partials (-1 otherwise)
    part_m_ptr,  # [S, H] partial max of split chunks, by rank
    part_s_ptr,  # [S, H] partial sum, relative to the partial max
    n_seg,
    n_slots,  # G
    H,
    ACC: tl.constexpr,  # accumulation dtype (float32, or float64 for float64 inputs)
    BLOCK_E: tl.constexpr,
    BLOCK_H: tl.constexpr,
    CHUNK: tl.constexpr,
    SLOTS: tl.constexpr,  # chunk slots per program: small segments share a program
):
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = heads < H  # the head padding of BLOCK_H
    for t in tl.static_range(SLOTS):
        c = tl.program_id(0).to(tl.int64) * SLOTS + t
        seg, start, end, split = chunk_range(
            c, n_slots, ptr_ptr, chunk_ptr_ptr, chunk_seg_ptr, n_seg, CHUNK
        )
        if seg < n_seg:  # grid slots past the last chunk do nothing
            # First tile, kept in registers: a chunk of at most BLOCK_E rows is
            # read from memory exactly once.
            rows0 = start + tl.arange(0, BLOCK_E)
            mask0 = (rows0 < end)[:, None] & hmask[None, :]  # rows of this chunk only
            offs0 = rows0[:, None] * H + heads[None, :]
            x0 = tl.load(x_ptr + offs0, mask=mask0, other=float("-inf")).to(ACC)
            m = tl.max(x0, 0)
            # Shift by 0 where the max is -inf (empty / all -inf): no -inf - -inf.
            m_safe = tl.where(m == float("-inf"), 0.0, m)
            s = tl.sum(tl.exp(x0 - m_safe[None, :]), 0)
            b = start + BLOCK_E
            while b < end:  # online max/sum over the rest of the chunk
                rows = b + tl.arange(0, BLOCK_E)
                mask = (rows < end)[:, None] & hmask[None, :]
                x = tl.load(
                    x_ptr + rows[:, None] * H + heads[None, :], mask=mask, other=float("-inf")
                ).to(ACC)
                m_new = tl.maximum(m, tl.max(x, 0))
                m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
                # exp(-inf - finite) = 0: a running sum that was empty stays 0.
                s = s * tl.exp(m - m_safe) + tl.sum(tl.exp(x - m_safe[None, :]), 0)
                m = m_new
                b += BLOCK_E

            if split:
                # A split segment: leave the partials for the combine kernel.
                r = tl.load(rank_ptr + c)
                tl.store(part_m_ptr + r * H + heads, m, mask=hmask)
                tl.store(part_s_ptr + r * H + heads, s, mask=hmask)
            else:
                # The whole segment is here: normalise and write. Only a zero
                # sum (every exp 0) is replaced: a NaN sum stays NaN.
                inv = 1.0 / tl.where(s == 0, 1.0, s)
                y0 = tl.exp(x0 - m_safe[None, :]) * inv[None, :]
                tl.store(y_ptr + offs0, y0.to(y_ptr.dtype.element_ty), mask=mask0)
                b = start + BLOCK_E
                while b < end:
                    rows = b + tl.arange(0, BLOCK_E)
                    mask = (rows < end)[:, None] & hmask[None, :]
                    o = rows[:, None] * H + heads[None, :]
                    x = tl.load(x_ptr + o, mask=mask, other=float("-inf")).to(ACC)
                    y = tl.exp(x - m_safe[None, :]) * inv[None, :]
                    tl.store(y_ptr + o, y.to(y_ptr.dtype.element_ty), mask=mask)
                    b += BLOCK_E


@triton.jit(do_not_specialize=["n_slots"])
def _softmax_combine(
    split_ptr,  # [S] int64: slots of split chunks, then the sentinel G
    chunk_ptr_ptr,
    chunk_seg_ptr,
    rank_ptr,
    part_a_ptr,  # [S, H] partial max (forward) or partial sum(g * y) (backward)
    part_b_ptr,  # [S, H] partial sum relative to the max (forward; unused backward)
    n_slots,
    H,
    IS_MAX: tl.constexpr,  # forward: (max, sum) pairs; backward: plain sums
    ACC: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """Merge the partials of each split segment once, into its first chunk's row.

    Only the program of a segment's first chunk works, so each partial is read
    once: linear in the number of chunks.
    """
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = heads < H
    slot = tl.load(split_ptr + tl.program_id(0))
    if slot < n_slots:
        seg = tl.load(chunk_seg_ptr + slot)
        c0 = tl.load(chunk_ptr_ptr + seg)
        if slot == c0:
            c1 = tl.load(chunk_ptr_ptr + seg + 1)
            r0 = tl.load(rank_ptr + c0)
            a = tl.load(part_a_ptr + r0 * H + heads, mask=hmask, other=0.0)
            bsum = tl.load(part_b_ptr + r0 * H + heads, mask=hmask, other=0.0)
            cc = c0 + 1
            while cc < c1:
                # The chunks of one segment are consecutive slots with
                # consecutive ranks.
                r = r0 + (cc - c0)
                pa = tl.load(part_a_ptr + r * H + heads, mask=hmask, other=0.0)
                if IS_MAX:
                    pb = tl.load(part_b_ptr + r * H + heads, mask=hmask, other=0.0)
                    m_new = tl.maximum(a, pa)
                    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
                    # exp(-inf - x) = 0: an all -inf side adds nothing.
                    bsum = bsum * tl.exp(a - m_safe) + pb * tl.exp(pa - m_safe)
                    a = m_new
                else:
                    a += pa
                cc += 1
            if IS_MAX:
                # Stored relative to the safe shift, as the normalize pass uses it.
                a_safe = tl.where(a == float("-inf"), 0.0, a)
                tl.store(part_a_ptr + r0 * H + heads, a_safe, mask=hmask)
                tl.store(part_b_ptr + r0 * H + heads, bsum, mask=hmask)
            else:
                tl.store(part_a_ptr + r0 * H + heads, a, mask=hmask)


@triton.jit(do_not_specialize=_NO_SPECIALISE)
def _softmax_fwd_split(
    x_ptr,
    y_ptr,
    ptr_ptr,
    split_ptr,
    chunk_ptr_ptr,
    chunk_seg_ptr,
    rank_ptr,
    part_m_ptr,
    part_s_ptr,
    n_seg,
    n_slots,
    H,
    ACC: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_H: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """Normalise one chunk of a split segment with the segment's combined (max, sum)."""
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = heads < H
    c = tl.load(split_ptr + tl.program_id(0))  # the sentinel n_slots past the list
    seg, start, end, _ = chunk_range(
        c, n_slots, ptr_ptr, chunk_ptr_ptr, chunk_seg_ptr, n_seg, CHUNK
    )
    if seg < n_seg:
        r0 = tl.load(rank_ptr + tl.load(chunk_ptr_ptr + seg))  # the segment's first chunk
        m_safe = tl.load(part_m_ptr + r0 * H + heads, mask=hmask, other=0.0)
        s = tl.load(part_s_ptr + r0 * H + heads, mask=hmask, other=1.0)
        inv = 1.0 / tl.where(s == 0, 1.0, s)  # a NaN sum stays NaN
        b = start
        while b < end:
            rows = b + tl.arange(0, BLOCK_E)
            mask = (rows < end)[:, None] & hmask[None, :]
            o = rows[:, None] * H + heads[None, :]
            x = tl.load(x_ptr + o, mask=mask, other=float("-inf")).to(ACC)
            y = tl.exp(x - m_safe[None, :]) * inv[None, :]
            tl.store(y_ptr + o, y.to(y_ptr.dtype.element_ty), mask=mask)
            b += BLOCK_E


@triton.jit(do_not_specialize=_NO_SPECIALISE)
def _softmax_bwd_chunk(
    y_ptr,  # [E, H] forward output
    g_ptr,  # [E, H] incoming gradient
    dx_ptr,  # [E, H] gradient of the scores
    ptr_ptr,
    chunk_ptr_ptr,
    chunk_seg_ptr,
    rank_ptr,
    part_d_ptr,  # [S, H] partial sum(g * y) of split chunks, by rank
    n_seg,
    n_slots,
    H,
    ACC: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_H: tl.constexpr,
    CHUNK: tl.constexpr,
    SLOTS: tl.constexpr,
):
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = heads < H
    for t in tl.static_range(SLOTS):
        c = tl.program_id(0).to(tl.int64) * SLOTS + t
        seg, start, end, split = chunk_range(
            c, n_slots, ptr_ptr, chunk_ptr_ptr, chunk_seg_ptr, n_seg, CHUNK
        )
        if seg < n_seg:
            rows0 = start + tl.arange(0, BLOCK_E)
            mask0 = (rows0 < end)[:, None] & hmask[None, :]
            offs0 = rows0[:, None] * H + heads[None, :]
            # Masked lanes read 0 and so add nothing to sum(g * y).
            y0 = tl.load(y_ptr + offs0, mask=mask0, other=0.0).to(ACC)
            g0 = tl.load(g_ptr + offs0, mask=mask0, other=0.0).to(ACC)
            d = tl.sum(y0 * g0, 0)
            b = start + BLOCK_E
            while b < end:
                rows = b + tl.arange(0, BLOCK_E)
                mask = (rows < end)[:, None] & hmask[None, :]
                o = rows[:, None] * H + heads[None, :]
                y = tl.load(y_ptr + o, mask=mask, other=0.0).to(ACC)
                g = tl.load(g_ptr + o, mask=mask, other=0.0).to(ACC)
                d += tl.sum(y * g, 0)
                b += BLOCK_E

            if split:
                r = tl.load(rank_ptr + c)
                tl.store(part_d_ptr + r * H + heads, d, mask=hmask)
            else:
                dx0 = y0 * (g0 - d[None, :])
                tl.store(dx_ptr + offs0, dx0.to(dx_ptr.dtype.element_ty), mask=mask0)
                b = start + BLOCK_E
                while b < end:
                    rows = b + tl.arange(0, BLOCK_E)
                    mask = (rows < end)[:, None] & hmask[None, :]
                    o = rows[:, None] * H + heads[None, :]
                    y = tl.load(y_ptr + o, mask=mask, other=0.0).to(ACC)
                    g = tl.load(g_ptr + o, mask=mask, other=0.0).to(ACC)
                    dx = y * (g - d[None, :])
                    tl.store(dx_ptr + o, dx.to(dx_ptr.dtype.element_ty), mask=mask)
                    b += BLOCK_E


@triton.jit(do_not_specialize=_NO_SPECIALISE)
def _softmax_bwd_split(
    y_ptr,
    g_ptr,
    dx_ptr,
    ptr_ptr,
    split_ptr,
    chunk_ptr_ptr,
    chunk_seg_ptr,
    rank_ptr,
    part_d_ptr,
    n_seg,
    n_slots,
    H,
    ACC: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_H: tl.constexpr,
    CHUNK: tl.constexpr,
):
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = heads < H
    c = tl.load(split_ptr + tl.program_id(0))
    seg, start, end, _ = chunk_range(
        c, n_slots, ptr_ptr, chunk_ptr_ptr, chunk_seg_ptr, n_seg, CHUNK
    )
    if seg < n_seg:
        r0 = tl.load(rank_ptr + tl.load(chunk_ptr_ptr + seg))
        d = tl.load(part_d_ptr + r0 * H + heads, mask=hmask, other=0.0)
        b = start
        while b < end:
            rows = b + tl.arange(0, BLOCK_E)
            mask = (rows < end)[:, None] & hmask[None, :]
            o = rows[:, None] * H + heads[None, :]
            y = tl.load(y_ptr + o, mask=mask, other=0.0).to(ACC)
            g = tl.load(g_ptr + o, mask=mask, other=0.0).to(ACC)
            tl.store(dx_ptr + o, (y * (g - d[None, :])).to(dx_ptr.dtype.element_ty), mask=mask)
            b += BLOCK_E


# --------------------------------------------------------------------------- host side


class _Blocks(NamedTuple):
    block_e: int
    block_h: int
    chunk: int
    slots: int
    num_warps: int


#: The most heads (columns) one tile spans, so that a tile of the 2K-element budget
#: per program keeps up to 128 edge rows; wider inputs take more head blocks.
_MAX_BLOCK_H = 16


def _blocks(
    e: int,
    n: int,
    h: int,
    block_e: int | None,
    split_blocks: int | None,
    chunk: int | None = None,
) -> _Blocks:
    """Tile sizes; the chunk is ``block_e * split_blocks``, or a plan's ``chunk``."""
    block_h = min(triton.next_power_of_2(max(h, 1)), _MAX_BLOCK_H)
    if block_e is None:
        # One tile per typical segment: the mean degree, rounded up to a power
        # of two, within [16, 2048 // BLOCK_H] rows (32 under the interpreter,
        # which pays per program and per op rather than per lane), and no
        # longer than a plan's chunk.
        cap = 32 if _INTERPRET else max(16, 2048 // block_h)
        if chunk is not None:
            cap = min(cap, max(16, triton.next_power_of_2(chunk)))
        block_e = min(max(triton.next_power_of_2(max(1, -(-e // max(n, 1)))), 16), cap)
    if chunk is None:
        split_blocks = 8 if split_blocks is None else split_blocks
        chunk = block_e * split_blocks
    elif split_blocks is not None:
        raise ValueError("Expected 'split_blocks' or 'plan', not both: the plan fixes the chunk")
    if block_e < 1 or block_e & (block_e - 1) or chunk < 1:
        raise ValueError(
            f"Expected 'block_e' a power of two and 'split_blocks' >= 1, "
            f"got {block_e} and {split_blocks}"
        )
    tile = block_e * block_h
    # Small segments: several per program, so that each program moves about
    # 2K elements (launch and scheduling costs amortised); one under the
    # interpreter. Warps sized to the tile: 256 elements per warp, 1 to 8.
    slots = 1 if _INTERPRET else max(1, min(16, 2048 // tile))
    num_warps = max(1, min(8, tile // 256))
    return _Blocks(block_e, block_h, chunk, slots, num_warps)


def _check(src: Tensor, ptr: Tensor, name: str, plan: TritonPlan | None) -> None:
    """Shapes, dtypes and devices (metadata only); ``ptr``'s values too without a plan."""
    if src.dim() < 1:
        raise ValueError(f"Expected '{name}' of shape [E] or [E, H], got {list(src.shape)}")
    if ptr.dim() != 1 or ptr.dtype != torch.int64:
        raise TypeError(f"Expected 'ptr' int64 of shape [N + 1], got {ptr.dtype} {list(ptr.shape)}")
    if not src.is_floating_point():
        raise TypeError(f"Expected '{name}' floating point, got {src.dtype}")
    if ptr.device != src.device:
        raise ValueError(
            f"Expected 'ptr' on the device of '{name}' ({src.device}), got {ptr.device}"
        )
    if plan is None:
        check_ptr(ptr, src.shape[0])  # reads ptr: one host synchronisation
        return
    if not isinstance(plan, TritonPlan):
        raise TypeError(f"Expected 'plan' from gnnattn.kernels.chunks.plan, got {type(plan)}")
    if (plan.num_rows, plan.num_edges) != (ptr.numel() - 1, src.shape[0]):
        raise ValueError(
            f"Expected 'plan' of a CSR with {ptr.numel() - 1} segments and {src.shape[0]} "
            f"edges, got {plan.num_rows} and {plan.num_edges}"
        )
    if plan.ptr.device != src.device:
        raise ValueError(
            f"Expected 'plan' on the device of '{name}' ({src.device}), got {plan.ptr.device}"
        )


#: The most head blocks a launch takes: CUDA's grid y is at most 65535.
_MAX_HEAD_BLOCKS = 65535


def _too_wide(h: int) -> bool:
    """Whether ``h`` columns (over a million: a softmax along a short dim of a wide
    tensor) need more head blocks than a launch has; those take the torch reference."""
    return triton.cdiv(h, _MAX_BLOCK_H) > _MAX_HEAD_BLOCKS


def _as_2d(t: Tensor) -> Tensor:
    return t.reshape(t.shape[0], math.prod(t.shape[1:])).contiguous()


def _work(
    ptr: Tensor,
    e: int,
    h: int,
    plan: TritonPlan | None,
    block_e: int | None,
    split_blocks: int | None,
) -> tuple[_Blocks, Tensor, ChunkPlan]:
    """Blocks, pointers and chunks: the plan's, or made now (no host sync either way)."""
    n = ptr.numel() - 1
    if plan is None:
        blk = _blocks(e, n, h, block_e, split_blocks)
        ptr = ptr.contiguous()
        return blk, ptr, chunk_plan(ptr, e, blk.chunk, blk.slots)
    blk = _blocks(e, n, h, block_e, split_blocks, plan.chunk)
    return blk, plan.ptr, plan.chunks


def segment_softmax_fwd(
    src: Tensor,
    ptr: Tensor,
    *,
    plan: TritonPlan | None = None,
    block_e: int | None = None,
    split_blocks: int | None = None,
) -> Tensor:
    """Stable softmax of ``src`` ``[E, H]`` within each CSR segment of ``ptr``.

    Args:
        src: ``[E]``, ``[E, H]`` (or ``[E, ...]``, flattened to ``[E, H]``) scores.
        ptr: ``[N + 1]`` int64 CSR pointers; ``ptr[-1]`` must be ``E``.
        plan: :func:`gnnattn.kernels.chunks.plan` of this CSR: then ``ptr``
            is not read on the host (no synchronisation) and the plan's
            chunks are used.
        block_e: rows per tile (a power of two); default from the mean degree.
        split_blocks: a segment longer than ``block_e * split_blocks`` edges is
            split across programs (default 8; not with ``plan``).

    Returns:
        The weights, shaped and typed like ``src``.

    Raises:
        ValueError: when ``ptr`` does not describe ``E`` edges.
    """
    _check(src, ptr, "src", plan)
    x = _as_2d(src)
    e, h = x.shape
    n = ptr.numel() - 1
    y = torch.empty_like(x)
    if e == 0 or h == 0 or n <= 0:
        return y.view_as(src)
    if _too_wide(h):
        acc = acc_dtype(x.dtype)
        return reference.segment_softmax_fwd(x.to(acc), ptr).to(x.dtype).view_as(src)
    blk, ptr, chunks = _work(ptr, e, h, plan, block_e, split_blocks)
    acc_t = acc_dtype(x.dtype)
    part_m = torch.empty((chunks.split_grid, h), dtype=acc_t, device=x.device)
    part_s = torch.empty_like(part_m)
    heads = triton.cdiv(h, blk.block_h)
    meta = dict(ACC=acc_tl(x.dtype), BLOCK_E=blk.block_e, BLOCK_H=blk.block_h)
    _softmax_fwd_chunk[(triton.cdiv(chunks.grid, blk.slots), heads)](
        x,
        y,
        ptr,
        chunks.chunk_ptr,
        chunks.chunk_seg,
        chunks.rank,
        part_m,
        part_s,
        n,
        chunks.grid,
        h,
        CHUNK=blk.chunk,
        SLOTS=blk.slots,
        num_warps=blk.num_warps,
        **meta,
    )
    if e > blk.chunk:  # otherwise no segment can have two chunks
        split = (chunks.split_grid, heads)
        _softmax_combine[split](
            chunks.split,
            chunks.chunk_ptr,
            chunks.chunk_seg,
            chunks.rank,
            part_m,
            part_s,
            chunks.grid,
            h,
            IS_MAX=True,
            ACC=meta["ACC"],
            BLOCK_H=blk.block_h,
        )
        _softmax_fwd_split[split](
            x,
            y,
            ptr,
            chunks.split,
            chunks.chunk_ptr,
            chunks.chunk_seg,
            chunks.rank,
            part_m,
            part_s,
            n,
            chunks.grid,
            h,
            CHUNK=blk.chunk,
            num_warps=blk.num_warps,
            **meta,
        )
    return y.view_as(src)


def segment_softmax_bwd(
    y: Tensor,
    grad: Tensor,
    ptr: Tensor,
    *,
    plan: TritonPlan | None = None,
    block_e: int | None = None,
    split_blocks: int | None = None,
) -> Tensor:
    """Gradient of :func:`segment_softmax_fwd`: ``y * (g - sum_seg(g * y))``.

    Args:
        y: the forward output, ``[E]`` or ``[E, H]``.
        grad: the gradient of the output, shaped like ``y``.
        ptr: ``[N + 1]`` int64 CSR pointers.
        plan: as in :func:`segment_softmax_fwd`.
        block_e: as in :func:`segment_softmax_fwd`.
        split_blocks: as in :func:`segment_softmax_fwd`.

    Returns:
        The gradient of the scores, shaped and typed like ``y``.
    """
    _check(y, ptr, "y", plan)
    if grad.shape != y.shape:
        raise ValueError(f"Expected 'grad' of shape {list(y.shape)}, got {list(grad.shape)}")
    if grad.device != y.device:
        raise ValueError(f"Expected 'grad' on the device of 'y' ({y.device}), got {grad.device}")
    yy, gg = _as_2d(y), _as_2d(grad.to(y.dtype))
    e, h = yy.shape
    n = ptr.numel() - 1
    dx = torch.empty_like(yy)
    if e == 0 or h == 0 or n <= 0:
        return dx.view_as(y)
    if _too_wide(h):
        acc = acc_dtype(yy.dtype)
        dx = reference.segment_softmax_bwd(yy.to(acc), gg.to(acc), ptr)
        return dx.to(yy.dtype).view_as(y)
    blk, ptr, chunks = _work(ptr, e, h, plan, block_e, split_blocks)
    part_d = torch.empty((chunks.split_grid, h), dtype=acc_dtype(yy.dtype), device=yy.device)
    heads = triton.cdiv(h, blk.block_h)
    meta = dict(ACC=acc_tl(yy.dtype), BLOCK_E=blk.block_e, BLOCK_H=blk.block_h)
    _softmax_bwd_chunk[(triton.cdiv(chunks.grid, blk.slots), heads)](
        yy,
        gg,
        dx,
        ptr,
        chunks.chunk_ptr,
        chunks.chunk_seg,
        chunks.rank,
        part_d,
        n,
        chunks.grid,
        h,
        CHUNK=blk.chunk,
        SLOTS=blk.slots,
        num_warps=blk.num_warps,
        **meta,
    )
    if e > blk.chunk:
        split = (chunks.split_grid, heads)
        _softmax_combine[split](
            chunks.split,
            chunks.chunk_ptr,
            chunks.chunk_seg,
            chunks.rank,
            part_d,
            part_d,
            chunks.grid,
            h,
            IS_MAX=False,
            ACC=meta["ACC"],
            BLOCK_H=blk.block_h,
        )
        _softmax_bwd_split[split](
            yy,
            gg,
            dx,
            ptr,
            chunks.split,
            chunks.chunk_ptr,
            chunks.chunk_seg,
            chunks.rank,
            part_d,
            n,
            chunks.grid,
            h,
            CHUNK=blk.chunk,
            num_warps=blk.num_warps,
            **meta,
        )
    return dx.view_as(y)
