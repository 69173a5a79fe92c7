"""Test fixtures (``TRITON_INTERPRET`` is set in the root ``conftest.py``)."""

import pytest
import torch

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
