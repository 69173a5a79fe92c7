"""Graph attention == dense attention, for every backend, forward and backward."""

import math

import pytest
import torch

from gnnattn import (
    AttentionGraph,
    GraphTransformerLayer,
    SelfAttentionConv,
    SimplifiedAttention,
    causal_graph,
    complete_graph,
    dense_attention_weights,
    dense_self_attention,
    dense_simplified_attention,
    edge_index_to_mask,
    sliding_window_graph,
)
from gnnattn.graphs import Structure

TOL = 1e-10  # float64 throughout: only summation order differs between paths.
N = 9
LENGTHS = [3, 1, 5]


def random_sparse(n, e, seed=0):
    g = torch.Generator().manual_seed(seed)
    # unique(): a dense mask cannot express duplicate edges.
    return torch.randint(0, n, (2, e), generator=g).unique(dim=1)


def graphs():
    batch = torch.repeat_interleave(torch.arange(3), torch.tensor(LENGTHS))
    return {
        "complete": (complete_graph(N), None),
        "causal": (causal_graph(N), None),
        "window": (sliding_window_graph(N, window=2), None),
        "causal_window": (sliding_window_graph(N, window=3, causal=True), None),
        "sparse": (random_sparse(N, 30), None),
        "batch_complete": (complete_graph(batch=batch), batch),
        "batch_causal": (causal_graph(batch=batch), batch),
    }


def backends_for(name):
    # "sdpa" needs a structure it can express; random graphs have none.
    return ["mp", "fused"] + ([] if name == "sparse" else ["sdpa", "auto"])


def make_layer(seed=0, heads=3, dim=12, **kw):
    torch.manual_seed(seed)
    layer = SelfAttentionConv(dim, num_heads=heads, **kw).double()
    with torch.no_grad():  # non-zero biases, so that bias handling is tested
        for p in layer.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return layer


def grads(module, x, out):
    g = torch.randn_like(out, generator=torch.Generator().manual_seed(1))
    params = [x, *module.parameters()]
    return torch.autograd.grad((out * g).sum(), params)


@pytest.mark.parametrize("name", list(graphs()))
def test_self_attention_conv_equals_dense(name):
    ei, _ = graphs()[name]
    layer = make_layer()
    x = torch.randn(N, 12, dtype=torch.float64, requires_grad=True)
    mask = edge_index_to_mask(ei, N)
    ref = dense_self_attention(layer, x, mask)
    ref_grads = grads(layer, x, ref)
    ref_w = dense_attention_weights(layer, x, mask)  # (H, N, N)
    for backend in backends_for(name):
        out, (ei_out, alpha) = layer(x, ei, return_attention_weights=True, backend=backend)
        assert torch.equal(ei_out, ei)
        assert (out - ref).abs().max() < TOL, backend
        assert (alpha - ref_w[:, ei[1], ei[0]].T).abs().max() < TOL, backend
        for a, b in zip(grads(layer, x, out), ref_grads, strict=True):
            assert (a - b).abs().max() < TOL, backend


@pytest.mark.parametrize("name", list(graphs()))
def test_simplified_attention_equals_dense(name):
    ei, _ = graphs()[name]
    x = torch.randn(N, 5, dtype=torch.float64, requires_grad=True)
    mask = edge_index_to_mask(ei, N)
    ref, ref_w = dense_simplified_attention(x, mask, scale=0.7, return_weights=True)
    (ref_g,) = torch.autograd.grad(ref.pow(2).sum(), x)
    for backend in backends_for(name):
        attn = SimplifiedAttention(0.7, backend=backend)
        z, (_, alpha) = attn(x, ei, return_attention_weights=True)
        assert alpha.shape == (ei.shape[1],)
        assert (z - ref).abs().max() < TOL, backend
        assert (alpha - ref_w[ei[1], ei[0]]).abs().max() < TOL, backend
        (g,) = torch.autograd.grad(z.pow(2).sum(), x)
        assert (g - ref_g).abs().max() < TOL, backend


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("backend", ["mp", "sdpa", "fused", "auto"])
def test_implicit_graphs_and_batch(causal, backend):
    layer = make_layer(causal=causal, backend=backend)
    x = torch.randn(N, 12, dtype=torch.float64)
    builder = causal_graph if causal else complete_graph
    assert (layer(x) - dense_self_attention(layer, x, is_causal=causal)).abs().max() < TOL
    batch = torch.repeat_interleave(torch.arange(3), torch.tensor(LENGTHS))
    mask = edge_index_to_mask(builder(batch=batch), N)
    out = layer(x, batch=batch)
    assert (out - dense_self_attention(layer, x, mask)).abs().max() < TOL
    # Each sequence alone gives the same rows.
    start = 0
    for t in LENGTHS:
        alone = layer(x[start : start + t])
        assert (out[start : start + t] - alone).abs().max() < TOL
        start += t


def test_causal_prunes_explicit_edge_index():
    layer = make_layer()
    layer.causal = True
    x = torch.randn(N, 12, dtype=torch.float64)
    out, (ei, _) = layer(x, complete_graph(N), return_attention_weights=True)
    assert torch.equal(ei, causal_graph(N))
    assert (out - dense_self_attention(layer, x, is_causal=True)).abs().max() < TOL


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("causal", [False, True])
def test_from_torch_equals_mha(bias, causal):
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(16, 4, bias=bias, batch_first=True).double()
    with torch.no_grad():
        for p in mha.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    x = torch.randn(1, 11, 16, dtype=torch.float64)
    attn_mask = torch.ones(11, 11, dtype=torch.bool).triu(1) if causal else None
    ref, ref_w = mha(x, x, x, attn_mask=attn_mask, average_attn_weights=False)
    layer = SelfAttentionConv.from_torch(mha, causal=causal)
    assert layer.lin_query.weight.dtype == torch.float64
    for backend in ("mp", "sdpa", "fused"):
        out, (ei, alpha) = layer(x[0], return_attention_weights=True, backend=backend)
        assert (out - ref[0]).abs().max() < TOL
        assert (alpha - ref_w[0][:, ei[1], ei[0]].T).abs().max() < TOL
    back = layer.to_torch()
    for a, b in zip(back.state_dict().values(), mha.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert (back(x, x, x, attn_mask=attn_mask)[0] - ref).abs().max() == 0


def test_isolated_targets_get_output_bias():
    layer = make_layer()
    x = torch.randn(4, 12, dtype=torch.float64, requires_grad=True)
    ei = torch.tensor([[0, 1], [1, 1]])  # only node 1 receives messages
    for backend in ("mp", "fused"):
        out = layer(x, ei, backend=backend)
        for i in (0, 2, 3):
            assert torch.allclose(out[i], layer.lin_out.bias)
        g = torch.autograd.grad(out.sum(), x)[0]
        assert torch.isfinite(g).all()


def test_empty_graph_and_single_node():
    layer = make_layer()
    x = torch.randn(3, 12, dtype=torch.float64)
    empty = torch.zeros(2, 0, dtype=torch.long)
    for backend in ("mp", "fused"):
        out, (_, alpha) = layer(x, empty, return_attention_weights=True, backend=backend)
        assert alpha.shape == (0, 3)
        assert torch.allclose(out, layer.lin_out.bias.expand(3, -1))
    one = torch.randn(1, 12, dtype=torch.float64)
    # One token attends only to itself: the output is W_O v + b_O.
    expected = layer.lin_out(layer.lin_value(one))
    assert (layer(one) - expected).abs().max() < TOL


def test_dropout_applies_in_training_only():
    layer = SelfAttentionConv(8, num_heads=2, dropout=0.5)
    x = torch.randn(6, 8)
    layer.eval()
    assert torch.equal(layer(x), layer(x))
    layer.train()
    layer_graph = AttentionGraph(random_sparse(6, 10), 6)
    # Attention dropout runs on the fused kernels (it used to need "mp").
    assert layer.backend_for(x, layer_graph).backend == "fused"
    assert layer_graph.structure is None
    torch.manual_seed(0)
    a = layer(x, random_sparse(6, 20))
    torch.manual_seed(1)
    b = layer(x, random_sparse(6, 20))
    assert not torch.allclose(a, b)
    # Weights are returned before dropout: they still sum to 1 per target.
    _, (ei, alpha) = layer(x, complete_graph(6), return_attention_weights=True)
    sums = torch.zeros(6, 2).index_add_(0, ei[1], alpha)
    assert torch.allclose(sums, torch.ones(6, 2), atol=1e-6)


def test_structure_detected_from_explicit_edge_index():
    def structure(ei):
        return AttentionGraph(ei, N).structure

    batch = torch.repeat_interleave(torch.arange(3), torch.tensor(LENGTHS))
    assert structure(complete_graph(N)) == Structure("complete", (N,))
    assert structure(causal_graph(N)) == Structure("causal", (N,))
    assert structure(complete_graph(batch=batch)) == Structure("complete", tuple(LENGTHS))
    assert structure(causal_graph(batch=batch)) == Structure("causal", tuple(LENGTHS))
    assert structure(sliding_window_graph(N, window=2)) == Structure("window", (N,), 2)
    s = structure(sliding_window_graph(N, window=2, causal=True))
    assert s == Structure("causal_window", (N,), 2)
    # Shuffled edges: same structure. Duplicates or a missing edge: none.
    ei = complete_graph(N)
    assert structure(ei[:, torch.randperm(ei.shape[1])]) == Structure("complete", (N,))
    assert structure(torch.cat([ei, ei[:, :1]], 1)) is None
    assert structure(ei[:, 1:]) is None
    assert structure(random_sparse(N, 30)) is None


def test_repr_and_reset():
    layer = SelfAttentionConv(64, num_heads=4)
    assert repr(layer) == "SelfAttentionConv(64, heads=4)"
    w = layer.lin_query.weight.clone()
    layer.reset_parameters()
    assert not torch.equal(w, layer.lin_query.weight)
    assert repr(SimplifiedAttention()) == "SimplifiedAttention(scale=1)"
    causal = SimplifiedAttention(0.5, causal=True)
    assert repr(causal) == "SimplifiedAttention(scale=0.5, causal=True)"
    assert (
        repr(SelfAttentionConv(8, 2, causal=True)) == "SelfAttentionConv(8, heads=2, causal=True)"
    )


@pytest.mark.parametrize(
    "make, name",
    [
        (lambda: SelfAttentionConv(8, 2, causal="no"), "causal"),
        (lambda: SelfAttentionConv(8, 2, bias=0), "bias"),
        (lambda: SelfAttentionConv(8, 2, edge_dim=2, edge_value=1), "edge_value"),
        (lambda: SimplifiedAttention(causal="no"), "causal"),
        (lambda: GraphTransformerLayer(8, 2, norm_first="no"), "norm_first"),
    ],
)
def test_flags_must_be_bools(make, name):
    # A string or an int would be read by its truth, silently ("no" is causal).
    with pytest.raises(TypeError, match=f"'{name}' to be a bool"):
        make()


def test_from_torch_with_dropout_one_and_kwargs_it_takes_from_mha():
    # MultiheadAttention takes dropout=1 (F.dropout's bound): in training every
    # weight is dropped and the output is out_proj's bias, on every backend.
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(8, 2, dropout=1.0, batch_first=True).double().train()
    with torch.no_grad():
        mha.out_proj.bias.uniform_(-1, 1)
    x = torch.randn(1, 5, 8, dtype=torch.float64)
    ref = mha(x, x, x, need_weights=False)[0][0]
    layer = SelfAttentionConv.from_torch(mha).train()
    for backend in ("mp", "sdpa", "fused", "tiles"):
        torch.testing.assert_close(layer(x[0], backend=backend), ref, atol=TOL, rtol=0)
    with pytest.raises(TypeError, match=r"'kwargs' among causal.*\['dropout'\]"):
        SelfAttentionConv.from_torch(mha, dropout=0.1)


def test_init_is_multihead_attentions():
    torch.manual_seed(0)
    d = 256
    layer = SelfAttentionConv(d, num_heads=8)
    mha = torch.nn.MultiheadAttention(d, 8)
    # xavier_uniform_ on MHA's packed in_proj_weight [3D, D]: fan_in D, fan_out 3D.
    bound = math.sqrt(6 / (d + 3 * d))
    for i, lin in enumerate((layer.lin_query, layer.lin_key, layer.lin_value)):
        w, ref = lin.weight.detach(), mha.in_proj_weight.detach()[i * d : (i + 1) * d]
        assert 0.99 * bound < w.abs().max() <= bound
        assert abs(w.std() / ref.std() - 1) < 0.02
        assert not lin.bias.any()
    # The output projection: its Linear's own weights (bound 1/sqrt(D)), a zero bias.
    out = layer.lin_out.weight.detach()
    assert 0.99 / math.sqrt(d) < out.abs().max() <= 1 / math.sqrt(d)
    assert abs(out.std() / mha.out_proj.weight.detach().std() - 1) < 0.02
    assert not layer.lin_out.bias.any()


def test_edge_inputs_of_another_dtype_are_refused_outside_autocast():
    layer = SelfAttentionConv(8, num_heads=2, edge_dim=3)
    x, ei = torch.randn(4, 8), torch.tensor([[0, 1, 2], [1, 2, 3]])
    ea, bias = torch.randn(3, 3), torch.randn(3, 2)
    expected = r"of dtype torch.float32 \(the dtype of x\), got torch.float64"
    with pytest.raises(TypeError, match=rf"'edge_attr' {expected}"):
        layer(x, ei, ea.double())
    with pytest.raises(TypeError, match=rf"'attn_bias' {expected}"):
        layer(x, ei, ea, attn_bias=bias.double())
    with pytest.raises(TypeError, match=rf"'attn_bias' {expected}"):
        layer.backend_for(x, ei, ea, attn_bias=bias.double())
    # Under autocast the projections cast their inputs: float32 edge inputs are fine.
    ref = layer(x, ei, ea, attn_bias=bias)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for x_in in (x, x.bfloat16()):
            out = layer(x_in, ei, ea, attn_bias=bias)
            assert out.dtype == torch.bfloat16
            assert (out.float() - ref).abs().max() < 0.1
