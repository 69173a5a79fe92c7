"""The fused attention forward: one pass per target over its incoming edges.

Per target, a blockwise online softmax: the scores of a block of ``_BLOCK``
edges (every head of an edge from one gathered ``k_j`` row) are held in a
small array, the running max, sum and unnormalized output are rescaled when
the max grows, and the weighted values are accumulated from one gathered
``v_j`` row per edge. Per edge the pass gathers ``k_j`` and ``v_j``; ``q_i``
and ``out_i`` are read and written once per target; no ``[E, C]`` array is
made. Hubs are reduced in pieces whose ``(max, sum, acc)`` are merged in
piece order.

With edge features (``edge_attr`` ``[E, F]``, or ``[E, H, F]`` per head, read
in CSR order), an edge query adds ``edge_query_i^h . a_ij`` to the score (times
the scale for per-head features, a key's term), and the weights (after
dropout) also accumulate ``edge_out_i^h = sum_j P_ij^h a_ij`` per target, in
the same online softmax (rescaled and merged with ``acc``).

Dropout multiplies each weight by its keep factor as it is accumulated; the
sum that normalizes, and so ``lse``, are of the undropped weights.

NaN: a NaN score or value of a target's edge makes its output NaN (and a NaN
score its ``lse``): the maximum keeps a NaN, a NaN weight makes the sum NaN,
and only a zero sum (no edge, or only ``-inf`` scores) is not divided by.
"""

from __future__ import annotations

import math

import numba
import numpy as np
import torch
from numba import prange
from torch import Tensor

from ..common import Dropout, acc_dtype
from ._edge import (
    _eacc_axpy,
    _eacc_merge,
    _eacc_scale,
    _eacc_store,
    _edge_score,
    _factor,
    _score,
)
from ._simd import (
    _AHEAD,
    _INLINE,
    _JIT,
    _NEG_INF,
    _NN,
    _axpy,
    _exp,
    _exp_first,
    _max,
    _prefetch_row,
)
from .plans import (
    CPUPlan,
    _bias,
    _check_edge,
    _check_options,
    _check_plan,
    _check_qkv,
    _edge_rows,
    _make_plan,
    _opt_rows,
    _option_args,
    _Plan,
    _rows,
    _scalar,
    _threads,
)

__all__ = ["attention_fwd", "per_head_edges"]

#: The largest ``E * H * C`` whose edge term a layer forms per edge and head
#: (``edge_attr`` ``[E, H, C]`` = ``a_ij W^T``: one matrix product, and ``[E, H, C]``
#: in and out of the kernels) rather than by the algebra (``W^T q_i`` and
#: ``W edge_out_i``: batched products over the targets, with their transposed
#: copies, forward and backward): 16 MB of float32 in each direction.
PER_HEAD_EDGES_MAX = 1 << 22
#: The most edges per target for the per-edge term: its work grows with the edges,
#: the algebra's with the targets. Measured on 2 cores, 2026-12-06
#: (``TransformerConv(64, 16, heads=4, edge_dim=16)`` forward + backward): on
#: batches of 32-512 molecules (about 2.2 edges per target) 3-7% faster; on
#: random graphs of 800 nodes level at 2-4 edges per target, 5% slower at 8, and
#: 4-39% slower at 16 (200-8,000 nodes).
PER_HEAD_EDGES_DEGREE = 4


def per_head_edges(num_edges: int, num_targets: int, heads: int, channels: int) -> bool:
    """Whether the operator hands these kernels a sparse, small graph's edge term per edge
    and head (``[E, H, C]``) where keys and values share one edge map
    (:data:`PER_HEAD_EDGES_MAX`, :data:`PER_HEAD_EDGES_DEGREE`)."""
    return (
        num_edges <= PER_HEAD_EDGES_DEGREE * num_targets
        and num_edges * heads * channels <= PER_HEAD_EDGES_MAX
    )


# Edges per block of scores held in registers/L1.
_BLOCK = 64


@numba.njit(**_INLINE)
def _fwd_segment(
    q, i, k, v, bias, has_bias, key, dscale, ea, eq, col, s0, e0, scale, sc, m, tot, acc, eacc
):  # pragma: no cover - compiled
    """Online softmax of target ``i`` over the edges ``s0:e0``, a block at a time.

    Leaves the running max ``m``, sum ``tot`` (of the undropped weights) and
    unnormalized ``acc`` (per head) for :func:`_fwd_finish` or a merge with
    other pieces.
    """
    nh = m.shape[0]
    cq = q.shape[1] // nh
    cv = v.shape[1] // nh
    zero = q.dtype.type(0)
    one = q.dtype.type(1)
    m[:] = _NEG_INF
    tot[:] = zero
    acc[:] = zero
    eacc[:] = zero
    flat = sc.reshape(sc.size)
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
                s = _score(q, i, k, j, h, cq, scale, bias, b0 + t, has_bias)
                sc[t, h] = _edge_score(s, eq, i, ea, b0 + t, h, scale)
        for h in range(nh):
            mb = m[h]
            for t in range(nb):
                mb = _max(mb, sc[t, h])
            if not mb <= m[h]:
                # A new maximum (or a NaN) rescales what was accumulated. Not
                # after only -inf scores: their weights were 0, so tot is 0 and
                # acc is 0 (or NaN from 0 * inf), what the factor 0 leaves.
                if m[h] != _NEG_INF:
                    corr = _exp(m[h] - mb)
                    tot[h] *= corr
                    lo = (h * cv) & _NN
                    for c in range(cv):
                        acc[lo + c] *= corr
                    _eacc_scale(eacc, corr, ea, h)
                m[h] = mb
            # All -inf so far: shift by 0, every weight is 0 (never NaN).
            shift = m[h] if m[h] != _NEG_INF else zero
            for t in range(nb):
                sc[t, h] -= shift
        # The block's weights of every head, contiguous in sc ([edge, head]).
        _exp_first(flat, nb * nh)
        for h in range(nh):
            w_sum = zero
            for t in range(nb):
                w_sum += sc[t, h]
            tot[h] += w_sum
        # The weighted sum: one gathered v row per edge, each weight times its
        # dropout factor.
        for t in range(nb):
            e = b0 + t
            j = col[e] & _NN
            for h in range(nh):
                w = sc[t, h] * _factor(key, dscale, e, h, nh, one)
                _axpy(acc, w, v, j, h * cv, cv)
                _eacc_axpy(eacc, w, ea, e, h)
        b0 += nb


@numba.njit(**_INLINE)
def _fwd_finish(m, tot, acc, out, lse, i, eacc, ea, eo, inv):  # pragma: no cover - compiled
    nh = m.shape[0]
    cv = out.shape[1] // nh
    zero = out.dtype.type(0)
    one = out.dtype.type(1)
    for h in range(nh):
        lo = (h * cv) & _NN
        # Only a zero sum (no edge, or only -inf scores) is not divided by:
        # a NaN sum makes the output NaN. acc is 0 there unless a value is
        # not finite (0 * inf), as in the reference.
        d = tot[h]
        iv = one if d == zero else one / d
        inv[h] = iv  # for edge_out
        for c in range(cv):
            out[i, lo + c] = acc[lo + c] * iv
        lse[i, h] = _NEG_INF if d == zero else m[h] + math.log(d)
    _eacc_store(eo, i, eacc, inv, ea)


@numba.njit(**_JIT)
def _fwd_kernel(
    q, k, v, bias, has_bias, key, dscale, ea, eq, nf, ptr, col, scale, bounds, limit, out, lse, eo
):  # pragma: no cover - compiled
    nh = lse.shape[1]
    cv = v.shape[1] // nh
    for ch in prange(bounds.shape[0] - 1):
        sc = np.empty((_BLOCK, nh), dtype=q.dtype)
        m = np.empty(nh, dtype=q.dtype)
        tot = np.empty(nh, dtype=q.dtype)
        acc = np.empty(nh * cv, dtype=q.dtype)
        # edge_out's accumulator (size 0 without edge features: nf = 0).
        eacc = np.empty(nh * nf, dtype=q.dtype)
        inv = np.empty(nh, dtype=q.dtype)
        for i in range(bounds[ch] & _NN, bounds[ch + 1]):
            s0, e0 = ptr[i], ptr[i + 1]
            if e0 - s0 > limit:
                continue  # a hub: _fwd_pieces_kernel
            _fwd_segment(
                q,
                i,
                k,
                v,
                bias,
                has_bias,
                key,
                dscale,
                ea,
                eq,
                col,
                s0,
                e0,
                scale,
                sc,
                m,
                tot,
                acc,
                eacc,
            )
            _fwd_finish(m, tot, acc, out, lse, i, eacc, ea, eo, inv)


@numba.njit(**_JIT)
def _fwd_pieces_kernel(
    q, k, v, bias, has_bias, key, dscale, ea, eq, nf, col, scale, pieces, seg, out, lse, eo
):  # pragma: no cover - compiled
    nh = lse.shape[1]
    cv = v.shape[1] // nh
    npc = pieces.shape[0]
    pm = np.empty((npc, nh), dtype=q.dtype)
    pt = np.empty((npc, nh), dtype=q.dtype)
    pa = np.empty((npc, nh * cv), dtype=q.dtype)
    pe = np.empty((npc, nh * nf), dtype=q.dtype)
    for x in prange(npc):
        sc = np.empty((_BLOCK, nh), dtype=q.dtype)
        _fwd_segment(
            q,
            pieces[x, 0] & _NN,
            k,
            v,
            bias,
            has_bias,
            key,
            dscale,
            ea,
            eq,
            col,
            pieces[x, 1],
            pieces[x, 2],
            scale,
            sc,
            pm[x],
            pt[x],
            pa[x],
            pe[x],
        )
    zero = q.dtype.type(0)
    for s in prange(seg.shape[0] - 1):
        m = np.empty(nh, dtype=q.dtype)
        tot = np.empty(nh, dtype=q.dtype)
        acc = np.zeros(nh * cv, dtype=q.dtype)
        eacc = np.zeros(nh * nf, dtype=q.dtype)
        inv = np.empty(nh, dtype=q.dtype)
        # Merge the pieces' (max, sum, acc) in piece order.
        for h in range(nh):
            mh = _NEG_INF
            for x in range(seg[s] & _NN, seg[s + 1]):
                mh = _max(mh, pm[x, h])
            m[h] = mh
            shift = mh if mh != _NEG_INF else zero
            tot[h] = zero
            for x in range(seg[s] & _NN, seg[s + 1]):
                f = _exp(pm[x, h] - shift)
                tot[h] += pt[x, h] * f
                _axpy(acc, f, pa, x, h * cv, cv)
                _eacc_merge(eacc, f, pe, x, ea, h)
        _fwd_finish(m, tot, acc, out, lse, pieces[seg[s], 0] & _NN, eacc, ea, eo, inv)


def attention_fwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    ptr: Tensor,
    col: Tensor,
    scale: float,
    bias: Tensor | None = None,
    *,
    dropout: Dropout | None = None,
    plan: CPUPlan | None = None,
    edge_attr: Tensor | None = None,
    edge_query: Tensor | None = None,
) -> tuple[Tensor, ...]:
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
        dropout: optional :class:`~gnnattn.kernels.common.Dropout`: the
            weights its stream drops are zeroed, the others scaled by
            ``1 / (1 - p)``, after the softmax (``p = 0`` drops nothing).
        plan: ``plan(ptr, col, M)`` (:func:`~gnnattn.kernels.cpu.plan`):
            then ``ptr`` and ``col`` are neither read nor checked beyond their
            sizes, and the kernels run on the plan's (checked) arrays.
        edge_attr: optional ``[E, F]`` raw edge features in CSR order, read
            once per edge and head (never gathered), or ``[E, H, F]``, a row
            per head (``scale edge_query_i^h . edge_attr_ij^h``, a key's term);
            then ``edge_out`` is returned too.
        edge_query: optional ``[N, H, F]`` (needs ``edge_attr``): adds
            ``edge_query_i^h . edge_attr_ij`` to the score, unscaled for ``[E, F]``
            features (times ``scale`` for per-head ones).

    Returns:
        ``out`` ``[N, H, Cv]`` typed like ``q`` and the log-sum-exp ``lse``
        ``[N, H]`` (of the undropped scores) in the compute dtype (float64 for
        float64, else float32); ``lse = -inf`` and ``out = 0`` where a target
        has no finite score; NaN where a score or value it reads is NaN. With
        ``edge_attr``, a third result ``edge_out`` ``[N, H, F]`` (typed like
        ``q``): ``sum_j P_ij edge_attr_ij`` with ``P`` the weights after
        dropout (those that multiply ``v``).

    Raises:
        ValueError: on shapes that do not fit, or ``ptr``/``col`` out of range.
        TypeError: on non-floating inputs or non-integer ``ptr``/``col``.
    """
    e = _check_qkv(q, k, v, bias, ptr, col)
    drop = _check_options(dropout)
    _check_edge(edge_attr, edge_query, q, e)
    if plan is None:
        plan = _make_plan(ptr, col, k.shape[0], None)
    else:
        plan = _check_plan(plan, "plan", q.shape[0], e, k.shape[0])
        _threads()
    return forward(q, k, v, plan.ptr, plan.col, plan.work, scale, bias, drop, edge_attr, edge_query)


def forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    ptr: np.ndarray,
    col: np.ndarray,
    work: _Plan,
    scale: float,
    bias: Tensor | None,
    drop: Dropout | None,
    edge_attr: Tensor | None,
    edge_query: Tensor | None,
) -> tuple[Tensor, ...]:
    """:func:`attention_fwd` on inputs that were checked (by it, or by the operator that
    validated the call: :mod:`.op`), over a checked CSR's arrays and their split.

    ``drop`` is ``None`` or drops something (``threshold > 0``). The results are
    new tensors, contiguous, sharing memory with no input.
    """
    nf = edge_attr.shape[-1] if edge_attr is not None else 0
    dt = acc_dtype(q.dtype)
    n, nh, cv = q.shape[0], q.shape[1], v.shape[2]
    out = torch.empty(n, nh * cv, dtype=dt)
    lse = torch.empty(n, nh, dtype=dt)
    # Every target's row is written by a kernel, as out's.
    eo = torch.empty(n, nh * nf, dtype=dt) if edge_attr is not None else None
    if n * nh:
        qq, kk, vv = _rows(q, dt), _rows(k, dt), _rows(v, dt)
        bb, sc = _bias(bias, dt, nh), _scalar(scale, dt)
        key, dscale = _option_args(drop, dt)
        ea, eq = _edge_rows(edge_attr, dt), _opt_rows(edge_query, dt)
        eo_np = eo.numpy() if eo is not None else None
        o, ls = out.numpy(), lse.numpy()
        has_bias = bias is not None
        args = (qq, kk, vv, bb, has_bias, key, dscale, ea, eq, nf)
        _fwd_kernel(*args, ptr, col, sc, work.bounds, work.limit, o, ls, eo_np)
        if work.pieces.shape[0]:
            _fwd_pieces_kernel(*args, col, sc, work.pieces, work.seg, o, ls, eo_np)
    res = out.view(n, nh, cv).to(q.dtype)
    if eo is None:
        return res, lse
    return res, lse, eo.view(n, nh, nf).to(q.dtype)
