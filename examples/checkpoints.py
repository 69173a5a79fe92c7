"""Checkpoints for the examples: written atomically, resumed exactly, refused when they differ.

A checkpoint is one file (``torch.save`` of a dict of tensors, numbers and
strings, so ``torch.load(..., weights_only=True)`` reads it) holding everything
the rest of a run depends on: the model, the optimizer (and LR schedule), the
step, and the random states of torch and of every data generator. Resuming
from it, the remaining steps draw the same batches and the same dropout masks
as the run that wrote it, so the final parameters are bitwise those of an
uninterrupted run.

``tiny_gpt.py`` and ``ddp_train.py`` use it; it is not a script.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

# Bumped when the layout of the dict changes, so an old file is refused by name
# instead of failing on a missing key.
FORMAT = 1


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Write ``state`` to ``path`` atomically.

    The bytes go to a temporary file in the same directory, are flushed to disk,
    and the file is renamed over ``path`` (``os.replace`` is atomic within one
    file system): a crash mid-write leaves the previous checkpoint intact,
    never a truncated one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save({"format": FORMAT, **state}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    # The rename lives in the directory: sync it too, so after a power loss the
    # name points at the new file (POSIX; not possible on Windows).
    with contextlib.suppress(OSError):
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def read_checkpoint(path: Path) -> dict[str, Any] | None:
    """The checkpoint at ``path``, or ``None`` when there is no such file.

    Raises:
        ValueError: the file exists but is not a readable checkpoint of this
            format (truncated, another kind of file, an older layout); the
            message names the file.
    """
    path = Path(path)
    if not path.exists():
        return None
    try:
        # weights_only: a checkpoint is data, never code to run.
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        first_line = (str(e).strip().splitlines() or [""])[0]  # torch's can run to pages
        raise ValueError(
            f"Checkpoint {path} is unreadable (truncated, or not a checkpoint): "
            f"{type(e).__name__}: {first_line}. Delete it to start a new run, or pass "
            f"another file to --resume"
        ) from e
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        got = ckpt.get("format") if isinstance(ckpt, dict) else type(ckpt).__name__
        raise ValueError(
            f"Checkpoint {path} is not a checkpoint of these examples: expected a dict with "
            f"format={FORMAT}, got {got!r}"
        )
    return ckpt


def _describe(key: str, saved: Any, current: Any) -> str:
    if key == "vocab" and isinstance(saved, str) and isinstance(current, str):
        only_saved = "".join(sorted(set(saved) - set(current)))
        only_here = "".join(sorted(set(current) - set(saved)))
        detail = []
        if only_saved:
            detail.append(f"only in the checkpoint: {only_saved!r}")
        if only_here:
            detail.append(f"only in this run: {only_here!r}")
        if not detail:
            detail.append("same characters, other order")
        return (
            f"vocab: {len(saved)} characters in the checkpoint, {len(current)} in this run "
            f"({'; '.join(detail)})"
        )
    return f"{key}: {saved!r} in the checkpoint, {current!r} in this run"


def check_config(ckpt: dict[str, Any], config: dict[str, Any], path: Path) -> None:
    """Raise a ``ValueError`` naming ``path`` and every setting in which the
    checkpoint's run differs from this one (model width, vocab, ...).

    A checkpoint continues the run that wrote it: with another width its
    tensors do not fit, and with another vocab, batch size or LR the rest
    of the run would not be the one it was.
    """
    saved = ckpt.get("config", {})
    diffs = [
        _describe(key, saved.get(key, "<absent>"), config.get(key, "<absent>"))
        for key in sorted(set(saved) | set(config))
        if saved.get(key, "<absent>") != config.get(key, "<absent>")
    ]
    if diffs:
        raise ValueError(
            f"Checkpoint {path} does not match this run: {'; '.join(diffs)}. Resume with the "
            f"settings it was saved with, or start a new run (without --resume, or another --out)"
        )


def load_model_state(model: torch.nn.Module, state: dict[str, Any], path: Path) -> None:
    """``model.load_state_dict(state)``, with a ``ValueError`` naming ``path`` and the
    differing tensors (missing, unexpected, other shapes) instead of torch's
    ``RuntimeError``."""
    own = model.state_dict()
    problems = [
        f"{k}: shape {list(state[k].shape)} in the checkpoint, {list(v.shape)} in this model"
        for k, v in own.items()
        if k in state and state[k].shape != v.shape
    ]
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    if missing:
        problems.append(f"missing from the checkpoint: {', '.join(missing[:5])}")
    if unexpected:
        problems.append(f"not in this model: {', '.join(unexpected[:5])}")
    if problems:
        raise ValueError(f"Checkpoint {path} does not fit this model: {'; '.join(problems[:5])}")
    model.load_state_dict(state)


def rng_state(*generators: torch.Generator) -> dict[str, Any]:
    """The random states a step depends on: torch's global CPU (and CUDA) generators,
    which draw dropout masks, and each data generator, which draws the batches."""
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "data": [g.get_state() for g in generators],
    }


def set_rng_state(state: dict[str, Any], *generators: torch.Generator) -> None:
    """Restore what :func:`rng_state` saved (the same generators, in the same order)."""
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if len(state["data"]) != len(generators):
        raise ValueError(
            f"Expected {len(generators)} data generator states in the checkpoint, "
            f"got {len(state['data'])}"
        )
    for g, s in zip(generators, state["data"], strict=True):
        g.set_state(s)


def fail_once(out: Path, step: int, fail_at: int | None) -> None:
    """``--fail-at-step``: end this process with status 1 after step ``fail_at``, once.

    A file in ``out`` records that the fault happened, so the same command run
    again (by hand, or by torchrun after a restart) goes past the step. The
    process ends with ``os._exit``, as a crash would: no ``finally`` blocks, no
    interpreter teardown (which, with a live DDP wrapper, may itself hang; see
    ``ddp_train.py``).
    """
    if fail_at is None or step != fail_at:
        return
    marker = Path(out) / f"failed_at_step_{step}"
    if marker.exists():
        return
    marker.write_text(f"--fail-at-step {step}: this process exited here once\n")
    print(
        f"--fail-at-step {step}: exiting with status 1 after step {step} (a simulated crash; "
        f"{marker} keeps it from happening again)",
        file=sys.stderr,
        flush=True,
    )
    sys.stdout.flush()
    os._exit(1)
