"""The attention operator's CPU entry: one call per pass, on inputs the caller validated.

:mod:`gnnattn.kernels.library`'s ops call these with what their schemas
hold: the graph's layouts and the packed plans that
:func:`~.plans.csr_plan_tensors` made when the graph was built (its indices
checked then). :func:`gnnattn.attention` validated the call's tensors once,
before any op ran; so nothing here checks or plans, and the public kernels'
checks (:func:`~.forward.attention_fwd`, :func:`~.backward.attention_bwd`) are
not repeated per call. On a batch of molecules those checks and conversions
cost as much as the kernels themselves.
"""

from __future__ import annotations

from torch import Tensor

from ...graphs.csr import transpose_csr
from ..common import Dropout
from .backward import csr_source_pass, dst_pass, results, src_csr, src_pass
from .forward import forward
from .plans import _make_plan, plan_from_tensors

__all__ = ["attention_bwd_op", "attention_fwd_op"]


def _dropping(dropout: Dropout | None) -> Dropout | None:
    # p so small that no 24-bit draw falls under it drops nothing: the kernels'
    # specialisation without dropout.
    return dropout if dropout is not None and dropout.threshold > 0 else None


def attention_fwd_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    ptr: Tensor,
    col: Tensor,
    plan: Tensor,
    bias: Tensor | None,
    edge_attr: Tensor | None,
    edge_query: Tensor | None,
    dropout: Dropout | None,
    scale: float,
) -> tuple[Tensor, ...]:
    """:func:`~.forward.attention_fwd` over a graph's CSR and its packed ``plan``,
    unchecked; the results are new contiguous tensors."""
    pl = plan_from_tensors(ptr, col, k.shape[0], plan)  # sets numba's thread count
    drop = _dropping(dropout)
    return forward(q, k, v, pl.ptr, pl.col, pl.work, scale, bias, drop, edge_attr, edge_query)


def attention_bwd_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    lse: Tensor,
    grad_out: Tensor,
    layouts: tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor | None, Tensor | None, Tensor],
    bias: Tensor | None,
    edge_attr: Tensor | None,
    edge_query: Tensor | None,
    grad_edge_out: Tensor | None,
    dropout: Dropout | None,
    scale: float,
    need_dedge_attr: bool,
    grad_lse: Tensor | None = None,
) -> tuple[Tensor | None, ...]:
    """:func:`~.backward.attention_bwd` over a graph's ``layouts`` ``(ptr, col, plan,
    tptr, trow, tperm, csc_plan)`` (``plan`` made), unchecked; the results are new
    contiguous tensors (``None`` where :func:`~.backward.attention_bwd` gives none).

    Without the transposed CSR (``tptr`` ``None``), a graph of at most
    :data:`~.backward.CSR_SOURCE_PASS_MAX` work takes the source pass
    over the CSR (:func:`~.backward.src_csr`); a larger one has its
    transposed CSR made here.
    """
    ptr, col, plan, tptr, trow, tperm, csc_plan = layouts
    drop = _dropping(dropout)
    n, h = q.shape[0], q.shape[1]
    m = k.shape[0]
    csr = plan_from_tensors(ptr, col, m, plan)  # sets numba's thread count
    csc = None
    if tptr is not None and trow is not None and tperm is not None:
        # The graph's transposed CSR; its plan made here when the graph has none yet
        # (a compiled call on a graph whose eager calls never needed it).
        if csc_plan.numel():
            csc = plan_from_tensors(tptr, trow, n, csc_plan, perm=tperm)
        else:
            csc = _make_plan(tptr, trow, n, tperm, check=False)
    elif not csr_source_pass(col.shape[0], h, q.shape[2], v.shape[2]):
        tptr, trow, tperm = transpose_csr(ptr, col, m)
        csc = _make_plan(tptr, trow, n, tperm, check=False)
    dst = dst_pass(
        q,
        k,
        v,
        lse,
        grad_out,
        csr,
        scale,
        bias,
        drop,
        edge_attr,
        edge_query,
        grad_edge_out,
        True,
        need_dedge_attr,
        store=csc is None,
        grad_lse=grad_lse,
    )
    dq, ld, ds, dea, deq, dsp = dst
    del dst
    if csc is None:
        assert dsp is not None
        dk, dv = src_csr(q, grad_out, dsp, csr, scale, m)
    else:
        args = (scale, bias, drop, dsp, edge_attr, edge_query)
        dk, dv = src_pass(q, k, v, ld, grad_out, csc, csc.perm, *args)
    del dsp
    res = results(q, k, v, bias, edge_attr, dq, dk, dv, ds, dea, deq)
    # dS views the [dS | P] buffer: the op's results are contiguous.
    return tuple(t.contiguous() if t is not None else None for t in res)
