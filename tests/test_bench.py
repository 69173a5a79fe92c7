"""Smoke test of ``gnnattn bench``: it runs and writes its JSON (no timing assertions)."""

import json

import pytest

from gnnattn.bench import SUITES, default_suites
from gnnattn.cli import main


def test_bench_quick_writes_json(tmp_path, capsys):
    path = tmp_path / "bench.json"
    assert main(["bench", "--quick", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "nn.MultiheadAttention" in out and "TransformerConv" in out
    assert "PASS" not in out and "FAIL" not in out  # ratios only, no targets

    result = json.loads(path.read_text())
    quick = [s for s in SUITES if s != "scale"]
    assert result["suites"] == quick == list(default_suites())
    assert result["machine"]["torch"] and result["machine"]["threads"] >= 1
    assert "loadavg" in result["machine"]
    rows = result["rows"]
    assert {r["suite"] for r in rows} == set(quick)
    assert {r["mode"] for r in rows} == {"fwd", "fwdbwd"}
    for r in rows:
        assert r["status"] == "ok" or r["status"].startswith(("skipped", "n/a")), r
        if r["status"] == "ok":
            assert r["median_ms"] > 0 and r["reps"] >= 1
            if r["suite"] != "limit":
                # Every candidate that ran computes the baseline's operator.
                assert r["max_abs_diff"] is not None and r["max_abs_diff"] < 1e-3, r
    # The gnnattn backends and every peer took part.
    names = {r["candidate"] for r in rows if r["status"] == "ok"}
    for name in (
        "gnnattn auto: layer(x)",
        "gnnattn sdpa: layer(x)",
        "gnnattn mp: layer(x)",
        "gnnattn fused: layer(x, graph)",
        "GraphTransformer(x, batch=batch)",
        "layer(x, complete edge_index)",
        "F.sdpa [1,H,T,C] (+proj)",
        "PyG TransformerConv (+out proj)",
        "PyG utils.softmax(index)",
        "gnnattn scatter_softmax(index)",
        "CSR SpMM: torch.sparse.mm(A, X)",
        "backward source pass (kernel)",
        "reordered (RCM): restore(layer(apply(x), graph_r))",
    ):
        assert name in names
    # The limit suite knows what each pass must move.
    limit = [r for r in rows if r["suite"] == "limit" and r["status"] == "ok"]
    assert limit and all(r["gbps"] > 0 for r in limit if r["bytes"])


def test_bench_one_suite(tmp_path):
    path = tmp_path / "bench.json"
    assert main(["bench", "--quick", "--suite", "softmax", "--no-memory", "--json", str(path)]) == 0
    result = json.loads(path.read_text())
    assert result["suites"] == ["softmax"]
    assert {r["suite"] for r in result["rows"]} == {"softmax"}
    assert all(r["peak_bytes"] is None for r in result["rows"])


def test_scale_suite_needs_its_flag():
    assert "scale" in SUITES and "scale" not in default_suites()
    assert "scale" in default_suites(scale=True)
    with pytest.raises(SystemExit, match="--scale"):
        main(["bench", "--suite", "scale"])
    with pytest.raises(SystemExit, match="quick"):
        main(["bench", "--scale", "--quick"])
