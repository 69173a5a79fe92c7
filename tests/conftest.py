"""Shared test setup.

The Triton kernels are exercised on the CPU through Triton's interpreter when
there is no GPU; ``TRITON_INTERPRET`` has to be set before any ``@triton.jit``
function is defined, that is before ``gnnattn.kernels.triton_*`` is imported,
so it is set here, at collection time.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
