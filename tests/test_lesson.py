"""The worked numbers of the lesson (SPEC section 7), in float32, float16 and bfloat16."""

import pytest
import torch

from gnnattn import SimplifiedAttention, complete_graph, scatter_softmax

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
def test_dot_products(dtype):
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=dtype)
    omega = x @ x.T
    assert omega[0, 2] == 1  # omega_13
    assert omega[0, 1] == 0  # omega_12
    v = torch.tensor([2.0, 1.0], dtype=dtype)
    assert v @ v == 5


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_rows_are_softmax_of_dot_products(dtype):
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=dtype)
    z, (ei, alpha) = SimplifiedAttention()(x, return_attention_weights=True)
    assert ei.shape == (2, 9) and alpha.dtype == dtype and z.dtype == dtype
    ref = torch.softmax((x.double() @ x.double().T), dim=1)
    tol = 1e-6 if dtype == torch.float32 else 1e-2  # half types keep 11 / 8 bits
    assert torch.allclose(alpha.double(), ref[ei[1], ei[0]], atol=tol)
    assert (alpha > 0).all()
    sums = torch.zeros(3, dtype=torch.float64).index_add_(0, ei[1], alpha.double())
    assert torch.allclose(sums, torch.ones(3, dtype=torch.float64), atol=tol)
    assert torch.allclose(z.double(), ref @ x.double(), atol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_stable_softmax_trace(dtype):
    s = torch.tensor([100.0, 102.0, 105.0], dtype=dtype)
    m = s.max()
    shifted = s - m
    assert shifted.tolist() == [-5.0, -3.0, 0.0]
    assert (torch.exp(shifted.float()) <= 1).all()
    y = scatter_softmax(s, torch.zeros(3, dtype=torch.long))
    tol = {torch.float32: 1e-5, torch.float16: 5e-4, torch.bfloat16: 4e-3}[dtype]
    assert torch.allclose(y.double(), torch.tensor([0.00638, 0.04712, 0.94650]).double(), atol=tol)


def test_complete_graph_on_four_tokens_has_sixteen_edges():
    assert complete_graph(4).shape[1] == 16
