"""Graphs for attention: the builders, validation, structure, CSR layouts and the graph object.

Everything gnnattn knows about an edge set lives here; the operator and the
layers only ask the :class:`AttentionGraph` they are given.

* :mod:`.builders`: complete, causal, sliding-window, bipartite and batched
  edge sets (plain ``[2, |E|]`` tensors) and dense-mask conversions;
* :mod:`.validate`: checks of ``edge_index`` and ``batch``;
* :mod:`.csr`: the destination CSR and the transposed CSR;
* :mod:`.structure`: complete / causal / window detection;
* :mod:`.inputs`: the edge-set forms a graph is built from;
* :mod:`.graph`: :class:`AttentionGraph`, held by the caller;
* :mod:`.resolve`: :func:`as_graph`, the graph of a layer call;
* :mod:`.reorder`: node orders that keep neighbours close in memory, and the
  tile fill they give;
* :mod:`.patterns`: dilated-window and BigBird graphs (graph objects that
  carry their :class:`Pattern`).
"""

from .builders import (
    causal_graph,
    complete_bipartite_graph,
    complete_graph,
    edge_index_to_mask,
    mask_to_edge_index,
    sequence_lengths,
    sliding_window_graph,
    structured_edge_index,
)
from .csr import CSC, CSR, is_sorted_by_target, segment_ids, sort_by_target, to_csr, transpose_csr
from .global_graphs import (
    EDGE_KINDS,
    ComposedGraph,
    GraphComposition,
    expander_graph,
    exphormer_graph,
    with_virtual_nodes,
)
from .graph import AttentionGraph
from .patterns import PATTERN_KEY, Pattern, bigbird_graph, dilated_window_graph, pattern_of
from .reorder import Reordering, permute, reorder, tile_fill
from .resolve import GraphLike, as_graph, refuse_jit_trace
from .structure import KINDS, Structure, detect_structure
from .validate import check_batch, check_edge_index, check_edge_index_static

__all__ = [
    "CSC",
    "CSR",
    "EDGE_KINDS",
    "KINDS",
    "PATTERN_KEY",
    "AttentionGraph",
    "ComposedGraph",
    "GraphComposition",
    "Pattern",
    "Reordering",
    "GraphLike",
    "Structure",
    "as_graph",
    "bigbird_graph",
    "causal_graph",
    "check_batch",
    "check_edge_index",
    "check_edge_index_static",
    "complete_bipartite_graph",
    "complete_graph",
    "detect_structure",
    "dilated_window_graph",
    "edge_index_to_mask",
    "expander_graph",
    "exphormer_graph",
    "is_sorted_by_target",
    "mask_to_edge_index",
    "pattern_of",
    "permute",
    "refuse_jit_trace",
    "reorder",
    "segment_ids",
    "sequence_lengths",
    "sliding_window_graph",
    "sort_by_target",
    "structured_edge_index",
    "tile_fill",
    "to_csr",
    "transpose_csr",
    "with_virtual_nodes",
]
