"""The ``gnnattn demo`` and ``gnnattn compare`` commands."""

import os

from gnnattn.cli import main


def test_demo_writes_pngs(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path), "--text", "a small cat sat"]) == 0
    out = capsys.readouterr().out
    for name in ("attention_graph.png", "heatmap.png", "causal_dag.png", "side_by_side.png"):
        path = tmp_path / name
        assert path.exists() and os.path.getsize(path) > 5000
        assert str(path) in out
    assert "agreement: OK" in out and "subtract the max" in out
    page = tmp_path / "explorer.html"
    assert str(page) in out and page.stat().st_size > 100_000
    assert '"labels":["a","small","cat","sat"]' in page.read_text(encoding="utf-8")


def test_compare_command(capsys):
    argv = ["compare", "--tokens", "5", "--embed-dim", "8", "--heads", "2", "--reps", "1"]
    assert main(argv + ["--dtype", "float32", "--causal", "yes"]) == 0
    assert "nn.MultiheadAttention" in capsys.readouterr().out
