"""Smoke test of ``gnnattn bench``: it runs and writes its JSON (no timing assertions)."""

import io
import json
import sys

import pytest

from gnnattn.bench import SUITES, default_suites
from gnnattn.cli import main


@pytest.mark.slow
def test_bench_compile_suite_runs_every_row(tmp_path, capsys):
    """``--suite compile``: eager against compiled, and PyG against both on small graphs;
    every row ran and has a ratio to its baseline, and the compiled rows say their
    compile time."""
    path = tmp_path / "compile.json"
    assert main(["bench", "--suite", "compile", "--quick", "--json", str(path)]) == 0
    rows = json.loads(path.read_text())["rows"]
    assert len(rows) == 2 + 2 + 2 * 3  # train, sparse layer: 2 rows; TC, GPS: 3 at one size
    for r in rows:
        assert r["status"] == "ok" and r["ratio"] is not None and r["median_ms"] > 0, r
    compiled = [r for r in rows if r["candidate"] == "gnnattn torch.compile"]
    assert len(compiled) == 4 and all("first call" in r["note"] for r in compiled)
    assert {r["baseline"] for r in rows} == {
        "gnnattn eager", "PyG TransformerConv", "PyG GPSConv"
    }  # fmt: skip
    # The same weights, no dropout: every output but the train step's is compared.
    for r in rows:
        if r["case"].startswith("train step"):
            assert r["max_abs_diff"] is None, r
        else:
            assert r["max_abs_diff"] is not None and r["max_abs_diff"] < 1e-4, r


def test_bench_quick_writes_json(tmp_path, capsys):
    path = tmp_path / "bench.json"
    assert main(["bench", "--quick", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "nn.MultiheadAttention" in out and "TransformerConv" in out
    assert "PASS" not in out and "FAIL" not in out  # ratios only, no targets
    # Smoke sizes say so, above and below the tables.
    assert out.count("--quick: smoke-test sizes") == 2 and "NOT meaningful" in out

    result = json.loads(path.read_text())
    quick = [s for s in SUITES if s not in ("scale", "distributed", "compile")]
    assert result["suites"] == quick == list(default_suites())
    assert result["machine"]["torch"] and result["machine"]["threads"] >= 1
    assert "loadavg" in result["machine"]
    rows = result["rows"]
    assert {r["suite"] for r in rows} == set(quick)
    assert {r["mode"] for r in rows} == {"fwd", "fwdbwd", "step"}
    for r in rows:
        assert r["status"] == "ok" or r["status"].startswith(("skipped", "n/a")), r
        if r["status"] == "ok":
            assert r["median_ms"] > 0 and r["reps"] >= 1
            # Every candidate that ran computes the baseline's operator (but the limit
            # suite's passes, and the training step without dropout).
            if r["suite"] != "limit" and r["candidate"] != "gnnattn auto, dropout 0":
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
        "gnnattn auto, dropout 0.1",
        "gnnattn mp (message passing), dropout 0.1",
        "gnnattn auto, dropout 0",
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


def test_train_suite_times_a_training_step_against_mp(tmp_path):
    path = tmp_path / "bench.json"
    argv = ["bench", "--quick", "--suite", "train", "--no-memory", "--json", str(path)]
    assert main(argv) == 0
    rows = {r["candidate"]: r for r in json.loads(path.read_text())["rows"]}
    fused = rows["gnnattn auto, dropout 0.1"]
    mp = rows["gnnattn mp (message passing), dropout 0.1"]
    plain = rows["gnnattn auto, dropout 0"]
    assert {r["mode"] for r in rows.values()} == {"step"}
    assert fused["baseline"] == fused["candidate"] and fused["ratio"] == 1.0
    # "auto" says what it took; with dropout and edge features that is the fused kernel
    # wherever one is compiled.
    assert "auto took 'fused'" in fused["note"] or "auto took 'mp'" in fused["note"]
    # Same weights, same dropout masks: the first steps' losses and gradients agree.
    assert mp["max_abs_diff"] is not None and mp["max_abs_diff"] < 1e-4, mp
    assert "loss and parameter gradients" in mp["note"]
    assert "mp / auto = " in mp["note"]
    assert "auto(dropout 0.1) / auto(dropout 0) = " in plain["note"]
    assert plain["max_abs_diff"] is None  # another function: no diff


def test_scale_suite_needs_its_flag(capsys):
    assert "scale" in SUITES and "scale" not in default_suites()
    assert "scale" in default_suites(scale=True)
    # A user error: one line on stderr and exit status 2, no traceback.
    assert main(["bench", "--suite", "scale"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gnnattn bench: ") and "--scale" in err and err.count("\n") == 1
    assert main(["bench", "--scale", "--quick"]) == 2
    assert "quick" in capsys.readouterr().err


def test_bench_library_raises_value_error_not_system_exit():
    import argparse

    from gnnattn import bench

    args = argparse.Namespace(suite=["scale"], scale=False, quick=False)
    with pytest.raises(ValueError, match="--scale"):
        bench.main(args)


def test_cuda_timing_uses_events_and_cpu_timing_the_clock():
    import torch

    from gnnattn.bench.harness import timed

    seconds, out = timed(lambda: torch.ones(3).sum(), torch.device("cpu"))
    assert seconds >= 0 and out.item() == 3
    if torch.cuda.is_available():
        seconds, out = timed(lambda: torch.ones(3, device="cuda").sum(), torch.device("cuda"))
        assert seconds > 0 and out.item() == 3


def test_pyg_suite_gps_rows(tmp_path):
    path = tmp_path / "bench.json"
    argv = ["bench", "--quick", "--suite", "pyg", "--no-memory", "--json", str(path)]
    assert main(argv) == 0
    rows = json.loads(path.read_text())["rows"]
    assert {r["suite"] for r in rows} == {"pyg"}
    gps = [r for r in rows if "GPSConv" in r["case"]]
    assert {r["mode"] for r in gps} == {"fwd", "fwdbwd"}
    by = {(r["mode"], r["candidate"]): r for r in gps}
    for mode in ("fwd", "fwdbwd"):
        base = by[mode, "PyG GPSConv"]
        assert base["baseline"] == "PyG GPSConv" and base["ratio"] == 1.0
        for name in ("gnnattn GPSConv (auto)", "gnnattn GPSConv (fused)"):
            r = by[mode, name]
            assert r["status"] == "ok" and r["max_abs_diff"] < 1e-4, r
        assert "auto took '" in by[mode, "gnnattn GPSConv (auto)"]["note"]
    # The sizes are skewed, and the case says how much padding PyG's layer attends over.
    assert "(skewed)" in gps[0]["case"] and "padded:" in gps[0]["case"]


class _Terminal(io.StringIO):
    """A stderr that says it is a terminal (what tqdm asks before drawing)."""

    def isatty(self) -> bool:
        return True


def test_progress_bars_on_a_terminal_only(tmp_path, capsys, monkeypatch):
    argv = ["bench", "--quick", "--suite", "softmax", "--suite", "reorder", "--no-memory"]
    path = tmp_path / "bench.json"
    assert main([*argv, "--json", str(path)]) == 0
    piped = capsys.readouterr()
    # Piped: stderr holds the "running" lines and nothing else; the JSON is plain JSON.
    running = piped.err.splitlines()
    assert running and all(line.startswith("running [") for line in running), piped.err
    assert "\r" not in piped.out + piped.err
    json.loads(path.read_text())
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert [ln for ln in out.splitlines() if ln.startswith("[")] == [
        ln for ln in piped.out.splitlines() if ln.startswith("[")
    ]  # the same tables
    drawn = terminal.getvalue()
    # The suites (2 of them) and the cases of the one running, redrawn in place, with
    # the "running" lines written above them.
    assert "gnnattn bench" in drawn and "2/2" in drawn and "[softmax]" in drawn, drawn
    assert "[reorder]" in drawn and "\r" in drawn
    assert all(line in drawn for line in running)


def test_tiles_suite_quick(tmp_path):
    """``--suite tiles``: every case against its baseline (Flex forward, dense SDPA or
    "auto" forward + backward on the CPU, "fused" for the layer cases); a ``gnnattn tiles``
    row in each, run when the backend exists and said to be missing otherwise."""
    from gnnattn.ops import BACKENDS

    path = tmp_path / "tiles.json"
    argv = ["bench", "--quick", "--suite", "tiles", "--no-memory", "--json", str(path)]
    assert main(argv) == 0
    rows = json.loads(path.read_text())["rows"]
    assert {r["suite"] for r in rows} == {"tiles"}
    cases = {r["case"] for r in rows}
    for what in ("sliding window", "dilated window", "BigBird", "complete within each"):
        assert any(what in c for c in cases), (what, cases)
    knn = [r for r in rows if r["case"].startswith("kNN graph")]
    assert knn and "Hilbert order" in knn[0]["case"] and "tile fill at B=64" in knn[0]["case"]
    for r in rows:
        if r["candidate"] == "gnnattn tiles":
            assert (r["status"] == "ok") == ("tiles" in BACKENDS), r
            continue
        assert r["status"] == "ok", r
        assert r["max_abs_diff"] is not None and r["max_abs_diff"] < 1e-4, r
    by = {(r["case"], r["mode"], r["candidate"]): r for r in rows}
    window = next(c for c in cases if c.startswith("sliding window"))
    # Flex is the forward's baseline; on the CPU (no Flex backward) dense SDPA with the mask.
    assert by[window, "fwd", "FlexAttention (eager, BlockMask)"]["ratio"] == 1.0
    assert by[window, "fwdbwd", "dense SDPA, boolean mask"]["ratio"] == 1.0
    assert (window, "fwdbwd", "FlexAttention (eager, BlockMask)") not in by
    # On a random graph "auto" keeps the CSR kernel.
    random = [r for r in rows if r["case"].startswith("random graph")]
    auto = [r for r in random if r["candidate"] == "gnnattn auto"]
    assert auto and all("auto took 'tiles'" not in r["note"] for r in auto)


# --- a run keeps its rows when a suite fails; options that would mislead -------------


def _tiny_case(suite: str):
    import torch

    from gnnattn.bench import Candidate, Case

    x = torch.randn(4, 3, requires_grad=True)
    return Case(
        suite, "tiny", x, torch.ones(4, 3), "double", [Candidate("double", lambda t: 2 * t)]
    )


def test_a_suite_that_raises_is_an_error_row_and_the_run_goes_on(monkeypatch):
    import gnnattn.bench as bench
    from gnnattn.bench.suites import Suite

    def rows_fail(cfg, log):
        raise ImportError("method='metis' needs the 'pymetis' package")

    def cases_fail(cfg, device):
        raise RuntimeError("could not build the inputs")

    registry = (
        Suite("rows_fail", "finished rows, raises", rows=rows_fail),
        Suite("cases_fail", "raises while making its cases", cases=cases_fail),
        Suite("fine", "one tiny case", cases=lambda cfg, device: [_tiny_case("fine")]),
    )
    monkeypatch.setattr(bench, "REGISTRY", registry)
    cfg = bench.BenchConfig(suites=tuple(s.name for s in registry), memory=False, reps=1)
    rows = bench.run(cfg)["rows"]
    by = {r["suite"]: r for r in rows}
    assert by["rows_fail"]["status"] == (
        "error: ImportError: method='metis' needs the 'pymetis' package"
    )
    assert by["cases_fail"]["status"] == "error: RuntimeError: could not build the inputs"
    assert [r["status"] for r in rows if r["suite"] == "fine"] == ["ok", "ok"]  # fwd, fwdbwd
    assert "stopped by an error" in bench.format_table(rows)


def test_a_row_stopped_by_an_error_makes_the_exit_status_1(monkeypatch, tmp_path, capsys):
    # --quick "checks that every candidate runs": a script sees a failure in the status,
    # and the tables and the JSON still hold every row.
    import dataclasses

    import gnnattn.bench as bench

    def cases_fail(cfg, device):
        raise RuntimeError("could not build the inputs")

    registry = tuple(
        dataclasses.replace(s, cases=cases_fail) if s.name == "softmax" else s
        for s in bench.REGISTRY
    )
    monkeypatch.setattr(bench, "REGISTRY", registry)
    path = tmp_path / "bench.json"
    argv = ["bench", "--quick", "--suite", "softmax", "--no-memory", "--json", str(path)]
    assert main(argv) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith("gnnattn bench: 1 row(s) stopped by an error, the first softmax")
    assert "RuntimeError: could not build the inputs" in err[-1]
    rows = json.loads(path.read_text())["rows"]
    assert [r["status"] for r in rows] == ["error: RuntimeError: could not build the inputs"]


def test_cpu_only_suites_refuse_a_cuda_device():
    # Their processes run on the CPU: under a CUDA header their figures would mislead.
    from gnnattn.bench import BenchConfig, run

    for suite in ("scale", "distributed"):
        with pytest.raises(ValueError, match=f"--device cpu for the suite {suite}.*--device cuda"):
            run(BenchConfig(device="cuda", suites=("softmax", suite)))


def _captured_config(monkeypatch, argv):
    """The BenchConfig that ``gnnattn bench ARGV`` would run (the run itself is cut short)."""
    import gnnattn.bench as bench

    seen = {}

    def fake_run(cfg, log=None):
        seen["cfg"] = cfg
        raise ValueError("stopped by the test")

    monkeypatch.setattr(bench, "run", fake_run)
    assert main(argv) == 2
    return seen["cfg"]


def test_scale_adds_the_scale_suite_to_the_named_ones(monkeypatch, capsys):
    cfg = _captured_config(monkeypatch, ["bench", "--scale", "--suite", "sparse"])
    assert cfg.suites == ("sparse", "scale")
    cfg = _captured_config(monkeypatch, ["bench", "--scale"])
    assert cfg.suites == default_suites(scale=True)
    cfg = _captured_config(monkeypatch, ["bench", "--suite", "distributed", "--reps", "5"])
    assert cfg.suites == ("distributed",) and cfg.reps == 5


def test_suite_help_names_every_suite_left_out_by_default(capsys):
    from gnnattn.bench.suites import REGISTRY

    assert main(["bench", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    left_out = [s.name for s in REGISTRY if s.name not in default_suites()]
    assert len(left_out) == 3
    assert f"every suite but {left_out[0]}, {left_out[1]} and {left_out[2]}" in text


def test_reps_reach_the_suites_that_time_their_own(monkeypatch):
    from gnnattn.bench.harness import BenchConfig
    from gnnattn.bench.suites import scale

    jobs = []

    def fake_worker(args):
        jobs.append(args)
        return None, ["no worker in this test"]

    monkeypatch.setattr(scale, "_run_worker", fake_worker)
    rows = scale.scale_rows(BenchConfig(quick=True, reps=4))
    assert len(jobs) == 5 and all(job["reps"] == 4 for job in jobs)  # 3 inputs, GPS, PyG probe
    assert rows and all(r["status"].startswith(("error", "not run", "skipped")) for r in rows)


def test_scale_worker_interleaves_the_baseline_with_the_layer(monkeypatch):
    from gnnattn.bench.suites import scale

    calls = []
    timed_ms = scale._ms

    def recorded(fn):
        calls.append(fn.__name__)
        return timed_ms(fn)

    monkeypatch.setattr(scale, "_ms", recorded)
    args = dict(nodes=300, deg=4, embed=8, heads=2, reps=3, input="csr", threads=1, seed=0)
    out = scale._worker(args)
    # The first call (its peak read) alone; then one of each per repetition, in turn.
    assert calls == ["fwdbwd"] + ["fwd", "fwdbwd", "spmm"] * 3
    assert len(out["spmm_ms"]) == len(out["fwd_ms"]) == len(out["fwdbwd_ms"]) == 3
    assert out["peak_rss"] >= out["rss_inputs"] > 0


def test_models_causal_graph_is_built_once_on_the_case_device(monkeypatch):
    import torch

    from gnnattn.bench.harness import BenchConfig
    from gnnattn.bench.suites import models
    from gnnattn.graphs import AttentionGraph

    made = []
    causal = AttentionGraph.causal

    def counted(*args, **kwargs):
        made.append(kwargs.get("device"))
        return causal(*args, **kwargs)

    monkeypatch.setattr(AttentionGraph, "causal", staticmethod(counted))
    case = models._causal_case(BenchConfig(quick=True), torch.device("cpu"), torch.Generator())
    cand = next(c for c in case.candidates if c.name == "layer(x, AttentionGraph.causal(T))")
    with torch.no_grad():
        outs = [cand.fn(case.x) for _ in range(3)]
    assert made == [torch.device("cpu")]  # once, with the device (not per timed call)
    assert torch.equal(outs[0], outs[2])


def test_json_path_that_cannot_be_written_is_refused_before_the_run(monkeypatch, capsys, tmp_path):
    import tempfile

    from gnnattn import cli

    # The probe leaves a new file unmade (a dangling link stays one) and an
    # existing one as it was.
    existing = tmp_path / "old.json"
    existing.write_text("{}")
    assert cli._out_file(str(existing)) == str(existing) and existing.read_text() == "{}"
    assert cli._out_file(str(tmp_path / "new.json")) and not (tmp_path / "new.json").exists()
    (tmp_path / "link.json").symlink_to(tmp_path / "target.json")
    assert cli._out_file(str(tmp_path / "link.json"))
    assert (tmp_path / "link.json").is_symlink() and not (tmp_path / "target.json").exists()

    def refused(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    cases = [
        (tmp_path, "a folder"),
        (f"{tmp_path}/new/", "a folder"),  # abspath would drop the slash
        (tmp_path / "missing" / "b.json", "is not a folder"),
        ("", "got ''"),
    ]
    for path, needle in cases:
        assert main(["bench", "--json", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("gnnattn bench: ") and "--json" in err and needle in err, err
    # A file the user cannot write (root passes os.access for any path), in a
    # folder it cannot write in.
    monkeypatch.setattr(cli, "open", refused, raising=False)
    monkeypatch.setattr(tempfile, "TemporaryFile", refused)
    for path in (tmp_path / "new.json", existing):
        assert main(["bench", "--json", str(path)]) == 2
        assert "can be written" in capsys.readouterr().err


def test_json_write_error_at_the_end_is_one_line(monkeypatch, capsys, tmp_path):
    import shutil

    import gnnattn.bench as bench

    folder = tmp_path / "out"
    folder.mkdir()
    real_run = bench.run

    def run_then_lose_the_folder(cfg, log=None):
        shutil.rmtree(folder)  # the folder goes while the bench runs
        return real_run(cfg, log)

    monkeypatch.setattr(bench, "run", run_then_lose_the_folder)
    argv = ["bench", "--quick", "--suite", "softmax", "--no-memory", "--reps", "1"]
    assert main([*argv, "--json", str(folder / "b.json")]) == 2
    captured = capsys.readouterr()
    assert "[softmax]" in captured.out  # the tables were printed
    last = captured.err.strip().splitlines()[-1]
    assert last.startswith("gnnattn bench: --json: could not write") and "Traceback" not in (
        captured.err
    )


# --- compile suite: a failing compile, and comparisons that can fail ------------------


def test_compile_loop_returns_the_last_output_not_the_input():
    import torch

    from gnnattn.bench.suites.compiled import _loop

    batches = [(torch.randn(3, 2),), (torch.randn(4, 2),)]
    out = _loop(lambda b: b[0] * 3, batches)(torch.zeros(1))
    assert torch.equal(out, batches[-1][0].detach() * 3) and not out.requires_grad


@pytest.mark.slow
def test_compile_suite_without_a_compiler_keeps_its_eager_rows(monkeypatch):
    import torch

    from gnnattn.bench.harness import BenchConfig
    from gnnattn.bench.suites.compiled import COMPILED, compile_rows

    class NoCompiler(torch.nn.Module):
        """What torch.compile gives on a machine where Inductor cannot build its code."""

        def __init__(self, module):
            super().__init__()
            self.module = module

        def forward(self, *args, **kwargs):
            raise RuntimeError("InductorError: no C++ compiler\nmore lines")

    monkeypatch.setattr(torch, "compile", lambda module, **kwargs: NoCompiler(module))
    rows = compile_rows(BenchConfig(quick=True, reps=1, memory=False))
    compiled = [r for r in rows if r["candidate"] == COMPILED]
    assert len(compiled) == 4  # train, sparse layer, TransformerConv, GPSConv
    for r in compiled:
        assert r["status"] == "error: RuntimeError: InductorError: no C++ compiler", r
    others = [r for r in rows if r["candidate"] != COMPILED]
    assert others and all(r["status"] == "ok" for r in others), others
    # PyG's layers against gnnattn's, same weights: the last batch's outputs agree.
    small = [r for r in others if r["case"].startswith("small graphs")]
    assert len(small) == 4
    for r in small:
        assert r["max_abs_diff"] is not None and r["max_abs_diff"] < 1e-4, r


def test_train_diff_covers_the_backward():
    import torch

    from gnnattn.bench.suites.train import _First, _first_step_diff

    base = _First(1.5, [torch.ones(3), torch.zeros(2)])
    assert _first_step_diff(base, _First(1.5, [torch.ones(3), torch.zeros(2)])) == 0.0
    # The same loss, a wrong gradient: the diff shows it.
    assert _first_step_diff(base, _First(1.5, [torch.ones(3), torch.tensor([0.0, 0.25])])) == 0.25
    assert _first_step_diff(base, _First(1.0, base.grads)) == 0.5


def test_a_candidate_failing_after_its_warm_up_is_an_error_row_and_the_others_go_on():
    import torch

    from gnnattn.bench.harness import BenchConfig, Candidate, Case, run_case

    calls = [0]

    def fails_on_its_second_call(t):
        calls[0] += 1
        if calls[0] >= 2:
            raise RuntimeError("out of memory (second call)")
        return t * 2

    x = torch.randn(4, requires_grad=True)
    case = Case(
        "demo",
        "a flaky candidate",
        x,
        torch.ones(4),
        "good",
        [Candidate("good", lambda t: t * 2), Candidate("flaky", fails_on_its_second_call)],
    )
    rows = {r["candidate"]: r for r in run_case(case, "fwd", BenchConfig(min_reps=3, max_reps=3))}
    assert rows["good"]["status"] == "ok" and rows["good"]["reps"] == 3
    assert rows["good"]["median_ms"] is not None and rows["good"]["peak_bytes"] is not None
    flaky = rows["flaky"]
    assert flaky["status"] == "error: RuntimeError: out of memory (second call)"
    assert flaky["median_ms"] is None and flaky["ratio"] is None and flaky["peak_bytes"] is None


def test_tiles_cases_keep_an_unavailable_flex_row_saying_why(monkeypatch):
    import torch
    import torch.nn.attention.flex_attention as flex

    from gnnattn.bench import BenchConfig
    from gnnattn.bench.suites import tiles

    def fails(*args, **kwargs):
        raise RuntimeError("no block mask here")

    monkeypatch.setattr(flex, "create_block_mask", fails)
    fwd, bwd = tiles._window_cases(BenchConfig(quick=True), torch.device("cpu"))
    assert fwd.baseline == "dense SDPA, boolean mask"
    skipped = [c for c in fwd.candidates if c.name.startswith("FlexAttention")]
    assert len(skipped) == 1 and "no block mask here" in skipped[0].skip
    # The CPU's Flex has no backward: no Flex row there, available or not.
    assert not any(c.name.startswith("FlexAttention") for c in bwd.candidates)


def test_the_share_of_empty_blocks_is_a_share_at_any_length():
    from torch.nn.attention.flex_attention import create_block_mask

    from gnnattn.bench.suites.tiles import _empty_blocks

    def window(b, h, q, k):
        return (q - k).abs() <= 20

    # 200 tokens: 2 x 2 blocks of 128, all four visited (sparsity() says -64%).
    assert _empty_blocks(create_block_mask(window, None, None, 200, 200, device="cpu")) == 0.0
    # 1,024 tokens: 8 x 8 blocks, 8 + 2 * 7 visited.
    share = _empty_blocks(create_block_mask(window, None, None, 1024, 1024, device="cpu"))
    assert share == pytest.approx(100 * (1 - 22 / 64))
