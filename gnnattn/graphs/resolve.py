"""The graph a layer attends over, from its call arguments (``edge_index``, ``batch``, ``x``).

A plain ``edge_index`` given to a layer is wrapped in a fresh graph on every
call: validated (one pass over the edges), and analysed when a backend needs
it (the structure detection is a few passes over the edges; a sparse graph's
CSR is a sort). Build the graph object once to pay that once.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..checks import check_tensor
from ..kernels.common import outside_func_transforms, plain_index
from .builders import sequence_lengths
from .graph import AttentionGraph
from .inputs import own_sizes
from .validate import check_batch, check_edge_index_static

__all__ = ["GraphLike", "as_graph", "refuse_jit_trace"]

#: What layers accept as a graph.
GraphLike = AttentionGraph | Tensor


def refuse_jit_trace() -> None:
    """Raise under ``torch.jit.trace`` where a layer would build its graph from the call:
    the node count is traced as a tensor, and the graph's checks and layouts would be
    recorded as constants of the traced sizes (a trace that silently fits one graph)."""
    if torch.jit.is_tracing():
        raise RuntimeError(
            "gnnattn's attention layers cannot build their graph under torch.jit.trace "
            "(TorchScript): use torch.export or torch.compile (docs/compile.md), or pass "
            "an AttentionGraph built outside the traced function"
        )


def as_graph(
    graph: GraphLike | None,
    *,
    num_src: int,
    num_dst: int,
    device: torch.device,
    batch: Tensor | None = None,
    causal: bool = False,
    bipartite: bool = False,
) -> AttentionGraph:
    """The graph a layer attends over, from its call arguments.

    ``graph`` may be an :class:`AttentionGraph` (checked against ``x``, used as
    is; with ``causal`` its :meth:`~AttentionGraph.causal_view`), any edge set
    :class:`AttentionGraph` takes (wrapped afresh: validated, pruned, analysed
    on this call only), or ``None``: the complete (``causal``: causal) graph,
    one per sequence of ``batch``, or the complete bipartite graph.
    """
    if not isinstance(graph, AttentionGraph):
        refuse_jit_trace()
    if graph is not None and batch is not None:
        raise ValueError(
            "Expected either 'edge_index' or 'batch', got both: 'batch' builds one complete "
            "(or causal) graph per sequence, 'edge_index' gives the graph itself"
        )
    if bipartite and causal:
        raise ValueError(
            "Expected a single 'x' with causal=True (causal order relates tokens of one "
            "sequence), got a pair (x_src, x_dst); for cross-attention use causal=False "
            "and give the cross-attention graph as edge_index"
        )
    if bipartite and batch is not None:
        raise ValueError(
            "Expected no 'batch' with a pair (x_src, x_dst): 'batch' builds square graphs; "
            "pass the cross-attention graph as 'edge_index'"
        )
    if graph is None:
        if bipartite:
            return AttentionGraph.bipartite(num_src, num_dst, device=device)
        if batch is not None:
            if torch.compiler.is_compiling():
                raise ValueError(
                    "Expected the graph of 'batch' to be built outside torch.compile (its "
                    "sequence lengths are read on the host): pass "
                    "AttentionGraph.from_batch(batch).prepare() as edge_index instead"
                )
            # Validated once (one pass and one sync), then only its lengths are kept.
            with outside_func_transforms():
                b = check_batch(plain_index(batch, "batch"), num_dst, device=device)
                lengths = sequence_lengths(b)
            build = AttentionGraph.causal if causal else AttentionGraph.complete
            return build(lengths=list(lengths), device=device)
        build = AttentionGraph.causal if causal else AttentionGraph.complete
        return build(num_dst, device=device)
    if not isinstance(graph, AttentionGraph):
        t = check_tensor(graph, "edge_index")
        if t.layout == torch.strided and not torch.compiler.is_compiling():
            check_edge_index_static(t, device=device)
        elif t.device != device:
            raise ValueError(
                f"Expected 'edge_index' on device {device} (the device of x), got {t.device}"
            )
        sizes = own_sizes(t)
        if sizes is not None:
            # An adjacency or EdgeIndex knows its sizes: built with them, then
            # checked against x below, so that the message is about x.
            graph = AttentionGraph(t, num_src=sizes[0] if bipartite else None, causal=causal)
        else:
            src = num_src if bipartite else None
            graph = AttentionGraph(t, num_dst, num_src=src, causal=causal)
    graph.check_nodes(num_src, num_dst, device)
    return graph.causal_view() if causal else graph
