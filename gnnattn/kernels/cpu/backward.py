"""The fused attention backward: :func:`attention_bwd` and its two passes.

See :mod:`._bwd_kernels` for what each pass computes and reads.
"""

from __future__ import annotations

import numba
import numpy as np
import torch
from torch import Tensor

from ...graphs.csr import transpose_csr
from ..common import Dropout, acc_dtype
from ._bwd_kernels import (
    _bwd_dst_kernel,
    _bwd_dst_pieces_kernel,
    _bwd_src_kept_kernel,
    _bwd_src_kept_pieces_kernel,
    _bwd_src_kernel,
    _bwd_src_pieces_kernel,
    _bwd_src_scatter_kernel,
)
from .plans import (
    CPUPlan,
    _bias,
    _check_edge,
    _check_options,
    _check_plan,
    _check_qkv,
    _check_rows,
    _check_tensors,
    _edge_rows,
    _make_plan,
    _np_dtype,
    _opt_rows,
    _option_args,
    _rows,
    _scalar,
    _threads,
)

__all__ = ["attention_bwd", "attention_bwd_dst", "attention_bwd_src", "csr_source_pass"]

#: The most work ``E * H * (C + Cv)`` (multiply-adds) whose source pass runs over the
#: CSR (:func:`src_csr`: each thread a range of sources, reading every edge) instead
#: of over the transposed CSR. Measured on 2 cores (``TransformerConv(64, 16, heads=4,
#: edge_dim=16)`` forward + backward on batches of molecules, 2026-12-06, when the CSR
#: pass ran on one thread): with a graph made per batch the CSR pass was 1-5% faster
#: up to 4M (512 molecules), the transposed CSR's construction included; on a graph
#: reused with its transposed CSR, level up to 16M. Kept at 1M (128 molecules): each
#: thread of the CSR pass reads all the edges, so on many cores the transposed CSR's
#: pass gains.
CSR_SOURCE_PASS_MAX = 1 << 20


def csr_source_pass(num_edges: int, heads: int, channels: int, value_channels: int) -> bool:
    """Whether a graph's backward does its source pass over the CSR (its work is at most
    :data:`CSR_SOURCE_PASS_MAX`), needing no transposed CSR."""
    return num_edges * heads * (channels + value_channels) <= CSR_SOURCE_PASS_MAX


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
    *,
    dropout: Dropout | None = None,
    plan: CPUPlan | None = None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """The backward's destination pass: ``dq``, ``D`` and the score gradient.

    Args:
        q, k, v, lse, grad_out, ptr, col, scale, bias, dropout, plan: as in
            :func:`attention_bwd`.

    Returns:
        ``dq`` ``[N, H, C]``, ``ld`` ``[N, 2H]`` (``lse`` and ``D_i`` side by
        side, what the source pass reads per edge) and the score gradient
        ``dS`` ``[E, H]`` (with a bias, else ``None``), all in the compute
        dtype.
    """
    dst = _bwd_dst(q, k, v, lse, grad_out, ptr, col, scale, bias, dropout=dropout, plan=plan)
    return dst[:3]


def _bwd_dst(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    lse: Tensor,
    grad_out: Tensor,
    ptr: Tensor,
    col: Tensor,
    scale: float,
    bias: Tensor | None = None,
    *,
    dropout: Dropout | None = None,
    plan: CPUPlan | None = None,
    edge_attr: Tensor | None = None,
    edge_query: Tensor | None = None,
    grad_edge_out: Tensor | None = None,
    weights: bool = False,
    need_dedge_attr: bool = True,
    grad_lse: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None, Tensor | None, Tensor | None]:
    """:func:`attention_bwd_dst` with the edge features and ``grad_lse`` of
    :func:`attention_bwd`.

    With ``weights`` (and a stored ``dS``: a bias or edge features) the pass
    also stores the dropped weights ``P_ij = alpha_ij f_ij`` beside ``dS``,
    one ``[E, 2H]`` array (``dS`` in ``[:, :H]``, ``P`` in ``[:, H:]``): the
    source pass, given it as ``ds=``, then reads one cache line per edge
    instead of recomputing the weights.

    Returns:
        those of :func:`attention_bwd_dst` (``dS`` also with edge features:
        the source pass reads it as ``ds=`` then; with ``weights`` a view of
        the ``[E, 2H]`` array), then ``dedge_attr`` (shaped like ``edge_attr``) and
        ``dedge_query`` ``[N, H, F]`` in the compute dtype (``None`` without
        ``edge_attr`` or ``need_dedge_attr``, resp. without ``edge_query``),
        then the ``[E, 2H]`` array
        (``None`` without ``weights`` or without a stored ``dS``).
    """
    e = _check_qkv(q, k, v, bias, ptr, col)
    n, nh, _ = q.shape
    _check_rows("grad_out", grad_out, (n, nh, v.shape[2]))
    _check_rows("lse", lse, (n, nh))
    if grad_lse is not None:
        _check_rows("grad_lse", grad_lse, (n, nh))
    drop = _check_options(dropout)
    nf = _check_edge(edge_attr, edge_query, q, e)
    if edge_attr is not None and grad_edge_out is not None:
        _check_rows("grad_edge_out", grad_edge_out, (n, nh, nf))
    if plan is None:
        plan = _make_plan(ptr, col, k.shape[0], None)
    else:
        plan = _check_plan(plan, "plan", n, e, k.shape[0])
        _threads()
    return dst_pass(
        q,
        k,
        v,
        lse,
        grad_out,
        plan,
        scale,
        bias,
        drop,
        edge_attr,
        edge_query,
        grad_edge_out,
        weights,
        need_dedge_attr,
        grad_lse=grad_lse,
    )


def dst_pass(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    lse: Tensor,
    grad_out: Tensor,
    plan: CPUPlan,
    scale: float,
    bias: Tensor | None,
    drop: Dropout | None,
    edge_attr: Tensor | None,
    edge_query: Tensor | None,
    grad_edge_out: Tensor | None,
    weights: bool,
    need_dedge_attr: bool,
    store: bool = False,
    grad_lse: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None, Tensor | None, Tensor | None]:
    """:func:`_bwd_dst` on checked inputs (``drop``: ``None`` or dropping something);
    ``store``: ``dS`` (and with ``weights`` ``P``) stored even without a bias or edge
    features, for :func:`src_csr`; ``grad_lse`` ``[N, H]``: the gradient of ``lse``
    (``None``: zero), folded into ``D_i`` (the second half of ``ld``)."""
    n, nh, cq = q.shape
    e = plan.num_edges
    nf = edge_attr.shape[-1] if edge_attr is not None else 0
    if edge_attr is None:
        grad_edge_out = None
    dt = acc_dtype(q.dtype)
    alloc = torch.empty if e else torch.zeros
    dq = alloc(n, nh * cq, dtype=dt)
    # lse and D_i side by side; the kernels write both halves of every row.
    ld = torch.empty(n, 2 * nh, dtype=dt)
    # The pass writes every edge's row of these (and every target's of deq).
    keep_ds = store or bias is not None or edge_attr is not None
    weights = weights and keep_ds
    # dS and P interleaved per edge: the source pass reads both at the edge's
    # CSR position, a random row, so side by side they cost one cache line.
    dsp = torch.empty(e, 2 * nh, dtype=dt) if weights else None
    ds = dsp[:, :nh] if dsp is not None else torch.empty(e, nh, dtype=dt) if keep_ds else None
    # Without dea the kernels compile without its per-edge sum over heads and its store.
    dea = None
    if edge_attr is not None and need_dedge_attr:
        dea = alloc(e, *edge_attr.shape[1:], dtype=dt)  # [E, F] or [E, H, F]
    deq = alloc(n, nh * nf, dtype=dt) if edge_query is not None else None
    if e and nh:
        qq, kk, vv, go = _rows(q, dt), _rows(k, dt), _rows(v, dt), _rows(grad_out, dt)
        ll = _rows(lse, dt)
        gl = _rows(grad_lse, dt) if grad_lse is not None else np.empty((0, nh), _np_dtype(dt))
        bb, sc = _bias(bias, dt, nh), _scalar(scale, dt)
        if dsp is not None:
            dd = dsp.numpy()
        else:
            dd = ds.numpy() if ds is not None else np.empty((0, nh), _np_dtype(dt))
        key, dscale = _option_args(drop, dt)
        ea, eq, gg = (
            _edge_rows(edge_attr, dt),
            _opt_rows(edge_query, dt),
            _opt_rows(grad_edge_out, dt),
        )
        dea_np = dea.numpy() if dea is not None else None
        deq_np = deq.numpy() if deq is not None else None
        w = plan.work
        args = (qq, kk, vv, go, ll, gl, bb, bias is not None, key, dscale, ea, eq, gg, nf)
        outs = (dq.numpy(), ld.numpy(), dd, deq_np, dea_np)
        _bwd_dst_kernel(*args, plan.ptr, plan.col, sc, w.bounds, w.limit, *outs)
        if w.pieces.shape[0]:
            _bwd_dst_pieces_kernel(*args, plan.col, sc, w.pieces, w.seg, *outs)
    else:
        ld[:, :nh] = lse
        ld[:, nh:] = 0
        if dea is not None:
            dea.zero_()  # no head: no term
    deq_out = deq.view(n, nh, nf) if deq is not None else None
    return dq.view(n, nh, cq), ld, ds, dea, deq_out, dsp


def attention_bwd_src(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    ld: Tensor,
    grad_out: Tensor,
    csc: tuple[Tensor, Tensor, Tensor] | None,
    scale: float,
    bias: Tensor | None = None,
    *,
    dropout: Dropout | None = None,
    ds: Tensor | None = None,
    csc_plan: CPUPlan | None = None,
    edge_attr: Tensor | None = None,
    edge_query: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The backward's source pass: ``dk`` and ``dv`` over the transposed CSR.

    Args:
        q, k, v, grad_out, scale, bias, dropout: as in :func:`attention_bwd`.
        ld: ``[N, 2H]`` from :func:`attention_bwd_dst`.
        csc: ``(tptr, trow, tperm)``, the transposed CSR; checked here unless
            ``csc_plan`` is given. With a ``csc_plan`` it may be ``None``, or
            supply ``tperm`` to a plan made without ``perm=`` (then only its
            shape is checked: the caller vouches that it is the plan's).
        ds: optional ``[E, H]`` score gradient from :func:`attention_bwd_dst`:
            read per edge (one cache line) instead of recomputed. Or
            ``[E, 2H]``, ``dS`` and the dropped weights ``P_ij = alpha_ij
            f_ij`` side by side (as :func:`attention_bwd` has the destination
            pass store them): then ``dk_j = scale sum_i dS_ij q_i`` and
            ``dv_j = sum_i P_ij dout_i`` from them alone, and ``k``, ``v``,
            ``ld``, ``bias``, ``dropout``, ``edge_attr`` and ``edge_query``
            are checked but not read.
        csc_plan: ``plan(tptr, trow, N, perm=tperm)``; made without ``perm``
            it serves calls with ``bias``, ``dropout`` or ``ds`` only together
            with ``csc`` (whose ``tperm`` is then used unchecked).
        edge_attr, edge_query: as in :func:`attention_bwd`; with ``edge_attr``
            ``ds`` is required (the ``edge_out`` gradient enters only through it).

    Returns:
        ``dk`` ``[M, H, C]`` and ``dv`` ``[M, H, Cv]`` in the compute dtype.
    """
    _check_tensors(q, k, v)
    n, nh, _ = q.shape
    m, cv = k.shape[0], v.shape[2]
    _check_rows("ld", ld, (n, 2 * nh))
    _check_rows("grad_out", grad_out, (n, nh, cv))
    if csc_plan is None:
        if csc is None:
            raise ValueError("Expected 'csc' (tptr, trow, tperm) or 'csc_plan', got neither")
        tptr, trow, tperm = csc
        e = trow.numel()
        if tptr.numel() != m + 1 or tperm.numel() != e or (bias is not None and bias.shape[0] != e):
            raise ValueError(
                f"Expected 'csc' = transpose_csr(ptr, col, {m}) of a graph with the bias's edges, "
                f"got shapes {[list(t.shape) for t in csc]}"
            )
        pl = _make_plan(tptr, trow, n, tperm, names=("csc", "csc", "csc"))
    else:
        pl = _check_plan(csc_plan, "csc_plan", m, None, n)
        _threads()
    e = pl.num_edges
    perm = pl.perm
    if perm is None and csc is not None:
        perm = _companion_perm(csc, m, e)
    if bias is not None:
        _check_rows("bias", bias, (e, nh))
    kept = ds is not None and ds.ndim == 2 and ds.shape[1] == 2 * nh and nh > 0
    if ds is not None:
        _check_rows("ds", ds, (e, 2 * nh) if kept else (e, nh))
    elif edge_attr is not None:
        raise ValueError("Expected 'ds' from attention_bwd_dst with 'edge_attr', got None")
    drop = _check_options(dropout)
    _check_edge(edge_attr, edge_query, q, e)
    per_edge = bias is not None or drop is not None or ds is not None
    if per_edge and perm is None:
        raise ValueError(
            "Expected 'csc' with a 'csc_plan' made without perm= (bias, dropout and ds are "
            "read at each edge's CSR position, csc[2]), got neither"
        )
    return src_pass(q, k, v, ld, grad_out, pl, perm, scale, bias, drop, ds, edge_attr, edge_query)


def src_pass(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    ld: Tensor,
    grad_out: Tensor,
    pl: CPUPlan,
    perm: np.ndarray | None,
    scale: float,
    bias: Tensor | None,
    drop: Dropout | None,
    ds: Tensor | None,
    edge_attr: Tensor | None,
    edge_query: Tensor | None,
) -> tuple[Tensor, Tensor]:
    """:func:`attention_bwd_src` on checked inputs, over the transposed CSR's plan ``pl``
    and its ``perm`` (``None`` only without per-edge reads: no bias, dropout or ``ds``)."""
    n, nh, cq = q.shape
    m, cv = k.shape[0], v.shape[2]
    e = pl.num_edges
    dt = acc_dtype(q.dtype)
    kept = ds is not None and ds.ndim == 2 and ds.shape[1] == 2 * nh and nh > 0
    tperm_np = perm if perm is not None else np.empty(0, np.int64)
    alloc = torch.empty if e else torch.zeros
    dk = alloc(m, nh * cq, dtype=dt)
    dv = alloc(m, nh * cv, dtype=dt)
    if e and nh:
        qq, go = _rows(q, dt), _rows(grad_out, dt)
        sc = _scalar(scale, dt)
        dsv = _rows(ds, dt) if ds is not None else None
        w = pl.work
        if kept:
            # dS and P stored: nothing to recompute (see _src_kept_segment).
            assert dsv is not None
            args = (qq, go, dsv)
            _bwd_src_kept_kernel(
                *args, pl.ptr, pl.col, tperm_np, sc, w.bounds, w.limit, dk.numpy(), dv.numpy()
            )
            if w.pieces.shape[0]:
                _bwd_src_kept_pieces_kernel(
                    *args, pl.col, tperm_np, sc, w.pieces, w.seg, dk.numpy(), dv.numpy()
                )
            return dk.view(m, nh, cq), dv.view(m, nh, cv)
        kk, vv, lld = _rows(k, dt), _rows(v, dt), _rows(ld, dt)
        bb = _bias(bias, dt, nh)
        key, dscale = _option_args(drop, dt)
        if edge_query is None:
            edge_attr = None  # without a query it does not enter the scores: not read here
        ea, eq = _edge_rows(edge_attr, dt), _opt_rows(edge_query, dt)
        full = (qq, kk, vv, go, lld, bb, bias is not None, key, dscale, dsv, ea, eq)
        _bwd_src_kernel(
            *full, pl.ptr, pl.col, tperm_np, sc, w.bounds, w.limit, dk.numpy(), dv.numpy()
        )
        if w.pieces.shape[0]:
            _bwd_src_pieces_kernel(
                *full, pl.col, tperm_np, sc, w.pieces, w.seg, dk.numpy(), dv.numpy()
            )
    return dk.view(m, nh, cq), dv.view(m, nh, cv)


def src_csr(
    q: Tensor, grad_out: Tensor, dsp: Tensor, plan: CPUPlan, scale: float, num_src: int
) -> tuple[Tensor, Tensor]:
    """The source pass of a graph of at most :data:`CSR_SOURCE_PASS_MAX` work, from
    the destination pass's ``[dS | P]`` ``[E, 2H]``, over the CSR, each thread the
    sources of its range: the graph needs no transposed CSR (on a batch of molecules,
    made anew per step, that costs more than the pass). ``dk`` ``[M, H, C]`` and
    ``dv`` ``[M, H, Cv]`` in the compute dtype."""
    n, nh, cq = q.shape
    cv = grad_out.shape[2]
    dt = acc_dtype(q.dtype)
    # Zeroed by the kernel; without an edge (or a head) it does not run.
    alloc = torch.empty if plan.num_edges and nh else torch.zeros
    dk = alloc(num_src, nh * cq, dtype=dt)
    dv = alloc(num_src, nh * cv, dtype=dt)
    if plan.num_edges and nh:
        qq, go, dd = _rows(q, dt), _rows(grad_out, dt), _rows(dsp, dt)
        sc, parts = _scalar(scale, dt), numba.get_num_threads()
        _bwd_src_scatter_kernel(qq, go, dd, plan.ptr, plan.col, sc, parts, dk.numpy(), dv.numpy())
    return dk.view(num_src, nh, cq), dv.view(num_src, nh, cv)


def _companion_perm(csc: tuple[Tensor, Tensor, Tensor], m: int, e: int) -> np.ndarray:
    """``csc[2]`` given with a ``csc_plan`` made without ``perm``: its shape, dtype and
    device are checked (O(1)), its values trusted, as the graph object that made both
    vouches for them (as the Triton kernels do)."""
    tptr, trow, tperm = csc
    if tptr.numel() != m + 1 or trow.numel() != e or tperm.shape != (e,):
        raise ValueError(
            f"Expected 'csc' = transpose_csr(ptr, col, {m}) of the plan's graph, got shapes "
            f"{[list(t.shape) for t in csc]}"
        )
    if tperm.dtype not in (torch.int32, torch.int64) or tperm.device.type != "cpu":
        raise TypeError(
            f"Expected 'csc' int32/int64 on the CPU, got {tperm.dtype} on {tperm.device}"
        )
    return tperm.contiguous().numpy()


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
    plan: CPUPlan | None = None,
    csc_plan: CPUPlan | None = None,
    edge_attr: Tensor | None = None,
    edge_query: Tensor | None = None,
    grad_edge_out: Tensor | None = None,
    need_dedge_attr: bool = True,
    grad_lse: Tensor | None = None,
) -> tuple[Tensor | None, ...]:
    """Gradients of :func:`~gnnattn.kernels.cpu.attention_fwd` w.r.t. ``q``, ``k``, ``v``
    and ``bias`` (and ``edge_attr``, ``edge_query``).

    FlashAttention's recomputation: ``alpha`` comes back from ``lse``. ``dq``,
    ``D_i`` and the per-edge gradients are summed per target over the CSR
    (:func:`attention_bwd_dst`), ``dk`` and ``dv`` per source over the
    transposed CSR (:func:`attention_bwd_src`), which recomputes the weights
    (and the dropout mask) instead of reading stored ones, except where the
    destination pass writes the ``[E, H]`` score gradient anyway (a bias,
    edge features): then it writes the dropped weights beside it
    and the source pass reads the two (one cache line per edge).

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
        dropout: the forward's :class:`~gnnattn.kernels.common.Dropout` (the
            same key: the mask is regenerated), or ``None``.
        csc: the transposed CSR ``(tptr, trow, tperm)`` of the graph
            (:attr:`gnnattn.AttentionGraph.csc`); built here when neither it
            nor ``csc_plan`` is given.
        plan: ``plan(ptr, col, M)``, as in the forward.
        csc_plan: ``plan(tptr, trow, N, perm=tperm)``: with both plans no
            index array is read or checked (beyond its size) and ``csc`` is
            not needed. ``plan(tptr, trow, N)`` without ``perm`` works too,
            given ``csc``: its ``tperm`` is then trusted to be the plan's (as
            the graph object guarantees) and not range-checked.
        edge_attr: the forward's ``[E, F]`` (or per-head ``[E, H, F]``) edge
            features, or ``None``.
        edge_query: the forward's ``[N, H, F]`` edge query, or ``None``.
        grad_edge_out: ``[N, H, F]`` the gradient of the forward's
            ``edge_out`` (``None``: zero; ignored without ``edge_attr``).
        need_dedge_attr: ``False`` when ``edge_attr`` needs no gradient (raw
            features usually do not): ``dedge_attr`` is then not computed.
        grad_lse: ``[N, H]`` the gradient of the forward's ``lse`` (``None``:
            zero). ``d lse_i / d s_ij = alpha_ij``: it enters as ``D_i - grad_lse_i``.

    Returns:
        ``dq``, ``dk``, ``dv`` (typed like ``q``, ``k``, ``v``) and ``dbias``
        ``[E, H]`` (the score gradient ``dS``, typed like ``bias``; ``None``
        without a bias); with ``edge_attr`` six results: these four, then
        ``dedge_attr`` shaped like ``edge_attr`` (``[E, F]`` summed over heads;
        typed like it; ``None`` without ``need_dedge_attr``) and ``dedge_query`` ``[N, H, F]``
        (``None`` without an edge query).

    Raises:
        ValueError: on shapes that do not fit, or ``ptr``/``col`` out of range.
        TypeError: on non-floating inputs or non-integer ``ptr``/``col``.
    """
    _check_qkv(q, k, v, bias, ptr, col)
    n, nh, _ = q.shape
    m, cv = k.shape[0], v.shape[2]
    if out is not None:
        _check_rows("out", out, (n, nh, cv))
    if plan is None:
        plan = _make_plan(ptr, col, m, None)  # checked once, for both uses below
    dst = _bwd_dst(
        q,
        k,
        v,
        lse,
        grad_out,
        ptr,
        col,
        scale,
        bias,
        dropout=dropout,
        plan=plan,
        edge_attr=edge_attr,
        edge_query=edge_query,
        grad_edge_out=grad_edge_out,
        weights=True,
        need_dedge_attr=need_dedge_attr,
        grad_lse=grad_lse,
    )
    dq, ld, ds = dst[:3]
    dsp = dst[5]
    if csc_plan is not None:
        _check_plan(csc_plan, "csc_plan", m, col.numel(), n)
    elif csc is None:
        # Built from the checked CSR: nothing to check again.
        tptr, trow, tperm = transpose_csr(ptr, col, m)
        csc_plan = _make_plan(tptr, trow, n, tperm, check=False)
    # Whenever the destination pass stores dS (a bias, edge features), it stores
    # the dropped weights P beside it, and the source pass reads both instead of
    # recomputing the scores, the exp and the dropout mask (and of gathering the
    # edge query's rows).
    dk, dv = attention_bwd_src(
        q,
        k,
        v,
        ld,
        grad_out,
        csc,
        scale,
        bias,
        dropout=dropout,
        ds=dsp,
        csc_plan=csc_plan,
        edge_attr=edge_attr,
        edge_query=edge_query,
    )
    del dsp
    return results(q, k, v, bias, edge_attr, dq, dk, dv, ds, *dst[3:5])


def results(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None,
    edge_attr: Tensor | None,
    dq: Tensor,
    dk: Tensor,
    dv: Tensor,
    ds: Tensor | None,
    dea: Tensor | None,
    deq: Tensor | None,
) -> tuple[Tensor | None, ...]:
    """:func:`attention_bwd`'s results from the passes', typed like the inputs."""
    # A view of [dS | P] when there is P: it keeps P alive as long as the
    # gradient, which a contiguous copy would allocate anew, for the same bytes.
    dbias = ds.to(bias.dtype) if bias is not None and ds is not None else None
    res = (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dbias)
    if edge_attr is None:
        return res
    return (
        *res,
        dea.to(edge_attr.dtype) if dea is not None else None,
        deq.to(q.dtype) if deq is not None else None,
    )
