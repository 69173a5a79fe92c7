"""GPSConv(attn_type="exphormer") and attention bias (issue 29).

The Exphormer layer equals dense attention over its graph (the virtual nodes' rows
appended, a float mask of -inf off the edges); "mp" and "fused" agree on outputs and
on the gradients of x and of every parameter (float64, 1e-10), with and without
attn_bias and attn_edge_attr; attn_bias is the float mask of MultiheadAttention
for GPSConv("multihead"), GraphTransformerLayer and GraphTransformer; the errors
name the argument.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import torch_geometric.nn as pyg_nn
from torch import Tensor

from gnnattn import AttentionGraph, ComposedGraph, expander_graph, exphormer_graph
from gnnattn.nn import GPSConv, GraphTransformer, GraphTransformerLayer

C, H = 16, 4
REL = 1e-10


def make_batch(sizes: list[int], seed: int = 0) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``x``, ``edge_index`` (a path through each graph plus random edges), ``edge_attr``,
    ``batch``."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.tensor(sizes)
    batch = torch.repeat_interleave(torch.arange(len(sizes)), counts)
    starts = (torch.cumsum(counts, 0) - counts).tolist()
    edges = []
    for s, n in zip(starts, sizes, strict=True):
        path = torch.stack([torch.arange(n - 1), torch.arange(1, n)]) + s
        edges += [path, torch.randint(0, n, (2, n), generator=g) + s]
    ei = torch.cat(edges, 1)
    x = torch.randn(batch.numel(), C, generator=g, dtype=torch.float64)
    ea = torch.randn(ei.shape[1], 3, generator=g, dtype=torch.float64)
    return x, ei, ea, batch


def gine() -> torch.nn.Module:
    mlp = torch.nn.Sequential(torch.nn.Linear(C, C), torch.nn.ReLU(), torch.nn.Linear(C, C))
    return pyg_nn.GINEConv(mlp, edge_dim=3)


def exphormer_layer(conv: str = "gine", seed: int = 0, **kw) -> GPSConv:
    torch.manual_seed(seed)
    kw.setdefault("attn_kwargs", {"expander_degree": 3, "virtual_nodes": 2, "seed": 5})
    layer = GPSConv(C, gine() if conv == "gine" else None, heads=H, attn_type="exphormer", **kw)
    layer = layer.double()
    with torch.no_grad():  # nonzero biases, so that each one is tested
        for p in layer.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return layer


def run(layer: torch.nn.Module, x: Tensor, *args, **kw) -> tuple[Tensor, dict[str, Tensor]]:
    """The output, and the gradients of ``x``, of the keyword tensors that require grad
    and of every parameter by name."""
    x = x.clone().requires_grad_()
    out = layer(x, *args, **kw)
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=out.dtype)
    layer.zero_grad(set_to_none=True)
    for t in kw.values():
        if isinstance(t, Tensor):
            t.grad = None
    out.backward(upstream)
    grads = {"x": x.grad}
    grads.update({n: p.grad for n, p in layer.named_parameters() if p.grad is not None})
    grads.update({k: t.grad for k, t in kw.items() if isinstance(t, Tensor) and t.requires_grad})
    return out.detach(), grads


def assert_rel(a: Tensor, b: Tensor, what: str) -> None:
    scale = float(b.abs().max()) if b.numel() else 0.0
    err = float((a - b).abs().max()) if b.numel() else 0.0
    assert err <= REL * max(scale, 1e-4), f"{what}: max|diff| {err:.3g} vs max|ref| {scale:.3g}"


def assert_same_runs(a, b) -> None:
    assert_rel(a[0], b[0], "output")
    assert a[1].keys() == b[1].keys()
    for name in a[1]:
        assert_rel(a[1][name], b[1][name], f"grad of {name}")


SIZES = {"one": [23], "skewed": [1, 2, 40, 3, 17], "equal": [6, 6, 6]}


# --------------------------------------------------------------------------- exphormer


@pytest.mark.parametrize("bias", ["none", "attn_bias", "attn_edge_attr", "both"])
@pytest.mark.parametrize("sizes", list(SIZES), ids=list(SIZES))
def test_exphormer_mp_and_fused_agree(sizes: str, bias: str) -> None:
    x, ei, ea, batch = make_batch(SIZES[sizes])
    layer = exphormer_layer(attn_edge_dim=2 if bias in ("attn_edge_attr", "both") else None)
    layer.eval()
    graph = layer._attn_graph(x, ei, batch, None)
    gen = torch.Generator().manual_seed(3)
    kw: dict = {"edge_attr": ea}
    if bias in ("attn_bias", "both"):
        kw["attn_bias"] = torch.randn(graph.num_edges, H, generator=gen, dtype=torch.float64)
        kw["attn_bias"].requires_grad_()
    if bias in ("attn_edge_attr", "both"):
        kw["attn_edge_attr"] = torch.randn(graph.num_edges, 2, generator=gen, dtype=torch.float64)
    mp = run(layer, x, ei, batch, backend="mp", **kw)
    fused = run(layer, x, ei, batch, backend="fused", **kw)
    assert_same_runs(fused, mp)
    assert_same_runs(run(layer, x, ei, batch, **kw), mp)  # auto
    assert "virtual_embedding" in mp[1] and float(mp[1]["virtual_embedding"].abs().max()) > 0
    if "attn_bias" in kw:
        assert float(mp[1]["attn_bias"].abs().max()) > 0


def test_exphormer_mp_and_fused_agree_in_training() -> None:
    # Batch norms on batch statistics (the dropouts are 0: deterministic).
    x, ei, ea, batch = make_batch(SIZES["skewed"])
    layer = exphormer_layer().train()
    assert_same_runs(
        run(layer, x, ei, batch, edge_attr=ea, backend="fused"),
        run(layer, x, ei, batch, edge_attr=ea, backend="mp"),
    )


def dense_reference(layer: GPSConv, x: Tensor, graph: AttentionGraph, bias: Tensor | None):
    """``x + attn`` of the global attention alone: MultiheadAttention over the graph's
    nodes (the virtual rows after x) with the float mask of the graph and the bias."""
    n = x.shape[0]
    comp = graph.composition if isinstance(graph, ComposedGraph) else None
    rows = x
    if comp is not None and comp.num_virtual:
        rows = torch.cat([x, layer.virtual_embedding[comp.virtual_index()]])
    m = rows.shape[0]
    mask = torch.full((H, m, m), float("-inf"), dtype=x.dtype)
    src, dst = graph.edge_index
    mask[:, dst, src] = 0.0 if bias is None else bias.T
    out, _ = layer.attn(rows[None], rows[None], rows[None], attn_mask=mask, need_weights=False)
    return x + out[0, :n]


def attention_only(**kw) -> GPSConv:
    """A layer whose output is ``x + global attention`` (no conv, no norm, an MLP of
    zeros)."""
    layer = exphormer_layer("none", norm=None, **kw).eval()
    with torch.no_grad():
        for lin in (layer.mlp[0], layer.mlp[3]):
            lin.weight.zero_()
            lin.bias.zero_()
    return layer


@pytest.mark.parametrize("backend", ["mp", "fused"])
def test_exphormer_is_dense_attention_over_its_graph(backend: str) -> None:
    x, ei, _, batch = make_batch(SIZES["skewed"])
    layer = attention_only()
    graph = exphormer_graph(ei, expander_degree=3, virtual_nodes=2, seed=5, batch=batch)
    bias = torch.randn(graph.num_edges, H, dtype=torch.float64)
    with torch.no_grad():
        out = layer(x, ei, batch, backend=backend)
        # The graph the layer builds is exphormer_graph's, with the layer's kwargs.
        assert_rel(out, layer(x, ei, attn_graph=graph, backend=backend), "given attn_graph")
        assert_rel(out, dense_reference(layer, x, graph, None), "vs dense")
        with_bias = layer(x, ei, batch, attn_bias=bias, backend=backend)
        assert_rel(with_bias, dense_reference(layer, x, graph, bias), "bias vs dense")
        _, (edges, alpha) = layer(x, ei, batch, return_attention_weights=True, backend=backend)
    assert torch.equal(edges, graph.edge_index) and alpha.shape == (graph.num_edges, H)
    # Each target's weights sum to 1 over its edges, virtual nodes included.
    sums = torch.zeros(graph.num_nodes, H, dtype=alpha.dtype).index_add_(0, edges[1], alpha)
    torch.testing.assert_close(sums, torch.ones_like(sums))


def test_exphormer_without_virtual_nodes_or_expander() -> None:
    x, ei, _, batch = make_batch(SIZES["equal"])
    for kwargs in ({"virtual_nodes": 0, "seed": 1}, {"expander_degree": 0, "virtual_nodes": 1}):
        layer = attention_only(attn_kwargs=kwargs)
        assert (layer.virtual_embedding is None) == (kwargs.get("virtual_nodes") == 0)
        graph = layer._attn_graph(x, ei, batch, None)
        with torch.no_grad():
            assert_rel(layer(x, ei, batch), dense_reference(layer, x, graph, None), str(kwargs))
    # A plain graph (no virtual node) for a layer without virtual nodes.
    layer = attention_only(attn_kwargs={"virtual_nodes": 0})
    loops = torch.arange(x.shape[0]).repeat(2, 1)
    # Each edge once (the dense mask has no duplicates), every node with an in-edge.
    plain = AttentionGraph(torch.unique(torch.cat([ei, loops], 1), dim=1), x.shape[0])
    with torch.no_grad():
        assert_rel(layer(x, ei, attn_graph=plain), dense_reference(layer, x, plain, None), "plain")


def test_exphormer_graph_is_fixed_by_the_seed_and_the_module_by_pyg() -> None:
    x, ei, ea, batch = make_batch(SIZES["skewed"])
    layer = exphormer_layer().eval()
    with torch.no_grad():
        assert torch.equal(layer(x, ei, batch, edge_attr=ea), layer(x, ei, batch, edge_attr=ea))
        other = exphormer_layer(attn_kwargs={"expander_degree": 3, "virtual_nodes": 2, "seed": 6})
        other.load_state_dict(layer.state_dict())
        one = other.eval()(x, ei, batch, edge_attr=ea)
        assert not torch.equal(one, layer(x, ei, batch, edge_attr=ea))
    # PyG's module tree, plus the virtual nodes' table.
    names = set(layer.state_dict())
    ref = pyg_nn.GPSConv(C, gine(), heads=H)
    assert names - set(ref.state_dict()) == {"virtual_embedding"}
    assert layer.virtual_embedding.shape == (2, C)
    assert str(layer).endswith("heads=4, attn_type=exphormer)")
    # A torch.sparse adj_t (row = target) gives the attention graph of its edge_index.
    adj = torch.sparse_coo_tensor(
        ei.flip(0), torch.ones(ei.shape[1]), (x.shape[0],) * 2, check_invariants=True
    )
    bare = exphormer_layer("none").eval()
    with torch.no_grad():
        assert_rel(bare(x, adj.coalesce(), batch), bare(x, ei, batch), "adj_t")


def test_exphormer_on_a_knn_graph_trains() -> None:
    # A kNN graph of 3000 points: forward and backward on the fused kernels.
    n = 3000
    pos = torch.rand(n, 3, generator=torch.Generator().manual_seed(0))
    nbr = torch.cdist(pos, pos).topk(7, largest=False).indices[:, 1:]  # 6 nearest, not itself
    ei = torch.stack([nbr.reshape(-1), torch.arange(n).repeat_interleave(6)])
    layer = GPSConv(32, pyg_nn.GINConv(torch.nn.Linear(32, 32)), heads=4, attn_type="exphormer")
    x = torch.randn(n, 32, requires_grad=True)
    out = layer(x, ei)
    out.sum().backward()
    assert out.shape == (n, 32) and x.grad is not None and layer.virtual_embedding.grad is not None
    assert layer.backend_for(x, edge_index=ei).backend == "fused"


# --------------------------------------------------------------------------- attn_bias


def test_multihead_attn_bias_is_multihead_attention_s_float_mask() -> None:
    torch.manual_seed(0)
    layer = GPSConv(C, None, heads=H, norm=None).double().eval()
    with torch.no_grad():
        for lin in (layer.mlp[0], layer.mlp[3]):
            lin.weight.zero_()
            lin.bias.zero_()
    sizes = [5, 1, 9]
    x, ei, _, batch = make_batch(sizes)
    graph = AttentionGraph.from_batch(batch)
    bias = torch.randn(graph.num_edges, H, dtype=torch.float64)
    with torch.no_grad():
        out = layer(x, ei, batch, attn_bias=bias)
        assert layer.backend_for(x, batch, attn_bias=bias).backend == "fused"
        assert layer.backend_for(x, batch).backend == "sdpa"
        want = dense_reference(layer, x, graph, bias)
        assert_rel(out, want, "multihead with bias")
        assert_rel(layer(x, ei, batch, attn_bias=bias, backend="mp"), want, "mp")


def test_graph_transformer_layer_attn_bias() -> None:
    torch.manual_seed(0)
    layer = GraphTransformerLayer(C, H, dropout=0.0).double().eval()
    n = 9
    x = torch.randn(n, C, dtype=torch.float64)
    ei = torch.randint(0, n, (2, 30), generator=torch.Generator().manual_seed(1))
    graph = AttentionGraph(ei, n)
    bias = torch.randn(graph.num_edges, H, dtype=torch.float64, requires_grad=True)
    mp = run(layer, x, graph, attn_bias=bias, backend="mp")
    fused = run(layer, x, graph, attn_bias=bias, backend="fused")
    assert_same_runs(fused, mp)
    assert layer.backend_for(x, graph, attn_bias=bias).backend == "fused"
    # On the complete graph a bias is MultiheadAttention's float mask.
    full = AttentionGraph(torch.cartesian_prod(torch.arange(n), torch.arange(n)).T.contiguous(), n)
    b = torch.randn(full.num_edges, H, dtype=torch.float64)
    mask = torch.zeros(H, n, n, dtype=torch.float64)
    mask[:, full.edge_index[1], full.edge_index[0]] = b.T
    t = layer.to_torch()  # norm_first: x + SA(LN1(x)), then + FF(LN2(x))
    with torch.no_grad():
        y = t.norm1(x)[None]
        h = x + t.self_attn(y, y, y, attn_mask=mask, need_weights=False)[0][0]
        want = h + t.linear2(F.relu(t.linear1(t.norm2(h))))
        assert_rel(layer(x, full, attn_bias=b), want, "vs MultiheadAttention with a float mask")
        # Every block of a stack takes it.
        stack = GraphTransformer(2, C, H).double().eval()
        got = stack(x, full, attn_bias=b)
        h = x
        for blk in stack.layers:
            h = blk(h, full, attn_bias=b)
        assert_rel(got, stack.norm(h), "stack")
        assert [c.backend for c in stack.backend_for(x, full, attn_bias=b)] == ["fused"] * 2


def test_causal_layer_takes_the_bias_of_the_edges_as_given_or_as_kept() -> None:
    torch.manual_seed(0)
    layer = GraphTransformerLayer(C, H, causal=True).double().eval()
    n = 6
    ei = torch.cartesian_prod(torch.arange(n), torch.arange(n)).T.contiguous()  # complete
    x = torch.randn(n, C, dtype=torch.float64)
    bias = torch.randn(ei.shape[1], H, dtype=torch.float64)
    keep = ei[0] <= ei[1]
    with torch.no_grad():
        a = layer(x, ei, attn_bias=bias)
        b = layer(x, AttentionGraph(ei, n, causal=True), attn_bias=bias[keep])
    assert_rel(a, b, "causal bias")


# --------------------------------------------------------------------------- errors


def test_errors_name_the_argument() -> None:
    x, ei, _, batch = make_batch([4, 5])
    layer = exphormer_layer("none")
    graph = layer._attn_graph(x, ei, batch, None)
    e = graph.num_edges
    with pytest.raises(ValueError, match=rf"'attn_bias' of shape \[{e}, 4\].*got \[{e}\]"):
        layer(x, ei, batch, attn_bias=torch.zeros(e, dtype=torch.float64))
    with pytest.raises(ValueError, match=rf"'attn_bias' of shape \[{e}, 4\].*got \[{e}, 2\]"):
        layer(x, ei, batch, attn_bias=torch.zeros(e, 2, dtype=torch.float64))
    with pytest.raises(ValueError, match=rf"'attn_bias' of shape \[{e}, 4\].*got \[{e - 1}, 4\]"):
        layer(x, ei, batch, attn_bias=torch.zeros(e - 1, 4, dtype=torch.float64))
    with pytest.raises(TypeError, match="'attn_bias' of a floating dtype, got torch.int64"):
        layer(x, ei, batch, attn_bias=torch.zeros(e, 4, dtype=torch.long))
    with pytest.raises(TypeError, match="'attn_bias' to be a Tensor"):
        layer(x, ei, batch, attn_bias=[[0.0] * 4] * e)
    with pytest.raises(ValueError, match="'attn_edge_attr' but the layer has attn_edge_dim=None"):
        layer(x, ei, batch, attn_edge_attr=torch.zeros(e, 2, dtype=torch.float64))
    with_edge = exphormer_layer("none", attn_edge_dim=2)
    with pytest.raises(ValueError, match=rf"'attn_edge_attr' of shape \[{e}, 2\].*got None"):
        with_edge(x, ei, batch)
    with pytest.raises(ValueError, match=rf"'attn_edge_attr' of shape \[{e}, 2\].*got \[{e}, 3\]"):
        with_edge(x, ei, batch, attn_edge_attr=torch.zeros(e, 3, dtype=torch.float64))
    # The attention graph must carry the layer's virtual nodes.
    other = exphormer_graph(ei, expander_degree=3, virtual_nodes=1, seed=0, batch=batch)
    with pytest.raises(ValueError, match=r"2 virtual node\(s\) per graph.*got 1"):
        layer(x, ei, attn_graph=other)
    for bare in (
        exphormer_graph(ei, expander_degree=3, virtual_nodes=0, seed=0, batch=batch),
        expander_graph(degree=3, seed=0, batch=batch),
    ):
        with pytest.raises(ValueError, match=r"2 virtual node\(s\) per graph.*got 0"):
            layer(x, ei, attn_graph=bare)
    with pytest.raises(ValueError, match="plain AttentionGraph of 9 nodes"):
        layer(x, ei, attn_graph=AttentionGraph(ei, 9))
    with pytest.raises(ValueError, match="'edge_index'.*or 'attn_graph'"):
        layer.backend_for(x, batch)
    with pytest.raises(ValueError, match="'batch' of length 9"):
        layer(x, ei, batch[:5])
    # Constructor.
    with pytest.raises(ValueError, match=r"'attn_kwargs' without \['seed'\].*'multihead'"):
        GPSConv(C, None, attn_kwargs={"seed": 1})
    with pytest.raises(TypeError, match="attn_kwargs\\['virtual_nodes'\\]"):
        GPSConv(C, None, attn_type="exphormer", attn_kwargs={"virtual_nodes": 1.0})
    with pytest.raises(ValueError, match="'bigbird'.*block-tile kernels"):
        GPSConv(C, None, attn_type="bigbird")
    with pytest.raises(ValueError, match="'attn_edge_dim'"):
        GPSConv(C, None, attn_edge_dim=0)
    # GraphTransformerLayer.
    gt = GraphTransformerLayer(C, H)
    with pytest.raises(ValueError, match=r"'attn_bias' of shape \[3, 4\]"):
        gt(torch.randn(4, C), torch.tensor([[0, 1, 2], [1, 2, 3]]), attn_bias=torch.zeros(3, 2))
