"""Every example runs with --quick, as a user would start it, and does what it says; each
stays small enough to read (a page of main(), public API only)."""

import ast
import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
from test_checkpoints import run_in_own_group

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def run_example(name, tmp_path, *extra):
    cmd = [sys.executable, str(EXAMPLES / name), "--quick", "--out", str(tmp_path), *extra]
    # 50 s alone; on a loaded CI machine (another pytest worker, process launches) several
    # times that. The whole process group dies on a timeout.
    proc = run_in_own_group(cmd, timeout=900)
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


@pytest.mark.slow
def test_long_range_separates_local_from_global(tmp_path):
    result, proc = run_example("long_range.py", tmp_path)
    models = result["models"]
    mpnn, exphormer = models["local MPNN (GIN)"], models["GPS + Exphormer"]
    # Paths of 32 nodes, 3 layers: the MPNN sees the coloured node from 4 nodes of 32
    # and guesses the rest (chance 0.25); global attention reaches every node.
    assert mpnn["accuracy"] < 0.5
    assert exphormer["accuracy"] > mpnn["accuracy"] + 0.3
    assert models["GPS + full attention"]["accuracy"] > mpnn["accuracy"] + 0.3
    # Comparable models: parameter counts within 10% of each other.
    params = [m["params"] for m in models.values()]
    assert max(params) < 1.1 * min(params)
    assert "| GPS + Exphormer |" in proc.stdout


def _functions(path: Path) -> dict[str, ast.FunctionDef]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.py")), ids=lambda p: p.name)
def test_example_reads_as_a_page(path):
    main = _functions(path).get("main")
    if main is not None:
        assert main.end_lineno - main.lineno + 1 <= 50, "main() longer than a page"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        # No sys.path edits: a script's own folder is on sys.path, `import common` works.
        if isinstance(node, ast.Attribute) and node.attr == "path":
            assert not (isinstance(node.value, ast.Name) and node.value.id == "sys"), node.lineno
        # Public API only: no private attributes (os._exit, the crash hook, aside).
        if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            is_os_exit = isinstance(node.value, ast.Name) and node.value.id == "os"
            assert node.attr.startswith("__") or is_os_exit, f"{node.attr} at line {node.lineno}"
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gnnattn"):
            assert not any(a.name.startswith("_") for a in node.names), node.lineno


SWITCHERS = ["gnnattn/compare.py", "gnnattn/cli.py", *map(str, EXAMPLES.glob("*.py"))]
SWITCHERS += [str(p) for p in (ROOT / "gnnattn" / "bench").rglob("*.py")]


@pytest.mark.parametrize("name", SWITCHERS, ids=lambda p: Path(p).name)
def test_backends_are_chosen_per_call_never_assigned(name):
    # `layer.backend = ...` changes a module that other threads may be calling.
    tree = ast.parse((ROOT / name).read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                assert not (isinstance(t, ast.Attribute) and t.attr == "backend"), node.lineno


def test_graph_vs_dense_ticks_are_plain_numbers():
    # matplotlib's default log ticks read "6x10^0" (issue 17); the example's are numbers.
    spec = importlib.util.spec_from_file_location("graph_vs_dense", EXAMPLES / "graph_vs_dense.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = [{"T": t, "torch_s": 0.004 * k, **{f"{b}_s": 0.006 * k for b in mod.BACKENDS}}
            for k, t in enumerate((32, 64, 128), start=1)]  # fmt: skip
    fig = mod.figure(rows)
    fig.canvas.draw()
    texts = [t.get_text() for ax in fig.axes for t in ax.get_xticklabels() + ax.get_yticklabels()]
    texts += [t.get_text() for t in fig.axes[0].get_yticklabels(minor=True)]
    shown = [t for t in texts if t]
    assert {"32", "64", "128"} <= set(shown)
    assert shown and all(re.fullmatch(r"[0-9.]+", t) for t in shown), shown


@pytest.mark.parametrize(
    ("name", "args", "message"),
    [
        ("tiny_gpt.py", ["--steps", "0"], "--steps: expected a positive number, got 0"),
        ("tiny_gpt.py", ["--batch-size", "0"], "--batch-size: expected a positive number"),
        ("distributed_graph.py", ["--heads", "0"], "--heads: expected a positive number"),
        ("distributed_graph.py", ["--nodes", "5", "--k", "8"], "--k: expected 1 to --nodes (5)"),
    ],
)
def test_training_examples_refuse_bad_sizes_in_one_line(name, args, message, capsys):
    # Before: a traceback from deep in torch (OneCycleLR, losses[0], edge_index ids).
    spec = importlib.util.spec_from_file_location(name[:-3], EXAMPLES / name)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with pytest.raises(SystemExit) as exit_info:
        mod.parse_args(["--quick", *args])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
