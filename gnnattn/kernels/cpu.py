r"""CPU kernels, compiled with numba: segment softmax and fused sparse attention.

The four public functions have the signatures and results of
:mod:`gnnattn.kernels.reference` (``tests/test_kernels_cpu.py`` compares them),
including its rules for ``-inf`` scores, empty and all ``-inf`` segments.

Why numba. The operator is a loop per target over its incoming edges with a
running max and sum. Torch ops cannot express that without gathering ``q_i``,
``k_j`` and ``v_j`` for every edge (``|E| x C`` tensors, which is what makes
PyG's ``TransformerConv`` slow), and ``torch.compile`` lowers the per-segment
reductions to the same gathers and scatters, so the ``|E| x C`` tensors stay. A
torch C++ extension would express the loops but needs a compiler on the
user's machine and a long JIT build at first use (or a wheel per torch
version). numba is well kept, ships pip-installable wheels for the platforms
torch supports, compiles these loops with LLVM, runs ``prange`` loops on a
thread pool, and caches the machine code on disk (``cache=True``), so install
stays one ``pip install`` with no C++ toolchain.

First call. Importing this module compiles nothing (numba compiles lazily;
the import itself takes about 15 ms once torch and numba are loaded). The
first call of each kernel per dtype compiles it and writes the machine code
to ``__pycache__``; later processes load it from there. Measured on this
project's 2-core x86_64 machine (numba 0.68, tiny inputs): with an empty
cache the first float32 call took about 1-2 s for each segment softmax
function, 3.4 s for ``attention_fwd`` and 5.4 s for ``attention_bwd`` (float64
about the same again); with the cache filled the first call of the process
took about 0.3 s (loading the cache and starting numba's thread pool) and
each further kernel's first call a few ms.

Work split. The ``prange`` iterations are chunks of consecutive targets (for
the ``dk``/``dv`` pass, of consecutive sources), about ``4 x threads`` of them,
cut so that each holds about the same number of *edges* (``searchsorted`` of
evenly spaced edge counts in the CSR pointers), so a few high-degree nodes do
not leave one core with most of the work. A single segment is never split: a
node holding most of the edges runs on one core (splitting it would need a
second reduction pass across threads; the graphs this targets have many
segments).

Arithmetic. Float64 inputs compute in float64, float32 inputs in float32
(accumulators included); float16/bfloat16 are upcast to float32 and the
results cast back (``lse`` stays float32, as in the Triton kernels). numba's
``fastmath`` is off, so LLVM may not reorder sums; the dot products instead
keep eight partial sums in a fixed order, which it can vectorize and which
gives the same result on every run and thread count.

Memory traffic per edge and head. Forward: one row of ``k`` and one of ``v``
(``C + Cv`` numbers from contiguous ``[M, H, C]`` rows) and the source id;
per target one row of ``q`` read and one of ``out`` written. Backward, first
pass over the CSR: ``k_j`` and ``v_j`` read, the weight and the score
gradient written (2 numbers, the ``[E, H]`` arrays ``alpha`` and ``dS``),
``dq_i`` accumulated in cache. Second pass over the transposed CSR (edges
grouped by source): ``alpha``, ``dS``, ``q_i`` and ``dout_i`` read, ``dk_j``
and ``dv_j`` accumulated in cache, so no two threads write the same row and no
atomics are needed. Segment softmax: per edge ``H`` numbers read and written;
a segment's exponentials are normalized while still in cache.

The transposed CSR. :func:`attention_bwd` takes it as ``csc=``, from the
graph object that owns it (:attr:`gnnattn.AttentionGraph.csc`, built once per
graph); without it, it is built for that call by
:func:`gnnattn.graphs.transpose_csr` (a stable sort of ``col``).
"""

from __future__ import annotations

import math
from typing import Any

import numba
import numpy as np
import torch
from numba import prange
from torch import Tensor

from ..graphs.csr import transpose_csr

__all__ = [
    "attention_bwd",
    "attention_fwd",
    "segment_softmax_bwd",
    "segment_softmax_fwd",
]

_NEG_INF = -np.inf
# fastmath stays off: the kernels compare with -inf and rely on exp(-inf) = 0,
# and sums keep a fixed order (see the module docstring).
_JIT: dict[str, Any] = dict(parallel=True, cache=True, nogil=True, fastmath=False)
_CHUNKS_PER_THREAD = 4


# ------------------------------------------------------------------ helpers


@numba.njit(cache=True, inline="always")
def _dot(a, i, b, j, h, n):  # pragma: no cover - compiled
    """``sum_c a[i, h, c] * b[j, h, c]`` in ``a``'s dtype.

    Eight independent partial sums let LLVM vectorize the loop without
    reassociating (fastmath is off); their order is fixed, so is the result.
    """
    z = a.dtype.type(0)
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = z
    c = 0
    while c + 8 <= n:
        s0 += a[i, h, c] * b[j, h, c]
        s1 += a[i, h, c + 1] * b[j, h, c + 1]
        s2 += a[i, h, c + 2] * b[j, h, c + 2]
        s3 += a[i, h, c + 3] * b[j, h, c + 3]
        s4 += a[i, h, c + 4] * b[j, h, c + 4]
        s5 += a[i, h, c + 5] * b[j, h, c + 5]
        s6 += a[i, h, c + 6] * b[j, h, c + 6]
        s7 += a[i, h, c + 7] * b[j, h, c + 7]
        c += 8
    t = ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))
    while c < n:
        t += a[i, h, c] * b[j, h, c]
        c += 1
    return t


def _threads() -> int:
    # torch.set_num_threads is what users set; numba has its own pool.
    limit = numba.config.NUMBA_NUM_THREADS  # type: ignore[attr-defined]
    n = max(1, min(torch.get_num_threads(), limit))
    numba.set_num_threads(n)
    return n


def _chunks(ptr: np.ndarray) -> np.ndarray:
    """Segment boundaries ``[K + 1]`` of chunks holding about equal edge counts."""
    n = ptr.shape[0] - 1
    k = max(1, min(n, _CHUNKS_PER_THREAD * _threads()))
    cuts = np.searchsorted(ptr, np.linspace(0, int(ptr[-1]), k + 1), side="left")
    cuts[0], cuts[-1] = 0, n
    # A segment bigger than a chunk makes equal cuts; empty chunks cost nothing
    # but a prange iteration, so drop them.
    return np.unique(cuts).astype(np.int64)


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    # float64 stays float64; float32 and the half types compute in float32.
    return torch.float64 if dtype == torch.float64 else torch.float32


def _floating(name: str, t: Tensor) -> None:
    if not t.is_floating_point():
        raise TypeError(f"Expected '{name}' of a floating dtype, got {t.dtype}")
    if t.device.type != "cpu":
        raise ValueError(f"Expected '{name}' on the CPU, got {t.device}")


def _check_ptr(ptr: Tensor, num_edges: int, name: str = "ptr") -> np.ndarray:
    """``ptr`` as int64 numpy, after the checks that keep the kernels in bounds."""
    if ptr.dtype != torch.int64:
        raise TypeError(f"Expected '{name}' int64, got {ptr.dtype}")
    if ptr.dim() != 1 or ptr.numel() < 1:
        raise ValueError(f"Expected '{name}' of shape [N + 1], got {list(ptr.shape)}")
    if ptr.device.type != "cpu":
        raise ValueError(f"Expected '{name}' on the CPU, got {ptr.device}")
    p = ptr.contiguous().numpy()
    # O(N) checks; the kernels do not bounds-check, so a bad ptr would read
    # out of bounds instead of raising.
    if p[0] != 0 or p[-1] != num_edges or (p.shape[0] > 1 and (np.diff(p) < 0).any()):
        raise ValueError(
            f"Expected '{name}' non-decreasing from 0 to the number of edges {num_edges}, "
            f"got {p[0]} ... {p[-1]}"
        )
    return p


def _check_col(col: Tensor, num_src: int, name: str = "col") -> np.ndarray:
    if col.dtype != torch.int64:
        raise TypeError(f"Expected '{name}' int64, got {col.dtype}")
    if col.dim() != 1:
        raise ValueError(f"Expected '{name}' of shape [E], got {list(col.shape)}")
    if col.device.type != "cpu":
        raise ValueError(f"Expected '{name}' on the CPU, got {col.device}")
    c = col.contiguous().numpy()
    if c.shape[0] and (c.min() < 0 or c.max() >= num_src):
        raise ValueError(f"Expected '{name}' ids in [0, {num_src}), got [{c.min()}, {c.max()}]")
    return c


def _flat(t: Tensor, dtype: torch.dtype) -> Tensor:
    """``t`` ``[E, ...]`` as a contiguous ``[E, F]`` tensor of ``dtype``."""
    # .detach(): .numpy() refuses tensors that require grad; no copy when
    # the dtype and layout already fit.
    t = t.detach().to(dtype)
    return t.reshape(t.shape[0], math.prod(t.shape[1:])).contiguous()  # (E, F)


# ------------------------------------------------------------------ softmax


@numba.njit(**_JIT)
def _softmax_fwd_kernel(src, ptr, bounds, out):  # pragma: no cover - compiled
    nh = src.shape[1]
    zero = src.dtype.type(0)
    one = src.dtype.type(1)
    for ch in prange(bounds.shape[0] - 1):
        # Per-chunk scratch: no allocation per segment.
        m = np.empty(nh, dtype=src.dtype)
        tot = np.empty(nh, dtype=src.dtype)
        for i in range(bounds[ch], bounds[ch + 1]):
            s, e = ptr[i], ptr[i + 1]
            m[:] = _NEG_INF
            for p in range(s, e):
                for h in range(nh):
                    if src[p, h] > m[h]:
                        m[h] = src[p, h]
            for h in range(nh):
                # An all -inf segment: shift by 0, so every exp is 0, not NaN.
                if m[h] == _NEG_INF:
                    m[h] = zero
            tot[:] = zero
            for p in range(s, e):
                for h in range(nh):
                    w = math.exp(src[p, h] - m[h])
                    out[p, h] = w
                    tot[h] += w
            for h in range(nh):
                # tot is 0 only when every exp is 0: the weights stay 0.
                tot[h] = one / tot[h] if tot[h] > zero else one
            # The segment was just written: this pass runs in cache.
            for p in range(s, e):
                for h in range(nh):
                    out[p, h] *= tot[h]


@numba.njit(**_JIT)
def _softmax_bwd_kernel(y, g, ptr, bounds, out):  # pragma: no cover - compiled
    nh = y.shape[1]
    zero = y.dtype.type(0)
    for ch in prange(bounds.shape[0] - 1):
        dot = np.empty(nh, dtype=y.dtype)
        for i in range(bounds[ch], bounds[ch + 1]):
            s, e = ptr[i], ptr[i + 1]
            dot[:] = zero
            for p in range(s, e):
                for h in range(nh):
                    dot[h] += g[p, h] * y[p, h]
            for p in range(s, e):
                for h in range(nh):
                    out[p, h] = y[p, h] * (g[p, h] - dot[h])


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
    p = _check_ptr(ptr, src.shape[0])
    x = _flat(src, _work_dtype(src.dtype))  # (E, F)
    out = torch.empty_like(x)
    if x.numel():
        _softmax_fwd_kernel(x.numpy(), p, _chunks(p), out.numpy())
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
    p = _check_ptr(ptr, y.shape[0])
    dt = _work_dtype(y.dtype)
    yy, gg = _flat(y, dt), _flat(grad, dt)  # (E, F) each
    out = torch.empty_like(yy)
    if yy.numel():
        _softmax_bwd_kernel(yy.numpy(), gg.numpy(), p, _chunks(p), out.numpy())
    return out.view(y.shape).to(y.dtype)


# ---------------------------------------------------------------- attention


@numba.njit(**_JIT)
def _attn_fwd_kernel(
    q, k, v, bias, has_bias, ptr, col, scale, bounds, out, lse
):  # pragma: no cover - compiled
    nh, cq, cv = q.shape[1], q.shape[2], v.shape[2]
    zero = q.dtype.type(0)
    one = q.dtype.type(1)
    for ch in prange(bounds.shape[0] - 1):
        m = np.empty(nh, dtype=q.dtype)
        tot = np.empty(nh, dtype=q.dtype)
        acc = np.empty((nh, cv), dtype=q.dtype)
        for i in range(bounds[ch], bounds[ch + 1]):
            m[:] = _NEG_INF
            tot[:] = zero
            acc[:, :] = zero
            for p in range(ptr[i], ptr[i + 1]):
                j = col[p]
                for h in range(nh):
                    s = _dot(q, i, k, j, h, cq) * scale
                    if has_bias:
                        s += bias[p, h]
                    if s == _NEG_INF:
                        continue  # weight 0; keeps (-inf) - (-inf) out
                    if s > m[h]:
                        # Online softmax: a new maximum rescales what was
                        # accumulated (exp(-inf) = 0 on the first finite score).
                        corr = math.exp(m[h] - s)
                        tot[h] *= corr
                        for c in range(cv):
                            acc[h, c] *= corr
                        m[h] = s
                    w = math.exp(s - m[h])
                    tot[h] += w
                    for c in range(cv):
                        acc[h, c] += w * v[j, h, c]
            for h in range(nh):
                if tot[h] > zero:
                    inv = one / tot[h]
                    for c in range(cv):
                        out[i, h, c] = acc[h, c] * inv
                    lse[i, h] = m[h] + math.log(tot[h])
                else:  # no edge, or only -inf scores
                    for c in range(cv):
                        out[i, h, c] = zero
                    lse[i, h] = _NEG_INF


@numba.njit(**_JIT)
def _attn_bwd_dst_kernel(
    q, k, v, bias, has_bias, out, dout, lse, ptr, col, scale, bounds, alpha, ds, dq
):  # pragma: no cover - compiled
    nh, cq, cv = q.shape[1], q.shape[2], v.shape[2]
    zero = q.dtype.type(0)
    for ch in prange(bounds.shape[0] - 1):
        delta = np.empty(nh, dtype=q.dtype)
        for i in range(bounds[ch], bounds[ch + 1]):
            for h in range(nh):
                # D_i = sum_c dout_ic out_ic = sum_j alpha_ij dalpha_ij.
                delta[h] = _dot(dout, i, out, i, h, cv)
                for c in range(cq):
                    dq[i, h, c] = zero
            for p in range(ptr[i], ptr[i + 1]):
                j = col[p]
                for h in range(nh):
                    if lse[i, h] == _NEG_INF:  # all weights 0, so all gradients
                        alpha[p, h] = zero
                        ds[p, h] = zero
                        continue
                    s = _dot(q, i, k, j, h, cq) * scale
                    if has_bias:
                        s += bias[p, h]
                    a = math.exp(s - lse[i, h])  # exp(-inf) = 0 for masked edges
                    g = a * (_dot(dout, i, v, j, h, cv) - delta[h])
                    alpha[p, h] = a
                    ds[p, h] = g
                    g *= scale
                    for c in range(cq):
                        dq[i, h, c] += g * k[j, h, c]


@numba.njit(**_JIT)
def _attn_bwd_src_kernel(
    q, dout, alpha, ds, tptr, trow, tperm, scale, bounds, dk, dv
):  # pragma: no cover - compiled
    nh, cq, cv = q.shape[1], q.shape[2], dout.shape[2]
    zero = q.dtype.type(0)
    for ch in prange(bounds.shape[0] - 1):
        for j in range(bounds[ch], bounds[ch + 1]):
            for h in range(nh):
                for c in range(cq):
                    dk[j, h, c] = zero
                for c in range(cv):
                    dv[j, h, c] = zero
            for t in range(tptr[j], tptr[j + 1]):
                p = tperm[t]
                i = trow[t]
                for h in range(nh):
                    a = alpha[p, h]
                    g = ds[p, h] * scale
                    for c in range(cv):
                        dv[j, h, c] += a * dout[i, h, c]
                    for c in range(cq):
                        dk[j, h, c] += g * q[i, h, c]


def _check_qkv(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, num_edges: int) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        _floating(name, t)
        if t.dim() != 3:
            raise ValueError(f"Expected '{name}' of rank 3 [*, H, C], got {list(t.shape)}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"Expected 'q', 'k', 'v' of one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.shape[1:] != k.shape[1:] or k.shape[:2] != v.shape[:2]:
        raise ValueError(
            f"Expected 'q' [N, H, C], 'k' [M, H, C] and 'v' [M, H, Cv], got "
            f"{list(q.shape)}, {list(k.shape)}, {list(v.shape)}"
        )
    if bias is not None:
        _floating("bias", bias)
        if tuple(bias.shape) != (num_edges, q.shape[1]):
            raise ValueError(
                f"Expected 'bias' of shape [{num_edges}, {q.shape[1]}], got {list(bias.shape)}"
            )


def _contig(t: Tensor, dtype: torch.dtype) -> np.ndarray:
    return t.detach().to(dtype).contiguous().numpy()


def _np_dtype(dt: torch.dtype) -> type:
    return np.float64 if dt == torch.float64 else np.float32


def _scalar(x: float, dtype: torch.dtype) -> np.floating:
    # A float64 scale would promote every float32 product to float64.
    return np.float64(x) if dtype == torch.float64 else np.float32(x)


def attention_fwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    ptr: Tensor,
    col: Tensor,
    scale: float,
    bias: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Sparse attention over a destination-sorted CSR graph.

    One pass per target over its incoming edges with an online softmax; no
    ``[E, C]`` array is made.

    Args:
        q: ``[N, H, C]`` queries of the targets.
        k: ``[M, H, C]`` keys of the sources.
        v: ``[M, H, Cv]`` values of the sources.
        ptr: ``[N + 1]`` int64 CSR pointers (incoming edges per target).
        col: ``[E]`` int64 source of each edge.
        scale: multiplies ``q . k``.
        bias: optional ``[E, H]`` additive score bias (edge features).

    Returns:
        ``out`` ``[N, H, Cv]`` typed like ``q`` and the log-sum-exp ``lse``
        ``[N, H]`` in the compute dtype (float64 for float64, else float32);
        ``lse = -inf`` and ``out = 0`` where a target has no finite score.

    Raises:
        ValueError: on shapes that do not fit, or ``ptr``/``col`` out of range.
        TypeError: on non-floating inputs or non-int64 ``ptr``/``col``.
    """
    e = col.numel()
    _check_qkv(q, k, v, bias, e)
    p = _check_ptr(ptr, e)
    c = _check_col(col, k.shape[0])
    dt = _work_dtype(q.dtype)
    n, nh, cv = q.shape[0], q.shape[1], v.shape[2]
    out = torch.empty(n, nh, cv, dtype=dt)
    lse = torch.empty(n, nh, dtype=dt)
    if n * nh:
        bb = _contig(bias, dt) if bias is not None else np.empty((0, nh), _np_dtype(dt))
        _attn_fwd_kernel(
            _contig(q, dt), _contig(k, dt), _contig(v, dt), bb, bias is not None,
            p, c, _scalar(scale, dt), _chunks(p), out.numpy(), lse.numpy(),
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
    *,
    csc: tuple[Tensor, Tensor, Tensor] | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """Gradients of :func:`attention_fwd` w.r.t. ``q``, ``k``, ``v`` and ``bias``.

    FlashAttention's recomputation: ``alpha`` comes back from ``lse`` and
    ``D_i = sum_c dout_ic out_ic``. ``dq`` is summed per target over the CSR,
    ``dk`` and ``dv`` per source over the transposed CSR.

    Args:
        q: ``[N, H, C]``, as in the forward.
        k: ``[M, H, C]``.
        v: ``[M, H, Cv]``.
        out: ``[N, H, Cv]`` the forward output.
        lse: ``[N, H]`` the forward log-sum-exp.
        grad_out: ``[N, H, Cv]`` the gradient of ``out``.
        ptr: ``[N + 1]`` int64 CSR pointers.
        col: ``[E]`` int64 sources.
        scale: as in the forward.
        bias: the forward's ``[E, H]`` bias, or ``None``.
        csc: the transposed CSR ``(tptr, trow, tperm)`` of the graph
            (:attr:`gnnattn.AttentionGraph.csc`); built here when not given.

    Returns:
        ``dq``, ``dk``, ``dv`` (typed like ``q``, ``k``, ``v``) and ``dbias``
        ``[E, H]`` (the score gradient ``dS``, typed like ``bias``; ``None``
        without a bias).

    Raises:
        ValueError: on shapes that do not fit, or ``ptr``/``col`` out of range.
        TypeError: on non-floating inputs or non-int64 ``ptr``/``col``.
    """
    e = col.numel()
    _check_qkv(q, k, v, bias, e)
    n, nh, cq = q.shape
    m, cv = k.shape[0], v.shape[2]
    for name, t, shape in (
        ("out", out, (n, nh, cv)), ("grad_out", grad_out, (n, nh, cv)), ("lse", lse, (n, nh))
    ):  # fmt: skip
        _floating(name, t)
        if tuple(t.shape) != shape:
            raise ValueError(f"Expected '{name}' of shape {list(shape)}, got {list(t.shape)}")
    p = _check_ptr(ptr, e)
    c = _check_col(col, m)
    dt = _work_dtype(q.dtype)
    run = bool(n * nh and e)
    # The kernels write every element (zeros included); with no edge there
    # is nothing to run and every gradient is 0.
    alloc = torch.empty if run else torch.zeros
    dq = alloc(n, nh, cq, dtype=dt)
    dk = alloc(m, nh, cq, dtype=dt)
    dv = alloc(m, nh, cv, dtype=dt)
    ds = alloc(e, nh, dtype=dt)  # dS, which is also the bias gradient
    if run:
        qq, go = _contig(q, dt), _contig(grad_out, dt)
        alpha: np.ndarray = np.empty((e, nh), _np_dtype(dt))
        bb = _contig(bias, dt) if bias is not None else np.empty((0, nh), _np_dtype(dt))
        sc = _scalar(scale, dt)
        _attn_bwd_dst_kernel(
            qq, _contig(k, dt), _contig(v, dt), bb, bias is not None,
            _contig(out, dt), go, _contig(lse, dt), p, c, sc, _chunks(p),
            alpha, ds.numpy(), dq.numpy(),
        )  # fmt: skip
        if csc is None:
            csc = transpose_csr(ptr, col, m)
        tptr, trow, tperm = (_contig(t, torch.int64) for t in csc)
        if tptr.shape[0] != m + 1 or trow.shape[0] != e or tperm.shape[0] != e:
            raise ValueError(
                f"Expected 'csc' = transpose_csr(ptr, col, {m}), got shapes "
                f"{[list(t.shape) for t in csc]}"
            )
        _attn_bwd_src_kernel(
            qq, go, alpha, ds.numpy(), tptr, trow, tperm, sc, _chunks(tptr),
            dk.numpy(), dv.numpy(),
        )  # fmt: skip
    dbias = ds.to(bias.dtype) if bias is not None else None
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dbias
