"""Pytest setup shared by the tests and the docstring examples.

The Triton kernels are exercised on the CPU through Triton's interpreter when
there is no GPU. ``TRITON_INTERPRET`` has to be set before any ``@triton.jit``
function is defined, that is before ``gnnattn.kernels.triton_*`` is imported
(by a test or by doctest collection), so it is set here, first of all.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

import gnnattn  # noqa: E402


@pytest.fixture(autouse=True)
def _doctest_names(doctest_namespace: dict) -> None:
    # The docstring examples use torch and gnnattn's public names bare.
    doctest_namespace["torch"] = torch
    for name in gnnattn.__all__:
        doctest_namespace[name] = getattr(gnnattn, name)
