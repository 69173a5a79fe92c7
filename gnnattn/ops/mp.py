r"""The ``"mp"`` backend: attention as PyG message passing, the reference.

.. math::
    s_{ij} = \text{scale}\; q_i \cdot k_j + b_{ij}, \qquad
    \alpha_{ij} = \operatorname{softmax}_{j \in \mathcal{N}(i)} s_{ij}, \qquad
    o_i = \sum_{j \in \mathcal{N}(i)} \alpha_{ij} m_{ij} \,(v_j + e_{ij})

with the dropout factor :math:`m_{ij}` (0, or :math:`1/(1-p)` where the
stream keeps the edge) and the edge features' value term
:math:`e_{ij} = W_v a_{ij}`. Every other backend is tested equal to this
one. It materialises ``|E| x C`` tensors (the gathered keys, values and
messages), as PyG's ``TransformerConv`` does.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor
from torch_geometric.nn import MessagePassing

from ..graphs import AttentionGraph
from ..kernels import reference
from ..kernels.common import acc_dtype
from ..softmax import segment_softmax
from .args import AttentionArgs

__all__ = ["PROPAGATE", "MessagePassingAttention", "dropout_mask", "mp_attention"]


class MessagePassingAttention(MessagePassing):
    """Scores on the edges (:meth:`edge_update`), weighted messages (:meth:`message`).

    Has no parameters, buffers or per-call state: it is the formulation, not
    data. One instance, :data:`PROPAGATE`, serves every call (building a
    ``MessagePassing`` inspects its signatures, which is slow next to a
    small call and cannot be traced by ``torch.compile``).
    """

    # The arguments of edge_updater / propagate, declared: PyG otherwise reads
    # them from the calls in the class's forward, and this class has none.
    edge_updater_type = {
        "query": Tensor,
        "key": Tensor,
        "score_bias": Optional[Tensor],  # noqa: UP045 - PyG reads these hints at runtime
        "key_bias": Optional[Tensor],  # noqa: UP045
        "scale": float,
    }
    propagate_type = {"value": Tensor, "alpha": Tensor, "value_bias": Optional[Tensor]}  # noqa: UP045

    def __init__(self) -> None:
        super().__init__(aggr="add", node_dim=0)

    def edge_update(  # type: ignore[override]
        self,
        query_i: Tensor,
        key_j: Tensor,
        score_bias: Tensor | None,
        key_bias: Tensor | None,
        scale: float,
    ) -> Tensor:
        if key_bias is not None:
            key_j = key_j + key_bias  # (E, H, C): PyG's k_j + W_k a_ij
        # The dot products in the accumulation dtype, as every kernel has them: a
        # float16 product overflows past 65504, where a float32 one does not.
        acc = acc_dtype(query_i.dtype)
        score = (query_i.to(acc) * key_j.to(acc)).sum(dim=-1) * scale  # (E, H)
        return score + score_bias if score_bias is not None else score

    def message(  # type: ignore[override]
        self, value_j: Tensor, alpha: Tensor, value_bias: Tensor | None
    ) -> Tensor:
        if value_bias is not None:
            value_j = value_j + value_bias  # (E, H, Cv)
        return value_j * alpha.unsqueeze(-1)  # (E, H, Cv)


#: The one instance every call of the ``"mp"`` backend uses (stateless, see above).
PROPAGATE = MessagePassingAttention()


def dropout_mask(graph: AttentionGraph, key: Tensor, p: float, num_heads: int) -> Tensor:
    """The ``[|E|, H]`` kept mask of the stream keyed by ``key`` (``[seed, offset]``, see
    :func:`gnnattn.kernels.library.draw_key`), in ``graph.edge_index`` order.

    The stream is indexed by destination-CSR position (see
    :mod:`gnnattn.kernels.common`), so every backend drops the same edges. The
    hash runs as one operator (``torch.ops.gnnattn.dropout_bits``).
    """
    counter = torch.arange(graph.num_edges * num_heads, device=graph.device)
    bits = torch.ops.gnnattn.dropout_bits(counter, key)
    keep = (bits >= int(round(p * (1 << 24)))).view(graph.num_edges, num_heads)  # (E, H)
    perm = graph.csr.perm
    if perm is None:
        return keep
    return torch.empty_like(keep).index_copy_(0, perm, keep)


def mp_attention(a: AttentionArgs) -> tuple[Tensor, Tensor | None, Tensor]:
    """The ``"mp"`` backend: ``(out [N, H, Cv], lse [N, H] or None, alpha [|E|, H])``.

    ``alpha`` are the weights before dropout, in ``graph.edge_index`` order.
    Edge features are applied the direct way, as PyG's ``TransformerConv``
    does (the reference the fused path's algebra is tested against): the
    keys ``k_j + W_k a_ij`` and values ``v_j + W_v a_ij`` per edge.
    """
    q, k, v, graph = a.q, a.k, a.v, a.graph
    edge_attr, edge_key, edge_value = a.edge_attr, a.edge_key, a.edge_value
    mp = PROPAGATE
    edge_index = graph.edge_index
    size = (k.shape[0], q.shape[0])
    h = q.shape[1]
    key_bias = value_bias = None
    # The edge terms in the keys' and values' dtype, the score bias in the scores'
    # (as the kernels take them): the results keep q's dtype whatever these come in.
    if edge_attr is not None and edge_key is not None:
        key_bias = (edge_attr.to(k.dtype) @ edge_key.to(k.dtype).T).view(-1, h, q.shape[2])
    if edge_attr is not None and edge_value is not None:
        value_bias = (edge_attr.to(v.dtype) @ edge_value.to(v.dtype).T).view(-1, h, v.shape[2])
    bias = a.score_bias.to(acc_dtype(q.dtype)) if a.score_bias is not None else None
    score = mp.edge_updater(
        edge_index,
        query=q,
        key=k,
        score_bias=bias,
        key_bias=key_bias,
        scale=a.scale,
        size=size,
    )
    n = q.shape[0]
    index = edge_index[1]
    # Edges in target order (the builders' and PyG's sorted order): the CSR
    # pointers are the graph's, and the compiled segment softmax can run.
    ptr = graph.csr.ptr if graph.csr.perm is None else None
    alpha = segment_softmax(score, index, n, ptr=ptr)  # (E, H)
    # The scores, the weights and the log-sum-exp are in the accumulation dtype (a
    # half lse would round the log-sum-exp to 3 digits); the messages in v's.
    lse = reference.segment_logsumexp(score, index, n) if a.return_lse else None
    kept = alpha
    if a.dropout_key is not None:
        keep = dropout_mask(graph, a.dropout_key, a.dropout_p, h)
        kept = alpha * keep.to(alpha.dtype) * (1.0 / (1.0 - a.dropout_p))  # (E, H)
    out = mp.propagate(
        edge_index, value=v, alpha=kept.to(v.dtype), value_bias=value_bias, size=size
    )
    return out, lse, alpha.to(q.dtype)
