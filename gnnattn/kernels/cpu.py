r"""CPU kernels, compiled with numba: segment softmax and fused sparse attention.

The four functions have the signatures and results of
:mod:`gnnattn.kernels.reference` (the tests compare them).

Why numba. The operator needs a loop per target over its incoming edges with
a running max and sum; torch ops cannot express that without gathering
``q_i``, ``k_j`` and ``v_j`` for every edge (three ``|E| x C`` tensors, which
is exactly what makes PyG's ``TransformerConv`` slow), and ``torch.compile``
lowers scatter/gather to the same materialized tensors. A torch C++ extension
would need a compiler on the user's machine and a minute-long build at first
use. numba ships wheels on PyPI for every platform torch supports, compiles
these loops with LLVM to native code, runs ``prange`` loops on a thread pool,
and caches the machine code on disk (``cache=True``), so install stays one
``pip install`` and only the very first call of each kernel pays compilation
(a few seconds per kernel and dtype on this machine; later processes load it
from the cache).

Work split. Targets are cut into about ``8 x threads`` chunks holding equal
numbers of *edges* (``searchsorted`` on the CSR pointers), and the chunks are
the ``prange`` iterations, so a few high-degree targets do not leave one core
with most of the work. A single target is never split: one node holding most
of the edges still runs on one core.

Memory traffic per edge (forward attention): one row of ``k`` and one of ``v``
(``H (C + Cv)`` numbers, read contiguously from ``[M, H, C]`` tensors) and the
source id; per target one row of ``q`` read and one of ``out`` written. The
backward first walks the CSR (per edge: ``k_j``, ``v_j``; it writes the weight
and the score gradient, ``2 H`` numbers) and accumulates ``dq``, then walks the
transposed CSR (per edge: ``q_i``, ``dout_i``) and accumulates ``dk`` and
``dv`` per source, so no two threads write the same row and no atomics are
needed. The transposed CSR is built once per graph and cached.

Tested on the project's 2-core x86_64 CPU machines (float32 and float64).
"""

from __future__ import annotations

import math
import weakref

import numba
import numpy as np
import torch
from numba import prange
from torch import Tensor

from .reference import segment_ids

__all__ = ["attention_bwd", "attention_fwd", "segment_softmax_bwd", "segment_softmax_fwd"]

_NEG_INF = -np.inf
# Reassociation lets LLVM vectorize the dot products and sums (results change
# at rounding level only); no "ninf"/"nnan" flags, since the kernels rely on
# -inf comparisons and exp(-inf) = 0.
_FAST = {"reassoc", "contract"}


def _threads() -> int:
    limit = numba.config.NUMBA_NUM_THREADS  # type: ignore[attr-defined]
    n = max(1, min(torch.get_num_threads(), limit))
    numba.set_num_threads(n)
    return n


def _chunks(ptr: np.ndarray) -> np.ndarray:
    """Target boundaries of about ``8 x threads`` chunks with equal edge counts."""
    n = ptr.shape[0] - 1
    e = int(ptr[-1]) if n >= 0 else 0
    k = max(1, min(n, 8 * _threads()))
    cuts = np.searchsorted(ptr, np.linspace(0, e, k + 1), side="left")
    cuts[0], cuts[-1] = 0, n
    return np.unique(np.clip(cuts, 0, n)).astype(np.int64)


def _np(t: Tensor) -> np.ndarray:
    return t.detach().contiguous().numpy()


def _scalar(x: float, dtype: torch.dtype) -> np.floating:
    # A float64 scale would promote every float32 product to float64 and stop
    # LLVM from vectorizing the float32 loops.
    return np.float64(x) if dtype == torch.float64 else np.float32(x)


def _work_dtype(t: Tensor) -> torch.dtype:
    # float64 stays float64; float32 and the half types compute in float32.
    return torch.float64 if t.dtype == torch.float64 else torch.float32


# ----------------------------------------------------------------- softmax


@numba.njit(parallel=True, cache=True, nogil=True, fastmath=_FAST)
def _softmax_fwd_kernel(src, ptr, bounds, out):  # pragma: no cover - compiled
    h = src.shape[1]
    for c in prange(bounds.shape[0] - 1):
        m = np.empty(h, dtype=src.dtype)
        tot = np.empty(h, dtype=src.dtype)
        for i in range(bounds[c], bounds[c + 1]):
            s, e = ptr[i], ptr[i + 1]
            m[:] = _NEG_INF
            for p in range(s, e):
                for j in range(h):
                    if src[p, j] > m[j]:
                        m[j] = src[p, j]
            for j in range(h):
                # An all -inf segment: shift by 0 so that every exp is 0.
                if m[j] == _NEG_INF:
                    m[j] = 0.0
            tot[:] = 0.0
            for p in range(s, e):
                for j in range(h):
                    v = math.exp(src[p, j] - m[j])
                    out[p, j] = v
                    tot[j] += v
            for j in range(h):
                # tot == 0 only when every exp is 0: weights stay 0, not NaN.
                tot[j] = 1.0 / tot[j] if tot[j] > 0 else 1.0
            for p in range(s, e):
                for j in range(h):
                    out[p, j] *= tot[j]


@numba.njit(parallel=True, cache=True, nogil=True, fastmath=_FAST)
def _softmax_bwd_kernel(y, g, ptr, bounds, out):  # pragma: no cover - compiled
    h = y.shape[1]
    for c in prange(bounds.shape[0] - 1):
        dot = np.empty(h, dtype=y.dtype)
        for i in range(bounds[c], bounds[c + 1]):
            s, e = ptr[i], ptr[i + 1]
            dot[:] = 0.0
            for p in range(s, e):
                for j in range(h):
                    dot[j] += g[p, j] * y[p, j]
            for p in range(s, e):
                for j in range(h):
                    out[p, j] = y[p, j] * (g[p, j] - dot[j])


def _as_2d(t: Tensor) -> Tensor:
    return t.reshape(t.shape[0], -1) if t.dim() != 2 else t


def segment_softmax_fwd(src: Tensor, ptr: Tensor) -> Tensor:
    """Stable softmax of ``src`` ``[E, H]`` within each CSR segment of ``ptr``."""
    x = _as_2d(src).to(_work_dtype(src)).contiguous()
    out = torch.empty_like(x)
    p = _np(ptr)
    if x.numel():
        _softmax_fwd_kernel(x.numpy(), p, _chunks(p), out.numpy())
    return out.view(src.shape).to(src.dtype)


def segment_softmax_bwd(y: Tensor, grad: Tensor, ptr: Tensor) -> Tensor:
    """Gradient of :func:`segment_softmax_fwd`: ``y * (g - sum_seg(g * y))``."""
    dt = _work_dtype(y)
    yy = _as_2d(y).to(dt).contiguous()
    gg = _as_2d(grad).to(dt).contiguous()
    out = torch.empty_like(yy)
    p = _np(ptr)
    if yy.numel():
        _softmax_bwd_kernel(yy.numpy(), gg.numpy(), p, _chunks(p), out.numpy())
    return out.view(y.shape).to(y.dtype)


# --------------------------------------------------------------- attention


@numba.njit(parallel=True, cache=True, nogil=True, fastmath=_FAST)
def _attn_fwd_kernel(
    q, k, v, bias, has_bias, ptr, col, scale, bounds, out, lse
):  # pragma: no cover
    nh, c_qk, c_v = q.shape[1], q.shape[2], v.shape[2]
    for ch in prange(bounds.shape[0] - 1):
        m = np.empty(nh, dtype=q.dtype)
        tot = np.empty(nh, dtype=q.dtype)
        acc = np.empty((nh, c_v), dtype=q.dtype)
        for i in range(bounds[ch], bounds[ch + 1]):
            m[:] = _NEG_INF
            tot[:] = 0.0
            acc[:, :] = 0.0
            for p in range(ptr[i], ptr[i + 1]):
                j = col[p]
                for h in range(nh):
                    s = q.dtype.type(0)  # accumulate in the input's dtype
                    for c in range(c_qk):
                        s += q[i, h, c] * k[j, h, c]
                    s *= scale
                    if has_bias:
                        s += bias[p, h]
                    if s == _NEG_INF:
                        continue  # weight 0; also keeps (-inf) - (-inf) out
                    if s > m[h]:
                        # Online softmax: a new maximum rescales what was
                        # accumulated so far (exp(-inf) = 0 on the first edge).
                        corr = math.exp(m[h] - s)
                        tot[h] *= corr
                        for c in range(c_v):
                            acc[h, c] *= corr
                        m[h] = s
                    w = math.exp(s - m[h])
                    tot[h] += w
                    for c in range(c_v):
                        acc[h, c] += w * v[j, h, c]
            for h in range(nh):
                if tot[h] > 0:
                    inv = 1.0 / tot[h]
                    for c in range(c_v):
                        out[i, h, c] = acc[h, c] * inv
                    lse[i, h] = m[h] + math.log(tot[h])
                else:
                    for c in range(c_v):
                        out[i, h, c] = 0.0
                    lse[i, h] = _NEG_INF


@numba.njit(parallel=True, cache=True, nogil=True, fastmath=_FAST)
def _attn_bwd_dst_kernel(
    q, k, v, bias, has_bias, dout, delta, lse, ptr, col, scale, bounds, alpha, ds, dq
):  # pragma: no cover - compiled
    nh, c_qk, c_v = q.shape[1], q.shape[2], v.shape[2]
    for ch in prange(bounds.shape[0] - 1):
        for i in range(bounds[ch], bounds[ch + 1]):
            for h in range(nh):
                for c in range(c_qk):
                    dq[i, h, c] = 0.0
            for p in range(ptr[i], ptr[i + 1]):
                j = col[p]
                for h in range(nh):
                    if lse[i, h] == _NEG_INF:
                        alpha[p, h] = 0.0
                        ds[p, h] = 0.0
                        continue
                    s = q.dtype.type(0)  # accumulate in the input's dtype
                    for c in range(c_qk):
                        s += q[i, h, c] * k[j, h, c]
                    s *= scale
                    if has_bias:
                        s += bias[p, h]
                    a = math.exp(s - lse[i, h])
                    da = q.dtype.type(0)
                    for c in range(c_v):
                        da += dout[i, h, c] * v[j, h, c]
                    g = a * (da - delta[i, h])
                    alpha[p, h] = a
                    ds[p, h] = g
                    g *= scale
                    for c in range(c_qk):
                        dq[i, h, c] += g * k[j, h, c]


@numba.njit(parallel=True, cache=True, nogil=True, fastmath=_FAST)
def _attn_bwd_src_kernel(
    q, dout, alpha, ds, cptr, eperm, dst, scale, bounds, dk, dv
):  # pragma: no cover - compiled
    nh, c_qk, c_v = q.shape[1], q.shape[2], dout.shape[2]
    for ch in prange(bounds.shape[0] - 1):
        for j in range(bounds[ch], bounds[ch + 1]):
            for h in range(nh):
                for c in range(c_qk):
                    dk[j, h, c] = 0.0
                for c in range(c_v):
                    dv[j, h, c] = 0.0
            for t in range(cptr[j], cptr[j + 1]):
                p = eperm[t]
                i = dst[p]
                for h in range(nh):
                    a = alpha[p, h]
                    g = ds[p, h] * scale
                    for c in range(c_v):
                        dv[j, h, c] += a * dout[i, h, c]
                    for c in range(c_qk):
                        dk[j, h, c] += g * q[i, h, c]


class _Transposes:
    """Transposed CSR per graph, keyed on the identity of its ``col`` tensor.

    The layers keep one CSR per graph (see :class:`gnnattn.ops.Graph`), so the
    same ``col`` tensor comes back on every call; a weak reference and the
    tensor's version guard against a new tensor reusing a freed one's id.
    """

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self.entries: dict[int, tuple] = {}

    def get(self, ptr: Tensor, col: Tensor, num_src: int) -> tuple[np.ndarray, ...]:
        hit = self.entries.get(id(col))
        if hit is not None:
            ref, version, m, value = hit
            if ref() is col and version == col._version and m == num_src:
                return value
        dst = segment_ids(ptr, col.numel())
        eperm = torch.argsort(col, stable=True)
        counts = torch.bincount(col, minlength=num_src)
        cptr = torch.zeros(num_src + 1, dtype=torch.long)
        torch.cumsum(counts, 0, out=cptr[1:])
        value = (_np(cptr), _np(eperm), _np(dst))
        if len(self.entries) >= self.size:
            self.entries.pop(next(iter(self.entries)))
        self.entries[id(col)] = (weakref.ref(col), col._version, num_src, value)
        return value


_transposes = _Transposes()


def _prep(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None):
    dt = _work_dtype(q)
    qq, kk, vv = (t.to(dt).contiguous() for t in (q, k, v))
    if bias is None:
        bb = torch.zeros(0, q.shape[1], dtype=dt)
    else:
        bb = bias.to(dt).contiguous()
    return dt, qq, kk, vv, bb


def attention_fwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    ptr: Tensor,
    col: Tensor,
    scale: float,
    bias: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Sparse attention over a destination-sorted CSR graph (see the reference)."""
    dt, qq, kk, vv, bb = _prep(q, k, v, bias)
    n, h = q.shape[0], q.shape[1]
    out = torch.empty(n, h, v.shape[2], dtype=dt)
    lse = torch.empty(n, h, dtype=dt)
    p = _np(ptr)
    if n:
        _attn_fwd_kernel(
            qq.numpy(), kk.numpy(), vv.numpy(), bb.numpy(), bias is not None,
            p, _np(col), _scalar(scale, dt), _chunks(p), out.numpy(), lse.numpy(),
        )  # fmt: skip
    return out.to(q.dtype), lse


def attention_bwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    grad_out: Tensor,
    ptr: Tensor,
    col: Tensor,
    scale: float,
    bias: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """Gradients of :func:`attention_fwd` w.r.t. ``q``, ``k``, ``v`` and ``bias``."""
    dt, qq, kk, vv, bb = _prep(q, k, v, bias)
    go = grad_out.to(dt).contiguous()
    delta = (go * out.to(dt)).sum(-1).contiguous()  # (N, H): sum_j alpha_ij dalpha_ij
    ll = lse.to(dt).contiguous()
    n, h = q.shape[0], q.shape[1]
    m, e = k.shape[0], col.numel()
    alpha = torch.empty(e, h, dtype=dt)
    ds = torch.empty(e, h, dtype=dt)
    dq = torch.zeros_like(qq)
    dk = torch.zeros_like(kk)
    dv = torch.zeros_like(vv)
    p = _np(ptr)
    if n and e:
        _attn_bwd_dst_kernel(
            qq.numpy(), kk.numpy(), vv.numpy(), bb.numpy(), bias is not None,
            go.numpy(), delta.numpy(), ll.numpy(), p, _np(col), _scalar(scale, dt),
            _chunks(p), alpha.numpy(), ds.numpy(), dq.numpy(),
        )  # fmt: skip
        cptr, eperm, dst = _transposes.get(ptr, col, m)
        _attn_bwd_src_kernel(
            qq.numpy(), go.numpy(), alpha.numpy(), ds.numpy(), cptr, eperm, dst,
            _scalar(scale, dt), _chunks(cptr), dk.numpy(), dv.numpy(),
        )  # fmt: skip
    dbias = ds.to(bias.dtype) if bias is not None else None
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dbias
