"""Attention layers (PyG ``MessagePassing`` modules)."""

from .conv import SelfAttentionConv
from .simplified import SimplifiedAttention

__all__ = ["SelfAttentionConv", "SimplifiedAttention"]
