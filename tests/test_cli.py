"""The ``gnnattn`` command answers user errors with one line on stderr and status 2."""

import sys

import pytest
import torch
from test_checkpoints import run_in_own_group

from gnnattn import cli
from gnnattn.cli import DEMO_MAX_TOKENS, DEMO_OUT, main


@pytest.fixture
def a_file(tmp_path):
    path = tmp_path / "a_file"
    path.write_text("not a folder")
    return path


def _one_line_error(capsys, argv, *needles: str) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err
    assert err.startswith(f"gnnattn {argv[0]}: ") and err.count("\n") == 1, err
    assert "Traceback" not in err and "usage:" not in err
    for needle in needles:
        assert needle in err, (needle, err)
    return err


@pytest.mark.parametrize(
    "argv,needles",
    [
        (["check", "--tokens", "0"], ["--tokens", "got 0"]),
        (["check", "--tokens", "-3"], ["--tokens", "got -3"]),
        (["check", "--tokens", "many"], ["--tokens", "expected an int, got 'many'"]),
        (["check", "--tokens", "100000"], ["--tokens", "got 100000"]),
        (["check", "--seed", "-1"], ["--seed"]),
        (["compare", "--heads", "3"], ["--heads", "a divisor of --embed-dim 16, got 3"]),
        (["compare", "--heads", "0"], ["--heads", "got 0"]),
        (["compare", "--tokens", "0"], ["--tokens"]),
        (["compare", "--embed-dim", "0"], ["--embed-dim"]),
        (["compare", "--reps", "0"], ["--reps"]),
        (["compare", "--device", "gpu"], ["--device", "expected cpu, cuda or cuda:N"]),
        (["compare", "--device", "cuda:99"], ["--device"]),
        (["compare", "--dtype", "float64"], ["--dtype"]),
        (["bench", "--threads", "0"], ["--threads", "got 0"]),
        (["bench", "--reps", "0"], ["--reps", "got 0"]),
        (["bench", "--device", "tpu"], ["--device"]),
        (["bench", "--json", "/nonexistent-folder/bench.json"], ["--json", "not a folder"]),
        (["demo", "--seed", "x"], ["--seed"]),
    ],
)
def test_bad_options_are_one_line_and_status_2(capsys, argv, needles):
    _one_line_error(capsys, argv, *needles)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("command", ["compare", "bench"])
def test_a_cuda_device_that_is_not_there_is_a_user_error(capsys, command):
    _one_line_error(capsys, [command, "--device", "cuda"], "--device", "sees no CUDA device")


def test_the_library_refuses_cuda_without_it_by_a_value_error(monkeypatch):
    from gnnattn.compare import compare

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="Expected a CUDA device for device='cuda'"):
        compare(tokens=3, embed_dim=4, num_heads=1, device="cuda")
    with pytest.raises(ValueError, match="Expected 'tokens' to be a positive int, got 0"):
        compare(tokens=0, embed_dim=4, num_heads=1)


def test_demo_out_must_be_a_folder(capsys, a_file):
    _one_line_error(capsys, ["demo", "--out", str(a_file)], "--out", "which is a file")
    under = a_file / "sub" / "dir"
    _one_line_error(capsys, ["demo", "--out", str(under)], "--out", f"{str(a_file)!r} is a file")
    _one_line_error(capsys, ["bench", "--json", str(a_file / "b.json")], "--json")


def test_demo_out_that_cannot_be_made_is_a_user_error(capsys, tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(cli.os, "makedirs", refuse)
    err = _one_line_error(capsys, ["demo", "--out", str(tmp_path / "new")], "--out")
    assert "Permission denied" in err


def test_demo_out_that_cannot_be_written_is_refused_before_the_run(capsys, tmp_path, monkeypatch):
    # A folder that exists but takes no file (read-only, or /proc/sys): refused by a
    # probe write before the comparison runs, not by the first PNG after it.
    import tempfile

    def refuse(*args, **kwargs):
        raise OSError(30, "Read-only file system")

    def no_run(*args, **kwargs):
        raise AssertionError("the demo ran before its folder was checked")

    monkeypatch.setattr(tempfile, "TemporaryFile", refuse)
    monkeypatch.setattr(cli, "_embed", no_run)
    err = _one_line_error(capsys, ["demo", "--out", str(tmp_path)], "--out", "Read-only")
    assert "expected a folder to write in" in err


def test_a_failed_write_is_a_user_error(capsys, monkeypatch):
    def full(args):
        raise OSError(28, "No space left on device", "out/heatmap.png")

    monkeypatch.setattr(cli, "_cmd_check", full)
    _one_line_error(capsys, ["check"], "No space left on device", "out/heatmap.png")


def test_out_of_memory_is_one_line_and_status_1(capsys, monkeypatch, tmp_path):
    # A partition of an edge list whose largest id is 2**40 makes a CSR of 2**40 + 1
    # pointers: numba's allocation raises MemoryError (not a user error: status 1).
    def too_large(args):
        raise MemoryError("Allocation failed (probably too large).")

    monkeypatch.setattr(cli, "_cmd_partition", too_large)
    graph = tmp_path / "g.pt"
    torch.save(torch.tensor([[0, 2**40], [1, 2]]), graph)
    assert main(["partition", str(graph), "--parts", "2", "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("gnnattn partition: out of memory (Allocation failed"), err
    assert "node ids and sizes" in err


def test_text_that_is_not_utf8_is_a_user_error(capsys):
    # A shell passes bytes that are not UTF-8 as lone surrogates.
    _one_line_error(capsys, ["demo", "--text", "\udcff bank"], "--text", "not UTF-8")


def test_an_empty_text_is_a_user_error(capsys):
    _one_line_error(capsys, ["demo", "--text", "   "], "--text is empty")


def test_help_returns_zero(capsys):
    assert main(["demo", "--help"]) == 0
    assert f"{DEMO_OUT}/" in capsys.readouterr().out


def test_the_installed_command_prints_no_traceback(tmp_path):
    # The whole way a user meets it: a process, its stderr and its exit status.
    proc = run_in_own_group(
        [sys.executable, "-m", "gnnattn", "check", "--tokens", "0"], timeout=120, cwd=tmp_path
    )
    assert proc.returncode == 2
    assert proc.stderr == "gnnattn check: argument --tokens: expected an int in [1, 256], got 0\n"


def test_check_runs_on_one_token(capsys):
    assert main(["check", "--tokens", "1"]) == 0
    assert "agreement: OK" in capsys.readouterr().out


def test_demo_cuts_long_text_and_writes_to_the_documented_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    words = [f"w{i}" for i in range(DEMO_MAX_TOKENS + 6)]
    assert main(["demo", "--text", " ".join(words)]) == 0
    out = capsys.readouterr().out
    assert f"--text has {len(words)} tokens; the demo takes the first {DEMO_MAX_TOKENS}" in out
    assert f"tokens ({DEMO_MAX_TOKENS}):" in out
    # Past a few tokens the graph drawings keep each target's heaviest edges only.
    assert "show each token's 3 heaviest incoming edges" in out
    folder = tmp_path / DEMO_OUT
    for name in ("attention_graph.png", "heatmap.png", "causal_dag.png", "side_by_side.png"):
        assert (folder / name).exists()
    page = (folder / "explorer.html").read_text(encoding="utf-8")
    assert f'"w{DEMO_MAX_TOKENS - 1}"' in page and f'"w{DEMO_MAX_TOKENS}"' not in page
    # No other folder was made next to it (the demo once wrote to a random name).
    assert [p.name for p in tmp_path.iterdir()] == [DEMO_OUT]


def test_bench_prints_no_profiler_chatter(capfd):
    # Kineto writes "USDT: ... profiler_start" to file descriptor 2 on every profiled call.
    assert main(["bench", "--quick", "--suite", "softmax"]) == 0
    out, err = capfd.readouterr()
    assert "profiler_start" not in err and "USDT" not in err
    assert "running [softmax]" in err  # the progress lines still come through
    assert "NOT meaningful" in out
