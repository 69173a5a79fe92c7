"""gnnattn.nn.GPSConv against PyG's GPSConv: same module, same weights, same outputs and
gradients (float64), without the padding; dropout in training; the errors."""

from __future__ import annotations

import math

import pytest
import torch
import torch_geometric.nn as pyg_nn
from torch import Tensor

import gnnattn
from gnnattn.nn import GPSConv

C = 16
REL = 1e-9
# Graph sizes per batch: single nodes, equal sizes, skew, one big graph.
BATCHES = {
    "one_node": [1],
    "singletons": [1, 1, 1],
    "equal": [4, 4, 4],
    "skewed": [1, 2, 40, 3, 1, 17],
    "one_big": [2, 60],
}
CONVS = ("none", "gin", "gcn", "gine")
BACKENDS = ("auto", "fused", "mp")


def make_conv(kind: str) -> torch.nn.Module | None:
    if kind == "none":
        return None
    if kind == "gin":
        mlp = torch.nn.Sequential(torch.nn.Linear(C, C), torch.nn.ReLU(), torch.nn.Linear(C, C))
        return pyg_nn.GINConv(mlp)
    if kind == "gcn":
        return pyg_nn.GCNConv(C, C)
    mlp = torch.nn.Sequential(torch.nn.Linear(C, C), torch.nn.ReLU(), torch.nn.Linear(C, C))
    return pyg_nn.GINEConv(mlp, edge_dim=3)  # takes edge_attr through **kwargs


def make_pair(conv: str, heads: int, seed: int = 0, **kw) -> tuple[torch.nn.Module, GPSConv]:
    """PyG's layer with random weights and statistics, and ours with its state_dict."""
    torch.manual_seed(seed)
    ref = pyg_nn.GPSConv(C, make_conv(conv), heads=heads, **kw).double()
    with torch.no_grad():
        # Nonzero biases and running statistics, so that each one is tested.
        for p in ref.parameters():
            p.add_(torch.randn_like(p) * 0.2)
        for name, b in ref.named_buffers():
            if name.endswith("running_mean"):
                b.normal_(0, 0.3)
            elif name.endswith("running_var"):
                b.uniform_(0.5, 2.0)
    ours = GPSConv(C, make_conv(conv), heads=heads, **kw).double()
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def make_batch(sizes: list[int], seed: int = 0) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``x``, ``edge_index`` (random edges inside each graph), ``edge_attr`` and ``batch``."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.tensor(sizes)
    batch = torch.repeat_interleave(torch.arange(len(sizes)), counts)
    starts = torch.cumsum(counts, 0) - counts
    edges = []
    for s, n in zip(starts.tolist(), sizes, strict=True):
        e = 2 * n
        edges.append(torch.randint(0, n, (2, e), generator=g) + s)
    edge_index = torch.cat(edges, 1)
    x = torch.randn(batch.numel(), C, generator=g, dtype=torch.float64)
    edge_attr = torch.randn(edge_index.shape[1], 3, generator=g, dtype=torch.float64)
    return x, edge_index, edge_attr, batch


def run(module: torch.nn.Module, x: Tensor, ei: Tensor, batch: Tensor | None, **kw):
    """The output, and the gradients of ``x`` and of every parameter by name."""
    x = x.clone().requires_grad_()
    out = module(x, ei, batch, **kw)
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=out.dtype)
    module.zero_grad(set_to_none=True)
    out.backward(upstream)
    assert x.grad is not None
    grads = {"x": x.grad}
    grads.update({n: p.grad for n, p in module.named_parameters() if p.grad is not None})
    return out.detach(), grads


def assert_rel(a: Tensor, b: Tensor, what: str) -> None:
    scale = float(b.abs().max()) if b.numel() else 0.0
    err = float((a - b).abs().max()) if b.numel() else 0.0
    # Relative to the largest entry; a gradient that is zero up to rounding (a
    # bias that training-mode BatchNorm cancels: ~1e-15) is held to 1e-13.
    assert err <= REL * max(scale, 1e-4), f"{what}: max|diff| {err:.3g} vs max|ref| {scale:.3g}"


def assert_same(ref, ours, x, ei, batch, backend=None, **kw) -> None:
    """``ours`` (on ``backend`` for this call when given) against PyG's ``ref``."""
    out_r, g_r = run(ref, x, ei, batch, **kw)
    out_o, g_o = run(ours, x, ei, batch, **kw, **({} if backend is None else {"backend": backend}))
    assert_rel(out_o, out_r, "output")
    assert g_o.keys() == g_r.keys()
    for name in g_r:
        assert_rel(g_o[name], g_r[name], f"grad of {name}")


# --------------------------------------------------------------------------- parity


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("heads", [1, 4])
@pytest.mark.parametrize("conv", CONVS)
def test_eval_matches_pyg_outputs_and_gradients(conv: str, heads: int, backend: str) -> None:
    ref, ours = make_pair(conv, heads)
    ref.eval(), ours.eval()
    for seed, (name, sizes) in enumerate(BATCHES.items()):
        x, ei, ea, batch = make_batch(sizes, seed)
        kw = {"edge_attr": ea} if conv == "gine" else {}
        try:
            assert_same(ref, ours, x, ei, batch, backend=backend, **kw)
        except AssertionError as err:
            raise AssertionError(f"batch {name}: {err}") from None
    assert ours.backend == "auto"  # the per-call override left the layer as it was


@pytest.mark.parametrize("conv", ["none", "gin"])
def test_without_batch_is_one_graph(conv: str) -> None:
    ref, ours = make_pair(conv, 4)
    ref.eval(), ours.eval()
    x, ei, _, _ = make_batch([5, 9])
    assert_same(ref, ours, x, ei, None)


def test_batch_with_gaps_in_graph_ids() -> None:
    # Graph ids without nodes: PyG's to_dense_batch drops their all-padding rows.
    ref, ours = make_pair("gin", 2)
    ref.eval(), ours.eval()
    x, ei, _, _ = make_batch([3, 4, 2])
    batch = torch.tensor([0, 0, 0, 2, 2, 2, 2, 5, 5])
    assert_same(ref, ours, x, ei, batch)
    # Empty graphs first, as a PyG Batch of them gives: ids past the node count.
    assert_same(ref, ours, x, ei, torch.tensor([3, 3, 3, 6, 6, 6, 6, 12, 12]))


@pytest.mark.parametrize("backend", ["mp", "fused", "sdpa"])
def test_dropout_one_drops_everything_as_pygs(backend: str) -> None:
    # p = 1 is F.dropout's bound: PyG takes it, as dropout and as the attention's.
    ref, ours = make_pair("gin", 2, dropout=1.0, attn_kwargs={"dropout": 1.0})
    ref.train(), ours.train()
    x, ei, _, batch = make_batch(BATCHES["skewed"])
    assert_same(ref, ours, x, ei, batch, backend=backend)
    ref, ours = make_pair("gin", 2, attn_kwargs={"dropout": 1.0})
    ref.train(), ours.train()
    assert_same(ref, ours, x, ei, batch, backend=backend)
    with pytest.raises(ValueError, match=r"'attn_kwargs\['dropout'\]' in \[0, 1\], got 1.5"):
        GPSConv(C, None, heads=2, attn_kwargs={"dropout": 1.5})


@pytest.mark.parametrize("norm", ["batch_norm", "layer_norm", "graph_norm", None])
def test_training_mode_without_dropout_matches_pyg(norm: str | None) -> None:
    # Deterministic in training when every dropout is 0: batch statistics, and
    # norms that take the batch vector (graph_norm), and the running statistics
    # they update.
    ref, ours = make_pair("gin", 4, norm=norm)
    ref.train(), ours.train()
    x, ei, _, batch = make_batch(BATCHES["skewed"])
    assert_same(ref, ours, x, ei, batch)
    ours_buffers = dict(ours.named_buffers())
    for name, b in ref.named_buffers():
        if b.is_floating_point():
            assert_rel(ours_buffers[name], b, name)


def test_float32_close_to_pyg() -> None:
    ref, ours = make_pair("gcn", 4)
    ref, ours = ref.float().eval(), ours.float().eval()
    x, ei, _, batch = make_batch(BATCHES["skewed"])
    with torch.no_grad():
        torch.testing.assert_close(ours(x.float(), ei, batch), ref(x.float(), ei, batch))


# --------------------------------------------------------------------------- weights


def mha_weights(mha: torch.nn.MultiheadAttention, x: Tensor, sizes: list[int]):
    """``mha``'s weights per graph of the batch: ``[H, n, n]`` unaveraged and ``[n, n]``
    averaged over the heads (row: target, column: source)."""
    out = []
    for xg in x.split(sizes):
        xg = xg[None]
        _, per_head = mha(xg, xg, xg, need_weights=True, average_attn_weights=False)
        _, mean = mha(xg, xg, xg, need_weights=True)
        out.append((per_head[0], mean[0]))
    return out


def as_dense(edges: Tensor, alpha: Tensor, sizes: list[int]) -> list[Tensor]:
    """The ``[H, n, n]`` matrix of each graph from edge weights, after checking that the
    edges are exactly the node pairs of each graph, each once."""
    dense, start = [], 0
    for n in sizes:
        inside = (edges[1] >= start) & (edges[1] < start + n)
        src, dst = edges[:, inside] - start
        assert bool(((src >= 0) & (src < n)).all()), "an edge between two graphs"
        assert int(inside.sum()) == n * n and (dst * n + src).unique().numel() == n * n
        m = alpha.new_zeros(alpha.shape[1], n, n)
        m[:, dst, src] = alpha[inside].T
        dense.append(m)
        start += n
    assert sum(n * n for n in sizes) == edges.shape[1]  # no edge left over
    return dense


@pytest.mark.parametrize("backend", ["auto", "sdpa", "fused", "mp"])
@pytest.mark.parametrize("heads", [1, 4])
def test_attention_weights_are_multihead_attention_s(backend: str, heads: int) -> None:
    ref, ours = make_pair("gin", heads)
    ref.eval(), ours.eval()
    sizes = BATCHES["skewed"]
    x, ei, _, batch = make_batch(sizes)
    with torch.no_grad():
        out, (edges, alpha) = ours(x, ei, batch, return_attention_weights=True, backend=backend)
        # Asking for the weights changes nothing else: the output is PyG's.
        assert_rel(out, ours(x, ei, batch, backend=backend), "output with weights")
        assert_rel(out, ref(x, ei, batch), "output vs PyG")
        want = mha_weights(ref.attn, x, sizes)  # PyG's own MultiheadAttention
    assert alpha.shape == (edges.shape[1], heads)
    dense = as_dense(edges, alpha, sizes)
    for g, (got, (per_head, mean)) in enumerate(zip(dense, want, strict=True)):
        torch.testing.assert_close(got, per_head, rtol=1e-12, atol=1e-12, msg=f"graph {g}")
        torch.testing.assert_close(got.mean(0), mean, rtol=1e-12, atol=1e-12, msg=f"graph {g}")


def test_attention_weights_before_dropout_and_on_a_given_graph() -> None:
    conv = attention_only(0.5, 0.3)
    sizes = [7, 1, 12]
    x, ei, _, batch = make_batch(sizes)
    with torch.no_grad():
        _, (e_eval, a_eval) = conv.eval()(x, ei, batch, return_attention_weights=True)
        graph = gnnattn.AttentionGraph.from_batch(batch)
        out, (e_train, a_train) = conv.train()(
            x, ei, attn_graph=graph, return_attention_weights=True
        )
    # Dropout acts on the weights after they are returned, as in PyG's layers.
    assert torch.equal(e_train, graph.edge_index) and torch.equal(e_eval, e_train)
    torch.testing.assert_close(a_train, a_eval, rtol=1e-12, atol=1e-12)
    assert out.shape == x.shape


def test_attention_weights_of_each_layer_of_a_stack() -> None:
    # PyG's GraphGPS example stacks GPSConv layers: each returns its own weights,
    # those of MultiheadAttention on that layer's input.
    torch.manual_seed(0)
    layers = [GPSConv(C, make_conv("gin"), heads=2).double().eval() for _ in range(2)]
    sizes = [5, 9]
    x, ei, _, batch = make_batch(sizes)
    h, per_layer = x, []
    with torch.no_grad():
        for layer in layers:
            inputs = h
            h, (edges, alpha) = layer(h, ei, batch, return_attention_weights=True)
            per_layer.append((inputs, edges, alpha))
        for layer, (inputs, edges, alpha) in zip(layers, per_layer, strict=True):
            want = mha_weights(layer.attn, inputs, sizes)
            for got, (per_head, _) in zip(as_dense(edges, alpha, sizes), want, strict=True):
                torch.testing.assert_close(got, per_head, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(per_layer[0][2], per_layer[1][2])


# --------------------------------------------------------------------------- module


def test_state_dict_round_trips_both_ways_and_module_tree_is_pyg() -> None:
    ref, ours = make_pair("gin", 4, dropout=0.1, attn_kwargs={"dropout": 0.2})
    assert list(ours.state_dict()) == list(ref.state_dict())
    assert str(ours) == str(ref)
    assert ours.attn.dropout == 0.2 and ref.attn.dropout == 0.2
    # Same submodule names and kinds; gnnattn's Dropout is a torch.nn.Dropout.
    mods_r = dict(ref.named_modules())
    mods_o = dict(ours.named_modules())
    assert mods_o.keys() == mods_r.keys()
    for name, m in mods_r.items():
        if name:  # the root is gnnattn's class
            assert isinstance(mods_o[name], type(m)), name
    assert isinstance(ours.mlp[2], gnnattn.nn.Dropout) and str(ours.mlp) == str(ref.mlp)
    # PyG -> ours was make_pair; now ours (changed) -> a fresh PyG layer.
    with torch.no_grad():
        for p in ours.parameters():
            p.mul_(1.5)
    back = pyg_nn.GPSConv(C, make_conv("gin"), heads=4, dropout=0.1).double()
    back.load_state_dict(ours.state_dict())
    for (n, a), (_, b) in zip(back.state_dict().items(), ours.state_dict().items(), strict=True):
        assert torch.equal(a, b), n
    back.eval(), ours.eval()
    x, ei, _, batch = make_batch(BATCHES["skewed"])
    assert_same(back, ours, x, ei, batch)


def test_same_initialization_as_pyg_and_reset_parameters_resets_all() -> None:
    torch.manual_seed(3)
    ref = pyg_nn.GPSConv(C, make_conv("gcn"), heads=2, norm="layer_norm")
    torch.manual_seed(3)
    ours = GPSConv(C, make_conv("gcn"), heads=2, norm="layer_norm")
    for (n, a), b in zip(ref.state_dict().items(), ours.state_dict().values(), strict=True):
        assert torch.equal(a, b), n
    # reset_parameters resets every parameter; PyG's leaves attn.out_proj.weight as it is.
    with torch.no_grad():
        for p in ours.parameters():
            p.fill_(7.0)
    ours.reset_parameters()
    for n, p in ours.named_parameters():
        assert not bool((p == 7.0).all()), n


def test_exported_and_backend_for() -> None:
    assert gnnattn.GPSConv is GPSConv and "GPSConv" in gnnattn.__all__
    assert "GPSConv" in gnnattn.nn.__all__
    conv = GPSConv(8, None, heads=2)
    x = torch.randn(6, 8)
    batch = torch.tensor([0, 1, 1, 1, 1, 1])
    assert conv.backend_for(x, batch).backend == "sdpa"
    assert conv.backend_for(x, batch, backend="fused").backend == "fused"
    assert GPSConv(8, None, heads=2, backend="fused").backend_for(x, batch).backend == "fused"


def test_empty_input() -> None:
    conv = GPSConv(8, None, heads=2, norm=None).eval()
    out = conv(torch.randn(0, 8), torch.zeros(2, 0, dtype=torch.long), torch.zeros(0).long())
    assert out.shape == (0, 8)


# --------------------------------------------------------------------------- dropout


def attention_only(p_attn: float, p: float) -> GPSConv:
    """A layer whose output minus ``x`` is the dropped global attention alone (no conv,
    no norm, an MLP that outputs zeros)."""
    torch.manual_seed(0)
    conv = GPSConv(C, None, heads=4, dropout=p, norm=None, attn_kwargs={"dropout": p_attn})
    conv = conv.double()
    with torch.no_grad():
        for lin in (conv.mlp[0], conv.mlp[3]):
            lin.weight.zero_()
            lin.bias.zero_()
    return conv


def test_activation_dropout_zeroes_and_rescales() -> None:
    p = 0.3
    conv = attention_only(0.0, p)
    x, ei, _, batch = make_batch([50, 7, 200, 1])
    with torch.no_grad():
        clean = conv.eval()(x, ei, batch) - x
        conv.train()
        torch.manual_seed(11)
        a = conv(x, ei, batch) - x
        torch.manual_seed(11)
        b = conv(x, ei, batch) - x
    assert torch.equal(a, b)  # torch.manual_seed fixes the masks
    kept = a != 0
    n = kept.numel()
    frac = 1 - float(kept.double().mean())
    assert abs(frac - p) < 5 * math.sqrt(p * (1 - p) / n), frac
    torch.testing.assert_close(a[kept], clean[kept] / (1 - p), rtol=1e-12, atol=1e-12)


def test_attention_dropout_is_mha_dropout_unbiased() -> None:
    # attn_kwargs["dropout"] drops attention weights while training: the outputs
    # vary, and their mean over many draws is the evaluation output.
    p = 0.4
    conv = attention_only(p, 0.0)
    x, ei, _, batch = make_batch([30, 5, 12])
    with torch.no_grad():
        clean = conv.eval()(x, ei, batch) - x
        conv.train()
        draws = torch.stack([conv(x, ei, batch) - x for _ in range(400)])
    assert not torch.equal(draws[0], draws[1])
    assert not torch.allclose(draws[0], clean)
    mean, std = draws.mean(0), draws.std(0)
    # Per element the mean of 400 draws is within 6 standard errors of the clean value.
    z = (mean - clean).abs() / (std / math.sqrt(draws.shape[0]) + 1e-12)
    assert float(z.max()) < 6.0, float(z.max())
    # The evaluation output is PyG's.
    ref = pyg_nn.GPSConv(C, None, heads=4, norm=None, attn_kwargs={"dropout": p}).double()
    ref.load_state_dict(conv.state_dict())
    with torch.no_grad():
        assert_rel(conv.eval()(x, ei, batch), ref.eval()(x, ei, batch), "eval output")


def test_dropout_off_in_eval() -> None:
    conv = attention_only(0.5, 0.5).eval()
    x, ei, _, batch = make_batch([9, 4])
    with torch.no_grad():
        assert torch.equal(conv(x, ei, batch), conv(x, ei, batch))


# --------------------------------------------------------------------------- errors


def test_performer_is_not_provided() -> None:
    with pytest.raises(ValueError, match="performer.*torch_geometric.nn.GPSConv"):
        GPSConv(C, None, attn_type="performer")
    with pytest.raises(ValueError, match="'attn_type'.*'bigbird'"):
        GPSConv(C, None, attn_type="bigbird")


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"channels": 10, "heads": 4}, ValueError, "divisible by 'heads'"),
        ({"channels": 0}, ValueError, "'channels'"),
        ({"heads": 1.5}, TypeError, "'heads'"),
        ({"dropout": 1.5}, ValueError, r"'dropout' in \[0, 1\], got 1.5"),
        ({"backend": "dense"}, ValueError, "'backend'"),
        ({"attn_kwargs": {"add_bias_kv": True}}, ValueError, "add_bias_kv"),
        ({"attn_kwargs": {"add_zero_attn": True}}, ValueError, "add_zero_attn"),
        ({"attn_kwargs": {"kdim": 8}}, ValueError, "kdim"),
    ],
)
def test_constructor_errors(kwargs: dict, error: type, match: str) -> None:
    args = {"channels": C, "conv": None, **kwargs}
    with pytest.raises(error, match=match):
        GPSConv(**args)


def test_forward_errors() -> None:
    conv = GPSConv(C, None, heads=2)
    x = torch.randn(5, C)
    ei = torch.zeros(2, 0, dtype=torch.long)
    with pytest.raises(ValueError, match="sorted"):
        conv(x, ei, torch.tensor([0, 1, 0, 1, 1]))
    with pytest.raises(ValueError, match="ids >= 0, got -1"):
        conv(x, ei, torch.tensor([-1, 0, 0, 1, 1]))
    with pytest.raises(ValueError, match=r"'batch' of shape \[5\].*got \[4\]"):
        conv(x, ei, torch.tensor([0, 0, 1, 1]))
    with pytest.raises(TypeError, match="'batch' of dtype torch.int64 or torch.int32, got torch.f"):
        conv(x, ei, torch.zeros(5))
    with pytest.raises(TypeError, match="'batch' to be a Tensor, got list"):
        conv(x, ei, [0, 0, 0, 1, 1])
    with pytest.raises(ValueError, match=r"'x' of shape \[N, 16\]"):
        conv(torch.randn(5, 8), ei)


def test_unsorted_batch_rejected_before_the_local_conv_runs() -> None:
    calls = []
    conv = GPSConv(C, pyg_nn.GCNConv(C, C), heads=2)
    conv.conv.register_forward_hook(lambda *_: calls.append(1))
    with pytest.raises(ValueError, match="sorted"):
        conv(torch.randn(3, C), torch.tensor([[0], [1]]), torch.tensor([1, 0, 1]))
    assert not calls


def test_conv_kwargs_reach_the_local_conv() -> None:
    ref, ours = make_pair("gine", 2)
    ref.eval(), ours.eval()
    x, ei, ea, batch = make_batch([3, 6])
    with torch.no_grad():
        one, two = ours(x, ei, batch, edge_attr=ea), ours(x, ei, batch, edge_attr=2 * ea)
    assert not torch.equal(one, two)
