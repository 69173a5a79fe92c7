"""The docs say what the code does: the API tables' signatures are the real ones, every
public name is documented, links resolve, and docs/performance.md's tables are written by
docs/make_performance.py from ``gnnattn bench --json`` output."""

from __future__ import annotations

import importlib.util
import inspect
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

import gnnattn

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
API = DOCS / "api.md"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]

# A table row whose first cell is a call: | `name(params)` | ... |
ROW = re.compile(r"^\| `(?P<name>[A-Za-z_][\w.]*)\((?P<params>.*?)\)` \|", re.M)


# --------------------------------------------------------------------------- the API tables


def api_rows(text: str) -> list[tuple[str, str]]:
    """``(name, params)`` of every signature row of the API page."""
    return [(m.group("name"), m.group("params")) for m in ROW.finditer(text)]


def resolve(name: str) -> Any:
    """``gnnattn.<name>``, attribute by attribute (``nn.Dropout``, ``AttentionGraph.to``)."""
    import gnnattn.compare  # noqa: F401 - submodules the table names
    import gnnattn.distributed  # noqa: F401
    import gnnattn.viz  # noqa: F401

    obj: Any = gnnattn
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def _shape(params: list[inspect.Parameter]) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in params]


def stated(params: str) -> list[tuple[str, Any, Any]]:
    """The parameters a table states: its text made the parameter list of a function."""
    ns: dict[str, Any] = {}
    exec(f"def _stated({params}): pass", ns)  # defaults are literals: None, "auto", 1e-05
    return _shape(list(inspect.signature(ns["_stated"]).parameters.values()))


def real(obj: Any) -> list[tuple[str, Any, Any]]:
    """The real parameters, without ``self`` (a method read from its class)."""
    params = list(inspect.signature(obj).parameters.values())
    if params and params[0].name == "self":
        params = params[1:]
    return _shape(params)


def test_the_api_page_has_signature_tables():
    rows = api_rows(API.read_text(encoding="utf-8"))
    assert len(rows) >= 50
    names = [n for n, _ in rows]
    assert len(names) == len(set(names)), "a name listed twice"


@pytest.mark.parametrize("name,params", api_rows(API.read_text(encoding="utf-8")))
def test_an_api_row_states_the_real_signature(name, params):
    # Every parameter the row names exists, and every parameter is in the row, in
    # order, with its kind (positional, keyword-only, **kwargs) and default.
    assert stated(params) == real(resolve(name)), f"docs/api.md's row of {name} is stale"


def test_the_signature_check_can_fail():
    # The SelfAttentionConv row as it once was: edge_dim and edge_value left out.
    old = 'embed_dim, num_heads=1, *, dropout=0.0, bias=True, causal=False, backend="auto"'
    assert stated(old) != real(gnnattn.SelfAttentionConv)
    # A default or a keyword-only marker that differs is caught too.
    assert stated("scale=2.0, *, causal=False, backend='auto'") != real(gnnattn.SimplifiedAttention)
    assert stated("scale=1.0, causal=False, backend='auto'") != real(gnnattn.SimplifiedAttention)


@pytest.mark.parametrize("module", ["gnnattn", "gnnattn.nn", "gnnattn.distributed"])
def test_every_public_name_is_on_the_api_page(module):
    import importlib

    text = API.read_text(encoding="utf-8")
    mod = importlib.import_module(module)
    missing = [n for n in mod.__all__ if not re.search(rf"`(?:[\w.]*\.)?{n}\b", text)]
    assert not missing, f"{module} names missing from docs/api.md: {missing}"


# --------------------------------------------------------------------------- links and words


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of the headings of ``page``."""
    out = set()
    for m in re.finditer(r"^#+ (.+)$", page.read_text(encoding="utf-8"), re.M):
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        out.add(slug)
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page):
    text = page.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{page.name} links to {target}, which does not exist"
        if anchor and dest.suffix == ".md":
            assert anchor in _anchors(dest), f"{page.name}: no heading #{anchor} in {path}"


STALE = re.compile(
    r"not yet (run )?on a GPU|\*\*missed\*\*|target of issue|an earlier run|was called",
    re.I,
)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_docs_describe_the_software_not_its_history(page):
    assert not STALE.findall(page.read_text(encoding="utf-8"))


# --------------------------------------------------------------------------- performance page


def _script() -> Any:
    spec = importlib.util.spec_from_file_location("make_performance", DOCS / "make_performance.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["make_performance"] = mod
    spec.loader.exec_module(mod)
    return mod


def _run(quick: bool = False, device: str = "cpu") -> dict[str, Any]:
    from gnnattn.bench.harness import row
    from gnnattn.bench.report import machine_info

    machine = machine_info("cpu")
    machine["device"] = device
    machine["threads"] = 2  # the run's, whatever this process's thread count is
    machine["loadavg_end"] = machine.get("loadavg", [0.0, 0.0, 0.0])
    case = "random graph N=1,000, |E|=8,000 <of> 4*8"
    rows = [
        row(
            "sparse",
            case,
            "fwd",
            "PyG | layer",
            "PyG | layer",
            median_ms=2.0,
            ratio=1.0,
            reps=3,
            peak_bytes=2**20,
            mem_ratio=1.0,
            max_abs_diff=0.0,
        ),
        row(
            "sparse",
            case,
            "fwd",
            "gnnattn",
            "PyG | layer",
            median_ms=0.5,
            ratio=0.25,
            reps=3,
            peak_bytes=2**18,
            mem_ratio=0.25,
            max_abs_diff=1e-7,
            note="graph once",
        ),
        row("sparse", case, "fwd", "mp", "PyG | layer", status="skipped (memory): 9 GiB"),
        row(
            "scale",
            "N=1M",
            "fwdbwd",
            "layer",
            "SpMM",
            median_ms=9000.0,
            ratio=3.0,
            reps=1,
            peak_rss=6_300_000_000,
        ),
    ]
    return {
        "machine": machine,
        "config": {"device": device, "quick": quick, "threads": 2, "memory": True},
        "suites": ["sparse", "scale"],
        "rows": rows,
        "seconds": 12.0,
    }


PAGE = """# Performance

Prose stays.

<!-- bench:sparse -->
an old table
<!-- /bench -->

More prose.
"""


def test_the_script_replaces_the_blocks_whole_and_keeps_the_prose(tmp_path):
    mp = _script()
    run = tmp_path / "run.json"
    run.write_text(json.dumps(_run()))
    page = tmp_path / "performance.md"
    page.write_text(PAGE)
    assert mp.main([str(run), "--page", str(page)]) == 0
    text = page.read_text()
    assert "an old table" not in text
    assert "Prose stays." in text and "More prose." in text
    assert text.count("<!-- bench:sparse -->") == 1 and text.count("<!-- /bench -->") == 2
    assert "<!-- bench:scale -->" in text  # no marker for it: added at the end
    m = json.loads(run.read_text())["machine"]
    for fact in (m["date"][:10], m["torch"], m["torch_geometric"], "2 threads", "load average"):
        assert fact in text
    assert "`gnnattn bench --suite sparse`" in text
    assert "`gnnattn bench --suite scale --scale`" in text
    # Cells are escaped (a pipe would split a cell), statuses and RSS shown.
    assert "PyG \\| layer" in text and "&lt;of&gt;" not in text and "&lt;of>" in text
    assert "| mp | - |" in text and "skipped (memory): 9 GiB" in text
    assert "peak RSS GB" in text and "6.30" in text
    assert "Smoke-test" not in text
    # Idempotent: the same runs give the same page.
    assert mp.main([str(run), "--page", str(page)]) == 0
    assert page.read_text() == text


def test_the_script_refuses_quick_runs_unless_told(tmp_path, capsys):
    mp = _script()
    run = tmp_path / "quick.json"
    run.write_text(json.dumps(_run(quick=True)))
    page = tmp_path / "performance.md"
    page.write_text(PAGE)
    assert mp.main([str(run), "--page", str(page)]) == 2
    assert "--quick" in capsys.readouterr().err and page.read_text() == PAGE
    assert mp.main([str(run), "--page", str(page), "--allow-quick"]) == 0
    text = page.read_text()
    assert text.count("Smoke-test data, not figures") == 2  # each block says so
    assert "`gnnattn bench --suite sparse --quick`" in text


def test_cuda_runs_get_their_own_blocks(tmp_path):
    mp = _script()
    cpu, cuda = tmp_path / "cpu.json", tmp_path / "cuda.json"
    cpu.write_text(json.dumps(_run()))
    cuda.write_text(json.dumps(_run(device="cuda")))
    page = tmp_path / "performance.md"
    page.write_text(PAGE)
    assert mp.main([str(cpu), str(cuda), "--page", str(page)]) == 0
    text = page.read_text()
    assert "<!-- bench:sparse -->" in text and "<!-- bench:cuda/sparse -->" in text


def test_the_script_reads_a_real_quick_bench_run(tmp_path):
    from gnnattn.bench import BenchConfig, run

    mp = _script()
    cfg = BenchConfig(quick=True, suites=("softmax",), min_reps=1, max_reps=1, budget_s=0.1)
    result = run(cfg)
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(result, default=str))
    blocks = mp.load_runs([path], allow_quick=True)
    assert set(blocks) == {"softmax"}
    for r in result["rows"]:
        assert r["candidate"] in blocks["softmax"]
    assert result["machine"]["date"] and "triton" in result["machine"]


def test_the_performance_page_has_a_block_for_every_suite():
    from gnnattn.bench import SUITES

    text = (DOCS / "performance.md").read_text(encoding="utf-8")
    keys = re.findall(r"^<!-- bench:([\w/.-]+) -->$", text, re.M)
    assert sorted(keys) == sorted(set(keys)), "a suite with two blocks"
    assert set(SUITES) <= set(keys)
    assert len(re.findall(r"^<!-- /bench -->$", text, re.M)) == len(keys)
    # Every block is closed before the next opens.
    assert all(
        "<!-- bench:" not in m.group(0)[1:]
        for m in re.finditer(r"<!-- bench:.*?<!-- /bench -->", text, re.S)
    )


def test_the_block_names_a_fixed_reps_run_with_its_reps():
    mp = _script()
    run = _run()
    assert mp._command(run, "sparse") == "gnnattn bench --suite sparse"
    run["config"]["reps"] = 5  # `gnnattn bench --reps 5`
    assert mp._command(run, "sparse") == "gnnattn bench --suite sparse --reps 5"
