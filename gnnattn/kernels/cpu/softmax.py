"""Segment softmax over CSR segments, and the pointers of a sorted segment index.

Per segment: a max pass, an exp pass and a normalize pass, the last two in
cache; on the flat ``[E * F]`` view in lanes (below), so the loops vectorize
for any number of heads ``F``. The pass reads and writes each element once
from memory. A segment is never split: a hub's exponentials are normalized
while in cache, and the pass is cheap next to attention.

NaN: a NaN anywhere in a segment (and head) makes that segment's outputs NaN,
as :func:`gnnattn.kernels.reference.segment_softmax` does: the maximum keeps
a NaN (:func:`._simd._max`), and only a zero sum (every weight 0) is replaced.
"""

from __future__ import annotations

import numba
import numpy as np
import torch
from numba import prange
from torch import Tensor

from ..common import acc_dtype, check_ptr
from ._simd import _INLINE, _JIT, _NEG_INF, _NN, _exp, _max
from .plans import _CHUNKS_PER_THREAD, _flat, _floating, _on_cpu, _threads

__all__ = ["segment_ptr", "segment_softmax_bwd", "segment_softmax_fwd"]


# Segment softmax works on the flat ``[E * F]`` view of ``[E, F]``: segment
# ``i`` is the contiguous range ``ptr[i] * F : ptr[i + 1] * F``, walked in
# blocks of ``L`` lanes, ``L`` a multiple of ``F`` near 16, so lane ``l``
# always holds head ``l % F`` and the loops over lanes vectorize (looping over
# the F = 4 heads of one edge does not). Per-lane maxima and sums are folded
# into per-head ones in a fixed order once per segment.


@numba.njit(**_INLINE)
def _lanes(nh):  # pragma: no cover - compiled
    return nh * max(1, 16 // nh)


@numba.njit(**_INLINE)
def _fold(lv, nh, mode):  # pragma: no cover - compiled
    """Fold lanes ``lv[ln]`` into heads ``lv[l % nh]`` (max for mode 0, sum otherwise),
    then tile the per-head results back over every lane (no division: once per
    segment, an integer modulo per lane cost as much as the segment's exps)."""
    nb = lv.shape[0] // nh
    for b in range(1, nb):
        for h in range(nh):
            x = lv[b * nh + h]
            lv[h] = _max(lv[h], x) if mode == 0 else lv[h] + x
    for b in range(1, nb):
        for h in range(nh):
            lv[b * nh + h] = lv[h]


@numba.njit(**_JIT)
def _softmax_fwd_kernel(src, nh, ptr, bounds, out):  # pragma: no cover - compiled
    zero = src.dtype.type(0)
    one = src.dtype.type(1)
    nl = _lanes(nh)
    for ch in prange(bounds.shape[0] - 1):
        # Per-chunk scratch: no allocation per segment.
        lv = np.empty(nl, dtype=src.dtype)
        for i in range(bounds[ch] & _NN, bounds[ch + 1]):
            s = (ptr[i] * nh) & _NN
            nb, rest = divmod(ptr[i + 1] * nh - s, nl)
            tail = (s + nb * nl) & _NN
            lv[:] = _NEG_INF
            for b in range(nb):
                x = (s + b * nl) & _NN
                for ln in range(nl):
                    lv[ln] = _max(lv[ln], src[x + ln])
            for ln in range(rest):
                lv[ln] = _max(lv[ln], src[tail + ln])
            _fold(lv, nh, 0)
            for ln in range(nl):
                # An all -inf segment: shift by 0, so every exp is 0, not NaN.
                if lv[ln] == _NEG_INF:
                    lv[ln] = zero
            for b in range(nb):
                x = (s + b * nl) & _NN
                for ln in range(nl):
                    out[x + ln] = _exp(src[x + ln] - lv[ln])
            for ln in range(rest):
                out[tail + ln] = _exp(src[tail + ln] - lv[ln])
            lv[:] = zero
            # The segment was just written: these passes run in cache.
            for b in range(nb):
                x = (s + b * nl) & _NN
                for ln in range(nl):
                    lv[ln] += out[x + ln]
            for ln in range(rest):
                lv[ln] += out[tail + ln]
            _fold(lv, nh, 1)
            for ln in range(nl):
                # The sum is 0 only when every exp is 0: the weights stay 0.
                # Any other sum, NaN included, is divided by.
                lv[ln] = one if lv[ln] == zero else one / lv[ln]
            for b in range(nb):
                x = (s + b * nl) & _NN
                for ln in range(nl):
                    out[x + ln] *= lv[ln]
            for ln in range(rest):
                out[tail + ln] *= lv[ln]


@numba.njit(**_JIT)
def _softmax_bwd_kernel(y, g, nh, ptr, bounds, out):  # pragma: no cover - compiled
    zero = y.dtype.type(0)
    nl = _lanes(nh)
    for ch in prange(bounds.shape[0] - 1):
        lv = np.empty(nl, dtype=y.dtype)
        for i in range(bounds[ch] & _NN, bounds[ch + 1]):
            s = (ptr[i] * nh) & _NN
            nb, rest = divmod(ptr[i + 1] * nh - s, nl)
            tail = (s + nb * nl) & _NN
            lv[:] = zero
            for b in range(nb):
                x = (s + b * nl) & _NN
                for ln in range(nl):
                    lv[ln] += g[x + ln] * y[x + ln]
            for ln in range(rest):
                lv[ln] += g[tail + ln] * y[tail + ln]
            _fold(lv, nh, 1)
            for b in range(nb):
                x = (s + b * nl) & _NN
                for ln in range(nl):
                    out[x + ln] = y[x + ln] * (g[x + ln] - lv[ln])
            for ln in range(rest):
                out[tail + ln] = y[tail + ln] * (g[tail + ln] - lv[ln])


def _segments(ptr: Tensor, num_edges: int) -> np.ndarray:
    """``ptr`` as int64 numpy, after the checks that keep the kernels in bounds."""
    _on_cpu("ptr", ptr)
    check_ptr(ptr, num_edges)
    return ptr.contiguous().numpy()


def _segment_bounds(p: np.ndarray, num_edges: int) -> np.ndarray:
    # Chunks of whole segments with about equal element counts.
    n = p.shape[0] - 1
    k = max(1, min(n, _CHUNKS_PER_THREAD * _threads()))
    cuts = np.searchsorted(p, np.linspace(0, num_edges, k + 1), side="left")
    cuts[0], cuts[-1] = 0, n
    return np.unique(cuts).astype(np.int64)


@numba.njit(**_JIT)
def _segment_ptr_kernel(index, n, bounds, ptr, flags):  # pragma: no cover - compiled
    for ch in prange(bounds.shape[0] - 1):
        for p in range(bounds[ch] & _NN, bounds[ch + 1]):
            cur = index[p]
            prev = index[p - 1] if p > 0 else -1
            if cur < 0 or cur >= n:
                flags[ch] = 2  # out of range: write nothing for it
            elif cur < prev:
                flags[ch] = max(flags[ch], 1)  # not sorted
            else:
                # The first position whose id is >= v, for every v this one starts.
                for v in range(prev + 1, cur + 1):
                    ptr[v] = p


def segment_ptr(index: Tensor, num_segments: int) -> Tensor | None:
    """CSR pointers ``[num_segments + 1]`` of a sorted segment ``index``, or ``None``.

    One parallel pass over ``index`` both checks that it is non-decreasing
    and finds where each segment starts (what ``bincount`` + ``cumsum`` and a
    separate sortedness check would take four passes for).

    Args:
        index: ``[E]`` int64 or int32 segment id of each entry.
        num_segments: the number of segments ``N``.

    Returns:
        int64 ``ptr`` with segment ``i`` at ``ptr[i]:ptr[i+1]``, or ``None``
        when ``index`` is not sorted.

    Raises:
        ValueError: on ids outside ``[0, num_segments)``.
    """
    if index.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"Expected 'index' int64 or int32, got {index.dtype}")
    if index.dim() != 1 or index.device.type != "cpu":
        raise ValueError(f"Expected 'index' of shape [E] on the CPU, got {list(index.shape)}")
    e = index.numel()
    ptr = torch.zeros(num_segments + 1, dtype=torch.int64)
    if e == 0:
        return ptr
    ix = index.contiguous().numpy()
    k = max(1, min(e, _CHUNKS_PER_THREAD * _threads()))
    bounds = np.linspace(0, e, k + 1).astype(np.int64)
    flags = np.zeros(k, np.int64)
    p = ptr.numpy()
    _segment_ptr_kernel(ix, num_segments, bounds, p, flags)
    if (flags == 2).any():
        raise ValueError(f"Expected 'index' ids in [0, {num_segments}), got one outside")
    if flags.any():
        return None
    p[int(ix[-1]) + 1 :] = e
    return ptr


def segment_softmax_fwd(src: Tensor, ptr: Tensor) -> Tensor:
    """Stable softmax of ``src`` within each CSR segment of ``ptr``.

    Args:
        src: ``[E, ...]`` scores, softmax-normalized along dim 0 per segment.
        ptr: ``[N + 1]`` int64 CSR pointers; segment ``i`` is ``ptr[i]:ptr[i+1]``.

    Returns:
        The weights, shaped and typed like ``src``; 0 for ``-inf`` scores and
        in all ``-inf`` segments.
    """
    _floating("src", src)
    if src.dim() < 1:
        raise ValueError(f"Expected 'src' of shape [E, ...], got {list(src.shape)}")
    p = _segments(ptr, src.shape[0])
    x = _flat(src, acc_dtype(src.dtype))  # (E, F)
    out = torch.empty_like(x)
    if x.numel():
        nh = x.shape[1]
        bounds = _segment_bounds(p, x.shape[0])
        _softmax_fwd_kernel(x.view(-1).numpy(), nh, p, bounds, out.view(-1).numpy())
    return out.view(src.shape).to(src.dtype)


def segment_softmax_bwd(y: Tensor, grad: Tensor, ptr: Tensor) -> Tensor:
    """Gradient of :func:`segment_softmax_fwd`: ``y * (g - sum_seg(g * y))``.

    Args:
        y: ``[E, ...]`` the forward's output.
        grad: ``[E, ...]`` the gradient of ``y``.
        ptr: ``[N + 1]`` int64 CSR pointers, as in the forward.

    Returns:
        The gradient of ``src``, shaped and typed like ``y``.
    """
    _floating("y", y)
    _floating("grad", grad)
    if y.dim() < 1 or grad.shape != y.shape:
        raise ValueError(
            f"Expected 'y' of shape [E, ...] and 'grad' of its shape, got {list(y.shape)} "
            f"and {list(grad.shape)}"
        )
    p = _segments(ptr, y.shape[0])
    dt = acc_dtype(y.dtype)
    yy, gg = _flat(y, dt), _flat(grad, dt)  # (E, F) each
    out = torch.empty_like(yy)
    if yy.numel():
        bounds = _segment_bounds(p, yy.shape[0])
        _softmax_bwd_kernel(
            yy.view(-1).numpy(), gg.view(-1).numpy(), yy.shape[1], p, bounds, out.view(-1).numpy()
        )
    return out.view(y.shape).to(y.dtype)
