"""PyG, imported once before the rest of the package, without its import-time warning.

torch 2.15 deprecates ``torch.jit.script`` with a ``FutureWarning``, which
Python shows by default, and ``torch_geometric`` calls it while it imports
(torch 2.13 raised a ``DeprecationWarning``, hidden outside ``__main__``).
Every ``import gnnattn`` and every ``gnnattn`` command would print it, with
nothing for the user to change. Only that message is hidden, and only during
this import; PyG's other warnings, and later calls, still show.
"""

import warnings

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=r"`torch\.jit\.script` is deprecated")
    import torch_geometric  # noqa: F401
