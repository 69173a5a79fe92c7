"""gnnattn: transformer self-attention as message passing over a graph.

A sequence is a complete directed graph with self-loops, causal masking prunes
it to a DAG, and any sparse edge set is just another graph. See the README for
the conventions (``edge_index[0]`` is the source j, ``edge_index[1]`` the
target i; softmax runs over each target's incoming edges).
"""

from . import _pyg  # noqa: F401  (first: PyG without its import-time warning)
from .dense import dense_attention_weights, dense_self_attention, dense_simplified_attention
from .graphs import (
    CSR,
    AttentionGraph,
    ComposedGraph,
    GraphComposition,
    Structure,
    bigbird_graph,
    causal_graph,
    complete_bipartite_graph,
    complete_graph,
    dilated_window_graph,
    edge_index_to_mask,
    expander_graph,
    exphormer_graph,
    mask_to_edge_index,
    permute,
    reorder,
    sliding_window_graph,
    tile_fill,
    to_csr,
    with_virtual_nodes,
)
from .nn import (
    GINEConv,
    GPSConv,
    GraphPositionalEncoding,
    GraphTransformer,
    GraphTransformerLayer,
    LearnedPositionalEncoding,
    SelfAttentionConv,
    SimplifiedAttention,
    SinusoidalPositionalEncoding,
    TransformerConv,
    sequence_positions,
)
from .ops import AttentionOutput, BackendChoice, attention, backend_for
from .softmax import naive_scatter_softmax, scatter_softmax

__version__ = "0.1.0"

__all__ = [
    "AttentionGraph",
    "AttentionOutput",
    "BackendChoice",
    "attention",
    "backend_for",
    "CSR",
    "ComposedGraph",
    "GraphComposition",
    "Structure",
    "GINEConv",
    "GPSConv",
    "GraphPositionalEncoding",
    "GraphTransformer",
    "GraphTransformerLayer",
    "LearnedPositionalEncoding",
    "SinusoidalPositionalEncoding",
    "complete_bipartite_graph",
    "sequence_positions",
    "SelfAttentionConv",
    "SimplifiedAttention",
    "TransformerConv",
    "bigbird_graph",
    "causal_graph",
    "complete_graph",
    "dense_attention_weights",
    "dense_self_attention",
    "dense_simplified_attention",
    "dilated_window_graph",
    "edge_index_to_mask",
    "expander_graph",
    "exphormer_graph",
    "mask_to_edge_index",
    "naive_scatter_softmax",
    "permute",
    "reorder",
    "scatter_softmax",
    "sliding_window_graph",
    "tile_fill",
    "to_csr",
    "with_virtual_nodes",
]
