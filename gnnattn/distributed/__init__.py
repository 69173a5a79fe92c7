"""One graph across many processes: attention partitioned over ``torch.distributed`` ranks.

Layers (lowest first): ``graphs`` and ``kernels`` < ``ops`` < ``distributed`` < ``nn``.
A *part* is what one rank holds of a graph; a layer called on it
(``layer(x_local, part)``) calls ``part.attention(q, k, v, ...)`` with its
local rows instead of :func:`gnnattn.attention`, and the part exchanges what
the other ranks need. :class:`SequencePart` is the part of a complete or
causal sequence (ring attention: the graph is never built).
"""

from .ring import SequencePart, ring_attention, sequence_shard

__all__: list[str] = ["SequencePart", "ring_attention", "sequence_shard"]
