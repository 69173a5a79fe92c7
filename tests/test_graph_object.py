"""The graph object: built once, held by the caller, safe in every mode, equal to plain edges."""

from __future__ import annotations

import copy
import gc
import pickle
import threading
import weakref

import pytest
import torch
from torch_geometric import EdgeIndex

import gnnattn.graphs.graph as graph_module
from gnnattn import (
    AttentionGraph,
    SelfAttentionConv,
    SimplifiedAttention,
    attention,
    causal_graph,
    complete_graph,
    dense_self_attention,
    edge_index_to_mask,
    sliding_window_graph,
)
from gnnattn.graphs import Structure
from gnnattn.nn import GraphTransformer

TOL = 1e-10  # float64: only summation order differs between paths
D, H = 8, 2
BACKENDS = ("mp", "sdpa", "fused", "auto")


def random_graph(n: int, e: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, n, (2, e), generator=gen)


def layer64(**kw) -> SelfAttentionConv:
    torch.manual_seed(0)
    return SelfAttentionConv(D, H, **kw).double()


# --------------------------------------------------------------------------- structure


def test_builders_know_their_structure_without_detection(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("detect_structure called for a built graph")

    monkeypatch.setattr(graph_module, "detect_structure", fail)
    batch = torch.tensor([0, 0, 0, 1, 1, 2])
    cases = [
        (AttentionGraph.complete(5), Structure("complete", (5,)), complete_graph(5)),
        (AttentionGraph.causal(5), Structure("causal", (5,)), causal_graph(5)),
        (
            AttentionGraph.causal(batch=batch),
            Structure("causal", (3, 2, 1)),
            causal_graph(batch=batch),
        ),
        (
            AttentionGraph.window(7, window=2),
            Structure("window", (7,), 2),
            sliding_window_graph(7, window=2),
        ),
        (
            AttentionGraph.window(7, window=2, causal=True, batch=torch.tensor([0] * 4 + [1] * 3)),
            Structure("causal_window", (4, 3), 2),
            sliding_window_graph(7, window=2, causal=True, batch=torch.tensor([0] * 4 + [1] * 3)),
        ),
    ]
    for g, structure, edges in cases:
        assert g.structure == structure
        assert g._edge_index is None  # nothing built until a backend needs it
        assert g.num_edges == edges.shape[1] == structure.num_edges
        assert torch.equal(g.edge_index, edges)
    # A window as wide as the sequence is the complete graph.
    assert AttentionGraph.window(4, window=3).structure == Structure("complete", (4,))


def test_explicit_edges_detected_once_and_pruned_once(monkeypatch):
    calls = {"detect": 0, "prune": 0}
    detect = graph_module.detect_structure
    prune = AttentionGraph._prune_causal

    def counting_detect(*args, **kwargs):
        calls["detect"] += 1
        return detect(*args, **kwargs)

    def counting_prune(self):
        calls["prune"] += 1
        return prune(self)

    monkeypatch.setattr(graph_module, "detect_structure", counting_detect)
    monkeypatch.setattr(AttentionGraph, "_prune_causal", counting_prune)
    layer = layer64(causal=True)
    x = torch.randn(6, D, dtype=torch.float64)
    graph = AttentionGraph(complete_graph(6))
    outs = [layer(x, graph) for _ in range(4)]
    assert calls["prune"] == 1  # the causal view, made once and kept by the graph
    assert calls["detect"] == 1  # the causal view's structure, once
    assert graph.causal_view() is graph.causal_view()
    assert graph.causal_view().structure == Structure("causal", (6,))
    for out in outs[1:]:
        assert torch.equal(out, outs[0])
    assert torch.allclose(outs[0], layer(x, causal_graph(6)), atol=TOL)
    # Built with causal=True: pruned at construction, once.
    calls["prune"] = 0
    g = AttentionGraph(random_graph(6, 30), 6, causal=True)
    for _ in range(3):
        layer(x, g)
    assert calls["prune"] == 1 and g.is_causal
    assert bool((g.edge_index[0] <= g.edge_index[1]).all())


@pytest.mark.parametrize("host", [True, False], ids=["numba", "torch"])
def test_transposed_csr_built_once_per_graph(monkeypatch, host):
    import gnnattn.kernels.cpu as cpu_module

    calls = []
    # Every graph's backward over the transposed CSR (not the small graphs' pass over the CSR).
    monkeypatch.setattr(cpu_module.backward, "CSR_SOURCE_PASS_MAX", 0)
    # On the host the CSC is made with its plan in one compiled pass; elsewhere
    # (and under compile) by transpose_csr.
    if host:
        owner, name = cpu_module, "csc_plan_tensors"
    else:
        monkeypatch.setattr(graph_module, "_on_host", lambda t: False)
        owner, name = graph_module, "_transpose_csr"
    build = getattr(owner, name)

    def counting(*args, **kwargs):
        calls.append(1)
        return build(*args, **kwargs)

    monkeypatch.setattr(owner, name, counting)
    layer = layer64(backend="fused")
    graph = AttentionGraph(random_graph(12, 50), 12)
    for _ in range(4):
        x = torch.randn(12, D, dtype=torch.float64, requires_grad=True)
        layer(x, graph).sum().backward()
        assert x.grad is not None and torch.isfinite(x.grad).all()
    assert len(calls) == 1
    # A plain edge_index has no owner to keep it: built on each backward.
    ei = random_graph(12, 50)
    for _ in range(2):
        layer(torch.randn(12, D, dtype=torch.float64, requires_grad=True), ei).sum().backward()
    assert len(calls) == 3


def test_small_graph_backward_makes_no_transposed_csr(monkeypatch):
    """A graph of little work (a batch of molecules) has its backward's source pass done
    over the CSR: no transposed CSR is made, on the graph or in the op, and
    the gradients are those of the pass over the transposed CSR (which recomputes the
    weights here, no bias or edge features: equal to rounding)."""
    import gnnattn.kernels.cpu as cpu_module
    from gnnattn.kernels.cpu import op

    csr_calls = []
    real = op.src_csr

    def spy(*args):
        csr_calls.append(1)
        return real(*args)

    def no_transpose(*args, **kwargs):
        raise AssertionError("the op made a transposed CSR")

    monkeypatch.setattr(op, "src_csr", spy)
    monkeypatch.setattr(op, "transpose_csr", no_transpose)
    layer = layer64(backend="fused")
    ei = random_graph(12, 50)
    x = torch.randn(12, D, dtype=torch.float64)
    grads = []
    for limit in (cpu_module.backward.CSR_SOURCE_PASS_MAX, 0):
        monkeypatch.setattr(cpu_module.backward, "CSR_SOURCE_PASS_MAX", limit)
        graph = AttentionGraph(ei, 12)
        xx = x.clone().requires_grad_()
        layer(xx, graph).sum().backward()
        assert (graph._csc is None) == (limit > 0)
        assert len(csr_calls) == 1  # the first call only
        grads.append([xx.grad, *(p.grad.clone() for p in layer.parameters())])
        layer.zero_grad()
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------- equality


def _weights_dense(ei: torch.Tensor, alpha: torch.Tensor, n: int) -> torch.Tensor:
    w = torch.zeros(alpha.shape[1], n, n, dtype=alpha.dtype)
    for h in range(alpha.shape[1]):
        w[h].index_put_((ei[1], ei[0]), alpha[:, h], accumulate=True)
    return w


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["complete", "causal", "window", "sparse", "shuffled"])
def test_graph_object_equals_edge_index_equals_dense(kind, backend):
    n = 9
    ei = {
        "complete": complete_graph(n),
        "causal": causal_graph(n),
        "window": sliding_window_graph(n, window=2),
        "sparse": random_graph(n, 30).unique(dim=1).contiguous(),
        "shuffled": complete_graph(n)[
            :, torch.randperm(n * n, generator=torch.Generator().manual_seed(1))
        ],
    }[kind]
    layer = layer64(backend=backend)
    x = torch.randn(n, D, dtype=torch.float64)
    if kind == "sparse" and backend == "sdpa":
        with pytest.raises(ValueError, match="needs a graph of known structure"):
            layer(x, AttentionGraph(ei, n))
        return
    mask = edge_index_to_mask(ei, n)
    xr = x.clone().requires_grad_()
    ref = dense_self_attention(layer, xr, mask)
    (ref_grad,) = torch.autograd.grad(ref.sum(), xr)
    ref = ref.detach()
    results = []
    for g in (ei, AttentionGraph(ei, n), EdgeIndex(ei, sparse_size=(n, n))):
        xx = x.clone().requires_grad_()
        out, (ei_out, alpha) = layer(xx, g, return_attention_weights=True)
        assert torch.equal(ei_out, ei)  # weights come in the caller's edge order
        (grad,) = torch.autograd.grad(out.sum(), xx)
        results.append((out, alpha, grad))
    for out, alpha, grad in results:
        assert (out - ref).abs().max() < TOL
        assert (alpha - results[0][1]).abs().max() < TOL
        assert (grad - ref_grad).abs().max() < TOL
        sums = torch.zeros(n, H, dtype=alpha.dtype).index_add_(0, ei[1], alpha)
        assert torch.allclose(sums, torch.ones_like(sums), atol=TOL)


@pytest.mark.filterwarnings("ignore:Sparse:UserWarning")
@pytest.mark.parametrize("layout", ["coo", "csr", "csc"])
def test_sparse_adjacency_in_pyg_adj_t_convention(layout):
    n = 7
    ei = random_graph(n, 20, seed=3).unique(dim=1)
    # adj_t: row = target, column = source.
    adj = torch.sparse_coo_tensor(torch.stack([ei[1], ei[0]]), torch.ones(ei.shape[1]), (n, n))
    adj = {"coo": adj, "csr": adj.to_sparse_csr(), "csc": adj.to_sparse_csc()}[layout]
    layer = layer64(backend="mp")
    x = torch.randn(n, D, dtype=torch.float64)
    ref = dense_self_attention(layer, x, edge_index_to_mask(ei, n))
    out, (ei_out, alpha) = layer(x, adj, return_attention_weights=True)
    assert (out - ref).abs().max() < TOL
    assert ei_out.shape == ei.shape
    assert torch.equal(edge_index_to_mask(ei_out, n), edge_index_to_mask(ei, n))
    graph = AttentionGraph(adj)
    assert graph.num_nodes == n and graph.num_edges == ei.shape[1]
    assert (layer(x, graph, backend="fused") - ref).abs().max() < TOL


def test_bipartite_graph_object_and_edge_index():
    m, n = 5, 3
    layer = layer64()
    xs, xd = torch.randn(m, D, dtype=torch.float64), torch.randn(n, D, dtype=torch.float64)
    ref = layer.to_torch()(xd[None], xs[None], xs[None])[0][0]
    ei = torch.stack(
        [torch.arange(m).repeat(n), torch.arange(n).repeat_interleave(m)]
    )  # every target, every source
    for g in (None, AttentionGraph.bipartite(m, n), AttentionGraph(ei, n, num_src=m)):
        for backend in ("mp", "fused", "auto"):
            assert (layer((xs, xd), g, backend=backend) - ref).abs().max() < TOL
    with pytest.raises(ValueError, match="5 source and 3 target rows"):
        layer((xs[:4], xd), AttentionGraph.bipartite(m, n))


# --------------------------------------------------------------------------- modes


@pytest.mark.parametrize("backend", BACKENDS)
def test_inference_mode_then_training_on_the_same_graph(backend):
    n = 8
    batch = torch.tensor([0] * 5 + [1] * 3)
    layer = SelfAttentionConv(D, H, backend=backend)
    model = GraphTransformer(2, D, H, backend=backend)
    ei = complete_graph(n) if backend == "sdpa" else random_graph(n, 30)
    graph = AttentionGraph(ei, n)
    with torch.inference_mode():
        ei_inf = ei.clone()  # an inference tensor, as users make them
        graph_inf = AttentionGraph(ei_inf, n)
        x = torch.randn(n, D)
        for g in (ei, graph, ei_inf, graph_inf):
            layer(x, g)
            model(x, g)
        if backend != "fused":  # batch= builds structured graphs
            layer(x, batch=batch)
            model(x, batch=batch)
    x = torch.randn(n, D, requires_grad=True)
    for g in (ei, graph, ei_inf, graph_inf):
        layer(x, g).sum().backward()
        model(x, g).sum().backward()
    if backend != "fused":
        layer(x, batch=batch).sum().backward()
        model(x, batch=batch).sum().backward()
    with torch.no_grad():
        layer(x, graph)
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_graph_dies_with_its_owner():
    layer = SelfAttentionConv(D, H)
    x = torch.randn(10, D, requires_grad=True)
    ei = random_graph(10, 40)
    ref = weakref.ref(ei)
    for backend in ("mp", "fused", "auto"):
        layer(x, ei, backend=backend).sum().backward()
    del ei
    gc.collect()
    assert ref() is None
    # 40 fresh graphs, used and dropped: nothing of them stays alive.
    refs = []
    for i in range(40):
        e = random_graph(10, 40, seed=i)
        g = AttentionGraph(e, 10)
        layer(x, g).sum().backward()
        refs += [weakref.ref(e), weakref.ref(g), weakref.ref(g.csr.col), weakref.ref(g.csc.perm)]
        del e, g
    gc.collect()
    assert sum(r() is not None for r in refs) == 0


def test_threads_on_one_layer_give_sequential_results():
    torch.manual_seed(0)
    layer = SelfAttentionConv(D, H).double()
    graphs = [AttentionGraph(random_graph(30, 120, seed=i), 30) for i in range(8)]
    plain = [random_graph(30, 120, seed=100 + i) for i in range(8)]
    x = torch.randn(30, D, dtype=torch.float64)
    jobs = graphs + plain + [graphs[0]] * 4  # one graph object shared by threads too
    want = [layer(x, g) for g in jobs]
    fresh = [AttentionGraph(random_graph(30, 120, seed=i), 30) for i in range(8)]
    jobs_fresh = fresh + plain + [fresh[0]] * 4  # lazy builds race on fresh objects
    got: list[torch.Tensor | None] = [None] * len(jobs)
    errors = []

    def work(i: int) -> None:
        try:
            xx = x.clone().requires_grad_()
            out = layer(xx, jobs_fresh[i])
            out.sum().backward()
            got[i] = out.detach()
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for a, b in zip(got, want, strict=True):
        assert a is not None and torch.equal(a, b.detach())


def test_to_device_copy_and_pickle():
    g = AttentionGraph(random_graph(6, 20), 6)
    _ = g.csr, g.csc, g.structure
    assert g.to("cpu") is g
    meta = g.to("meta")
    assert meta.device.type == "meta" and meta.csr.col.device.type == "meta"
    assert meta.num_edges == g.num_edges and g.csr.col.device.type == "cpu"
    for clone in (copy.deepcopy(g), pickle.loads(pickle.dumps(g))):
        assert torch.equal(clone.edge_index, g.edge_index)
        assert torch.equal(clone.csc.perm, g.csc.perm)
    pyg = g.to_pyg()
    assert isinstance(pyg, EdgeIndex) and pyg.sparse_size() == (6, 6)
    assert torch.equal(AttentionGraph(pyg).edge_index, g.edge_index)


def test_compile_with_a_graph_object_built_outside():
    torch._dynamo.reset()
    layer = SelfAttentionConv(D, H, backend="mp")
    graph = AttentionGraph(random_graph(10, 40), 10)
    x = torch.randn(10, D)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    assert (compiled(x, graph) - layer(x, graph)).abs().max() < 1e-5


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "make, exc, match",
    [
        (lambda: AttentionGraph(torch.tensor([[0, 1], [1, 5]]), 3), ValueError, "target ids"),
        (lambda: AttentionGraph(torch.tensor([[0, -1], [1, 1]]), 3), ValueError, ">= 0, got -1"),
        (
            lambda: AttentionGraph(torch.tensor([[0.0, 1.0], [1.0, 1.0]])),
            TypeError,
            "dtype torch.int64",
        ),
        (
            lambda: AttentionGraph(torch.zeros(3, 4, dtype=torch.long)),
            ValueError,
            r"shape \[2, E\], got \[3, 4\]",
        ),
        (lambda: AttentionGraph([[0, 1], [1, 0]]), TypeError, "'edge_index' to be a Tensor"),
        (
            lambda: AttentionGraph.causal(batch=torch.tensor([1, 0])),
            ValueError,
            "'batch' to be sorted",
        ),
        (
            lambda: AttentionGraph.causal(3, batch=torch.tensor([0, 0])),
            ValueError,
            "'batch' of length 3",
        ),
        (
            lambda: AttentionGraph(
                torch.sparse_coo_tensor(torch.zeros(2, 0, dtype=torch.long), [], (3, 4))
            ),
            ValueError,
            "square adjacency",
        ),
        (
            lambda: AttentionGraph(EdgeIndex(torch.tensor([[0], [1]]), sparse_size=(3, 3)), 4),
            ValueError,
            "sparse_size",
        ),
    ],
)
def test_bad_graph_input(make, exc, match):
    with pytest.raises(exc, match=match):
        make()


def test_graph_used_with_the_wrong_x():
    layer = SelfAttentionConv(D, H)
    graph = AttentionGraph(random_graph(6, 20), 6)
    _ = graph.csr
    before = dict(graph.__dict__)
    with pytest.raises(ValueError, match="'x' with 6 rows"):
        layer(torch.randn(5, D), graph)
    with pytest.raises(ValueError, match="graph on the device of x"):
        layer(torch.randn(6, D), graph.to("meta"))
    with pytest.raises(ValueError, match="either 'edge_index' or 'batch'"):
        layer(torch.randn(6, D), graph, batch=torch.zeros(6, dtype=torch.long))
    with pytest.raises(ValueError, match="'x' with 6 rows"):
        SimplifiedAttention()(torch.randn(7, 3), graph)
    assert graph.__dict__.keys() == before.keys()
    assert all(graph.__dict__[k] is v for k, v in before.items())


# --------------------------------------------------------------------------- review regressions


def test_int32_edges_and_uncoalesced_coo_made_in_inference_mode_then_training():
    layer = SelfAttentionConv(D, H, backend="mp")
    ei = torch.randint(0, 8, (2, 30), generator=torch.Generator().manual_seed(3)).int()
    with torch.inference_mode():
        g = AttentionGraph(ei, 8)
        adj = torch.sparse_coo_tensor(
            torch.tensor([[1, 2, 0, 0], [0, 1, 2, 1]]), torch.ones(4), (3, 3)
        )  # not coalesced
        layer(torch.randn(8, D), g)
        layer(torch.randn(3, D), adj)
    x = torch.randn(8, D, requires_grad=True)
    layer(x, g).sum().backward()
    x3 = torch.randn(3, D, requires_grad=True)
    layer(x3, adj).sum().backward()
    assert x.grad is not None and x3.grad is not None


def test_composed_graphs_and_orders_made_in_inference_mode_then_training():
    from gnnattn.graphs import expander_graph, exphormer_graph, reorder, with_virtual_nodes

    ring = torch.tensor([[0, 1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 0]])
    with torch.inference_mode():
        graphs = [
            (exphormer_graph(ring, 6, expander_degree=2, virtual_nodes=1, seed=0), 7),
            (expander_graph(8, 3, seed=0), 8),
            (with_virtual_nodes(ring, 1, 6), 7),
        ]
        order = reorder(sliding_window_graph(6, window=1))
    layer = SelfAttentionConv(D, H)
    for graph, n in graphs:
        x = torch.randn(n, D, requires_grad=True)
        layer(x, graph).sum().backward()
        assert x.grad is not None
    x = torch.randn(6, D, requires_grad=True)
    order.apply(x).sum().backward()
    assert torch.equal(x.grad, torch.ones(6, D))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_sparse_csr_adjacency_made_in_inference_mode_then_training(dtype):
    adj = torch.sparse_csr_tensor(
        torch.tensor([0, 1, 3, 4], dtype=dtype),
        torch.tensor([0, 0, 2, 1], dtype=dtype),
        torch.ones(4),
        (3, 3),
    )
    with torch.inference_mode():
        graph = AttentionGraph(adj)
    q = torch.randn(3, 2, 4, requires_grad=True)
    attention(q, q, q, graph, backend="fused").sum().backward()
    want = torch.autograd.grad(attention(q, q, q, graph, backend="mp").sum(), q)[0]
    assert q.grad is not None
    torch.testing.assert_close(q.grad, want)


@pytest.mark.parametrize("materialize", [False, True])
def test_causal_view_keeps_structure_and_edge_attr_order(materialize):
    conv = SelfAttentionConv(D, H, causal=True, edge_dim=3).double()
    x = torch.randn(5, D, dtype=torch.float64)
    ea = torch.randn(25, 3, dtype=torch.float64)  # one row per edge of complete_graph(5)
    g = AttentionGraph.complete(5)
    if materialize:
        _ = g.edge_index
    got = conv(x, g, ea)
    want = conv(x, complete_graph(5), ea)  # plain edges: pruned with edge_attr
    assert (got - want).abs().max() < TOL
    assert g.causal_view().structure == Structure("causal", (5,))
    batch = torch.tensor([0] * 6 + [1] * 5)
    w = AttentionGraph.window(window=2, batch=batch)
    if materialize:
        _ = w.edge_index
    assert w.causal_view().structure == Structure("causal_window", (6, 5), 2)
    sdpa = SelfAttentionConv(D, H, causal=True, backend="sdpa").double()
    ref = dense_self_attention(sdpa, torch.randn(11, D, dtype=torch.float64), None)
    assert ref.shape == (11, D)
    out = sdpa(torch.randn(11, D, dtype=torch.float64), w)
    assert out.shape == (11, D)


@pytest.mark.parametrize("materialize", [False, True])
def test_input_edges_of_every_kind_of_causal_graph(materialize):
    """input_edges / num_input_edges index the edges as given before causal pruning: of an
    edge_index, of a graph object, and of a structured graph whether or not its edges
    were built (then its causal view's parent's)."""
    ei = complete_graph(5)
    want = (ei[0] <= ei[1]).nonzero().view(-1)
    structured = AttentionGraph.complete(5)
    if materialize:
        _ = structured.edge_index
    for g in (AttentionGraph(ei, causal=True), AttentionGraph(ei).causal_view()):
        assert g.num_input_edges == 25 and torch.equal(g.input_edges, want)
    view = structured.causal_view()
    assert view.num_input_edges == 25 and view.num_edges == 15
    assert torch.equal(view.input_edges, want)
    assert torch.equal(view.edge_index, ei[:, want])
    kept = AttentionGraph(AttentionGraph.causal(5).edge_index, causal=True)
    assert kept.input_edges is None and kept.num_input_edges == kept.num_edges == 15


def test_devices_sizes_and_messages():
    layer = SelfAttentionConv(D, H)
    assert layer(torch.randn(5, D), AttentionGraph.causal(5).to("cpu:0")).shape == (5, D)
    assert AttentionGraph.causal(5, device="cpu:0").device == torch.device("cpu")
    g = AttentionGraph(torch.tensor([[5, 6], [0, 1]]), num_src=7)
    assert (g.num_src, g.num_dst, g.is_bipartite) == (7, 2, True)
    with pytest.raises(ValueError, match="square graph with causal=True"):
        AttentionGraph(torch.tensor([[0, 3], [1, 2]]), 3, num_src=4, causal=True)
    adj = torch.sparse_coo_tensor(torch.tensor([[1, 2], [0, 1]]), torch.ones(2), (3, 3))
    with pytest.raises(ValueError, match="'x' with 3 rows"):
        layer(torch.randn(5, D), adj)
    with pytest.raises(ValueError, match="'x' with 3 rows"):
        layer(torch.randn(5, D), EdgeIndex(torch.tensor([[0, 1], [1, 2]]), sparse_size=(3, 3)))
    rect = torch.sparse_coo_tensor(torch.tensor([[1], [0]]), torch.ones(1), (3, 4))
    with pytest.raises(ValueError, match=r"pair \(x_src, x_dst\)"):
        layer(torch.randn(3, D), rect)
    with pytest.raises(ValueError, match="explicit 'edge_index' with 'edge_attr'"):
        GraphTransformer(1, D, H, edge_dim=2)(torch.randn(4, D), edge_attr=torch.randn(16, 2))


def test_threads_get_their_own_attention_weights():
    torch.manual_seed(0)
    layer = SelfAttentionConv(D, H, backend="mp").double()
    graphs = [AttentionGraph(random_graph(20, 60 + i, seed=i), 20) for i in range(12)]
    x = torch.randn(20, D, dtype=torch.float64)
    want = [layer(x, g, return_attention_weights=True)[1][1] for g in graphs]
    got: list[torch.Tensor | None] = [None] * len(graphs)

    def work(i: int) -> None:
        for _ in range(5):
            got[i] = layer(x, graphs[i], return_attention_weights=True)[1][1]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(graphs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for a, b in zip(got, want, strict=True):
        assert a is not None and torch.equal(a, b)


@pytest.mark.parametrize("backend", ["mp", "fused", "tiles", "auto"])
def test_edges_changed_in_place_are_refused_on_every_backend(backend):
    """The graph keeps the caller's edge_index (no copy) and its version: an
    in-place change after the CSR was built raises instead of letting the
    backends read different edges (or a tile plan made from the old ones)."""
    from gnnattn import SelfAttentionConv

    ei = torch.randint(0, 12, (2, 40))
    graph = AttentionGraph(ei, 12)
    layer = SelfAttentionConv(8, num_heads=2)
    x = torch.randn(12, 8)
    layer(x, graph, backend="fused")  # the CSR and plans now exist
    layer(x, graph, backend="tiles")  # and the tile plan
    ei[0, 0] = (ei[0, 0] + 1) % 12
    with pytest.raises(ValueError, match="modified in place"):
        layer(x, graph, backend=backend)
    fresh = AttentionGraph(ei, 12)
    torch.testing.assert_close(
        layer(x, fresh, backend="mp"), layer(x, fresh, backend="fused"), atol=1e-5, rtol=1e-5
    )


@pytest.mark.parametrize(
    "copy_of",
    [copy.copy, copy.deepcopy, lambda g: pickle.loads(pickle.dumps(g)), lambda g: g.to("meta")],
)
def test_a_copy_does_not_hide_an_in_place_change(copy_of):
    # A copy starts a fresh version count: it carried the stale CSR unnoticed.
    ei = torch.tensor([[0, 1, 2], [1, 2, 0]])
    graph = AttentionGraph(ei, 3)
    assert graph.csr.ptr.numel() == 4  # built
    ei[0, 0] = 2
    with pytest.raises(ValueError, match="modified in place"):
        copy_of(graph)


@pytest.mark.parametrize("backend", ["sdpa", "auto"])
def test_a_detected_structure_is_not_kept_after_an_in_place_change(backend):
    """A complete graph detected as such runs SDPA without reading its edges: an
    in-place change to them afterwards still raises, as does its causal view's."""
    q = k = v = torch.randn(4, 1, 2)
    ei = complete_graph(4)
    graph = AttentionGraph(ei)
    assert graph.structure is not None and graph.structure.kind == "complete"
    attention(q, k, v, graph, backend=backend)
    view = graph.causal_view()
    ei[0, 1] = 0
    with pytest.raises(ValueError, match="modified in place"):
        attention(q, k, v, graph, backend=backend)
    with pytest.raises(ValueError, match="modified in place"):
        graph.causal_view()
    assert view.num_edges == 10


def _sparse(ei: torch.Tensor, n: int, layout: str) -> torch.Tensor:
    adj_t = torch.sparse_coo_tensor(ei.flip(0), torch.ones(ei.shape[1]), (n, n)).coalesce()
    return {"coo": adj_t, "csr": adj_t.to_sparse_csr(), "csc": adj_t.to_sparse_csc()}[layout]


def _indices_of(adj_t: torch.Tensor) -> torch.Tensor:
    if adj_t.layout == torch.sparse_coo:
        return adj_t._indices()[1]
    if adj_t.layout == torch.sparse_csr:
        return adj_t.col_indices()
    return adj_t.row_indices()


@pytest.mark.parametrize(
    "given", ["int32", "causal", "coo", "csr", "csc", "causal view", "EdgeIndex"]
)
def test_an_in_place_change_is_refused_where_the_graph_holds_a_copy(given):
    """int32 ids, pruned edges and a sparse adjacency's indices are converted (or kept
    as given, a CSR's); a later change in place of the caller's tensor raised only
    for an int64 edge_index: the others kept training on the old edges, and a CSR
    adjacency's cached transposed CSR gave wrong gradients."""
    ei = torch.tensor([[1, 0, 2, 0, 3], [0, 1, 1, 2, 3]])
    if given == "int32":
        src = ei.int()
        graph = AttentionGraph(src, 4)
    elif given == "causal":
        src = ei
        graph = AttentionGraph(src, 4, causal=True)
    elif given == "causal view":
        src = ei
        graph = AttentionGraph(src, 4).causal_view()
    elif given == "EdgeIndex":  # its as_tensor() view has a version counter of its own
        src = EdgeIndex(ei, sparse_size=(4, 4))
        graph = AttentionGraph(src)
    else:
        adj_t = _sparse(ei, 4, given)
        src = _indices_of(adj_t)
        graph = AttentionGraph(adj_t)
    graph.prepare()
    q = torch.randn(4, 1, 2, dtype=torch.float64)
    attention(q, q, q, graph)  # reads as built
    src[(0, 1) if src.dim() == 2 else 0] = 3  # an edge's source becomes node 3
    with pytest.raises(ValueError, match="modified in place"):
        attention(q, q, q, graph)


@pytest.mark.parametrize("layout", ["csr", "csc"])
def test_a_sparse_adjacency_with_pointers_of_another_length_is_refused(layout):
    # torch.sparse checks nothing by default: a CSR of 3 rows with 3 pointers was
    # taken, and the fused kernel read past the end of them (garbage outputs).
    make = torch.sparse_csr_tensor if layout == "csr" else torch.sparse_csc_tensor
    for ptr in ([0, 1, 2], [0, 1, 1, 2, 2]):
        adj_t = make(torch.tensor(ptr), torch.tensor([1, 0]), torch.ones(2), (3, 3))
        with pytest.raises(ValueError, match=r"of shape \[4\] \(3 segments and the end\)"):
            AttentionGraph(adj_t)


def test_the_graph_does_not_keep_the_tensor_it_copied_alive():
    # An int32 edge_index is copied to int64; the watch on the caller's tensor is weak.
    ei = causal_graph(64).int()
    ref = weakref.ref(ei)
    graph = AttentionGraph(ei)
    del ei
    gc.collect()
    assert ref() is None
    assert graph.num_edges == 64 * 65 // 2 and graph.csr.ptr.numel() == 65


def test_prepare_makes_a_tile_plan_only_where_the_tiles_may_run():
    # A causal graph goes to SDPA: its tile plan was memory no call read.
    causal = AttentionGraph(causal_graph(200)).prepare()
    assert causal.structure is not None and causal.peek(("tiles", 64)) is None
    window = AttentionGraph(sliding_window_graph(256, window=32)).prepare()
    assert window.peek(("tiles", 64)) is not None


@pytest.mark.parametrize(
    "size, given, want",
    [
        ((None, 5), {"num_src": 3}, (5, 3)),
        ((5, None), {"num_nodes": 3}, (3, 5)),
        ((5, None), {}, (5, 5)),
    ],
)
def test_an_edge_index_keeps_each_size_it_knows(size, given, want):
    # The known target count was dropped when num_src was given, and the known source
    # count when num_nodes was.
    ei = torch.tensor([[0, 1, 2, 1], [1, 2, 0, 0]])
    graph = AttentionGraph(EdgeIndex(ei, sparse_size=size), **given)
    assert (graph.num_dst, graph.num_src) == want


@pytest.mark.parametrize("size", [(5, None), (None, 5)])
def test_an_edge_index_with_one_size_known_is_a_square_graph_of_that_size(size):
    # (5, None) made a bipartite graph of 5 sources and max id + 1 targets.
    ei = torch.tensor([[0, 1, 2, 1], [1, 2, 0, 0]])
    graph = AttentionGraph(EdgeIndex(ei, sparse_size=size))
    assert not graph.is_bipartite
    assert (graph.num_dst, graph.num_src) == (5, 5)
    assert graph.causal_view().num_edges == 2
    with pytest.raises(ValueError, match="got a bipartite one .* sizes of the EdgeIndex"):
        AttentionGraph(EdgeIndex(ei, sparse_size=(4, 3)), causal=True)
