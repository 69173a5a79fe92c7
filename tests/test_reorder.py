"""Graph layouts for the kernels (int32 transposed CSR, no copies of grouped edges,
lean CSR adjacencies) and node reordering (reverse Cuthill-McKee)."""

from __future__ import annotations

import pytest
import torch

from gnnattn import AttentionGraph, SelfAttentionConv, permute, reorder, sliding_window_graph
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
        reorder(ei, method="metis")
    with pytest.raises(ValueError, match="bipartite"):
        reorder(AttentionGraph(torch.tensor([[0, 1], [0, 0]]), 1, num_src=2))
    with pytest.raises(ValueError, match="'perm'"):
        permute(ei, torch.arange(5))
    with pytest.raises(ValueError, match="'perm'"):
        permute(ei, torch.zeros(9, dtype=torch.long))
