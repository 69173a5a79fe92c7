"""The DDP example on 2 gloo processes, launched with torchrun, ends with identical replicas."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "ddp_train.py"
# Several launches: the example once hung at exit in about 1 launch in 4 to 6 (a rank
# deadlocked tearing down the gloo process group), so one launch proved little.
LAUNCHES = 4
LAUNCH_TIMEOUT_S = 120  # a quick launch takes about 10 s on 2 CPU cores


def _rank_pids(out: Path, exclude: int) -> list[int]:
    """The processes whose command line names EXAMPLE and ``out``: the ranks of one launch.

    Found by command line, not as torchrun's children: they are reparented if torchrun dies.
    Linux only (/proc); elsewhere none are found and only torchrun's group is killed.
    """
    pids = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if str(EXAMPLE) in argv and str(out) in argv and int(entry.name) != exclude:
            pids.append(int(entry.name))
    return pids


def _kill_launch(proc: subprocess.Popen, out: Path) -> None:
    """SIGKILL torchrun's process group and each rank's: torchrun starts every rank in a
    session of its own (``start_new_session=True``), so killing torchrun's group alone
    would leave a hung rank alive."""
    ranks = _rank_pids(out, exclude=proc.pid)
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


def _torchrun(out: Path) -> subprocess.CompletedProcess:
    """One 2-process launch of the quick example, writing into ``out``; on a timeout (or
    any other error) every process of the launch is killed before the test fails."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    cmd += [str(EXAMPLE), "--quick", "--out", str(out)]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=LAUNCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        _kill_launch(proc, out)
        # The ranks hold the pipes too: read them only once every process is dead.
        stdout, stderr = proc.communicate(timeout=30)
        pytest.fail(
            f"torchrun did not finish in {LAUNCH_TIMEOUT_S} s (killed)\n"
            f"--- stdout ---\n{stdout[-2000:]}\n--- stderr ---\n{stderr[-3000:]}"
        )
    finally:
        if proc.poll() is None:  # an exception other than the timeout, e.g. Ctrl-C
            _kill_launch(proc, out)
            proc.wait(timeout=30)
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


@pytest.mark.slow
@pytest.mark.parametrize("launch", range(LAUNCHES))
def test_ddp_two_processes_end_identical(tmp_path, launch):
    proc = _torchrun(tmp_path)
    assert not _rank_pids(tmp_path, exclude=-1), "a rank outlived torchrun"
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")][-1]
    result = json.loads(line[len("RESULT ") :])
    assert result["world_size"] == 2 and result["identical"]
    assert result["loss_end"] < result["loss_start"]
    # Checked here too, from the files each rank wrote, not only by the script.
    a = torch.load(tmp_path / "ddp_rank0.pt")
    b = torch.load(tmp_path / "ddp_rank1.pt")
    assert a.keys() == b.keys() and len(a) > 10
    for k in a:
        assert torch.equal(a[k], b[k]), k
    # Training changed them: they are not merely the shared initialization.
    torch.manual_seed(0)
    sys.path.insert(0, str(EXAMPLE.parent))
    from tiny_gpt import CharGPT, load_text

    init = CharGPT(len(load_text()[1]), 32, 32, 4, 2).state_dict()
    assert not torch.equal(init["head.weight"], a["head.weight"])


def test_ddp_example_without_torchrun_says_how_to_launch(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--quick", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "RANK"},
    )
    assert proc.returncode != 0
    assert "torchrun --standalone --nproc_per_node 2" in proc.stderr
