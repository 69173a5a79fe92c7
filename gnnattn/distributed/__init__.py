"""One graph across many processes: attention partitioned over ``torch.distributed`` ranks.

Layers (lowest first): ``graphs`` and ``kernels`` < ``ops`` < ``distributed`` < ``nn``.
A *part* is what one rank holds of a graph; a layer called on it
(``layer(x_local, part)``) calls ``part.attention(q, k, v, ...)`` with its
local rows instead of :func:`gnnattn.attention`, and the part exchanges what
the other ranks need.

- :func:`partition` splits a graph by target (METIS, contiguous, random) into
  :class:`GraphPart` objects, one per rank, with the halo exchange planned once.
- :class:`SequencePart` is the part of a complete or causal sequence (ring
  attention: the graph is never built).
- :func:`all_reduce_gradients` sums the replicated parameters' gradients.
"""

from .part import GraphPart
from .partition import METHODS, Partition, partition
from .ring import SequencePart, ring_attention, sequence_shard
from .training import all_reduce_gradients, broadcast_parameters

__all__ = [
    "METHODS",
    "GraphPart",
    "Partition",
    "SequencePart",
    "all_reduce_gradients",
    "broadcast_parameters",
    "partition",
    "ring_attention",
    "sequence_shard",
]
