"""The DDP example on 2 gloo processes, launched with torchrun, ends with identical replicas,
resumes bitwise from its checkpoints, and survives a rank's crash under torchrun's restarts."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from ranks import kill_launch, launch_pids
from test_checkpoints import assert_identical, run_in_own_group

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "ddp_train.py"
FAIL_AT_STEP = "GNNATTN_FAIL_AT_STEP"  # the examples' crash test hook (examples/common.py)
# Several launches: the example once hung at exit in about 1 launch in 4 to 6 (a rank
# deadlocked tearing down the gloo process group), so one launch proved little.
LAUNCHES = 4
LAUNCH_TIMEOUT_S = 120  # a quick launch takes about 10 s on 2 CPU cores


def _torchrun(
    out: Path, *args: str, max_restarts: int = 0, fail_at_step: int | None = None
) -> subprocess.CompletedProcess:
    """One 2-process launch of the quick example (with ``args``), writing into ``out``; on a
    timeout (or any other error) every process of the launch is killed before the test
    fails. ``fail_at_step`` sets the example's crash test hook (rank 1 exits after it)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    cmd += ["--max-restarts", str(max_restarts)]
    cmd += [str(EXAMPLE), "--quick", "--out", str(out), *args]
    env = {k: v for k, v in os.environ.items() if k != FAIL_AT_STEP}
    if fail_at_step is not None:
        env[FAIL_AT_STEP] = str(fail_at_step)
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=env,
    )
    try:
        stdout, stderr = proc.communicate(timeout=LAUNCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        kill_launch(proc, EXAMPLE, out)
        # The ranks hold the pipes too: read them only once every process is dead.
        stdout, stderr = proc.communicate(timeout=30)
        pytest.fail(
            f"torchrun did not finish in {LAUNCH_TIMEOUT_S} s (killed)\n"
            f"--- stdout ---\n{stdout[-2000:]}\n--- stderr ---\n{stderr[-3000:]}"
        )
    finally:
        if proc.poll() is None:  # an exception other than the timeout, e.g. Ctrl-C
            kill_launch(proc, EXAMPLE, out)
            proc.wait(timeout=30)
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


@pytest.mark.slow
@pytest.mark.parametrize("launch", range(LAUNCHES))
def test_ddp_two_processes_end_identical(tmp_path, launch):
    proc = _torchrun(tmp_path)
    assert not launch_pids(EXAMPLE, tmp_path, exclude=-1), "a rank outlived torchrun"
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
    from tiny_gpt import CharGPT, load_data

    init = CharGPT(len(load_data().vocab), 32, 32, 4, 2).state_dict()
    assert not torch.equal(init["head.weight"], a["head.weight"])


def test_ddp_example_without_torchrun_says_how_to_launch(tmp_path):
    proc = run_in_own_group(
        [sys.executable, str(EXAMPLE), "--quick", "--out", str(tmp_path)],
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "RANK"},
    )
    assert proc.returncode != 0
    assert "torchrun --standalone --nproc_per_node 2" in proc.stderr


# Checkpoints at steps 10, 20 and 30; the fault comes after step 15, so a resumed run
# redoes steps 11 to 15 from the checkpoint of step 10.
STEPS = ("--steps", "30", "--ckpt-every", "10")
FAULT = 15


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ddp_uninterrupted")
    proc = _torchrun(out, *STEPS)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _assert_same_run(reference: Path, out: Path) -> None:
    """Bitwise the same final parameters on both ranks, and the same final checkpoint:
    model, optimizer state, step and every rank's random states."""
    for rank in (0, 1):
        a = torch.load(reference / f"ddp_rank{rank}.pt", weights_only=True)
        b = torch.load(out / f"ddp_rank{rank}.pt", weights_only=True)
        assert_identical(a, b, f"ddp_rank{rank}.pt")
    a = torch.load(reference / "ddp_ckpt.pt", weights_only=True)
    b = torch.load(out / "ddp_ckpt.pt", weights_only=True)
    assert a["step"] == b["step"] == 30 and len(a["rng"]) == 2
    assert a["optimizer"]["state"]
    assert_identical(a, b)


@pytest.mark.slow
def test_ddp_interrupted_and_resumed_is_bitwise_the_uninterrupted_run(uninterrupted, tmp_path):
    ckpt = tmp_path / "ddp_ckpt.pt"
    first = _torchrun(tmp_path, *STEPS, "--resume", fail_at_step=FAULT)  # no restarts: gives up
    assert not launch_pids(EXAMPLE, tmp_path, exclude=-1), "a rank outlived torchrun"
    assert first.returncode != 0
    assert f"no checkpoint at {ckpt}: starting fresh" in first.stdout
    assert f"{FAIL_AT_STEP}=15: exiting with status 1" in first.stderr
    assert torch.load(ckpt, weights_only=True)["step"] == 10
    # The same command: resumes, and the marker file keeps the fault from happening again.
    second = _torchrun(tmp_path, *STEPS, "--resume", fail_at_step=FAULT)
    assert not launch_pids(EXAMPLE, tmp_path, exclude=-1), "a rank outlived torchrun"
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"resumed from {ckpt} at step 10" in second.stdout
    _assert_same_run(uninterrupted, tmp_path)


@pytest.mark.slow
def test_ddp_elastic_restart_ends_with_the_parameters_of_a_run_without_fault(
    uninterrupted, tmp_path
):
    ckpt = tmp_path / "ddp_ckpt.pt"
    proc = _torchrun(tmp_path, *STEPS, "--resume", max_restarts=1, fail_at_step=FAULT)
    assert not launch_pids(EXAMPLE, tmp_path, exclude=-1), "a rank outlived torchrun"
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Rank 1 did crash, torchrun restarted the group, and the group resumed.
    assert (tmp_path / "failed_at_step_15").exists()
    assert f"{FAIL_AT_STEP}=15: exiting with status 1" in proc.stderr
    assert f"no checkpoint at {ckpt}: starting fresh" in proc.stdout
    assert f"resumed from {ckpt} at step 10" in proc.stdout
    _assert_same_run(uninterrupted, tmp_path)


@pytest.mark.slow
def test_ddp_bad_checkpoint_stops_every_rank_with_the_error(tmp_path):
    ckpt = tmp_path / "ddp_ckpt.pt"
    ckpt.write_bytes(b"PK\x03\x04 half a zip file")
    proc = _torchrun(tmp_path, *STEPS, "--resume")
    assert not launch_pids(EXAMPLE, tmp_path, exclude=-1), "a rank outlived torchrun"
    assert proc.returncode != 0
    # Rank 0 read the file and sent the error to rank 1: both raise it, neither waits for
    # the other. (Counted at least once, not twice: whichever rank exits first, torchrun
    # may stop the other before its traceback is printed.)
    message = f"ValueError: Checkpoint {ckpt} is unreadable (truncated, or not a checkpoint)"
    assert message in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" in proc.stderr and "RESULT" not in proc.stdout
