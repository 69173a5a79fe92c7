"""Compiled kernels, their pure-torch references, and the operators that call them.

Every kernel module implements the functions of
:mod:`gnnattn.kernels.reference` with the same signatures and results:

* ``plan(ptr, col, num_cols)``: check a CSR once and make its work split;
  ``plan_tensors`` / ``plan_from_tensors`` (compiled modules): the same as
  one int64 tensor, which the graph object keeps and the operators take;
* ``segment_softmax_fwd(src, ptr)`` / ``segment_softmax_bwd(y, grad, ptr)``;
* ``attention_fwd(q, k, v, ptr, col, scale, bias=None, *, dropout=None,
  plan=None) -> (out, lse)``;
* ``attention_bwd(q, k, v, out, lse, grad_out, ptr, col, scale, bias=None, *,
  dropout=None, csc=None, plan=None, csc_plan=None) -> (dq, dk, dv, dbias)``;
* ``BACKWARD_READS_OUTPUT``: whether ``attention_bwd`` reads ``out``.

Raw edge features: two more keyword-only options, ``edge_attr`` ``[E, F]``
(CSR order, read per edge, never gathered) and ``edge_query`` ``[N, H, F]``
(optional: adds ``edge_query_i^h . edge_attr_ij`` to the score, unscaled).
The CPU kernels (and the reference) also take per-head features ``[E, H, F]``
(a key's term, scored with the scale: ``scale edge_query_i^h . edge_attr_ij^h``,
with ``q`` as the edge query; ``dedge_attr`` then per head too), which
the operator makes of a small graph's shared key/value map where the module
has ``per_head_edges``; the Triton kernels take ``[E, F]`` only.
The results grow only when ``edge_attr`` is given:

* ``attention_fwd(..., edge_attr=, edge_query=None) -> (out, lse, edge_out)``
  with ``edge_out`` ``[N, H, F] = sum_j P_ij edge_attr_ij`` (``P`` the
  weights after dropout, those that multiply ``v``);
* ``attention_bwd(..., edge_attr=, edge_query=None, grad_edge_out=None)
  -> (dq, dk, dv, dbias, dedge_attr, dedge_query)`` with ``grad_edge_out``
  the gradient of ``edge_out`` (``None``: zero), ``dedge_attr`` ``[E, F]``
  (summed over heads) and ``dedge_query`` ``[N, H, F]`` (``None`` without
  ``edge_query``).

:mod:`gnnattn.kernels.common` holds the rules they share (accumulation dtype,
index checks, the dropout stream). :mod:`gnnattn.kernels.cpu` compiles them
with numba, the ``triton_*`` modules with Triton for CUDA. Those modules are
imported lazily, by :func:`get`, so that importing gnnattn never compiles
anything and works without numba or triton. :mod:`gnnattn.kernels.library`
registers the entry points as PyTorch operators (``torch.ops.gnnattn.*``),
which is how everything above this package calls them.
"""

from __future__ import annotations

import importlib.util
from types import MappingProxyType, ModuleType

import torch

from . import reference

__all__ = ["COMPILED", "edge_sum", "get", "library", "reference"]

#: The compiled kernel module of each device type, and the package it needs.
_MODULES = MappingProxyType({"cpu": ("cpu", "numba"), "cuda": ("triton_ops", "triton")})

#: The device types with compiled kernels in this environment (their package
#: is installed): found once at import, without importing numba or triton.
COMPILED = frozenset(
    dev for dev, (_, pkg) in _MODULES.items() if importlib.util.find_spec(pkg) is not None
)


def get(device: torch.device) -> ModuleType:
    """The kernel module for ``device``: compiled where possible, else the reference."""
    if device.type not in COMPILED:
        return reference
    # Import statements, not importlib.import_module nor a look in sys.modules: a model
    # compiled before anything imported the kernels traces this first call, and Dynamo
    # skips importlib (a graph break; an error under fullgraph=True or a strict
    # export) and guards on sys.modules (which the import then changes). Once the
    # module is imported, the statement is a lookup of about a microsecond.
    try:
        if device.type == "cpu":
            from . import cpu

            return cpu
        from . import triton_ops

        return triton_ops
    except ImportError:
        # numba / triton missing: the pure-torch reference computes the same.
        return reference


# Registers the operators (torch.ops.gnnattn.*); imports no kernel module.
from . import edge_sum, library  # noqa: E402
