"""``gnnattn partition``: one file per rank that ``GraphPart.load`` reads back as
``partition(...).part(rank)``; bad inputs are one line and status 2."""

import io
import os
import re
import select
import subprocess
import sys
import time

import pytest
import torch

from gnnattn.cli import main
from gnnattn.distributed import GraphPart, partition


def _graph(n: int = 60, e: int = 240) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    return torch.stack(
        [torch.randint(0, n, (e,), generator=g), torch.randint(0, n, (e,), generator=g)]
    )


def _same(a: GraphPart, b: GraphPart) -> None:
    assert repr(a) == repr(b)
    for name in ("targets", "sources", "halo", "edge_ids", "send_index", "global_edge_index"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert (a.send_counts, a.recv_counts, a.num_interior) == (b.send_counts, b.recv_counts,
                                                               b.num_interior)  # fmt: skip
    assert torch.equal(a.graph.edge_index, b.graph.edge_index)


@pytest.mark.parametrize(
    "method,as_dict,causal",
    [("metis", False, False), ("contiguous", True, True), ("random", True, False)],
)
def test_partition_writes_the_parts_of_partition(tmp_path, capsys, method, as_dict, causal):
    ei = _graph()
    n = 64  # four nodes without edges: only a dict can say so
    path = tmp_path / "g.pt"
    torch.save({"edge_index": ei, "num_nodes": n} if as_dict else ei.int(), path)
    argv = ["partition", str(path), "--parts", "3", "--method", method, "--seed", "1",
            "--out", str(tmp_path / "parts")]  # fmt: skip
    assert main(argv + (["--causal"] if causal else [])) == 0
    out = capsys.readouterr().out
    ref = partition(ei, 3, method=method, num_nodes=n if as_dict else None, causal=causal, seed=1)
    for r in range(3):
        loaded = GraphPart.load(tmp_path / "parts" / f"part-{r}-of-3.pt")
        want = ref.part(r)
        _same(loaded, want)
        line = (f"rank {r}: {want.num_targets:,} targets, {want.halo.numel():,} halo rows, "
                f"{want.num_edges:,} edges")  # fmt: skip
        assert line in out
    assert f"halo rows / owned rows: {100 * ref.halo_fraction():.1f}%" in out


def _error(capsys, argv, *needles):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("gnnattn partition: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, (needle, err)


def test_bad_inputs_are_one_line_and_status_2(tmp_path, capsys):
    out = ["--out", str(tmp_path / "o")]
    good = tmp_path / "good.pt"
    torch.save(_graph(), good)
    _error(capsys, ["partition", str(tmp_path / "missing.pt"), "--parts", "2", *out], "not there")
    _error(capsys, ["partition", str(tmp_path), "--parts", "2", *out], "a folder")
    _error(capsys, ["partition", str(good), "--parts", "0", *out], "--parts", "got 0")
    _error(capsys, ["partition", str(good), "--parts", "2", "--method", "spectral", *out],
           "--method")  # fmt: skip
    _error(capsys, ["partition", str(good), "--parts", "2", "--out", str(good)], "--out")
    # A folder that cannot be made (under a file): one line, not a traceback.
    _error(capsys, ["partition", str(good), "--parts", "2", "--out", str(good / "o")], "--out")
    text = tmp_path / "text.pt"
    text.write_text("not a tensor")
    _error(capsys, ["partition", str(text), "--parts", "2", *out], "torch.save file")
    cases = {
        "float": (torch.rand(2, 5), "integer edge_index of shape [2, E]"),
        "bool": (torch.rand(2, 5) > 0.5, "got torch.bool"),
        "shape": (torch.zeros(3, 5, dtype=torch.long), "shape [2, E]"),
        "list": ([1, 2], "got list"),
        "nokey": ({"edges": _graph()}, "'edge_index'"),
        "badn": ({"edge_index": _graph(), "num_nodes": 2.5}, "'num_nodes'"),
        "smalln": ({"edge_index": _graph(), "num_nodes": 3}, "number of nodes 3"),
        "negative": (torch.tensor([[0, -1], [1, 0]]), ""),
    }
    for name, (data, needle) in cases.items():
        path = tmp_path / f"{name}.pt"
        torch.save(data, path)
        _error(capsys, ["partition", str(path), "--parts", "2", *out], needle)
    # partition()'s seed is an int64: refused by the option, before the graph is read.
    _error(capsys, ["partition", str(good), "--parts", "2", "--seed", str(2**63), *out], "--seed")


def test_an_out_folder_that_cannot_be_written_is_refused_before_the_split(
    tmp_path, capsys, monkeypatch
):
    import tempfile

    import gnnattn.distributed

    def no_split(*args, **kwargs):
        raise AssertionError("the graph was split before --out was checked")

    def read_only(*args, **kwargs):
        raise OSError(30, "Read-only file system")

    good = tmp_path / "good.pt"
    torch.save(_graph(), good)
    # A graph refused on its contents leaves no --out folder behind.
    bad = tmp_path / "bad.pt"
    torch.save({"edge_index": _graph(), "num_nodes": 3}, bad)
    _error(capsys, ["partition", str(bad), "--parts", "2", "--out", str(tmp_path / "p")], "3")
    assert not (tmp_path / "p").exists()
    monkeypatch.setattr(gnnattn.distributed, "partition", no_split)
    monkeypatch.setattr(tempfile, "TemporaryFile", read_only)
    out = ["--out", str(tmp_path / "o")]
    _error(capsys, ["partition", str(good), "--parts", "2", *out], "--out", "Read-only")


class _Terminal(io.StringIO):
    """A stderr that says it is a terminal (what tqdm asks before drawing)."""

    def isatty(self) -> bool:
        return True


def _same_but_time(a: str, b: str) -> None:
    drop = re.compile(r"in \d+\.\d s")
    assert drop.sub("in T s", a) == drop.sub("in T s", b)


def test_progress_bar_on_a_terminal_and_nothing_on_a_pipe(tmp_path, capsys, monkeypatch):
    path = tmp_path / "g.pt"
    torch.save(_graph(), path)
    argv = ["partition", str(path), "--parts", "3", "--method", "random", "--out", str(tmp_path)]
    assert main(argv) == 0
    piped = capsys.readouterr()
    assert piped.err == ""  # stderr piped or captured: no bar, no stray byte
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(argv) == 0
    _same_but_time(capsys.readouterr().out, piped.out)  # stdout is the same either way
    drawn = terminal.getvalue()
    # Phases and part files, 4 + 3 steps, redrawn in place.
    for phase in ("reading the graph", "random: splitting into 3 parts", "writing part 3 of 3"):
        assert phase in drawn, (phase, drawn)
    assert "7/7" in drawn and "\r" in drawn


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal")
def test_progress_bar_on_a_real_pseudo_terminal(tmp_path):
    import fcntl
    import struct
    import termios

    path = tmp_path / "g.pt"
    torch.save(_graph(), path)
    leader, follower = os.openpty()
    # A terminal of 100 columns (a fresh pty has 0, where tqdm draws nothing).
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    argv = [sys.executable, "-m", "gnnattn", "partition", str(path), "--parts", "2",
            "--method", "contiguous", "--out", str(tmp_path / "parts")]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=follower)
    os.close(follower)
    drawn = b""
    deadline = time.monotonic() + 300  # a stuck command fails the test, never hangs it
    while time.monotonic() < deadline:
        if not select.select([leader], [], [], 1.0)[0]:
            if proc.poll() is not None:
                break
            continue
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # EIO once the command has closed its side
            break
        if not chunk:
            break
        drawn += chunk
    os.close(leader)
    out = proc.communicate(timeout=300)[0].decode()
    assert proc.returncode == 0
    assert "100%|" in drawn.decode() and "6/6" in drawn.decode(), drawn
    assert "\r" not in out and out.splitlines()[-1].startswith("halo rows / owned rows: ")
