"""Property-based checks on random graphs (hypothesis)."""

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gnnattn import SelfAttentionConv, SimplifiedAttention, scatter_softmax

# derandomize, as in test_nonfinite: every run checks the same examples, in one
# process or spread over xdist's workers.
SETTINGS = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)


@st.composite
def graphs(draw, max_nodes=8, max_edges=30):
    n = draw(st.integers(1, max_nodes))
    e = draw(st.integers(0, max_edges))
    src = draw(st.lists(st.integers(0, n - 1), min_size=e, max_size=e))
    dst = draw(st.lists(st.integers(0, n - 1), min_size=e, max_size=e))
    seed = draw(st.integers(0, 2**16))
    scale = draw(st.sampled_from([1.0, 1e3]))
    return n, torch.tensor([src, dst], dtype=torch.long).view(2, e), seed, scale


def per_target_sums(alpha, dst, n):
    return torch.zeros(n, *alpha.shape[1:], dtype=alpha.dtype).index_add_(0, dst, alpha)


@SETTINGS
@given(graphs(), st.sampled_from([1, 3]))
def test_scatter_softmax_is_a_distribution(g, heads):
    n, ei, seed, scale = g
    gen = torch.Generator().manual_seed(seed)
    src = torch.randn(ei.shape[1], heads, generator=gen, dtype=torch.float64) * scale
    # Some -inf scores: they must get weight exactly 0.
    ninf = torch.rand(ei.shape[1], heads, generator=gen) < 0.2
    src = src.masked_fill(ninf, float("-inf"))
    y = scatter_softmax(src, ei[1], n)
    assert torch.isfinite(y).all()
    assert ((y >= 0) & (y <= 1)).all()
    assert (y[ninf] == 0).all()
    sums = per_target_sums(y, ei[1], n)
    has_finite = per_target_sums((~ninf).double(), ei[1], n) > 0
    assert torch.allclose(sums[has_finite], torch.ones_like(sums[has_finite]), atol=1e-12)
    assert (sums[~has_finite] == 0).all()  # empty or all -inf targets: all zeros
    # Gradients stay finite, including through all -inf segments.
    x = src.clone().requires_grad_()
    (scatter_softmax(x, ei[1], n) * torch.randn_like(src, generator=gen)).sum().backward()
    assert torch.isfinite(x.grad).all()


@SETTINGS
@given(graphs(), st.sampled_from(["mp", "fused"]))
def test_layer_is_edge_permutation_invariant(g, backend):
    n, ei, seed, scale = g
    torch.manual_seed(seed)
    layer = SelfAttentionConv(6, num_heads=2, backend=backend).double()
    x = torch.randn(n, 6, dtype=torch.float64) * scale**0.5
    out, (_, alpha) = layer(x, ei, return_attention_weights=True)
    perm = torch.randperm(ei.shape[1])
    out_p, (ei_p, alpha_p) = layer(x, ei[:, perm], return_attention_weights=True)
    assert torch.isfinite(out).all()
    assert torch.allclose(out, out_p, atol=1e-9)
    assert torch.equal(ei_p, ei[:, perm])
    assert torch.allclose(alpha[perm], alpha_p, atol=1e-12)
    assert ((alpha >= 0) & (alpha <= 1)).all()
    sums = per_target_sums(alpha, ei[1], n)
    has_in = torch.bincount(ei[1], minlength=n) > 0
    assert torch.allclose(sums[has_in], torch.ones_like(sums[has_in]), atol=1e-12)
    # A target without incoming edges gets the output bias only.
    assert torch.allclose(out[~has_in], layer.lin_out.bias.expand(int((~has_in).sum()), -1))


@SETTINGS
@given(graphs())
def test_backends_agree_on_random_graphs(g):
    n, ei, seed, scale = g
    torch.manual_seed(seed)
    x = torch.randn(n, 4, dtype=torch.float64) * scale**0.5
    outs = [SimplifiedAttention(backend=b)(x, ei) for b in ("mp", "fused")]
    assert torch.isfinite(outs[0]).all()
    assert torch.allclose(outs[0], outs[1], atol=1e-9 * max(1.0, float(x.abs().max())))
