"""The numba CPU kernels against their pure-torch references, on awkward sizes."""

import pytest
import torch

from gnnattn.kernels import cpu
from gnnattn.kernels import reference as ref

# float64: both compute the same sums in other orders, so only rounding
# differs. float32: reassociated dot products of length C and sums of up to
# 5000 exponentials, relative error ~ sqrt(terms) * 2^-24 < 1e-5; but a score
# of magnitude L is only known to ~L * 2^-24 absolute, and exp turns that into
# a relative error of the weights, so float32 tolerances grow with L (1e3
# logits: scores of several hundred).
TOL = {torch.float64: 1e-10, torch.float32: 1e-5}


def csr_of(deg):
    deg = torch.as_tensor(deg, dtype=torch.long)
    ptr = torch.zeros(deg.numel() + 1, dtype=torch.long)
    torch.cumsum(deg, 0, out=ptr[1:])
    return ptr


CASES = {
    "ragged": ([3, 0, 1, 17, 5, 0, 2, 9, 11], 13),  # isolated targets, M != N
    "one node": ([1], 1),
    "no edges": ([0, 0, 0], 4),
    "hub": ([5000, 1, 2, 3, 0, 7], 40),  # one target with 5000 in-edges
    "bipartite": ([4, 4, 4], 101),
}


def make(case, dtype, heads=3, c=5, cv=7, scale_logits=1.0, seed=0):
    deg, m = CASES[case]
    g = torch.Generator().manual_seed(seed)
    ptr = csr_of(deg)
    n, e = len(deg), int(ptr[-1])
    col = torch.randint(0, m, (e,), generator=g)
    if e > 4:
        col[1] = col[0]  # a duplicate edge
    q = torch.randn(n, heads, c, generator=g, dtype=dtype) * scale_logits
    k = torch.randn(m, heads, c, generator=g, dtype=dtype)
    v = torch.randn(m, heads, cv, generator=g, dtype=dtype)
    return q, k, v, ptr, col


def close(a, b, dtype, logit=0.0):
    scale = max(1.0, float(b.abs().max())) if b.numel() else 1.0
    tol = TOL[dtype] * (1.0 + (logit if dtype == torch.float32 else 0.0))
    return a.shape == b.shape and bool(((a - b).abs() <= tol * scale).all())


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("logits", [1.0, 1e3])
def test_attention_matches_reference(dtype, case, with_bias, logits):
    q, k, v, ptr, col = make(case, dtype, scale_logits=logits)
    bias = None
    if with_bias:
        bias = torch.randn(col.numel(), q.shape[1], dtype=dtype)
        bias[::4, 0] = float("-inf")  # masked edges, and all -inf targets
    out, lse = cpu.attention_fwd(q, k, v, ptr, col, 0.3, bias)
    out_r, lse_r = ref.attention_fwd(q, k, v, ptr, col, 0.3, bias)
    scores = ref.attention_scores(q, k, ptr, col, 0.3)
    logit = float(scores.abs().max()) if scores.numel() else 0.0
    assert close(out, out_r, dtype, logit)
    assert torch.equal(torch.isinf(lse), torch.isinf(lse_r))
    fin = torch.isfinite(lse_r)
    assert close(lse[fin], lse_r[fin], dtype, logit)
    g = torch.randn_like(out)
    got = cpu.attention_bwd(q, k, v, out, lse, g, ptr, col, 0.3, bias)
    want = ref.attention_bwd(q, k, v, out_r, lse_r, g, ptr, col, 0.3, bias)
    for a, b in zip(got, want, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            assert torch.isfinite(a).all()
            assert close(a, b, dtype, logit)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("case", list(CASES))
def test_segment_softmax_matches_reference(dtype, case):
    _, _, _, ptr, col = make(case, dtype)
    src = torch.randn(col.numel(), 4, dtype=dtype) * 1e3
    src[::3, 1] = float("-inf")
    if col.numel():
        src[ptr[0] : ptr[1], 2] = float("-inf")  # a whole segment at -inf
    y = cpu.segment_softmax_fwd(src, ptr)
    assert close(y, ref.segment_softmax_fwd(src, ptr), dtype)
    g = torch.randn_like(y)
    assert close(cpu.segment_softmax_bwd(y, g, ptr), ref.segment_softmax_bwd(y, g, ptr), dtype)


def test_half_inputs_come_back_in_their_dtype():
    q, k, v, ptr, col = make("ragged", torch.float32)
    out, lse = cpu.attention_fwd(q.bfloat16(), k.bfloat16(), v.bfloat16(), ptr, col, 0.5)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    src = torch.randn(col.numel(), 2).half()
    assert cpu.segment_softmax_fwd(src, ptr).dtype == torch.float16


def test_reference_backward_is_autograd_of_reference_forward():
    q, k, v, ptr, col = make("ragged", torch.float64, heads=2, c=3, cv=2)
    bias = torch.randn(col.numel(), 2, dtype=torch.float64)
    args = [t.clone().requires_grad_() for t in (q, k, v, bias)]
    out, lse = ref.attention_fwd(*args[:3], ptr, col, 0.7, args[3])
    g = torch.randn_like(out)
    auto = torch.autograd.grad((out * g).sum(), args)
    mine = ref.attention_bwd(q, k, v, out.detach(), lse.detach(), g, ptr, col, 0.7, bias)
    for a, b in zip(auto, mine, strict=True):
        assert torch.allclose(a, b, atol=1e-12)


def test_transposed_csr_is_cached_per_graph():
    _, _, _, ptr, col = make("ragged", torch.float64)
    a = cpu._transposes.get(ptr, col, 13)
    assert cpu._transposes.get(ptr, col, 13) is a
    col2 = col.clone()
    assert cpu._transposes.get(ptr, col2, 13) is not a
