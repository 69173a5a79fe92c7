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
* :mod:`.reorder`: node orders that keep neighbours close in memory.
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
from .graph import AttentionGraph
from .reorder import Reordering, permute, reorder
from .resolve import GraphLike, as_graph
from .structure import KINDS, Structure, detect_structure
from .validate import check_batch, check_edge_index, check_edge_index_static

__all__ = [
    "CSC",
    "CSR",
    "KINDS",
    "AttentionGraph",
    "Reordering",
    "GraphLike",
    "Structure",
    "as_graph",
    "causal_graph",
    "check_batch",
    "check_edge_index",
    "check_edge_index_static",
    "complete_bipartite_graph",
    "complete_graph",
    "detect_structure",
    "edge_index_to_mask",
    "is_sorted_by_target",
    "mask_to_edge_index",
    "permute",
    "reorder",
    "segment_ids",
    "sequence_lengths",
    "sliding_window_graph",
    "sort_by_target",
    "structured_edge_index",
    "to_csr",
    "transpose_csr",
]
