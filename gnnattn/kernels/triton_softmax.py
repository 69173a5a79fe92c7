"""Triton segment softmax over a destination-sorted CSR graph, forward and backward.

Implements :func:`gnnattn.kernels.reference.segment_softmax_fwd` and
:func:`~gnnattn.kernels.reference.segment_softmax_bwd` for ``src`` ``[E, H]``
(``[E]`` and ``[E, ...]`` are viewed as ``[E, H]``) and ``ptr`` int64 ``[N + 1]``.
float16/bfloat16/float32 inputs reduce in float32 (float64 in float64); the
result has the input's dtype.

Work split across programs
--------------------------
The grid is ``(chunk, head block)``. Every segment (the incoming edges of one
target) is cut into chunks of at most ``CHUNK = BLOCK_E * SPLIT_BLOCKS`` edges;
a segment of length ``L`` has ``max(1, ceil(L / CHUNK))`` chunks, so the
segments longer than ``CHUNK`` are split across programs and one hub of a
power-law graph does not serialise the launch. The defaults are
``BLOCK_E = clamp(next_pow2(E / N), 16, 2048 // BLOCK_H)``, ``SPLIT_BLOCKS = 8``
on a GPU (``BLOCK_E <= 32``, so ``CHUNK <= 256``, under the interpreter); both can
be passed as ``block_e`` / ``split_blocks``. A head block covers
``BLOCK_H = min(next_pow2(H), 16)`` heads, so a ``[BLOCK_E, BLOCK_H]`` tile is
``BLOCK_E`` whole contiguous rows of ``src`` when ``H <= 16``.

The chunk of program ``c`` is found from ``chunk_seg`` / ``chunk_ptr``, built
with torch on the device without a host sync: the total number of chunks is at
most ``N + E // CHUNK`` and that bound is the grid; programs past the last
chunk see ``seg == N`` and do nothing.

* Pass 1 (``_softmax_fwd_chunk``): one read of the chunk with an online
  max/sum (running max ``m``, sum rescaled by ``exp(m_old - m_new)``). A
  segment of one chunk is finished in the same program (normalise and write);
  a split segment's program stores its partial ``(m, s)`` per head.
* Pass 2 (``_softmax_fwd_split``), launched only when some segment can be
  longer than ``CHUNK`` (``E > CHUNK``): each chunk of a split segment combines
  the partials of all the segment's chunks
  (``M = max m_c``, ``S = sum s_c exp(m_c - M)``) and writes its own outputs.

The backward has the same two passes with the partial ``sum_seg(g * y)``
instead of ``(m, s)``, then ``dx = y * (g - sum_seg(g * y))``.

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

Tested under ``TRITON_INTERPRET=1`` on CPU; not yet run on a GPU (the kernels
are also compiled for sm_90 offline by the tests, which checks that they
lower to PTX, not that they are right or fast there).
"""

from __future__ import annotations

import math
import os
import time

import torch
import triton
import triton.language as tl
from torch import Tensor

__all__ = [
    "bench_segment_softmax_bandwidth",
    "chunk_plan",
    "segment_softmax_bwd",
    "segment_softmax_fwd",
]

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def _softmax_fwd_chunk(
    x_ptr,  # [E, H] input scores
    y_ptr,  # [E, H] output weights (input dtype)
    ptr_ptr,  # [N + 1] int64 CSR pointers
    chunk_ptr_ptr,  # [N + 1] int64: the chunks of segment i are chunk_ptr[i]:chunk_ptr[i+1]
    chunk_seg_ptr,  # [G] int64: the segment of each chunk slot (N past the last chunk)
    part_m_ptr,  # [G, H] float partial max of split segments' chunks
    part_s_ptr,  # [G, H] float partial sum, relative to part_m
    n_seg,
    H,
    ACC: tl.constexpr,  # accumulation dtype (float32, or float64 for float64 inputs)
    BLOCK_E: tl.constexpr,
    BLOCK_H: tl.constexpr,
    CHUNK: tl.constexpr,
):
    c = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = heads < H  # the head padding of BLOCK_H
    seg = tl.load(chunk_seg_ptr + c)
    if seg < n_seg:  # grid slots past the last chunk do nothing
        c0 = tl.load(chunk_ptr_ptr + seg)
        n_chunks = tl.load(chunk_ptr_ptr + seg + 1) - c0
        start = tl.load(ptr_ptr + seg) + (c - c0) * CHUNK
        end = tl.minimum(start + CHUNK, tl.load(ptr_ptr + seg + 1))

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

        if n_chunks == 1:
            # The whole segment is here: normalise and write.
            inv = 1.0 / tl.where(s > 0, s, 1.0)  # s == 0: every exp is 0 already
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
        else:
            # A split segment: leave the partials for pass 2.
            tl.store(part_m_ptr + c * H + heads, m, mask=hmask)
            tl.store(part_s_ptr + c * H + heads, s, mask=hmask)


@triton.jit
def _combine_max_sum(
    part_m_ptr,
    part_s_ptr,
    c0,
    c1,
    heads,
    hmask,
    H,
    ACC: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """Max and sum over the partials of chunks ``c0:c1`` (two passes over ``O(c1 - c0)``)."""
    m = tl.full([BLOCK_H], float("-inf"), ACC)
    p = c0
    while p < c1:
        cs = p + tl.arange(0, BLOCK_P)
        pmask = (cs < c1)[:, None] & hmask[None, :]  # this segment's chunks only
        pm = tl.load(part_m_ptr + cs[:, None] * H + heads[None, :], mask=pmask, other=float("-inf"))
        m = tl.maximum(m, tl.max(pm, 0))
        p += BLOCK_P
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    s = tl.zeros([BLOCK_H], ACC)
    p = c0
    while p < c1:
        cs = p + tl.arange(0, BLOCK_P)
        pmask = (cs < c1)[:, None] & hmask[None, :]
        o = cs[:, None] * H + heads[None, :]
        pm = tl.load(part_m_ptr + o, mask=pmask, other=float("-inf"))
        ps = tl.load(part_s_ptr + o, mask=pmask, other=0.0)
        s += tl.sum(ps * tl.exp(pm - m_safe[None, :]), 0)
        p += BLOCK_P
    return m_safe, s


@triton.jit
def _softmax_fwd_split(
    x_ptr,
    y_ptr,
    ptr_ptr,
    chunk_ptr_ptr,
    chunk_seg_ptr,
    part_m_ptr,
    part_s_ptr,
    n_seg,
    H,
    ACC: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_P: tl.constexpr,
    CHUNK: tl.constexpr,
):
    c = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = heads < H
    seg = tl.load(chunk_seg_ptr + c)
    if seg < n_seg:
        c0 = tl.load(chunk_ptr_ptr + seg)
        c1 = tl.load(chunk_ptr_ptr + seg + 1)
        if c1 - c0 > 1:  # segments of one chunk were finished by pass 1
            m_safe, s = _combine_max_sum(
                part_m_ptr, part_s_ptr, c0, c1, heads, hmask, H, ACC, BLOCK_P, BLOCK_H
            )
            inv = 1.0 / tl.where(s > 0, s, 1.0)
            start = tl.load(ptr_ptr + seg) + (c - c0) * CHUNK
            end = tl.minimum(start + CHUNK, tl.load(ptr_ptr + seg + 1))
            b = start
            while b < end:
                rows = b + tl.arange(0, BLOCK_E)
                mask = (rows < end)[:, None] & hmask[None, :]
                o = rows[:, None] * H + heads[None, :]
                x = tl.load(x_ptr + o, mask=mask, other=float("-inf")).to(ACC)
                y = tl.exp(x - m_safe[None, :]) * inv[None, :]
                tl.store(y_ptr + o, y.to(y_ptr.dtype.element_ty), mask=mask)
                b += BLOCK_E


@triton.jit
def _softmax_bwd_chunk(
    y_ptr,  # [E, H] forward output
    g_ptr,  # [E, H] incoming gradient
    dx_ptr,  # [E, H] gradient of the scores
    ptr_ptr,
    chunk_ptr_ptr,
    chunk_seg_ptr,
    part_d_ptr,  # [G, H] partial sum(g * y) of split segments' chunks
    n_seg,
    H,
    ACC: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_H: tl.constexpr,
    CHUNK: tl.constexpr,
):
    c = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = heads < H
    seg = tl.load(chunk_seg_ptr + c)
    if seg < n_seg:
        c0 = tl.load(chunk_ptr_ptr + seg)
        n_chunks = tl.load(chunk_ptr_ptr + seg + 1) - c0
        start = tl.load(ptr_ptr + seg) + (c - c0) * CHUNK
        end = tl.minimum(start + CHUNK, tl.load(ptr_ptr + seg + 1))

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

        if n_chunks == 1:
            dx0 = y0 * (g0 - d[None, :])
            tl.store(dx_ptr + offs0, dx0.to(dx_ptr.dtype.element_ty), mask=mask0)
            b = start + BLOCK_E
            while b < end:
                rows = b + tl.arange(0, BLOCK_E)
                mask = (rows < end)[:, None] & hmask[None, :]
                o = rows[:, None] * H + heads[None, :]
                y = tl.load(y_ptr + o, mask=mask, other=0.0).to(ACC)
                g = tl.load(g_ptr + o, mask=mask, other=0.0).to(ACC)
                tl.store(dx_ptr + o, (y * (g - d[None, :])).to(dx_ptr.dtype.element_ty), mask=mask)
                b += BLOCK_E
        else:
            tl.store(part_d_ptr + c * H + heads, d, mask=hmask)


@triton.jit
def _softmax_bwd_split(
    y_ptr,
    g_ptr,
    dx_ptr,
    ptr_ptr,
    chunk_ptr_ptr,
    chunk_seg_ptr,
    part_d_ptr,
    n_seg,
    H,
    ACC: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_P: tl.constexpr,
    CHUNK: tl.constexpr,
):
    c = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = heads < H
    seg = tl.load(chunk_seg_ptr + c)
    if seg < n_seg:
        c0 = tl.load(chunk_ptr_ptr + seg)
        c1 = tl.load(chunk_ptr_ptr + seg + 1)
        if c1 - c0 > 1:
            d = tl.zeros([BLOCK_H], ACC)
            p = c0
            while p < c1:
                cs = p + tl.arange(0, BLOCK_P)
                pmask = (cs < c1)[:, None] & hmask[None, :]
                d += tl.sum(
                    tl.load(part_d_ptr + cs[:, None] * H + heads[None, :], mask=pmask, other=0.0),
                    0,
                )
                p += BLOCK_P
            start = tl.load(ptr_ptr + seg) + (c - c0) * CHUNK
            end = tl.minimum(start + CHUNK, tl.load(ptr_ptr + seg + 1))
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


def _acc(dtype: torch.dtype) -> tl.dtype:
    return tl.float64 if dtype == torch.float64 else tl.float32


def _acc_torch(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _blocks(e: int, n: int, h: int, block_e: int | None, split_blocks: int | None):
    block_h = min(triton.next_power_of_2(max(h, 1)), 16)
    if block_e is None:
        # One tile per typical segment: the mean degree, rounded up to a power
        # of two, within [16, 2048 // BLOCK_H] rows (32 under the interpreter,
        # which pays per program and per op rather than per lane).
        cap = 32 if _INTERPRET else max(16, 2048 // block_h)
        block_e = min(max(triton.next_power_of_2(max(1, -(-e // max(n, 1)))), 16), cap)
    if split_blocks is None:
        split_blocks = 8
    if block_e < 1 or block_e & (block_e - 1) or split_blocks < 1:
        raise ValueError(
            f"Expected 'block_e' a power of two and 'split_blocks' >= 1, "
            f"got {block_e} and {split_blocks}"
        )
    return block_e, block_h, block_e * split_blocks


def chunk_plan(ptr: Tensor, num_edges: int, chunk: int) -> tuple[Tensor, Tensor, int]:
    """Cut every CSR segment into chunks of at most ``chunk`` edges.

    Args:
        ptr: ``[N + 1]`` int64 CSR pointers.
        num_edges: ``E = ptr[-1]`` (passed so that nothing syncs with the device).
        chunk: the most edges one program handles.

    Returns:
        ``chunk_ptr`` ``[N + 1]`` (the chunks of segment ``i`` are
        ``chunk_ptr[i]:chunk_ptr[i + 1]``; an empty segment has one chunk),
        ``chunk_seg`` ``[G]`` (the segment of each grid slot, ``N`` past the
        last chunk) and the grid size ``G = N + E // chunk``, an upper bound of
        the number of chunks that needs no device-to-host copy.

    >>> cp, cs, g = chunk_plan(torch.tensor([0, 0, 5, 6]), 6, 2)
    >>> cp.tolist(), cs.tolist(), g
    ([0, 1, 4, 5], [0, 1, 1, 1, 2, 3], 6)
    """
    n = ptr.numel() - 1
    counts = ptr.diff()
    n_chunks = torch.clamp((counts + (chunk - 1)) // chunk, min=1)
    chunk_ptr = torch.zeros(n + 1, dtype=torch.int64, device=ptr.device)
    torch.cumsum(n_chunks, 0, out=chunk_ptr[1:])
    grid = n + num_edges // chunk
    slots = torch.arange(grid, dtype=torch.int64, device=ptr.device)
    chunk_seg = torch.searchsorted(chunk_ptr, slots, right=True) - 1
    return chunk_ptr, chunk_seg, grid


def _as_2d(t: Tensor) -> Tensor:
    return t.reshape(t.shape[0], math.prod(t.shape[1:])).contiguous()


def _check(src: Tensor, ptr: Tensor, name: str = "src") -> None:
    if src.dim() < 1:
        raise ValueError(f"Expected '{name}' of shape [E] or [E, H], got {list(src.shape)}")
    if ptr.dim() != 1 or ptr.dtype != torch.int64:
        raise TypeError(f"Expected 'ptr' int64 of shape [N + 1], got {ptr.dtype} {list(ptr.shape)}")
    if not src.is_floating_point():
        raise TypeError(f"Expected '{name}' floating point, got {src.dtype}")


def segment_softmax_fwd(
    src: Tensor, ptr: Tensor, *, block_e: int | None = None, split_blocks: int | None = None
) -> Tensor:
    """Stable softmax of ``src`` ``[E, H]`` within each CSR segment of ``ptr``.

    Args:
        src: ``[E]``, ``[E, H]`` (or ``[E, ...]``, flattened to ``[E, H]``) scores.
        ptr: ``[N + 1]`` int64 CSR pointers; ``ptr[-1]`` must be ``E``.
        block_e: rows per tile (a power of two); default from the mean degree.
        split_blocks: a segment longer than ``block_e * split_blocks`` edges is
            split across programs (default 8).

    Returns:
        The weights, shaped and typed like ``src``.
    """
    _check(src, ptr)
    x = _as_2d(src)
    e, h = x.shape
    n = ptr.numel() - 1
    y = torch.empty_like(x)
    if e == 0 or h == 0 or n <= 0:
        return y.view_as(src)
    block_e, block_h, chunk = _blocks(e, n, h, block_e, split_blocks)
    ptr = ptr.contiguous()
    chunk_ptr, chunk_seg, grid = chunk_plan(ptr, e, chunk)
    split = e > chunk  # otherwise no segment can have two chunks
    acc_t = _acc_torch(x.dtype)
    part_m = torch.empty((grid, h) if split else (1, h), dtype=acc_t, device=x.device)
    part_s = torch.empty_like(part_m)
    launch = (grid, triton.cdiv(h, block_h))
    common = dict(ACC=_acc(x.dtype), BLOCK_E=block_e, BLOCK_H=block_h, CHUNK=chunk)
    args = (x, y, ptr, chunk_ptr, chunk_seg, part_m, part_s, n, h)
    _softmax_fwd_chunk[launch](*args, **common)
    if split:
        _softmax_fwd_split[launch](*args, BLOCK_P=16, **common)
    return y.view_as(src)


def segment_softmax_bwd(
    y: Tensor,
    grad: Tensor,
    ptr: Tensor,
    *,
    block_e: int | None = None,
    split_blocks: int | None = None,
) -> Tensor:
    """Gradient of :func:`segment_softmax_fwd`: ``y * (g - sum_seg(g * y))``.

    Args:
        y: the forward output, ``[E]`` or ``[E, H]``.
        grad: the gradient of the output, shaped like ``y``.
        ptr: ``[N + 1]`` int64 CSR pointers.
        block_e: as in :func:`segment_softmax_fwd`.
        split_blocks: as in :func:`segment_softmax_fwd`.

    Returns:
        The gradient of the scores, shaped and typed like ``y``.
    """
    _check(y, ptr, "y")
    if grad.shape != y.shape:
        raise ValueError(f"Expected 'grad' of shape {list(y.shape)}, got {list(grad.shape)}")
    yy, gg = _as_2d(y), _as_2d(grad.to(y.dtype))
    e, h = yy.shape
    n = ptr.numel() - 1
    dx = torch.empty_like(yy)
    if e == 0 or h == 0 or n <= 0:
        return dx.view_as(y)
    block_e, block_h, chunk = _blocks(e, n, h, block_e, split_blocks)
    ptr = ptr.contiguous()
    chunk_ptr, chunk_seg, grid = chunk_plan(ptr, e, chunk)
    split = e > chunk
    part_d = torch.empty(
        (grid, h) if split else (1, h), dtype=_acc_torch(yy.dtype), device=yy.device
    )
    launch = (grid, triton.cdiv(h, block_h))
    common = dict(ACC=_acc(yy.dtype), BLOCK_E=block_e, BLOCK_H=block_h, CHUNK=chunk)
    args = (yy, gg, dx, ptr, chunk_ptr, chunk_seg, part_d, n, h)
    _softmax_bwd_chunk[launch](*args, **common)
    if split:
        _softmax_bwd_split[launch](*args, BLOCK_P=16, **common)
    return dx.view_as(y)


def bench_segment_softmax_bandwidth(
    num_edges: int = 100_000_000,
    num_heads: int = 8,
    avg_degree: int = 32,
    *,
    device: str = "cuda",
    repeats: int = 10,
) -> dict[str, float]:
    """Time the forward kernel against a device copy of the same bytes.

    Builds a CSR with ``num_edges // avg_degree`` segments of (nearly) equal
    length, then times :func:`segment_softmax_fwd` on float32 ``[E, H]`` and
    ``torch.Tensor.copy_`` of the same tensor, both counted as 8 bytes per
    element (read + write), by wall clock around ``repeats`` calls between
    ``torch.cuda.synchronize()``. Meant for a GPU: under the
    interpreter it would take hours at the default size.

    Returns:
        ``{"softmax_gbps", "copy_gbps", "fraction"}`` (measured, not claimed).
    """
    if not torch.cuda.is_available() and device == "cuda":
        raise RuntimeError("bench_segment_softmax_bandwidth needs a CUDA device")
    n = max(1, num_edges // avg_degree)
    # Integer arithmetic: float32 linspace is not exact past 2**24.
    ptr = torch.arange(n + 1, dtype=torch.int64, device=device) * num_edges // n
    x = torch.randn(num_edges, num_heads, device=device)
    out = torch.empty_like(x)
    nbytes = 8 * x.numel()

    def timed(fn) -> float:
        fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(repeats):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / repeats

    t_soft = timed(lambda: segment_softmax_fwd(x, ptr))
    t_copy = timed(lambda: out.copy_(x))
    soft, copy = nbytes / t_soft / 1e9, nbytes / t_copy / 1e9
    return {"softmax_gbps": soft, "copy_gbps": copy, "fraction": soft / copy}
