"""Attention layers (PyG ``MessagePassing`` modules) and the models built from them."""

from .conv import SelfAttentionConv
from .dropout import Dropout
from .gine_conv import GINEConv
from .gps import GPSConv
from .positional import (
    GraphPositionalEncoding,
    LearnedPositionalEncoding,
    SinusoidalPositionalEncoding,
    sequence_positions,
)
from .simplified import SimplifiedAttention
from .transformer import GraphTransformer, GraphTransformerLayer
from .transformer_conv import TransformerConv

__all__ = [
    "Dropout",
    "GINEConv",
    "GPSConv",
    "GraphPositionalEncoding",
    "GraphTransformer",
    "GraphTransformerLayer",
    "LearnedPositionalEncoding",
    "SelfAttentionConv",
    "SimplifiedAttention",
    "SinusoidalPositionalEncoding",
    "TransformerConv",
    "sequence_positions",
]
