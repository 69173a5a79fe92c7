"""The backward: the ``dq`` pass over the CSR, the ``dk``/``dv`` pass over its transpose.

* ``_attn_bwd_dq``: the forward's plan and walk. ``D_i = sum_c dout_ic
  out_ic`` is computed once on the host side (``N x H`` numbers); the kernel
  recomputes ``alpha_ij = exp(s_ij - lse_i)``, then ``ds = alpha (dp - D_i)``
  with ``dp = keep * scale_d * (dout_i . v_j)``, ``dq_i = scale * sum_j ds_ij
  k_j`` and ``dbias = ds``, all per edge in CSR order. Split targets' partial
  ``dq`` are summed in chunk order (``_sum_split_rows``).
* ``_attn_bwd_dkdv``: one program per chunk of one source ``j`` over the
  **transposed CSR** (the graph object's, built once per graph): ``dv_j =
  sum_i kept_ij dout_i`` and ``dk_j = scale * sum_i ds_ij q_i``; an edge's
  bias, dropout counter and features come from its CSR position ``tperm[t]``.
  High out-degree sources are split and summed the same way.

Why a transposed CSR rather than atomics: every ``dk_j`` / ``dv_j`` is summed
by one program in a fixed order, so the gradients are deterministic (run to
run, bit for bit) and accumulate in float32 registers rather than in the
output dtype; float16/bfloat16 ``atomic_add`` into ``[M, H, C]`` would round
at every add and serialise on the rows of high out-degree sources. The price is
one ``O(E log E)`` sort per graph (kept by :class:`gnnattn.AttentionGraph`)
and recomputing each score twice (once per backward kernel), as FlashAttention-2.

Edge features (``HAS_EA``, ``a_ij`` ``[F]`` per edge in CSR order): the
score's ``edge_query_i . a_ij`` (``HAS_EQ``) is recomputed in both passes,
and ``grad_edge_out_i . a_ij`` (``HAS_GE``, the gradient of ``edge_out_i =
sum_j P_ij a_ij``) joins ``dp`` where ``dout_i . v_j`` does, before the
dropout factor. The ``dq`` pass, which owns each edge's CSR position, writes
``d a_ij = sum_h ds_ij^h edge_query_i^h + kept_ij^h grad_edge_out_i^h``
(``[E, F]``, no head dimension) and sums ``d edge_query_i = sum_j ds_ij
a_ij`` per target (split targets' partials like ``dq``). ``D_i`` then gets
``grad_edge_out_i . edge_out_i`` too: ``sum_j alpha_ij dalpha_ij`` over the
whole message ``dout_i . v_j + grad_edge_out_i . a_ij``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from ...graphs.csr import transpose_csr
from ..chunks import TritonPlan, acc_tl, chunk_range
from ..common import Dropout, acc_dtype, check_index
from ._launch import _check_csc, _check_edge, _check_inputs, _check_plan, _plan_now, _scales
from ._random import _dropout_args, _keep
from ._tiles import _NO_SPECIALISE, _blocks, _load_feats, _load_head_feats, _load_rows
from .forward import _fwd

__all__ = ["attention_bwd"]


@triton.jit(do_not_specialize=_NO_SPECIALISE)
def _attn_bwd_dq(
    q_ptr,
    k_ptr,
    v_ptr,
    bias_ptr,
    ea_ptr,  # [E, F] raw edge features (unused unless HAS_EA)
    eq_ptr,  # [N, H, F] edge queries (unused unless HAS_EQ)
    ge_ptr,  # [N, H, F] gradient of edge_out (unused unless HAS_GE)
    dout_ptr,  # [N, H, CV]
    lse_ptr,
    delta_ptr,  # [N, H]: D = sum(dout * out) (+ sum(ge * edge_out)), computed on the host
    dq_ptr,  # [N, H, C]
    dbias_ptr,  # [E, H] (unused unless HAS_BIAS)
    dea_ptr,  # [E, F] (unused unless HAS_DEA)
    deq_ptr,  # [N, H, F] (unused unless HAS_EQ)
    scale_ptr,
    ptr_ptr,
    col_ptr,
    chunk_ptr_ptr,
    chunk_seg_ptr,
    rank_ptr,
    part_ptr,  # [S, H, C] partial dq of split chunks
    part_eq_ptr,  # [S, H, F] partial d edge_query of split chunks (unused unless HAS_EQ)
    n_seg,
    n_slots,
    seed_lo,
    seed_hi,
    drop_offset,
    drop_threshold,
    H: tl.constexpr,
    C: tl.constexpr,
    CV: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_DROPOUT: tl.constexpr,
    F: tl.constexpr,
    HAS_EA: tl.constexpr,
    HAS_EQ: tl.constexpr,
    HAS_GE: tl.constexpr,
    HAS_DEA: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_CV: tl.constexpr,
    BLOCK_F: tl.constexpr,
    CHUNK: tl.constexpr,
):
    c = tl.program_id(0).to(tl.int64)
    i, start, end, split = chunk_range(
        c, n_slots, ptr_ptr, chunk_ptr_ptr, chunk_seg_ptr, n_seg, CHUNK
    )
    if i < n_seg:
        hs = tl.arange(0, BLOCK_H)
        hmask = hs < H
        cs = tl.arange(0, BLOCK_C)
        cvs = tl.arange(0, BLOCK_CV)
        qmask = hmask[:, None] & (cs < C)[None, :]
        scale = tl.load(scale_ptr)
        drop_scale = tl.load(scale_ptr + 1)
        q = tl.load(q_ptr + i * (H * C) + hs[:, None] * C + cs[None, :], mask=qmask, other=0.0)
        q = q.to(ACC)  # unscaled: the scores are the forward's (q . k) * scale
        dmask = hmask[:, None] & (cvs < CV)[None, :]
        do = tl.load(
            dout_ptr + i * (H * CV) + hs[:, None] * CV + cvs[None, :], mask=dmask, other=0.0
        )
        do = do.to(ACC)  # (BLOCK_H, BLOCK_CV)
        delta = tl.load(delta_ptr + i * H + hs, mask=hmask, other=0.0).to(ACC)
        lse = tl.load(lse_ptr + i * H + hs, mask=hmask, other=float("-inf")).to(ACC)
        # lse = -inf: no finite score, every weight of i is 0 (never NaN).
        live = hmask & (lse != float("-inf"))
        lse_safe = tl.where(live, lse, 0.0)  # no -inf - -inf, even where masked
        if HAS_EQ:
            eq = _load_head_feats(eq_ptr, i, hs, hmask, H, F, BLOCK_F).to(ACC)
        if HAS_GE:
            ge = _load_head_feats(ge_ptr, i, hs, hmask, H, F, BLOCK_F).to(ACC)
        fs = tl.arange(0, BLOCK_F)

        dq = tl.zeros([BLOCK_H, BLOCK_C], ACC)
        deq = tl.zeros([BLOCK_H, BLOCK_F], ACC)  # stays 0 without HAS_EQ
        b = start
        while b < end:
            edges = b + tl.arange(0, BLOCK_E)
            emask = edges < end
            j = tl.load(col_ptr + edges, mask=emask, other=0).to(tl.int64)
            kt = _load_rows(k_ptr, j, emask, hs, hmask, C, BLOCK_C, H).to(ACC)
            s = tl.sum(kt * q[None, :, :], 2) * scale  # (BLOCK_E, BLOCK_H)
            bmask = emask[:, None] & hmask[None, :]
            if HAS_BIAS:
                bias = tl.load(bias_ptr + edges[:, None] * H + hs[None, :], mask=bmask, other=0.0)
                s += bias.to(ACC)
            if HAS_EA:
                at = _load_feats(ea_ptr, edges, emask, F, BLOCK_F).to(ACC)  # (BLOCK_E, BLOCK_F)
                if HAS_EQ:
                    s += tl.sum(at[:, None, :] * eq[None, :, :], 2)
            # exp(-inf) = 0 off the edges and for dead targets (no overflow
            # there); a NaN lse gives NaN weights, as in the reference.
            valid = emask[:, None] & live[None, :]
            alpha = tl.exp(tl.where(valid, s - lse_safe[None, :], float("-inf")))
            vt = _load_rows(v_ptr, j, emask, hs, hmask, CV, BLOCK_CV, H).to(ACC)
            dp = tl.sum(vt * do[None, :, :], 2)  # (BLOCK_E, BLOCK_H): dout_i . v_j
            if HAS_GE:  # edge_out's gradient: grad_edge_out_i . a_ij
                dp += tl.sum(at[:, None, :] * ge[None, :, :], 2)
            kept = alpha  # the weights the forward used
            if HAS_DROPOUT:
                keep = _keep(edges, hs, H, seed_lo, seed_hi, drop_offset, drop_threshold)
                f = keep.to(ACC) * drop_scale
                dp = dp * f
                kept = alpha * f
            ds = alpha * (dp - delta[None, :])
            dq += tl.sum(ds[:, :, None] * kt, 0)
            if HAS_BIAS:
                db = ds.to(dbias_ptr.dtype.element_ty)
                tl.store(dbias_ptr + edges[:, None] * H + hs[None, :], db, mask=bmask)
            if HAS_EQ:
                deq += tl.sum(ds[:, :, None] * at[:, None, :], 0)
            if HAS_DEA:  # (implies HAS_EA)
                # d a_ij sums over heads (reduced last: compiled on an H200, triton
                # 3.6, a middle-axis sum came out ~2x); this program owns row ij.
                dea = tl.zeros([BLOCK_E, BLOCK_F], ACC)
                if HAS_EQ:
                    dea += tl.sum(ds[:, None, :] * tl.trans(eq)[None, :, :], 2)
                if HAS_GE:
                    dea += tl.sum(kept[:, None, :] * tl.trans(ge)[None, :, :], 2)
                amask = emask[:, None] & (fs < F)[None, :]
                dea_offs = edges[:, None] * F + fs[None, :]
                tl.store(dea_ptr + dea_offs, dea.to(dea_ptr.dtype.element_ty), mask=amask)
            b += BLOCK_E
        hc = hs[:, None] * C + cs[None, :]
        fmask = hmask[:, None] & (fs < F)[None, :]
        hf = hs[:, None] * F + fs[None, :]
        if split:
            r = tl.load(rank_ptr + c)
            tl.store(part_ptr + r * (H * C) + hc, dq, mask=qmask)
            if HAS_EQ:
                tl.store(part_eq_ptr + r * (H * F) + hf, deq, mask=fmask)
        else:
            dq_out = (dq * scale).to(dq_ptr.dtype.element_ty)
            tl.store(dq_ptr + i * (H * C) + hc, dq_out, mask=qmask)
            if HAS_EQ:
                tl.store(deq_ptr + i * (H * F) + hf, deq.to(deq_ptr.dtype.element_ty), mask=fmask)


@triton.jit(do_not_specialize=_NO_SPECIALISE)
def _attn_bwd_dkdv(
    q_ptr,
    k_ptr,
    v_ptr,
    bias_ptr,
    ea_ptr,  # [E, F] in CSR order: gathered by tperm (unused unless HAS_EA)
    eq_ptr,  # [N, H, F] gathered by target (unused unless HAS_EQ)
    ge_ptr,  # [N, H, F] gathered by target (unused unless HAS_GE)
    dout_ptr,
    lse_ptr,
    delta_ptr,
    dk_ptr,  # [M, H, C]
    dv_ptr,  # [M, H, CV]
    scale_ptr,
    tptr_ptr,  # [M + 1] int64: the out-edges of source j are tptr[j]:tptr[j+1]
    trow_ptr,  # [E] int32 / int64: their targets
    tperm_ptr,  # [E] int32 / int64: their CSR positions (bias, dropout, edge features)
    chunk_ptr_ptr,
    chunk_seg_ptr,
    rank_ptr,
    part_k_ptr,  # [S, H, C] partial dk of split chunks
    part_v_ptr,  # [S, H, CV] partial dv
    n_seg,
    n_slots,
    seed_lo,
    seed_hi,
    drop_offset,
    drop_threshold,
    H: tl.constexpr,
    C: tl.constexpr,
    CV: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_DROPOUT: tl.constexpr,
    F: tl.constexpr,
    HAS_EA: tl.constexpr,
    HAS_EQ: tl.constexpr,
    HAS_GE: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_CV: tl.constexpr,
    BLOCK_F: tl.constexpr,
    CHUNK: tl.constexpr,
):
    c = tl.program_id(0).to(tl.int64)
    j, start, end, split = chunk_range(
        c, n_slots, tptr_ptr, chunk_ptr_ptr, chunk_seg_ptr, n_seg, CHUNK
    )
    if j < n_seg:
        hs = tl.arange(0, BLOCK_H)
        hmask = hs < H
        cs = tl.arange(0, BLOCK_C)
        cvs = tl.arange(0, BLOCK_CV)
        kmask = hmask[:, None] & (cs < C)[None, :]
        vmask = hmask[:, None] & (cvs < CV)[None, :]
        scale = tl.load(scale_ptr)
        drop_scale = tl.load(scale_ptr + 1)
        k = tl.load(k_ptr + j * (H * C) + hs[:, None] * C + cs[None, :], mask=kmask, other=0.0)
        k = k.to(ACC)  # unscaled: the scores are the forward's (q . k) * scale
        v = tl.load(v_ptr + j * (H * CV) + hs[:, None] * CV + cvs[None, :], mask=vmask, other=0.0)
        v = v.to(ACC)

        dk = tl.zeros([BLOCK_H, BLOCK_C], ACC)
        dv = tl.zeros([BLOCK_H, BLOCK_CV], ACC)
        b = start
        while b < end:
            t = b + tl.arange(0, BLOCK_E)
            emask = t < end  # the tail of the last block of out-edges
            # Row 0 keeps masked lanes' gathers in bounds; they are masked after.
            i = tl.load(trow_ptr + t, mask=emask, other=0).to(tl.int64)
            qt = _load_rows(q_ptr, i, emask, hs, hmask, C, BLOCK_C, H).to(ACC)
            s = tl.sum(qt * k[None, :, :], 2) * scale  # (BLOCK_E, BLOCK_H)
            bmask = emask[:, None] & hmask[None, :]
            ih = i[:, None] * H + hs[None, :]
            if HAS_BIAS or HAS_DROPOUT or HAS_EA:
                e = tl.load(tperm_ptr + t, mask=emask, other=0).to(tl.int64)  # CSR positions
            if HAS_BIAS:
                bias = tl.load(bias_ptr + e[:, None] * H + hs[None, :], mask=bmask, other=0.0)
                s += bias.to(ACC)
            if HAS_EA:
                at = _load_feats(ea_ptr, e, emask, F, BLOCK_F).to(ACC)  # (BLOCK_E, BLOCK_F)
                if HAS_EQ:  # the target's edge query, all heads: one H * F row per edge
                    eqt = _load_rows(eq_ptr, i, emask, hs, hmask, F, BLOCK_F, H).to(ACC)
                    s += tl.sum(eqt * at[:, None, :], 2)
            lse = tl.load(lse_ptr + ih, mask=bmask, other=float("-inf")).to(ACC)
            valid = bmask & (lse != float("-inf"))  # lse = -inf: all weights of i are 0
            alpha = tl.exp(tl.where(valid, s - tl.where(valid, lse, 0.0), float("-inf")))
            dot = _load_rows(dout_ptr, i, emask, hs, hmask, CV, BLOCK_CV, H).to(ACC)
            dp = tl.sum(dot * v[None, :, :], 2)
            if HAS_GE:
                get = _load_rows(ge_ptr, i, emask, hs, hmask, F, BLOCK_F, H).to(ACC)
                dp += tl.sum(get * at[:, None, :], 2)
            kept = alpha
            if HAS_DROPOUT:
                keep = _keep(e, hs, H, seed_lo, seed_hi, drop_offset, drop_threshold)
                f = keep.to(ACC) * drop_scale
                dp = dp * f
                kept = alpha * f
            dv += tl.sum(kept[:, :, None] * dot, 0)
            delta = tl.load(delta_ptr + ih, mask=bmask, other=0.0).to(ACC)
            ds = alpha * (dp - delta)
            dk += tl.sum(ds[:, :, None] * qt, 0)
            b += BLOCK_E
        hc = hs[:, None] * C + cs[None, :]
        hcv = hs[:, None] * CV + cvs[None, :]
        if split:
            r = tl.load(rank_ptr + c)
            tl.store(part_k_ptr + r * (H * C) + hc, dk, mask=kmask)
            tl.store(part_v_ptr + r * (H * CV) + hcv, dv, mask=vmask)
        else:
            # dk = scale * sum ds q.
            dk_out = (dk * scale).to(dk_ptr.dtype.element_ty)
            tl.store(dk_ptr + j * (H * C) + hc, dk_out, mask=kmask)
            tl.store(dv_ptr + j * (H * CV) + hcv, dv.to(dv_ptr.dtype.element_ty), mask=vmask)


@triton.jit(do_not_specialize=["n_slots"])  # a graph size (as _NO_SPECIALISE)
def _sum_split_rows(
    split_ptr,
    chunk_ptr_ptr,
    chunk_seg_ptr,
    rank_ptr,
    part_ptr,  # [S, W] partial rows of split chunks
    out_ptr,  # [*, W]: row i gets the sum of segment i's partials, times mult
    scale_ptr,
    n_slots,
    W: tl.constexpr,
    SCALED: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    """Sum the partial rows of each split segment in chunk order (deterministic)."""
    slot = tl.load(split_ptr + tl.program_id(0))
    if slot < n_slots:
        seg = tl.load(chunk_seg_ptr + slot)
        c0 = tl.load(chunk_ptr_ptr + seg)
        if slot == c0:
            c1 = tl.load(chunk_ptr_ptr + seg + 1)
            r0 = tl.load(rank_ptr + c0)
            ws = tl.arange(0, BLOCK_W)
            wmask = ws < W
            total = tl.zeros([BLOCK_W], ACC)
            r = r0
            while r < r0 + (c1 - c0):
                total += tl.load(part_ptr + r * W + ws, mask=wmask, other=0.0)
                r += 1
            if SCALED:
                total = total * tl.load(scale_ptr)
            tl.store(out_ptr + seg * W + ws, total.to(out_ptr.dtype.element_ty), mask=wmask)


class _Edge(NamedTuple):
    """The edge-feature tensors of a backward call (any of them ``None``)."""

    attr: Tensor | None = None
    query: Tensor | None = None
    grad_out: Tensor | None = None
    out: Tensor | None = None  # the forward's edge_out, for D_i
    need_dea: bool = True  # False: edge_attr needs no gradient, none is computed
    grad_lse: Tensor | None = None  # the gradient of lse, [N, H] (None: zero)


def _bwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    grad_out: Tensor,
    scale: float,
    bias: Tensor | None,
    dropout: Dropout | None,
    pl: TritonPlan,
    pl_t: TritonPlan,
    tperm: Tensor,
    block_e: int | None,
    edge: _Edge | None = None,
) -> tuple[Tensor | None, ...]:
    """The backward's launches, given checked plans: no host synchronisation.

    Returns the four gradients of :func:`attention_bwd`, then ``dedge_attr``
    and ``dedge_query`` when ``edge.attr`` is given.
    """
    n, h, c = q.shape
    m, cv = k.shape[0], v.shape[2]
    e = pl.num_edges
    fmt = torch.contiguous_format
    edge = edge if edge is not None else _Edge()
    ea, eq, ge, need_dea = edge.attr, edge.query, edge.grad_out, edge.need_dea
    nf = ea.shape[1] if ea is not None else 0
    empty = n * h == 0 or e == 0  # no edge, no gradient: zeros
    # Otherwise every element is written by a kernel: each target, source and
    # edge belongs to exactly one program (or to a split row summed once).
    like = torch.zeros_like if empty else torch.empty_like
    dq, dk, dv = (like(t, memory_format=fmt) for t in (q, k, v))
    dbias, dea, deq = (
        like(t, memory_format=fmt) if t is not None else None
        for t in (bias, ea if need_dea else None, eq)
    )
    if empty:
        return (dq, dk, dv, dbias) if ea is None else (dq, dk, dv, dbias, dea, deq)
    acc_t = acc_dtype(q.dtype)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    grad_out = grad_out.to(q.dtype).contiguous()
    lse = lse.to(acc_t).contiguous()
    # Dummy pointers (q) for the options not given: never read or written.
    b, ea_a, eq_a, ge_a, db, dea_a, deq_a = (
        t.contiguous() if t is not None else q for t in (bias, ea, eq, ge, dbias, dea, deq)
    )
    scales = _scales(scale, dropout, acc_t, q.device)
    # D_i = sum_c dout_ic out_ic (= sum_j alpha_ij dalpha_ij, with dropout
    # too): N x H numbers, one pass over out, shared by both kernels.
    # The edge_out gradient adds its own term: sum_f ge_if edge_out_if.
    delta = (grad_out.to(acc_t) * out.to(acc_t)).sum(-1)  # (N, H)
    if ge is not None and edge.out is not None:
        delta = delta + (ge.to(acc_t) * edge.out.to(acc_t)).sum(-1)
    if edge.grad_lse is not None:
        # d lse_i / d s_ij = alpha_ij: dS_ij = alpha_ij (dp_ij - D_i + glse_i).
        delta = delta - edge.grad_lse.to(acc_t)
    delta = delta.contiguous()
    consts = dict(
        H=h,
        C=c,
        CV=cv,
        HAS_BIAS=bias is not None,
        HAS_DROPOUT=dropout is not None,
        ACC=acc_tl(q.dtype),
        F=nf,
        HAS_EA=ea is not None,
        HAS_EQ=eq is not None,
        HAS_GE=ge is not None,
    )
    drop = _dropout_args(dropout)

    blk = _blocks(pl, h, c, cv, block_e, nf)
    blocks = dict(BLOCK_E=blk.block_e, BLOCK_H=blk.block_h, BLOCK_C=blk.block_c)
    blocks.update(BLOCK_CV=blk.block_cv, BLOCK_F=blk.block_f, CHUNK=pl.chunk)
    ch = pl.chunks
    part = torch.empty((ch.split_grid, h, c), dtype=acc_t, device=q.device)
    part_eq = part  # a dummy pointer without edge queries: never read or written
    if eq is not None:
        part_eq = torch.empty((ch.split_grid, h, nf), dtype=acc_t, device=q.device)
    _attn_bwd_dq[(ch.grid,)](
        q,
        k,
        v,
        b,
        ea_a,
        eq_a,
        ge_a,
        grad_out,
        lse,
        delta,
        dq,
        db,
        dea_a,
        deq_a,
        scales,
        pl.ptr,
        pl.col,
        ch.chunk_ptr,
        ch.chunk_seg,
        ch.rank,
        part,
        part_eq,
        n,
        ch.grid,
        *drop,
        num_warps=blk.num_warps,
        HAS_DEA=dea is not None,
        **consts,
        **blocks,
    )
    if e > pl.chunk:
        _sum_split(pl, part, dq, scales, True, consts["ACC"])
        if deq is not None:
            _sum_split(pl, part_eq, deq, scales, False, consts["ACC"])

    if m * h > 0:
        blk = _blocks(pl_t, h, c, cv, block_e, nf)
        blocks = dict(BLOCK_E=blk.block_e, BLOCK_H=blk.block_h, BLOCK_C=blk.block_c)
        blocks.update(BLOCK_CV=blk.block_cv, BLOCK_F=blk.block_f, CHUNK=pl_t.chunk)
        ch = pl_t.chunks
        part_k = torch.empty((ch.split_grid, h, c), dtype=acc_t, device=q.device)
        part_v = torch.empty((ch.split_grid, h, cv), dtype=acc_t, device=q.device)
        _attn_bwd_dkdv[(ch.grid,)](
            q,
            k,
            v,
            b,
            ea_a,
            eq_a,
            ge_a,
            grad_out,
            lse,
            delta,
            dk,
            dv,
            scales,
            pl_t.ptr,
            pl_t.col,
            tperm,
            ch.chunk_ptr,
            ch.chunk_seg,
            ch.rank,
            part_k,
            part_v,
            m,
            ch.grid,
            *drop,
            num_warps=blk.num_warps,
            **consts,
            **blocks,
        )
        if e > pl_t.chunk:
            _sum_split(pl_t, part_k, dk, scales, True, consts["ACC"])
            _sum_split(pl_t, part_v, dv, scales, False, consts["ACC"])
    if ea is None:
        return dq, dk, dv, dbias
    return dq, dk, dv, dbias, dea, deq


def _sum_split(
    pl: TritonPlan, part: Tensor, out: Tensor, scales: Tensor, scaled: bool, acc: tl.dtype
) -> None:
    w = math.prod(part.shape[1:])
    ch = pl.chunks
    _sum_split_rows[(ch.split_grid,)](
        ch.split,
        ch.chunk_ptr,
        ch.chunk_seg,
        ch.rank,
        part,
        out,
        scales,
        ch.grid,
        W=w,
        SCALED=scaled,
        ACC=acc,
        BLOCK_W=triton.next_power_of_2(max(w, 1)),
    )


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
    dropout: Dropout | None = None,
    csc: tuple[Tensor, Tensor, Tensor] | None = None,
    plan: TritonPlan | None = None,
    csc_plan: TritonPlan | None = None,
    edge_attr: Tensor | None = None,
    edge_query: Tensor | None = None,
    grad_edge_out: Tensor | None = None,
    need_dedge_attr: bool = True,
    grad_lse: Tensor | None = None,
    block_e: int | None = None,
    split_blocks: int | None = None,
    edge_out: Tensor | None = None,
) -> tuple[Tensor | None, ...]:
    """Gradients of :func:`.attention_fwd` w.r.t. ``q``, ``k``, ``v``, ``bias`` (and
    ``edge_attr``, ``edge_query``); ``grad_lse`` ``[N, H]`` is the gradient of the
    forward's ``lse`` (``None``: zero).

    Args:
        q: ``[N, H, C]``, as in the forward.
        k: ``[M, H, C]``.
        v: ``[M, H, Cv]``.
        out: ``[N, H, Cv]`` the forward output, or ``None`` (recomputed then:
            one more forward).
        lse: ``[N, H]`` the forward log-sum-exp.
        grad_out: ``[N, H, Cv]`` the gradient of ``out``.
        ptr: ``[N + 1]`` int64 CSR pointers.
        col: ``[E]`` int32/int64 sources.
        scale: as in the forward.
        bias: the forward's ``[E, H]`` bias, or ``None``.
        dropout: the forward's dropout (the same key: the mask is regenerated).
        csc: the transposed CSR ``(tptr, trow, tperm)`` of the graph
            (:attr:`gnnattn.AttentionGraph.csc`); built here when not given
            (not allowed with ``csc_plan``, whose ``perm`` it supplies).
        plan: :func:`~gnnattn.kernels.chunks.plan` of ``(ptr, col, M)``, as in
            :func:`.attention_fwd`.
        csc_plan: :func:`~gnnattn.kernels.chunks.plan` of ``(tptr, trow, N)``. With
            both plans the call never synchronises with the device.
        edge_attr: the forward's ``[E, F]`` edge features, or ``None``.
        edge_query: the forward's ``[N, H, F]`` edge queries, or ``None``.
        grad_edge_out: ``[N, H, F]`` the gradient of the forward's
            ``edge_out`` (``None``: zero).
        need_dedge_attr: ``False`` when ``edge_attr`` needs no gradient: the
            kernel then compiles without ``dedge_attr``'s sum and store.
        block_e: as in :func:`.attention_fwd`.
        split_blocks: as in :func:`.attention_fwd` (targets in the ``dq``
            pass, sources in the ``dk``/``dv`` pass); not with plans.
        edge_out: the forward's ``edge_out`` (used with ``grad_edge_out``:
            ``D_i`` needs ``grad_edge_out_i . edge_out_i``); recomputed with
            ``out`` (one more forward) when ``grad_edge_out`` is given without it.

    Returns:
        ``dq``, ``dk``, ``dv`` (typed like ``q``, ``k``, ``v``) and ``dbias``
        ``[E, H]`` (typed like ``bias``; ``None`` without a bias); with
        ``edge_attr`` six results: these four, then ``dedge_attr`` ``[E, F]``
        (typed like ``edge_attr``; ``None`` without ``need_dedge_attr``) and
        ``dedge_query`` ``[N, H, F]`` (typed like ``edge_query``; ``None``
        without one).
    """
    _check_inputs(q, k, v, ptr, col, bias, dropout)
    _check_edge(q, col.numel(), edge_attr, edge_query, grad_edge_out, edge_out)
    n, h, c = q.shape
    m, cv = k.shape[0], v.shape[2]
    e = col.numel()
    named = (
        ("grad_out", grad_out, (n, h, cv)),
        ("lse", lse, (n, h)),
        ("grad_lse", grad_lse, (n, h)),
    )
    for name, t, shape in (*named, ("out", out, (n, h, cv))):
        if t is not None and (tuple(t.shape) != shape or t.device != q.device):
            raise ValueError(
                f"Expected '{name}' of shape {list(shape)} on {q.device}, got "
                f"{list(t.shape)} on {t.device}"
            )
    dims = (h, c, cv)
    if plan is None:
        plan = _plan_now(ptr, col, m, dims, block_e, split_blocks)
    else:
        plan = _check_plan(plan, "plan", n, e, m, q.device, split_blocks)
    if csc_plan is None:
        if csc is None:
            tr = transpose_csr(plan.ptr, plan.col, m)
            csc = (tr.ptr, tr.row, tr.perm)
        tptr, trow, tperm = _check_csc(csc, m, e, q.device)
        check_index(tperm, e, "csc")  # positions index bias and edge features: checked too
        csc_plan = _plan_now(tptr, trow, n, dims, block_e, split_blocks)
    else:
        csc_plan = _check_plan(csc_plan, "csc_plan", m, e, n, q.device, split_blocks)
        if csc is None:
            raise ValueError("Expected 'csc' with 'csc_plan' (its perm, the CSR positions)")
        tperm = _check_csc(csc, m, e, q.device)[2]
    if out is None or (grad_edge_out is not None and edge_out is None):
        # D_i needs the outputs the caller did not keep: one more forward.
        fwd = _fwd(q, k, v, scale, bias, dropout, plan, block_e, edge_attr, edge_query)
        out = fwd[0] if out is None else out
        edge_out = fwd[2] if edge_out is None else edge_out
    edge = _Edge(edge_attr, edge_query, grad_edge_out, edge_out, need_dedge_attr, grad_lse)
    return _bwd(
        q, k, v, out, lse, grad_out, scale, bias, dropout, plan, csc_plan, tperm, block_e, edge
    )
