"""A graph partitioned over P gloo processes computes what one process computes.

The multi-process tests launch P ranks of one thread each (tests/ranks.py kills
them on timeout); each rank compares its part with the whole graph's
single-process run (tests/dist_workers.py). The rest runs in this process.
"""

from __future__ import annotations

import pytest
import torch
from ranks import run_ranks

import gnnattn
from gnnattn import AttentionGraph, SelfAttentionConv, complete_graph
from gnnattn.distributed import GraphPart, Partition, partition

# float64 throughout: the parts compute every target's softmax exactly as one
# process does; the only differences are the order of the parameter-gradient
# sums over ranks (a few ulps).
TOL = 1e-10

# The cases with edge features run the message-passing reference ("mp") in every process:
# the partition, the exchange and the interior/boundary split do not depend on the backend,
# and four cold ranks compiling the fused kernels' edge-feature variants (float64, two
# index widths) took most of this file's CI time. The fused kernels with edge features on
# a part: test_one_part_without_torch_distributed_equals_the_layer, in this process.
CASES = [
    dict(model="transformer", method="metis", n=40, layers=3),
    dict(model="conv", method="random", n=30, edge_dim=3, backend="mp"),
    dict(
        model="transformer",
        method="contiguous",
        n=40,
        causal=True,
        edge_dim=2,
        edge_value=True,
        backend="mp",
    ),
    dict(model="conv", method="metis", n=30, m=25, bipartite=True, edge_dim=2, backend="mp"),
    dict(model="transformer", method="random", n=20, owner="empty_rank", hub=True, isolated=True),
    dict(model="conv", method="random", n=20, owner="all_remote"),
]


WORLDS = [1, 2, 3, 4]


@pytest.fixture(scope="module")
def launched() -> list[dict[int, list[dict[str, float]]]]:
    """One launch of 4 ranks runs every case on P = 1, 2, 3 and 4 of them."""
    return run_ranks("dist_workers:check", max(WORLDS), timeout=300, cases=CASES, worlds=WORLDS)


@pytest.mark.parametrize("world", WORLDS)
def test_parts_equal_one_process(launched, world: int) -> None:
    results = [r[world] for r in launched[:world]]
    # The last result: a causal GraphTransformer on a SequencePart (ring attention).
    seq = [r[-1] for r in results]
    assert sum(r["targets"] for r in seq) == 23
    for r in seq:
        assert r["scale"] > 0.1 and max(r["out"], r["params"], r["x_src"]) < TOL, (world, r)
    for c, case in enumerate(CASES):
        per_rank = [r[c] for r in results]
        assert sum(r["targets"] for r in per_rank) == case["n"], case
        for r in per_rank:
            assert r["scale"] > 0.1  # outputs that are not trivially zero
            for key in ("out", "params", "x_src", "x_dst", "ea"):
                if key in r:
                    assert r[key] < TOL, (world, case, key, r[key])
        if case.get("owner") == "empty_rank" and world > 1:
            assert per_rank[-1]["targets"] == 0
        elif world > 1:
            # The exchange was exercised: some rank read remote rows.
            assert any(r["halo"] > 0 for r in per_rank), case


def test_bytes_sent_are_the_halo_rows_times_the_row_size() -> None:
    ranks = run_ranks("dist_workers:traffic", 3, timeout=240, n=30, heads=2, channels=3)
    for r in ranks:
        # Forward: each rank sends its send list's rows (one key and one value row each);
        # backward: the gradients of its halo rows go back.
        assert r["forward"] == r["sent_rows"] * r["row_bytes"] > 0
        assert r["backward"] == r["halo_rows"] * r["row_bytes"] > 0
    assert sum(r["sent_rows"] for r in ranks) == sum(r["halo_rows"] for r in ranks)


def test_training_helpers_on_three_ranks() -> None:
    """all_reduce_gradients keeps each gradient's dtype, leaves an unused parameter's
    grad None (no rank gave one: an optimizer skips it, as in one process) and sums in
    place; broadcast_parameters takes src within its group; a one-part partition runs
    in a larger world."""
    ranks = run_ranks("dist_workers:training_helpers", 3, timeout=240)
    for rank, r in enumerate(ranks):
        assert r["dtypes"] == ["torch.bfloat16", "torch.bfloat16"]
        assert r["unused_grad_is_none"] and r["in_place"]
        assert r["bias_grad"] == [6.0, 6.0, 6.0]
        assert r["weight"] == [float(rank if rank == 0 else 1)] * 4
        assert r["one_part"] < 1e-6


# ------------------------------------------------------------ in this process


def _random_graph(n: int, e: int, seed: int = 0) -> AttentionGraph:
    g = torch.Generator().manual_seed(seed)
    return AttentionGraph(torch.randint(0, n, (2, e), generator=g), n)


def _knn_graph(n: int, k: int, seed: int = 0) -> AttentionGraph:
    g = torch.Generator().manual_seed(seed)
    pos = torch.rand(n, 3, generator=g)
    nbr = torch.cdist(pos, pos).topk(k, largest=False).indices  # (N, k), itself included
    return AttentionGraph(torch.stack([nbr.reshape(-1), torch.arange(n).repeat_interleave(k)]), n)


@pytest.mark.parametrize("method", ["metis", "contiguous", "random"])
def test_parts_hold_every_target_and_edge_once_with_matching_lists(method: str) -> None:
    graph = _random_graph(50, 220, seed=1)
    p = partition(graph, 3, method=method, seed=2)
    parts = [p.part(r) for r in range(3)]
    targets = torch.cat([q.targets for q in parts])
    assert torch.equal(targets.sort().values, torch.arange(50))
    assert torch.equal(
        torch.cat([q.edge_ids for q in parts]).long().sort().values, torch.arange(220)
    )
    src, dst = graph.edge_index
    for q in parts:
        # Every local edge is an in-edge of an owned target, with its global source.
        assert torch.equal(q.global_edge_index, torch.stack([src[q.edge_ids], dst[q.edge_ids]]))
        assert bool((p.owner[q.halo] != q.rank).all())
        # Interior targets read owned sources only.
        ei = q.graph.edge_index
        assert bool((ei[0][ei[1] < q.num_interior] < q.sources.numel()).all())
    for a in parts:
        for b in parts:
            assert a.send_counts[b.rank] == b.recv_counts[a.rank]
            if a.rank != b.rank:
                sent = a.sources[a.send_index][sum(a.send_counts[: b.rank]) :][
                    : a.send_counts[b.rank]
                ]
                got = b.halo[sum(b.recv_counts[: a.rank]) :][: b.recv_counts[a.rank]]
                assert torch.equal(sent, got)


def test_metis_cuts_far_fewer_halo_rows_than_random() -> None:
    graph = _knn_graph(3000, 8)
    metis = partition(graph, 4, method="metis").halo_fraction()
    rand = partition(graph, 4, method="random").halo_fraction()
    assert metis < 0.25 * rand, (metis, rand)
    assert rand > 0.7


def test_contiguous_balances_the_edge_work_of_a_causal_graph() -> None:
    p = partition(AttentionGraph.causal(400), 4, method="contiguous")
    work = [p.part(r).num_edges + p.part(r).num_targets for r in range(4)]
    assert max(work) < 1.1 * min(work), work
    # Blocks of consecutive ids, in order.
    assert bool((p.owner.diff() >= 0).all())


def test_a_part_saved_and_loaded_attends_the_same(tmp_path) -> None:
    p = partition(_random_graph(30, 90), 1, method="random")
    (path,) = p.save(tmp_path)
    loaded = GraphPart.load(path)
    assert repr(loaded) == repr(p.part(0))
    torch.manual_seed(0)
    conv = SelfAttentionConv(8, 2).double()
    x = torch.randn(30, 8, dtype=torch.float64)
    whole = conv(x, p.graph)
    assert torch.allclose(conv(loaded.shard(x), loaded), whole[loaded.targets], atol=1e-12)


def test_a_part_holds_narrow_indices_and_the_boundary_reads_only_what_it_needs(
    tmp_path,
) -> None:
    # Slabs of a kNN graph of points sorted by x: the boundary targets read a few owned
    # rows, not all of them.
    pos = torch.rand(200, 3, generator=torch.Generator().manual_seed(3))
    pos = pos[pos[:, 0].argsort()]
    nbr = torch.cdist(pos, pos).topk(6, largest=False).indices  # (N, 6)
    ei = torch.stack([nbr.reshape(-1), torch.arange(200).repeat_interleave(6)])
    p = partition(AttentionGraph(ei, 200), 2, method="contiguous")
    for r in range(2):
        part = p.part(r)
        lay = part._layout
        assert lay.col.dtype == torch.int32 and part.edge_ids.dtype == torch.int32
        ni, ne, m_r = part.num_interior, lay.num_interior_edges, part.sources.numel()
        bcol = lay.col[ne:].long()
        assert torch.equal(part.boundary_sources, torch.unique(bcol[bcol < m_r]))
        assert 0 < part.boundary_sources.numel() < m_r
        # The boundary graph's sources, mapped back, are the local edges' sources.
        bsrc = part.boundary_graph.edge_index[0]
        back = torch.cat([part.boundary_sources, m_r + torch.arange(part.halo.numel())])
        assert torch.equal(back[bsrc], bcol)
        assert part.boundary_graph.num_dst == part.num_targets - ni
        assert "graph" not in vars(part)  # the whole local graph is made only when asked
        loaded = GraphPart.load(p.save(tmp_path)[r])
        assert torch.equal(loaded.global_edge_index, part.global_edge_index)


def test_a_rank_owning_no_sources_reads_the_halo_only() -> None:
    # Bipartite: every source goes to rank 0 (it owns most of their targets).
    ei = torch.tensor([[0, 1, 2, 3, 0, 1, 2], [0, 0, 1, 1, 2, 4, 5]])
    p = Partition(AttentionGraph(ei, 6, num_src=4), torch.tensor([0, 0, 0, 0, 1, 1]), 2)
    part = p.part(1)
    assert part.sources.numel() == 0 and part.boundary_sources.numel() == 0
    assert torch.equal(part.halo[part.boundary_graph.edge_index[0]], torch.tensor([1, 2]))
    assert torch.equal(part.global_edge_index, torch.tensor([[1, 2], [4, 5]]))


def test_a_corrupt_part_file_is_refused(tmp_path) -> None:
    p = partition(_random_graph(30, 90), 1, method="random")
    (path,) = p.save(tmp_path)
    data = torch.load(path, weights_only=True)
    data["layout"]["col"] = data["layout"]["col"] + 1000
    torch.save(data, path)
    with pytest.raises(ValueError, match="'col' ids in"):
        GraphPart.load(path)
    del data["layout"]["col"]
    torch.save(data, path)
    with pytest.raises(ValueError, match="partition the graph again"):
        GraphPart.load(path)


def test_one_part_without_torch_distributed_equals_the_layer() -> None:
    graph = _random_graph(25, 80, seed=4)
    part = partition(graph, 1).part(0)
    torch.manual_seed(0)
    conv = gnnattn.TransformerConv(6, 3, heads=2, edge_dim=2).double()
    x = torch.randn(25, 6, dtype=torch.float64)
    ea = torch.randn(80, 2, dtype=torch.float64)
    out, (ei, w) = conv(part.shard(x), part, part.shard_edges(ea), return_attention_weights=True)
    ref, (ei_ref, w_ref) = conv(x, graph, ea, return_attention_weights=True)
    assert torch.allclose(out, ref[part.targets], atol=1e-12)
    # The weights come back edge for edge, in global ids.
    assert torch.equal(ei, ei_ref[:, part.edge_ids])
    assert torch.allclose(w, w_ref[part.edge_ids], atol=1e-12)


def test_wrong_inputs_to_a_part_name_what_was_expected() -> None:
    part = partition(_random_graph(20, 60), 1).part(0)
    conv = SelfAttentionConv(8, 2)
    with pytest.raises(ValueError, match=r"Expected 'q' of shape \[20, H, C\]"):
        conv(torch.randn(19, 8), part)
    with pytest.raises(ValueError, match="causal"):
        SelfAttentionConv(8, 2, causal=True)(torch.randn(20, 8), part)
    with pytest.raises(ValueError, match="pair"):
        conv((torch.randn(20, 8), torch.randn(20, 8)), part)
    with pytest.raises(ValueError, match="shard_edges"):
        SelfAttentionConv(8, 2, edge_dim=3)(torch.randn(20, 8), part, torch.randn(59, 3))
    two = partition(_random_graph(20, 60), 2).part(0)
    with pytest.raises(ValueError, match="rank 0 of 2 .* got it on rank 0 of 1"):
        conv(two.shard(torch.randn(20, 8)), two)
    with pytest.raises(ValueError, match="'method'"):
        partition(_random_graph(20, 60), 2, method="spectral")
    with pytest.raises(ValueError, match="'num_parts'"):
        partition(_random_graph(20, 60), 0)
    with pytest.raises(ValueError, match=r"'num_nodes' None or 20 with an AttentionGraph.*999"):
        partition(_random_graph(20, 60), 2, num_nodes=999)
    with pytest.raises(ValueError, match="'rank'"):
        partition(_random_graph(20, 60), 2).part(2)
    with pytest.raises(ValueError, match="'owner'"):
        Partition(_random_graph(20, 60), torch.zeros(19, dtype=torch.int64), 2)
    with pytest.raises(TypeError, match="'owner' of an integer dtype"):
        Partition(_random_graph(20, 60), torch.full((20,), 0.9), 2)
    with pytest.raises(TypeError, match="'owner' to be a Tensor"):
        Partition(_random_graph(20, 60), [0] * 20, 2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'num_parts'"):
        Partition(_random_graph(20, 60), torch.zeros(20, dtype=torch.int64), 0)
    with pytest.raises(TypeError, match="'seed'"):
        partition(_random_graph(20, 60), 2, seed=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'seed' below 2"):
        partition(_random_graph(20, 60), 2, method="random", seed=2**64)
    with pytest.raises(ValueError, match="no 'sdpa'|'sdpa' does not take"):
        conv(torch.randn(20, 8), part, backend="sdpa")


def test_shard_takes_the_whole_graphs_rows_only() -> None:
    """A part's shard methods refuse tensors of another row count (a plain index would
    take too many rows silently, or give an IndexError on too few)."""
    full = AttentionGraph(complete_graph(6))
    part = partition(full, 2, causal=True, method="contiguous").part(1)
    with pytest.raises(ValueError, match=r"'x' of shape \[6, ...\]"):
        part.shard(torch.randn(7, 4))
    with pytest.raises(ValueError, match=r"'x_src' of shape \[6, ...\]"):
        part.shard_src(torch.randn(5, 4))
    # Per-edge rows follow the edges as given (36), not the 21 kept by causal pruning.
    with pytest.raises(ValueError, match=r"'edge_attr' of shape \[36, ...\]"):
        part.shard_edges(torch.randn(21, 2))
    ea = torch.randn(36, 2)
    assert torch.equal(part.shard_edges(ea), ea[part.edge_ids.long()])
    # A structured graph whose edges were never built: the same rows (its 36 edges).
    lazy = partition(AttentionGraph.complete(6), 2, causal=True, method="contiguous").part(1)
    assert torch.equal(lazy.shard_edges(ea), part.shard_edges(ea))
