r"""Attention bias: one additive score per edge and head of the attention graph.

Graph transformers bias attention with what they know about a pair of nodes:
a shortest-path distance (Graphormer), a random-walk structural encoding of
the pair, the kind of an edge of a composed graph
(:attr:`gnnattn.graphs.GraphComposition.edge_kind`). The layers take it as
``attn_bias`` ``[|E|, H]``, in the order of their attention graph's
``edge_index``, and the operator adds it to the scores:

.. math::
    \alpha_{ij}^h = \operatorname{softmax}_{j \in \mathcal{N}(i)}
        \left(\text{scale}\,\langle q_i^h, k_j^h\rangle + b_{ij}^h\right)

It runs on the fused kernels (SDPA takes no score bias, so ``"auto"`` picks
``"fused"``) and on the message-passing reference (`PyG#9511
<https://github.com/pyg-team/pytorch_geometric/issues/9511>`_ asks the same of
PyG's ``GPSConv``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..checks import check_tensor

__all__ = ["check_attn_bias"]


def check_attn_bias(
    attn_bias: Any, graph: Any, heads: int, device: torch.device, name: str = "attn_bias"
) -> Tensor:
    """``attn_bias`` checked against the attention graph and the heads: ``[|E|, H]``
    floating on ``device``, its rows those of ``graph``'s edges (a causal layer's
    graph takes the rows of the edges before pruning too, and keeps its own).

    Example:
        >>> from gnnattn import AttentionGraph
        >>> g = AttentionGraph(torch.tensor([[0, 1], [1, 0]]))
        >>> check_attn_bias(torch.zeros(2, 4), g, 4, torch.device("cpu")).shape
        torch.Size([2, 4])
        >>> check_attn_bias(torch.zeros(2), g, 4, torch.device("cpu"))
        Traceback (most recent call last):
        ...
        ValueError: Expected 'attn_bias' of shape [2, 4] (one score per edge of the attention graph, in its edge_index order, and head), got [2]
    """  # noqa: E501
    b = check_tensor(attn_bias, name)
    if b.dim() != 2 or b.shape[1] != heads:
        raise ValueError(
            f"Expected '{name}' of shape [{graph.num_edges}, {heads}] (one score per edge of the "
            f"attention graph, in its edge_index order, and head), got {list(b.shape)}"
        )
    if not b.is_floating_point():
        raise TypeError(f"Expected '{name}' of a floating dtype, got {b.dtype}")
    if b.device != device:
        raise ValueError(f"Expected '{name}' on device {device} (the device of x), got {b.device}")
    return graph.select_edges(b, name)
