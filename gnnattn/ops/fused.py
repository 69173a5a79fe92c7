"""The ``"fused"`` backend: sparse attention over the graph's CSR, never ``|E| x C``.

The kernels (numba on the CPU, Triton on CUDA, see :mod:`gnnattn.kernels`)
take the destination CSR in the forward and the ``dq`` pass and the
transposed CSR in the ``dk``/``dv`` pass. What they need per graph (the
index tensors in the width the device's kernel takes, the checked and planned
work split of each layout) is made once and kept in the graph's
:meth:`~gnnattn.AttentionGraph.derived` cache, so a call checks nothing and
plans nothing about the graph: on a GPU it makes no host synchronisation.
"""

from __future__ import annotations

import inspect
from functools import cache
from types import ModuleType
from typing import Any

import torch
from torch import Tensor

from .. import kernels
from ..graphs import AttentionGraph, segment_ids
from ..kernels.common import Dropout, acc_dtype

__all__ = ["fused_attention"]


def _csr(graph: AttentionGraph, device: torch.device) -> tuple[Tensor, Tensor]:
    """The CSR ``(ptr, col)`` as the device's kernel takes it: as held on the CPU
    (int32 or int64), int64 for Triton."""
    if device.type == "cpu":
        return graph.csr.ptr, graph.csr.col
    return graph.derived(("csr", "int64"), lambda: (graph.csr.ptr, graph.csr.col.long()))


def _csc(graph: AttentionGraph, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    tptr, trow, tperm = graph.csc
    if device.type == "cpu":
        return tptr, trow, tperm
    return graph.derived(("csc", "int64"), lambda: (tptr, trow.long(), tperm.long()))


def _plan(graph: AttentionGraph, kern: ModuleType, layout: str) -> Any:
    """The kernel's checked work plan of one layout of the graph, made once.

    The CPU kernels split work by the thread count, so their plans are kept
    per thread count (a process that changes it makes one more).
    """
    device = graph.device
    threads = torch.get_num_threads() if device.type == "cpu" else 0
    key = ("plan", kern.__name__, layout, threads)
    if layout == "csr":
        ptr, col = _csr(graph, device)
        return graph.derived(key, lambda: kern.plan(ptr, col, graph.num_src))
    tptr, trow, tperm = _csc(graph, device)
    return graph.derived(key, lambda: kern.plan(tptr, trow, graph.num_dst, perm=tperm))


@cache
def _takes_edge_out(kern: ModuleType) -> bool:
    """Whether a kernel's backward takes the forward's ``edge_out`` (Triton's: its
    ``D_i`` comes from the saved outputs, not from the edges)."""
    return "edge_out" in inspect.signature(kern.attention_bwd).parameters


class _FusedAttention(torch.autograd.Function):
    """Autograd around the kernels' ``attention_fwd`` / ``attention_bwd``.

    The graph and the dropout key ride on ``ctx`` rather than through
    ``save_for_backward``: they carry no gradient and never change, and the
    backward regenerates the dropout mask from the key instead of storing it.
    """

    @staticmethod
    def forward(ctx, q, k, v, bias, vbias, ea, eq, graph, scale, dropout):  # type: ignore[override]
        kern = kernels.get(q.device)
        ptr, col = _csr(graph, q.device)
        # The edge options are passed only when given (a kernel module may lack them:
        # backend_for sends such calls to "mp").
        opts = {} if ea is None else {"edge_attr": ea, "edge_query": eq}
        res = kern.attention_fwd(
            q, k, v, ptr, col, scale, bias,
            value_bias=vbias, dropout=dropout, plan=_plan(graph, kern, "csr"), **opts,
        )  # fmt: skip
        out, lse = res[0], res[1]
        edge_out = res[2] if ea is not None else None
        # The CPU kernel's backward recomputes D_i = dout_i . out_i from the
        # edges, so the output is not kept: at N = 1M, embed 128 that is
        # 0.5 GB less at the backward's peak. Triton's takes D_i from the
        # outputs (out, and edge_out for the edge_out gradient's term), which
        # are kept rather than recomputed by one more forward.
        takes_eo = _takes_edge_out(kern)
        keep_out = out if q.device.type != "cpu" or takes_eo else None
        keep_eo = edge_out if takes_eo else None
        ctx.save_for_backward(q, k, v, bias, vbias, keep_out, lse, ea, eq, keep_eo)
        ctx.graph, ctx.scale, ctx.dropout = graph, scale, dropout
        ctx.mark_non_differentiable(lse)
        return out, lse, edge_out

    @staticmethod
    def backward(ctx, grad_out, grad_lse, grad_edge_out):  # type: ignore[override]
        q, k, v, bias, vbias, out, lse, ea, eq, eo = ctx.saved_tensors
        graph = ctx.graph
        kern = kernels.get(q.device)
        ptr, col = _csr(graph, q.device)
        opts = {}
        if ea is not None:
            ge = grad_edge_out.contiguous() if grad_edge_out is not None else None
            opts = {"edge_attr": ea, "edge_query": eq, "grad_edge_out": ge}
            # Raw edge features seldom need a gradient: the kernels then skip it.
            opts["need_dedge_attr"] = ctx.needs_input_grad[5]
            if eo is not None:
                opts["edge_out"] = eo
        res = kern.attention_bwd(
            q, k, v, out, lse, grad_out.contiguous(), ptr, col, ctx.scale, bias,
            value_bias=vbias, dropout=ctx.dropout, csc=_csc(graph, q.device),
            plan=_plan(graph, kern, "csr"), csc_plan=_plan(graph, kern, "csc"), **opts,
        )  # fmt: skip
        dq, dk, dv, dbias, dvbias = res[:5]
        dea, deq = (res[5], res[6]) if ea is not None else (None, None)
        return dq, dk, dv, dbias, dvbias, dea, deq, None, None, None


def _kernel_dtype(t: Tensor) -> torch.dtype:
    # The CPU kernels compute in the accumulation dtype; the Triton kernels
    # take the half types natively (with float32 accumulation).
    return acc_dtype(t.dtype) if t.device.type == "cpu" else t.dtype


def fused_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    graph: AttentionGraph,
    scale: float,
    *,
    score_bias: Tensor | None = None,
    value_bias: Tensor | None = None,
    dropout: Dropout | None = None,
    need_weights: bool = False,
    edge_attr: Tensor | None = None,
    edge_key: Tensor | None = None,
    edge_value: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """The ``"fused"`` backend.

    ``score_bias`` ``[|E|, H]``, ``value_bias`` ``[|E|, H, Cv]`` and
    ``edge_attr`` ``[|E|, F]`` follow ``graph.edge_index``; they are put in
    CSR order here (a gather that autograd undoes). The weights, when asked
    for, are recomputed from the saved log-sum-exp (``|E| x H`` numbers) and
    are those before dropout.

    Edge features (see :func:`gnnattn.attention`) by linearity, with no
    ``|E| x (H*C)`` tensor: ``q_i . W_k a_ij = (W_k^T q_i) . a_ij``, so the
    kernel gets the edge query ``scale * W_k^T q_i`` ``[N, H, F]``, and
    ``sum_j P_ij W_v a_ij = W_v sum_j P_ij a_ij``, so ``W_v`` maps the
    kernel's ``edge_out`` ``[N, H, F]``. Both maps are torch ops: autograd
    takes the weights' gradients from the kernel's ``edge_query`` and
    ``edge_out`` gradients.

    Returns:
        ``out`` ``[N, H, Cv]`` (typed like ``q``), ``lse`` ``[N, H]`` (float32,
        float64 for float64) and the weights ``[|E|, H]`` or ``None``.
    """
    perm = graph.csr.perm
    dtype = _kernel_dtype(q)

    def csr_order(t: Tensor | None) -> Tensor | None:
        if t is None:
            return None
        return (t if perm is None else t[perm]).to(dtype).contiguous()

    qc, kc, vc = (t.to(dtype).contiguous() for t in (q, k, v))
    bc, vbc, eac = csr_order(score_bias), csr_order(value_bias), csr_order(edge_attr)
    h, c, cv = q.shape[1], q.shape[2], v.shape[2]
    eqc = None
    if edge_attr is not None and edge_key is not None:
        wk = edge_key.view(h, c, -1).to(dtype)  # (H, C, F)
        eqc = (torch.einsum("nhc,hcf->nhf", qc, wk) * scale).contiguous()  # (N, H, F)
    if torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (qc, kc, vc, bc, vbc, eac, eqc)
    ):
        # The backward walks the transposed CSR: build it and its plan (once
        # per graph) now, before the forward's activations exist, not in the
        # backward, where its sort would add to the peak memory.
        _plan(graph, kernels.get(q.device), "csc")
    out, lse, eo = _FusedAttention.apply(qc, kc, vc, bc, vbc, eac, eqc, graph, scale, dropout)
    if eo is not None and edge_value is not None:
        wv = edge_value.view(h, cv, -1).to(dtype)  # (H, Cv, F)
        out = out + torch.einsum("nhf,hcf->nhc", eo, wv)  # (N, H, Cv)
    weights = _weights(qc, kc, graph, scale, lse, bc, eac, eqc) if need_weights else None
    return out.to(q.dtype), lse, (weights.to(q.dtype) if weights is not None else None)


@torch.no_grad()
def _weights(
    q: Tensor,
    k: Tensor,
    graph: AttentionGraph,
    scale: float,
    lse: Tensor,
    bias: Tensor | None,
    edge_attr: Tensor | None = None,
    edge_query: Tensor | None = None,
) -> Tensor:
    """The weights ``[|E|, H]`` in ``graph.edge_index`` order, from the saved ``lse``."""
    csr, ref = graph.csr, kernels.reference
    w = ref.attention_weights(
        q, k, csr.ptr, csr.col, scale, lse.to(q.dtype), bias,
        edge_attr=edge_attr, edge_query=edge_query,
    )  # fmt: skip
    # The scores recomputed here and the kernel's log-sum-exp differ by
    # rounding; renormalizing makes every row sum to 1 and keeps each weight
    # <= 1 exactly, as on the other backends.
    index = segment_ids(csr.ptr, csr.col.numel())
    total = ref.segment_sum(w, index, graph.num_dst)
    w = w / torch.where(total == 0, torch.ones_like(total), total)[index]
    if csr.perm is not None:
        w = torch.empty_like(w).index_copy_(0, csr.perm, w)
    return w
