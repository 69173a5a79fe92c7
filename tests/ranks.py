"""Run a test function on P gloo processes of one thread each, and collect what each returns.

``run_ranks("dist_workers:check", 3, case=...)`` starts 3 Python processes, each in a
session of its own (so a hung rank is killed with its whole group on timeout), joins
them in a gloo process group through a file store (no port to collide), calls
``dist_workers.check(**kwargs)`` on every rank and returns the ranks' results (what
``torch.save`` can write) in rank order. A rank that raises fails the test with its
traceback.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

TESTS = Path(__file__).resolve().parent

_BOOT = """
import os, sys, traceback
import torch
torch.set_num_threads(1)
import torch.distributed as dist
sys.path.insert(0, {tests!r})
rank, world, tmp = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
dist.init_process_group("gloo", init_method="file://" + tmp + "/store", rank=rank,
                        world_size=world)
try:
    import importlib
    module, name = {worker!r}.split(":")
    kwargs = torch.load(tmp + "/kwargs.pt", weights_only=False)
    result = getattr(importlib.import_module(module), name)(**kwargs)
    torch.save(result, f"{{tmp}}/rank{{rank}}.pt")
    del result
    dist.barrier()
    code = 0
except BaseException:
    traceback.print_exc()
    code = 1
# Leave without tearing gloo down: its destructors at exit (destroy_process_group or
# interpreter finalization) aborted a rank with "terminate called without an active
# exception" about once in tens of launches, after its result was written. The barrier
# above keeps a rank from leaving while a peer still reads from it; a failed rank
# leaves at once, and its peers fail or time out, killed with their groups.
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)
"""


def _kill(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)  # each rank leads its own group
        except ProcessLookupError:
            pass
    for p in procs:
        p.wait()


def launch_pids(script: Path, out: Path, exclude: int) -> list[int]:
    """The processes whose command line names ``script`` and ``out``: the ranks of one
    torchrun launch, found by command line (they are reparented if torchrun dies).
    Linux only (/proc); elsewhere none are found."""
    pids = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if str(script) in argv and str(out) in argv and int(entry.name) != exclude:
            pids.append(int(entry.name))
    return pids


def kill_launch(proc: subprocess.Popen, script: Path, out: Path) -> None:
    """SIGKILL torchrun's process group and each rank's: torchrun starts every rank in a
    session of its own (``start_new_session=True``), so killing torchrun's group alone
    would leave a hung rank alive."""
    ranks = launch_pids(script, out, exclude=proc.pid)
    groups = {proc.pid}  # torchrun leads its group: it was started with start_new_session
    for pid in ranks:
        try:
            groups.add(os.getpgid(pid))
        except ProcessLookupError:
            pass
    groups.discard(os.getpgrp())  # never our own (pytest's) group
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid in ranks:  # in case a rank's group was ours after all
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_ranks(worker: str, world_size: int, *, timeout: float = 120, **kwargs: Any) -> list[Any]:
    """``worker`` (``"module:function"`` of the tests folder) on ``world_size`` ranks."""
    with tempfile.TemporaryDirectory() as tmp:
        torch.save(kwargs, f"{tmp}/kwargs.pt")
        boot = _BOOT.format(tests=str(TESTS), worker=worker)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", boot, str(r), str(world_size), tmp],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=env,
                start_new_session=True,
            )
            for r in range(world_size)
        ]
        try:
            outs = [p.communicate(timeout=timeout)[0] for p in procs]
        except subprocess.TimeoutExpired:
            _kill(procs)
            raise AssertionError(
                f"{worker} on {world_size} ranks did not finish in {timeout} s (killed)"
            ) from None
        except BaseException:
            _kill(procs)
            raise
        for r, (p, out) in enumerate(zip(procs, outs, strict=True)):
            if p.returncode != 0:
                raise AssertionError(f"rank {r} of {worker} exited {p.returncode}:\n{out[-4000:]}")
        return [torch.load(f"{tmp}/rank{r}.pt", weights_only=False) for r in range(world_size)]
