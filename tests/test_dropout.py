"""Activation dropout on the counter-based stream (``gnnattn.ops.dropout``,
``gnnattn.nn.Dropout``): the compiled kernel against its torch reference, the
distribution, the gradient and the module contract."""

from __future__ import annotations

import math

import pytest
import torch

from gnnattn.kernels import reference
from gnnattn.kernels.common import Dropout as Key
from gnnattn.nn import Dropout, GraphTransformerLayer
from gnnattn.ops import dropout, relu_dropout

cpu = pytest.importorskip("gnnattn.kernels.cpu")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(0,), (1,), (7, 3), (16385,), (3, 40001)])
def test_kernel_equals_reference_bitwise(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    x = torch.randn(shape, dtype=dtype) * 1e3
    for key in (Key(0.1, 123, 77), Key(0.5, 2**62 + 5, 2**31 - 1)):
        assert torch.equal(cpu.dropout(x, key), reference.dropout(x, key))


def test_kernel_counter_crossing_32_bits() -> None:
    # A counter whose low word wraps inside a block takes the kernel's scalar
    # branch; offsets that large only occur past 2^31 elements, so a key with
    # such an offset stands in for one.
    x = torch.randn(40000, dtype=torch.float64)
    key = Key(0.3, 987654321, 2**32 - 12345)
    assert torch.equal(cpu.dropout(x, key), reference.dropout(x, key))


def test_kernel_same_on_every_thread_count() -> None:
    x = torch.randn(300, 1000)
    key = Key(0.2, 42, 3)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = cpu.dropout(x, key)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, cpu.dropout(x, key))


def test_non_finite_as_in_torch() -> None:
    # Dropped elements are multiplied by 0, as torch's dropout does: a dropped
    # NaN or inf becomes NaN, never a finite 0.
    x = torch.tensor([math.nan, math.inf, -math.inf, 1.0] * 500)
    key = Key(0.5, 1, 0)
    y = cpu.dropout(x, key)
    assert torch.equal(y.isnan(), reference.dropout(x, key).isnan())
    assert y[0::4].isnan().all() and y[1::4].isnan().any() and y[1::4].isinf().any()


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_kept_fraction_within_binomial_bounds(p: float) -> None:
    torch.manual_seed(0)
    n = 200_000
    y = dropout(torch.ones(n), p)
    kept = int((y != 0).sum())
    sd = math.sqrt(n * p * (1 - p))
    assert abs(kept - n * (1 - p)) < 5 * sd  # 5 sigma: fails about once in 1.7M runs
    assert torch.allclose(y[y != 0], torch.tensor(1 / (1 - p)))


def test_same_seed_same_mask_and_gradient_is_the_mask() -> None:
    x = torch.randn(64, 33, dtype=torch.float64, requires_grad=True)
    torch.manual_seed(5)
    a = dropout(x, 0.3)
    torch.manual_seed(5)
    b = dropout(x, 0.3)
    assert torch.equal(a, b)
    torch.manual_seed(6)
    assert not torch.equal(a, dropout(x, 0.3))
    g = torch.randn_like(a)
    a.backward(g)
    assert torch.equal(x.grad, torch.where(a != 0, g * (1 / 0.7), torch.zeros_like(g)))


def test_gradcheck_with_the_key_fixed() -> None:
    x = torch.randn(5, 7, dtype=torch.float64, requires_grad=True)

    def fn(t: torch.Tensor) -> torch.Tensor:
        torch.manual_seed(11)  # each evaluation draws the same key
        return dropout(t, 0.4)

    assert torch.autograd.gradcheck(fn, (x,))


def test_identity_when_off_and_fallbacks() -> None:
    x = torch.randn(10, 4)
    assert dropout(x, 0.5, training=False) is x
    assert dropout(x, 0.0) is x
    # float16 goes to torch's dropout: same contract, its own stream.
    h = dropout(torch.ones(10_000, dtype=torch.float16), 0.5)
    assert h.dtype == torch.float16 and 0.4 < (h != 0).float().mean() < 0.6


@pytest.mark.parametrize("p", [-0.1, 1.5, math.nan])
def test_bad_p(p: float) -> None:
    # torch.nn.Dropout's [0, 1], for the function and the module.
    with pytest.raises(ValueError, match="'p'"):
        dropout(torch.ones(3), p)
    with pytest.raises(ValueError, match="'p'"):
        Dropout(p)
    with pytest.raises(ValueError, match=r"'p' in \[0, 1\], got 1.5"):
        Dropout(1.5)


def test_module_takes_torch_dropouts_arguments() -> None:
    """``p = 1`` (every element dropped, as torch: NaN and inf stay NaN) and ``inplace``."""
    x = torch.tensor([1.0, -2.0, math.nan, math.inf])
    want = torch.nn.Dropout(1.0)(x)
    assert torch.equal(Dropout(1.0)(x).nan_to_num(7.0), want.nan_to_num(7.0))
    assert torch.equal(Dropout(1.0).eval()(x).nan_to_num(7.0), x.nan_to_num(7.0))
    y = torch.randn(1000)
    z = y.clone()
    torch.manual_seed(2)
    out = Dropout(0.5, inplace=True)(z)
    torch.manual_seed(2)
    assert out is z and torch.equal(z, dropout(y, 0.5))
    assert repr(Dropout(0.5, inplace=True)) == repr(torch.nn.Dropout(0.5, inplace=True))
    with pytest.raises(TypeError, match="'inplace'"):
        Dropout(0.5, inplace=1)  # type: ignore[arg-type]


def test_module_is_a_torch_dropout() -> None:
    m = Dropout(0.25)
    assert isinstance(m, torch.nn.Dropout) and repr(m) == repr(torch.nn.Dropout(0.25))
    x = torch.randn(100, 8)
    assert torch.equal(m.eval()(x), x)
    torch.manual_seed(1)
    y = m.train()(x)
    torch.manual_seed(1)
    assert torch.equal(y, dropout(x, 0.25))


def test_graph_transformer_layer_uses_it() -> None:
    layer = GraphTransformerLayer(16, 2, dropout=0.1)
    assert all(isinstance(getattr(layer, n), Dropout) for n in ("dropout", "dropout1", "dropout2"))
    back = GraphTransformerLayer.from_torch(layer.to_torch())
    assert isinstance(back.dropout1, Dropout) and back.dropout1.p == 0.1


# ------------------------------------------------------------------ relu_dropout


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(0,), (1,), (7, 3), (16385,), (3, 40001)])
def test_relu_kernels_equal_reference_bitwise(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    x = torch.randn(shape, dtype=dtype) * 1e3
    g = torch.randn(shape, dtype=dtype)
    for key in (Key(0.1, 123, 77), Key(0.5, 2**62 + 5, 2**31 - 1)):
        y = cpu.relu_dropout(x, key)
        assert torch.equal(y, reference.relu_dropout(x, key))
        # the same mask as dropout after a ReLU
        assert torch.equal(y, cpu.dropout(torch.relu(x), key))
        want = reference.relu_dropout_bwd(y, g, key.scale)
        assert torch.equal(cpu.relu_dropout_bwd(y, g, key.scale), want)


def test_relu_kernel_counter_crossing_32_bits_and_nan() -> None:
    x = torch.randn(40000, dtype=torch.float64)
    x[::7] = math.nan  # a NaN passes the ReLU (torch's rule) and stays NaN when dropped
    key = Key(0.3, 987654321, 2**32 - 12345)
    y = cpu.relu_dropout(x, key)
    want = reference.relu_dropout(x, key)
    assert torch.equal(y.isnan(), want.isnan()) and y[::7].isnan().all()
    fin = ~want.isnan()
    assert torch.equal(y[fin], want[fin])


def test_relu_dropout_equals_dropout_of_relu_forward_and_backward() -> None:
    x = torch.randn(300, 70, dtype=torch.float64)
    x[0, :5] = 0.0  # ReLU's kink: torch's gradient there is 0
    g = torch.randn_like(x)
    res = []
    for fused in (True, False):
        xx = x.clone().requires_grad_()
        torch.manual_seed(7)
        y = relu_dropout(xx, 0.3) if fused else dropout(torch.relu(xx), 0.3)
        y.backward(g)
        res.append((y.detach(), xx.grad))
    assert torch.equal(res[0][0], res[1][0]) and torch.equal(res[0][1], res[1][1])
    assert (res[0][0] == 0).float().mean() > 0.5  # half negative, then 30% dropped


def test_relu_dropout_gradcheck_with_the_key_fixed() -> None:
    x = torch.randn(5, 7, dtype=torch.float64)
    # Away from the kink, where gradcheck's finite step would cross it.
    x = (x + 0.1 * x.sign()).requires_grad_()

    def fn(t: torch.Tensor) -> torch.Tensor:
        torch.manual_seed(11)
        return relu_dropout(t, 0.4)

    assert torch.autograd.gradcheck(fn, (x,))


def test_relu_dropout_off_and_fallbacks() -> None:
    x = torch.randn(10, 4)
    assert torch.equal(relu_dropout(x, 0.5, training=False), torch.relu(x))
    assert torch.equal(relu_dropout(x, 0.0), torch.relu(x))
    h = relu_dropout(torch.ones(10_000, dtype=torch.float16), 0.5)
    assert h.dtype == torch.float16 and 0.4 < (h != 0).float().mean() < 0.6
    with pytest.raises(ValueError, match=r"'p' in \[0, 1\], got 1.5"):
        relu_dropout(x, 1.5)
    # p = 1 drops every element, as F.dropout (PyG's layers take it).
    x.requires_grad_()
    for f in (dropout, relu_dropout):
        y = f(x, 1.0)
        assert torch.equal(y, torch.zeros_like(x))
        (g,) = torch.autograd.grad(y.sum(), x)
        assert torch.equal(g, torch.zeros_like(x))


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_graph_transformer_feed_forward_is_dropout_of_activation(activation: str) -> None:
    # The layer's feed-forward takes relu_dropout for "relu": the same numbers
    # as the unfused dropout(activation(.)).
    torch.manual_seed(0)
    layer = GraphTransformerLayer(16, 2, dropout=0.2, activation=activation).double().train()
    x = torch.randn(40, 16, dtype=torch.float64, requires_grad=True)
    torch.manual_seed(3)
    got = layer._ff(x)
    (gx,) = torch.autograd.grad(got.sum(), x)
    torch.manual_seed(3)
    h = layer.dropout(layer.activation(layer.linear1(x)))
    want = layer.dropout2(layer.linear2(h))
    (wx,) = torch.autograd.grad(want.sum(), x)
    assert torch.equal(got, want) and torch.equal(gx, wx)
