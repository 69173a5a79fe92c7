"""Graph layouts for the kernels (int32 transposed CSR, no copies of grouped edges,
lean CSR adjacencies), node reordering (reverse Cuthill-McKee, METIS parts, Hilbert and
Morton curves) and the tile fill it gives."""

from __future__ import annotations

import importlib.util
import itertools

import pytest
import torch

from gnnattn import (
    AttentionGraph,
    SelfAttentionConv,
    complete_graph,
    permute,
    reorder,
    sliding_window_graph,
    tile_fill,
)
from gnnattn.graphs import to_csr

TOL = 1e-10


def layer64() -> SelfAttentionConv:
    torch.manual_seed(0)
    return SelfAttentionConv(8, 2, backend="fused").double()


def grid(side: int) -> torch.Tensor:
    """4-neighbourhood of a side x side grid plus self-loops, row-major ids, grouped by target."""
    idx = torch.arange(side * side).view(side, side)
    src, dst = [idx.reshape(-1)], [idx.reshape(-1)]
    for a, b in ((idx[:, :-1], idx[:, 1:]), (idx[:-1], idx[1:])):
        src += [a.reshape(-1), b.reshape(-1)]
        dst += [b.reshape(-1), a.reshape(-1)]
    ei = torch.stack([torch.cat(src), torch.cat(dst)])
    return ei[:, torch.argsort(ei[1], stable=True)]


def test_grouped_edges_make_the_csr_without_a_copy():
    gen = torch.Generator().manual_seed(0)
    ei = torch.stack(
        [torch.randint(0, 50, (200,), generator=gen), torch.arange(50).repeat(4).sort().values]
    )
    csr = to_csr(ei, 50)
    assert csr.perm is None  # grouped by target: the input order is the CSR order
    assert csr.col.data_ptr() == ei[0].data_ptr()  # a view of the caller's edges
    g = AttentionGraph(ei, 50)
    assert g.csc.row.dtype == g.csc.perm.dtype == torch.int32  # narrow on the CPU
    assert g.to("meta").csc.row.dtype == torch.int64  # other devices take int64


def test_int32_csr_adjacency_is_kept_and_edges_made_on_demand():
    n = 30
    gen = torch.Generator().manual_seed(1)
    crow = torch.arange(n + 1, dtype=torch.int32) * 3
    col = torch.randint(0, n, (3 * n,), generator=gen, dtype=torch.int32)
    adj = torch.sparse_csr_tensor(
        crow, col, torch.ones(3 * n, dtype=torch.bool), (n, n), check_invariants=False
    )
    g = AttentionGraph(adj)
    assert g._edge_index is None and g.num_edges == 3 * n  # no [2, E] int64 copy
    assert g.csr.col.dtype == torch.int32 and g.csr.col.data_ptr() == col.data_ptr()
    layer = layer64()
    x = torch.randn(n, 8, dtype=torch.float64)
    ei = torch.stack([col.long(), torch.arange(n).repeat_interleave(3)])
    assert torch.allclose(layer(x, g), layer(x, ei), atol=TOL)
    assert torch.equal(g.edge_index, ei)  # made when asked for, in CSR order
    assert torch.allclose(layer(x, g, backend="mp"), layer(x, ei, backend="mp"), atol=TOL)
    pruned = AttentionGraph(adj, causal=True)
    assert bool((pruned.edge_index[0] <= pruned.edge_index[1]).all())


def test_reorder_clusters_neighbours_of_a_shuffled_grid():
    side = 12
    ei = grid(side)
    shuffle = torch.randperm(side * side, generator=torch.Generator().manual_seed(2))
    shuffled = shuffle[ei]
    perm, inv = reorder(shuffled)
    assert torch.equal(perm[inv], torch.arange(side * side))
    bandwidth = lambda e: int((e[0] - e[1]).abs().max())  # noqa: E731
    assert bandwidth(shuffled) > 4 * side
    assert bandwidth(inv[shuffled]) <= 2 * side  # RCM: about the grid's own bandwidth


@pytest.mark.parametrize("graph", ["grid", "window"])
def test_reordered_layer_gives_the_same_outputs_and_gradients(graph):
    ei = grid(7) if graph == "grid" else sliding_window_graph(40, window=3)
    n = int(ei.max()) + 1
    g = AttentionGraph(ei, n)
    order = reorder(g)
    perm, inv = order
    g_r = permute(g, perm)
    layer = layer64()
    x = torch.randn(n, 8, dtype=torch.float64, requires_grad=True)
    out = layer(x, g)
    (gx,) = torch.autograd.grad(out.square().sum(), x)
    for out_r in (layer(x[perm], g_r)[inv], order.restore(layer(order.apply(x), g_r))):
        (gx_r,) = torch.autograd.grad(out_r.square().sum(), x)
        assert torch.allclose(out, out_r, atol=TOL) and torch.allclose(gx, gx_r, atol=TOL)
    # The edges keep their order: edge features still line up.
    assert torch.equal(perm[g_r.edge_index], g.edge_index)


def test_reorder_bad_input():
    ei = grid(3)
    with pytest.raises(ValueError, match="'method'"):
        reorder(ei, method="spectral")
    with pytest.raises(ValueError, match="bipartite"):
        reorder(AttentionGraph(torch.tensor([[0, 1], [0, 0]]), 1, num_src=2))
    with pytest.raises(ValueError, match="'perm'"):
        permute(ei, torch.arange(5))
    with pytest.raises(ValueError, match="'perm'"):
        permute(ei, torch.zeros(9, dtype=torch.long))
    # Negative ids would wrap around, out-of-range ones index past the end.
    for bad in ([-1, *range(1, 9)], [*range(8), 9]):
        with pytest.raises(ValueError, match="'perm'"):
            permute(ei, torch.tensor(bad))
    with pytest.raises(TypeError, match="'perm'"):
        permute(ei, torch.arange(9).double())


@pytest.mark.parametrize("method", ["rcm", "metis"])
def test_reorder_of_an_empty_graph_is_empty(method):
    # No node to order: METIS is not called (nor pymetis imported).
    perm, inv = reorder(torch.zeros(2, 0, dtype=torch.long), 0, method=method)
    assert perm.shape == inv.shape == (0,)


@pytest.mark.parametrize("method", ["rcm", "hilbert"])
def test_reorder_of_one_node(method):
    # scipy's one-element order is a reversed view that torch refused.
    pos = torch.zeros(1, 2) if method == "hilbert" else None
    perm, inv = reorder(torch.tensor([[0], [0]]), method=method, pos=pos)
    assert perm.tolist() == inv.tolist() == [0]


@pytest.mark.parametrize("method", ["rcm", "hilbert"])
def test_reorder_of_a_batch_keeps_its_graphs_in_order(method):
    # RCM put the graphs in reverse order and a curve interleaved them: the result
    # was no longer a PyG batch (from_batch and GPSConv refuse an unsorted one).
    batch = torch.tensor([0] * 4 + [1] * 3 + [2] * 5)
    ei = AttentionGraph.window(batch=batch, window=1).edge_index
    pos = torch.randn(12, 3, generator=torch.Generator().manual_seed(0))
    order = reorder(ei, 12, method=method, pos=pos if method == "hilbert" else None, batch=batch)
    assert batch[order.perm].tolist() == batch.tolist()
    # Within each graph, the method's order of the whole batch.
    plain = reorder(ei, 12, method=method, pos=pos if method == "hilbert" else None).perm
    assert order.perm.tolist() == [int(p) for g in range(3) for p in plain if batch[p] == g]
    with pytest.raises(ValueError, match="'batch'"):
        reorder(ei, 12, batch=batch[:-1])


def test_reordering_takes_one_row_per_node():
    order = reorder(sliding_window_graph(4, window=1))
    for bad in (torch.randn(6, 2), torch.randn(3)):
        with pytest.raises(ValueError, match="'x' with 4 rows"):
            order.apply(bad)
        with pytest.raises(ValueError, match="'y' with 4 rows"):
            order.restore(bad)


def lattice(side: int, dims: int) -> torch.Tensor:
    """The integer points of a ``side ** dims`` grid, ``[side ** dims, dims]``, row-major."""
    axes = torch.meshgrid(*[torch.arange(side)] * dims, indexing="ij")
    return torch.stack([a.reshape(-1) for a in axes], 1).double()


def no_edges(n: int) -> torch.Tensor:
    return torch.stack([torch.arange(n), torch.arange(n)])  # self-loops: a graph of n nodes


@pytest.mark.parametrize("dims, side", [(2, 8), (3, 4), (2, 16)])
def test_hilbert_curve_steps_to_a_neighbour_every_time(dims, side):
    pos = lattice(side, dims)
    shuffle = torch.randperm(pos.shape[0], generator=torch.Generator().manual_seed(0))
    pos = pos[shuffle] * 0.25 + 3.0  # ids in no order, the grid scaled and moved
    order = reorder(no_edges(pos.shape[0]), pos=pos)  # "hilbert" when pos is given
    walk = pos[order.perm]
    steps = (walk[1:] - walk[:-1]).abs().sum(1)
    assert torch.allclose(steps, torch.full_like(steps, 0.25))  # one grid step each
    assert torch.equal(order.perm, reorder(no_edges(pos.shape[0]), method="hilbert", pos=pos).perm)


def test_morton_curve_is_the_z_order():
    pos = lattice(4, 2)  # (a, b) row-major
    perm = reorder(no_edges(16), method="morton", pos=pos).perm
    code = [
        sum(
            ((int(a) >> bit & 1) << (2 * bit + 1)) | ((int(b) >> bit & 1) << (2 * bit))
            for bit in (0, 1)
        )
        for a, b in pos[perm].tolist()
    ]
    assert code == list(range(16))


def brute_fill(ei: torch.Tensor, num_dst: int, block: int) -> float:
    area = 0
    for start in range(0, num_dst, block):
        rows = range(start, min(start + block, num_dst))
        sources = {int(j) for j, i in ei.t().tolist() if i in rows}
        area += len(rows) * len(sources)
    return ei.shape[1] / area if area else 1.0


@pytest.mark.parametrize("block", [1, 3, 8, 50])
def test_tile_fill_is_edges_over_window_tiles(block):
    gen = torch.Generator().manual_seed(block)
    ei = torch.stack(
        [torch.randint(0, 30, (120,), generator=gen), torch.randint(0, 37, (120,), generator=gen)]
    )
    assert tile_fill(ei, 37, block=block) == pytest.approx(brute_fill(ei, 37, block), rel=1e-12)
    bipartite = AttentionGraph(ei, 37, num_src=30)
    assert tile_fill(bipartite, block=block) == pytest.approx(brute_fill(ei, 37, block), rel=1e-12)
    assert tile_fill(complete_graph(block * 3), block=block) == 1.0
    assert tile_fill(torch.zeros(2, 0, dtype=torch.long), 5, block=block) == 1.0


def test_curves_and_metis_give_a_knn_graph_tile_fill():
    from gnnattn.bench.suites.common import knn_graph

    gen = torch.Generator().manual_seed(4)
    pos = torch.rand(3000, 3, generator=gen, dtype=torch.float64)
    ei = knn_graph(pos, 8)
    graph = AttentionGraph(ei, 3000)
    fill = {"random ids": tile_fill(graph, block=32)}
    methods = ["rcm", "hilbert", "morton"]
    if importlib.util.find_spec("pymetis") is not None:
        methods.append("metis")
    for method in methods:
        order = reorder(graph, method=method, pos=pos if method in ("hilbert", "morton") else None)
        assert torch.equal(order.perm.sort().values, torch.arange(3000))
        fill[method] = tile_fill(permute(graph, order.perm), block=32)
    assert fill["hilbert"] > 3 * fill["random ids"], fill
    assert fill["hilbert"] > fill["rcm"] and fill["morton"] > fill["rcm"], fill
    if "metis" in fill:
        assert fill["metis"] > 2 * fill["random ids"], fill


@pytest.mark.parametrize("method", ["hilbert", "metis"])
def test_layer_on_a_curve_order_gives_the_same_outputs(method):
    if method == "metis" and importlib.util.find_spec("pymetis") is None:
        pytest.skip("needs pymetis")
    side = 9
    ei = grid(side)
    pos = torch.stack(
        [torch.arange(side).repeat_interleave(side), torch.arange(side).repeat(side)], 1
    )
    g = AttentionGraph(ei, side * side)
    order = reorder(g, method=method, pos=pos.double() if method == "hilbert" else None, block=8)
    layer = layer64()
    x = torch.randn(side * side, 8, dtype=torch.float64)
    out_r = order.restore(layer(order.apply(x), permute(g, order.perm)))
    assert torch.allclose(out_r, layer(x, g), atol=TOL)


def test_curve_bad_input():
    ei = grid(3)
    with pytest.raises(ValueError, match="'pos'.*method='hilbert'"):
        reorder(ei, method="hilbert")
    with pytest.raises(ValueError, match="'pos' only"):
        reorder(ei, method="rcm", pos=torch.zeros(9, 2))
    with pytest.raises(ValueError, match=r"'pos' of shape \[9, D\]"):
        reorder(ei, pos=torch.zeros(8, 2))
    with pytest.raises(ValueError, match="finite 'pos'"):
        reorder(ei, pos=torch.full((9, 2), float("nan")))
    with pytest.raises(TypeError, match="'pos'"):
        reorder(ei, pos=[[0.0, 0.0]] * 9)
    with pytest.raises(ValueError, match="'block'"):
        tile_fill(ei, block=0)
    for n, d in itertools.product((0, 1), (1, 3)):  # no points, one point: nothing to sort
        assert reorder(
            torch.zeros(2, 0, dtype=torch.long), n, pos=torch.zeros(n, d)
        ).perm.tolist() == list(range(n))
