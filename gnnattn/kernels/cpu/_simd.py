r"""The compiled building blocks every CPU kernel uses: flags, ``exp``, prefetch, row loops.

**Fast-math flags.** The kernels are compiled with ``reassoc``, ``contract``,
``nsz`` and ``arcp`` (so LLVM vectorizes the dot products and fuses
multiply-adds), but not ``nnan``/``ninf``: ``-inf`` scores are data, and a
NaN must stay a NaN (:func:`_max` does not hide one either).

**exp.** ``exp`` in float32 is an inlined Cody-Waite + degree-6 polynomial
(Cephes ``expf``, within 1 ulp of libm on the tested range), compiled with
``fastmath=False`` set explicitly (numba otherwise compiles a callee with its
caller's flags) so that the two-part ``ln 2`` survives: libm's ``expf`` is a
call LLVM cannot vectorize, and every pass takes one exponential per edge and
head. Float64 uses libm's ``exp``.

**Non-negative indices.** numba wraps negative indices around (``a[-1]`` is
the last element), so an index LLVM cannot prove non-negative costs a compare
and select per element, and turns the contiguous row loads of a vectorized
loop into gathers. ``x & _NN`` proves ``x >= 0``; every loop over a row starts
from such a base.

**Software prefetch.** With every head of an edge in one loop body, the
out-of-order core sees only an edge or two ahead and would wait on each
gathered row in turn (a DRAM latency each once the rows outgrow the caches).
Each pass therefore prefetches every cache line of the rows of the edge
``_AHEAD`` positions further on, which keeps about that many rows in flight.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from . import _cache  # noqa: F401  (before any kernel: the cache's freshness stamp)

_NEG_INF = -np.inf
# No 'nnan'/'ninf': the kernels compare with -inf and rely on exp(-inf) = 0.
_FAST = frozenset({"reassoc", "contract", "nsz", "arcp"})
#: The options of a kernel (a ``prange`` loop), of a serial kernel and of an inlined helper.
_JIT: Mapping[str, Any] = MappingProxyType(
    dict(parallel=True, cache=True, nogil=True, fastmath=set(_FAST))
)
#: A kernel that runs on the calling thread (work too small to share).
_SERIAL: Mapping[str, Any] = MappingProxyType(dict(cache=True, nogil=True, fastmath=set(_FAST)))
_INLINE: Mapping[str, Any] = MappingProxyType(
    dict(cache=True, inline="always", fastmath=set(_FAST))
)

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


@numba.njit(**_INLINE)
def _exp_first(a, n):  # pragma: no cover - compiled
    """``a[u] = exp(a[u])`` for ``u < n`` of a 1-D array: one contiguous loop, which LLVM
    vectorizes (a kernel's weights of every head of a block of edges, where a loop per
    edge and head of about 2 edges per target would take a scalar exp each)."""
    for u in range(n & _NN):
        a[u] = _exp(a[u])


@numba.njit(**_INLINE)
def _max(a, b):  # pragma: no cover - compiled
    """The larger of ``a`` and ``b``, NaN if either is (Python's ``max`` keeps ``a``
    when ``b`` is NaN)."""
    return a if (a >= b or a != a) else b


# ------------------------------------------------------------------ rows

_NN = np.int64(0x7FFF_FFFF_FFFF_FFFF)
#: Edges between the one a pass works on and the one whose rows it prefetches.
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
    r = a.dtype.type(0)
    lo = lo & _NN
    for c in range(n):
        r += a[i, lo + c] * b[j, lo + c]
    return r


# fastmath=False and not inlined, as exp32: the path of the rare score that
# the fast loop made -inf, where the flags would change the answer.
@numba.njit(cache=True, fastmath=False)  # pragma: no cover - compiled
def _dot_strict(a, i, b, j, lo, n):
    """:func:`_dot` in IEEE arithmetic: each product rounded, summed in order."""
    r = a.dtype.type(0)
    lo = lo & _NN
    for c in range(n):
        r += a[i, lo + c] * b[j, lo + c]
    return r


@numba.njit(**_INLINE)
def _score_dot(a, i, b, j, lo, n):  # pragma: no cover - compiled
    """:func:`_dot` for a score, with overflow as the reference has it.

    With 'contract' and 'reassoc' an overflowing dot product takes the sign
    of whichever huge term its chain met first: a fused multiply-add never
    rounds a product to inf, so ``+1e40 - 1e40`` (inputs of 1e20 in float32)
    can come out -inf, a masked edge and a finite target, where the rounded
    products sum to ``inf - inf = NaN`` (torch, the ``"mp"`` backend). Only
    -inf needs the second look: a +inf or NaN score makes the target NaN
    either way. One compare per score, and the strict sum only where the dot
    product itself is -inf (a -inf input, or an overflow; a score masked by
    its bias is not).
    """
    r = _dot(a, i, b, j, lo, n)
    if r == _NEG_INF:
        r = _dot_strict(a, i, b, j, lo, n)
    return r


@numba.njit(**_INLINE)
def _axpy(acc, w, b, j, lo, n):  # pragma: no cover - compiled
    """``acc[lo + c] += w * b[j, lo + c]`` over ``c < n``."""
    lo = lo & _NN
    for c in range(n):
        acc[lo + c] += w * b[j, lo + c]
