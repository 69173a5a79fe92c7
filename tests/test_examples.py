"""Every example runs with --quick, as a user would start it, and does what it says."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run_example(name, tmp_path, *extra):
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name), "--quick", "--out", str(tmp_path), *extra],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, proc.stdout[-3000:]
    return json.loads(lines[-1][len("RESULT ") :]), proc


@pytest.mark.slow
def test_tiny_gpt_learns(tmp_path):
    result, proc = run_example("tiny_gpt.py", tmp_path)
    # Untrained, the loss is about ln(vocab) ~ 4.1 nats; a working model learns
    # character frequencies and common bigrams well within the quick run.
    assert result["loss_start"] > 3.5
    assert result["loss_end"] < result["loss_start"] - 1.0
    assert result["train_loss_last"] < result["train_loss_first"]
    for png in ("tiny_gpt_loss.png", "tiny_gpt_attention.png"):
        assert (tmp_path / png).stat().st_size > 10_000
    page = (tmp_path / "tiny_gpt_explorer.html").read_text(encoding="utf-8")
    assert '"name":"layer 1"' in page and "<canvas" in page  # every layer, as a page
    saved = json.loads((tmp_path / "tiny_gpt.json").read_text())
    assert saved["sample"].startswith("Shall I ") and len(saved["sample"]) > 100
    assert "--- sample ---" in proc.stdout


@pytest.mark.slow
def test_node_classification_beats_chance(tmp_path):
    result, proc = run_example("node_classification.py", tmp_path)
    assert result["splits"] == 5
    # Two factions of 17/17 members: chance is 0.5.
    assert result["graph_transformer"] > 0.7
    assert result["gcn"] > 0.7
    assert "graph_transformer: test accuracy" in proc.stdout


@pytest.mark.slow
def test_graph_vs_dense_agrees(tmp_path):
    result, proc = run_example("graph_vs_dense.py", tmp_path)
    assert result["max_abs_diff"] < 1e-4
    assert result["tokens"] == [32, 64]
    assert (tmp_path / "graph_vs_dense.png").stat().st_size > 10_000
    rows = json.loads((tmp_path / "graph_vs_dense.json").read_text())["rows"]
    assert {"mp_s", "sdpa_s", "fused_s", "torch_s"} <= set(rows[0])
