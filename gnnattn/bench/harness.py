"""How ``gnnattn bench`` measures: cases, candidates, interleaved timing, peak memory.

* **Interleaved repetitions.** Each repetition runs every candidate of a case
  once, round-robin (the starting candidate rotates), so a noisy neighbour or
  a frequency change hits all candidates alike; the report shows medians and
  the ratio of each median to the case's named baseline. One untimed warm-up
  call per candidate comes first (numba compiles, caches fill).
* **Forward** runs under ``torch.no_grad()`` (inference; MHA takes its fast
  path there). **Forward+backward** times the forward and ``backward`` of a
  fixed upstream gradient with respect to the input and all weights. A
  **training step** (the ``train`` suite) is whatever the candidate does with
  autograd on: forward, loss, backward and its optimizer's step.
* **Correctness.** Every row reports the max abs difference of its output
  (forward) or of the gradient of the input (forward+backward) against the
  baseline's, so a fast but wrong path shows (cases that time different
  operators side by side, such as the per-pass ``limit`` suite, say so and
  leave it out).
* **Clocks.** On CUDA a call is timed between two CUDA events recorded on
  the current stream around it (the device's clock; the host waits for the
  second event only to read it); on the CPU by ``time.perf_counter``.
* **Peak memory.** On CUDA, ``torch.cuda.max_memory_allocated`` over one call,
  minus what was allocated before it. On the CPU, one extra call under
  ``torch.profiler.profile(profile_memory=True)``: the allocator's
  allocation/free events are replayed in time order and the peak of the
  running sum is reported. Both count the bytes of torch tensors allocated
  during the call above what was live before it; memory that a kernel
  allocates outside torch's allocator (numba scratch arrays, MKL workspaces)
  is *not* seen. The ``scale`` suite measures the process's resident set
  instead. The profiler's C++ side (kineto) writes ``USDT: ... profiler_start``
  / ``profiler_stop`` lines straight to file descriptor 2 on every use, which
  no setting turns off; :func:`_without_profiler_chatter` keeps them out of
  the user's terminal and passes every other line on.
* **Work.** A candidate that knows how many bytes it must move (the ``limit``
  suite's passes) reports the achieved GB/s.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar

import torch
from torch import Tensor

__all__ = [
    "MODES",
    "MODE_LABEL",
    "BenchConfig",
    "Candidate",
    "Case",
    "error_row",
    "error_status",
    "add_note",
    "max_abs_diff",
    "row",
    "run_case",
    "timed",
]

#: What a case times by default: the forward alone and the forward with its backward.
MODES = ("fwd", "fwdbwd")
MODE_LABEL = MappingProxyType(
    {
        "fwd": "forward",
        "fwdbwd": "forward+backward",
        "step": "whole step as named (forward, backward; a train step also the optimizer)",
    }
)


@dataclass
class BenchConfig:
    """What to run and how.

    Attributes:
        device: ``"cpu"`` or ``"cuda"``.
        quick: tiny sizes for a smoke run.
        threads: ``torch.set_num_threads`` (and numba's) on the CPU.
        suites: which suites to run (names from :data:`gnnattn.bench.SUITES`).
        min_reps / max_reps: bounds on the interleaved repetitions.
        reps: a fixed number of repetitions (``--reps``) instead of the bounds and
            the budget; also the timed calls of the suites that time their own
            (``scale``, ``distributed``). ``None``: each suite's own.
        budget_s: target seconds of timed repetitions per case and mode; the
            number of repetitions is ``budget_s / (one round)``, clamped.
        max_call_s: a candidate whose warm-up call takes longer gets one
            timed repetition (in the first round), not ``reps``.
        max_edge_floats: skip candidates that would hold more than this many
            ``|E| x D`` floats in one tensor.
        memory: measure peak memory (one extra call per candidate).
        seed: for inputs and weights.
    """

    device: str = "cpu"
    quick: bool = False
    threads: int = 2
    suites: tuple[str, ...] = ()
    min_reps: int = 3
    max_reps: int = 15
    reps: int | None = None
    budget_s: float = 20.0
    max_call_s: float = 10.0
    max_edge_floats: int = 1 << 29
    memory: bool = True
    seed: int = 0


@dataclass
class Candidate:
    """One implementation in a case: ``fn(x) -> output``.

    ``bytes`` is the memory traffic one call must make at least (for the
    GB/s column), when the case knows it.
    """

    name: str
    fn: Callable[[Tensor], Tensor] | None = None
    skip: str | None = None
    note: str = ""
    bytes: int | None = None


@dataclass
class Case:
    """One input size of a suite, with its candidates and the baseline they are compared to.

    ``x`` is the tensor the gradient is taken with respect to (a leaf with
    ``requires_grad``); ``grad`` the upstream gradient used in backward;
    ``params`` every weight whose ``.grad`` must be cleared between calls.
    ``compare=False`` for cases whose candidates compute different things
    (no max|diff| column); ``mode_label`` names what a ``"fwd"`` call is
    when it is not a forward pass.
    """

    suite: str
    name: str
    x: Tensor
    grad: Tensor
    baseline: str
    candidates: list[Candidate]
    params: list[Tensor] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    modes: tuple[str, ...] = MODES
    compare: bool = True
    memory: bool = True
    mode_label: str | None = None


T = TypeVar("T")


def timed(fn: Callable[[], T], device: torch.device) -> tuple[float, T]:
    """Seconds one call of ``fn`` takes on ``device``, and what it returned.

    On CUDA, the time between two CUDA events recorded on the current stream
    before and after the call (work queued before it is not counted; the host
    waits for the second event before reading it); elsewhere
    ``time.perf_counter`` around the call.
    """
    if device.type != "cuda":
        t0 = time.perf_counter()
        out = fn()
        return time.perf_counter() - t0, out
    with torch.cuda.device(device):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3, out


def _call(case: Case, cand: Candidate, mode: str) -> Tensor:
    """One call: the output (forward), the input's gradient (forward+backward), or
    whatever a training step returns (``"step"``: the candidate runs its own
    backward and optimizer step, with autograd on)."""
    assert cand.fn is not None
    if mode == "fwd":
        with torch.no_grad():
            return cand.fn(case.x)
    if mode == "step":
        with torch.enable_grad():
            return cand.fn(case.x)
    for p in (case.x, *case.params):
        p.grad = None
    out = cand.fn(case.x)
    out.backward(case.grad)
    assert case.x.grad is not None
    return case.x.grad


def _timed(case: Case, cand: Candidate, mode: str) -> tuple[float, Tensor]:
    return timed(lambda: _call(case, cand, mode), case.x.device)


def _peak_bytes(case: Case, cand: Candidate, mode: str) -> int:
    """Peak bytes of torch tensors allocated during one call, above what was live before."""
    device = case.x.device
    for p in (case.x, *case.params):
        p.grad = None
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        out = _call(case, cand, mode)
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - base
        del out
        return int(peak)
    from torch.profiler import ProfilerActivity, profile

    with (
        _without_profiler_chatter(),
        profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof,
    ):
        out = _call(case, cand, mode)
    del out
    events = prof.profiler.kineto_results.events()  # type: ignore[union-attr]
    # "[memory]" events carry +bytes for an allocation and -bytes for a free.
    timeline = sorted(
        (ev.start_ns(), ev.nbytes())
        for ev in events
        if ev.name() == "[memory]" and ev.device_type() == torch.autograd.DeviceType.CPU
    )
    cur = peak = 0
    for _, nbytes in timeline:
        cur += nbytes
        peak = max(peak, cur)
    return peak


# Kineto's status lines, e.g. "USDT:2026-01-01 12:00:00 1:1 SyncActivityProfilerHandler.cpp:52]
# profiler_start" (and "STAGE:" at other log levels).
_CHATTER = re.compile(r"^(USDT|STAGE):\S+ \S+ \d+:\d+ \S+\.cpp:\d+\] ")


@contextlib.contextmanager
def _without_profiler_chatter() -> Iterator[None]:
    """File descriptor 2 goes to a temporary file while the block runs; afterwards
    every line but kineto's status lines is written to ``sys.stderr``.

    The lines come from C++ (no Python logger, no environment variable silences
    them), so only a redirection of the descriptor itself can catch them.
    """
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no descriptor 2 to redirect: nothing to filter
        yield
        return
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            text = tmp.read().decode("utf-8", errors="replace")
            kept = [ln for ln in text.splitlines(keepends=True) if not _CHATTER.match(ln)]
            if kept:
                sys.stderr.write("".join(kept))


def max_abs_diff(a: Tensor, b: Tensor) -> float:
    """``max |a - b|`` in float64 (``inf`` when the shapes differ)."""
    if a.shape != b.shape:
        return math.inf
    if a.numel() == 0:
        return 0.0
    return float((a.detach().double() - b.detach().double()).abs().max())


def row(
    suite: str, case: str, mode: str, candidate: str, baseline: str, **kw: Any
) -> dict[str, Any]:
    """One result row, with every field the report and the JSON file know."""
    r: dict[str, Any] = {
        "suite": suite,
        "case": case,
        "mode": mode,
        "mode_label": MODE_LABEL.get(mode, mode),
        "candidate": candidate,
        "baseline": baseline,
        "status": "ok",
        "median_ms": None,
        "times_ms": [],
        "reps": 0,
        "ratio": None,
        "peak_bytes": None,
        "mem_ratio": None,
        "max_abs_diff": None,
        "bytes": None,
        "gbps": None,
        "note": "",
    }
    r.update(kw)
    return r


def _first_line(err: BaseException) -> str:
    return (str(err).splitlines() or [""])[0][:120]


def error_status(err: BaseException) -> str:
    """A row's status for an exception: ``"error: Type: first line of the message"``."""
    return f"error: {type(err).__name__}: {_first_line(err)}"


def error_row(suite: str, what: str, err: BaseException) -> dict[str, Any]:
    """The row that stands for a suite, or a part of one, that raised ``err``: the run
    goes on and the table says what stopped it (its rows, if any, were not made)."""
    return row(
        suite, what, "error", what, what, status=error_status(err), mode_label="stopped by an error"
    )


def add_note(r: dict[str, Any], text: str) -> None:
    """Append ``text`` to a row's note (``"; "`` between notes)."""
    r["note"] = (r["note"] + "; " if r["note"] else "") + text


def run_case(case: Case, mode: str, cfg: BenchConfig) -> list[dict[str, Any]]:
    """Every candidate of ``case`` in ``mode``: warm-up, interleaved repetitions, memory."""
    label = case.mode_label or MODE_LABEL[mode]
    rows = {
        c.name: row(
            case.suite,
            case.name,
            mode,
            c.name,
            case.baseline,
            note=c.note,
            bytes=c.bytes,
            mode_label=label,
        )
        for c in case.candidates
    }
    active: list[Candidate] = []
    reference: Tensor | None = None
    reference_name = case.baseline
    estimate: dict[str, float] = {}
    # The baseline runs first so its output is there to compare the others to.
    order = sorted(case.candidates, key=lambda c: c.name != case.baseline)
    for cand in order:
        r = rows[cand.name]
        if cand.skip is not None:
            r["status"] = cand.skip
            continue
        try:
            seconds, out = _timed(case, cand, mode)
        except NotImplementedError as err:
            # For example FlexAttention has no backward on the CPU.
            r["status"] = f"n/a: {_first_line(err)}"
            continue
        except Exception as err:  # noqa: BLE001 - a failing candidate must not stop the bench
            r["status"] = error_status(err)
            continue
        if case.compare:
            if reference is None:
                reference, reference_name = out.detach().clone(), cand.name
            r["max_abs_diff"] = max_abs_diff(out, reference)
            if reference_name != case.baseline:
                add_note(r, f"diff vs {reference_name}")
        del out
        estimate[cand.name] = seconds
        active.append(cand)
        if seconds > cfg.max_call_s:
            add_note(r, "1 rep (slow)")
    del reference
    slow = {c.name for c in active if estimate[c.name] > cfg.max_call_s}
    round_s = sum(estimate[c.name] for c in active if c.name not in slow)
    reps = cfg.min_reps
    if cfg.reps is not None:
        reps = cfg.reps
    elif round_s > 0:
        reps = int(min(cfg.max_reps, max(cfg.min_reps, cfg.budget_s // round_s)))
    limit = {c.name: 1 if c.name in slow else reps for c in active}
    for rep in range(reps if active else 0):
        shift = rep % len(active)
        for cand in active[shift:] + active[:shift]:
            r = rows[cand.name]
            if r["status"] != "ok" or r["reps"] >= limit[cand.name]:
                continue
            try:
                seconds, out = _timed(case, cand, mode)
            except Exception as err:  # noqa: BLE001 - as in the warm-up: the others go on
                # A later call failed (memory, a recompile limit): no median of the
                # calls before it, which would pass for the candidate's time.
                r["status"], r["times_ms"], r["reps"] = error_status(err), [], 0
                continue
            del out
            rows[cand.name]["times_ms"].append(seconds * 1e3)
            rows[cand.name]["reps"] += 1
    if cfg.memory and case.memory:
        # After the timing, so that the profiler's own work cannot disturb it.
        for cand in order:
            r = rows[cand.name]
            if cand.name in estimate and r["status"] == "ok":
                try:
                    r["peak_bytes"] = _peak_bytes(case, cand, mode)
                except Exception as err:  # noqa: BLE001 - its times stand; the others go on
                    add_note(r, f"peak memory {error_status(err)}")
    for p in (case.x, *case.params):
        p.grad = None
    for r in rows.values():
        if r["times_ms"]:
            r["median_ms"] = statistics.median(r["times_ms"])
            if r["bytes"]:
                r["gbps"] = r["bytes"] / (r["median_ms"] * 1e-3) / 1e9
    base = rows[case.baseline]
    for r in rows.values():
        if r["median_ms"] is not None and base["median_ms"]:
            r["ratio"] = r["median_ms"] / base["median_ms"]
        if r["peak_bytes"] is not None and base["peak_bytes"]:
            r["mem_ratio"] = r["peak_bytes"] / base["peak_bytes"]
    return [rows[c.name] for c in case.candidates]
