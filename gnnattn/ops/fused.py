"""The ``"fused"`` backend: sparse attention over the graph's CSR, never ``|E| x C``.

The kernels (numba on the CPU, Triton on CUDA, see :mod:`gnnattn.kernels`)
take the destination CSR in the forward and the ``dq`` pass and the
transposed CSR in the ``dk``/``dv`` pass. What they need per graph (the
index tensors in the width the device's kernel takes, the checked and planned
work split of each layout, as tensors) is made once and kept by the graph
(:meth:`~gnnattn.AttentionGraph.kernel_plan`), so a call checks nothing and
plans nothing about the graph: on a GPU it makes no host synchronisation.
The kernels run as the operators of :mod:`gnnattn.kernels.library`, so a
compiled or exported model runs them too.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from .. import kernels
from ..graphs import AttentionGraph
from ..kernels import library
from ..kernels.common import acc_dtype
from .args import AttentionArgs

__all__ = ["edge_weights", "fused_attention"]


def _kernel_dtype(t: Tensor) -> torch.dtype:
    # The CPU kernels compute in the accumulation dtype; the Triton kernels
    # take the half types natively (with float32 accumulation).
    return acc_dtype(t.dtype) if t.device.type == "cpu" else t.dtype


def fused_attention(a: AttentionArgs) -> tuple[Tensor, Tensor, Tensor | None]:
    """The ``"fused"`` backend: one call of ``torch.ops.gnnattn.attention_fwd`` (through
    :func:`gnnattn.kernels.library.attention`, which runs its implementation directly
    in eager mode).

    ``a.score_bias`` ``[|E|, H]`` and ``edge_attr`` ``[|E|, F]`` follow
    ``graph.edge_index``; they are put in CSR order here (a gather that
    autograd undoes). The weights, when asked for, are a softmax of the scores
    recomputed on the edges (:func:`edge_weights`), differentiable, and are those
    before dropout.

    Edge features (see :func:`gnnattn.attention`) by linearity, with no
    ``|E| x (H*C)`` tensor: ``q_i . W_k a_ij = (W_k^T q_i) . a_ij``, so the
    kernel gets the edge query ``scale * W_k^T q_i`` ``[N, H, F]``, and
    ``sum_j P_ij W_v a_ij = W_v sum_j P_ij a_ij``, so ``W_v`` maps the
    kernel's ``edge_out`` ``[N, H, F]``. Both maps are torch ops: autograd
    takes the weights' gradients from the kernel's ``edge_query`` and
    ``edge_out`` gradients. Except on a small sparse graph where one map
    serves keys and values (:func:`_per_head_edges`): there the kernel gets
    ``W a_ij`` per edge and head (``[|E|, H, C]``, one product) with ``q`` as the
    edge query (per-head features are scored with the scale, as keys), and its
    ``edge_out`` is the output's edge term.

    Returns:
        ``out`` ``[N, H, Cv]`` (typed like ``q``), ``lse`` ``[N, H]`` (float32,
        float64 for float64) and the weights ``[|E|, H]`` or ``None``.
    """
    q, k, v, graph, scale = a.q, a.k, a.v, a.graph, a.scale
    edge_attr, edge_key, edge_value = a.edge_attr, a.edge_key, a.edge_value
    perm = graph.csr.perm
    dtype = _kernel_dtype(q)

    def csr_order(t: Tensor | None) -> Tensor | None:
        if t is None:
            return None
        # index_select, not t[perm]: its backward is an index_add, where advanced
        # indexing's is an accumulating index_put (a sort on the CPU).
        return (t if perm is None else t.index_select(0, perm)).to(dtype).contiguous()

    qc, kc, vc = (t.to(dtype).contiguous() for t in (q, k, v))
    bc, eac = csr_order(a.score_bias), csr_order(edge_attr)
    h, c, cv = q.shape[1], q.shape[2], v.shape[2]
    eqc = None
    per_head = eac is not None and _per_head_edges(a)
    if per_head:
        assert eac is not None and edge_key is not None
        # The edge term per edge and head, a_ij W^T (E, H, C): the kernels score
        # per-head features as a key's term, scale * q_i . a_ij W^T, so q itself is
        # the edge query (no scaled copy, forward or backward); the aggregate
        # edge_out is the output's edge term as it is.
        eac = (eac @ edge_key.to(dtype).T).view(eac.shape[0], h, c)  # (E, H, C)
        eqc = qc
    elif edge_attr is not None and edge_key is not None:
        wk = edge_key.view(h, c, -1).to(dtype) * scale  # (H, C, F)
        # A batched matmul over heads (einsum plans its contraction on every call).
        eqc = torch.bmm(qc.transpose(0, 1), wk).transpose(0, 1).contiguous()  # (N, H, F)
    backward = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (qc, kc, vc, bc, eac, eqc)
    )
    ptr, col = graph.kernel_layout("csr")
    # The backward's layout goes in with the forward, so that the op's autograd
    # has it; made now (once per graph), before the forward's activations
    # exist, not in the backward, where its sort would add to the peak memory.
    tptr = trow = tperm = None
    csc_plan = ptr.new_empty(0)
    if backward and _needs_csc(q, v, graph):
        tptr, trow, tperm = graph.kernel_layout("csc")
        csc_plan = graph.kernel_plan("csc")
    out, lse, eo = library.attention(
        qc,
        kc,
        vc,
        ptr,
        col,
        graph.kernel_plan("csr"),
        tptr,
        trow,
        tperm,
        csc_plan,
        bc,
        eac,
        eqc,
        a.dropout_key,
        scale,
        a.dropout_p,
    )
    if per_head:
        out = out + eo  # (N, H, Cv): + sum_j P_ij W a_ij
    elif edge_attr is not None and edge_value is not None:
        wv = edge_value.view(h, cv, -1).to(dtype)  # (H, Cv, F)
        out = out + torch.bmm(eo.transpose(0, 1), wv.transpose(1, 2)).transpose(0, 1)  # (N, H, Cv)
    weights = None
    if a.need_weights:
        # Torch ops on the edges: the weights' gradient (an attention regulariser's)
        # reaches q, k, the bias and the edge maps, as on every backend.
        weights = edge_weights(qc, kc, graph, scale, bc, eac, eqc)
    return out.to(q.dtype), lse, (weights.to(q.dtype) if weights is not None else None)


def _per_head_edges(a: AttentionArgs) -> bool:
    """Whether the edge term goes to the kernels per edge and head (``edge_attr W^T``,
    ``[E, H, C]``) rather than by the algebra: where the device's kernels take it
    (``per_head_edges``: on the CPU, a small sparse graph), keys and values share one map
    (``TransformerConv``'s ``lin_edge``), and not compiled (no guard on the size)."""
    per_head = getattr(kernels.get(a.q.device), "per_head_edges", None)
    if per_head is None or torch.compiler.is_compiling():
        return False
    if a.edge_key is None or a.edge_key is not a.edge_value:
        return False
    return bool(per_head(a.graph.num_edges, a.q.shape[0], a.q.shape[1], a.q.shape[2]))


def _needs_csc(q: Tensor, v: Tensor, graph: AttentionGraph) -> bool:
    """Whether the backward takes the transposed CSR: not where the device's kernels
    do a small graph's source pass over the CSR (``csr_source_pass``: on
    the CPU, a batch of molecules), so that a graph made per step never makes one.

    A compiled call does not compare the graph's size (a guard on it): it passes the
    transposed CSR where the graph holds its plan (:meth:`~AttentionGraph.prepare`),
    and otherwise none, so that the op takes the source pass the eager call would
    take (over the CSR, or over a transposed CSR it makes on a larger graph)."""
    over_csr = getattr(kernels.get(q.device), "csr_source_pass", None)
    if over_csr is None:
        return True
    if torch.compiler.is_compiling():
        return graph.kernel_plan("csc").numel() > 0
    return not over_csr(graph.num_edges, q.shape[1], q.shape[2], v.shape[2])


def edge_weights(
    q: Tensor,
    k: Tensor,
    graph: AttentionGraph,
    scale: float,
    bias: Tensor | None = None,
    edge_attr: Tensor | None = None,
    edge_query: Tensor | None = None,
) -> Tensor:
    """The weights ``[|E|, H]`` in ``graph.edge_index`` order: the softmax of the scores
    recomputed on the edges (``|E| x H`` numbers, whatever the graph's structure),
    differentiable.

    With a gradient to keep, the per-edge products are recomputed in the backward
    (a checkpoint): autograd would otherwise hold the gathered ``q_i`` and ``k_j``,
    two ``|E| x H x C`` tensors, for as long as the weights live, kept for a plot
    or not. Compiled, Inductor's partitioner chooses what to keep instead.
    """
    inputs = (q, k, bias, edge_attr, edge_query)
    keep = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in inputs)
    if keep and not torch.compiler.is_compiling():
        # No random numbers inside: the RNG state need not be saved and restored.
        w = checkpoint(
            _edge_weights, graph, scale, *inputs, use_reentrant=False, preserve_rng_state=False
        )
        assert isinstance(w, Tensor)
        return w
    return _edge_weights(graph, scale, *inputs)


def _edge_weights(
    graph: AttentionGraph,
    scale: float,
    q: Tensor,
    k: Tensor,
    bias: Tensor | None,
    edge_attr: Tensor | None,
    edge_query: Tensor | None,
) -> Tensor:
    csr = graph.csr
    w = kernels.reference.softmax_weights(
        q, k, csr.ptr, csr.col, scale, bias, edge_attr=edge_attr, edge_query=edge_query
    )
    if csr.perm is not None:
        w = torch.empty_like(w).index_copy_(0, csr.perm, w)
    return w
