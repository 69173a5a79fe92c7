"""Transformer blocks, positional encodings and the PyG ecosystem around them."""

import io

import pytest
import torch
from torch_geometric.data import Batch, Data
from torch_geometric.loader import DataLoader

from gnnattn import AttentionGraph, SelfAttentionConv, causal_graph, complete_graph
from gnnattn.nn import (
    GraphPositionalEncoding,
    GraphTransformer,
    GraphTransformerLayer,
    LearnedPositionalEncoding,
    SinusoidalPositionalEncoding,
    sequence_positions,
)

TOL = 1e-10
D, H, F = 16, 4, 24


def torch_layer(norm_first, activation, seed=0):
    torch.manual_seed(seed)
    t = torch.nn.TransformerEncoderLayer(
        D, H, F, dropout=0.0, activation=activation, batch_first=True, norm_first=norm_first
    ).double()
    with torch.no_grad():  # non-trivial LayerNorm and bias parameters too
        for p in t.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return t.eval()


def grads(out, params):
    g = torch.randn_like(out, generator=torch.Generator().manual_seed(1))
    return torch.autograd.grad((out * g).sum(), params)


@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("causal", [False, True])
def test_layer_equals_torch_encoder_layer(norm_first, activation, causal):
    t = torch_layer(norm_first, activation)
    layer = GraphTransformerLayer.from_torch(t, causal=causal)
    assert layer.norm_first == norm_first and layer.causal == causal
    b, s = 3, 6
    x = torch.randn(b, s, D, dtype=torch.float64, requires_grad=True)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(s, dtype=torch.float64)
    ref = t(x, src_mask=mask if causal else None, is_causal=causal)  # (B, S, D)
    ref_g = grads(ref, [x])[0]
    batch = torch.arange(b).repeat_interleave(s)
    flat = x.reshape(b * s, D)  # (B*S, D): one node per token, one graph per sequence
    for backend in ("mp", "sdpa", "fused"):
        out = layer(flat, batch=batch, backend=backend)
        assert (out - ref.reshape(b * s, D)).abs().max() < TOL, backend
        assert (grads(out, [x])[0] - ref_g).abs().max() < TOL, backend
    builder = causal_graph if causal else complete_graph
    out = layer(flat, builder(batch=batch))  # the same graph given explicitly
    assert (out - ref.reshape(b * s, D)).abs().max() < TOL


def test_layer_parameter_gradients_equal_torch():
    t = torch_layer(True, "gelu")
    layer = GraphTransformerLayer.from_torch(t)
    x = torch.randn(2, 5, D, dtype=torch.float64)
    ref = t(x)
    out = layer(x.reshape(10, D), batch=torch.arange(2).repeat_interleave(5))
    g_ref = dict(
        zip([n for n, _ in t.named_parameters()], grads(ref, list(t.parameters())), strict=True)
    )
    g = dict(
        zip(
            [n for n, _ in layer.named_parameters()],
            grads(out, list(layer.parameters())),
            strict=True,
        )
    )
    in_proj = torch.cat([g[f"self_attn.lin_{n}.weight"] for n in ("query", "key", "value")])
    assert (in_proj - g_ref["self_attn.in_proj_weight"]).abs().max() < TOL
    assert (g["self_attn.lin_out.weight"] - g_ref["self_attn.out_proj.weight"]).abs().max() < TOL
    for name in ("linear1.weight", "linear2.bias", "norm1.weight", "norm2.bias"):
        assert (g[name] - g_ref[name]).abs().max() < TOL, name


def test_padded_batch_equals_key_padding_mask():
    """Sequences of different lengths: the batch vector is torch's key padding mask."""
    t = torch_layer(False, "relu")
    layer = GraphTransformerLayer.from_torch(t)
    lengths = [5, 2, 4]
    x = torch.randn(3, 5, D, dtype=torch.float64)
    pad = torch.arange(5).view(1, -1) >= torch.tensor(lengths).view(-1, 1)  # (B, S) True = pad
    ref = t(x, src_key_padding_mask=pad)
    out = layer(x[~pad], batch=torch.arange(3).repeat_interleave(torch.tensor(lengths)))
    assert (out - ref[~pad]).abs().max() < TOL


@pytest.mark.parametrize("norm_first", [True, False])
def test_stack_equals_torch_encoder_and_round_trips(norm_first):
    t = torch_layer(norm_first, "relu")
    norm = torch.nn.LayerNorm(D).double() if norm_first else None
    enc = torch.nn.TransformerEncoder(t, 3, norm=norm, enable_nested_tensor=False).eval()
    with torch.no_grad():
        for p in enc.parameters():
            p.add_(torch.randn_like(p) * 0.1)  # the three layers differ
    model = GraphTransformer.from_torch(enc)
    assert (model.norm is not None) == norm_first
    x = torch.randn(2, 7, D, dtype=torch.float64)
    ref = enc(x)
    out = model(x.reshape(14, D), batch=torch.arange(2).repeat_interleave(7))
    assert (out - ref.reshape(14, D)).abs().max() < TOL
    back = model._layer(1).to_torch().eval()
    assert (back(x) - enc.layers[1](x)).abs().max() < TOL


def test_stack_defaults_and_bad_arguments():
    model = GraphTransformer(2, D, H, causal=True)
    assert model.norm is not None and model.causal
    assert repr(model._layer(0)) == (
        "GraphTransformerLayer(16, heads=4, ffn_dim=64, norm_first=True, causal=True)"
    )
    assert GraphTransformer(1, D, H, norm_first=False).norm is None
    with pytest.raises(ValueError, match="'num_layers' to be a positive int"):
        GraphTransformer(0, D, H)
    with pytest.raises(ValueError, match="'activation' to be one of"):
        GraphTransformerLayer(D, H, activation="tanh")
    with pytest.raises(ValueError, match="'ffn_dim' to be a positive int"):
        GraphTransformerLayer(D, H, ffn_dim=0)
    with pytest.raises(TypeError, match="TransformerEncoderLayer"):
        GraphTransformerLayer.from_torch(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match=r"'batch' of length 6"):
        model(torch.randn(6, D), batch=torch.zeros(5, dtype=torch.long))


def test_edge_features_through_the_stack():
    model = GraphTransformer(2, D, H, edge_dim=3, edge_value=True).double()
    ei = torch.randint(0, 8, (2, 30))
    ea = torch.randn(30, 3, dtype=torch.float64)
    x = torch.randn(8, D, dtype=torch.float64)
    out = model(x, ei, ea)
    assert (out - model(x, ei, torch.zeros_like(ea))).abs().max() > 1e-4
    out.sum().backward()
    assert model._layer(0).self_attn.lin_edge.weight.grad.abs().sum() > 0


# ---------------------------------------------------------------- positions


def test_sequence_positions_and_sinusoids():
    batch = torch.tensor([0, 0, 0, 2, 2, 5])
    assert sequence_positions(6, batch).tolist() == [0, 1, 2, 0, 1, 0]
    assert sequence_positions(3).tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="sorted"):
        sequence_positions(3, torch.tensor([1, 0, 0]))
    with pytest.raises(ValueError, match="'num_nodes' to be an int >= 0, got -1"):
        sequence_positions(-1)
    pe = SinusoidalPositionalEncoding(8)
    out = pe(torch.zeros(6, 8), batch=batch)
    assert torch.equal(out[3], out[0]) and torch.equal(out[4], out[1])  # restarts per sequence
    p = torch.tensor([0, 1, 2, 0, 1, 0])
    assert torch.allclose(out[:, 0], torch.sin(p.float()))
    assert torch.allclose(out[:, 1], torch.cos(p.float()))
    assert torch.allclose(out[:, 2], torch.sin(p / 10000 ** (2 / 8)))
    with pytest.raises(ValueError, match="even 'embed_dim'"):
        SinusoidalPositionalEncoding(7)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_sinusoids_keep_their_frequencies_after_a_cast(dtype):
    """The frequencies are not a buffer that .half() would round: far positions keep
    the float64 encoding, rounded once to the input's dtype (float64 stays float64)."""
    pos = torch.tensor([0, 10, 1000, 5000, 99_999])
    want = SinusoidalPositionalEncoding(16).encoding(pos, torch.float64)
    got = SinusoidalPositionalEncoding(16).to(dtype)(torch.zeros(5, 16, dtype=dtype), pos)
    assert got.dtype == dtype
    assert torch.equal(got, want.to(dtype))
    k = torch.arange(0, 16, 2, dtype=torch.float64)
    ang = pos.double()[:, None] * 10000.0 ** (-k / 16)  # (N, D/2)
    exact = torch.stack([ang.sin(), ang.cos()], -1).view(5, 16)
    # The two ways of writing the frequency differ by an ulp of float64, which an angle
    # of 1e5 radians turns into about 1e-11: float32 would be off by 1e-3 there.
    torch.testing.assert_close(want, exact, rtol=0, atol=1e-10)


def test_learned_positions():
    pe = LearnedPositionalEncoding(4, 8)
    x = torch.zeros(5, 8)
    out = pe(x, batch=torch.tensor([0, 0, 0, 1, 1]))
    assert torch.equal(out[3], pe.embedding.weight[0].detach())
    with pytest.raises(ValueError, match="below max_len=4, got 4"):
        pe(x)
    with pytest.raises(ValueError, match="either 'pos' or 'batch'"):
        pe(x, torch.zeros(5, dtype=torch.long), batch=torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="positions >= 0 in 'pos', got -1"):
        pe(x, torch.tensor([-1, 0, 1, 2, 3]))


def karate():
    import networkx as nx
    from torch_geometric.utils import from_networkx

    data = from_networkx(nx.karate_club_graph())
    data.x = torch.eye(data.num_nodes)
    return data


def test_graph_positional_encoding_with_random_walk_pe():
    from torch_geometric.transforms import AddRandomWalkPE

    data = AddRandomWalkPE(walk_length=5)(karate())
    enc = GraphPositionalEncoding(5, 34)
    out = enc(data.x, data.random_walk_pe)
    assert out.shape == (34, 34)
    assert (out - data.x).abs().sum() > 0
    with pytest.raises(ValueError, match=r"'pe' of shape \[34, 5\]"):
        enc(data.x, data.random_walk_pe[:, :4])


def test_graph_positional_encoding_with_laplacian_pe():
    pytest.importorskip("scipy")  # PyG's eigensolver
    from torch_geometric.transforms import AddLaplacianEigenvectorPE

    data = AddLaplacianEigenvectorPE(k=3)(karate())
    enc = GraphPositionalEncoding(3, 34, random_sign_flip=True)
    pe = data.laplacian_eigenvector_pe
    enc.eval()
    flipped = enc.lin(-pe) - enc.lin.bias
    assert torch.allclose(flipped, -(enc.lin(pe) - enc.lin.bias), atol=1e-6)
    enc.train()
    torch.manual_seed(0)
    outs = {tuple(enc(data.x, pe)[0].tolist()) for _ in range(8)}
    assert len(outs) > 1  # signs were flipped


# ---------------------------------------------------------------- PyG ecosystem


def test_dataloader_batches():
    torch.manual_seed(0)
    graphs = []
    for n in (5, 3, 7, 4):
        ei = torch.randint(0, n, (2, 3 * n))
        graphs.append(Data(x=torch.randn(n, D), edge_index=ei, edge_attr=torch.randn(3 * n, 2)))
    model = GraphTransformer(2, D, H, edge_dim=2).eval()
    plain = GraphTransformer(2, D, H).eval()
    loader = DataLoader(graphs, batch_size=2)
    rows = []
    for b in loader:
        assert isinstance(b, Batch)
        rows.append(model(b.x, b.edge_index, b.edge_attr))
        dense = plain(b.x, batch=b.batch)  # complete graph per graph of the batch
        start = 0
        for g in b.to_data_list():
            alone = plain(g.x, complete_graph(g.num_nodes))
            assert torch.allclose(dense[start : start + g.num_nodes], alone, atol=1e-5)
            start += g.num_nodes
    out = torch.cat(rows)
    for i, g in enumerate(graphs):  # batching changes nothing per graph
        start = sum(h.num_nodes for h in graphs[:i])
        alone = model(g.x, g.edge_index, g.edge_attr)
        assert torch.allclose(out[start : start + g.num_nodes], alone, atol=1e-5)


@pytest.mark.filterwarnings("ignore:Using .NeighborSampler. without:UserWarning")
def test_sampled_subgraphs():
    """Mini-batches of sampled subgraphs, as NeighborLoader yields (needs pyg-lib or
    torch-sparse); the same relabeled subgraphs from ``k_hop_subgraph`` otherwise."""
    from torch_geometric.utils import k_hop_subgraph

    data = karate()
    conv = SelfAttentionConv(34, 2)
    full = conv(data.x, data.edge_index)
    seeds = torch.tensor([0, 33])
    subset, ei, mapping, _ = k_hop_subgraph(seeds, 2, data.edge_index, relabel_nodes=True)
    # Two hops of receptive field around the seeds: one layer's output at the
    # seeds only needs their 1-hop in-neighbors, which the subgraph contains.
    sub = conv(data.x[subset], ei)
    assert torch.allclose(sub[mapping], full[seeds], atol=1e-5)
    try:
        from torch_geometric.loader import NeighborLoader

        loader = NeighborLoader(data, num_neighbors=[-1], batch_size=4)
        batch = next(iter(loader))
    except ImportError:
        return  # no sampler backend installed; the k-hop check above stands in
    out = conv(batch.x, batch.edge_index)[: batch.batch_size]
    assert torch.allclose(out, full[batch.n_id[: batch.batch_size]], atol=1e-5)


def test_state_dict_round_trip():
    model = GraphTransformer(2, D, H, causal=True, edge_dim=2)
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    other = GraphTransformer(2, D, H, causal=True, edge_dim=2)
    other.load_state_dict(torch.load(buf))
    ei, ea = causal_graph(6), torch.randn(21, 2)
    x = torch.randn(6, D)
    assert torch.equal(model(x, ei, ea), other(x, ei, ea))
    assert "layers.0.self_attn.lin_edge.weight" in model.state_dict()


def test_causal_stack_names_the_edge_attr_width_the_user_gave():
    """A causal stack prunes edge_attr to the kept edges once; a wrong width is refused
    before, in terms of the rows the user passed (not the 28 kept of 49)."""
    model = GraphTransformer(1, D, H, causal=True, edge_dim=3)
    with pytest.raises(ValueError, match=r"shape \[E, 3\] .* got \[49, 5\]"):
        model(torch.randn(7, D), complete_graph(7), torch.randn(49, 5))
    out = model(torch.randn(7, D), complete_graph(7), torch.randn(49, 3))
    assert out.shape == (7, D)


def test_autocast_bfloat16_on_cpu():
    model = GraphTransformer(2, D, H, causal=True)
    x = torch.randn(2 * 9, D)
    batch = torch.arange(2).repeat_interleave(9)
    ref = model(x, batch=batch)
    for backend in ("mp", "sdpa", "fused"):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x, batch=batch, backend=backend)
        assert torch.isfinite(out).all()
        assert (out.float() - ref).abs().max() < 0.15, backend
        out.float().sum().backward()


@pytest.mark.slow
def test_compile_fullgraph_on_the_mp_path():
    torch._dynamo.reset()
    conv = SelfAttentionConv(D, H, causal=True, edge_dim=3, backend="mp")
    ei = torch.randint(0, 10, (2, 40))
    ea = torch.randn(40, 3)  # rows follow ei; the graph keeps which edges it pruned
    x = torch.randn(10, D, requires_grad=True)
    # Pruning gives a data-dependent edge count: the graph is built outside.
    graph = AttentionGraph(ei, 10, causal=True)
    compiled = torch.compile(conv, fullgraph=True, backend="aot_eager")
    out = compiled(x, graph, ea)
    ref = conv(x, ei, ea)
    assert (out - ref).abs().max() < 1e-5
    (g,) = torch.autograd.grad(out.sum(), x)
    (g_ref,) = torch.autograd.grad(ref.sum(), x)
    assert (g - g_ref).abs().max() < 1e-5
    # A whole stack, graph built inside (no edge_index): complete + causal.
    model = GraphTransformer(2, D, H, causal=True, backend="mp")
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    assert (compiled(x) - model(x)).abs().max() < 1e-5
