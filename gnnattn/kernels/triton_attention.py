"""Triton fused sparse attention over a destination-sorted CSR graph.

Implements :func:`gnnattn.kernels.reference.attention_fwd` and
:func:`~gnnattn.kernels.reference.attention_bwd`:
``out_i = sum_{j in N(i)} softmax_j(q_i . k_j * scale + bias_ij) v_j`` per head,
for ``q`` ``[N, H, C]``, ``k`` ``[M, H, C]``, ``v`` ``[M, H, Cv]`` (``M`` may
differ from ``N``), ``ptr`` int64 ``[N + 1]``, ``col`` int64 ``[E]`` and an
optional additive ``bias`` ``[E, H]``, the only per-edge input. Inputs may be
float16, bfloat16, float32 (float64 too); products and sums are float32 (float64
for float64), outputs have the input dtype, ``lse`` is float32 (float64).

Work split across programs
--------------------------
* Forward (``_attn_fwd``): one program per chunk of one destination ``i``,
  for **all heads at once**: an edge's ``col`` is loaded once and its ``k_j``
  / ``v_j`` come in as one contiguous ``H * C`` row (a
  ``[BLOCK_E, BLOCK_H, BLOCK_C]`` tile), rather than ``H`` programs that each
  reload ``col`` and gather ``C``-long pieces. The program walks its edges in
  blocks of ``BLOCK_E`` with the online softmax of FlashAttention (a running
  max ``m`` and sum ``l`` per head, the accumulator ``acc = sum p_j v_j``
  rescaled by ``exp(m_old - m_new)``). Scores live only in registers: nothing
  of size ``E x C`` or ``E x H`` is written. It saves ``lse = m + log(l)``.
* Split targets: a destination with more than ``CHUNK = BLOCK_E *
  SPLIT_BLOCKS`` in-edges is cut into chunks (:mod:`gnnattn.kernels.chunks`);
  each chunk leaves its partial ``(m, l, acc)`` and ``_attn_fwd_combine``
  merges them once per target, as FlashDecoding's split-K does (DF-GNN's
  super-node scheduling is the same idea for graphs).
* Backward, dq (``_attn_bwd_dq``): the same plan and walk. ``D_i = sum_c
  dout_ic out_ic`` is computed once on the host side (``N x H`` numbers);
  the kernel recomputes ``alpha_ij = exp(s_ij - lse_i)``, then ``ds = alpha
  (dout_i . v_j - D_i)``, ``dq_i = scale * sum_j ds_ij k_j`` and ``dbias =
  ds``. Split targets' partial ``dq`` are summed in chunk order
  (``_sum_split_rows``).
* Backward, dk/dv (``_attn_bwd_dkdv``): one program per chunk of one source
  ``j`` over the **transposed CSR** (the graph object's, built once per graph):
  ``dv_j = sum_i alpha_ij dout_i`` and ``dk_j = scale * sum_i ds_ij q_i``;
  high out-degree sources are split and summed the same way.

Head counts and dims are compile-time constants (one compile per layer
shape), so the compiler knows that a row offset ``(j * H + h) * C`` is a
multiple of ``C``'s power-of-two part and can vectorise the gathers of
``C = 24`` or ``40`` rows too; tiles are padded to powers of two and masked.
``scale`` is passed as a one-element tensor of the accumulation dtype: a
Python float would reach the kernel as fp32 and round a float64 scale.

Why a transposed CSR rather than atomics: every ``dk_j`` / ``dv_j`` is summed
by one program in a fixed order, so the gradients are deterministic (run to
run, bit for bit) and accumulate in float32 registers rather than in the
output dtype; float16/bfloat16 ``atomic_add`` into ``[M, H, C]`` would round
at every add and serialise on the rows of high out-degree sources. The price is
one ``O(E log E)`` sort per graph (kept by :class:`gnnattn.AttentionGraph`)
and recomputing each score twice (once per backward kernel), which
FlashAttention-2 also pays.

Masks
-----
* ``edges < end``: the tail of the last neighbour block. ``col`` reads 0 there
  (a valid row, so the gathers stay in bounds), the ``k`` / ``v`` loads are
  masked too, and the score is set to ``-inf`` so that ``p = 0``.
* ``cs < C`` / ``cvs < Cv``: the head-dim padding to ``BLOCK_C`` /
  ``BLOCK_CV = next_pow2`` (``C = 24`` runs in a 32-wide tile); padded lanes
  load 0 and add nothing to the dot products.
* A destination with no edges, or whose scores are all ``-inf`` (a bias of
  ``-inf`` masks an edge), keeps ``m = -inf``; the kernels then shift by 0,
  as the reference does, so ``p = 0``, ``l = 0``, ``out = 0`` and
  ``lse = -inf``; the backward turns ``lse = -inf`` into ``alpha = 0``.

All offsets are int64: node ids come from ``col`` / the transposed rows
(int64) and the program id is widened before use.

Memory traffic per edge
-----------------------
Forward: ``col_j`` (8 bytes, once for all heads), ``k_j`` and ``v_j``
(``H * (C + Cv) * itemsize``, two contiguous rows), ``bias_j`` (``H``
numbers) if given; per destination ``q_i``, ``out_i`` and ``lse_i``. dq: the
same gathers plus ``dbias`` written. dk/dv: ``q_i`` and ``dout_i`` gathered
(``H * (C + Cv) * itemsize``), ``lse_i``, ``D_i``, the edge's row and its CSR
position. Split chunks add ``O(H * Cv)`` partial numbers each, next to nothing.

Loops are ``while`` loops, as in :mod:`gnnattn.kernels.triton_softmax` (Triton
3.6's interpreter cannot take a loaded value as a ``range`` bound under
NumPy 2).

Tested under ``TRITON_INTERPRET=1`` on CPU against the reference (split hub
targets and sources, C in {16, 24, 64, 128}, float64 to 1e-10) and compiled
for sm_90 offline; not yet run on a GPU (``.ci/gpu`` is the probe for the
first run). The host entry points check ``ptr``, ``col < M``, devices and the
grid size before any launch: compiled kernels do not bounds-check.
"""

from __future__ import annotations

import math
import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..graphs.csr import transpose_csr
from . import reference
from .chunks import ChunkPlan, chunk_plan
from .triton_softmax import check_ptr

__all__ = ["attention_bwd", "attention_fwd"]

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def _load_rows(base_ptr, rows, emask, hs, hmask, W: tl.constexpr, BLOCK_W: tl.constexpr, H):
    """Gather ``[BLOCK_E, BLOCK_H, BLOCK_W]``: all heads of the rows ``rows`` of an
    ``[*, H, W]`` tensor, one contiguous ``H * W`` row per edge."""
    ws = tl.arange(0, BLOCK_W)
    mask = emask[:, None, None] & hmask[None, :, None] & (ws < W)[None, None, :]
    offs = rows[:, None, None] * (H * W) + hs[None, :, None] * W + ws[None, None, :]
    return tl.load(base_ptr + offs, mask=mask, other=0.0)


@triton.jit
def _attn_fwd(
    q_ptr,  # [N, H, C]
    k_ptr,  # [M, H, C]
    v_ptr,  # [M, H, CV]
    bias_ptr,  # [E, H] (unused unless HAS_BIAS)
    out_ptr,  # [N, H, CV]
    lse_ptr,  # [N, H] float32 (float64)
    scale_ptr,  # [1] the scale in the accumulation dtype
    ptr_ptr,  # [N + 1] int64
    col_ptr,  # [E] int64
    chunk_ptr_ptr,  # [N + 1] int64: the chunks of target i
    chunk_seg_ptr,  # [G] int64: the target of each chunk slot (N past the end)
    rank_ptr,  # [G] int64: where a split chunk keeps its partials
    part_m_ptr,  # [S, H] partial max of split chunks
    part_l_ptr,  # [S, H] partial sum of exp, relative to the partial max
    part_acc_ptr,  # [S, H, CV] partial sum of p v
    n_seg,
    H: tl.constexpr,
    C: tl.constexpr,
    CV: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_CV: tl.constexpr,
    CHUNK: tl.constexpr,
):
    c = tl.program_id(0).to(tl.int64)
    i = tl.load(chunk_seg_ptr + c)
    if i < n_seg:
        c0 = tl.load(chunk_ptr_ptr + i)
        n_chunks = tl.load(chunk_ptr_ptr + i + 1) - c0
        start = tl.load(ptr_ptr + i) + (c - c0) * CHUNK
        end = tl.minimum(start + CHUNK, tl.load(ptr_ptr + i + 1))
        hs = tl.arange(0, BLOCK_H)
        hmask = hs < H  # head padding
        cs = tl.arange(0, BLOCK_C)
        cvs = tl.arange(0, BLOCK_CV)
        qmask = hmask[:, None] & (cs < C)[None, :]
        # The scale folded into q once, in the accumulation dtype.
        scale = tl.load(scale_ptr)
        q = tl.load(q_ptr + i * (H * C) + hs[:, None] * C + cs[None, :], mask=qmask, other=0.0)
        q = q.to(ACC) * scale  # (BLOCK_H, BLOCK_C)

        m = tl.full([BLOCK_H], float("-inf"), ACC)
        m_safe = tl.zeros([BLOCK_H], ACC)
        l_sum = tl.zeros([BLOCK_H], ACC)
        acc = tl.zeros([BLOCK_H, BLOCK_CV], ACC)
        b = start
        while b < end:
            edges = b + tl.arange(0, BLOCK_E)
            emask = edges < end  # the tail of the last block
            # One col load per edge serves every head; row 0 keeps masked
            # lanes' gathers in bounds.
            j = tl.load(col_ptr + edges, mask=emask, other=0)
            kt = _load_rows(k_ptr, j, emask, hs, hmask, C, BLOCK_C, H).to(ACC)
            s = tl.sum(kt * q[None, :, :], 2)  # (BLOCK_E, BLOCK_H)
            if HAS_BIAS:
                bmask = emask[:, None] & hmask[None, :]
                bias = tl.load(bias_ptr + edges[:, None] * H + hs[None, :], mask=bmask, other=0.0)
                s += bias.to(ACC)
            s = tl.where(emask[:, None], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 0))
            # All scores so far -inf: shift by 0, so exp gives 0 and never NaN.
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp(s - m_safe[None, :])  # (BLOCK_E, BLOCK_H)
            corr = tl.exp(m - m_safe)  # 0 while nothing was accumulated
            l_sum = l_sum * corr + tl.sum(p, 0)
            vt = _load_rows(v_ptr, j, emask, hs, hmask, CV, BLOCK_CV, H).to(ACC)
            acc = acc * corr[:, None] + tl.sum(p[:, :, None] * vt, 0)
            m = m_new
            b += BLOCK_E

        omask = hmask[:, None] & (cvs < CV)[None, :]
        if n_chunks == 1:
            has = l_sum > 0  # some finite score: else out = 0, lse = -inf
            out = acc / tl.where(has, l_sum, 1.0)[:, None]
            o_offs = i * (H * CV) + hs[:, None] * CV + cvs[None, :]
            tl.store(out_ptr + o_offs, out.to(out_ptr.dtype.element_ty), mask=omask)
            lse = tl.where(has, m_safe + tl.log(tl.where(has, l_sum, 1.0)), float("-inf"))
            tl.store(lse_ptr + i * H + hs, lse, mask=hmask)
        else:
            # A split target: (max, sum, acc) of this chunk for the combine kernel.
            r = tl.load(rank_ptr + c)
            tl.store(part_m_ptr + r * H + hs, m, mask=hmask)
            tl.store(part_l_ptr + r * H + hs, l_sum, mask=hmask)
            p_offs = r * (H * CV) + hs[:, None] * CV + cvs[None, :]
            tl.store(part_acc_ptr + p_offs, acc, mask=omask)


@triton.jit
def _attn_fwd_combine(
    split_ptr,  # [S] int64: slots of split chunks, then the sentinel G
    chunk_ptr_ptr,
    chunk_seg_ptr,
    rank_ptr,
    part_m_ptr,
    part_l_ptr,
    part_acc_ptr,
    out_ptr,
    lse_ptr,
    n_slots,
    H: tl.constexpr,
    CV: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_CV: tl.constexpr,
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
            m = tl.full([BLOCK_H], float("-inf"), ACC)
            l_sum = tl.zeros([BLOCK_H], ACC)
            acc = tl.zeros([BLOCK_H, BLOCK_CV], ACC)
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
                m = m_new
                r += 1
            has = l_sum > 0
            m_safe = tl.where(m == float("-inf"), 0.0, m)
            out = acc / tl.where(has, l_sum, 1.0)[:, None]
            tl.store(out_ptr + i * (H * CV) + hc, out.to(out_ptr.dtype.element_ty), mask=omask)
            lse = tl.where(has, m_safe + tl.log(tl.where(has, l_sum, 1.0)), float("-inf"))
            tl.store(lse_ptr + i * H + hs, lse, mask=hmask)


@triton.jit
def _attn_bwd_dq(
    q_ptr,
    k_ptr,
    v_ptr,
    bias_ptr,
    dout_ptr,  # [N, H, CV]
    lse_ptr,
    delta_ptr,  # [N, H]: D = sum(dout * out), computed on the host
    dq_ptr,  # [N, H, C]
    dbias_ptr,  # [E, H] (unused unless HAS_BIAS)
    scale_ptr,
    ptr_ptr,
    col_ptr,
    chunk_ptr_ptr,
    chunk_seg_ptr,
    rank_ptr,
    part_ptr,  # [S, H, C] partial dq of split chunks
    n_seg,
    H: tl.constexpr,
    C: tl.constexpr,
    CV: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_CV: tl.constexpr,
    CHUNK: tl.constexpr,
):
    c = tl.program_id(0).to(tl.int64)
    i = tl.load(chunk_seg_ptr + c)
    if i < n_seg:
        c0 = tl.load(chunk_ptr_ptr + i)
        n_chunks = tl.load(chunk_ptr_ptr + i + 1) - c0
        start = tl.load(ptr_ptr + i) + (c - c0) * CHUNK
        end = tl.minimum(start + CHUNK, tl.load(ptr_ptr + i + 1))
        hs = tl.arange(0, BLOCK_H)
        hmask = hs < H
        cs = tl.arange(0, BLOCK_C)
        cvs = tl.arange(0, BLOCK_CV)
        qmask = hmask[:, None] & (cs < C)[None, :]
        scale = tl.load(scale_ptr)
        q = tl.load(q_ptr + i * (H * C) + hs[:, None] * C + cs[None, :], mask=qmask, other=0.0)
        q = q.to(ACC) * scale
        dmask = hmask[:, None] & (cvs < CV)[None, :]
        do = tl.load(
            dout_ptr + i * (H * CV) + hs[:, None] * CV + cvs[None, :], mask=dmask, other=0.0
        )
        do = do.to(ACC)  # (BLOCK_H, BLOCK_CV)
        delta = tl.load(delta_ptr + i * H + hs, mask=hmask, other=0.0).to(ACC)
        lse = tl.load(lse_ptr + i * H + hs, mask=hmask, other=float("-inf")).to(ACC)
        # lse = -inf: no finite score, every weight is 0 (shift by 0, no NaN).
        lse_safe = tl.where(lse == float("-inf"), 0.0, lse)

        dq = tl.zeros([BLOCK_H, BLOCK_C], ACC)
        b = start
        while b < end:
            edges = b + tl.arange(0, BLOCK_E)
            emask = edges < end
            j = tl.load(col_ptr + edges, mask=emask, other=0)
            kt = _load_rows(k_ptr, j, emask, hs, hmask, C, BLOCK_C, H).to(ACC)
            s = tl.sum(kt * q[None, :, :], 2)  # (BLOCK_E, BLOCK_H)
            bmask = emask[:, None] & hmask[None, :]
            if HAS_BIAS:
                bias = tl.load(bias_ptr + edges[:, None] * H + hs[None, :], mask=bmask, other=0.0)
                s += bias.to(ACC)
            alpha = tl.exp(s - lse_safe[None, :])
            alpha = tl.where(bmask & (lse != float("-inf"))[None, :], alpha, 0.0)
            vt = _load_rows(v_ptr, j, emask, hs, hmask, CV, BLOCK_CV, H).to(ACC)
            dalpha = tl.sum(vt * do[None, :, :], 2)  # (BLOCK_E, BLOCK_H)
            ds = alpha * (dalpha - delta[None, :])
            dq += tl.sum(ds[:, :, None] * kt, 0)
            if HAS_BIAS:
                db = ds.to(dbias_ptr.dtype.element_ty)
                tl.store(dbias_ptr + edges[:, None] * H + hs[None, :], db, mask=bmask)
            b += BLOCK_E
        hc = hs[:, None] * C + cs[None, :]
        if n_chunks == 1:
            tl.store(
                dq_ptr + i * (H * C) + hc, (dq * scale).to(dq_ptr.dtype.element_ty), mask=qmask
            )
        else:
            r = tl.load(rank_ptr + c)
            tl.store(part_ptr + r * (H * C) + hc, dq, mask=qmask)


@triton.jit
def _attn_bwd_dkdv(
    q_ptr,
    k_ptr,
    v_ptr,
    bias_ptr,
    dout_ptr,
    lse_ptr,
    delta_ptr,
    dk_ptr,  # [M, H, C]
    dv_ptr,  # [M, H, CV]
    scale_ptr,
    tptr_ptr,  # [M + 1] int64: the out-edges of source j are tptr[j]:tptr[j+1]
    trow_ptr,  # [E] int64: their targets
    tperm_ptr,  # [E] int64: their positions in the CSR order (for bias)
    chunk_ptr_ptr,
    chunk_seg_ptr,
    rank_ptr,
    part_k_ptr,  # [S, H, C] partial dk of split chunks
    part_v_ptr,  # [S, H, CV] partial dv
    n_seg,
    H: tl.constexpr,
    C: tl.constexpr,
    CV: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_CV: tl.constexpr,
    CHUNK: tl.constexpr,
):
    c = tl.program_id(0).to(tl.int64)
    j = tl.load(chunk_seg_ptr + c)
    if j < n_seg:
        c0 = tl.load(chunk_ptr_ptr + j)
        n_chunks = tl.load(chunk_ptr_ptr + j + 1) - c0
        start = tl.load(tptr_ptr + j) + (c - c0) * CHUNK
        end = tl.minimum(start + CHUNK, tl.load(tptr_ptr + j + 1))
        hs = tl.arange(0, BLOCK_H)
        hmask = hs < H
        cs = tl.arange(0, BLOCK_C)
        cvs = tl.arange(0, BLOCK_CV)
        kmask = hmask[:, None] & (cs < C)[None, :]
        vmask = hmask[:, None] & (cvs < CV)[None, :]
        scale = tl.load(scale_ptr)
        k = tl.load(k_ptr + j * (H * C) + hs[:, None] * C + cs[None, :], mask=kmask, other=0.0)
        k = k.to(ACC) * scale
        v = tl.load(v_ptr + j * (H * CV) + hs[:, None] * CV + cvs[None, :], mask=vmask, other=0.0)
        v = v.to(ACC)

        dk = tl.zeros([BLOCK_H, BLOCK_C], ACC)
        dv = tl.zeros([BLOCK_H, BLOCK_CV], ACC)
        b = start
        while b < end:
            t = b + tl.arange(0, BLOCK_E)
            emask = t < end  # the tail of the last block of out-edges
            i = tl.load(trow_ptr + t, mask=emask, other=0)  # row 0: in bounds, then masked
            qt = _load_rows(q_ptr, i, emask, hs, hmask, C, BLOCK_C, H).to(ACC)
            s = tl.sum(qt * k[None, :, :], 2)  # (BLOCK_E, BLOCK_H)
            bmask = emask[:, None] & hmask[None, :]
            ih = i[:, None] * H + hs[None, :]
            if HAS_BIAS:
                e = tl.load(tperm_ptr + t, mask=emask, other=0)
                bias = tl.load(bias_ptr + e[:, None] * H + hs[None, :], mask=bmask, other=0.0)
                s += bias.to(ACC)
            lse = tl.load(lse_ptr + ih, mask=bmask, other=float("-inf")).to(ACC)
            valid = bmask & (lse != float("-inf"))  # lse = -inf: all weights of i are 0
            alpha = tl.where(valid, tl.exp(s - tl.where(valid, lse, 0.0)), 0.0)
            dot = _load_rows(dout_ptr, i, emask, hs, hmask, CV, BLOCK_CV, H).to(ACC)
            dv += tl.sum(alpha[:, :, None] * dot, 0)
            delta = tl.load(delta_ptr + ih, mask=bmask, other=0.0).to(ACC)
            ds = alpha * (tl.sum(dot * v[None, :, :], 2) - delta)
            dk += tl.sum(ds[:, :, None] * qt, 0)
            b += BLOCK_E
        hc = hs[:, None] * C + cs[None, :]
        hcv = hs[:, None] * CV + cvs[None, :]
        if n_chunks == 1:
            # k was pre-scaled, so s was right; dk = scale * sum ds q.
            dk_out = (dk * scale).to(dk_ptr.dtype.element_ty)
            tl.store(dk_ptr + j * (H * C) + hc, dk_out, mask=kmask)
            tl.store(dv_ptr + j * (H * CV) + hcv, dv.to(dv_ptr.dtype.element_ty), mask=vmask)
        else:
            r = tl.load(rank_ptr + c)
            tl.store(part_k_ptr + r * (H * C) + hc, dk, mask=kmask)
            tl.store(part_v_ptr + r * (H * CV) + hcv, dv, mask=vmask)


@triton.jit
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


# --------------------------------------------------------------------------- host side


def _acc(dtype: torch.dtype) -> tuple[tl.dtype, torch.dtype]:
    if dtype == torch.float64:
        return tl.float64, torch.float64
    return tl.float32, torch.float32


class _Blocks(NamedTuple):
    block_e: int
    block_h: int
    block_c: int
    block_cv: int
    chunk: int
    num_warps: int


def _blocks(
    num_edges: int, n: int, h: int, c: int, cv: int, block_e: int | None, split_blocks: int | None
) -> _Blocks:
    block_h = triton.next_power_of_2(h)
    block_c, block_cv = triton.next_power_of_2(c), triton.next_power_of_2(cv)
    tile = block_h * max(block_c, block_cv)  # elements of one edge's gathered row
    if block_e is None:
        # [BLOCK_E, H, C] tiles of about 4096 elements on a GPU (the k and v
        # tiles then fit the registers of 4 warps), no longer than the mean
        # degree needs; 8 rows under the interpreter, which pays per op.
        cap = 8 if _INTERPRET else max(2, 4096 // tile)
        mean = -(-num_edges // max(n, 1))
        block_e = min(max(triton.next_power_of_2(max(mean, 1)), 2), cap)
    if split_blocks is None:
        # Chunks of 256 edges or more: typical targets finish in one program,
        # hubs are spread over many.
        split_blocks = 8 if _INTERPRET else max(8, 256 // block_e)
    if block_e < 1 or block_e & (block_e - 1) or split_blocks < 1:
        raise ValueError(
            f"Expected 'block_e' a power of two and 'split_blocks' >= 1, "
            f"got {block_e} and {split_blocks}"
        )
    num_warps = 4 if block_e * tile <= 4096 else 8
    return _Blocks(block_e, block_h, block_c, block_cv, block_e * split_blocks, num_warps)


def _check(q: Tensor, k: Tensor, v: Tensor, ptr: Tensor, col: Tensor, bias: Tensor | None):
    """Host-side checks: compiled kernels do not bounds-check their gathers."""
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(
            f"Expected 'q', 'k', 'v' of shape [N, H, C], [M, H, C], [M, H, Cv], got "
            f"{list(q.shape)}, {list(k.shape)}, {list(v.shape)}"
        )
    if k.shape[:2] != v.shape[:2] or q.shape[1:] != k.shape[1:]:
        raise ValueError(
            f"Expected 'k' [M, H, C] and 'v' [M, H, Cv] with 'q' [N, H, C], got "
            f"{list(q.shape)}, {list(k.shape)}, {list(v.shape)}"
        )
    for name, t in (("k", k), ("v", v), ("ptr", ptr), ("col", col), ("bias", bias)):
        if t is not None and t.device != q.device:
            raise ValueError(f"Expected '{name}' on the device of 'q' ({q.device}), got {t.device}")
    if ptr.dtype != torch.int64 or col.dtype != torch.int64:
        raise TypeError(f"Expected 'ptr' and 'col' int64, got {ptr.dtype} and {col.dtype}")
    if ptr.dim() != 1 or ptr.numel() != q.shape[0] + 1:
        raise ValueError(f"Expected 'ptr' of shape [{q.shape[0] + 1}], got {list(ptr.shape)}")
    if col.dim() != 1:
        raise ValueError(f"Expected 'col' of shape [E], got {list(col.shape)}")
    if bias is not None and tuple(bias.shape) != (col.numel(), q.shape[1]):
        raise ValueError(
            f"Expected 'bias' of shape [{col.numel()}, {q.shape[1]}], got {list(bias.shape)}"
        )
    check_ptr(ptr, col.numel())
    _check_ids(col, k.shape[0], "col")


def _check_ids(ids: Tensor, bound: int, name: str) -> None:
    if ids.numel():
        lo, hi = (int(x) for x in torch.aminmax(ids))
        if lo < 0 or hi >= bound:
            raise ValueError(f"Expected '{name}' ids in [0, {bound}), got [{lo}, {hi}]")


def _grid_size(slots: int) -> None:
    if slots >= 2**31:
        raise ValueError(
            f"Expected fewer than 2**31 work slots (targets + edges / chunk), got {slots}; "
            f"pass a larger split_blocks"
        )


def attention_fwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    ptr: Tensor,
    col: Tensor,
    scale: float,
    bias: Tensor | None = None,
    *,
    block_e: int | None = None,
    split_blocks: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Sparse attention over a destination-sorted CSR graph (one fused kernel).

    Args:
        q: ``[N, H, C]`` queries of the targets.
        k: ``[M, H, C]`` keys of the sources.
        v: ``[M, H, Cv]`` values of the sources.
        ptr: ``[N + 1]`` int64 CSR pointers (incoming edges per target).
        col: ``[E]`` int64 source of each edge.
        scale: multiplies ``q . k``.
        bias: optional ``[E, H]`` additive score bias (``-inf`` masks an edge).
        block_e: edges per tile (a power of two); default from the mean degree.
        split_blocks: a target with more than ``block_e * split_blocks`` edges
            is split across programs whose partials are merged.

    Returns:
        ``out`` ``[N, H, Cv]`` in ``q``'s dtype and ``lse`` ``[N, H]`` float32
        (float64 for float64; ``-inf`` where the target has no finite score).

    Raises:
        ValueError: on shapes that do not fit, another device, ``ptr`` that
            does not describe ``E`` edges or ``col`` ids out of range.
    """
    _check(q, k, v, ptr, col, bias)
    n, h, c = q.shape
    cv = v.shape[2]
    e = col.numel()
    acc_tl, acc_t = _acc(q.dtype)
    out = torch.empty((n, h, cv), dtype=q.dtype, device=q.device)
    lse = torch.empty((n, h), dtype=acc_t, device=q.device)
    if n * h == 0:
        return out, lse
    if e == 0:  # no edges: zero outputs, lse = -inf (no launch needed)
        return out.zero_(), lse.fill_(float("-inf"))
    if c == 0 or cv == 0:  # degenerate head dims: nothing to fuse, use the reference
        o, lse_r = reference.attention_fwd(q, k, v, ptr, col, scale, bias)
        return o, lse_r.to(acc_t)
    blk = _blocks(e, n, h, c, cv, block_e, split_blocks)
    ptr = ptr.contiguous()
    plan = chunk_plan(ptr, e, blk.chunk)
    _grid_size(plan.grid)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    b = bias.contiguous() if bias is not None else q  # a dummy pointer, never read
    # A tensor, not a Python float: a float argument is passed as fp32, which
    # would round a float64 scale.
    scale_t = torch.full((1,), scale, dtype=acc_t, device=q.device)
    part_m = torch.empty((plan.split_grid, h), dtype=acc_t, device=q.device)
    part_l = torch.empty_like(part_m)
    part_acc = torch.empty((plan.split_grid, h, cv), dtype=acc_t, device=q.device)
    shape = dict(H=h, C=c, CV=cv, ACC=acc_tl)
    blocks = dict(BLOCK_H=blk.block_h, BLOCK_CV=blk.block_cv)
    _attn_fwd[(plan.grid,)](
        q, k, v, b, out, lse, scale_t, ptr, col.contiguous(), plan.chunk_ptr, plan.chunk_seg,
        plan.rank, part_m, part_l, part_acc, n, HAS_BIAS=bias is not None,
        BLOCK_E=blk.block_e, BLOCK_C=blk.block_c, CHUNK=blk.chunk, num_warps=blk.num_warps,
        **shape, **blocks,
    )  # fmt: skip
    if e > blk.chunk:  # otherwise no target can have two chunks
        _attn_fwd_combine[(plan.split_grid,)](
            plan.split, plan.chunk_ptr, plan.chunk_seg, plan.rank, part_m, part_l, part_acc,
            out, lse, plan.grid, H=h, CV=cv, ACC=acc_tl, **blocks,
        )  # fmt: skip
    return out, lse


def _sum_split(
    plan: ChunkPlan, part: Tensor, out: Tensor, scale_t: Tensor, scaled: bool, acc_tl: tl.dtype
) -> None:
    w = math.prod(part.shape[1:])
    _sum_split_rows[(plan.split_grid,)](
        plan.split, plan.chunk_ptr, plan.chunk_seg, plan.rank, part, out, scale_t, plan.grid,
        W=w, SCALED=scaled, ACC=acc_tl, BLOCK_W=triton.next_power_of_2(w),
    )  # fmt: skip


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
    block_e: int | None = None,
    split_blocks: int | None = None,
    csc: tuple[Tensor, Tensor, Tensor] | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """Gradients of :func:`attention_fwd` w.r.t. ``q``, ``k``, ``v`` and ``bias``.

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
        block_e: as in :func:`attention_fwd`.
        split_blocks: as in :func:`attention_fwd` (targets in the ``dq``
            pass, sources in the ``dk``/``dv`` pass).
        csc: the transposed CSR ``(tptr, trow, tperm)`` of the graph
            (:attr:`gnnattn.AttentionGraph.csc`); built here when not given.

    Returns:
        ``dq``, ``dk``, ``dv`` (typed like ``q``, ``k``, ``v``) and ``dbias``
        ``[E, H]`` (typed like ``bias``; ``None`` without a bias).
    """
    _check(q, k, v, ptr, col, bias)
    n, h, c = q.shape
    m, cv = k.shape[0], v.shape[2]
    e = col.numel()
    for name, t, shape in (
        ("out", out, (n, h, cv)), ("grad_out", grad_out, (n, h, cv)), ("lse", lse, (n, h))
    ):  # fmt: skip
        if tuple(t.shape) != shape or t.device != q.device:
            raise ValueError(
                f"Expected '{name}' of shape {list(shape)} on {q.device}, got "
                f"{list(t.shape)} on {t.device}"
            )
    dq = torch.zeros_like(q, memory_format=torch.contiguous_format)
    dk = torch.zeros_like(k, memory_format=torch.contiguous_format)
    dv = torch.zeros_like(v, memory_format=torch.contiguous_format)
    dbias = None
    if bias is not None:
        dbias = torch.zeros_like(bias, memory_format=torch.contiguous_format)
    if n * h == 0 or e == 0:  # no edge, no gradient
        return dq, dk, dv, dbias
    if c == 0 or cv == 0:  # degenerate head dims: nothing to fuse
        return reference.attention_bwd(q, k, v, out, lse, grad_out, ptr, col, scale, bias)
    acc_tl, acc_t = _acc(q.dtype)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    grad_out = grad_out.to(q.dtype).contiguous()
    lse = lse.to(acc_t).contiguous()
    ptr, col = ptr.contiguous(), col.contiguous()
    b = bias.contiguous() if bias is not None else q  # dummy pointer, never read
    db = dbias if dbias is not None else q  # dummy pointer, never written
    scale_t = torch.full((1,), scale, dtype=acc_t, device=q.device)
    # D_i = sum_c dout_ic out_ic (= sum_j alpha_ij dalpha_ij): N x H numbers,
    # one pass over out, shared by both kernels.
    delta = (grad_out.to(acc_t) * out.to(acc_t)).sum(-1).contiguous()  # (N, H)
    consts = dict(H=h, C=c, CV=cv, HAS_BIAS=bias is not None, ACC=acc_tl)

    blk = _blocks(e, n, h, c, cv, block_e, split_blocks)
    blocks = dict(BLOCK_E=blk.block_e, BLOCK_H=blk.block_h, BLOCK_C=blk.block_c)
    blocks.update(BLOCK_CV=blk.block_cv, CHUNK=blk.chunk)
    plan = chunk_plan(ptr, e, blk.chunk)
    _grid_size(plan.grid)
    part = torch.empty((plan.split_grid, h, c), dtype=acc_t, device=q.device)
    _attn_bwd_dq[(plan.grid,)](
        q, k, v, b, grad_out, lse, delta, dq, db, scale_t, ptr, col, plan.chunk_ptr,
        plan.chunk_seg, plan.rank, part, n, num_warps=blk.num_warps, **consts, **blocks,
    )  # fmt: skip
    if e > blk.chunk:
        _sum_split(plan, part, dq, scale_t, True, acc_tl)

    if m * h > 0:
        if csc is None:
            csc = tuple(transpose_csr(ptr, col, m))  # type: ignore[assignment]
        assert csc is not None
        tptr, trow, tperm = (t.contiguous() for t in csc)
        if tptr.shape != (m + 1,) or trow.shape != (e,) or tperm.shape != (e,):
            raise ValueError(
                f"Expected 'csc' = transpose_csr(ptr, col, {m}), got shapes "
                f"{[list(t.shape) for t in csc]}"
            )
        blk_t = _blocks(e, m, h, c, cv, block_e, split_blocks)
        blocks = dict(BLOCK_E=blk_t.block_e, BLOCK_H=blk_t.block_h, BLOCK_C=blk_t.block_c)
        blocks.update(BLOCK_CV=blk_t.block_cv, CHUNK=blk_t.chunk)
        plan_t = chunk_plan(tptr, e, blk_t.chunk)
        _grid_size(plan_t.grid)
        part_k = torch.empty((plan_t.split_grid, h, c), dtype=acc_t, device=q.device)
        part_v = torch.empty((plan_t.split_grid, h, cv), dtype=acc_t, device=q.device)
        _attn_bwd_dkdv[(plan_t.grid,)](
            q, k, v, b, grad_out, lse, delta, dk, dv, scale_t, tptr, trow, tperm,
            plan_t.chunk_ptr, plan_t.chunk_seg, plan_t.rank, part_k, part_v, m,
            num_warps=blk_t.num_warps, **consts, **blocks,
        )  # fmt: skip
        if e > blk_t.chunk:
            _sum_split(plan_t, part_k, dk, scale_t, True, acc_tl)
            _sum_split(plan_t, part_v, dv, scale_t, False, acc_tl)
    return dq, dk, dv, dbias
