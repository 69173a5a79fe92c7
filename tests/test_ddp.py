"""The DDP example on 2 gloo processes, launched with torchrun, ends with identical replicas."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "ddp_train.py"


@pytest.mark.slow
def test_ddp_two_processes_end_identical(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    proc = subprocess.run(
        [*cmd, str(EXAMPLE), "--quick", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
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
        env={k: v for k, v in __import__("os").environ.items() if k != "RANK"},
    )
    assert proc.returncode != 0
    assert "torchrun --standalone --nproc_per_node 2" in proc.stderr
