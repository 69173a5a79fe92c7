"""The forward: a kernel per chunk, a kernel to merge split targets, their launcher.

* ``_attn_fwd``: one program per chunk of one destination ``i``, for all heads
  at once (:mod:`._tiles`). The program walks its edges in blocks of
  ``BLOCK_E`` with the online softmax of FlashAttention (a running max ``m``
  and sum ``l`` per head, the accumulator ``acc = sum p_j v_j`` rescaled by
  ``exp(m_old - m_new)``). Scores live only in registers: nothing of size
  ``E x C`` or ``E x H`` is written. It saves ``lse = m + log(l)``.
* ``_attn_fwd_combine``: a destination with more in-edges than the plan's
  chunk is cut into chunks (:mod:`gnnattn.kernels.chunks`); each chunk leaves
  its partial ``(m, l, acc)`` and this kernel merges them once per target.

Edge features (``HAS_EA``): each edge's raw ``a_ij`` ``[F]`` row is read once
per edge in CSR order (shared by every head); with ``HAS_EQ`` the score gets
``edge_query_i^h . a_ij`` (``edge_query_i`` ``[H, F]`` loaded once per
target), and the weights accumulate ``edge_out_i = sum_j P_ij a_ij``
``[H, F]`` beside ``acc``, rescaled by the same ``exp(m_old - m_new)`` and
merged by the combine kernel the same way. Per edge that is ``F`` numbers
more, not ``H * C``: the layer applies ``W_v`` to the aggregate.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..chunks import TritonPlan, acc_tl, chunk_range
from ..common import Dropout, acc_dtype
from ._launch import _check_edge, _check_inputs, _check_plan, _plan_now, _scales
from ._random import _dropout_args, _keep
from ._tiles import _NO_SPECIALISE, _blocks, _load_feats, _load_head_feats, _load_rows

__all__ = ["attention_fwd"]


@triton.jit
def _mixed_overflow(
    start,
    end,
    q,
    k_ptr,
    col_ptr,
    hs,
    hmask,
    ea_ptr,
    eq,
    H,
    C: tl.constexpr,
    F: tl.constexpr,
    HAS_EQ: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_F: tl.constexpr,
):
    """Per head, whether an edge of ``start:end`` has a dot product (``q . k``, or
    ``eq . a``) whose rounded products overflow to both ``+inf`` and ``-inf``.

    Its IEEE sum is ``inf - inf = NaN`` in any order (the reference, the
    ``"mp"`` backend), but a fused multiply-add never rounds a product, so the
    compiled sum takes the sign of the first huge term (inputs of ``1e20`` in
    float32): a ``-inf`` score, a masked edge and a finite target, where the
    reference is NaN. Products and their max and min, no sum: nothing here
    can be contracted. Run only for a chunk where such a ``-inf`` came up.
    """
    bad = tl.zeros([BLOCK_H], tl.int32)
    b = start
    while b < end:
        edges = b + tl.arange(0, BLOCK_E)
        emask = edges < end
        j = tl.load(col_ptr + edges, mask=emask, other=0).to(tl.int64)
        prod = _load_rows(k_ptr, j, emask, hs, hmask, C, BLOCK_C, H).to(ACC) * q[None, :, :]
        hit = (tl.max(prod, 2) == float("inf")) & (tl.min(prod, 2) == float("-inf"))
        if HAS_EQ:
            at = _load_feats(ea_ptr, edges, emask, F, BLOCK_F).to(ACC)
            pe = at[:, None, :] * eq[None, :, :]
            hit = hit | ((tl.max(pe, 2) == float("inf")) & (tl.min(pe, 2) == float("-inf")))
        bad = tl.maximum(bad, tl.max(hit.to(tl.int32), 0))
        b += BLOCK_E
    return bad > 0


@triton.jit(do_not_specialize=_NO_SPECIALISE)
def _attn_fwd(
    q_ptr,  # [N, H, C]
    k_ptr,  # [M, H, C]
    v_ptr,  # [M, H, CV]
    bias_ptr,  # [E, H] (unused unless HAS_BIAS)
    ea_ptr,  # [E, F] raw edge features (unused unless HAS_EA)
    eq_ptr,  # [N, H, F] edge queries (unused unless HAS_EQ)
    out_ptr,  # [N, H, CV]
    lse_ptr,  # [N, H] float32 (float64)
    eo_ptr,  # [N, H, F] edge_out (unused unless HAS_EA)
    scale_ptr,  # [2] the scale and the dropout's 1 / (1 - p), in the accumulation dtype
    ptr_ptr,  # [N + 1] int64
    col_ptr,  # [E] int32 / int64
    chunk_ptr_ptr,  # [N + 1] int64: the chunks of target i
    chunk_seg_ptr,  # [G] int64: the target of each chunk slot (N past the end)
    rank_ptr,  # [G] int64: where a split chunk keeps its partials
    part_m_ptr,  # [S, H] partial max of split chunks
    part_l_ptr,  # [S, H] partial sum of exp, relative to the partial max
    part_acc_ptr,  # [S, H, CV] partial sum of p v
    part_eo_ptr,  # [S, H, F] partial sum of p a (unused unless HAS_EA)
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
        hmask = hs < H  # head padding
        cs = tl.arange(0, BLOCK_C)
        cvs = tl.arange(0, BLOCK_CV)
        qmask = hmask[:, None] & (cs < C)[None, :]
        # The scale multiplies each score, as in the reference (q . k) * scale:
        # folded into q, it would move where an overflowing product turns inf.
        scale = tl.load(scale_ptr)
        drop_scale = tl.load(scale_ptr + 1)
        q = tl.load(q_ptr + i * (H * C) + hs[:, None] * C + cs[None, :], mask=qmask, other=0.0)
        q = q.to(ACC)  # (BLOCK_H, BLOCK_C)
        if HAS_EQ:  # unscaled: the layer folded the scale into it
            eq = _load_head_feats(eq_ptr, i, hs, hmask, H, F, BLOCK_F).to(ACC)

        m = tl.full([BLOCK_H], float("-inf"), ACC)
        m_safe = tl.zeros([BLOCK_H], ACC)
        l_sum = tl.zeros([BLOCK_H], ACC)
        acc = tl.zeros([BLOCK_H, BLOCK_CV], ACC)
        eacc = tl.zeros([BLOCK_H, BLOCK_F], ACC)  # sum p a (stays 0 without HAS_EA)
        # Where a dot product came out -inf (see _mixed_overflow): one compare
        # per score here, the second look after the loop only if one did.
        low = tl.zeros([BLOCK_E, BLOCK_H], tl.int32)
        b = start
        while b < end:
            edges = b + tl.arange(0, BLOCK_E)
            emask = edges < end  # the tail of the last block
            # One col load per edge serves every head; row 0 keeps masked
            # lanes' gathers in bounds.
            j = tl.load(col_ptr + edges, mask=emask, other=0).to(tl.int64)
            kt = _load_rows(k_ptr, j, emask, hs, hmask, C, BLOCK_C, H).to(ACC)
            s = tl.sum(kt * q[None, :, :], 2)  # (BLOCK_E, BLOCK_H)
            low = low | (s == float("-inf")).to(tl.int32)
            s = s * scale
            if HAS_BIAS:
                bmask = emask[:, None] & hmask[None, :]
                bias = tl.load(bias_ptr + edges[:, None] * H + hs[None, :], mask=bmask, other=0.0)
                s += bias.to(ACC)
            if HAS_EA:
                at = _load_feats(ea_ptr, edges, emask, F, BLOCK_F).to(ACC)  # (BLOCK_E, BLOCK_F)
                if HAS_EQ:
                    se = tl.sum(at[:, None, :] * eq[None, :, :], 2)
                    low = low | (se == float("-inf")).to(tl.int32)
                    s += se
            s = tl.where(emask[:, None], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 0))
            # All scores so far -inf: shift by 0, so exp gives 0 and never NaN.
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp(s - m_safe[None, :])  # (BLOCK_E, BLOCK_H)
            corr = tl.exp(m - m_safe)  # 0 while nothing was accumulated
            l_sum = l_sum * corr + tl.sum(p, 0)  # undropped: the normaliser
            if HAS_DROPOUT:
                # A product, not a select: a NaN weight stays NaN when dropped.
                keep = _keep(edges, hs, H, seed_lo, seed_hi, drop_offset, drop_threshold)
                p = p * (keep.to(ACC) * drop_scale)
            vt = _load_rows(v_ptr, j, emask, hs, hmask, CV, BLOCK_CV, H).to(ACC)
            acc = acc * corr[:, None] + tl.sum(p[:, :, None] * vt, 0)
            if HAS_EA:
                eacc = eacc * corr[:, None] + tl.sum(p[:, :, None] * at[:, None, :], 0)
            m = m_new
            b += BLOCK_E
        if tl.max(low) > 0:
            # An overflow the reference has as NaN: a NaN sum, so that the
            # output, lse (and a split target's merge) are NaN.
            bad = _mixed_overflow(
                start,
                end,
                q,
                k_ptr,
                col_ptr,
                hs,
                hmask,
                ea_ptr,
                eq if HAS_EQ else q,
                H,
                C,
                F,
                HAS_EQ,
                ACC,
                BLOCK_E,
                BLOCK_H,
                BLOCK_C,
                BLOCK_F,
            )
            l_sum = tl.where(bad, float("nan"), l_sum)

        omask = hmask[:, None] & (cvs < CV)[None, :]
        fs = tl.arange(0, BLOCK_F)
        fmask = hmask[:, None] & (fs < F)[None, :]
        hf = hs[:, None] * F + fs[None, :]
        if split:
            # A split target: (max, sum, acc) of this chunk for the combine kernel.
            r = tl.load(rank_ptr + c)
            tl.store(part_m_ptr + r * H + hs, m, mask=hmask)
            tl.store(part_l_ptr + r * H + hs, l_sum, mask=hmask)
            p_offs = r * (H * CV) + hs[:, None] * CV + cvs[None, :]
            tl.store(part_acc_ptr + p_offs, acc, mask=omask)
            if HAS_EA:
                tl.store(part_eo_ptr + r * (H * F) + hf, eacc, mask=fmask)
        else:
            # Only a zero sum (no finite score) is replaced: out = 0, lse = -inf.
            # A NaN sum is divided by, so NaN propagates.
            zero = l_sum == 0
            denom = tl.where(zero, 1.0, l_sum)
            out = acc / denom[:, None]
            o_offs = i * (H * CV) + hs[:, None] * CV + cvs[None, :]
            tl.store(out_ptr + o_offs, out.to(out_ptr.dtype.element_ty), mask=omask)
            lse = tl.where(zero, float("-inf"), m_safe + tl.log(denom))
            tl.store(lse_ptr + i * H + hs, lse, mask=hmask)
            if HAS_EA:
                eo = (eacc / denom[:, None]).to(eo_ptr.dtype.element_ty)
                tl.store(eo_ptr + i * (H * F) + hf, eo, mask=fmask)


@triton.jit(do_not_specialize=["n_slots"])  # a graph size (as _NO_SPECIALISE)
def _attn_fwd_combine(
    split_ptr,  # [S] int64: slots of split chunks, then the sentinel G
    chunk_ptr_ptr,
    chunk_seg_ptr,
    rank_ptr,
    part_m_ptr,
    part_l_ptr,
    part_acc_ptr,
    part_eo_ptr,  # [S, H, F] (unused unless HAS_EA)
    out_ptr,
    lse_ptr,
    eo_ptr,  # [N, H, F] (unused unless HAS_EA)
    n_slots,
    H: tl.constexpr,
    CV: tl.constexpr,
    F: tl.constexpr,
    HAS_EA: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_CV: tl.constexpr,
    BLOCK_F: tl.constexpr,
):
    """Merge the partials of each split target, once (its first chunk's program)."""
    slot = tl.load(split_ptr + tl.program_id(0))
    if slot < n_slots:
        i = tl.load(chunk_seg_ptr + slot)
        c0 = tl.load(chunk_ptr_ptr + i)
        if slot == c0:
            c1 = tl.load(chunk_ptr_ptr + i + 1)
            r0 = tl.load(rank_ptr + c0)
            hs = tl.arange(0, BLOCK_H)
            hmask = hs < H
            cvs = tl.arange(0, BLOCK_CV)
            omask = hmask[:, None] & (cvs < CV)[None, :]
            hc = hs[:, None] * CV + cvs[None, :]
            fs = tl.arange(0, BLOCK_F)
            fmask = hmask[:, None] & (fs < F)[None, :]
            hf = hs[:, None] * F + fs[None, :]
            m = tl.full([BLOCK_H], float("-inf"), ACC)
            l_sum = tl.zeros([BLOCK_H], ACC)
            acc = tl.zeros([BLOCK_H, BLOCK_CV], ACC)
            eacc = tl.zeros([BLOCK_H, BLOCK_F], ACC)
            r = r0
            while r < r0 + (c1 - c0):  # a target's chunks have consecutive ranks
                pm = tl.load(part_m_ptr + r * H + hs, mask=hmask, other=float("-inf"))
                pl = tl.load(part_l_ptr + r * H + hs, mask=hmask, other=0.0)
                pa = tl.load(part_acc_ptr + r * (H * CV) + hc, mask=omask, other=0.0)
                m_new = tl.maximum(m, pm)
                m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
                # Each partial is relative to its own safe shift (0 if all -inf,
                # where its sums are 0 anyway).
                pm_safe = tl.where(pm == float("-inf"), 0.0, pm)
                m_old_safe = tl.where(m == float("-inf"), 0.0, m)
                a_old = tl.where(m == float("-inf"), 0.0, tl.exp(m_old_safe - m_safe))
                a_new = tl.where(pm == float("-inf"), 0.0, tl.exp(pm_safe - m_safe))
                l_sum = l_sum * a_old + pl * a_new
                acc = acc * a_old[:, None] + pa * a_new[:, None]
                if HAS_EA:
                    pe = tl.load(part_eo_ptr + r * (H * F) + hf, mask=fmask, other=0.0)
                    eacc = eacc * a_old[:, None] + pe * a_new[:, None]
                m = m_new
                r += 1
            zero = l_sum == 0  # as in _attn_fwd: a NaN sum propagates
            denom = tl.where(zero, 1.0, l_sum)
            m_safe = tl.where(m == float("-inf"), 0.0, m)
            out = acc / denom[:, None]
            tl.store(out_ptr + i * (H * CV) + hc, out.to(out_ptr.dtype.element_ty), mask=omask)
            lse = tl.where(zero, float("-inf"), m_safe + tl.log(denom))
            tl.store(lse_ptr + i * H + hs, lse, mask=hmask)
            if HAS_EA:
                eo = (eacc / denom[:, None]).to(eo_ptr.dtype.element_ty)
                tl.store(eo_ptr + i * (H * F) + hf, eo, mask=fmask)


def _fwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float,
    bias: Tensor | None,
    dropout: Dropout | None,
    pl: TritonPlan,
    block_e: int | None,
    edge_attr: Tensor | None = None,
    edge_query: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """The forward's launches, given a checked plan: no host synchronisation.

    Returns ``out``, ``lse`` and ``edge_out`` (``None`` without ``edge_attr``).
    """
    n, h, c = q.shape
    cv = v.shape[2]
    nf = edge_attr.shape[1] if edge_attr is not None else 0
    acc_t = acc_dtype(q.dtype)
    out = torch.empty((n, h, cv), dtype=q.dtype, device=q.device)
    lse = torch.empty((n, h), dtype=acc_t, device=q.device)
    eo = torch.empty((n, h, nf), dtype=q.dtype, device=q.device) if edge_attr is not None else None
    if n * h == 0:
        return out, lse, eo
    if pl.num_edges == 0:  # no edges: zero outputs, lse = -inf (no launch needed)
        return out.zero_(), lse.fill_(float("-inf")), (eo.zero_() if eo is not None else None)
    blk = _blocks(pl, h, c, cv, block_e, nf)
    ch = pl.chunks
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    b = bias.contiguous() if bias is not None else q  # a dummy pointer, never read
    ea = edge_attr.contiguous() if edge_attr is not None else q  # likewise
    eq = edge_query.contiguous() if edge_query is not None else q  # likewise
    eo_arg = eo if eo is not None else out  # never written without HAS_EA
    scales = _scales(scale, dropout, acc_t, q.device)
    part_m = torch.empty((ch.split_grid, h), dtype=acc_t, device=q.device)
    part_l = torch.empty_like(part_m)
    part_acc = torch.empty((ch.split_grid, h, cv), dtype=acc_t, device=q.device)
    part_eo = part_l  # a dummy pointer without edge features: never read or written
    if eo is not None:
        part_eo = torch.empty((ch.split_grid, h, nf), dtype=acc_t, device=q.device)
    shape = dict(H=h, CV=cv, F=nf, HAS_EA=edge_attr is not None, ACC=acc_tl(q.dtype))
    blocks = dict(BLOCK_H=blk.block_h, BLOCK_CV=blk.block_cv, BLOCK_F=blk.block_f)
    _attn_fwd[(ch.grid,)](
        q,
        k,
        v,
        b,
        ea,
        eq,
        out,
        lse,
        eo_arg,
        scales,
        pl.ptr,
        pl.col,
        ch.chunk_ptr,
        ch.chunk_seg,
        ch.rank,
        part_m,
        part_l,
        part_acc,
        part_eo,
        n,
        ch.grid,
        *_dropout_args(dropout),
        C=c,
        HAS_BIAS=bias is not None,
        HAS_DROPOUT=dropout is not None,
        HAS_EQ=edge_query is not None,
        BLOCK_E=blk.block_e,
        BLOCK_C=blk.block_c,
        CHUNK=pl.chunk,
        num_warps=blk.num_warps,
        **shape,
        **blocks,
    )
    if pl.num_edges > pl.chunk:  # otherwise no target can have two chunks
        _attn_fwd_combine[(ch.split_grid,)](
            ch.split,
            ch.chunk_ptr,
            ch.chunk_seg,
            ch.rank,
            part_m,
            part_l,
            part_acc,
            part_eo,
            out,
            lse,
            eo_arg,
            ch.grid,
            **shape,
            **blocks,
        )
    return out, lse, eo


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
    plan: TritonPlan | None = None,
    edge_attr: Tensor | None = None,
    edge_query: Tensor | None = None,
    block_e: int | None = None,
    split_blocks: int | None = None,
) -> tuple[Tensor, ...]:
    """Sparse attention over a destination-sorted CSR graph (one fused kernel).

    Args:
        q: ``[N, H, C]`` queries of the targets.
        k: ``[M, H, C]`` keys of the sources.
        v: ``[M, H, Cv]`` values of the sources.
        ptr: ``[N + 1]`` int64 CSR pointers (incoming edges per target).
        col: ``[E]`` int32/int64 source of each edge.
        scale: multiplies ``q . k``.
        bias: optional ``[E, H]`` additive score bias (``-inf`` masks an edge).
        dropout: optional attention dropout (:class:`~gnnattn.kernels.common.Dropout`).
        plan: :func:`~gnnattn.kernels.chunks.plan` of ``(ptr, col, M)``: then nothing is read on the
            host and the call never synchronises; its ``ptr``/``col`` are the
            ones used. Made here (checks included) when not given.
        edge_attr: optional ``[E, F]`` raw edge features (CSR order), read once
            per edge for all heads; then ``edge_out`` is returned too.
        edge_query: optional ``[N, H, F]`` (needs ``edge_attr``): adds
            ``edge_query_i^h . edge_attr_ij`` to the score, unscaled.
        block_e: edges per tile (a power of two); default from the mean degree.
        split_blocks: without ``plan``, a target with more than ``block_e *
            split_blocks`` edges is split across programs whose partials are
            merged (default: chunks of :data:`~gnnattn.kernels.chunks.DEFAULT_CHUNK`).

    Returns:
        ``out`` ``[N, H, Cv]`` in ``q``'s dtype and ``lse`` ``[N, H]`` float32
        (float64 for float64; ``-inf`` where the target has no finite score);
        with ``edge_attr`` also ``edge_out`` ``[N, H, F]`` in ``q``'s dtype,
        ``sum_j P_ij edge_attr_ij`` with ``P`` the weights after dropout.

    Raises:
        ValueError: on shapes that do not fit, another device, ``ptr`` that
            does not describe ``E`` edges or ``col`` ids out of range.
    """
    _check_inputs(q, k, v, ptr, col, bias, dropout)
    _check_edge(q, col.numel(), edge_attr, edge_query)
    n, m = q.shape[0], k.shape[0]
    if plan is None:
        plan = _plan_now(ptr, col, m, (q.shape[1], q.shape[2], v.shape[2]), block_e, split_blocks)
    else:
        plan = _check_plan(plan, "plan", n, col.numel(), m, q.device, split_blocks)
    out, lse, eo = _fwd(q, k, v, scale, bias, dropout, plan, block_e, edge_attr, edge_query)
    return (out, lse) if eo is None else (out, lse, eo)
