"""Compiled kernels and their pure-torch references.

Every kernel module implements the functions of
:mod:`gnnattn.kernels.reference` with the same signatures and results:

* ``plan(ptr, col, num_cols)``: check a CSR once and make its work split;
  the result is passed back as ``plan=`` (the graph object keeps it);
* ``segment_softmax_fwd(src, ptr)`` / ``segment_softmax_bwd(y, grad, ptr)``;
* ``attention_fwd(q, k, v, ptr, col, scale, bias=None, *, value_bias=None,
  dropout=None, plan=None) -> (out, lse)``;
* ``attention_bwd(q, k, v, out, lse, grad_out, ptr, col, scale, bias=None, *,
  value_bias=None, dropout=None, csc=None, plan=None, csc_plan=None)
  -> (dq, dk, dv, dbias, dvalue_bias)``.

:mod:`gnnattn.kernels.common` holds the rules they share (accumulation dtype,
index checks, the dropout stream). :mod:`gnnattn.kernels.cpu` compiles them
with numba, the ``triton_*`` modules with Triton for CUDA. Those modules are
imported lazily, by :func:`get`, so that importing gnnattn never compiles
anything and works without numba or triton.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import torch

from . import reference

__all__ = ["get", "reference"]


def get(device: torch.device) -> ModuleType:
    """The kernel module for ``device``: compiled where possible, else the reference."""
    name = {"cuda": "triton_ops", "cpu": "cpu"}.get(device.type)
    if name is None:
        return reference
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ImportError:
        # numba / triton missing: the pure-torch reference computes the same.
        return reference
