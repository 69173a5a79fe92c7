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
* Forward (``_attn_fwd``): one program per (destination ``i``, head ``h``), a
  1-D grid of ``N * H`` with the head fastest, so the ``H`` programs of one
  destination run side by side and share the ``col`` reads and the cache lines
  of ``k_j`` / ``v_j`` (``[H, C]`` is contiguous per node). Each program walks
  its ``ptr[i]:ptr[i + 1]`` neighbours in blocks of ``BLOCK_E`` with the online
  softmax of FlashAttention: a running max ``m`` and sum ``l``, the float32
  accumulator ``acc = sum p_j v_j`` rescaled by ``exp(m_old - m_new)`` whenever
  the max grows. Scores live only in registers, one block at a time: nothing
  of size ``E x C`` or ``E x H`` is written. It saves ``lse = m + log(l)``
  ``[N, H]``.
* Backward, dq (``_attn_bwd_dq``): the same grid and walk. It computes
  ``D_i = sum_c dout_ic out_ic`` (saved for the next kernel), recomputes
  ``alpha_ij = exp(s_ij - lse_i)``, then ``ds = alpha (dout_i . v_j - D_i)``,
  ``dq_i = scale * sum_j ds_ij k_j``, and ``dbias = ds`` when there is a bias.
* Backward, dk/dv (``_attn_bwd_dkdv``): one program per (source ``j``, head),
  over the **transposed CSR** (the edges grouped by source, found by a stable
  sort of ``col``): ``dv_j = sum_i alpha_ij dout_i`` and
  ``dk_j = scale * sum_i ds_ij q_i``, both recomputed from ``lse`` and ``D``.

Why a transposed CSR rather than atomics: every ``dk_j`` / ``dv_j`` is summed
by one program in a fixed order, so the gradients are deterministic (run to
run, bit for bit) and accumulate in float32 registers rather than in the
output dtype; float16/bfloat16 ``atomic_add`` into ``[M, H, C]`` would round
at every add and serialise on the rows of high out-degree sources. The price is
an ``O(E log E)`` sort per backward and recomputing each score twice (once per
backward kernel), which FlashAttention-2 also pays.

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

Memory traffic per edge and head
--------------------------------
Forward: ``col_j`` (8 bytes, shared by the ``H`` programs of a destination
through L1/L2), ``k_j`` and ``v_j`` (``(C + Cv) * itemsize``, gathered rows),
``bias_ij`` if given; per destination ``q_i``, ``out_i`` and ``lse_i``. dq:
the same gathers plus ``dbias`` written. dk/dv: ``q_i`` and ``dout_i`` gathered
(``(C + Cv) * itemsize``), ``lse_i``, ``D_i``, ``bias``, the edge's row and
its CSR position (16 bytes). A high in-degree destination is walked by one
program (no split-K as in flash-decoding); the many programs of a large graph
keep the device busy, a single hub does not.

Loops are ``while`` loops, as in :mod:`gnnattn.kernels.triton_softmax` (Triton
3.6's interpreter cannot take a loaded value as a ``range`` bound under
NumPy 2).

Tested under ``TRITON_INTERPRET=1`` on CPU; not yet run on a GPU (the tests
also compile the kernels for sm_90 offline, which checks that they lower to
PTX, not that they are right or fast there).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..graphs.csr import transpose_csr
from . import reference

__all__ = ["attention_bwd", "attention_fwd"]

_INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def _attn_fwd(
    q_ptr,  # [N, H, C]
    k_ptr,  # [M, H, C]
    v_ptr,  # [M, H, CV]
    bias_ptr,  # [E, H] (unused unless HAS_BIAS)
    out_ptr,  # [N, H, CV]
    lse_ptr,  # [N, H] float32 (float64)
    ptr_ptr,  # [N + 1] int64
    col_ptr,  # [E] int64
    scale,
    H,
    C,
    CV,
    HAS_BIAS: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_CV: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    i = pid // H
    h = pid % H
    cs = tl.arange(0, BLOCK_C)
    cvs = tl.arange(0, BLOCK_CV)
    cmask = cs < C  # head-dim padding
    cvmask = cvs < CV
    start = tl.load(ptr_ptr + i)
    end = tl.load(ptr_ptr + i + 1)
    # scale folded into q once instead of into every score.
    q = tl.load(q_ptr + (i * H + h) * C + cs, mask=cmask, other=0.0).to(ACC) * scale

    m = tl.full([1], float("-inf"), ACC)
    m_safe = tl.zeros([1], ACC)
    l_sum = tl.zeros([1], ACC)
    acc = tl.zeros([BLOCK_CV], ACC)
    b = start
    while b < end:
        edges = b + tl.arange(0, BLOCK_E)
        emask = edges < end  # the tail of the last neighbour block
        j = tl.load(col_ptr + edges, mask=emask, other=0)
        kmask = emask[:, None] & cmask[None, :]
        kt = tl.load(k_ptr + (j * H + h)[:, None] * C + cs[None, :], mask=kmask, other=0.0)
        s = tl.sum(kt.to(ACC) * q[None, :], 1)
        if HAS_BIAS:
            s += tl.load(bias_ptr + edges * H + h, mask=emask, other=0.0).to(ACC)
        s = tl.where(emask, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 0))
        # All scores so far -inf: shift by 0, so exp gives 0 and never NaN.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(s - m_safe)
        corr = tl.exp(m - m_safe)  # 0 while nothing was accumulated
        l_sum = l_sum * corr + tl.sum(p, 0)
        vmask = emask[:, None] & cvmask[None, :]
        vt = tl.load(v_ptr + (j * H + h)[:, None] * CV + cvs[None, :], mask=vmask, other=0.0)
        acc = acc * corr + tl.sum(p[:, None] * vt.to(ACC), 0)
        m = m_new
        b += BLOCK_E

    has = l_sum > 0  # some finite score: else out = 0, lse = -inf
    out = acc / tl.where(has, l_sum, 1.0)
    tl.store(out_ptr + (i * H + h) * CV + cvs, out.to(out_ptr.dtype.element_ty), mask=cvmask)
    lse = tl.where(has, m_safe + tl.log(tl.where(has, l_sum, 1.0)), float("-inf"))
    tl.store(lse_ptr + pid + tl.arange(0, 1), lse)


@triton.jit
def _attn_bwd_dq(
    q_ptr,
    k_ptr,
    v_ptr,
    bias_ptr,
    out_ptr,
    dout_ptr,  # [N, H, CV]
    lse_ptr,
    delta_ptr,  # [N, H] out: D = sum(dout * out), for the dk/dv kernel
    dq_ptr,  # [N, H, C]
    dbias_ptr,  # [E, H] (unused unless HAS_BIAS)
    ptr_ptr,
    col_ptr,
    scale,
    H,
    C,
    CV,
    HAS_BIAS: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_CV: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    i = pid // H
    h = pid % H
    cs = tl.arange(0, BLOCK_C)
    cvs = tl.arange(0, BLOCK_CV)
    cmask = cs < C
    cvmask = cvs < CV
    start = tl.load(ptr_ptr + i)
    end = tl.load(ptr_ptr + i + 1)
    q = tl.load(q_ptr + (i * H + h) * C + cs, mask=cmask, other=0.0).to(ACC) * scale
    o_row = (i * H + h) * CV + cvs
    do = tl.load(dout_ptr + o_row, mask=cvmask, other=0.0).to(ACC)
    o = tl.load(out_ptr + o_row, mask=cvmask, other=0.0).to(ACC)
    delta = tl.sum(do * o, 0)
    tl.store(delta_ptr + pid + tl.arange(0, 1), tl.full([1], 0.0, ACC) + delta)
    lse = tl.load(lse_ptr + pid)
    # lse = -inf: no finite score, every weight is 0 (shift by 0, no NaN).
    lse_safe = tl.where(lse == float("-inf"), 0.0, lse)

    dq = tl.zeros([BLOCK_C], ACC)
    b = start
    while b < end:
        edges = b + tl.arange(0, BLOCK_E)
        emask = edges < end
        j = tl.load(col_ptr + edges, mask=emask, other=0)
        kmask = emask[:, None] & cmask[None, :]
        kt = tl.load(k_ptr + (j * H + h)[:, None] * C + cs[None, :], mask=kmask, other=0.0)
        kt = kt.to(ACC)
        s = tl.sum(kt * q[None, :], 1)
        if HAS_BIAS:
            s += tl.load(bias_ptr + edges * H + h, mask=emask, other=0.0).to(ACC)
        s = tl.where(emask, s, float("-inf"))
        alpha = tl.where(lse == float("-inf"), 0.0, tl.exp(s - lse_safe))
        vmask = emask[:, None] & cvmask[None, :]
        vt = tl.load(v_ptr + (j * H + h)[:, None] * CV + cvs[None, :], mask=vmask, other=0.0)
        dalpha = tl.sum(vt.to(ACC) * do[None, :], 1)
        ds = alpha * (dalpha - delta)
        dq += tl.sum(ds[:, None] * kt, 0)
        if HAS_BIAS:
            tl.store(dbias_ptr + edges * H + h, ds.to(dbias_ptr.dtype.element_ty), mask=emask)
        b += BLOCK_E
    tl.store(dq_ptr + (i * H + h) * C + cs, (dq * scale).to(dq_ptr.dtype.element_ty), mask=cmask)


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
    tptr_ptr,  # [M + 1] int64: the out-edges of source j are tptr[j]:tptr[j+1]
    trow_ptr,  # [E] int64: their destinations
    tperm_ptr,  # [E] int64: their positions in the CSR order (for bias)
    scale,
    H,
    C,
    CV,
    HAS_BIAS: tl.constexpr,
    ACC: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_CV: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    j = pid // H
    h = pid % H
    cs = tl.arange(0, BLOCK_C)
    cvs = tl.arange(0, BLOCK_CV)
    cmask = cs < C
    cvmask = cvs < CV
    start = tl.load(tptr_ptr + j)
    end = tl.load(tptr_ptr + j + 1)
    k = tl.load(k_ptr + (j * H + h) * C + cs, mask=cmask, other=0.0).to(ACC) * scale
    v = tl.load(v_ptr + (j * H + h) * CV + cvs, mask=cvmask, other=0.0).to(ACC)

    dk = tl.zeros([BLOCK_C], ACC)
    dv = tl.zeros([BLOCK_CV], ACC)
    b = start
    while b < end:
        t = b + tl.arange(0, BLOCK_E)
        emask = t < end  # the tail of the last block of out-edges
        i = tl.load(trow_ptr + t, mask=emask, other=0)  # row 0: in bounds, then masked
        ih = i * H + h
        qmask = emask[:, None] & cmask[None, :]
        qt = tl.load(q_ptr + ih[:, None] * C + cs[None, :], mask=qmask, other=0.0).to(ACC)
        s = tl.sum(qt * k[None, :], 1)
        if HAS_BIAS:
            e = tl.load(tperm_ptr + t, mask=emask, other=0)
            s += tl.load(bias_ptr + e * H + h, mask=emask, other=0.0).to(ACC)
        lse = tl.load(lse_ptr + ih, mask=emask, other=float("-inf")).to(ACC)
        valid = emask & (lse != float("-inf"))  # lse = -inf: all weights of i are 0
        alpha = tl.where(valid, tl.exp(s - tl.where(valid, lse, 0.0)), 0.0)
        dmask = emask[:, None] & cvmask[None, :]
        dot = tl.load(dout_ptr + ih[:, None] * CV + cvs[None, :], mask=dmask, other=0.0).to(ACC)
        dv += tl.sum(alpha[:, None] * dot, 0)
        delta = tl.load(delta_ptr + ih, mask=emask, other=0.0)
        ds = alpha * (tl.sum(dot * v[None, :], 1) - delta)
        dk += tl.sum(ds[:, None] * qt, 0)
        b += BLOCK_E
    # k was pre-scaled, so s was right; dk = scale * sum ds q.
    tl.store(dk_ptr + (j * H + h) * C + cs, (dk * scale).to(dk_ptr.dtype.element_ty), mask=cmask)
    tl.store(dv_ptr + (j * H + h) * CV + cvs, dv.to(dv_ptr.dtype.element_ty), mask=cvmask)


# --------------------------------------------------------------------------- host side


def _acc(dtype: torch.dtype) -> tuple[tl.dtype, torch.dtype]:
    if dtype == torch.float64:
        return tl.float64, torch.float64
    return tl.float32, torch.float32


def _block_e(num_edges: int, n: int, block_c: int, block_e: int | None) -> int:
    if block_e is not None:
        if block_e < 1 or block_e & (block_e - 1):
            raise ValueError(f"Expected 'block_e' a power of two, got {block_e}")
        return block_e
    # A [BLOCK_E, BLOCK_C] tile of about 4096 elements on a GPU, no longer than
    # the mean degree needs; 16 rows under the interpreter, which pays per op.
    cap = 16 if _INTERPRET else max(16, 4096 // block_c)
    mean = -(-num_edges // max(n, 1))
    return min(max(triton.next_power_of_2(max(mean, 1)), 16), cap)


def _check(q: Tensor, k: Tensor, v: Tensor, ptr: Tensor, col: Tensor, bias: Tensor | None):
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
    if ptr.dtype != torch.int64 or col.dtype != torch.int64:
        raise TypeError(f"Expected 'ptr' and 'col' int64, got {ptr.dtype} and {col.dtype}")
    if ptr.numel() != q.shape[0] + 1:
        raise ValueError(f"Expected 'ptr' of shape [{q.shape[0] + 1}], got {list(ptr.shape)}")
    if bias is not None and tuple(bias.shape) != (col.numel(), q.shape[1]):
        raise ValueError(
            f"Expected 'bias' of shape [{col.numel()}, {q.shape[1]}], got {list(bias.shape)}"
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
        block_e: neighbours per block (a power of two); default from the mean
            degree.

    Returns:
        ``out`` ``[N, H, Cv]`` in ``q``'s dtype and ``lse`` ``[N, H]`` float32
        (``-inf`` where the target has no finite score).
    """
    _check(q, k, v, ptr, col, bias)
    n, h, c = q.shape
    cv = v.shape[2]
    acc_tl, acc_t = _acc(q.dtype)
    out = torch.empty((n, h, cv), dtype=q.dtype, device=q.device)
    lse = torch.empty((n, h), dtype=acc_t, device=q.device)
    if n * h == 0:
        return out, lse
    if col.numel() == 0:  # no edges: zero outputs, lse = -inf (no launch needed)
        return out.zero_(), lse.fill_(float("-inf"))
    if c == 0 or cv == 0:  # degenerate head dims: nothing to fuse, use the reference
        o, lse_r = reference.attention_fwd(q, k, v, ptr, col, scale, bias)
        return o, lse_r.to(acc_t)
    block_c, block_cv = triton.next_power_of_2(max(c, 1)), triton.next_power_of_2(max(cv, 1))
    be = _block_e(col.numel(), n, max(block_c, block_cv), block_e)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    b = bias.contiguous() if bias is not None else q  # a dummy pointer, never read
    _attn_fwd[(n * h,)](
        q,
        k,
        v,
        b,
        out,
        lse,
        ptr.contiguous(),
        col.contiguous(),
        float(scale),
        h,
        c,
        cv,
        HAS_BIAS=bias is not None,
        ACC=acc_tl,
        BLOCK_E=be,
        BLOCK_C=block_c,
        BLOCK_CV=block_cv,
    )
    return out, lse


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
        block_e: neighbours per block; default from the mean degree.
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
    block_c, block_cv = triton.next_power_of_2(c), triton.next_power_of_2(cv)
    be = _block_e(e, n, max(block_c, block_cv), block_e)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    out, grad_out = out.contiguous(), grad_out.to(q.dtype).contiguous()
    lse = lse.to(acc_t).contiguous()
    ptr, col = ptr.contiguous(), col.contiguous()
    b = bias.contiguous() if bias is not None else q  # dummy pointer, never read
    db = dbias if dbias is not None else q  # dummy pointer, never written
    delta = torch.empty((n, h), dtype=acc_t, device=q.device)
    meta = dict(
        HAS_BIAS=bias is not None, ACC=acc_tl, BLOCK_E=be, BLOCK_C=block_c, BLOCK_CV=block_cv
    )
    _attn_bwd_dq[(n * h,)](
        q, k, v, b, out, grad_out, lse, delta, dq, db, ptr, col, float(scale), h, c, cv, **meta
    )
    if m * h > 0:
        tptr, trow, tperm = csc if csc is not None else transpose_csr(ptr, col, m)
        be_t = _block_e(e, m, max(block_c, block_cv), block_e)
        meta["BLOCK_E"] = be_t
        _attn_bwd_dkdv[(m * h,)](
            q,
            k,
            v,
            b,
            grad_out,
            lse,
            delta,
            dk,
            dv,
            tptr,
            trow,
            tperm,
            float(scale),
            h,
            c,
            cv,
            **meta,
        )
    return dq, dk, dv, dbias
