"""Layers on one rank's part of a distributed graph: the graph argument may be a part.

A part (:class:`gnnattn.distributed.GraphPart`, or
:class:`~gnnattn.distributed.SequencePart` for ring attention over a complete
or causal sequence) stands where a layer takes ``edge_index``: the layer
projects its own rows and calls the part's ``attention`` (which exchanges
what other ranks hold) instead of :func:`gnnattn.attention`.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from ..distributed import GraphPart, SequencePart
from ..graphs import AttentionGraph, GraphLike, as_graph
from ..ops import AttentionOutput, BackendChoice, attention, backend_for

__all__ = ["AnyGraph", "Part", "PartLike", "attend", "choose", "graph_or_part"]

#: One rank's part of a graph (partitioned by target) or of a sequence (ring).
Part = GraphPart | SequencePart
#: A whole graph, or one rank's part of one.
AnyGraph = AttentionGraph | Part
#: What layers accept as their graph argument.
PartLike = GraphLike | Part


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
    if not isinstance(edge_index, (GraphPart, SequencePart)):
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
    part_bipartite = isinstance(edge_index, GraphPart) and edge_index.is_bipartite
    if bipartite != part_bipartite:
        raise ValueError(
            f"Expected {'a pair (x_src, x_dst)' if part_bipartite else 'one x'} for "
            f"a part of a {'bipartite' if part_bipartite else 'square'} graph, got "
            f"{'a pair' if bipartite else 'one x'}"
        )
    return edge_index


def attend(
    q: Tensor, k: Tensor, v: Tensor, graph: AnyGraph, **options: Any
) -> Tensor | AttentionOutput:
    """:func:`gnnattn.attention` over a graph, or the part's exchange-and-attend."""
    if isinstance(graph, (GraphPart, SequencePart)):
        return graph.attention(q, k, v, **options)
    return attention(q, k, v, graph, **options)


def choose(q: Tensor, graph: AnyGraph, *, backend: str, **options: Any) -> BackendChoice:
    """:func:`gnnattn.backend_for` of the call :func:`attend` would make, and why.

    A :class:`~gnnattn.distributed.SequencePart` runs the ring; a
    :class:`~gnnattn.distributed.GraphPart` runs :func:`gnnattn.attention` on
    its interior and boundary halves, both bipartite like its local graph, so
    the local graph's choice is theirs.
    """
    if isinstance(graph, SequencePart):
        return BackendChoice("ring", "a SequencePart: blocks passed around the ranks' ring")
    if isinstance(graph, GraphPart):
        graph = graph.graph
    return backend_for(q, graph, backend=backend, **options)
