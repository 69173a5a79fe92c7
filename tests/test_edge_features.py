"""Edge features: a per-head score bias (and optionally a value term) from edge_attr."""

import pytest
import torch
import torch.nn.functional as F

from gnnattn import SelfAttentionConv, causal_graph, complete_graph, edge_index_to_mask

TOL = 1e-10
N, D, H, ED = 7, 12, 3, 4


def random_graph(n=N, e=25, seed=0):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, e), generator=g).unique(dim=1)
    return ei[:, torch.randperm(ei.shape[1], generator=g)]  # not sorted: tests the CSR perm


def make_layer(edge_value=False, seed=0):
    torch.manual_seed(seed)
    layer = SelfAttentionConv(D, H, edge_dim=ED, edge_value=edge_value).double()
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return layer


def dense_reference(layer, x, ei, edge_attr):
    """Dense attention with the additive float mask B[h, i, j] = (W_E e_ij)^h."""
    n = x.shape[0]
    q = layer.lin_query(x).view(n, H, -1).transpose(0, 1)  # (H, N, C)
    k = layer.lin_key(x).view(n, H, -1).transpose(0, 1)  # (H, N, C)
    v = layer.lin_value(x).view(n, H, -1).transpose(0, 1)  # (H, N, C)
    bias = torch.full((H, n, n), float("-inf"), dtype=x.dtype)
    bias[:, ei[1], ei[0]] = layer.lin_edge(edge_attr).T
    has_any = edge_index_to_mask(ei, n).any(-1)  # (N,)
    bias[:, ~has_any, :] = 0.0  # empty rows: any finite row, zeroed below
    if layer.lin_edge_value is None:
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=layer.scale)
    else:
        p = torch.softmax(q @ k.transpose(1, 2) * layer.scale + bias, dim=-1)  # (H, N, N)
        ev = torch.zeros(H, n, n, layer.head_dim, dtype=x.dtype)  # (H, N_i, N_j, C)
        ev[:, ei[1], ei[0]] = (
            layer.lin_edge_value(edge_attr).view(-1, H, layer.head_dim).transpose(0, 1)
        )
        o = p @ v + torch.einsum("hij,hijc->hic", p, ev)  # (H, N, C)
    o = torch.where(has_any.view(1, n, 1), o, torch.zeros_like(o))
    return layer.lin_out(o.transpose(0, 1).reshape(n, D))


def grads(layer, inputs, out):
    g = torch.randn_like(out, generator=torch.Generator().manual_seed(1))
    return torch.autograd.grad((out * g).sum(), [*inputs, *layer.parameters()])


@pytest.mark.parametrize("edge_value", [False, True])
@pytest.mark.parametrize("graph", ["sparse", "complete"])
def test_edge_features_equal_dense_with_additive_bias(edge_value, graph):
    layer = make_layer(edge_value)
    ei = random_graph() if graph == "sparse" else complete_graph(N)
    x = torch.randn(N, D, dtype=torch.float64, requires_grad=True)
    ea = torch.randn(ei.shape[1], ED, dtype=torch.float64, requires_grad=True)
    ref = dense_reference(layer, x, ei, ea)
    ref_g = grads(layer, (x, ea), ref)
    for backend in ("mp", "auto", "fused"):
        out, (ei_out, alpha) = layer(x, ei, ea, return_attention_weights=True, backend=backend)
        assert torch.equal(ei_out, ei)
        assert alpha.shape == (ei.shape[1], H)
        assert (out - ref).abs().max() < TOL, backend
        for a, b in zip(grads(layer, (x, ea), out), ref_g, strict=True):
            assert (a - b).abs().max() < TOL, backend


def test_edge_bias_changes_the_output_and_alpha_sums_to_one():
    layer = make_layer()
    ei = random_graph()
    x = torch.randn(N, D, dtype=torch.float64)
    ea = torch.randn(ei.shape[1], ED, dtype=torch.float64)
    out, (_, alpha) = layer(x, ei, ea, return_attention_weights=True)
    out0 = layer(x, ei, torch.zeros_like(ea))
    assert (out - out0).abs().max() > 1e-3
    sums = torch.zeros(N, H, dtype=torch.float64).index_add_(0, ei[1], alpha)
    has_in = torch.bincount(ei[1], minlength=N) > 0
    assert torch.allclose(sums[has_in], torch.ones_like(sums[has_in]))


def test_causal_prunes_edge_attr_with_edge_index():
    layer = make_layer()
    layer.causal = True
    x = torch.randn(N, D, dtype=torch.float64)
    ei = complete_graph(N)
    ea = torch.randn(ei.shape[1], ED, dtype=torch.float64)
    keep = ei[0] <= ei[1]
    out, (ei_out, _) = layer(x, ei, ea, return_attention_weights=True)
    assert torch.equal(ei_out, causal_graph(N))
    layer.causal = False
    assert (out - layer(x, ei[:, keep], ea[keep])).abs().max() < TOL


@pytest.mark.parametrize("backend", ["auto", "mp", "fused", "tiles"])
def test_edge_features_under_bfloat16_autocast(backend):
    # The tiles compute in float32 under autocast too (its bfloat16 matrix products
    # against their float32 buffers raised).
    layer = SelfAttentionConv(D, H, edge_dim=ED, edge_value=True)
    ei = random_graph()
    x = torch.randn(N, D)
    ea = torch.randn(ei.shape[1], ED)
    ref, (_, ref_alpha) = layer(x, ei, ea, return_attention_weights=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, (_, alpha) = layer(x, ei, ea, backend=backend, return_attention_weights=True)
    assert out.dtype == torch.bfloat16
    # bfloat16's 8-bit mantissa: about 0.4% per rounding of the projections.
    assert (out.float() - ref).abs().max() < 0.1
    assert (alpha.float() - ref_alpha).abs().max() < 0.05


def test_sdpa_cannot_do_edge_features_and_says_so():
    x = torch.randn(N, D, dtype=torch.float64)
    ei = complete_graph(N)
    ea = torch.randn(ei.shape[1], ED, dtype=torch.float64)
    for edge_value in (False, True):
        layer = make_layer(edge_value=edge_value)
        with pytest.raises(
            ValueError, match="backend=.sdpa. does not take (per-edge score biases|edge features)"
        ):
            layer(x, ei, ea, backend="sdpa")


E = random_graph().shape[1]


@pytest.mark.parametrize(
    "edge_attr, edge_index, match, exc",
    [
        (
            torch.randn(E - 1, ED),
            random_graph(),
            rf"'edge_attr' of shape \[{E}, {ED}\]",
            ValueError,
        ),
        (torch.randn(E, ED + 1), random_graph(), rf"got \[{E}, {ED + 1}\]", ValueError),
        (torch.randn(E), random_graph(), r"edge_attr.view\(-1, 1\)", ValueError),
        (torch.ones(E, ED, dtype=torch.long), random_graph(), "floating dtype", TypeError),
        (torch.randn(E, ED).tolist(), random_graph(), "'edge_attr' to be a Tensor", TypeError),
        (torch.randn(E, ED), None, "explicit 'edge_index' with 'edge_attr'", ValueError),
        (None, random_graph(), r"'edge_attr' of shape \[E, 4\].*got None", ValueError),
        (torch.randn(E, ED, device="meta"), random_graph(), "'edge_attr' on device", ValueError),
    ],
)
def test_bad_edge_attr(edge_attr, edge_index, match, exc):
    layer = SelfAttentionConv(D, H, edge_dim=ED)
    with pytest.raises(exc, match=match):
        layer(torch.randn(N, D), edge_index, edge_attr)


def test_edge_attr_without_edge_dim_and_bad_flags():
    with pytest.raises(ValueError, match="edge_dim=None; build it with"):
        SelfAttentionConv(D, H)(torch.randn(N, D), complete_graph(N), torch.randn(N * N, 2))
    with pytest.raises(ValueError, match="'edge_dim' with edge_value=True"):
        SelfAttentionConv(D, H, edge_value=True)
    with pytest.raises(ValueError, match="'edge_dim' to be a positive int"):
        SelfAttentionConv(D, H, edge_dim=0)
    assert repr(SelfAttentionConv(D, H, edge_dim=ED, edge_value=True)) == (
        "SelfAttentionConv(12, heads=3, edge_dim=4, edge_value=True)"
    )
