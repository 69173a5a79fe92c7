"""Layers on one rank's part of a distributed graph: the graph argument may be a part.

A part (:class:`gnnattn.distributed.GraphPart`) stands where a layer takes
``edge_index``: the layer projects its own rows and calls the part's
``attention`` (which exchanges the halo) instead of :func:`gnnattn.attention`.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from ..distributed import GraphPart
from ..graphs import AttentionGraph, GraphLike, as_graph
from ..ops import AttentionOutput, attention

__all__ = ["AnyGraph", "PartLike", "attend", "graph_or_part"]

#: A whole graph, or one rank's part of one.
AnyGraph = AttentionGraph | GraphPart
#: What layers accept as their graph argument.
PartLike = GraphLike | GraphPart


def graph_or_part(
    edge_index: PartLike | None,
    *,
    num_src: int,
    num_dst: int,
    device: Any,
    batch: Tensor | None = None,
    causal: bool = False,
    bipartite: bool = False,
) -> AnyGraph:
    """:func:`~gnnattn.graphs.as_graph`, or the part itself (its rows are checked by its
    ``attention``)."""
    if not isinstance(edge_index, GraphPart):
        return as_graph(
            edge_index,
            num_src=num_src,
            num_dst=num_dst,
            device=device,
            batch=batch,
            causal=causal,
            bipartite=bipartite,
        )
    if batch is not None:
        raise ValueError(
            "Expected no 'batch' with a graph part (its graph is fixed by the partition), got one"
        )
    if causal and not edge_index.causal:
        raise ValueError(
            "Expected a part of a causal graph for a causal layer (partition(..., "
            "causal=True) prunes the edges once, globally), got a part of a non-causal one"
        )
    if bipartite != edge_index.is_bipartite:
        raise ValueError(
            f"Expected {'a pair (x_src, x_dst)' if edge_index.is_bipartite else 'one x'} for "
            f"a part of a {'bipartite' if edge_index.is_bipartite else 'square'} graph, got "
            f"{'a pair' if bipartite else 'one x'}"
        )
    return edge_index


def attend(
    q: Tensor, k: Tensor, v: Tensor, graph: AnyGraph, **options: Any
) -> Tensor | AttentionOutput:
    """:func:`gnnattn.attention` over a graph, or the part's exchange-and-attend."""
    if isinstance(graph, GraphPart):
        return graph.attention(q, k, v, **options)
    return attention(q, k, v, graph, **options)
