r"""The ``"tiles"`` backend: attention as batched matrix products on the graph's tiles.

For graphs with locality (windows, dilated and BigBird patterns, batches of
small graphs, kNN graphs of points in a locality-preserving order) the
targets of a row window share most of their sources, so a window's scores are
one dense tile :math:`Q_w K_w^\top` of the window's queries against its
sources' keys, with the slots of absent edges masked: matrix-product speed
where the CSR kernels (:mod:`.fused`) take one dot product per edge. The
tiles come from the graph's block plan (:func:`gnnattn.graphs.blocks.block_plan`,
made once and kept by the graph); the kernel is
:func:`gnnattn.kernels.tiles.tile_attention` (torch operations only: every
device, ``torch.compile``), or on CUDA in eager mode the Triton kernels of
:mod:`gnnattn.kernels.triton_tiles` (one program per window and head, no
score tile in memory) where the call needs neither the weights nor the
edge features' value term.

Every option of the operator:

* ``score_bias`` is scattered into the slots of its edges;
* attention dropout draws the stream of the CSR kernels at each edge's CSR
  position (the mask of :func:`gnnattn.ops.dropout_mask`, hashed by the
  compiled activation-dropout kernel), so the same key drops the same edges
  as ``"fused"`` and ``"mp"``;
* edge features by the algebra of :mod:`.fused`: the key term
  :math:`\text{scale}\; q_i \cdot W_k a_{ij} = a_{ij} \cdot (\text{scale}\,
  W_k^\top q_i)` is a score bias, and the value term
  :math:`\sum_j P_{ij} W_v a_{ij} = W_v \sum_j P_{ij} a_{ij}` an aggregate of
  the edge features by the kernel's weights (an output with a gradient);
* cross-attention: the rows index ``q``, the columns ``k`` and ``v``.

:func:`gnnattn.attention` sends inputs that are not finite (or whose scores
may overflow) to ``"fused"``, which keeps the non-finite rules for them.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..graphs import AttentionGraph
from ..graphs.blocks import block_plan
from ..kernels import COMPILED
from ..kernels.common import acc_dtype
from ..kernels.tiles import tile_attention
from .args import AttentionArgs

__all__ = ["tiles_attention"]


def _not_finite(bias: Tensor) -> bool:
    """Whether a score bias holds a value that is not finite (``-inf`` may leave a row
    without a finite score, NaN and ``+inf`` make its maximum NaN or infinite: the
    kernel then applies the contract's rules explicitly). Assumed inside
    ``torch.compile``, where the flag cannot be read."""
    if torch.compiler.is_compiling():
        return True
    return not bool(torch.isfinite(bias).all())


def _dropout_factor(graph: AttentionGraph, key: Tensor, p: float, h: int, like: Tensor) -> Tensor:
    """``keep / (1 - p)`` per edge and head ``[|E|, H]``, in ``graph.edge_index`` order.

    The stream's counter of an edge and head is ``e H + h`` with ``e`` the edge's
    CSR position: the activation dropout op (:func:`gnnattn.ops.dropout`'s, the
    compiled kernel of the device) applied to ones ``[|E|, H]`` in CSR order
    draws exactly the attention kernels' mask, hashed in compiled code rather than
    in int64 torch ops (at a million edges and 8 heads, a second).
    """
    ones = torch.ones(graph.num_edges, h, dtype=like.dtype, device=like.device)
    factor = torch.ops.gnnattn.dropout(ones, key, p)  # (E, H), CSR order
    perm = graph.csr.perm
    return factor if perm is None else torch.empty_like(factor).index_copy_(0, perm, factor)


def _on_triton(q: Tensor) -> bool:
    """Whether the call runs the Triton tile kernels (:mod:`gnnattn.kernels.triton_tiles`):
    on CUDA with triton installed, in eager mode (compiled, the torch kernel runs, which
    Inductor traces)."""
    return (
        q.device.type == "cuda"
        and "cuda" in COMPILED
        and not torch.compiler.is_compiling()
        and not torch.jit.is_tracing()
    )


def tiles_attention(a: AttentionArgs) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """The ``"tiles"`` backend: ``(out [N, H, Cv], lse [N, H] or None, weights [|E|, H] or
    None)``.

    Computes in the accumulation dtype (float64 for float64, float32
    otherwise), under autocast too; the weights are those before dropout, in
    ``graph.edge_index`` order, gathered from the tiles, differentiable.
    """
    if torch.is_autocast_enabled(a.q.device.type):
        # Autocast would run the tiles' matrix products in its lower dtype, against
        # buffers made in the accumulation dtype (the fused kernels compute in it too).
        with torch.autocast(a.q.device.type, enabled=False):
            return _tiles_attention(a)
    return _tiles_attention(a)


def _tiles_attention(a: AttentionArgs) -> tuple[Tensor, Tensor | None, Tensor | None]:
    q, k, v, graph, scale = a.q, a.k, a.v, a.graph, a.scale
    edge_attr, edge_key, edge_value = a.edge_attr, a.edge_key, a.edge_value
    dtype = acc_dtype(q.dtype)
    if q.shape[1] == 0:
        # No head, nothing to tile (the kernels' views divide by H): empty results,
        # in the autograd graph of q, k and v as the other backends' are.
        link = (q.sum() + k.sum() + v.sum()) * 0
        out = v.new_zeros(q.shape[0], 0, v.shape[2]) + link
        lse = q.new_zeros(q.shape[0], 0, dtype=dtype) + link if a.return_lse else None
        weights = q.new_zeros(graph.num_edges, 0) + link if a.need_weights else None
        return out, lse, weights
    plan = block_plan(graph)
    qc, kc, vc = (t.to(dtype) for t in (q, k, v))
    h, c, cv = q.shape[1], q.shape[2], v.shape[2]
    bias = a.score_bias.to(dtype) if a.score_bias is not None else None
    ea = edge_attr.to(dtype) if edge_attr is not None else None
    dst = graph.edge_index[1] if ea is not None else None
    if ea is not None and edge_key is not None:
        assert dst is not None
        wk = edge_key.view(h, c, -1).to(dtype) * scale  # (H, C, F)
        eq = torch.bmm(qc.transpose(0, 1), wk).transpose(0, 1)  # (N, H, F)
        # a_ij . (scale W_k^T q_i): one bias per edge and head.
        eb = torch.bmm(eq.index_select(0, dst), ea.unsqueeze(-1)).squeeze(-1)  # (E, H)
        bias = eb if bias is None else bias + eb
    factor = None
    if a.dropout_key is not None:
        factor = _dropout_factor(graph, a.dropout_key, a.dropout_p, h, qc)
    value_term = ea is not None and edge_value is not None
    if _on_triton(q) and not (a.need_weights or value_term):
        from ..kernels.triton_tiles import tile_attention_triton  # imports triton

        res = tile_attention_triton(q, k, v, plan, scale, bias, factor)
        return res[0], (res[1] if a.return_lse else None), None
    out, lse, alpha = tile_attention(
        qc,
        kc,
        vc,
        plan,
        scale,
        bias,
        factor,
        need_alpha=a.need_weights or value_term,
        need_lse=a.return_lse,
        guard=bias is not None and _not_finite(bias),
    )
    if value_term:
        assert alpha is not None and ea is not None and dst is not None and edge_value is not None
        kept = alpha if factor is None else alpha * factor  # (E, H)
        # sum_j P_ij a_ij per target and head, then W_v once per target.
        eo = qc.new_zeros(q.shape[0], h, ea.shape[1]).index_add_(
            0, dst, kept.unsqueeze(-1) * ea.unsqueeze(1)
        )  # (N, H, F)
        wv = edge_value.view(h, cv, -1).to(dtype)  # (H, Cv, F)
        out = out + torch.bmm(eo.transpose(0, 1), wv.transpose(1, 2)).transpose(0, 1)
    # The tiles' weights are differentiable (their gradient goes into the tiles' backward).
    weights = alpha.to(q.dtype) if a.need_weights and alpha is not None else None
    return out.to(q.dtype), lse, weights
