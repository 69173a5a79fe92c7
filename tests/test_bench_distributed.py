"""The ``distributed`` bench suite: only when named, and its parts in this process
(the full suite starts a dozen processes: ``gnnattn bench --quick --suite distributed``)."""

import dataclasses

import torch

from gnnattn.bench import BenchConfig, default_suites
from gnnattn.bench.suites import REGISTRY
from gnnattn.bench.suites.distributed import SIZES, _halo_rows
from gnnattn.bench.suites.distributed_worker import JOBS, _instrument
from gnnattn.distributed import GraphPart, exchange


def test_the_suite_runs_only_when_named():
    assert "distributed" in {s.name for s in REGISTRY}
    assert "distributed" not in default_suites() and "distributed" not in default_suites(scale=True)


def test_halo_rows_compare_metis_contiguous_random():
    size = dataclasses.replace(SIZES["quick"], halo_nodes=1500)
    rows = _halo_rows(size, BenchConfig(quick=True))
    frac = {r["candidate"].split()[0]: r["halo_fraction"] for r in rows}
    assert set(frac) == {"random", "contiguous", "metis"}
    assert frac["metis"] < frac["random"] / 3  # a kNN graph: METIS cuts far less
    assert all(r["median_ms"] > 0 and "halo" in r["note"] for r in rows)


def test_make_writes_the_graph_and_one_file_per_rank_and_single_runs(tmp_path):
    job = {"nodes": 300, "k": 8, "parts": 3, "seed": 0, "folder": str(tmp_path),
           "method": "contiguous", "sort": True}  # fmt: skip
    made = JOBS["make"](job)
    assert 0 < made["halo_fraction"] < 1 and made["peak_rss"] > 0
    data = torch.load(tmp_path / "graph.pt", weights_only=True)
    assert data["num_nodes"] == 300 and data["edge_index"].shape == (2, 2400)
    parts = [GraphPart.load(tmp_path / f"part-{r}-of-3.pt") for r in range(3)]
    assert sum(p.num_edges for p in parts) == 2400
    res = JOBS["single"]({**job, "embed": 8, "heads": 2, "reps": 1, "threads": 1})
    assert len(res["ms"]) == 1 and res["edges"] == 2400 and res["peak_rss"] > 0


def test_the_exchange_clock_wraps_the_all_to_all(monkeypatch):
    inner = exchange._all_to_all
    monkeypatch.setattr(exchange, "_all_to_all", inner)  # restored after the test
    clock = _instrument()
    assert exchange._all_to_all is not inner
    # One process: nothing to exchange, no process group; the call is still timed.
    out = exchange._all_to_all(torch.empty(0, 2), torch.empty(0, 2), [0], [0], None, True)
    assert out is None and clock[0] >= 0


def test_halo_rows_without_pymetis_skip_metis_only(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "pymetis", None)  # import pymetis -> ImportError
    size = dataclasses.replace(SIZES["quick"], halo_nodes=1500)
    rows = {r["candidate"]: r for r in _halo_rows(size, BenchConfig(quick=True))}
    assert rows["metis"]["status"].startswith("skipped (no pymetis)")
    for name in ("random (the baseline)", "contiguous"):
        assert rows[name]["status"] == "ok" and rows[name]["halo_fraction"] > 0


def test_a_failing_part_is_an_error_row_and_the_reps_reach_the_parts(monkeypatch):
    from gnnattn.bench.suites import distributed

    seen = []

    def halo(size, cfg):
        seen.append(size.reps)
        return [distributed.row("distributed", "halo", "partition", "random", "random")]

    def layer(size, cfg, log):
        raise RuntimeError("rank 2 of 4 exited 1: Killed")

    monkeypatch.setattr(distributed, "_halo_rows", halo)
    monkeypatch.setattr(distributed, "_layer_rows", layer)
    monkeypatch.setattr(
        distributed, "_weak_rows", lambda size, cfg, log: seen.append(size.reps) or []
    )
    rows = distributed.distributed_rows(BenchConfig(quick=True, reps=7))
    assert seen == [7, 7]  # the halo part and weak scaling, after the layer part failed
    assert [r["status"] for r in rows] == [
        "ok",
        "error: RuntimeError: rank 2 of 4 exited 1: Killed",
    ]
