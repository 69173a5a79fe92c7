"""What one edge contributes: its score, its weight, its message and the options on them.

Arrays are 2-D rows: ``q``, ``k`` ``[*, H*C]``; ``v``, ``dout`` and ``out``
``[*, H*Cv]``; head ``h`` of a row is the slice ``[h*C, (h+1)*C)``. ``e`` is
an edge's destination-CSR position (the order of the per-edge arrays and of
the dropout counter).

**Options at no cost when absent.** The dropout stream's key (``key``,
uint64 ``[threshold, seed_lo, seed_hi, offset]``, with its scale
``dscale``) reaches the kernels as an argument that is ``None`` when there
is no dropout. numba compiles a specialisation per combination of argument
types, and the helpers below are typed by their overloads: with ``None`` the
dropout factor is the constant 1, so a call without dropout runs the code
the kernels had before the option existed, and a call with it pays only for
it: one integer hash per edge and head (:mod:`._random`). Arrays and
scalars, not tuples: numba passes only those into the body of a ``prange``
loop. The source pass's ``dsv`` (the score gradient the destination pass
stored) is chosen the same way.

**Edge features.** The raw edge features ``ea`` ``[E, F]`` (CSR order, read
sequentially; or ``[E, H, F]``, a row per head: :func:`_ea`), the per-target
edge query ``eq`` ``[N, H*F]`` (its score term ``eq_i^h . ea_e^h``, times the
scale for per-head features: :func:`_edge_score`), the
gradient of the forward's ``edge_out`` ``gg`` ``[N, H*F]`` and the per-target
accumulators of ``edge_out`` / ``d edge_query`` (``eacc``, ``[H*F]``) follow
the same rule:
``None`` compiles the helpers below to nothing, so the kernels without edge
features are those the options had before. (``eacc`` is a size-0 array then,
allocated once per chunk; every helper that touches it is keyed on ``ea``.)

The overloads are inlined into the kernels by numba (``inline="always"``),
before LLVM optimizes the kernels' loops: compiled as separate functions and
inlined by LLVM afterwards, they left the plain forward measurably slower.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import numba
from numba import types
from numba.extending import overload

from ._random import _keep
from ._simd import (
    _FAST,
    _INLINE,
    _NEG_INF,
    _NN,
    _axpy,
    _dot,
    _exp,
    _prefetch_row,
    _score_dot,
)

# Inlined by numba (see the module docstring), with the kernels' fast-math flags.
_OL: Mapping[str, Any] = MappingProxyType(
    dict(inline="always", jit_options=dict(fastmath=set(_FAST)))
)


@numba.njit(**_INLINE)
def _score(q, i, k, j, h, c, scale, bias, e, has_bias):  # pragma: no cover - compiled
    """``q_i^h . k_j^h * scale (+ bias[e, h])``."""
    s = _score_dot(q, i, k, j, h * c, c) * scale
    if has_bias:
        s += bias[e, h]
    return s


@numba.njit(**_INLINE)
def _log_weight(s, lse):  # pragma: no cover - compiled
    """``s - lse``, whose ``exp`` is :func:`_weight`'s: ``-inf`` where ``lse = -inf``."""
    return s - lse if lse != _NEG_INF else _NEG_INF


@numba.njit(**_INLINE)
def _weight(s, lse, zero):  # pragma: no cover - compiled
    """``exp(s - lse)``, and ``zero`` where ``lse = -inf`` (no finite score: no weight)."""
    if lse == _NEG_INF:
        return zero
    return _exp(s - lse)


# Each helper below is a stub typed by its overload: one body for an absent
# option (None), one for a present one.


def _factor(key, dscale, e, h, nh, one):  # pragma: no cover - compiled only
    """The dropout factor of edge ``e``, head ``h``: ``keep / (1 - p)``, 1 without dropout."""


def _prefetch_at(a, perm, t):  # pragma: no cover - compiled only
    """Prefetch the row ``a[perm[t]]`` of a per-edge array (nothing when it is absent)."""


def _uses_order(key, dsv):  # pragma: no cover - compiled only
    """Whether an option reads per-edge data in CSR order (then the source pass
    needs each edge's CSR position)."""


def _src_ds(dsv, e, h, a, f, dout, i, v, j, d, lo, n):  # pragma: no cover - compiled only
    """The score gradient of edge ``e``, head ``h`` in the source pass:
    ``a * (f * dout_i . v_j - D_i)``, or ``dsv[e, h]`` when the
    destination pass stored it (``dsv`` not ``None``)."""


def _edge_score(s, eq, i, ea, e, h, scale):  # pragma: no cover - compiled only
    """``s + eq_i^h . ea_e`` (``s`` without an edge query); per-head features (``[E, H,
    F]``, a key's term) are scored like keys: ``s + scale eq_i^h . ea_e^h``."""


def _add_g(x, gg, i, ea, e, h):  # pragma: no cover - compiled only
    """``x + gg_i^h . ea_e``: the ``edge_out`` gradient's term of ``dp`` (``x`` without one)."""


def _eacc_axpy(eacc, w, ea, e, h):  # pragma: no cover - compiled only
    """``eacc^h += w * ea_e`` (nothing without edge features)."""


def _eacc_scale(eacc, corr, ea, h):  # pragma: no cover - compiled only
    """``eacc^h *= corr`` (the online softmax's rescale; nothing without edge features)."""


def _eacc_merge(eacc, f, pe, x, ea, h):  # pragma: no cover - compiled only
    """``eacc^h += f * pe[x]^h`` (a hub piece's accumulator; nothing without edge features)."""


def _eacc_store(eo, i, eacc, inv, ea):  # pragma: no cover - compiled only
    """``eo[i] = eacc * inv[h]`` per head (nothing without edge features)."""


def _dea_zero(dea, e):  # pragma: no cover - compiled only
    """``dea[e] = 0`` for shared features (nothing without edge features, nor for per-head
    ones, which :func:`_dea_head` stores whole)."""


def _dea_add(dea, e, w, src, i, h):  # pragma: no cover - compiled only
    """``dea[e] += w * src_i^h`` (nothing when ``dea`` or ``src`` is absent)."""


def _dea_head(
    dea, e, dse, eq, a, key, dscale, nh, one, gg, i, h, wf, t, cached
):  # pragma: no cover - compiled only
    """Edge ``e``'s ``d ea`` terms of head ``h``: ``dse eq_i^h + a f gg_i^h``. Stored
    into ``dea[e, h]`` for per-head features (each row is one head's, written once: no
    zeroing, no read); added into ``dea[e]`` for shared ones (:func:`_dea_add`, after
    :func:`_dea_zero`). ``a f`` (``f`` the dropout factor) is ``wf[t, h]`` when
    ``cached`` (:func:`_kept_weight`)."""


def _row_term(w, src, i, c, zero):  # pragma: no cover - compiled only
    """``w * src[i, c]`` (``zero`` when ``src`` is absent)."""


def _prefetch_opt(a, i):  # pragma: no cover - compiled only
    """Prefetch row ``a[i]`` of an optional per-target array (nothing when absent)."""


def _none(x) -> bool:
    return isinstance(x, types.NoneType)


@overload(_factor, **_OL)
def _factor_ol(key, dscale, e, h, nh, one):  # pragma: no cover - compiled
    if _none(key):
        return lambda key, dscale, e, h, nh, one: one
    return lambda key, dscale, e, h, nh, one: _keep(
        key[0], key[1], key[2], key[3], dscale, e, h, nh, one
    )


# A call, not inlined: numba's typed inlining of the overloads (_add_g, _factor)
# into a branch (where _dst_grad recomputes) trips its SSA checks.
@numba.njit(cache=True, fastmath=set(_FAST))
def _edge_dp(
    dout, i, v, j, e, key, dscale, h, nh, one, lo, n, gg, ea
):  # pragma: no cover - compiled
    """``dp`` of edge ``e``, head ``h``: ``f * (dout_i^h . v_j^h + gg_i^h . ea_e)``."""
    dp = _add_g(_dot(dout, i, v, j, lo, n), gg, i, ea, e, h)
    return dp * _factor(key, dscale, e, h, nh, one)


# A call, not inlined, for the same reason as _edge_dp.
@numba.njit(cache=True, fastmath=set(_FAST))
def _edge_score_call(s, eq, i, ea, e, h, scale):  # pragma: no cover - compiled
    """:func:`_edge_score` for a branch (see :func:`_edge_dp`)."""
    return _edge_score(s, eq, i, ea, e, h, scale)


@overload(_prefetch_at, **_OL)
def _prefetch_at_ol(a, perm, t):  # pragma: no cover - compiled
    # Per-head edge features ([E, H, F]) come from small graphs only (the
    # operator's per_head_edges), whose rows are in cache: no prefetch.
    if _none(a) or a.ndim != 2:
        return lambda a, perm, t: None
    return lambda a, perm, t: _prefetch_row(a, perm[t] & _NN)


@overload(_uses_order, **_OL)
def _uses_order_ol(key, dsv):  # pragma: no cover - compiled
    if _none(key) and _none(dsv):
        return lambda key, dsv: False
    return lambda key, dsv: True


@overload(_src_ds, **_OL)
def _src_ds_ol(dsv, e, h, a, f, dout, i, v, j, d, lo, n):  # pragma: no cover - compiled
    if _none(dsv):
        return lambda dsv, e, h, a, f, dout, i, v, j, d, lo, n: (
            a * (_dot(dout, i, v, j, lo, n) * f - d)
        )
    return lambda dsv, e, h, a, f, dout, i, v, j, d, lo, n: dsv[e, h]


# ------------------------------------------------------------------ edge features


def _ea(ea, e, h, c):  # pragma: no cover - compiled only
    """Feature ``c`` of edge ``e`` for head ``h``: ``ea[e, c]`` (``[E, F]``, shared by the
    heads) or ``ea[e, h, c]`` (``[E, H, F]``: a layer's ``W a_ij`` per head, where a
    small graph's edge term is cheaper formed per edge than by the algebra's weight
    products per target)."""


@overload(_ea, **_OL)
def _ea_ol(ea, e, h, c):  # pragma: no cover - compiled
    if ea.ndim == 3:
        return lambda ea, e, h, c: ea[e, h & _NN, c]
    return lambda ea, e, h, c: ea[e, c]


@numba.njit(**_INLINE)
def _edge_dot(eq, i, ea, e, h):  # pragma: no cover - compiled
    """``sum_c eq[i, h*F + c] * ea[e, c]``: a per-target row's head ``h`` against an edge's
    features."""
    nf = ea.shape[-1]
    lo = (h * nf) & _NN
    e = e & _NN
    r = eq.dtype.type(0)
    for c in range(nf):
        r += eq[i, lo + c] * _ea(ea, e, h, c)
    return r


# As _dot_strict: the rare path of an edge score term the fast loop made -inf.
@numba.njit(cache=True, fastmath=False)  # pragma: no cover - compiled
def _edge_dot_strict(eq, i, ea, e, h):
    """:func:`_edge_dot` in IEEE arithmetic (products rounded, summed in order)."""
    nf = ea.shape[-1]
    lo = (h * nf) & _NN
    e = e & _NN
    r = eq.dtype.type(0)
    for c in range(nf):
        r += eq[i, lo + c] * _ea(ea, e, h, c)
    return r


@numba.njit(**_INLINE)
def _edge_score_dot(eq, i, ea, e, h):  # pragma: no cover - compiled
    """:func:`_edge_dot` for a score term, overflowing as the reference does (see
    :func:`._simd._score_dot`)."""
    r = _edge_dot(eq, i, ea, e, h)
    if r == _NEG_INF:
        r = _edge_dot_strict(eq, i, ea, e, h)
    return r


@overload(_edge_score, **_OL)
def _edge_score_ol(s, eq, i, ea, e, h, scale):  # pragma: no cover - compiled
    if _none(eq):
        return lambda s, eq, i, ea, e, h, scale: s
    if ea.ndim == 3:
        return lambda s, eq, i, ea, e, h, scale: s + scale * _edge_score_dot(eq, i, ea, e, h)
    return lambda s, eq, i, ea, e, h, scale: s + _edge_score_dot(eq, i, ea, e, h)


def _key_term(x, ea, scale):  # pragma: no cover - compiled only
    """``x`` as the weight of an edge query's gradient terms (``d eq``, ``d ea`` from
    ``eq``): ``scale x`` for per-head features, scored with the scale (see
    :func:`_edge_score`), else ``x``."""


@overload(_key_term, **_OL)
def _key_term_ol(x, ea, scale):  # pragma: no cover - compiled
    if not _none(ea) and ea.ndim == 3:
        return lambda x, ea, scale: x * scale
    return lambda x, ea, scale: x


@overload(_add_g, **_OL)
def _add_g_ol(x, gg, i, ea, e, h):  # pragma: no cover - compiled
    if _none(gg):
        return lambda x, gg, i, ea, e, h: x
    return lambda x, gg, i, ea, e, h: x + _edge_dot(gg, i, ea, e, h)


@numba.njit(**_INLINE)
def _eacc_axpy_impl(eacc, w, ea, e, h):  # pragma: no cover - compiled
    nf = ea.shape[-1]
    lo = (h * nf) & _NN
    e = e & _NN
    for c in range(nf):
        eacc[lo + c] += w * _ea(ea, e, h, c)


@overload(_eacc_axpy, **_OL)
def _eacc_axpy_ol(eacc, w, ea, e, h):  # pragma: no cover - compiled
    if _none(ea):
        return lambda eacc, w, ea, e, h: None
    return lambda eacc, w, ea, e, h: _eacc_axpy_impl(eacc, w, ea, e, h)


@numba.njit(**_INLINE)
def _eacc_scale_impl(eacc, corr, ea, h):  # pragma: no cover - compiled
    nf = ea.shape[-1]
    lo = (h * nf) & _NN
    for c in range(nf):
        eacc[lo + c] *= corr


@overload(_eacc_scale, **_OL)
def _eacc_scale_ol(eacc, corr, ea, h):  # pragma: no cover - compiled
    if _none(ea):
        return lambda eacc, corr, ea, h: None
    return lambda eacc, corr, ea, h: _eacc_scale_impl(eacc, corr, ea, h)


@overload(_eacc_merge, **_OL)
def _eacc_merge_ol(eacc, f, pe, x, ea, h):  # pragma: no cover - compiled
    if _none(ea):
        return lambda eacc, f, pe, x, ea, h: None
    return lambda eacc, f, pe, x, ea, h: _axpy(eacc, f, pe, x, h * ea.shape[-1], ea.shape[-1])


@numba.njit(**_INLINE)
def _eacc_store_impl(eo, i, eacc, inv, ea):  # pragma: no cover - compiled
    nf = ea.shape[-1]
    for h in range(inv.shape[0]):
        lo = (h * nf) & _NN
        for c in range(nf):
            eo[i, lo + c] = eacc[lo + c] * inv[h]


@overload(_eacc_store, **_OL)
def _eacc_store_ol(eo, i, eacc, inv, ea):  # pragma: no cover - compiled
    if _none(ea):
        return lambda eo, i, eacc, inv, ea: None
    return lambda eo, i, eacc, inv, ea: _eacc_store_impl(eo, i, eacc, inv, ea)


@numba.njit(**_INLINE)
def _dea_zero_impl(dea, e):  # pragma: no cover - compiled
    e = e & _NN
    dea[e] = dea.dtype.type(0)


@overload(_dea_zero, **_OL)
def _dea_zero_ol(dea, e):  # pragma: no cover - compiled
    # Per-head rows are stored whole by _dea_head: nothing to zero.
    if _none(dea) or dea.ndim == 3:
        return lambda dea, e: None
    return lambda dea, e: _dea_zero_impl(dea, e)


@numba.njit(**_INLINE)
def _dea_add_impl(dea, e, w, src, i, h):  # pragma: no cover - compiled
    """``dea[e] += w * src_i^h``, summed over the heads: shared features ``[E, F]`` (per-head
    rows are stored whole by :func:`_dea_head`)."""
    nf = dea.shape[-1]
    lo = (h * nf) & _NN
    e = e & _NN
    for c in range(nf):
        dea[e, c] += w * src[i, lo + c]


@overload(_dea_add, **_OL)
def _dea_add_ol(dea, e, w, src, i, h):  # pragma: no cover - compiled
    if _none(dea) or _none(src):
        return lambda dea, e, w, src, i, h: None
    return lambda dea, e, w, src, i, h: _dea_add_impl(dea, e, w, src, i, h)


@overload(_prefetch_opt, **_OL)
def _prefetch_opt_ol(a, i):  # pragma: no cover - compiled
    if _none(a):
        return lambda a, i: None
    return lambda a, i: _prefetch_row(a, i)


# A call, not inlined: inlined into _dst_grad after its branch, _factor's
# branches trip numba's SSA checks (as in _edge_dp).
@numba.njit(cache=True, fastmath=set(_FAST))
def _factor_call(key, dscale, e, h, nh, one):  # pragma: no cover - compiled
    return _factor(key, dscale, e, h, nh, one)


@overload(_row_term, **_OL)
def _row_term_ol(w, src, i, c, zero):  # pragma: no cover - compiled
    if _none(src):
        return lambda w, src, i, c, zero: zero
    return lambda w, src, i, c, zero: w * src[i, c]


@numba.njit(**_INLINE)
def _dea_head_store(dea, e, dse, eq, w, gg, i, h):  # pragma: no cover - compiled
    nf = dea.shape[-1]
    lo = (h * nf) & _NN
    e = e & _NN
    hh = h & _NN
    zero = dea.dtype.type(0)
    for c in range(nf):
        dea[e, hh, c] = _row_term(dse, eq, i, lo + c, zero) + _row_term(w, gg, i, lo + c, zero)


def _kept_weight(a, key, dscale, e, nh, one, h, wf, t, cached):  # pragma: no cover
    """``a f``: ``a`` without dropout, else ``wf[t, h]`` when ``cached`` or rehashed."""


@overload(_kept_weight, **_OL)
def _kept_weight_ol(a, key, dscale, e, nh, one, h, wf, t, cached):  # pragma: no cover - compiled
    if _none(key):
        return lambda a, key, dscale, e, nh, one, h, wf, t, cached: a

    def dropped(a, key, dscale, e, nh, one, h, wf, t, cached):
        return wf[t & _NN, h] if cached else a * _factor_call(key, dscale, e, h, nh, one)

    return dropped


@overload(_dea_head, **_OL)
def _dea_head_ol(
    dea, e, dse, eq, a, key, dscale, nh, one, gg, i, h, wf, t, cached
):  # pragma: no cover - compiled
    if _none(dea):
        return lambda dea, e, dse, eq, a, key, dscale, nh, one, gg, i, h, wf, t, cached: None
    if _none(gg) and dea.ndim == 3:
        # No edge_out gradient: no weight to find (with dropout, a rehash per edge).
        return lambda dea, e, dse, eq, a, key, dscale, nh, one, gg, i, h, wf, t, cached: (
            _dea_head_store(dea, e, dse, eq, dse, gg, i, h)
        )
    if _none(gg):
        return lambda dea, e, dse, eq, a, key, dscale, nh, one, gg, i, h, wf, t, cached: _dea_add(
            dea, e, dse, eq, i, h
        )
    if dea.ndim == 3:
        return lambda dea, e, dse, eq, a, key, dscale, nh, one, gg, i, h, wf, t, cached: (
            _dea_head_store(
                dea,
                e,
                dse,
                eq,
                _kept_weight(a, key, dscale, e, nh, one, h, wf, t, cached),
                gg,
                i,
                h,
            )
        )

    def shared(dea, e, dse, eq, a, key, dscale, nh, one, gg, i, h, wf, t, cached):
        _dea_add(dea, e, dse, eq, i, h)
        _dea_add(dea, e, _kept_weight(a, key, dscale, e, nh, one, h, wf, t, cached), gg, i, h)

    return shared
