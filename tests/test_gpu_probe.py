"""The GPU probe (``.ci/gpu``) runs end to end in its dry run: CPU, interpreter, tiny sizes."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = (
    "tests",
    "softmax",
    "attention",
    "tiles",
    "options",
    "correctness",
    "registers",
    "compile",
    "gps",
)


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="the probe is a bash script for Linux")
def test_gpu_probe_dry_run_writes_every_section(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path)}
    env.pop("TRITON_INTERPRET", None)  # the probe sets it itself for the dry run
    proc = subprocess.Popen(
        ["bash", str(ROOT / ".ci" / "gpu"), "--dry-run"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # a timeout kills every process the probe started
    )
    try:
        out, _ = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    assert proc.returncode == 0, out[-4000:]
    for name in SECTIONS:
        result = json.loads((tmp_path / f"{name}.json").read_text())
        assert result["status"] == "ok", (name, result)
        assert result["dry_run"] is True
    attention = json.loads((tmp_path / "attention.json").read_text())
    assert attention["fused"] and "fwd_ms" in attention["fused"][0]
    correctness = json.loads((tmp_path / "correctness.json").read_text())
    assert correctness["backward_bitwise_identical"] is True
    assert max(correctness["max_abs_err"].values()) < 1e-4
    assert max(correctness["max_abs_err_options"].values()) < 1e-4
    options = json.loads((tmp_path / "options.json").read_text())
    # The dry run times one edge-feature variant (the device run adds one with dropout).
    expected = {"plain", "dropout", "edge_attr_F16"}
    assert set(options["fwdbwd"]) == expected
    assert all("fwdbwd_ms" in row for row in options["fwdbwd"].values()), options
    compiled = json.loads((tmp_path / "compile.json").read_text())
    assert compiled["fused_op_in_compiled_graph"] is True, compiled
    assert compiled["compiled_max_abs_diff"] < 1e-4 and compiled["export_max_abs_diff"] < 1e-4
    assert compiled["aoti_max_abs_diff"] < 1e-4 and compiled["opcheck_attention_fwd"] == "ok"
    softmax = json.loads((tmp_path / "softmax.json").read_text())
    assert {r["graph"] for r in softmax["rows"]} == {"degree 32", "hub"}
    assert all("error" not in r for r in softmax["rows"])
    # Achieved bandwidth as a fraction of the copy bandwidth, reported once per section.
    assert softmax["fraction_of_copy"]["fwd_best"] > 0 and softmax["goal"] == 0.7
    assert attention["fraction_of_copy"]["csr_fwd_best"] > 0
    tiles = json.loads((tmp_path / "tiles.json").read_text())
    assert tiles["cases"] and all("error" not in c for c in tiles["cases"]), tiles
    gps = json.loads((tmp_path / "gps.json").read_text())
    assert gps["fwdbwd_s"] > 0 and gps["attn_edges"] > gps["knn_edges"] > 0, gps
    window = [c for c in tiles["cases"] if c["case"].startswith("sliding window")]
    assert {c["mode"] for c in window} == {"fwd", "fwdbwd"}
