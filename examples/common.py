"""What the training examples share: their command line, the settings of a run, checkpoints
(written atomically, resumed exactly, refused when they differ) and a test hook.

``tiny_gpt.py``, ``ddp_train.py`` and ``distributed_graph.py`` import it (a script's own
directory is on ``sys.path``, so ``import common`` finds this file); it is not a script.

A checkpoint is one file (``torch.save`` of a dict of tensors, numbers and
strings, so ``torch.load(..., weights_only=True)`` reads it) holding everything
the rest of a run depends on: the model, the optimizer (and LR schedule), the
step, and the random states of torch and of every data generator. Resuming
from it, the remaining steps draw the same batches and the same dropout masks
as the run that wrote it, so the final parameters are bitwise those of an
uninterrupted run.

Test hook: with ``GNNATTN_FAIL_AT_STEP=N`` in the environment, a training run
exits with status 1 after step N, once (see :func:`fail_once`). The tests use
it to simulate a crash; it is not an option for users.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import pickle
import sys
import tempfile
import warnings
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

# Bumped when the layout of the dict changes, so an old file is refused by name
# instead of failing on a missing key.
FORMAT = 1

#: The environment variable of the crash test hook (a step number).
FAIL_AT_STEP = "GNNATTN_FAIL_AT_STEP"

# ---------------------------------------------------------------- command line


def training_parser(
    description: str, *, ckpt_name: str, batch_size: int, sequences: bool = True
) -> argparse.ArgumentParser:
    """The options every training example takes; a script adds its own after these.

    Options left at ``None`` get the script's defaults in :func:`parse_training_args`.
    ``sequences=False`` (a script that trains on one graph) leaves out ``--block`` and
    ``--batch-size``, which it would ignore.
    """
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="a small run, under a minute")
    p.add_argument("--steps", type=int, default=None, help="training steps")
    if sequences:
        p.add_argument("--block", type=int, default=None, help="context length T")
        p.add_argument("--batch-size", type=int, default=batch_size, help="sequences per step")
    else:
        p.set_defaults(block=None, batch_size=batch_size)
    p.add_argument("--embed-dim", type=int, default=None)
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("gnnattn-demo-out"))
    p.add_argument(
        "--ckpt-every",
        type=int,
        default=100,
        help=f"write --out/{ckpt_name} every this many steps and at the end (0: never)",
    )
    p.add_argument(
        "--resume",
        type=Path,
        nargs="?",
        const=Path(""),
        default=None,
        help=f"continue from a checkpoint (default: --out/{ckpt_name}); none there: start fresh",
    )
    return p


def parse_training_args(
    p: argparse.ArgumentParser,
    argv: list[str] | None,
    *,
    ckpt_name: str,
    quick: dict[str, Any],
    full: dict[str, Any],
) -> argparse.Namespace:
    """Parse ``argv``; every option still ``None`` takes its value from ``quick`` (with
    --quick) or ``full``, and a bare ``--resume`` means ``--out/ckpt_name``."""
    args = p.parse_args(argv)
    if args.ckpt_every < 0:
        p.error(f"--ckpt-every: expected a number of steps >= 0, got {args.ckpt_every}")
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    # Sizes: a zero or negative one would fail deep in torch (or train nothing).
    sizes = ("steps", "embed_dim", "layers", "heads")
    for key in sizes + (("block", "batch_size") if args.block is not None else ()):
        value = getattr(args, key)
        if value < 1:
            p.error(f"--{key.replace('_', '-')}: expected a positive number, got {value}")
    if args.resume == Path(""):
        args.resume = args.out / ckpt_name
    return args


def run_config(args: argparse.Namespace, vocab: list[str], **extra: Any) -> dict[str, Any]:
    """Everything that shapes a run: a checkpoint of another run is refused (``check_config``)."""
    return {
        "vocab": "".join(vocab),
        "block": args.block,
        "embed_dim": args.embed_dim,
        "layers": args.layers,
        "heads": args.heads,
        "lr": args.lr,
        "batch_size": args.batch_size,
        "seed": args.seed,
        **extra,
    }


# ---------------------------------------------------------------- checkpoints


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


# ---- what a checkpoint's fields must hold: (test, what the message says was expected)

Field = tuple[Callable[[Any], bool], str]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_tensor_dict(v: Any) -> bool:
    return isinstance(v, dict) and all(
        isinstance(k, str) and isinstance(t, torch.Tensor) for k, t in v.items()
    )


def _is_rng(v: Any) -> bool:
    """What :func:`rng_state` writes."""
    return (
        isinstance(v, dict)
        and isinstance(v.get("torch"), torch.Tensor)
        and v["torch"].dtype == torch.uint8
        and isinstance(v.get("cuda"), list)
        and all(isinstance(t, torch.Tensor) for t in v["cuda"])
        and isinstance(v.get("data"), list)
        and all(isinstance(t, torch.Tensor) and t.dtype == torch.uint8 for t in v["data"])
    )


#: The fields of every checkpoint; a script adds its own (``read_checkpoint(fields=...)``).
COMMON_FIELDS: Mapping[str, Field] = {
    "config": (
        lambda v: isinstance(v, dict) and all(isinstance(k, str) for k in v),
        "a dict of settings keyed by name",
    ),
    "step": (lambda v: _is_int(v) and v >= 0, "an int >= 0"),
    "model": (_is_tensor_dict, "a state dict (names to tensors)"),
    "optimizer": (
        lambda v: (
            isinstance(v, dict)
            and isinstance(v.get("state"), dict)
            and isinstance(v.get("param_groups"), list)
            and all(isinstance(g, dict) for g in v["param_groups"])
        ),
        "an optimizer state dict (with 'state' and a list of 'param_groups')",
    ),
}

#: Field checks the scripts share.
RNG_FIELD: Field = (_is_rng, "random states {'torch': uint8 tensor, 'cuda': [...], 'data': [...]}")
RNG_PER_RANK_FIELD: Field = (
    lambda v: isinstance(v, list) and len(v) > 0 and all(_is_rng(r) for r in v),
    "a list of random states, one per rank",
)
NUMBER_FIELD: Field = (_is_number, "a number")


def _got(v: Any) -> str:
    """A short description of a bad value: its type and the start of its repr."""
    text = repr(v)
    return f"{type(v).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def read_checkpoint(path: Path, fields: Mapping[str, Field] | None = None) -> dict[str, Any] | None:
    """The checkpoint at ``path``, or ``None`` when there is no such file.

    Loaded with ``weights_only=True`` (a checkpoint is data, never code to run),
    then checked field by field: :data:`COMMON_FIELDS` and the script's
    ``fields``, so that a file of the right format but wrong contents is refused
    here, by name, and not by a ``TypeError`` deep in the resumed run.

    Raises:
        ValueError: the file exists but is not a readable checkpoint of this
            format (truncated, another kind of file, an older layout, objects
            that are not plain data, a field missing or of the wrong kind); the
            message names the file and, for a bad field, the field.
    """
    path = Path(path)
    if not path.exists():
        return None
    try:
        with warnings.catch_warnings():
            # Its "pickle protocol" notice says nothing the error below does not.
            warnings.simplefilter("ignore", UserWarning)
            ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        # torch's message here advises loading again with weights_only=False, which
        # would run whatever code the file holds: never passed on, nor chained.
        # (Garbage bytes land here too: the legacy format is tried as a pickle.)
        raise ValueError(
            f"Checkpoint {path} is unreadable (truncated, or not a checkpoint): it is not "
            f"plain data (tensors, numbers, strings and containers of them), and a checkpoint "
            f"is never loaded as code. Delete it to start a new run, or pass another file to "
            f"--resume"
        ) from None
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
    for name, (ok, expected) in {**COMMON_FIELDS, **(fields or {})}.items():
        if name not in ckpt:
            raise ValueError(f"Checkpoint {path} has no field {name!r} (expected {expected})")
        if not ok(ckpt[name]):
            raise ValueError(
                f"Checkpoint {path}: field {name!r}: expected {expected}, got {_got(ckpt[name])}"
            )
    return ckpt


def load_field(path: Path, name: str, load: Callable[[], Any]) -> None:
    """Run ``load()`` (an optimizer's, a scheduler's ``load_state_dict`` or the like),
    turning torch's errors about the field's contents into a ``ValueError`` that
    names ``path`` and the field ``name``."""
    try:
        load()
    except (KeyError, IndexError, TypeError, ValueError, RuntimeError) as e:
        first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ValueError(
            f"Checkpoint {path}: field {name!r} does not fit this run: "
            f"{type(e).__name__}: {first_line}"
        ) from e


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


# ---------------------------------------------------------------- torchrun


def init_distributed(backend: str, timeout: timedelta, name: str) -> None:
    """``dist.init_process_group`` that also works after torchrun restarted the group.

    By default torchrun's agent hosts the store the ranks meet in, and keeps it across
    restarts (``TORCHELASTIC_USE_AGENT_STORE=True``). The keys through which the ranks
    of the first attempt exchanged their addresses are still there when the group
    restarts, so a restarted rank may read a dead peer's address and fail to connect
    (pytorch/pytorch#135712; here 3 restarts in 4 failed). Each attempt therefore meets
    under a prefix of its own (``name``, the script's, and
    ``TORCHELASTIC_RESTART_COUNT``, the same for all ranks of one torchrun agent; on
    several machines it may differ between agents, hence docs/distributed.md's
    ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, which gives each attempt a new store and
    takes the plain path below).
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        dist.init_process_group(backend, timeout=timeout)
        return
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout
    )
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    dist.init_process_group(
        backend,
        store=dist.PrefixStore(f"{name}/attempt_{attempt}", store),
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        timeout=timeout,
    )


def resume_on_every_rank(
    path: Path | None, fields: Mapping[str, Field], config: dict, model: torch.nn.Module
) -> dict | None:
    """The checkpoint to continue from on every rank (its weights loaded into ``model``),
    or None (no --resume, or no file).

    Rank 0 reads the file and broadcasts what it found (the checkpoint, nothing, or the
    error), so only rank 0 needs to see it and every rank decides alike: a bad file
    raises the same ValueError everywhere instead of leaving the others waiting (each
    rank then leaves the group cleanly).
    """
    if path is None:
        return None
    rank = dist.get_rank()
    found: list = [None]
    if rank == 0:
        try:
            found[0] = read_checkpoint(path, fields)
        except ValueError as e:
            found[0] = str(e)
        if found[0] is None:
            print(f"no checkpoint at {path}: starting fresh", flush=True)
    dist.broadcast_object_list(found, src=0)
    ckpt = found[0]
    try:
        if isinstance(ckpt, str):
            raise ValueError(ckpt)
        if ckpt is not None:
            check_config(ckpt, config, path)
            load_model_state(model, ckpt["model"], path)
    except ValueError:
        dist.destroy_process_group()
        raise
    if ckpt is not None and rank == 0:
        print(f"resumed from {path} at step {ckpt['step']}", flush=True)
    return ckpt


def param_digest(model: torch.nn.Module) -> str:
    """A short hash of every parameter and buffer, bit for bit (equal replicas, equal runs)."""
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


# ---------------------------------------------------------------- test hook


def fail_once(out: Path, step: int) -> None:
    """Test hook: end this process with status 1 after step ``$GNNATTN_FAIL_AT_STEP``, once.

    A file in ``out`` records that the fault happened, so the same command run
    again (by hand, or by torchrun after a restart) goes past the step. The
    process ends with ``os._exit``, as a crash would: no ``finally`` blocks, no
    interpreter teardown (which, with a live DDP wrapper, may itself hang; see
    ``ddp_train.py``).
    """
    value = os.environ.get(FAIL_AT_STEP)
    if not value or int(value) != step:
        return
    marker = Path(out) / f"failed_at_step_{step}"
    if marker.exists():
        return
    marker.write_text(f"{FAIL_AT_STEP}={step}: this process exited here once\n")
    print(
        f"{FAIL_AT_STEP}={step}: exiting with status 1 after step {step} (a simulated crash; "
        f"{marker} keeps it from happening again)",
        file=sys.stderr,
        flush=True,
    )
    sys.stdout.flush()
    os._exit(1)
