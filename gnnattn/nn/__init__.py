"""Attention layers (PyG ``MessagePassing`` modules) and the models built from them."""

from .conv import SelfAttentionConv, complete_bipartite_graph
from .simplified import SimplifiedAttention

__all__ = ["SelfAttentionConv", "SimplifiedAttention", "complete_bipartite_graph"]
