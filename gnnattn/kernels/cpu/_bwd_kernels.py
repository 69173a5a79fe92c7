r"""The backward's two passes, compiled: destination (``dq``, ``D``) and source (``dk``, ``dv``).

FlashAttention's recomputation: the weights come back from the forward's
``lse`` as ``alpha_ij = exp(s_ij - lse_i)`` instead of being stored. With
``f_ij`` the dropout factor (``keep / (1 - p)``, 1 without dropout):

.. math::
    dp_{ij} = f_{ij}\, dout_i \cdot v_j, \quad
    D_i = \frac{\sum_j \alpha_{ij} dp_{ij}}{\sum_j \alpha_{ij}}, \quad
    dS_{ij} = \alpha_{ij} (dp_{ij} - D_i),

``dq_i = scale sum_j dS_ij k_j``, ``dk_j = scale sum_i dS_ij q_i`` and
``dv_j = sum_i alpha_ij f_ij dout_i``.

* Destination pass (CSR): ``k_j`` and ``v_j`` (2 gathered rows per edge)
  give the weights, ``dp`` and ``D_i``; a second sweep over the target's
  edges (their weights and ``dp`` kept in a small array when they fit)
  accumulates ``dq_i`` and writes ``dS`` (with a score bias), in CSR order.
* Source pass (transposed CSR): ``q_i`` and ``dout_i`` (2 gathered rows) and
  one cache line of ``(lse_i, D_i)`` per edge; ``k_j``/``v_j`` are the
  source's own rows; ``dk_j`` and ``dv_j`` accumulate in cache, so no two
  threads write one row and no atomics are needed. The per-edge options
  (bias, dropout counter) are read at the edge's CSR position ``tperm[t]``.
* Source pass from stored weights: where the destination pass writes ``dS``
  anyway (a bias, edge features), :func:`attention_bwd` has it also write
  the dropped weight ``P_ij = alpha_ij f_ij``, interleaved with ``dS`` in
  one ``[E, 2H]`` array (its first sweep has ``alpha`` and
  ``f`` in hand). The source pass then reads per edge ``q_i`` and ``dout_i``
  (2 gathered rows) and the one cache line of ``(dS_ij, P_ij)`` at
  ``tperm[t]``: ``dk_j = scale sum_i dS_ij q_i``, ``dv_j = sum_i P_ij
  dout_i``, with no score, ``exp``, dropout hash or ``(lse_i, D_i)`` line,
  and none of the edge query's or edge features' reads below.

**Edge features** (``ea`` ``[E, F]`` in CSR order, the edge query ``eq``
``[N, H*F]``, the gradient ``gg`` ``[N, H*F]`` of the forward's ``edge_out``):
the score gains ``eq_i . ea_ij`` and ``dp_ij`` gains ``f_ij gg_i . ea_ij``
(``edge_out_i = sum_j alpha_ij f_ij ea_ij``, so its gradient reaches
``alpha`` as ``v``'s does), and the destination pass, which reads ``ea_ij``
in order anyway, also accumulates ``d eq_i = sum_j dS_ij ea_ij`` per target
and writes ``d ea_ij = sum_h dS_ij^h eq_i^h + alpha_ij^h f_ij^h gg_i^h`` per
edge (per head, not summed, for per-head features ``[E, H, F]``, whose score
term is a key's, ``scale eq_i . ea_ij``: ``scale dS`` in both gradients, see
:func:`._edge._key_term`). The source
pass then reads the stored ``dS`` and ``P`` (above); called with an ``[E, H]``
``dS`` alone it needs the score's edge term too:
``eq_i`` (one more gathered row of ``H*F``) and ``ea`` at the edge's CSR
position.

So the backward makes no ``[E, H]`` arrays without a bias or edge features
(dropout alone included: its mask is rehashed) and does not need the
forward's output. ``D_i`` is the ratio of two sums over the
edges rather than ``dout_i . out_i``: ``sum_j alpha_ij`` is 1 up to the
rounding of ``lse``, and dividing by the computed sum removes that rounding,
so ``dS`` is exactly 0 where every edge of a target carries the same ``dp``.
Only a zero sum (no edge, or only ``-inf`` scores) is not divided by.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange
from numba.extending import overload

from ._edge import (
    _OL,
    _add_g,
    _dea_head,
    _dea_zero,
    _eacc_axpy,
    _edge_dp,
    _edge_score,
    _edge_score_call,
    _factor,
    _key_term,
    _log_weight,
    _none,
    _prefetch_at,
    _prefetch_opt,
    _score,
    _src_ds,
    _uses_order,
    _weight,
)
from ._simd import (
    _AHEAD,
    _INLINE,
    _JIT,
    _NN,
    _axpy,
    _dot,
    _exp_first,
    _prefetch,
    _prefetch_row,
)

# Edges per target whose weights the destination pass keeps for its second sweep (and the
# length of its first sweep's chunks).
_CACHE = 512
# Edges per chunk of the source pass's weights (their rows stay in L1 between its sweeps).
_SRC_BLOCK = 64


@numba.njit(**_INLINE)
def _dst_delta(
    q,
    i,
    k,
    v,
    dout,
    lse,
    bias,
    has_bias,
    key,
    dscale,
    ea,
    eq,
    gg,
    col,
    s0,
    e0,
    scale,
    wa,
    wp,
    wf,
    dl,
    dbias,
):  # pragma: no cover - compiled
    """Partial sums of ``D_i`` over ``s0:e0``: ``dl[h] = sum_j alpha_ij dp_ij``,
    ``dl[H + h] = sum_j alpha_ij``; writes the dropped weight
    ``P_ij = alpha_ij f_ij`` into ``dbias[e, H + h]`` when ``dbias`` has
    those columns (``[E, 2H]``: see the module docstring).

    ``D_i`` is their ratio (see :func:`_delta`). The edges go in chunks of
    ``wa.shape[0]`` (at least 1), whose ``alpha``, ``dp`` and ``alpha f`` are kept in
    ``wa``/``wp``/``wf`` (``[edge, head]``): where the segment fits in one
    chunk, :func:`_dst_grad` reads them back instead of recomputing.
    """
    nh = dl.shape[0] // 2
    cq = q.shape[1] // nh
    cv = v.shape[1] // nh
    zero = q.dtype.type(0)
    one = q.dtype.type(1)
    keep_p = dbias.shape[1] > nh
    flat = wa.reshape(wa.size)
    dl[:] = zero
    c0 = s0 & _NN
    while c0 < e0:
        nc = min(wa.shape[0], e0 - c0)
        # The gathers: scores (less lse) and dp of every head of an edge.
        for t in range(nc):
            e = c0 + t
            if e + _AHEAD < col.shape[0]:
                jj = col[e + _AHEAD] & _NN
                _prefetch_row(k, jj)
                _prefetch_row(v, jj)
            j = col[e] & _NN
            for h in range(nh):
                s = _score(q, i, k, j, h, cq, scale, bias, e, has_bias)
                s = _edge_score(s, eq, i, ea, e, h, scale)
                wa[t, h] = _log_weight(s, lse[i, h])
                f = _factor(key, dscale, e, h, nh, one)
                wp[t, h] = _add_g(_dot(dout, i, v, j, h * cv, cv), gg, i, ea, e, h) * f
                wf[t, h] = f
        _exp_first(flat, nc * nh)
        for t in range(nc):
            for h in range(nh):
                a = wa[t, h]
                wf[t, h] *= a
                if keep_p:
                    dbias[c0 + t, nh + h] = wf[t, h]
                dl[h] += a * wp[t, h]
                dl[nh + h] += a
        c0 += nc


@numba.njit(**_INLINE)
def _delta(dl, lse, glse, ld, i):  # pragma: no cover - compiled
    """``ld[i] = (lse_i, D_i - glse_i)``, ``D_i`` from :func:`_dst_delta`'s sums and
    ``glse`` the gradient of ``lse`` (``[N, H]``, or ``[0, H]`` for zero):
    ``d lse_i / d s_ij = alpha_ij``, so ``dS_ij = alpha_ij (dp_ij - D_i + glse_i)``."""
    nh = dl.shape[0] // 2
    zero = dl.dtype.type(0)
    one = dl.dtype.type(1)
    for h in range(nh):
        tot = dl[nh + h]
        ld[i, h] = lse[i, h]
        g = glse[i, h] if glse.shape[0] else zero
        ld[i, nh + h] = dl[h] / (one if tot == zero else tot) - g


# fmt: off
@numba.njit(**_INLINE)
def _dst_grad(
    q, i, k, v, dout, lse, bias, has_bias, key, dscale, ea, eq, gg, col, s0, e0, scale, wa, wp, wf,
    ld, acc, dbias, eacc, dea,
):  # pragma: no cover - compiled
# fmt: on
    """``dq_i += sum_j dS_ij k_j`` over ``s0:e0`` into ``acc`` (and ``dS`` into ``dbias``);
    with edge features ``d eq_i += sum_j dS_ij ea_ij`` into ``eacc`` and ``d ea`` into ``dea``
    (``scale dS`` for per-head features: :func:`._edge._key_term`)."""
    nh = ld.shape[1] // 2
    cq = q.shape[1] // nh
    cv = v.shape[1] // nh
    zero = q.dtype.type(0)
    one = q.dtype.type(1)
    cached = e0 - s0 <= wa.shape[0]
    keep_ds = dbias.shape[0] > 0  # a score bias, or edge features (for the source pass)
    s0 = s0 & _NN
    for t in range(e0 - s0):
        e = s0 + t
        if not cached and e + _AHEAD < col.shape[0]:
            jj = col[e + _AHEAD] & _NN
            _prefetch_row(k, jj)
            _prefetch_row(v, jj)
        j = col[e] & _NN
        _dea_zero(dea, e)
        for h in range(nh):
            if cached:
                a = wa[t, h]
                dp = wp[t, h]
            else:
                s = _score(q, i, k, j, h, cq, scale, bias, e, has_bias)
                a = _weight(_edge_score_call(s, eq, i, ea, e, h, scale), lse[i, h], zero)
                dp = _edge_dp(dout, i, v, j, e, key, dscale, h, nh, one, h * cv, cv, gg, ea)
            ds = a * (dp - ld[i, nh + h])
            if keep_ds:
                dbias[e, h] = ds
            _axpy(acc, ds * scale, k, j, h * cq, cq)
            dse = _key_term(ds, ea, scale)
            _eacc_axpy(eacc, dse, ea, e, h)
            _dea_head(dea, e, dse, eq, a, key, dscale, nh, one, gg, i, h, wf, t, cached)


def _store_row(out, i, acc):  # pragma: no cover - compiled only
    """``out[i] = acc`` (nothing when ``out`` is absent)."""


def _sum_rows(out, i, parts, x0, x1):  # pragma: no cover - compiled only
    """``out[i] = sum_{x0 <= x < x1} parts[x]`` (nothing when ``out`` is absent)."""


@overload(_store_row, **_OL)
def _store_row_ol(out, i, acc):  # pragma: no cover - compiled
    if _none(out):
        return lambda out, i, acc: None

    def impl(out, i, acc):
        for c in range(acc.shape[0]):
            out[i, c] = acc[c]

    return impl


@overload(_sum_rows, **_OL)
def _sum_rows_ol(out, i, parts, x0, x1):  # pragma: no cover - compiled
    if _none(out):
        return lambda out, i, parts, x0, x1: None

    def impl(out, i, parts, x0, x1):
        for c in range(parts.shape[1]):
            d = parts.dtype.type(0)
            for x in range(x0 & _NN, x1):
                d += parts[x, c]
            out[i, c] = d

    return impl


@numba.njit(**_JIT)
def _bwd_dst_kernel(
    q, k, v, dout, lse, glse, bias, has_bias, key, dscale, ea, eq, gg, nf, ptr, col, scale, bounds,
    limit, dq, ld, dbias, deq, dea,
):  # pragma: no cover - compiled
    nh = lse.shape[1]
    cq = q.shape[1] // nh
    zero = q.dtype.type(0)
    for ch in prange(bounds.shape[0] - 1):
        wa = np.empty((_CACHE, nh), dtype=q.dtype)
        wp = np.empty((_CACHE, nh), dtype=q.dtype)
        wf = np.empty((_CACHE, nh), dtype=q.dtype)
        dl = np.empty(2 * nh, dtype=q.dtype)
        acc = np.empty(nh * cq, dtype=q.dtype)
        # d edge_query's accumulator (size 0 without edge features: nf = 0).
        eacc = np.empty(nh * nf, dtype=q.dtype)
        for i in range(bounds[ch] & _NN, bounds[ch + 1]):
            s0, e0 = ptr[i], ptr[i + 1]
            if e0 - s0 > limit:
                continue  # a hub: _bwd_dst_pieces_kernel
            _dst_delta(
                q, i, k, v, dout, lse, bias, has_bias, key, dscale, ea, eq, gg, col, s0, e0, scale,
                wa, wp, wf, dl, dbias,
            )
            _delta(dl, lse, glse, ld, i)
            acc[:] = zero
            eacc[:] = zero
            _dst_grad(
                q, i, k, v, dout, lse, bias, has_bias, key, dscale, ea, eq, gg, col, s0, e0, scale,
                wa, wp, wf, ld, acc, dbias, eacc, dea,
            )
            for c in range(nh * cq):
                dq[i, c] = acc[c]
            _store_row(deq, i, eacc)


@numba.njit(**_JIT)
def _bwd_dst_pieces_kernel(
    q, k, v, dout, lse, glse, bias, has_bias, key, dscale, ea, eq, gg, nf, col, scale, pieces, seg,
    dq, ld, dbias, deq, dea,
):  # pragma: no cover - compiled
    nh = lse.shape[1]
    cq = q.shape[1] // nh
    zero = q.dtype.type(0)
    npc = pieces.shape[0]
    pd = np.empty((npc, 2 * nh), dtype=q.dtype)
    pa = np.zeros((npc, nh * cq), dtype=q.dtype)
    pe = np.zeros((npc, nh * nf), dtype=q.dtype)
    # The second sweep runs after the pieces' sums are merged, in a later loop where the
    # first sweep's buffers are gone: it recomputes the weights.
    nokeep = np.empty((0, nh), dtype=q.dtype)
    for x in prange(npc):
        wa = np.empty((_CACHE, nh), dtype=q.dtype)
        wp = np.empty((_CACHE, nh), dtype=q.dtype)
        wf = np.empty((_CACHE, nh), dtype=q.dtype)
        _dst_delta(
            q, pieces[x, 0] & _NN, k, v, dout, lse, bias, has_bias, key, dscale, ea, eq, gg, col,
            pieces[x, 1], pieces[x, 2], scale, wa, wp, wf, pd[x], dbias,
        )
    for s in prange(seg.shape[0] - 1):
        dl = np.zeros(2 * nh, dtype=q.dtype)
        for x in range(seg[s] & _NN, seg[s + 1]):
            for h in range(2 * nh):
                dl[h] += pd[x, h]
        _delta(dl, lse, glse, ld, pieces[seg[s], 0] & _NN)
    for x in prange(npc):
        _dst_grad(
            q, pieces[x, 0] & _NN, k, v, dout, lse, bias, has_bias, key, dscale, ea, eq, gg, col,
            pieces[x, 1], pieces[x, 2], scale, nokeep, nokeep, nokeep, ld, pa[x], dbias, pe[x],
            dea,
        )
    for s in prange(seg.shape[0] - 1):
        i = pieces[seg[s], 0] & _NN
        for c in range(nh * cq):
            d = zero
            for x in range(seg[s] & _NN, seg[s + 1]):
                d += pa[x, c]
            dq[i, c] = d
        _sum_rows(deq, i, pe, seg[s], seg[s + 1])


@numba.njit(**_INLINE)
def _src_segment(
    q, k, j, v, dout, ld, bias, has_bias, key, dscale, dsv, ea, eq, trow, tperm, t0, t1, scale, ak,
    av, wa,
):  # pragma: no cover - compiled
    """``dk_j``, ``dv_j`` over the outgoing edges ``t0:t1`` of source ``j`` into ``ak``, ``av``,
    in chunks of ``wa.shape[0]`` edges (at least 1) whose weights ``wa`` (``[edge, head]``)
    holds."""
    nh = ld.shape[1] // 2
    cq = q.shape[1] // nh
    cv = v.shape[1] // nh
    one = q.dtype.type(1)
    flat = wa.reshape(wa.size)
    # The bias and the options are in CSR order: read at the edge's CSR position.
    by_pos = has_bias or _uses_order(key, dsv)
    c0 = t0 & _NN
    while c0 < t1:
        nc = min(wa.shape[0], t1 - c0)
        # The scores less lse first, then one exp over the chunk's weights.
        for u in range(nc):
            t = c0 + u
            if t + _AHEAD < trow.shape[0]:
                ii = trow[t + _AHEAD] & _NN
                _prefetch_row(q, ii)
                _prefetch_row(dout, ii)
                _prefetch(ld, ii, 0)
                _prefetch_at(dsv, tperm, t + _AHEAD)
                _prefetch_opt(eq, ii)
                _prefetch_at(ea, tperm, t + _AHEAD)
            i = trow[t] & _NN
            e = (tperm[t] & _NN) if by_pos else t
            for h in range(nh):
                s = _score(q, i, k, j, h, cq, scale, bias, e, has_bias)
                s = _edge_score(s, eq, i, ea, e, h, scale)
                wa[u, h] = _log_weight(s, ld[i, h])
        _exp_first(flat, nc * nh)
        for u in range(nc):
            t = c0 + u
            i = trow[t] & _NN
            e = (tperm[t] & _NN) if by_pos else t
            for h in range(nh):
                a = wa[u, h]
                f = _factor(key, dscale, e, h, nh, one)
                g = _src_ds(dsv, e, h, a, f, dout, i, v, j, ld[i, nh + h], h * cv, cv) * scale
                _axpy(av, a * f, dout, i, h * cv, cv)
                _axpy(ak, g, q, i, h * cq, cq)
        c0 += nc


# fmt: off
@numba.njit(**_JIT)
def _bwd_src_kernel(
    q, k, v, dout, ld, bias, has_bias, key, dscale, dsv, ea, eq, tptr, trow, tperm, scale, bounds,
    limit, dk, dv,
):  # pragma: no cover - compiled
# fmt: on
    nh = ld.shape[1] // 2
    cq = q.shape[1] // nh
    cv = v.shape[1] // nh
    zero = q.dtype.type(0)
    for ch in prange(bounds.shape[0] - 1):
        ak = np.empty(nh * cq, dtype=q.dtype)
        av = np.empty(nh * cv, dtype=q.dtype)
        wa = np.empty((_SRC_BLOCK, nh), dtype=q.dtype)
        for j in range(bounds[ch] & _NN, bounds[ch + 1]):
            t0, t1 = tptr[j], tptr[j + 1]
            if t1 - t0 > limit:
                continue  # a hub: _bwd_src_pieces_kernel
            ak[:] = zero
            av[:] = zero
            _src_segment(
                q, k, j, v, dout, ld, bias, has_bias, key, dscale, dsv, ea, eq, trow, tperm, t0,
                t1, scale, ak, av, wa,
            )
            for c in range(nh * cq):
                dk[j, c] = ak[c]
            for c in range(nh * cv):
                dv[j, c] = av[c]


@numba.njit(**_JIT)
def _bwd_src_pieces_kernel(
    q, k, v, dout, ld, bias, has_bias, key, dscale, dsv, ea, eq, trow, tperm, scale, pieces, seg,
    dk, dv,
):  # pragma: no cover - compiled
    nh = ld.shape[1] // 2
    cq = q.shape[1] // nh
    cv = v.shape[1] // nh
    zero = q.dtype.type(0)
    npc = pieces.shape[0]
    pk = np.zeros((npc, nh * cq), dtype=q.dtype)
    pv = np.zeros((npc, nh * cv), dtype=q.dtype)
    for x in prange(npc):
        wa = np.empty((_SRC_BLOCK, nh), dtype=q.dtype)
        _src_segment(
            q, k, pieces[x, 0] & _NN, v, dout, ld, bias, has_bias, key, dscale, dsv, ea, eq, trow,
            tperm, pieces[x, 1], pieces[x, 2], scale, pk[x], pv[x], wa,
        )
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


@numba.njit(**_INLINE)
def _src_kept_segment(q, dout, dsp, trow, tperm, t0, t1, scale, ak, av):  # pragma: no cover
    """:func:`_src_segment` from the stored ``dS`` and ``P`` (``dsp`` ``[E, 2H]``).

    ``dk_j += scale dS_ij q_i`` and ``dv_j += P_ij dout_i``: no score, no
    ``exp``, no dropout hash, no row of ``lse``/``D``, of the edge query or of
    the edge features; per edge the two gathered rows and one line of ``dsp``.
    """
    nh = dsp.shape[1] // 2
    cq = q.shape[1] // nh
    cv = dout.shape[1] // nh
    for t in range(t0 & _NN, t1):
        if t + _AHEAD < trow.shape[0]:
            ii = trow[t + _AHEAD] & _NN
            _prefetch_row(q, ii)
            _prefetch_row(dout, ii)
            _prefetch_row(dsp, tperm[t + _AHEAD] & _NN)
        i = trow[t] & _NN
        e = tperm[t] & _NN
        for h in range(nh):
            _axpy(av, dsp[e, nh + h], dout, i, h * cv, cv)
            _axpy(ak, dsp[e, h] * scale, q, i, h * cq, cq)


@numba.njit(**_JIT)
def _bwd_src_kept_kernel(
    q, dout, dsp, tptr, trow, tperm, scale, bounds, limit, dk, dv
):  # pragma: no cover - compiled
    nh = dsp.shape[1] // 2
    cq = q.shape[1] // nh
    cv = dout.shape[1] // nh
    zero = q.dtype.type(0)
    for ch in prange(bounds.shape[0] - 1):
        ak = np.empty(nh * cq, dtype=q.dtype)
        av = np.empty(nh * cv, dtype=q.dtype)
        for j in range(bounds[ch] & _NN, bounds[ch + 1]):
            t0, t1 = tptr[j], tptr[j + 1]
            if t1 - t0 > limit:
                continue  # a hub: _bwd_src_kept_pieces_kernel
            ak[:] = zero
            av[:] = zero
            _src_kept_segment(q, dout, dsp, trow, tperm, t0, t1, scale, ak, av)
            for c in range(nh * cq):
                dk[j, c] = ak[c]
            for c in range(nh * cv):
                dv[j, c] = av[c]


@numba.njit(**_JIT)
def _bwd_src_kept_pieces_kernel(
    q, dout, dsp, trow, tperm, scale, pieces, seg, dk, dv
):  # pragma: no cover - compiled
    nh = dsp.shape[1] // 2
    cq = q.shape[1] // nh
    cv = dout.shape[1] // nh
    npc = pieces.shape[0]
    pk = np.zeros((npc, nh * cq), dtype=q.dtype)
    pv = np.zeros((npc, nh * cv), dtype=q.dtype)
    for x in prange(npc):
        _src_kept_segment(
            q, dout, dsp, trow, tperm, pieces[x, 1], pieces[x, 2], scale, pk[x], pv[x]
        )
    zero = q.dtype.type(0)
    # Plain loops, not _sum_rows: its overload inlined into this prange trips
    # numba's SSA check (a NumbaIRAssumptionWarning at compile time).
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


@numba.njit(**_JIT)
def _bwd_src_scatter_kernel(q, dout, dsp, ptr, col, scale, parts, dk, dv):  # pragma: no cover
    """The source pass of a small graph, from the stored ``dS`` and ``P``, over the CSR,
    with no transposed CSR: ``dk_j += scale dS_ij q_i`` and ``dv_j += P_ij dout_i``
    edge by edge into ``dk``, ``dv``, which it zeroes first (here, not by torch: one
    more parallel fill each). Each thread owns a range of sources and walks every
    edge, skipping the others' (reading ``col`` once more per thread costs far less
    than a transposed CSR). Each source's terms come in CSR order, the order of its
    segment of the transposed CSR, so the sums are those of
    :func:`_bwd_src_kept_kernel` (outside hub pieces) on any number of threads.
    ``parts`` is the thread count, an argument: ``numba.get_num_threads()`` here
    would keep numba from caching the kernel."""
    nh = dsp.shape[1] // 2
    cq = q.shape[1] // nh
    cv = dout.shape[1] // nh
    m = dk.shape[0]
    parts = max(1, min(parts, m))
    for p in prange(parts):
        lo = m * p // parts
        hi = m * (p + 1) // parts
        dk[lo:hi] = 0
        dv[lo:hi] = 0
        for i in range(ptr.shape[0] - 1):
            for e in range(ptr[i] & _NN, ptr[i + 1]):
                j = col[e] & _NN
                if j < lo or j >= hi:
                    continue
                ak = dk[j]
                av = dv[j]
                for h in range(nh):
                    _axpy(av, dsp[e, nh + h], dout, i, h * cv, cv)
                    _axpy(ak, dsp[e, h] * scale, q, i, h * cq, cq)
