"""Cross-attention on bipartite graphs: layer((x_src, x_dst), edge_index)."""

import pytest
import torch

from gnnattn import SelfAttentionConv, complete_bipartite_graph

TOL = 1e-10
D, H = 12, 3


def make_mha(seed=0):
    torch.manual_seed(seed)
    mha = torch.nn.MultiheadAttention(D, H, batch_first=True).double()
    with torch.no_grad():
        for p in mha.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return mha


def grads(out, inputs, params):
    g = torch.randn_like(out, generator=torch.Generator().manual_seed(1))
    return torch.autograd.grad((out * g).sum(), [*inputs, *params])


@pytest.mark.parametrize("m, n", [(7, 3), (3, 7), (5, 5), (1, 4)])
def test_complete_bipartite_equals_mha_cross_attention(m, n):
    mha = make_mha()
    layer = SelfAttentionConv.from_torch(mha)
    x_src = torch.randn(m, D, dtype=torch.float64, requires_grad=True)
    x_dst = torch.randn(n, D, dtype=torch.float64, requires_grad=True)
    ref, ref_w = mha(x_dst[None], x_src[None], x_src[None], average_attn_weights=False)
    ref, ref_w = ref[0], ref_w[0]  # (N, D), (H, N, M)
    ref_g = grads(ref, (x_src, x_dst), mha.parameters())
    ei = complete_bipartite_graph(m, n)
    # Unsorted edges: the CSR of a graph with M != N sources must sort by (dst, src).
    perm = torch.randperm(ei.shape[1])
    for backend in ("mp", "fused", "auto"):
        for edges in (None, ei, ei[:, perm]):
            out, (ei_out, alpha) = layer(
                (x_src, x_dst), edges, return_attention_weights=True, backend=backend
            )
            assert out.shape == (n, D)
            assert (out - ref).abs().max() < TOL, backend
            assert (alpha - ref_w[:, ei_out[1], ei_out[0]].T).abs().max() < TOL, backend
        g = grads(out, (x_src, x_dst), layer.parameters())
        wq, bq, wk, bk, wv, bv, wo, bo = g[2:]
        # MHA keeps W_Q, W_K, W_V stacked in one in_proj matrix.
        mine = [g[0], g[1], torch.cat([wq, wk, wv]), torch.cat([bq, bk, bv]), wo, bo]
        for a, b in zip(mine, ref_g, strict=True):
            assert (a - b).abs().max() < TOL, backend


def test_sparse_bipartite_equals_masked_mha():
    m, n = 9, 4
    mha = make_mha()
    layer = SelfAttentionConv.from_torch(mha)
    g = torch.Generator().manual_seed(0)
    mask = torch.rand(n, m, generator=g) < 0.4  # mask[i, j]: target i attends to source j
    mask[:, 0] = True  # no empty rows, which MHA would turn into NaN
    i, j = mask.nonzero(as_tuple=True)
    ei = torch.stack([j, i])
    x_src = torch.randn(m, D, dtype=torch.float64)
    x_dst = torch.randn(n, D, dtype=torch.float64)
    ref = mha(x_dst[None], x_src[None], x_src[None], attn_mask=~mask)[0][0]
    for backend in ("mp", "fused"):
        assert (layer((x_src, x_dst), ei, backend=backend) - ref).abs().max() < TOL


def test_bipartite_with_edge_features_and_isolated_targets():
    layer = SelfAttentionConv(D, H, edge_dim=2).double()
    x_src = torch.randn(6, D, dtype=torch.float64)
    x_dst = torch.randn(3, D, dtype=torch.float64)
    ei = torch.tensor([[5, 0, 3, 2], [0, 0, 2, 2]])  # target 1 receives nothing
    ea = torch.randn(4, 2, dtype=torch.float64)
    outs = []
    for backend in ("mp", "fused"):
        outs.append(layer((x_src, x_dst), ei, ea, backend=backend))
    assert (outs[0] - outs[1]).abs().max() < TOL
    assert torch.allclose(outs[0][1], layer.lin_out.bias)


@pytest.mark.parametrize(
    "x, edge_index, kwargs, exc, match",
    [
        (
            (torch.randn(4, D), torch.randn(2, D)),
            torch.tensor([[4], [0]]),
            {},
            ValueError,
            r"source ids .* below the number of nodes 4, got 4",
        ),
        (
            (torch.randn(4, D), torch.randn(2, D)),
            torch.tensor([[3], [2]]),
            {},
            ValueError,
            r"target ids .* below the number of nodes 2, got 2",
        ),
        (
            (torch.randn(4, D), torch.randn(2, D + 1)),
            None,
            {},
            ValueError,
            r"'x\[1\]' of shape \[N, 12\], got \[2, 13\]",
        ),
        ((torch.randn(4, D),), None, {}, ValueError, "pair \\(x_src, x_dst\\), got a tuple"),
        (
            (torch.randn(4, D), torch.randn(2, D).double()),
            None,
            {},
            TypeError,
            "'x\\[0\\]' and 'x\\[1\\]' of one dtype",
        ),
        (
            (torch.randn(4, D), torch.randn(2, D)),
            None,
            {"batch": torch.zeros(2, dtype=torch.long)},
            ValueError,
            "no 'batch' with a pair",
        ),
    ],
)
def test_bad_bipartite_input(x, edge_index, kwargs, exc, match):
    layer = SelfAttentionConv(D, H)
    with pytest.raises(exc, match=match):
        layer(x, edge_index, **kwargs)


def test_bipartite_refuses_causal_and_dense():
    x = (torch.randn(4, D), torch.randn(2, D))
    with pytest.raises(ValueError, match="single 'x' with causal=True"):
        SelfAttentionConv(D, H, causal=True)(x)
    with pytest.raises(ValueError, match="backend='sdpa' does not do cross-attention"):
        SelfAttentionConv(D, H, backend="sdpa")(x)
