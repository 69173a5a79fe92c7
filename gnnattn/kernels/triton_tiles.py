r"""Tile attention in Triton: one program per row window and head, ``tl.dot`` on its tiles.

The CUDA kernel of the ``"tiles"`` backend, over the same block plan
(:mod:`gnnattn.graphs.blocks`) and with the same results as the torch
reference :func:`gnnattn.kernels.tiles.tile_attention`. Per chunk of windows
of one tile shape :math:`R \times K`, a program holds its window's queries
``[R, C]`` (gathered by the chunk's ``rows``) and walks its columns in blocks
of ``BLOCK_K``: keys and values gathered by ``cols``, scores by ``tl.dot``
(tensor cores), the empty slots masked, an online softmax, and
:math:`P V` by ``tl.dot`` again. No score tile reaches memory: the forward
reads :math:`q`, :math:`k`, :math:`v` once per window and writes ``out`` and
``lse``; the score bias and the dropout factors, when given, are dense
``[H, n R K]`` tiles the wrapper scatters from the edges.

The backward recomputes :math:`P = e^{S - \text{lse}}` block by block (the
FlashAttention recurrence of :mod:`gnnattn.kernels.tiles`): ``dq`` per row
(a target is a row of one window), and ``dk``/``dv`` per column of each
window into a ``[H, n K, C]`` buffer that the wrapper adds into the sources'
rows (a source is a column of many windows: a deterministic ``index_add``
instead of atomics), and ``dS`` into the bias tile's slots when the bias
needs a gradient.

Like the reference it takes finite ``q``, ``k``, ``v`` (the operator sends
other inputs to the CSR kernels); a NaN or ``+inf`` bias makes its row NaN,
and the empty slots are zeroed after the exponential. Half-precision inputs
multiply in their dtype with float32 accumulation; float32 in IEEE float32 (TF32
only where torch allows it for float32 matmuls:
``torch.backends.cuda.matmul.fp32_precision``, ``allow_tf32``); float64 stays
float64.
Tested under ``TRITON_INTERPRET=1`` against the reference and compiled for
sm_90 (``tests/test_triton_tiles.py``).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..graphs.blocks import TileChunk, TilePlan
from .common import acc_dtype

__all__ = ["tile_attention_triton"]

_NO_SPECIALISE = ("N", "M", "R", "K")


@triton.jit
def _scores(
    q,
    k_ptr,
    cols_ptr,
    mask_ptr,
    bias_ptr,
    w,
    h,
    n,
    r,
    rmask,
    c,
    k0,
    M,
    R,
    K,
    C: tl.constexpr,
    ACC: tl.constexpr,
    PREC: tl.constexpr,
    BLOCK_K: tl.constexpr,
    HAS_MASK: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    """The scores of window ``w``, head ``h`` against its columns ``k0 .. k0 + BLOCK_K``:
    ``(s, empty, kt, cols, kmask, slot, smask)``, where ``empty`` marks the slots
    that hold no edge (padding, or a partial tile's masked pairs) and ``slot`` is
    each score's index in the window's ``[R, K]`` slot tile."""
    kk = k0 + tl.arange(0, BLOCK_K)
    kmask = kk < K
    cols = tl.load(cols_ptr + w * K + kk, mask=kmask, other=0)
    km = (c[:, None] < C) & kmask[None, :]
    kt = tl.load(k_ptr + (h * M + cols)[None, :] * C + c[:, None], mask=km, other=0.0)
    s = tl.dot(q, kt, input_precision=PREC, out_dtype=ACC)  # (BLOCK_R, BLOCK_K)
    smask = rmask[:, None] & kmask[None, :]
    slot = (w * R + r)[:, None] * K + kk[None, :]
    if HAS_BIAS:
        s += tl.load(bias_ptr + h * n * R * K + slot, mask=smask, other=0.0).to(ACC)
    empty = ~smask
    if HAS_MASK:
        empty = empty | (tl.load(mask_ptr + slot, mask=smask, other=1) != 0)
    return s, empty, kt, cols, kmask, slot, smask


@triton.jit(do_not_specialize=_NO_SPECIALISE)
def _tile_fwd(
    q_ptr,
    k_ptr,
    v_ptr,
    rows_ptr,
    cols_ptr,
    mask_ptr,
    bias_ptr,
    fac_ptr,
    out_ptr,
    lse_ptr,
    N,
    M,
    R,
    K,
    C: tl.constexpr,
    CV: tl.constexpr,
    ACC: tl.constexpr,
    PREC: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_CV: tl.constexpr,
    HAS_MASK: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_FAC: tl.constexpr,
):
    """Window ``program_id(0)``, head ``program_id(1)``: ``out`` ``[H, n R, CV]`` and
    ``lse`` ``[H, n R]`` of its rows. ``q``/``k``/``v`` are heads-first ``[H, N, C]``,
    ``[H, M, C]``, ``[H, M, CV]`` (``q`` scaled)."""
    w = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    n = tl.num_programs(0).to(tl.int64)
    r = tl.arange(0, BLOCK_R)
    rmask = r < R
    c = tl.arange(0, BLOCK_C)
    cv = tl.arange(0, BLOCK_CV)
    rows = tl.load(rows_ptr + w * R + r, mask=rmask, other=0)
    qm = rmask[:, None] & (c[None, :] < C)
    q = tl.load(q_ptr + (h * N + rows)[:, None] * C + c[None, :], mask=qm, other=0.0)
    m_i = tl.full([BLOCK_R], float("-inf"), ACC)
    l_i = tl.zeros([BLOCK_R], ACC)
    acc = tl.zeros([BLOCK_R, BLOCK_CV], ACC)
    for k0 in range(0, K, BLOCK_K):
        s, empty, kt, cols, kmask, slot, smask = _scores(
            q,
            k_ptr,
            cols_ptr,
            mask_ptr,
            bias_ptr,
            w,
            h,
            n,
            r,
            rmask,
            c,
            k0,
            M,
            R,
            K,
            C,
            ACC,
            PREC,
            BLOCK_K,
            HAS_MASK,
            HAS_BIAS,
        )
        s = tl.where(empty, float("-inf"), s)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # A row without an edge so far keeps max -inf: shifted by 0, exp(-inf) = 0.
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        corr = tl.exp(m_i - shift)
        p = tl.where(empty, 0.0, tl.exp(s - shift[:, None]))
        l_i = l_i * corr + tl.sum(p, 1)
        if HAS_FAC:
            p = p * tl.load(fac_ptr + h * n * R * K + slot, mask=smask, other=0.0).to(ACC)
        vm = kmask[:, None] & (cv[None, :] < CV)
        vb = tl.load(v_ptr + (h * M + cols)[:, None] * CV + cv[None, :], mask=vm, other=0.0)
        acc = acc * corr[:, None] + tl.dot(p.to(vb.dtype), vb, input_precision=PREC, out_dtype=ACC)
        m_i = m_new
    denom = tl.where(l_i == 0.0, 1.0, l_i)
    lse = tl.where(l_i == 0.0, float("-inf"), m_i + tl.log(denom))
    out = acc / denom[:, None]
    base = h * n * R + w * R + r
    om = rmask[:, None] & (cv[None, :] < CV)
    tl.store(out_ptr + base[:, None] * CV + cv[None, :], out.to(out_ptr.dtype.element_ty), mask=om)
    tl.store(lse_ptr + base, lse, mask=rmask)


@triton.jit(do_not_specialize=_NO_SPECIALISE)
def _tile_bwd(
    q_ptr,
    k_ptr,
    v_ptr,
    rows_ptr,
    out_rows_ptr,
    cols_ptr,
    mask_ptr,
    bias_ptr,
    fac_ptr,
    do_ptr,
    lse_ptr,
    d_ptr,
    dq_ptr,
    dk_ptr,
    dv_ptr,
    ds_ptr,
    N,
    M,
    R,
    K,
    C: tl.constexpr,
    CV: tl.constexpr,
    ACC: tl.constexpr,
    PREC: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_CV: tl.constexpr,
    HAS_MASK: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_FAC: tl.constexpr,
    STORE_DS: tl.constexpr,
):
    """Window ``program_id(0)``, head ``program_id(1)``: ``dq`` ``[H, n R, C]`` of its
    rows, ``dk`` ``[H, n K, C]`` and ``dv`` ``[H, n K, CV]`` of its columns, and with
    ``STORE_DS`` the score gradient of its slots ``[H, n R K]``. ``do``, ``lse``
    (``+inf`` where a target has no edge) and ``d`` (``D_i``) are heads-first, by row
    of ``q``."""
    w = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    n = tl.num_programs(0).to(tl.int64)
    r = tl.arange(0, BLOCK_R)
    rmask = r < R
    c = tl.arange(0, BLOCK_C)
    cv = tl.arange(0, BLOCK_CV)
    rows = tl.load(rows_ptr + w * R + r, mask=rmask, other=0)
    # A padded row or a target without edges (out_rows = N) is computed unmasked
    # in the forward and dropped: here its P is 0 (lse +inf), so it adds nothing.
    live = rmask & (tl.load(out_rows_ptr + w * R + r, mask=rmask, other=N) < N)
    qm = rmask[:, None] & (c[None, :] < C)
    q = tl.load(q_ptr + (h * N + rows)[:, None] * C + c[None, :], mask=qm, other=0.0)
    om = live[:, None] & (cv[None, :] < CV)
    do = tl.load(do_ptr + (h * N + rows)[:, None] * CV + cv[None, :], mask=om, other=0.0)
    lse = tl.load(lse_ptr + h * N + rows, mask=live, other=float("inf")).to(ACC)
    d = tl.load(d_ptr + h * N + rows, mask=live, other=0.0).to(ACC)
    dq = tl.zeros([BLOCK_R, BLOCK_C], ACC)
    for k0 in range(0, K, BLOCK_K):
        s, empty, kt, cols, kmask, slot, smask = _scores(
            q,
            k_ptr,
            cols_ptr,
            mask_ptr,
            bias_ptr,
            w,
            h,
            n,
            r,
            rmask,
            c,
            k0,
            M,
            R,
            K,
            C,
            ACC,
            PREC,
            BLOCK_K,
            HAS_MASK,
            HAS_BIAS,
        )
        vm = kmask[:, None] & (cv[None, :] < CV)
        vb = tl.load(v_ptr + (h * M + cols)[:, None] * CV + cv[None, :], mask=vm, other=0.0)
        p = tl.where(empty, 0.0, tl.exp(s - lse[:, None]))  # (BLOCK_R, BLOCK_K)
        dp = tl.dot(do, tl.trans(vb), input_precision=PREC, out_dtype=ACC)
        pf = p
        if HAS_FAC:
            f = tl.load(fac_ptr + h * n * R * K + slot, mask=smask, other=0.0).to(ACC)
            pf = p * f
            dp = dp * f
        ds = tl.where(empty, 0.0, p * (dp - d[:, None]))
        if STORE_DS:
            tl.store(ds_ptr + h * n * R * K + slot, ds.to(ds_ptr.dtype.element_ty), mask=smask)
        dq += tl.dot(ds.to(kt.dtype), tl.trans(kt), input_precision=PREC, out_dtype=ACC)
        kbase = h * n * K + w * K + k0 + tl.arange(0, BLOCK_K)
        dkb = tl.dot(
            tl.trans(ds).to(q.dtype), q, input_precision=PREC, out_dtype=ACC
        )  # (BLOCK_K, C)
        dkm = kmask[:, None] & (c[None, :] < C)
        dk_at = dk_ptr + kbase[:, None] * C + c[None, :]
        tl.store(dk_at, dkb.to(dk_ptr.dtype.element_ty), mask=dkm)
        dvb = tl.dot(
            tl.trans(pf).to(do.dtype), do, input_precision=PREC, out_dtype=ACC
        )  # (BLOCK_K, CV)
        dv_at = dv_ptr + kbase[:, None] * CV + cv[None, :]
        tl.store(dv_at, dvb.to(dv_ptr.dtype.element_ty), mask=vm)
    base = h * n * R + w * R + r
    tl.store(dq_ptr + base[:, None] * C + c[None, :], dq.to(dq_ptr.dtype.element_ty), mask=qm)


def _pow2(x: int, least: int = 16) -> int:
    return max(least, triton.next_power_of_2(x))


def _acc(dtype: torch.dtype) -> tl.dtype:
    return tl.float64 if dtype == torch.float64 else tl.float32


def _precision(dtype: torch.dtype) -> str:
    """``tl.dot``'s input precision: float32 products in IEEE float32 unless the user
    allowed TF32 for float32 matmuls, as torch's matmul and Inductor's kernels do
    (Triton's own default is TF32, whose 10-bit mantissas give errors of 1e-3 on
    unit-scale scores). The half types and float64 do not read it."""
    if dtype == torch.float32 and not _tf32_allowed():
        return "ieee"
    return "tf32"


def _tf32_allowed() -> bool:
    matmul = torch.backends.cuda.matmul
    # torch's switch: fp32_precision where it exists (allow_tf32 and
    # set_float32_matmul_precision set it too, and reading allow_tf32 after the
    # new switch was set raises), allow_tf32 in older torch.
    precision = getattr(matmul, "fp32_precision", None)
    if precision is not None:
        return bool(precision == "tf32")
    return bool(matmul.allow_tf32)


def _slots(ch: TileChunk) -> int:
    """The chunk's slots, ``n R K``."""
    return ch.rows.numel() * ch.cols.shape[1]


def _or_empty(t: Tensor | None, like: Tensor) -> Tensor:
    """An absent tile as an empty tensor (its flag tells the kernel not to read it)."""
    return t if t is not None else like.new_empty(0)


def _slot_tile(values: Tensor | None, ch: TileChunk, fill: float) -> Tensor | None:
    """``values`` ``[H, E]`` (by edge id) scattered into the chunk's slots ``[H, n R K]``."""
    if values is None:
        return None
    tile = values.new_full((values.shape[0], _slots(ch)), fill)
    return tile.index_copy_(1, ch.slot, values.index_select(1, ch.edge))


def _blocks(r: int, k: int, c: int, cv: int, block_k: int | None) -> dict[str, int]:
    return dict(
        BLOCK_R=_pow2(r),
        BLOCK_K=block_k or (64 if k >= 64 else _pow2(k)),
        BLOCK_C=_pow2(c),
        BLOCK_CV=_pow2(cv),
    )


def _forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None,
    factor: Tensor | None,
    plan: TilePlan,
    scale: float,
    block_k: int | None,
) -> tuple[Tensor, Tensor]:
    """``(out [N, H, Cv], lse [N, H])``."""
    n, h, c = q.shape
    m, cv = k.shape[0], v.shape[2]
    acc = acc_dtype(q.dtype)
    qt = (q * scale).transpose(0, 1).contiguous()  # (H, N, C), the scale folded in
    kt, vt = (t.transpose(0, 1).contiguous() for t in (k, v))  # (H, M, C)
    bt = bias.t().to(acc).contiguous() if bias is not None else None  # (H, E)
    ft = factor.t().to(acc).contiguous() if factor is not None else None  # (H, E)
    outs, lses = [], []
    for ch in plan.chunks:
        w, r = ch.rows.shape
        kc = ch.cols.shape[1]
        out = q.new_empty(h, w * r, cv)
        lse = q.new_empty(h, w * r, dtype=acc)
        if w * r:
            mask = ch.masked.view(torch.uint8) if ch.masked is not None else None
            bs, fs = _slot_tile(bt, ch, 0.0), _slot_tile(ft, ch, 0.0)
            _tile_fwd[(w, h)](
                qt,
                kt,
                vt,
                ch.rows,
                ch.cols,
                _or_empty(mask, ch.rows),
                _or_empty(bs, qt),
                _or_empty(fs, qt),
                out,
                lse,
                n,
                m,
                r,
                kc,
                C=c,
                CV=cv,
                ACC=_acc(q.dtype),
                PREC=_precision(q.dtype),
                HAS_MASK=mask is not None,
                HAS_BIAS=bs is not None,
                HAS_FAC=fs is not None,
                **_blocks(r, kc, c, cv, block_k),
            )
        outs.append(out)
        lses.append(lse)
    # Targets of windows without edges take the row past the chunks' rows.
    outs.append(q.new_zeros(h, 1, cv))
    lses.append(q.new_full((h, 1), float("-inf"), dtype=acc))
    out = torch.cat(outs, 1).index_select(1, plan.take).transpose(0, 1)  # (N, H, Cv)
    lse = torch.cat(lses, 1).index_select(1, plan.take).t()  # (N, H)
    return out.contiguous(), lse.contiguous()


def _backward(ctx: Any, grad_out: Tensor, grad_lse: Tensor | None) -> tuple[Tensor | None, ...]:
    q, k, v, bias, factor, out, lse = ctx.saved_tensors
    plan: TilePlan = ctx.plan
    n, h, c = q.shape
    m, cv = k.shape[0], v.shape[2]
    acc = acc_dtype(q.dtype)
    qt = (q * ctx.scale).transpose(0, 1).contiguous()  # (H, N, C)
    kt, vt = (t.transpose(0, 1).contiguous() for t in (k, v))
    got = grad_out.transpose(0, 1).contiguous()  # (H, N, Cv)
    d = (grad_out.to(acc) * out.to(acc)).sum(-1)  # (N, H)
    if grad_lse is not None:
        d = d - grad_lse.to(acc)
    dt = d.t().contiguous()
    # A row without an edge (lse -inf) has exp(S - inf) = 0 everywhere.
    lse_t = lse.t().masked_fill(lse.t() == float("-inf"), float("inf")).contiguous()
    bt = bias.t().to(acc).contiguous() if bias is not None else None
    ft = factor.t().to(acc).contiguous() if factor is not None else None
    need_db = bias is not None and ctx.needs_input_grad[3]
    dk_t = torch.zeros(h, m, c, dtype=acc, device=q.device)
    dv_t = torch.zeros(h, m, cv, dtype=acc, device=q.device)
    dbias_t = torch.zeros(h, plan.num_edges, dtype=acc, device=q.device) if need_db else None
    dqs = []
    for ch in plan.chunks:
        w, r = ch.rows.shape
        kc = ch.cols.shape[1]
        dq = torch.empty(h, w * r, c, dtype=acc, device=q.device)
        if w * r:
            dk = torch.empty(h, w * kc, c, dtype=acc, device=q.device)
            dv = torch.empty(h, w * kc, cv, dtype=acc, device=q.device)
            ds = torch.empty(h, _slots(ch), dtype=acc, device=q.device) if need_db else None
            mask = ch.masked.view(torch.uint8) if ch.masked is not None else None
            bs, fs = _slot_tile(bt, ch, 0.0), _slot_tile(ft, ch, 0.0)
            _tile_bwd[(w, h)](
                qt,
                kt,
                vt,
                ch.rows,
                ch.out_rows,
                ch.cols,
                _or_empty(mask, ch.rows),
                _or_empty(bs, qt),
                _or_empty(fs, qt),
                got,
                lse_t,
                dt,
                dq,
                dk,
                dv,
                _or_empty(ds, dq),
                n,
                m,
                r,
                kc,
                C=c,
                CV=cv,
                ACC=_acc(q.dtype),
                PREC=_precision(q.dtype),
                HAS_MASK=mask is not None,
                HAS_BIAS=bs is not None,
                HAS_FAC=fs is not None,
                STORE_DS=ds is not None,
                **_blocks(r, kc, c, cv, ctx.block_k),
            )
            cols = ch.cols.view(-1)
            for i in range(h):  # along dim 0 of contiguous rows: the fast index_add
                dk_t[i].index_add_(0, cols, dk[i])
                dv_t[i].index_add_(0, cols, dv[i])
            if dbias_t is not None and ds is not None:
                dbias_t.index_copy_(1, ch.edge, ds.index_select(1, ch.slot))
        dqs.append(dq)
    dqs.append(torch.zeros(h, 1, c, dtype=acc, device=q.device))
    dq = torch.cat(dqs, 1).index_select(1, plan.take).transpose(0, 1).mul_(ctx.scale)
    dbias = dbias_t.t().to(bias.dtype) if dbias_t is not None and bias is not None else None
    return (
        dq.to(q.dtype),
        dk_t.transpose(0, 1).to(k.dtype),
        dv_t.transpose(0, 1).to(v.dtype),
        dbias,
    )


class _TritonTiles(torch.autograd.Function):
    """:func:`tile_attention_triton` with its backward."""

    @staticmethod
    def forward(  # type: ignore[override]
        q: Tensor,
        k: Tensor,
        v: Tensor,
        bias: Tensor | None,
        factor: Tensor | None,
        plan: TilePlan,
        scale: float,
        block_k: int | None,
    ) -> tuple[Tensor, Tensor]:
        return _forward(q, k, v, bias, factor, plan, scale, block_k)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, ...]) -> None:
        q, k, v, bias, factor, plan, scale, block_k = inputs
        out, lse = output
        ctx.save_for_backward(q, k, v, bias, factor, out, lse)
        ctx.plan, ctx.scale, ctx.block_k = plan, scale, block_k
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, grad_out: Tensor | None, grad_lse: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        if grad_out is None:
            grad_out = torch.zeros_like(ctx.saved_tensors[5])
        dq, dk, dv, dbias = _backward(ctx, grad_out.contiguous(), grad_lse)
        return dq, dk, dv, dbias, None, None, None, None


def tile_attention_triton(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    plan: TilePlan,
    scale: float,
    bias: Tensor | None = None,
    factor: Tensor | None = None,
    *,
    block_k: int | None = None,
) -> tuple[Tensor, Tensor]:
    r""":func:`gnnattn.kernels.tiles.tile_attention` (without ``need_alpha``) by the Triton
    kernels, with autograd.

    .. math::
        o_i = \sum_{j} \alpha_{ij} f_{ij} v_j, \qquad
        \alpha_{ij} = \operatorname{softmax}_j(\text{scale}\, q_i \cdot k_j + b_{ij})

    Args:
        q (Tensor): ``[N, H, C]`` queries (finite; CUDA, or CPU under
            ``TRITON_INTERPRET=1``).
        k (Tensor): ``[M, H, C]`` keys.
        v (Tensor): ``[M, H, Cv]`` values.
        plan (TilePlan): the graph's :func:`~gnnattn.graphs.blocks.block_plan`.
        scale (float): multiplies :math:`q \cdot k`.
        bias (Tensor, optional): ``[|E|, H]`` score bias in ``graph.edge_index``
            order. (default: :obj:`None`)
        factor (Tensor, optional): ``[|E|, H]`` multiplies the weights
            (dropout's factors); ``lse`` is that before it. (default: :obj:`None`)
        block_k (int, optional): the columns a program takes per step (a power
            of two >= 16); by default 64. (default: :obj:`None`)

    Returns:
        ``out`` ``[N, H, Cv]`` (typed like ``q``) and ``lse`` ``[N, H]`` (float32,
        float64 for float64; ``-inf`` for a target without edges).

    Shapes:
        - **q, k, v:** ``[N, H, C]``, ``[M, H, C]``, ``[M, H, Cv]``
        - **output:** ``[N, H, Cv]``, ``[N, H]``
    """
    return _TritonTiles.apply(q, k, v, bias, factor, plan, scale, block_k)
