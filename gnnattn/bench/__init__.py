r"""The benchmark behind ``gnnattn bench``: gnnattn against the peers it has to keep up
with, *in one process, on the same inputs and the same weights*.

* :mod:`.harness`: cases, candidates, interleaved timing, peak memory;
* :mod:`.suites`: one module per suite and the registry ``--suite`` reads
  (``train``: a training step of a graph transformer with dropout and edge
  features, ``"auto"`` against ``"mp"``);
* :mod:`.report`: the machine header and the tables (measured ratios only).

The peers (``nn.MultiheadAttention``, SDPA, FlexAttention, PyG
``TransformerConv`` and ``utils.softmax``) come from :mod:`gnnattn.peers`,
shared with :mod:`gnnattn.compare`. The figures depend on the machine;
``--json`` stores them together with the CPU model, thread count, load
average and library versions, which is how a figure should be quoted.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .._progress import bar, write
from .harness import MODE_LABEL, BenchConfig, Candidate, Case, error_row, error_status, run_case
from .report import QUICK_NOTE, format_table, header, machine_info
from .suites import REGISTRY, SUITES, Suite, default_suites

__all__ = [
    "SUITES",
    "BenchConfig",
    "Candidate",
    "Case",
    "default_suites",
    "format_table",
    "machine_info",
    "main",
    "run",
]


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        # FlexAttention warns on every eager CPU use; the table notes it once.
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile")
        warnings.filterwarnings("ignore", message=".*is_causal.*")
        warnings.filterwarnings("ignore", message=".*Sparse CSR tensor support is in beta.*")
        warnings.filterwarnings("ignore", message=".*Sparse invariant checks.*")
        yield


def _set_threads(cfg: BenchConfig, device: torch.device) -> None:
    if device.type != "cpu":
        return
    torch.set_num_threads(cfg.threads)
    with contextlib.suppress(Exception):
        import numba

        limit = numba.config.NUMBA_NUM_THREADS  # type: ignore[attr-defined]
        numba.set_num_threads(min(cfg.threads, limit))


def _run_suite(
    suite: Suite,
    cfg: BenchConfig,
    device: torch.device,
    rows: list[dict[str, Any]],
    log: Callable[[str], None] | None,
) -> None:
    """One suite's rows, appended to ``rows`` as each case finishes (so that an error in a
    later case keeps the earlier ones)."""
    if suite.rows is not None:
        rows += suite.rows(cfg, log)
        return
    assert suite.cases is not None
    cases = suite.cases(cfg, device)
    steps = sum(len(case.modes) for case in cases)
    with bar(steps, f"[{suite.name}]", unit="case", leave=False) as within:
        while cases:
            case = cases.pop(0)
            # Free the previous case's cyclic garbage (autograd graphs hold big tensors).
            gc.collect()
            for mode in case.modes:
                if log is not None:
                    label = case.mode_label or MODE_LABEL[mode]
                    log(f"running [{case.suite}] {case.name} -- {label}")
                rows += run_case(case, mode, cfg)
                within.update()
            del case


def run(cfg: BenchConfig, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the selected suites and return ``{"machine", "config", "suites", "rows", "seconds"}``.

    A suite that raises (a missing optional package, a failing build of its
    inputs) is one row whose status says so, and the run goes on with the next:
    a run of many minutes keeps every row it made.

    Raises:
        ValueError: ``--device cuda`` with a suite that runs on the CPU only
            (``scale``, ``distributed``), or without a CUDA device.
    """
    device = torch.device(cfg.device)
    suites = [s for s in REGISTRY if s.name in cfg.suites]
    if device.type != "cpu":
        cpu_only = [s.name for s in suites if s.cpu_only]
        if cpu_only:
            names = " and ".join(cpu_only)
            raise ValueError(
                f"Expected --device cpu for the suite {names} (it measures processes of its own "
                f"on the CPU, whatever the device), got --device {cfg.device}; run {names} in a "
                f"run of its own without --device"
            )
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("Expected a CUDA device for --device cuda, but torch sees none")
    _set_threads(cfg, device)
    torch.manual_seed(cfg.seed)
    machine = machine_info(cfg.device)
    start = time.perf_counter()
    rows: list[dict[str, Any]] = []
    # Two bars on a terminal (none otherwise): the suites, and the cases of the
    # one running. A suite's cases are counted only once it has made them (its
    # tensors), so the time left of all is the suites' pace, a rough one.
    with _quiet(), bar(len(suites), "gnnattn bench", unit="suite") as overall:
        for suite in suites:
            overall.set_postfix_str(suite.name)
            try:
                _run_suite(suite, cfg, device, rows, log)
            except Exception as err:  # noqa: BLE001 - one suite must not cost the others' rows
                if log is not None:
                    log(f"[{suite.name}] stopped: {error_status(err)}")
                rows.append(error_row(suite.name, f"the {suite.name} suite", err))
            gc.collect()
            overall.update()
    with contextlib.suppress(OSError):
        machine["loadavg_end"] = list(os.getloadavg())
    config = {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(cfg).items()}
    return {
        "machine": machine,
        "config": config,
        "suites": [s for s in SUITES if s in cfg.suites],
        "rows": rows,
        "seconds": time.perf_counter() - start,
    }


def main(args: Any) -> int:
    """``gnnattn bench``: run, print the tables, optionally write JSON.

    Returns:
        0 when every row ran (or is "n/a", "skipped", "not run" by design), 1
        when a row stopped by an error: the tables and the JSON keep it, and a
        script that runs the bench (``--quick`` checks that every candidate runs)
        sees the failure in the exit status.

    Raises:
        ValueError: options that do not go together (``--suite scale``
            without ``--scale``, ``--scale`` with ``--quick``, ``--device cuda``
            with a CPU-only suite), ``--device cuda`` without a CUDA device, or a
            ``--json`` file that could not be written at the end.
    """
    scale = bool(getattr(args, "scale", False))
    if args.suite and "scale" in args.suite and not scale:
        raise ValueError(
            "the 'scale' suite runs only with --scale (N = 1M nodes: minutes and about 6 GB); "
            "add --scale"
        )
    if scale and args.quick:
        raise ValueError("--scale is not a --quick run; drop one of them")
    # --scale adds the scale suite: to the defaults, or to the suites named.
    if args.suite:
        wanted = {*args.suite, *(["scale"] if scale else [])}
    else:
        wanted = set(default_suites(scale=scale))
    suites = tuple(s for s in SUITES if s in wanted)
    cfg = BenchConfig(
        device=args.device,
        quick=args.quick,
        threads=args.threads,
        suites=suites,
        memory=not args.no_memory,
        reps=args.reps,
    )
    if args.quick:
        cfg.min_reps, cfg.max_reps, cfg.budget_s = 2, 3, 1.0

    def log(msg: str) -> None:
        # Above the progress bars when they are up; the same line as print's when not.
        write(msg, file=sys.stderr)
        sys.stderr.flush()

    result = run(cfg, log)
    print(header(result))
    print(format_table(result["rows"]))
    print(f"\n{result['seconds']:.0f} s in all")
    if cfg.quick:
        print(QUICK_NOTE)
    if args.json:
        try:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1, default=str)
        except OSError as err:  # checked before the run, but the disk may fill or the folder go
            raise ValueError(f"--json: could not write {args.json!r}: {err}") from err
    failed = [r for r in result["rows"] if str(r["status"]).startswith("error")]
    if failed:
        first = failed[0]
        print(
            f"gnnattn bench: {len(failed)} row(s) stopped by an error, the first "
            f"{first['suite']}: {first['case']} ({first['candidate']}): {first['status']}",
            file=sys.stderr,
        )
        return 1
    return 0
