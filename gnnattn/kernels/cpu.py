r"""CPU kernels, compiled with numba: segment softmax and fused sparse attention.

The public functions have the signatures and results of
:mod:`gnnattn.kernels.reference` (``tests/test_kernels_cpu.py`` compares them),
including its rules for ``-inf`` scores, empty and all ``-inf`` segments.

Why numba. The operator is a loop per target over its incoming edges. Torch
ops cannot express that without gathering ``q_i``, ``k_j`` and ``v_j`` for
every edge (``|E| x C`` tensors, which is what makes PyG's ``TransformerConv``
slow), and ``torch.compile`` lowers the per-segment reductions to the same
gathers and scatters. A torch C++ extension would need a compiler on the
user's machine (or a wheel per torch version). numba ships wheels for the
platforms torch supports, compiles these loops with LLVM for the host CPU
(AVX-512 where there is one), runs ``prange`` loops on a thread pool and
caches the machine code on disk (``cache=True``).

The yardstick. Attention's aggregation ``sum_j alpha_ij v_j`` touches memory
exactly as a CSR SpMM (``torch.sparse.mm``, MKL) of the adjacency with an
``[M, H*C]`` matrix does: one gathered row per edge. Once ``k`` and ``v`` no
longer fit in the caches (N = 200k and up at ``H*C = 128``), every gathered
row is a DRAM access, and a pass over the edges costs about one SpMM. The
passes here, and what each gathers per edge (rows of ``H*C`` numbers):

* forward: ``k_j`` then ``v_j`` (2 rows; ``q_i`` and ``out_i`` once per
  target).
* backward, destination pass (CSR): ``k_j`` and ``v_j`` (2 rows) give the
  weights, ``dp = dout_i . v_j`` and ``D_i = sum_j alpha_ij dp_ij``; a second
  sweep over the target's edges (in cache) accumulates ``dq_i``.
* backward, source pass (transposed CSR): ``q_i`` and ``dout_i`` (2 rows)
  and one cache line of ``(lse_i, D_i)``; ``k_j``/``v_j`` are the source's
  own rows; ``dk_j`` and ``dv_j`` accumulate in cache, so no two threads
  write one row and no atomics are needed. The weights and score gradients
  are recomputed here rather than stored, so the backward makes no
  ``[E, H]`` arrays (without edge features) and does not need the forward's
  output. Forward + backward: 6 gathered rows per edge, SpMM 1.

Software prefetch. With every head of an edge in one loop body, the
out-of-order core sees only an edge or two ahead and would wait on each
gathered row in turn (about 100 ns each from DRAM). Each pass therefore
prefetches the rows of the edge ``_AHEAD = 16`` positions further on, every
cache line of them: this alone made the source pass 3.5x faster at
N = 200k. MKL's SpMM does not, which is why the passes below move their
(larger) traffic faster than it does once the rows come from DRAM.

Where the time goes (``gnnattn bench --suite limit``; float32, 2 threads,
this project's 2-core AMD EPYC, load average 1.2-1.9; random graph, 32
in-edges per node, ``H*C = 4*32``; GB/s counts the bytes each call must
move at least):

=========================  =====================  =====================
one call                   N = 20k (k, v in L3)   N = 200k (DRAM)
=========================  =====================  =====================
CSR SpMM (the yardstick)   9.4 ms, 38 GB/s        348 ms, 10 GB/s
forward                    16.9 ms, 1.8x SpMM     265 ms, 0.76x SpMM
backward, destination      27.9 ms, 3.0x          363 ms, 1.04x
backward, source           30.2 ms, 3.2x          430 ms, 1.24x
forward + backward         76 ms, 8.1x            1089 ms, 3.1x
=========================  =====================  =====================

From DRAM each pass runs at 17-26 GB/s (SpMM: 10): the passes are bound by
memory latency and bandwidth, and the backward's source pass, whose gathers
also fetch a cache line of ``(lse_i, D_i)`` per edge, is the slowest. In
cache the work per edge shows instead: per edge and head a 32-wide dot
product ends in a horizontal reduction (forward: 1, backward: 4) and an
exponential (one per pass), where SpMM does one multiply-add per element;
this is where a fused in-cache kernel still trails SpMM by 2-3x per pass.

Arithmetic. Float64 inputs compute in float64, float32 inputs in float32
(accumulators included); float16/bfloat16 are upcast to float32 and the
results cast back (``lse`` stays float32, as in the Triton kernels). The
kernels are compiled with the fast-math flags ``reassoc``, ``contract``,
``nsz`` and ``arcp`` (so LLVM vectorizes the dot products and fuses
multiply-adds), but not ``nnan``/``ninf``: ``-inf`` scores are data. Every
sum over a segment is made by one thread in one compiled loop, so results are
bitwise the same on every run and every thread count. ``exp`` in float32 is
an inlined Cody-Waite + degree-6 polynomial (Cephes ``expf``, within 1 ulp of
libm on the tested range), compiled with ``fastmath=False`` set explicitly
(numba otherwise compiles a callee with its caller's flags) so that the
two-part ``ln 2`` survives: libm's ``expf`` is a call LLVM cannot vectorize,
and every pass takes one exponential per edge and head. Float64 uses libm's
``exp``. Indices that LLVM cannot prove non-negative make numba's
wrap-around check turn row loads into gathers (5x slower dot products), so
every row loop starts from an index masked with ``_NN``.

Work split. The ``prange`` iterations are chunks of consecutive targets (for
the source pass, of consecutive sources), about ``4 x threads`` of them, cut
so that each holds about the same number of edges. A segment with more than
``max(2048, E / 64)`` edges (a hub) is cut into pieces of that many edges,
each reduced on its own and combined afterwards in piece order (the online
softmax's ``(max, sum, acc)`` merge forward, plain sums backward); the cut
depends only on the graph, never on the thread count, so neither do the
results.

Index width and memory. ``ptr`` is int64; ``col`` (and the transposed CSR's
``row`` and ``perm``) may be int32 or int64: numba compiles a version for
each. :class:`gnnattn.AttentionGraph` keeps its transposed CSR in int32 on
the CPU and an int32 CSR adjacency as given. The backward needs neither the
forward's output nor any ``[E, H]`` array (without edge features), so a
``SelfAttentionConv`` at N = 1M, embed 128, peaks at its ten ``[N, 128]``
tensors (input, upstream gradient, output, q, k, v, dout, dq, dk, dv:
5.1 GB) plus the indices and the interpreter (``gnnattn bench --scale``).

Segment softmax. Per segment: a max pass, an exp pass and a normalize pass,
the last two in cache; on the flat ``[E * F]`` view in lanes (see below), so
the loops vectorize for any number of heads ``F``. It moves 2 x 4 bytes per
element; at E = 10M, H = 4 about a third of its time is the first write of
its (fresh) output pages.

First call. Importing this module compiles nothing. The first call of each
kernel per dtype compiles it (a few seconds) and writes the machine code to
``__pycache__`` (or ``NUMBA_CACHE_DIR``); later processes load it from there
in milliseconds.
"""

from __future__ import annotations

import math
from typing import Any

import numba
import numpy as np
import torch
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic, overload
from torch import Tensor

from ..graphs.csr import transpose_csr

__all__ = [
    "attention_bwd",
    "attention_bwd_dst",
    "attention_bwd_src",
    "attention_fwd",
    "exp32",
    "segment_ptr",
    "segment_softmax_bwd",
    "segment_softmax_fwd",
]

_NEG_INF = -np.inf
# No 'nnan'/'ninf': the kernels compare with -inf and rely on exp(-inf) = 0.
_FAST = {"reassoc", "contract", "nsz", "arcp"}
_JIT: dict[str, Any] = dict(parallel=True, cache=True, nogil=True, fastmath=_FAST)
_INLINE: dict[str, Any] = dict(cache=True, inline="always", fastmath=_FAST)
_CHUNKS_PER_THREAD = 4
# Edges per block of scores held in registers/L1 by the forward.
_BLOCK = 64
# Edges per target whose weights the backward keeps for its second sweep.
_CACHE = 512
# Hubs: a segment longer than max(_PIECE_MIN, E // _PIECES) edges is cut.
_PIECE_MIN = 2048
_PIECES = 64


# ------------------------------------------------------------------ exp


@intrinsic
def _f32_from_bits(typingctx, bits):  # pragma: no cover - compiled
    """The float32 whose bit pattern is the int32 ``bits`` (an LLVM bitcast)."""
    if bits != types.int32:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.int32), codegen


_F = np.float32
_EXP_LO = _F(-87.33654)  # exp(x) < the smallest normal float32 below this: 0
_EXP_HI = _F(88.72283)
_LOG2E = _F(1.44269504088896341)
_LN2_HI = _F(0.693359375)  # ln 2 = _LN2_HI + _LN2_LO, _LN2_HI exact in 9 bits
_LN2_LO = _F(-2.12194440e-4)
_P0, _P1, _P2 = _F(1.9875691500e-4), _F(1.3981999507e-3), _F(8.3334519073e-3)
_P3, _P4, _P5 = _F(4.1665795894e-2), _F(1.6666665459e-1), _F(5.0000001201e-1)
_HALF, _ONE, _ZERO32, _INF32 = _F(0.5), _F(1.0), _F(0.0), _F(np.inf)


# fastmath=False explicitly: numba compiles a callee with its caller's
# fast-math flags unless the callee sets its own, and these kernels set
# 'reassoc', which would undo the two-part ln 2 and merge the scaling below.
@numba.njit(cache=True, fastmath=False)  # pragma: no cover - compiled
def exp32(x):
    """``exp`` of a float32, vectorizable (Cephes ``expf``); 0 below -87.34, inf above 88.72.

    Compiled without fast-math: reassociation would fold ``x - n ln2_hi -
    n ln2_lo`` into ``x - n ln 2`` and lose the low bits of the reduction.
    """
    xc = min(max(x, _EXP_LO), _EXP_HI)
    n = np.floor(xc * _LOG2E + _HALF)
    r = xc - n * _LN2_HI
    r = r - n * _LN2_LO
    p = _P0
    p = p * r + _P1
    p = p * r + _P2
    p = p * r + _P3
    p = p * r + _P4
    p = p * r + _P5
    y = (p * (r * r) + r) + _ONE
    # 2^n as 2^a * 2^b with |a|, |b| <= 64: n runs from -126 to 128 and a
    # single factor would overflow to inf at the top.
    ni = np.int32(n)
    a = ni >> 1
    y = y * _f32_from_bits(np.int32((a + 127) << 23))
    y = y * _f32_from_bits(np.int32((ni - a + 127) << 23))
    if x != x:  # NaN stays NaN
        return x
    if x > _EXP_HI:
        return _INF32
    return y if x >= _EXP_LO else _ZERO32


def _exp(x):  # pragma: no cover - replaced in compiled code by the overload below
    return math.exp(x)


@overload(_exp)
def _exp_overload(x):  # pragma: no cover - compiled
    if x == types.float32:
        return lambda x: exp32(x)
    return lambda x: math.exp(x)


# ------------------------------------------------------------------ helpers

# numba wraps negative indices around (``a[-1]`` is the last element), so an
# index LLVM cannot prove non-negative costs a compare and select per element,
# and turns the contiguous row loads of a vectorized loop into gathers
# (measured: 5x slower dot products). ``x & _NN`` proves ``x >= 0``; every
# loop over a row below starts from such a base.
_NN = np.int64(0x7FFF_FFFF_FFFF_FFFF)


# Gathered rows are DRAM misses once k, v (or q, dout) outgrow the caches.
# The loop bodies are long (every head of an edge), so the out-of-order core
# sees only one or two edges ahead and waits on each row in turn; software
# prefetches of the rows _AHEAD edges on keep ~16 of them in flight (measured:
# 3.5x faster source pass at N = 200k, one thread).
_AHEAD = 16


@intrinsic
def _prefetch(typingctx, arr, i, c):  # pragma: no cover - compiled
    """Prefetch the cache line holding ``arr[i, c]`` (a hint: never faults)."""
    if not isinstance(arr, types.Array) or arr.ndim != 2:
        return None

    def codegen(context, builder, sig, args):
        aryty = sig.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        shape = cgutils.unpack_tuple(builder, ary.shape, 2)
        strides = cgutils.unpack_tuple(builder, ary.strides, 2)
        idx = [
            context.cast(builder, a, t, types.intp)
            for a, t in zip(args[1:], sig.args[1:], strict=True)
        ]
        ptr = cgutils.get_item_pointer2(
            context, builder, ary.data, shape, strides, aryty.layout, idx
        )
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [ptr.type, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        builder.call(fn, [ptr, i32(0), i32(3), i32(1)])  # read, keep in all levels, data
        return context.get_dummy_value()

    return types.void(arr, i, c), codegen


@numba.njit(**_INLINE)
def _prefetch_row(a, i):  # pragma: no cover - compiled
    """Prefetch every cache line of row ``a[i]``."""
    step = 64 // a.itemsize
    for c in range(0, a.shape[1], step):
        _prefetch(a, i, c)


@numba.njit(**_INLINE)
def _dot(a, i, b, j, lo, n):  # pragma: no cover - compiled
    """``sum_c a[i, lo + c] * b[j, lo + c]`` over ``c < n``."""
    t = a.dtype.type(0)
    lo = lo & _NN
    for c in range(n):
        t += a[i, lo + c] * b[j, lo + c]
    return t


@numba.njit(**_INLINE)
def _axpy(acc, w, b, j, lo, n):  # pragma: no cover - compiled
    """``acc[lo + c] += w * b[j, lo + c]`` over ``c < n``."""
    lo = lo & _NN
    for c in range(n):
        acc[lo + c] += w * b[j, lo + c]


@numba.njit(**_INLINE)
def _score(q, i, k, j, h, c, scale, bias, p, has_bias):  # pragma: no cover - compiled
    """``q_i^h . k_j^h * scale (+ bias[p, h])``."""
    s = _dot(q, i, k, j, h * c, c) * scale
    if has_bias:
        s += bias[p, h]
    return s


@numba.njit(**_INLINE)
def _weight(s, lse, zero):  # pragma: no cover - compiled
    """``exp(s - lse)``, and ``zero`` where ``lse = -inf`` (no finite score: no weight)."""
    if lse == _NEG_INF:
        return zero
    return _exp(s - lse)


def _threads() -> int:
    # torch.set_num_threads is what users set; numba has its own pool.
    limit = numba.config.NUMBA_NUM_THREADS  # type: ignore[attr-defined]
    n = max(1, min(torch.get_num_threads(), limit))
    numba.set_num_threads(n)
    return n


def _piece_limit(num_edges: int) -> int:
    """Longest segment reduced in one piece; depends only on the graph."""
    return max(_PIECE_MIN, num_edges // _PIECES)


class _Plan:
    """How one pass over a CSR is split: chunks of whole segments, and hub pieces.

    Attributes:
        bounds: ``[K + 1]`` segment boundaries of the chunks (about equal
            edge counts, hubs counted as ``limit``).
        limit: segments with more edges are skipped by the chunks and cut
            into pieces.
        pieces: ``[P, 3]`` (segment, start, end) of every hub piece, hub
            after hub; ``[0, 3]`` when there is no hub.
        seg: ``[S + 1]``: the pieces of hub ``s`` are ``seg[s]:seg[s+1]``.
    """

    def __init__(self, ptr: np.ndarray, num_edges: int) -> None:
        n = ptr.shape[0] - 1
        self.limit = _piece_limit(num_edges)
        deg = np.diff(ptr)
        big = np.flatnonzero(deg > self.limit)
        k = max(1, min(n, _CHUNKS_PER_THREAD * _threads()))
        if big.size:
            # Balance on the edges the chunks really run (plus one per node
            # for its own row), not on the hubs they skip.
            work = np.cumsum(np.minimum(deg, self.limit) + 1)
            cuts = np.searchsorted(work, np.linspace(0, int(work[-1]), k + 1), side="left")
        else:
            cuts = np.searchsorted(ptr, np.linspace(0, num_edges, k + 1), side="left")
        cuts[0], cuts[-1] = 0, n
        # Equal cuts (a big segment, or no edges) make empty chunks: drop them.
        self.bounds = np.unique(cuts).astype(np.int64)
        counts = (deg[big] + self.limit - 1) // self.limit  # pieces per hub
        self.seg = np.zeros(big.size + 1, np.int64)
        np.cumsum(counts, out=self.seg[1:])
        total = int(self.seg[-1])
        self.pieces = np.empty((total, 3), np.int64)
        if total:
            hub = np.repeat(big, counts)
            first = np.repeat(self.seg[:-1], counts)
            start = ptr[hub] + (np.arange(total) - first) * self.limit
            self.pieces[:, 0] = hub
            self.pieces[:, 1] = start
            self.pieces[:, 2] = np.minimum(start + self.limit, ptr[hub + 1])


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    # float64 stays float64; float32 and the half types compute in float32.
    return torch.float64 if dtype == torch.float64 else torch.float32


def _floating(name: str, t: Tensor) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"Expected '{name}' to be a Tensor, got {type(t).__name__}")
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


def _check_index(col: Tensor, num: int, name: str = "col") -> np.ndarray:
    """``col`` as int32/int64 numpy with every id in ``[0, num)``."""
    if col.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"Expected '{name}' int64 or int32, got {col.dtype}")
    if col.dim() != 1:
        raise ValueError(f"Expected '{name}' of shape [E], got {list(col.shape)}")
    if col.device.type != "cpu":
        raise ValueError(f"Expected '{name}' on the CPU, got {col.device}")
    c = col.contiguous().numpy()
    if c.shape[0] and (c.min() < 0 or c.max() >= num):
        raise ValueError(f"Expected '{name}' ids in [0, {num}), got [{c.min()}, {c.max()}]")
    return c


def _flat(t: Tensor, dtype: torch.dtype) -> Tensor:
    """``t`` ``[E, ...]`` as a contiguous ``[E, F]`` tensor of ``dtype``."""
    # .detach(): .numpy() refuses tensors that require grad; no copy when
    # the dtype and layout already fit.
    t = t.detach().to(dtype)
    return t.reshape(t.shape[0], math.prod(t.shape[1:])).contiguous()  # (E, F)


def _rows(t: Tensor, dtype: torch.dtype) -> np.ndarray:
    """``[N, H, C]`` as a contiguous ``[N, H*C]`` numpy array (no copy when it fits)."""
    return _flat(t, dtype).numpy()


def _np_dtype(dt: torch.dtype) -> type:
    return np.float64 if dt == torch.float64 else np.float32


def _scalar(x: float, dtype: torch.dtype) -> np.floating:
    # A float64 scale would promote every float32 product to float64.
    return np.float64(x) if dtype == torch.float64 else np.float32(x)


# ------------------------------------------------------------------ softmax


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
            lv[h] = max(lv[h], x) if mode == 0 else lv[h] + x
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
                    lv[ln] = max(lv[ln], src[x + ln])
            for ln in range(rest):
                lv[ln] = max(lv[ln], src[tail + ln])
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
                lv[ln] = one / lv[ln] if lv[ln] > zero else one
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


def _segment_bounds(p: np.ndarray, num_edges: int) -> np.ndarray:
    # Segment softmax never splits a segment: a hub's exponentials are
    # normalized while in cache, and the pass is cheap next to attention.
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
    p = _check_ptr(ptr, src.shape[0])
    x = _flat(src, _work_dtype(src.dtype))  # (E, F)
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
    p = _check_ptr(ptr, y.shape[0])
    dt = _work_dtype(y.dtype)
    yy, gg = _flat(y, dt), _flat(grad, dt)  # (E, F) each
    out = torch.empty_like(yy)
    if yy.numel():
        bounds = _segment_bounds(p, yy.shape[0])
        _softmax_bwd_kernel(
            yy.view(-1).numpy(), gg.view(-1).numpy(), yy.shape[1], p, bounds, out.view(-1).numpy()
        )
    return out.view(y.shape).to(y.dtype)


# ---------------------------------------------------------------- attention
#
# Arrays are 2-D rows: q, k [*, H*C], v, dout, out [*, H*Cv]; head h of a row
# is the slice [h*C, (h+1)*C).


@numba.njit(**_INLINE)
def _fwd_segment(
    q, i, k, v, bias, has_bias, col, s0, e0, scale, sc, m, tot, acc
):  # pragma: no cover - compiled
    """Online softmax of target ``i`` over the edges ``s0:e0``, a block at a time.

    Leaves the running max ``m``, sum ``tot`` and unnormalized ``acc`` (per
    head) for :func:`_fwd_finish` or a merge with other pieces.
    """
    nh = m.shape[0]
    cq = q.shape[1] // nh
    cv = v.shape[1] // nh
    zero = q.dtype.type(0)
    m[:] = _NEG_INF
    tot[:] = zero
    acc[:] = zero
    b0 = s0 & _NN
    while b0 < e0:
        nb = min(_BLOCK, e0 - b0)
        # Scores of the block: every head of an edge from one gathered k row.
        for t in range(nb):
            ahead = b0 + t + _AHEAD
            if ahead < col.shape[0]:
                # v rows too: the weighted sum below reads them after the block.
                jj = col[ahead] & _NN
                _prefetch_row(k, jj)
                _prefetch_row(v, jj)
            j = col[b0 + t] & _NN
            for h in range(nh):
                sc[h, t] = _score(q, i, k, j, h, cq, scale, bias, b0 + t, has_bias)
        for h in range(nh):
            mb = m[h]
            for t in range(nb):
                mb = max(mb, sc[h, t])
            if mb > m[h]:
                # A new maximum rescales what was accumulated (exp(-inf) = 0
                # on the first finite score).
                corr = _exp(m[h] - mb)
                tot[h] *= corr
                lo = (h * cv) & _NN
                for c in range(cv):
                    acc[lo + c] *= corr
                m[h] = mb
            # All -inf so far: shift by 0, every weight is 0 (never NaN).
            shift = m[h] if m[h] != _NEG_INF else zero
            w_sum = zero
            for t in range(nb):
                w = _exp(sc[h, t] - shift)
                sc[h, t] = w
                w_sum += w
            tot[h] += w_sum
        # The weighted sum: one gathered v row per edge.
        for t in range(nb):
            j = col[b0 + t] & _NN
            for h in range(nh):
                _axpy(acc, sc[h, t], v, j, h * cv, cv)
        b0 += nb


@numba.njit(**_INLINE)
def _fwd_finish(m, tot, acc, out, lse, i):  # pragma: no cover - compiled
    nh = m.shape[0]
    cv = out.shape[1] // nh
    zero = out.dtype.type(0)
    one = out.dtype.type(1)
    for h in range(nh):
        lo = (h * cv) & _NN
        if tot[h] > zero:
            inv = one / tot[h]
            for c in range(cv):
                out[i, lo + c] = acc[lo + c] * inv
            lse[i, h] = m[h] + math.log(tot[h])
        else:  # no edge, or only -inf scores
            for c in range(cv):
                out[i, lo + c] = zero
            lse[i, h] = _NEG_INF


@numba.njit(**_JIT)
def _fwd_kernel(
    q, k, v, bias, has_bias, ptr, col, scale, bounds, limit, out, lse
):  # pragma: no cover - compiled
    nh = lse.shape[1]
    cv = v.shape[1] // nh
    for ch in prange(bounds.shape[0] - 1):
        sc = np.empty((nh, _BLOCK), dtype=q.dtype)
        m = np.empty(nh, dtype=q.dtype)
        tot = np.empty(nh, dtype=q.dtype)
        acc = np.empty(nh * cv, dtype=q.dtype)
        for i in range(bounds[ch] & _NN, bounds[ch + 1]):
            s0, e0 = ptr[i], ptr[i + 1]
            if e0 - s0 > limit:
                continue  # a hub: _fwd_pieces_kernel
            _fwd_segment(q, i, k, v, bias, has_bias, col, s0, e0, scale, sc, m, tot, acc)
            _fwd_finish(m, tot, acc, out, lse, i)


@numba.njit(**_JIT)
def _fwd_pieces_kernel(
    q, k, v, bias, has_bias, col, scale, pieces, seg, out, lse
):  # pragma: no cover - compiled
    nh = lse.shape[1]
    cv = v.shape[1] // nh
    npc = pieces.shape[0]
    pm = np.empty((npc, nh), dtype=q.dtype)
    pt = np.empty((npc, nh), dtype=q.dtype)
    pa = np.empty((npc, nh * cv), dtype=q.dtype)
    for x in prange(npc):
        sc = np.empty((nh, _BLOCK), dtype=q.dtype)
        _fwd_segment(
            q, pieces[x, 0] & _NN, k, v, bias, has_bias, col, pieces[x, 1], pieces[x, 2], scale,
            sc, pm[x], pt[x], pa[x],
        )  # fmt: skip
    zero = q.dtype.type(0)
    for s in prange(seg.shape[0] - 1):
        m = np.empty(nh, dtype=q.dtype)
        tot = np.empty(nh, dtype=q.dtype)
        acc = np.zeros(nh * cv, dtype=q.dtype)
        # Merge the pieces' (max, sum, acc) in piece order.
        for h in range(nh):
            mh = _NEG_INF
            for x in range(seg[s] & _NN, seg[s + 1]):
                mh = max(mh, pm[x, h])
            m[h] = mh
            shift = mh if mh != _NEG_INF else zero
            tot[h] = zero
            for x in range(seg[s] & _NN, seg[s + 1]):
                f = _exp(pm[x, h] - shift)
                tot[h] += pt[x, h] * f
                _axpy(acc, f, pa, x, h * cv, cv)
        _fwd_finish(m, tot, acc, out, lse, pieces[seg[s], 0] & _NN)


@numba.njit(**_INLINE)
def _dst_delta(
    q, i, k, v, dout, lse, bias, has_bias, col, s0, e0, scale, wa, wp, dl
):  # pragma: no cover - compiled
    """Partial sums of ``D_i`` over ``s0:e0``: ``dl[h] = sum_j alpha_ij (dout_i . v_j)``,
    ``dl[H + h] = sum_j alpha_ij``.

    ``D_i`` is their ratio (see :func:`_delta`). Keeps ``alpha`` and
    ``dout_i . v_j`` in ``wa``/``wp`` when the edges fit.
    """
    nh = dl.shape[0] // 2
    cq = q.shape[1] // nh
    cv = v.shape[1] // nh
    zero = q.dtype.type(0)
    keep = e0 - s0 <= wa.shape[1]
    dl[:] = zero
    s0 = s0 & _NN
    for t in range(e0 - s0):
        p = s0 + t
        if p + _AHEAD < col.shape[0]:
            jj = col[p + _AHEAD] & _NN
            _prefetch_row(k, jj)
            _prefetch_row(v, jj)
        j = col[p] & _NN
        for h in range(nh):
            a = _weight(_score(q, i, k, j, h, cq, scale, bias, p, has_bias), lse[i, h], zero)
            dp = _dot(dout, i, v, j, h * cv, cv)
            dl[h] += a * dp
            dl[nh + h] += a
            if keep:
                wa[h, t] = a
                wp[h, t] = dp


@numba.njit(**_INLINE)
def _delta(dl, ld, i):  # pragma: no cover - compiled
    """``D_i`` from :func:`_dst_delta`'s sums, into ``ld[i, H:]``.

    ``D_i = sum_j alpha_ij dp_ij`` with ``sum_j alpha_ij = 1``; dividing by the
    computed sum of the weights removes the rounding of ``lse`` from it (as
    ``D_i = dout_i . out_i`` does with the forward's normalized output), so
    ``dS_ij = alpha_ij (dp_ij - D_i)`` is exactly 0 where every edge of a
    target carries the same ``dp``, as it must be.
    """
    nh = dl.shape[0] // 2
    zero = dl.dtype.type(0)
    for h in range(nh):
        ld[i, nh + h] = dl[h] / dl[nh + h] if dl[nh + h] > zero else zero


@numba.njit(**_INLINE)
def _dst_grad(
    q, i, k, v, dout, lse, bias, has_bias, col, s0, e0, scale, wa, wp, ld, acc, dbias
):  # pragma: no cover - compiled
    """``dq_i += sum_j dS_ij k_j`` over ``s0:e0`` into ``acc`` (and ``dS`` into ``dbias``)."""
    nh = ld.shape[1] // 2
    cq = q.shape[1] // nh
    cv = v.shape[1] // nh
    zero = q.dtype.type(0)
    keep = e0 - s0 <= wa.shape[1]
    s0 = s0 & _NN
    for t in range(e0 - s0):
        p = s0 + t
        if not keep and p + _AHEAD < col.shape[0]:
            jj = col[p + _AHEAD] & _NN
            _prefetch_row(k, jj)
            _prefetch_row(v, jj)
        j = col[p] & _NN
        for h in range(nh):
            if keep:
                a = wa[h, t]
                dp = wp[h, t]
            else:
                s = _score(q, i, k, j, h, cq, scale, bias, p, has_bias)
                a = _weight(s, lse[i, h], zero)
                dp = _dot(dout, i, v, j, h * cv, cv)
            ds = a * (dp - ld[i, nh + h])
            if has_bias:
                dbias[p, h] = ds
            _axpy(acc, ds * scale, k, j, h * cq, cq)


@numba.njit(**_JIT)
def _bwd_dst_kernel(
    q, k, v, dout, lse, bias, has_bias, ptr, col, scale, bounds, limit, dq, ld, dbias
):  # pragma: no cover - compiled
    nh = lse.shape[1]
    cq = q.shape[1] // nh
    zero = q.dtype.type(0)
    for ch in prange(bounds.shape[0] - 1):
        wa = np.empty((nh, _CACHE), dtype=q.dtype)
        wp = np.empty((nh, _CACHE), dtype=q.dtype)
        dl = np.empty(2 * nh, dtype=q.dtype)
        acc = np.empty(nh * cq, dtype=q.dtype)
        for i in range(bounds[ch] & _NN, bounds[ch + 1]):
            s0, e0 = ptr[i], ptr[i + 1]
            if e0 - s0 > limit:
                continue  # a hub: _bwd_dst_pieces_kernel
            _dst_delta(q, i, k, v, dout, lse, bias, has_bias, col, s0, e0, scale, wa, wp, dl)
            _delta(dl, ld, i)
            acc[:] = zero
            _dst_grad(
                q, i, k, v, dout, lse, bias, has_bias, col, s0, e0, scale, wa, wp, ld, acc, dbias
            )
            for c in range(nh * cq):
                dq[i, c] = acc[c]


@numba.njit(**_JIT)
def _bwd_dst_pieces_kernel(
    q, k, v, dout, lse, bias, has_bias, col, scale, pieces, seg, dq, ld, dbias
):  # pragma: no cover - compiled
    nh = lse.shape[1]
    cq = q.shape[1] // nh
    zero = q.dtype.type(0)
    npc = pieces.shape[0]
    pd = np.empty((npc, 2 * nh), dtype=q.dtype)
    pa = np.zeros((npc, nh * cq), dtype=q.dtype)
    # Pieces are longer than the kept-weights cache: both sweeps recompute.
    nokeep = np.empty((nh, 0), dtype=q.dtype)
    for x in prange(npc):
        _dst_delta(
            q, pieces[x, 0] & _NN, k, v, dout, lse, bias, has_bias, col, pieces[x, 1],
            pieces[x, 2], scale, nokeep, nokeep, pd[x],
        )  # fmt: skip
    for s in prange(seg.shape[0] - 1):
        dl = np.zeros(2 * nh, dtype=q.dtype)
        for x in range(seg[s] & _NN, seg[s + 1]):
            for h in range(2 * nh):
                dl[h] += pd[x, h]
        _delta(dl, ld, pieces[seg[s], 0] & _NN)
    for x in prange(npc):
        _dst_grad(
            q, pieces[x, 0] & _NN, k, v, dout, lse, bias, has_bias, col, pieces[x, 1],
            pieces[x, 2], scale, nokeep, nokeep, ld, pa[x], dbias,
        )  # fmt: skip
    for s in prange(seg.shape[0] - 1):
        i = pieces[seg[s], 0] & _NN
        for c in range(nh * cq):
            d = zero
            for x in range(seg[s] & _NN, seg[s + 1]):
                d += pa[x, c]
            dq[i, c] = d


@numba.njit(**_INLINE)
def _src_segment(
    q, k, j, v, dout, ld, bias, has_bias, trow, tperm, t0, t1, scale, ak, av
):  # pragma: no cover - compiled
    """``dk_j``, ``dv_j`` over the outgoing edges ``t0:t1`` of source ``j`` into ``ak``, ``av``."""
    nh = ld.shape[1] // 2
    cq = q.shape[1] // nh
    cv = v.shape[1] // nh
    zero = q.dtype.type(0)
    for t in range(t0 & _NN, t1):
        if t + _AHEAD < trow.shape[0]:
            ii = trow[t + _AHEAD] & _NN
            _prefetch_row(q, ii)
            _prefetch_row(dout, ii)
            _prefetch(ld, ii, 0)
        i = trow[t] & _NN
        p = tperm[t] if has_bias else t  # the bias is in CSR order
        for h in range(nh):
            a = _weight(_score(q, i, k, j, h, cq, scale, bias, p, has_bias), ld[i, h], zero)
            dp = _dot(dout, i, v, j, h * cv, cv)
            g = a * (dp - ld[i, nh + h]) * scale
            _axpy(av, a, dout, i, h * cv, cv)
            _axpy(ak, g, q, i, h * cq, cq)


@numba.njit(**_JIT)
def _bwd_src_kernel(
    q, k, v, dout, ld, bias, has_bias, tptr, trow, tperm, scale, bounds, limit, dk, dv
):  # pragma: no cover - compiled
    nh = ld.shape[1] // 2
    cq = q.shape[1] // nh
    cv = v.shape[1] // nh
    zero = q.dtype.type(0)
    for ch in prange(bounds.shape[0] - 1):
        ak = np.empty(nh * cq, dtype=q.dtype)
        av = np.empty(nh * cv, dtype=q.dtype)
        for j in range(bounds[ch] & _NN, bounds[ch + 1]):
            t0, t1 = tptr[j], tptr[j + 1]
            if t1 - t0 > limit:
                continue  # a hub: _bwd_src_pieces_kernel
            ak[:] = zero
            av[:] = zero
            _src_segment(q, k, j, v, dout, ld, bias, has_bias, trow, tperm, t0, t1, scale, ak, av)
            for c in range(nh * cq):
                dk[j, c] = ak[c]
            for c in range(nh * cv):
                dv[j, c] = av[c]


@numba.njit(**_JIT)
def _bwd_src_pieces_kernel(
    q, k, v, dout, ld, bias, has_bias, trow, tperm, scale, pieces, seg, dk, dv
):  # pragma: no cover - compiled
    nh = ld.shape[1] // 2
    cq = q.shape[1] // nh
    cv = v.shape[1] // nh
    zero = q.dtype.type(0)
    npc = pieces.shape[0]
    pk = np.zeros((npc, nh * cq), dtype=q.dtype)
    pv = np.zeros((npc, nh * cv), dtype=q.dtype)
    for x in prange(npc):
        _src_segment(
            q, k, pieces[x, 0] & _NN, v, dout, ld, bias, has_bias, trow, tperm, pieces[x, 1],
            pieces[x, 2], scale, pk[x], pv[x],
        )  # fmt: skip
    for s in prange(seg.shape[0] - 1):
        j = pieces[seg[s], 0] & _NN
        for c in range(nh * cq):
            d = zero
            for x in range(seg[s] & _NN, seg[s + 1]):
                d += pk[x, c]
            dk[j, c] = d
        for c in range(nh * cv):
            d = zero
            for x in range(seg[s] & _NN, seg[s + 1]):
                d += pv[x, c]
            dv[j, c] = d


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


def _check_rows(name: str, t: Tensor, shape: tuple[int, ...]) -> None:
    _floating(name, t)
    if tuple(t.shape) != shape:
        raise ValueError(f"Expected '{name}' of shape {list(shape)}, got {list(t.shape)}")


def _bias(bias: Tensor | None, dt: torch.dtype, nh: int) -> np.ndarray:
    if bias is None:
        return np.empty((0, nh), _np_dtype(dt))
    return bias.detach().to(dt).contiguous().numpy()


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

    One pass per target over its incoming edges with a blockwise online
    softmax; no ``[E, C]`` array is made.

    Args:
        q: ``[N, H, C]`` queries of the targets.
        k: ``[M, H, C]`` keys of the sources.
        v: ``[M, H, Cv]`` values of the sources.
        ptr: ``[N + 1]`` int64 CSR pointers (incoming edges per target).
        col: ``[E]`` int64 or int32 source of each edge.
        scale: multiplies ``q . k``.
        bias: optional ``[E, H]`` additive score bias (edge features).

    Returns:
        ``out`` ``[N, H, Cv]`` typed like ``q`` and the log-sum-exp ``lse``
        ``[N, H]`` in the compute dtype (float64 for float64, else float32);
        ``lse = -inf`` and ``out = 0`` where a target has no finite score.

    Raises:
        ValueError: on shapes that do not fit, or ``ptr``/``col`` out of range.
        TypeError: on non-floating inputs or non-integer ``ptr``/``col``.
    """
    e = col.numel()
    _check_qkv(q, k, v, bias, e)
    p = _check_ptr(ptr, e)
    c = _check_index(col, k.shape[0])
    dt = _work_dtype(q.dtype)
    n, nh, cv = q.shape[0], q.shape[1], v.shape[2]
    out = torch.empty(n, nh * cv, dtype=dt)
    lse = torch.empty(n, nh, dtype=dt)
    if n * nh:
        qq, kk, vv = _rows(q, dt), _rows(k, dt), _rows(v, dt)
        bb, sc = _bias(bias, dt, nh), _scalar(scale, dt)
        plan = _Plan(p, e)
        o, ls = out.numpy(), lse.numpy()
        _fwd_kernel(qq, kk, vv, bb, bias is not None, p, c, sc, plan.bounds, plan.limit, o, ls)
        if plan.pieces.shape[0]:
            _fwd_pieces_kernel(
                qq, kk, vv, bb, bias is not None, c, sc, plan.pieces, plan.seg, o, ls
            )
    return out.view(n, nh, cv).to(q.dtype), lse


def attention_bwd_dst(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    lse: Tensor,
    grad_out: Tensor,
    ptr: Tensor,
    col: Tensor,
    scale: float,
    bias: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """The backward's destination pass: ``dq``, ``D`` and the score gradient.

    Args:
        q, k, v, lse, grad_out, ptr, col, scale, bias: as in :func:`attention_bwd`.

    Returns:
        ``dq`` ``[N, H, C]`` (compute dtype), ``ld`` ``[N, 2H]`` (``lse`` and
        ``D_i = sum_j alpha_ij (dout_i . v_j)`` side by side, what the source
        pass reads per edge) and ``dS`` ``[E, H]`` (``None`` without a bias).
    """
    e = col.numel()
    _check_qkv(q, k, v, bias, e)
    n, nh, cq = q.shape
    cv = v.shape[2]
    _check_rows("grad_out", grad_out, (n, nh, cv))
    _check_rows("lse", lse, (n, nh))
    p = _check_ptr(ptr, e)
    c = _check_index(col, k.shape[0])
    dt = _work_dtype(q.dtype)
    alloc = torch.empty if e else torch.zeros
    dq = alloc(n, nh * cq, dtype=dt)
    ld = torch.empty(n, 2 * nh, dtype=dt)
    ld[:, :nh] = lse
    ld[:, nh:] = 0
    ds = torch.zeros(e, nh, dtype=dt) if bias is not None else None
    if e and nh:
        qq, kk, vv, go = _rows(q, dt), _rows(k, dt), _rows(v, dt), _rows(grad_out, dt)
        ll = lse.detach().to(dt).contiguous().numpy()
        bb, sc = _bias(bias, dt, nh), _scalar(scale, dt)
        dd = ds.numpy() if ds is not None else np.empty((0, nh), _np_dtype(dt))
        plan = _Plan(p, e)
        has_bias = bias is not None
        args = (qq, kk, vv, go, ll, bb, has_bias)
        _bwd_dst_kernel(
            *args, p, c, sc, plan.bounds, plan.limit, dq.numpy(), ld.numpy(), dd
        )  # fmt: skip
        if plan.pieces.shape[0]:
            _bwd_dst_pieces_kernel(
                *args, c, sc, plan.pieces, plan.seg, dq.numpy(), ld.numpy(), dd
            )  # fmt: skip
    return dq.view(n, nh, cq), ld, ds


def attention_bwd_src(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    ld: Tensor,
    grad_out: Tensor,
    csc: tuple[Tensor, Tensor, Tensor],
    scale: float,
    bias: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The backward's source pass: ``dk`` and ``dv`` over the transposed CSR.

    Args:
        q, k, v, grad_out, scale, bias: as in :func:`attention_bwd`.
        ld: ``[N, 2H]`` from :func:`attention_bwd_dst`.
        csc: ``(tptr, trow, tperm)``, the transposed CSR.

    Returns:
        ``dk`` ``[M, H, C]`` and ``dv`` ``[M, H, Cv]`` in the compute dtype.
    """
    n, nh, cq = q.shape
    m, cv = k.shape[0], v.shape[2]
    dt = _work_dtype(q.dtype)
    tptr, trow, tperm = csc
    e = trow.numel()
    _check_rows("ld", ld, (n, 2 * nh))
    if tptr.numel() != m + 1 or tperm.numel() != e or (bias is not None and bias.shape[0] != e):
        raise ValueError(
            f"Expected 'csc' = transpose_csr(ptr, col, {m}) of a graph with the bias's edges, got "
            f"shapes {[list(t.shape) for t in csc]}"
        )
    tp = _check_ptr(tptr, e, "csc")
    tr = _check_index(trow, n, "csc")
    tq = _check_index(tperm, e, "csc")
    alloc = torch.empty if e else torch.zeros
    dk = alloc(m, nh * cq, dtype=dt)
    dv = alloc(m, nh * cv, dtype=dt)
    if e and nh:
        qq, kk, vv, go = _rows(q, dt), _rows(k, dt), _rows(v, dt), _rows(grad_out, dt)
        lld = ld.detach().to(dt).contiguous().numpy()
        bb, sc = _bias(bias, dt, nh), _scalar(scale, dt)
        plan = _Plan(tp, e)
        args = (qq, kk, vv, go, lld, bb, bias is not None)
        _bwd_src_kernel(*args, tp, tr, tq, sc, plan.bounds, plan.limit, dk.numpy(), dv.numpy())
        if plan.pieces.shape[0]:
            _bwd_src_pieces_kernel(
                *args, tr, tq, sc, plan.pieces, plan.seg, dk.numpy(), dv.numpy()
            )  # fmt: skip
    return dk.view(m, nh, cq), dv.view(m, nh, cv)


def attention_bwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor | None,
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

    FlashAttention's recomputation: ``alpha`` comes back from ``lse``. ``dq``
    and ``D_i = sum_j alpha_ij dalpha_ij`` are summed per target over the CSR
    (:func:`attention_bwd_dst`), ``dk`` and ``dv`` per source over the
    transposed CSR (:func:`attention_bwd_src`), which recomputes the weights
    instead of reading stored ones.

    Args:
        q: ``[N, H, C]``, as in the forward.
        k: ``[M, H, C]``.
        v: ``[M, H, Cv]``.
        out: ``[N, H, Cv]`` the forward output, or ``None``: this kernel
            computes ``D_i`` from the edges and does not read it (so the
            caller need not keep it); given, its shape is checked.
        lse: ``[N, H]`` the forward log-sum-exp.
        grad_out: ``[N, H, Cv]`` the gradient of ``out``.
        ptr: ``[N + 1]`` int64 CSR pointers.
        col: ``[E]`` int64 or int32 sources.
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
        TypeError: on non-floating inputs or non-integer ``ptr``/``col``.
    """
    e = col.numel()
    _check_qkv(q, k, v, bias, e)
    n, nh, _ = q.shape
    m, cv = k.shape[0], v.shape[2]
    if out is not None:
        _check_rows("out", out, (n, nh, cv))
    dq, ld, ds = attention_bwd_dst(q, k, v, lse, grad_out, ptr, col, scale, bias)
    if csc is None:
        csc = transpose_csr(ptr, col, m)
    dk, dv = attention_bwd_src(q, k, v, ld, grad_out, csc, scale, bias)
    dbias = ds.to(bias.dtype) if bias is not None and ds is not None else None
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dbias
