"""The global-attention graphs: expanders, virtual nodes, Exphormer's union.

Degrees, connectivity and expansion of the expander, the virtual nodes' degrees and
ids, the union's parts and kinds, determinism under ``seed``, no duplicate edges,
int32 and int64 inputs at a million nodes, the errors, and a virtual node (a hub
of N in- and out-edges) on the fused kernels at the time per edge of a graph
without hubs.
"""

from __future__ import annotations

import math
import pickle
import time

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from scipy.sparse.csgraph import connected_components

import gnnattn
from gnnattn import AttentionGraph, attention
from gnnattn.graphs import (
    EDGE_KINDS,
    ComposedGraph,
    GraphComposition,
    expander_graph,
    exphormer_graph,
    is_sorted_by_target,
    with_virtual_nodes,
)


def batch_of(lengths: list[int]) -> torch.Tensor:
    return torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))


def degrees(g: AttentionGraph) -> torch.Tensor:
    return g.csr.ptr.diff()


def assert_simple_and_sorted(g: AttentionGraph) -> None:
    """Sorted by target then source, each edge once."""
    ei = g.edge_index
    assert ei.dtype == torch.int64 and is_sorted_by_target(ei)
    key = ei[1] * g.num_nodes + ei[0]
    assert key.unique().numel() == key.numel(), "a duplicate edge"


def assert_symmetric(ei: torch.Tensor, n: int) -> None:
    fwd = (ei[1] * n + ei[0]).sort().values
    bwd = (ei[0] * n + ei[1]).sort().values
    assert torch.equal(fwd, bwd), "an edge without its reverse"


def components(ei: torch.Tensor, n: int) -> int:
    a = sp.coo_matrix((np.ones(ei.shape[1]), (ei[1].numpy(), ei[0].numpy())), shape=(n, n))
    return connected_components(a, directed=False)[0]


def expected_degree(length: int, d: int) -> tuple[int, int]:
    """``(degree of every node, nodes allowed one less)`` of a graph of ``length`` nodes."""
    want = min(d, length - 1)
    odd = d % 2 == 1 and length % 2 == 1 and length > d + 1
    return want, (1 if odd else 0)


# --------------------------------------------------------------------------- expander


@pytest.mark.parametrize("d", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("n", [2, 5, 10, 101, 1000])
def test_expander_is_regular_simple_and_symmetric(n: int, d: int) -> None:
    g = expander_graph(n, d, seed=n + d)
    assert isinstance(g, ComposedGraph) and g.num_nodes == n
    assert_simple_and_sorted(g)
    assert_symmetric(g.edge_index, n)
    assert bool((g.edge_index[0] != g.edge_index[1]).all()), "a self-loop"
    want, short = expected_degree(n, d)
    deg = degrees(g)
    assert int((deg == want).sum()) == n - short and int((deg == want - 1).sum()) == short
    total = n * want - short
    assert g.composition.kind_counts() == {k: 0 for k in EDGE_KINDS} | {"expander": total}


@pytest.mark.parametrize("d", [2, 3, 4, 6])
def test_expander_is_connected(d: int) -> None:
    assert components(expander_graph(3000, d, seed=d).edge_index, 3000) == 1
    lengths = [1, 2, 3, 7, 8, 9, 30, 500]
    g = expander_graph(degree=d, seed=d, batch=batch_of(lengths))
    assert components(g.edge_index, sum(lengths)) == len(lengths)  # one per graph


@pytest.mark.parametrize("d", [3, 4, 6])
def test_expander_expands(d: int) -> None:
    # Friedman: a random d-regular graph's other eigenvalues are at most about
    # 2 sqrt(d - 1) (a Ramanujan graph's bound) in absolute value; a ring's or a
    # grid's second eigenvalue tends to d.
    n = 1000
    g = expander_graph(n, d, seed=0)
    a = np.zeros((n, n))
    a[g.edge_index[1].numpy(), g.edge_index[0].numpy()] = 1
    ev = np.linalg.eigvalsh(a)
    assert math.isclose(ev[-1], d)
    assert max(abs(ev[0]), ev[-2]) <= 2 * math.sqrt(d - 1) + 0.1


@pytest.mark.parametrize("d", [1, 3, 4, 5, 6])
def test_expander_per_graph_of_a_batch(d: int) -> None:
    # Every size from 1 to 3 d, dense graphs (built as the complement of a sparse
    # one) included, in a shuffled order; graph id 9 has no node.
    gen = torch.Generator().manual_seed(d)
    lengths = torch.arange(1, 3 * d + 2)[torch.randperm(3 * d + 1, generator=gen)].tolist()
    batch = batch_of(lengths)
    batch = batch + (batch >= 9).long()
    g = expander_graph(degree=d, seed=1, batch=batch)
    assert_simple_and_sorted(g)
    assert_symmetric(g.edge_index, g.num_nodes)
    src, dst = g.edge_index
    assert torch.equal(batch[src], batch[dst]), "an edge between two graphs"
    deg = degrees(g)
    start = 0
    for length in lengths:
        want, short = expected_degree(length, d)
        part = deg[start : start + length]
        assert int((part == want).sum()) == length - short, (length, part.tolist())
        start += length
    assert g.composition.num_graphs == len(lengths)


def test_expander_is_determined_by_its_seed() -> None:
    a, b = expander_graph(500, 4, seed=3), expander_graph(500, 4, seed=3)
    assert torch.equal(a.edge_index, b.edge_index)
    assert not torch.equal(a.edge_index, expander_graph(500, 4, seed=4).edge_index)
    # The global generator plays no part.
    torch.manual_seed(0)
    c = expander_graph(500, 4, seed=3)
    torch.manual_seed(1)
    assert torch.equal(c.edge_index, expander_graph(500, 4, seed=3).edge_index)
    assert a.composition.seed == 3 and a.composition.expander_degree == 4


# --------------------------------------------------------------------------- virtual nodes


def test_virtual_nodes_join_every_node_of_their_graph_both_ways() -> None:
    lengths = [3, 1, 5]
    batch = batch_of(lengths)
    n, k = sum(lengths), 2
    ei = torch.tensor([[0, 1, 4, 5, 5], [1, 2, 5, 6, 6]])  # one duplicate
    g = with_virtual_nodes(ei, k, batch=batch)
    c = g.composition
    assert (c.num_real, c.num_virtual, c.virtual_per_graph, c.num_graphs) == (n, 6, 2, 3)
    assert g.num_nodes == n + 6 and c.num_nodes == g.num_nodes
    assert_simple_and_sorted(g)
    assert c.kind_counts() == {
        "input": 4,
        "expander": 0,
        "to_virtual": n * k,
        "from_virtual": n * k,
        "self_loop": 0,
    }
    src, dst = g.edge_index
    for gi, length in enumerate(lengths):
        for t in range(k):
            v = n + gi * k + t  # graph by graph
            members = (batch == gi).nonzero().view(-1)
            assert torch.equal(src[dst == v].sort().values, members)  # in: its graph's nodes
            assert torch.equal(dst[src == v].sort().values, members)  # out: the same
            assert int((dst == v).sum()) == length
    assert torch.equal(c.virtual_index(), torch.tensor([0, 1, 0, 1, 0, 1]))
    assert torch.equal(c.virtual_batch(), torch.tensor([0, 0, 1, 1, 2, 2]))
    # Every real node gains k in- and k out-edges; the input edges stay as given.
    inputs = g.edge_index[:, c.edge_kind == EDGE_KINDS.index("input")]
    assert torch.equal(inputs, torch.tensor([[0, 1, 4, 5], [1, 2, 5, 6]]))


def test_virtual_nodes_of_a_graph_object_and_without_batch() -> None:
    graph = AttentionGraph(torch.tensor([[0, 1], [1, 2]]), 4)
    g = with_virtual_nodes(graph, 1)
    assert g.num_nodes == 5 and g.composition.num_graphs == 1
    assert degrees(g).tolist() == [1, 2, 2, 1, 4]  # node 3: only the virtual node
    empty = with_virtual_nodes(torch.zeros(2, 0, dtype=torch.long), 3, 0)
    assert empty.num_nodes == 0 and empty.num_edges == 0


# --------------------------------------------------------------------------- exphormer


def test_exphormer_graph_is_the_union_of_its_parts() -> None:
    lengths = [6, 2, 11]
    batch = batch_of(lengths)
    n = sum(lengths)
    gen = torch.Generator().manual_seed(0)
    ei = torch.cat(
        [
            torch.randint(s, s + m, (2, 2 * m), generator=gen)
            for s, m in zip([0, 6, 8], lengths, strict=True)
        ],
        1,
    )
    g = exphormer_graph(ei, expander_degree=3, virtual_nodes=2, seed=5, batch=batch)
    c = g.composition
    assert g.num_nodes == n + 2 * 3 and c.num_virtual == 6
    assert_simple_and_sorted(g)
    assert_symmetric(g.edge_index, g.num_nodes)  # every part goes both ways

    def keys(e: torch.Tensor) -> set[int]:
        return set((e[1] * g.num_nodes + e[0]).tolist())

    got = keys(g.edge_index)
    exp = expander_graph(degree=3, seed=5, batch=batch).edge_index
    virt = with_virtual_nodes(torch.zeros(2, 0, dtype=torch.long), 2, batch=batch).edge_index
    loops = torch.arange(g.num_nodes).repeat(2, 1)
    assert got == keys(ei) | keys(ei.flip(0)) | keys(exp) | keys(virt) | keys(loops)
    # Each edge's kind: the first part that gives it.
    all_keys = (g.edge_index[1] * g.num_nodes + g.edge_index[0]).tolist()
    kind = {k: EDGE_KINDS[int(t)] for k, t in zip(all_keys, c.edge_kind, strict=True)}
    for key in keys(ei) | keys(ei.flip(0)):
        assert kind[key] == "input"
    for key in keys(exp) - keys(ei) - keys(ei.flip(0)):
        assert kind[key] == "expander"
    assert kind[n * g.num_nodes + 0] == "to_virtual" and kind[0 * g.num_nodes + n] == "from_virtual"
    src, dst = g.edge_index
    real = (src < n) & (dst < n)
    assert torch.equal(batch[src[real]], batch[dst[real]])  # nothing joins two graphs


def test_exphormer_self_loops_and_no_parts() -> None:
    ei = torch.tensor([[0, 1, 2, 2], [1, 2, 0, 2]])  # one input self-loop
    g = exphormer_graph(ei, 3, expander_degree=0, virtual_nodes=0, seed=0)
    assert g.num_nodes == 3
    assert g.composition.kind_counts() == {
        "input": 7,  # both directions; the input self-loop once
        "expander": 0,
        "to_virtual": 0,
        "from_virtual": 0,
        "self_loop": 2,
    }
    bare = exphormer_graph(ei, 3, expander_degree=0, virtual_nodes=0, seed=0, self_loops=False)
    assert bare.num_edges == 7


def test_builders_are_deterministic_and_keep_the_device_and_composition() -> None:
    ei = torch.randint(0, 200, (2, 600), generator=torch.Generator().manual_seed(0))
    a = exphormer_graph(ei, 200, seed=7)
    b = exphormer_graph(ei, 200, seed=7)
    assert torch.equal(a.edge_index, b.edge_index)
    assert torch.equal(a.composition.edge_kind, b.composition.edge_kind)
    assert not torch.equal(a.edge_index, exphormer_graph(ei, 200, seed=8).edge_index)
    # int32 and int64 inputs give the same graph.
    assert torch.equal(exphormer_graph(ei.int(), 200, seed=7).edge_index, a.edge_index)
    back = pickle.loads(pickle.dumps(a))
    assert isinstance(back, ComposedGraph) and torch.equal(back.edge_index, a.edge_index)
    assert torch.equal(back.composition.edge_kind, a.composition.edge_kind)
    assert a.to("cpu") is a
    assert repr(a).startswith("ComposedGraph(num_nodes=201, num_edges=")


def test_a_built_graph_holds_its_csr_and_makes_its_edges_when_read() -> None:
    # The builders keep the CSR, its sources int32 (a quarter of an int64 [2, E]);
    # edge_index is made from it on first read, in the same order.
    rings = [
        torch.stack([torch.arange(m), (torch.arange(m) + 1) % m]) + at
        for at, m in [(0, 20), (20, 30)]
    ]
    g = exphormer_graph(torch.cat(rings, 1), 50, seed=3, batch=batch_of([20, 30]))
    assert g._edge_index is None  # nothing made until read
    assert g.csr.col.dtype == torch.int32 and g.csr.perm is None
    ei = g.edge_index
    assert ei.dtype == torch.int64 and is_sorted_by_target(ei)
    assert torch.equal(ei[0], g.csr.col.long())
    assert torch.equal(torch.bincount(ei[1], minlength=g.num_nodes), g.csr.ptr.diff())
    # The same graph as the kernels see it, on every backend.
    q, k, v = (torch.randn(g.num_nodes, 2, 4, dtype=torch.float64) for _ in range(3))
    fused = attention(q, k, v, g, backend="fused")
    mp = attention(q, k, v, AttentionGraph(ei), backend="mp")
    assert isinstance(fused, torch.Tensor) and isinstance(mp, torch.Tensor)
    assert torch.allclose(fused, mp)


def test_exported() -> None:
    for name in ("ComposedGraph", "GraphComposition", "expander_graph", "exphormer_graph",
                 "with_virtual_nodes"):  # fmt: skip
        assert name in gnnattn.__all__ and getattr(gnnattn, name) is getattr(gnnattn.graphs, name)


def test_composed_graph_from_its_parts() -> None:
    kind = torch.zeros(2, dtype=torch.uint8)
    comp = GraphComposition(3, 0, 0, 1, 0, None, kind)
    g = ComposedGraph(torch.tensor([[0, 1], [1, 2]]), comp)
    assert g.composition is comp and g.num_nodes == 3
    with pytest.raises(ValueError, match=r"'composition.edge_kind' of shape \[2\]"):
        ComposedGraph(
            torch.tensor([[0, 1], [1, 2]]), GraphComposition(3, 0, 0, 1, 0, None, kind[:1])
        )
    with pytest.raises(TypeError, match="'composition'"):
        ComposedGraph(torch.tensor([[0, 1], [1, 2]]), None)  # type: ignore[arg-type]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_a_million_nodes_from_int32_and_int64_edges(dtype: torch.dtype) -> None:
    # N^2 = 10^12 > 2^31: keys of (target, source) pairs overflow int32 arithmetic.
    n = 1_000_000
    ring = torch.stack([torch.arange(n), (torch.arange(n) + 1) % n]).to(dtype)
    g = exphormer_graph(ring, n, expander_degree=3, virtual_nodes=1, seed=0)
    c = g.composition
    # The ring both ways, 3 expander edges per node (n even; none in the ring, by
    # chance, at most a handful), the virtual node both ways, n + 1 self-loops.
    counts = c.kind_counts()
    assert counts["input"] == 2 * n and counts["to_virtual"] == counts["from_virtual"] == n
    assert counts["self_loop"] == n + 1 and 3 * n - 100 < counts["expander"] <= 3 * n
    assert g.num_edges == sum(counts.values())
    deg = degrees(g)
    assert int(deg[n]) == n + 1  # the virtual node: every node and itself
    assert int(deg[:n].min()) >= 5 and int(deg[:n].max()) <= 7
    ei = g.edge_index
    assert int(ei.max()) == n and int(ei.min()) == 0
    assert is_sorted_by_target(ei)
    # The CPU kernels' transposed layout takes the narrow ids.
    assert g.csc.row.dtype == torch.int32


# --------------------------------------------------------------------------- errors


def test_errors_name_the_argument() -> None:
    ei = torch.tensor([[0, 1], [1, 2]])
    with pytest.raises(TypeError, match="'degree'"):
        expander_graph(5, 2.5, seed=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'degree'"):
        expander_graph(5, -1, seed=0)
    with pytest.raises(TypeError, match="'seed'"):
        expander_graph(5, 2, seed=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'num_nodes' or 'batch'"):
        expander_graph(degree=2, seed=0)
    with pytest.raises(ValueError, match="'batch' to be sorted"):
        expander_graph(degree=2, seed=0, batch=torch.tensor([1, 0]))
    with pytest.raises(ValueError, match=r"'edge_index'\[1\] below the number of nodes 2"):
        exphormer_graph(ei, 2, seed=0)
    with pytest.raises(ValueError, match=r"'edge_index' of shape \[2, E\]"):
        exphormer_graph(torch.zeros(3, 4, dtype=torch.long), 3, seed=0)
    with pytest.raises(TypeError, match="'edge_index' to be a Tensor"):
        exphormer_graph([[0], [1]], 3, seed=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'virtual_nodes'"):
        exphormer_graph(ei, 3, virtual_nodes=-1, seed=0)
    with pytest.raises(ValueError, match="'batch' of length 3"):
        exphormer_graph(ei, 3, seed=0, batch=torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="square graph"):
        with_virtual_nodes(AttentionGraph(ei, 3, num_src=4), 1)
    with pytest.raises(ValueError, match="'num_nodes' equal to the graph's 3"):
        with_virtual_nodes(AttentionGraph(ei, 3), 1, 4)
    with pytest.raises(TypeError, match="'graph' to be a Tensor"):
        with_virtual_nodes("edges", 1)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- the hub


def _fwd_bwd_seconds(g: AttentionGraph, h: int = 2, c: int = 16) -> float:
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(g.num_nodes, h, c, generator=gen).requires_grad_() for _ in range(3))
    t0 = time.perf_counter()
    out = attention(q, k, v, g, backend="fused")
    assert isinstance(out, torch.Tensor)
    out.sum().backward()
    return time.perf_counter() - t0


@pytest.mark.slow
def test_a_virtual_node_costs_what_its_edges_cost() -> None:
    # A virtual node is a hub: N in-edges (a softmax over N scores) and N
    # out-edges (a dk/dv sum over N targets). The fused kernels split both over
    # threads in pieces; here the time per edge of forward + backward with one
    # hub (a fifth of the edges) is held to that of a random graph of the same
    # size without one. Minima of interleaved runs, and a bound of 3x, keep it
    # quiet on a loaded machine: a hub handled by one thread costs more than
    # that, a hub handled quadratically far more.
    n, gen = 100_000, torch.Generator().manual_seed(0)

    def random_graph(deg: int, m: int) -> torch.Tensor:
        src = torch.randint(0, m, (m * deg,), generator=gen)
        return torch.stack([src, torch.arange(m).repeat_interleave(deg)])

    hub = with_virtual_nodes(random_graph(3, n), 1, n).prepare()
    flat = AttentionGraph(random_graph(5, n + 1), n + 1).prepare()
    assert int(degrees(hub)[n]) == n and abs(hub.num_edges - flat.num_edges) < 10
    _fwd_bwd_seconds(hub), _fwd_bwd_seconds(flat)  # compiled (or read from the cache)
    t_hub, t_flat = math.inf, math.inf
    for _ in range(7):
        t_hub = min(t_hub, _fwd_bwd_seconds(hub))
        t_flat = min(t_flat, _fwd_bwd_seconds(flat))
    ratio = (t_hub / hub.num_edges) / (t_flat / flat.num_edges)
    assert ratio < 3.0, f"time per edge with a hub {ratio:.2f}x that without"


def test_composed_graph_edge_kinds_are_codes_of_edge_kinds():
    # Codes outside EDGE_KINDS (or floats) were taken and failed later in kind_counts.
    ei = torch.tensor([[0, 1, 2], [1, 2, 3]])
    for kind, error, match in (
        (torch.tensor([0, 1, 9]), ValueError, r"codes in \[0, 5\) .* from 0 to 9"),
        (torch.tensor([0.0, 1.0, 1.0]), TypeError, "integer dtype, got torch.float32"),
    ):
        with pytest.raises(error, match=match):
            ComposedGraph(ei, GraphComposition(4, 0, 0, 1, 0, None, kind))
