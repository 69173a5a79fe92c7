"""The attention operator and its backends.

* :func:`attention` (:mod:`.operator`): the one operator every layer calls;
* :func:`backend_for` (:mod:`.choice`): which backend a call takes, and why,
  from the backends' :data:`DECLARATIONS`;
* the backends: :mod:`.mp` (PyG message passing, the reference),
  :mod:`.sdpa` (dense SDPA for structured graphs), :mod:`.fused` (the sparse
  kernels of :mod:`gnnattn.kernels`), :mod:`.tiles` (batched matrix products
  on the tiles of the graph's block plan);
* :func:`dropout`, :func:`relu_dropout` (:mod:`.activation_dropout`):
  activation dropout by the kernels' counter-based stream.

Everything about the graph (its structure, its CSR and transposed CSR, the
kernels' plans) comes from the graph object, built once by its owner; nothing
here caches.
"""

from .activation_dropout import dropout, relu_dropout
from .choice import BACKENDS, DECLARATIONS, BackendChoice, Declaration, backend_for, check_backend
from .mp import MessagePassingAttention, dropout_mask
from .operator import AttentionOutput, attention

__all__ = [
    "BACKENDS",
    "AttentionOutput",
    "BackendChoice",
    "DECLARATIONS",
    "Declaration",
    "MessagePassingAttention",
    "attention",
    "backend_for",
    "check_backend",
    "dropout",
    "dropout_mask",
    "relu_dropout",
]
