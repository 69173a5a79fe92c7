"""Smoke test of ``gnnattn bench``: it runs and writes its JSON (no timing assertions)."""

import json

from gnnattn.bench import SUITES
from gnnattn.cli import main


def test_bench_quick_writes_json(tmp_path, capsys):
    path = tmp_path / "bench.json"
    assert main(["bench", "--quick", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "nn.MultiheadAttention" in out and "TransformerConv" in out

    result = json.loads(path.read_text())
    assert result["suites"] == list(SUITES)
    assert result["machine"]["torch"] and result["machine"]["threads"] >= 1
    rows = result["rows"]
    assert {r["suite"] for r in rows} == set(SUITES)
    assert {r["mode"] for r in rows} == {"fwd", "fwdbwd"}
    for r in rows:
        assert r["status"] == "ok" or r["status"].startswith(("skipped", "n/a")), r
        if r["status"] == "ok":
            assert r["median_ms"] > 0 and r["reps"] >= 1
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
    ):
        assert name in names


def test_bench_one_suite(tmp_path):
    path = tmp_path / "bench.json"
    assert main(["bench", "--quick", "--suite", "softmax", "--no-memory", "--json", str(path)]) == 0
    result = json.loads(path.read_text())
    assert result["suites"] == ["softmax"]
    assert {r["suite"] for r in result["rows"]} == {"softmax"}
    assert all(r["peak_bytes"] is None for r in result["rows"])
