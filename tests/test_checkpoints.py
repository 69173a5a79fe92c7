"""Nothing lost across a save: the examples resume bitwise, refuse bad checkpoints by name,
and the layers' state survives a change of backend, of device and of process.

The 2-rank DDP and elastic-restart checks are in ``test_ddp.py``.
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gnnattn import AttentionGraph, SelfAttentionConv, sliding_window_graph
from gnnattn.nn import GraphTransformer

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
sys.path.insert(0, str(EXAMPLES))
import common  # noqa: E402  (examples/common.py: checkpoints and the test hook)
import tiny_gpt  # noqa: E402

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

# Small enough for three runs in about 20 s on 2 busy cores; dropout on, so resuming
# must also restore the random state that draws the dropout masks.
TINY = ["--quick", "--steps", "12", "--batch-size", "8", "--block", "16", "--embed-dim", "32"]
TINY += ["--sample", "10", "--dropout", "0.1"]
RUN_TIMEOUT_S = 240  # one run takes about 7 s


def assert_identical(a, b, where: str = "checkpoint") -> None:
    """``a`` and ``b`` equal all the way down: tensors by ``torch.equal`` (bitwise, same
    dtype and shape), containers key by key, everything else by ``==``."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), where
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{where}: {a.keys()} {b.keys()}"
        for k in a:
            assert_identical(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_identical(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def run_in_own_group(cmd: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run`` in a session of its own; on a timeout (or any exception) the
    whole process group is killed before the test fails, so nothing outlives it."""
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **kwargs,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=30)
        pytest.fail(
            f"{cmd[:3]} did not finish in {timeout} s (killed)\n"
            f"--- stdout ---\n{stdout[-2000:]}\n--- stderr ---\n{stderr[-3000:]}"
        )
    finally:
        if proc.poll() is None:  # an exception other than the timeout, e.g. Ctrl-C
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=30)
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def run_tiny_gpt(
    out: Path, *extra: str, fail_at_step: int | None = None
) -> subprocess.CompletedProcess:
    """One run of the example; ``fail_at_step`` sets its crash test hook."""
    cmd = [sys.executable, str(EXAMPLES / "tiny_gpt.py"), *TINY, "--out", str(out), *extra]
    env = {k: v for k, v in os.environ.items() if k != common.FAIL_AT_STEP}
    if fail_at_step is not None:
        env[common.FAIL_AT_STEP] = str(fail_at_step)
    return run_in_own_group(cmd, RUN_TIMEOUT_S, env=env)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """An uninterrupted run; its only checkpoint is the one written at the last step."""
    out = tmp_path_factory.mktemp("tiny_gpt_reference")
    proc = run_tiny_gpt(out, "--ckpt-every", "12")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


# ---------------------------------------------------------------- resume exactly


@pytest.mark.slow
def test_tiny_gpt_interrupted_and_resumed_is_bitwise_the_uninterrupted_run(reference, tmp_path):
    ckpt = tmp_path / tiny_gpt.CKPT_NAME
    # The same command twice, as a supervisor restarting it would: it crashes once after
    # step 10 (checkpoints at 4 and 8), then resumes from step 8 and redoes 9 and 10.
    cmd = ["--ckpt-every", "4", "--resume"]
    first = run_tiny_gpt(tmp_path, *cmd, fail_at_step=10)
    assert first.returncode == 1, first.stderr[-3000:]
    assert f"no checkpoint at {ckpt}: starting fresh" in first.stdout
    assert "GNNATTN_FAIL_AT_STEP=10: exiting with status 1" in first.stderr
    assert torch.load(ckpt, weights_only=True)["step"] == 8
    second = run_tiny_gpt(tmp_path, *cmd, fail_at_step=10)
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"resumed from {ckpt} at step 8" in second.stdout

    # Every parameter, every optimizer and LR-schedule state, every random state and the
    # loss history: the final checkpoints of the two runs are bitwise equal.
    a = torch.load(reference / tiny_gpt.CKPT_NAME, weights_only=True)
    b = torch.load(ckpt, weights_only=True)
    assert a["step"] == b["step"] == 12
    assert len(a["model"]) > 10 and a["optimizer"]["state"]
    assert_identical(a, b)
    # So is what the run printed and saved, down to the sampled text (the sampler draws
    # from the restored generator); only the time differs.
    ra = json.loads((reference / "tiny_gpt.json").read_text())
    rb = json.loads((tmp_path / "tiny_gpt.json").read_text())
    ra.pop("train_seconds"), rb.pop("train_seconds")
    assert ra == rb
    assert not list(tmp_path.glob(".*.tmp")), "a temporary checkpoint file was left behind"


# ---------------------------------------------------------------- bad checkpoints


def _resume_in_process(out: Path, ckpt: Path, *extra: str) -> None:
    tiny_gpt.main([*TINY, "--out", str(out), "--resume", str(ckpt), *extra])


@pytest.mark.parametrize("keep", [0.5, 0.0, "garbage"])
def test_truncated_checkpoint_is_refused_naming_the_file(reference, tmp_path, keep):
    data = (reference / tiny_gpt.CKPT_NAME).read_bytes()
    bad = tmp_path / "bad_ckpt.pt"
    bad.write_bytes(b"not a zip file" if keep == "garbage" else data[: int(len(data) * keep)])
    with pytest.raises(ValueError, match="unreadable") as info:
        _resume_in_process(tmp_path, bad)
    assert f"Checkpoint {bad} is unreadable (truncated, or not a checkpoint)" in str(info.value)
    assert "weights_only" not in str(info.value)


def test_checkpoint_of_another_width_is_refused_saying_what_differs(reference, tmp_path):
    ckpt = reference / tiny_gpt.CKPT_NAME
    with pytest.raises(ValueError) as info:
        _resume_in_process(tmp_path, ckpt, "--embed-dim", "16")
    msg = str(info.value)
    assert f"Checkpoint {ckpt} does not match this run" in msg
    assert "embed_dim: 32 in the checkpoint, 16 in this run" in msg


def test_checkpoint_of_another_vocab_is_refused_saying_what_differs(reference, tmp_path):
    # A consistent checkpoint of a run on a text without the vocab's last character.
    state = torch.load(reference / tiny_gpt.CKPT_NAME, weights_only=True)
    vocab = state["config"]["vocab"]
    state["config"]["vocab"] = vocab[:-1]
    for key in ("tok.weight", "head.weight", "head.bias"):
        state["model"][key] = state["model"][key][:-1]
    other = tmp_path / "other_text.pt"
    torch.save(state, other)
    with pytest.raises(ValueError) as info:
        _resume_in_process(tmp_path, other)
    msg = str(info.value)
    assert f"Checkpoint {other} does not match this run" in msg
    assert (
        f"vocab: {len(vocab) - 1} characters in the checkpoint, {len(vocab)} in this run "
        f"(only in this run: {vocab[-1]!r})" in msg
    )


def test_checkpoint_whose_tensors_do_not_fit_is_refused_naming_them(reference, tmp_path):
    # The settings match but a tensor does not (an edited or foreign file): torch's
    # RuntimeError would not name the file.
    state = torch.load(reference / tiny_gpt.CKPT_NAME, weights_only=True)
    v = len(state["config"]["vocab"])
    state["model"]["head.weight"] = state["model"]["head.weight"][:, :-1]
    del state["model"]["head.bias"]
    odd = tmp_path / "odd.pt"
    torch.save(state, odd)
    with pytest.raises(ValueError) as info:
        _resume_in_process(tmp_path, odd)
    msg = str(info.value)
    assert f"Checkpoint {odd} does not fit this model" in msg
    assert f"head.weight: shape [{v}, 31] in the checkpoint, [{v}, 32] in this model" in msg
    assert "missing from the checkpoint: head.bias" in msg


def _edited(reference: Path, tmp_path: Path, edit) -> Path:
    """A copy of the reference checkpoint with ``edit(state)`` applied."""
    state = torch.load(reference / tiny_gpt.CKPT_NAME, weights_only=True)
    edit(state)
    path = tmp_path / "edited.pt"
    torch.save(state, path)
    return path


def _set(key, value):
    return lambda state: state.__setitem__(key, value)


@pytest.mark.parametrize(
    "field,edit",
    [
        ("config", _set("config", [1])),  # once a TypeError in check_config
        ("config", _set("config", {1: "a"})),
        ("step", _set("step", "12")),
        ("step", _set("step", -1)),
        ("step", _set("step", True)),
        ("model", _set("model", {"tok.weight": [1.0]})),
        ("model", _set("model", [torch.ones(2)])),
        ("optimizer", _set("optimizer", {"state": {}})),
        ("optimizer", _set("optimizer", [])),
        ("scheduler", _set("scheduler", 3)),
        ("rng", _set("rng", {"torch": 1, "cuda": [], "data": []})),
        ("rng", lambda s: s["rng"].__setitem__("data", [torch.zeros(3)])),  # not uint8
        ("steps", _set("steps", [1.5])),
        ("losses", _set("losses", ["x"])),
        ("val", _set("val", [(0,)])),
    ],
)
def test_a_checkpoint_with_a_bad_field_is_refused_naming_file_and_field(
    reference, tmp_path, field, edit
):
    path = _edited(reference, tmp_path, edit)
    with pytest.raises(ValueError) as info:
        _resume_in_process(tmp_path, path)
    assert str(info.value).startswith(f"Checkpoint {path}: field {field!r}: expected ")


@pytest.mark.parametrize("field", ["config", "step", "model", "optimizer", "scheduler", "rng"])
def test_a_checkpoint_missing_a_field_is_refused_naming_it(reference, tmp_path, field):
    path = _edited(reference, tmp_path, lambda state: state.pop(field))
    with pytest.raises(ValueError, match=f"Checkpoint {path} has no field {field!r}"):
        _resume_in_process(tmp_path, path)


def test_state_that_does_not_fit_the_optimizer_or_generator_names_the_field(reference, tmp_path):
    # The right kinds of values, but torch refuses them while loading.
    def two_groups(state):
        state["optimizer"]["param_groups"].append(dict(state["optimizer"]["param_groups"][0]))

    path = _edited(reference, tmp_path, two_groups)
    with pytest.raises(ValueError, match=f"Checkpoint {path}: field 'optimizer' does not fit"):
        _resume_in_process(tmp_path, path)
    path = _edited(
        reference,
        tmp_path,
        lambda s: s["rng"].__setitem__("torch", torch.zeros(3, dtype=torch.uint8)),
    )
    with pytest.raises(ValueError, match=f"Checkpoint {path}: field 'rng' does not fit"):
        _resume_in_process(tmp_path, path)


def test_ddp_checkpoint_fields_are_checked_too(tmp_path):
    import ddp_train

    rng = common.rng_state(torch.Generator())
    good = {"config": {}, "step": 0, "model": {}, "optimizer": {"state": {}, "param_groups": []}}
    good.update(rng=[rng, rng], loss_start=4.2)
    path = tmp_path / "ddp.pt"
    common.save_checkpoint(path, good)
    assert common.read_checkpoint(path, ddp_train.CKPT_FIELDS)["loss_start"] == 4.2
    for key, bad in (("rng", rng), ("rng", []), ("loss_start", "4.2")):
        common.save_checkpoint(path, {**good, key: bad})
        with pytest.raises(ValueError, match=f"Checkpoint {path}: field {key!r}: expected"):
            common.read_checkpoint(path, ddp_train.CKPT_FIELDS)


class NotData:
    """A class the weights-only unpickler refuses (it is not on its allow list)."""


@pytest.mark.parametrize("how", ["torch.save", "pickle"])
def test_a_checkpoint_of_objects_is_refused_without_suggesting_weights_only_false(tmp_path, how):
    import pickle

    path = tmp_path / "objects.pt"
    if how == "torch.save":
        torch.save({"format": common.FORMAT, "config": NotData()}, path)
    else:  # a bare pickle, no zip container
        path.write_bytes(pickle.dumps({"format": common.FORMAT, "config": NotData()}))
    with pytest.raises(ValueError) as info:
        common.read_checkpoint(path)
    err = info.value
    assert f"Checkpoint {path} is unreadable (truncated, or not a checkpoint)" in str(err)
    assert "it is not plain data" in str(err)
    # torch's own message advises weights_only=False: neither in ours nor chained to it.
    assert "weights_only" not in str(err)
    assert err.__cause__ is None and err.__suppress_context__


def test_a_plain_state_dict_is_not_taken_for_a_checkpoint(tmp_path):
    path = tmp_path / "weights.pt"
    torch.save(torch.nn.Linear(2, 2).state_dict(), path)
    with pytest.raises(ValueError, match=f"Checkpoint {path} is not a checkpoint of these"):
        common.read_checkpoint(path)
    assert common.read_checkpoint(tmp_path / "absent.pt") is None


def test_a_crash_mid_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.pt"
    # The fields every checkpoint must have (read_checkpoint checks them), and little else.
    minimal = {"config": {}, "optimizer": {"state": {}, "param_groups": []}}
    common.save_checkpoint(path, {**minimal, "step": 1, "model": {"w": torch.ones(3)}})
    real_save = torch.save

    def crash_half_way(obj, f):
        real_save(obj, f)
        f.truncate(10)  # half a file on disk, then the process "dies"
        raise OSError("disk full")

    monkeypatch.setattr(common.torch, "save", crash_half_way)
    with pytest.raises(OSError, match="disk full"):
        common.save_checkpoint(path, {**minimal, "step": 2, "model": {"w": torch.zeros(3)}})
    monkeypatch.undo()
    kept = common.read_checkpoint(path)
    assert kept is not None and kept["step"] == 1
    assert torch.equal(kept["model"]["w"], torch.ones(3))
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]  # no temporary file left


# ---------------------------------------------------------------- library level

BACKENDS = ("auto", "mp", "sdpa", "fused")


def _model(kind: str, backend: str, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    if kind == "conv":
        return SelfAttentionConv(16, 4, backend=backend)
    return GraphTransformer(2, 16, 4, causal=True, activation="gelu", backend=backend)


@pytest.mark.parametrize("kind", ["conv", "transformer"])
def test_state_dict_round_trips_across_backends(tmp_path, kind):
    # Two sequences of 9 tokens, a window of 2: a graph every backend runs.
    batch = torch.arange(2).repeat_interleave(9)
    graph = AttentionGraph.window(window=2, batch=batch)
    x = torch.randn(18, 16)
    for save_backend in BACKENDS:
        saved = _model(kind, save_backend, seed=1)
        path = tmp_path / f"{kind}_{save_backend}.pt"
        torch.save(saved.state_dict(), path)
        expected = saved(x, graph)
        for load_backend in BACKENDS:
            loaded = _model(kind, load_backend, seed=2)  # other weights until loaded
            state = torch.load(path, map_location="cpu", weights_only=True)
            loaded.load_state_dict(state)  # strict: the backend adds no keys
            assert_identical(loaded.state_dict(), saved.state_dict(), f"{save_backend}->")
            out = loaded(x, graph)
            if load_backend == save_backend:
                assert torch.equal(out, expected)
            else:  # another implementation of the same operator: float32 rounding only
                torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "src,dst",
    [
        ("cpu", "cpu"),
        pytest.param("cuda", "cpu", marks=[requires_cuda, pytest.mark.gpu]),
        pytest.param("cpu", "cuda", marks=[requires_cuda, pytest.mark.gpu]),
    ],
)
def test_state_dict_moves_between_devices_with_map_location(tmp_path, src, dst):
    model = _model("transformer", "auto", seed=1).to(src)
    torch.save(model.state_dict(), tmp_path / "model.pt")
    state = torch.load(tmp_path / "model.pt", map_location=dst, weights_only=True)
    assert {v.device.type for v in state.values()} == {dst}
    other = _model("transformer", "auto", seed=2).to(dst)
    other.load_state_dict(state)
    for k, v in model.state_dict().items():
        assert torch.equal(other.state_dict()[k].cpu(), v.cpu()), k
    x = torch.randn(2 * 7, 16)
    batch = torch.arange(2).repeat_interleave(7)
    a = model(x.to(src), batch=batch.to(src)).cpu()
    b = other(x.to(dst), batch=batch.to(dst)).cpu()
    if src == dst:
        assert torch.equal(a, b)
    else:
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


FRESH_PROCESS = """
import sys
import torch
# Nothing of gnnattn imported here: unpickling the models has to find it alone.
inputs = torch.load(sys.argv[1], weights_only=True)
for name, expected in inputs["expected"].items():
    model = torch.load(f"{sys.argv[2]}/{name}.pt", weights_only=False)
    args = (inputs["x"], inputs["edge_index"])
    if name == "transformer":
        args += (inputs["edge_attr"],)
    assert torch.equal(model(*args), expected), name
    print("OK", name, type(model).__name__, model.training)
"""


def test_pickled_models_load_in_a_fresh_process(tmp_path):
    torch.manual_seed(0)
    ei = sliding_window_graph(10, window=2)
    inputs = {"x": torch.randn(10, 16), "edge_index": ei, "edge_attr": torch.randn(ei.shape[1], 3)}
    models = {
        "conv": SelfAttentionConv(16, 4, backend="fused").eval(),
        "transformer": GraphTransformer(
            2, 16, 4, causal=True, activation="gelu", edge_dim=3, backend="mp"
        ),
    }
    inputs["expected"] = {
        "conv": models["conv"](inputs["x"], ei),
        "transformer": models["transformer"](inputs["x"], ei, inputs["edge_attr"]),
    }
    for name, model in models.items():
        torch.save(model, tmp_path / f"{name}.pt")
    torch.save(inputs, tmp_path / "inputs.pt")
    proc = run_in_own_group(
        [sys.executable, "-c", FRESH_PROCESS, str(tmp_path / "inputs.pt"), str(tmp_path)],
        timeout=180,
        cwd=tmp_path,  # not the checkout: gnnattn comes from the installed package
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "OK conv SelfAttentionConv False" in proc.stdout
    assert "OK transformer GraphTransformer True" in proc.stdout


def test_tiny_gpt_checkpoints_are_plain_data(reference):
    # weights_only=True reads them: loading a checkpoint never runs code from the file.
    state = common.read_checkpoint(reference / tiny_gpt.CKPT_NAME)
    assert state is not None and state["format"] == common.FORMAT
    assert {"config", "step", "model", "optimizer", "scheduler", "rng"} <= state.keys()
    assert state["rng"]["torch"].dtype == torch.uint8 and len(state["rng"]["data"]) == 1
