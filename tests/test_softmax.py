import pytest
import torch
from torch_geometric.utils import softmax as pyg_softmax

import gnnattn.softmax as sm
from gnnattn import naive_scatter_softmax, scatter_softmax

LESSON = [0.00638, 0.04712, 0.94650]


def reference_softmax(src, index, n):
    """Per-segment torch.softmax in float64, one segment at a time."""
    out = torch.zeros_like(src, dtype=torch.float64)
    for i in range(n):
        sel = index == i
        if sel.any():
            seg = src[sel].double()
            p = torch.softmax(seg, dim=0)
            out[sel] = torch.nan_to_num(p, nan=0.0)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_lesson_logits(dtype):
    s = torch.tensor([100.0, 102.0, 105.0], dtype=dtype)
    y = scatter_softmax(s, torch.zeros(3, dtype=torch.long))
    assert y.dtype == dtype
    assert torch.isfinite(y).all()
    # bfloat16 keeps 8 bits of mantissa: 102 and 105 are exact, the weights
    # are within one bfloat16 ulp of 0.9465 (2^-8 ~ 0.004).
    tol = {torch.bfloat16: 4e-3, torch.float16: 5e-4}.get(dtype, 1e-5)
    assert torch.allclose(y.double(), torch.tensor(LESSON, dtype=torch.float64), atol=tol)
    assert abs(y.double().sum().item() - 1.0) < 2 * tol


def test_naive_overflows_in_float16_where_stable_does_not():
    s = torch.tensor([100.0, 102.0, 105.0], dtype=torch.float16)
    idx = torch.zeros(3, dtype=torch.long)
    naive = naive_scatter_softmax(s, idx)
    assert not torch.isfinite(naive).any()
    assert torch.isinf(torch.exp(s)).all()  # exp overflows past ~11.09 in float16
    assert torch.isfinite(scatter_softmax(s, idx)).all()
    # float32's exp overflows past ~88.72, so these logits break it too;
    # float64 (past ~709.78) survives them, and the small logits 0..5 survive
    # naive float16.
    assert not torch.isfinite(naive_scatter_softmax(s.float(), idx)).any()
    assert torch.allclose(
        naive_scatter_softmax(s.double(), idx), torch.tensor(LESSON).double(), atol=1e-5
    )
    small = torch.tensor([0.0, 2.0, 5.0], dtype=torch.float16)
    assert torch.allclose(
        naive_scatter_softmax(small, idx).float(), scatter_softmax(small, idx).float(), atol=1e-3
    )


def test_matches_reference_and_pyg():
    e, n = 300, 37
    index = torch.randint(0, n, (e,))
    src = torch.randn(e, 3, dtype=torch.float64) * 50
    y = scatter_softmax(src, index, n)
    for h in range(3):
        assert torch.allclose(y[:, h], reference_softmax(src[:, h], index, n), atol=1e-12)
    assert torch.allclose(y, pyg_softmax(src, index, num_nodes=n), atol=1e-12)


def test_neg_inf_rules_forward_and_backward():
    src = torch.tensor([0.0, float("-inf"), 1.0, float("-inf"), float("-inf")], requires_grad=True)
    index = torch.tensor([0, 0, 0, 1, 1])
    y = scatter_softmax(src, index, num_segments=3)  # segment 2 is empty
    assert y[1] == 0 and y[3] == 0 and y[4] == 0
    assert torch.allclose(y[[0, 2]], torch.softmax(torch.tensor([0.0, 1.0]), 0))
    (y * torch.arange(5.0)).sum().backward()
    assert torch.isfinite(src.grad).all()
    assert src.grad[1] == 0 and src.grad[3] == 0 and src.grad[4] == 0


def test_backward_formula_matches_autograd():
    e, n = 60, 7
    index = torch.randint(0, n, (e,))
    src = torch.randn(e, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda s: scatter_softmax(s, index, n), (src,))
    # The same gradient as autograd through the plain composition.
    g = torch.randn(e, 2, dtype=torch.float64)
    (scatter_softmax(src, index, n) * g).sum().backward()
    x = src.detach().clone().requires_grad_()
    (pyg_softmax(x, index, num_nodes=n) * g).sum().backward()
    assert torch.allclose(src.grad, x.grad, atol=1e-12)


def test_saves_only_output():
    src = torch.randn(10, requires_grad=True)
    index = torch.zeros(10, dtype=torch.long)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = scatter_softmax(src, index)
    floats = [t for t in saved if t.is_floating_point()]
    assert len(floats) == 1 and torch.equal(floats[0].view(-1), y.detach())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_reduce_in_float32(dtype):
    e, n = 2000, 3
    index = torch.randint(0, n, (e,))
    src = (torch.randn(e) * 4).to(dtype).requires_grad_()
    y = scatter_softmax(src, index, n)
    assert y.dtype == dtype
    ref = reference_softmax(src.detach(), index, n)
    # Each weight is ~1/700 here; one rounding of the float32 result to the
    # half type gives a relative error of 2^-11 (fp16) or 2^-8 (bf16).
    rel = 2**-10 if dtype == torch.float16 else 2**-7
    assert torch.allclose(y.double(), ref, rtol=rel, atol=1e-6)
    # Summing ~700 weights in float16 itself would drift; in float32 it does not.
    sums = torch.zeros(n, dtype=torch.float64).index_add_(0, index, y.double())
    assert torch.allclose(sums, torch.ones(n, dtype=torch.float64), atol=700 * 2**-11)
    y.float().sum().backward()
    assert src.grad.dtype == dtype and torch.isfinite(src.grad).all()


def test_under_autocast():
    src = torch.randn(50)
    index = torch.randint(0, 4, (50,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert scatter_softmax(src, index).dtype == torch.float32
        assert scatter_softmax(src.bfloat16(), index).dtype == torch.bfloat16


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_second_derivatives(dtype):
    """A gradient penalty through the softmax: the second derivative is torch.softmax's
    (float64 exactly; bfloat16 within its rounding: its output is the path a double
    backward takes, where the float32 weights kept for the first one have no graph and
    gave a second derivative off by a third of its size)."""
    g = torch.Generator().manual_seed(0)
    index = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2])
    x0 = torch.randn(9, 2, generator=g, dtype=torch.float64).to(dtype)
    w = torch.randn(9, 2, generator=g, dtype=torch.float64)

    def penalty_grad(f, dt):
        x = x0.to(dt).requires_grad_()
        (gx,) = torch.autograd.grad((f(x) * w.to(dt)).square().sum(), x, create_graph=True)
        return torch.autograd.grad(gx.float().square().sum(), x)[0].double()

    want = penalty_grad(lambda x: reference_softmax(x, index, 3), torch.float64)
    got = penalty_grad(lambda x: scatter_softmax(x, index, 3), dtype)
    # bfloat16: 2^-8 relative per rounding, a few roundings deep.
    tol = 1e-12 if dtype == torch.float64 else 0.02 * want.abs().max().item()
    torch.testing.assert_close(got, want, atol=tol, rtol=0)


def test_dim_argument():
    src = torch.randn(3, 20, dtype=torch.float64)
    index = torch.randint(0, 5, (20,))
    y = scatter_softmax(src, index, 5, dim=1)
    assert torch.allclose(y, scatter_softmax(src.T, index, 5).T)
    assert torch.allclose(y, scatter_softmax(src, index, 5, dim=-1))


def test_kernel_path_equals_torch_path(monkeypatch):
    """The compiled kernel (or its reference) and the torch path agree."""
    monkeypatch.setattr(sm, "_KERNEL_MIN_NUMEL", 0)
    n = 50
    index = torch.sort(torch.randint(0, n, (500,))).values
    src = torch.randn(500, 4, dtype=torch.float64) * 1e3
    src[::7, 1] = float("-inf")
    a = src.clone().requires_grad_()
    b = src.clone().requires_grad_()
    ya = scatter_softmax(a, index, n + 3)  # sorted: kernel path
    yb = sm.segment_softmax(b, index, n + 3)  # no ptr: the torch path
    assert torch.allclose(ya, yb, atol=1e-12)
    g = torch.randn_like(ya)
    (ya * g).sum().backward()
    (yb * g).sum().backward()
    assert torch.allclose(a.grad, b.grad, atol=1e-12)


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda: scatter_softmax([1.0], torch.zeros(1, dtype=torch.long)), TypeError, "'src'"),
        (lambda: scatter_softmax(torch.ones(3), torch.zeros(3)), TypeError, "'index'"),
        (
            lambda: scatter_softmax(
                torch.ones(3, dtype=torch.long), torch.zeros(3, dtype=torch.long)
            ),
            TypeError,
            "'src'",
        ),
        (
            lambda: scatter_softmax(torch.ones(3), torch.zeros(4, dtype=torch.long)),
            ValueError,
            r"'index' of shape \[3\]",
        ),
        (
            lambda: scatter_softmax(torch.ones(3), torch.tensor([0, 5, 1]), 2),
            ValueError,
            "'num_segments'",
        ),
        (lambda: scatter_softmax(torch.ones(3), torch.tensor([0, -1, 1])), ValueError, "'index'"),
        (
            lambda: scatter_softmax(torch.ones(3), torch.zeros(3, dtype=torch.long), dim=2),
            ValueError,
            "'dim'",
        ),
    ],
)
def test_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call()
