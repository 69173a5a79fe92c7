"""The ``distributed`` suite: one graph across P processes (:mod:`gnnattn.distributed`).

* **halo**: a kNN graph of random 3-D points (ids in random order), split
  over P = 4 ranks by METIS, contiguous blocks and at random (the baseline):
  the halo rows (sources a rank reads but another owns, summed over the
  ranks) as a fraction of the owned rows, and the time :func:`partition`
  took, in this process.
* **layer**: one ``SelfAttentionConv`` (embed 64, 4 heads, float32) forward +
  backward on a kNN graph of ``k`` = 32 (32 in-edges per node), ids sorted by
  the first coordinate (a local order, as :func:`gnnattn.reorder` would give)
  and split in contiguous blocks (slabs). A one-time partition process writes
  the whole graph and one file per rank; the single process loads the
  whole graph, each of P gloo ranks (1 thread each, started as processes of
  their own, killed as a group on a timeout) only its part. Every process
  reports its peak resident set (``VmHWM``): nothing but that case ran in
  it. Each rank reports its layer time, the bytes it handed to the exchange
  per layer (forward, backward) and the time it spent blocked in it (see
  :mod:`.distributed_worker`).
* **weak scaling**: the same layer at a fixed number of targets (and edges)
  per rank for P = 1, 2, 4: the compute time per rank, as the CPU time of
  each rank's main thread over a forward + backward (slowest rank). On a
  machine with fewer cores than ranks, or shared with other work, the ranks
  wait for a core, which wall-clock time counts and CPU time does not; the
  note gives the wall-clock time minus the exchange wait as well.

Every time here is also reported as CPU time where the machine may be
oversubscribed (partition: process CPU time; layer: main-thread CPU time), and
every figure depends on the load: quote them with the load average the
header prints.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from ..harness import BenchConfig, error_row, row

__all__ = ["SIZES", "DistSize", "distributed_rows"]

_WORKER = "gnnattn.bench.suites.distributed_worker"
_EMBED, _HEADS = 64, 4


@dataclass(frozen=True)
class DistSize:
    """The suite's sizes: halo case (nodes, k, P), layer case (nodes, k, P), weak scaling
    (targets per rank, ranks), timed repetitions, a timeout per process (s), and whether
    the graphs are made in this process (``--quick``: process starts are most of its
    time, and its memory is not what it measures) or in one of their own."""

    halo_nodes: int
    halo_k: int
    layer_nodes: int
    layer_k: int
    weak_nodes: int
    weak_parts: tuple[int, ...]
    parts: int = 4
    reps: int = 2
    timeout: float = 3600.0
    make_here: bool = False


SIZES: Mapping[str, DistSize] = MappingProxyType(
    {
        "full": DistSize(1_000_000, 16, 2_000_000, 32, 62_500, (1, 2, 4)),
        "quick": DistSize(
            4_000, 16, 4_000, 32, 1_000, (1, 2, 4), reps=1, timeout=120.0, make_here=True
        ),
    }
)


def _run(job: dict[str, Any], size: DistSize) -> dict[str, Any]:
    """One job of :mod:`.distributed_worker` in a new process (a ``make`` job in this
    one when ``size.make_here``); its JSON result."""
    if job["job"] == "make" and size.make_here:
        from .distributed_worker import JOBS

        return JOBS["make"]({k: v for k, v in job.items() if k != "job"})
    cmd = [sys.executable, "-m", _WORKER, json.dumps(job)]
    # The threads the job asks for, numba's kernels included (default: every core).
    threads = str(job.get("threads", 1))
    env = {**os.environ, "OMP_NUM_THREADS": threads, "NUMBA_NUM_THREADS": threads}
    res = subprocess.run(
        cmd, capture_output=True, text=True, timeout=size.timeout, check=False, env=env
    )
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{job['job']} exited {res.returncode}: {last[:200]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def _kill(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)  # each rank leads a session of its own
        except ProcessLookupError:
            pass
    for p in procs:
        p.wait()


def _run_ranks(job: dict[str, Any], parts: int, timeout: float) -> list[dict[str, Any]]:
    """``job`` on ``parts`` gloo ranks (processes of their own); their results in rank order."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
        procs = []
        for r in range(parts):
            spec = {**job, "job": "rank", "rank": r, "parts": parts, "store": f"{tmp}/store"}
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", _WORKER, json.dumps(spec)],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=env,
                    start_new_session=True,
                )
            )
        try:
            deadline = time.monotonic() + timeout
            outs = [p.communicate(timeout=max(deadline - time.monotonic(), 1)) for p in procs]
        except BaseException:
            _kill(procs)
            raise
    results = []
    for r, (p, (out, err)) in enumerate(zip(procs, outs, strict=True)):
        if p.returncode != 0:
            last = (err.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"rank {r} of {parts} exited {p.returncode}: {last[:200]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def _halo_rows(size: DistSize, cfg: BenchConfig) -> list[dict[str, Any]]:
    """METIS, contiguous, random: halo fraction and partition time (this process)."""
    import torch

    from ...distributed import partition
    from .common import knn_graph, random_points

    n, k, p = size.halo_nodes, size.halo_k, size.parts
    gen = torch.Generator().manual_seed(cfg.seed + 40)
    t0 = time.perf_counter()
    ei = knn_graph(random_points(n, gen), k)
    knn_s = time.perf_counter() - t0
    case = f"halo rows / owned rows: kNN graph of random 3-D points, N={n:,}, k={k}, P={p}"
    base = "random (the baseline)"
    found: dict[str, tuple[float, float, float]] = {}
    missing: dict[str, str] = {}
    for method in ("random", "contiguous", "metis"):
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            part = partition(ei, p, method=method, num_nodes=n, seed=cfg.seed)
        except ImportError:  # METIS without pymetis (the optional 'distributed' extra)
            missing[method] = "skipped (no pymetis): pip install 'gnnattn[distributed]'"
            continue
        found[method] = (time.perf_counter() - t0, time.process_time() - c0, part.halo_fraction())
        del part
    target = {"metis": "target <= 10%", "random": "target >= 70%", "contiguous": ""}
    rows = []
    for method in ("random", "contiguous", "metis"):
        if method in missing:
            name = base if method == "random" else method
            rows.append(row("distributed", case, "partition", name, base, status=missing[method]))
            continue
        sec, cpu, frac = found[method]
        name = base if method == "random" else method
        note = f"halo {100 * frac:.1f}% of owned rows"
        note += f" ({target[method]})" if target[method] else " (ids in random order)"
        note += f"; {cpu:.1f} s CPU"
        if method == "random":
            note += f"; kNN graph built in {knn_s:.1f} s (cKDTree)"
        rows.append(
            row(
                "distributed",
                case,
                "partition",
                name,
                base,
                times_ms=[sec * 1e3],
                reps=1,
                median_ms=sec * 1e3,
                ratio=sec / found["random"][0],
                note=note,
                mode_label="partition(...) time; halo fraction in the note",
                halo_fraction=frac,
            )
        )
    return rows


def _rank_note(r: dict[str, Any], single_rss: int) -> str:
    layer = statistics.median(r["ms"])
    wait = statistics.median(r["wait_ms"])
    cpu = f"main thread CPU {statistics.median(r['cpu_ms']):.0f} ms; " if "cpu_ms" in r else ""
    return (
        f"RSS {r['peak_rss'] / single_rss:.2f}x the single process's (target <= 0.35x); "
        f"exchange wait {wait:.0f} ms ({100 * wait / layer:.0f}% of the layer); {cpu}"
        f"{r['fwd_bytes'] / 1e6:.1f} MB fwd + {r['bwd_bytes'] / 1e6:.1f} MB bwd per layer; "
        f"{r['targets']:,} targets, {r['halo']:,} halo rows, {r['edges']:,} edges"
    )


def _layer_rows(
    size: DistSize, cfg: BenchConfig, log: Callable[[str], None] | None
) -> list[dict[str, Any]]:
    """The whole graph in one process against P ranks each loading its part."""
    n, k, p = size.layer_nodes, size.layer_k, size.parts
    case = (
        f"SelfAttentionConv (embed {_EMBED}, {_HEADS} heads, float32), kNN graph of 3-D points "
        f"sorted by x, N={n:,}, {k} in-edges each, |E|={n * k:,}: 1 process vs P={p} gloo "
        f"ranks (1 thread each, contiguous parts)"
    )
    base = "single process (1 thread)"
    with tempfile.TemporaryDirectory() as folder:
        job = {
            "nodes": n,
            "k": k,
            "parts": p,
            "seed": cfg.seed,
            "folder": folder,
            "embed": _EMBED,
            "heads": _HEADS,
            "reps": size.reps,
            "threads": 1,
        }
        if log is not None:
            log(f"running [distributed] kNN graph N={n:,} k={k} and its partition (a process)")
        made = _run({**job, "job": "make", "method": "contiguous", "sort": True}, size)
        if log is not None:
            log("running [distributed] the layer in one process")
        single = _run({**job, "job": "single"}, size)
        if log is not None:
            log(f"running [distributed] the layer on {p} ranks")
        ranks = _run_ranks(job, p, size.timeout)
    one = statistics.median(single["ms"])
    made_note = (
        (
            f"main thread CPU {statistics.median(single['cpu_ms']):.0f} ms; "
            if "cpu_ms" in single
            else ""
        )
        + f"one-time partition process: kNN {made['knn_s']:.1f} s, partition "
        f"{made['partition_s']:.1f} s, files {made['save_s']:.1f} s, peak RSS "
        f"{made['peak_rss'] / 1e9:.2f} GB; halo {100 * made['halo_fraction']:.1f}% of owned rows"
    )
    rows = [
        row(
            "distributed",
            case,
            "fwdbwd",
            base,
            base,
            times_ms=single["ms"],
            reps=len(single["ms"]),
            median_ms=one,
            ratio=1.0,
            peak_rss=single["peak_rss"],
            note=made_note,
        )
    ]
    for r, res in enumerate(ranks):
        rows.append(
            row(
                "distributed",
                case,
                "fwdbwd",
                f"rank {r} of {p}",
                base,
                times_ms=res["ms"],
                reps=len(res["ms"]),
                median_ms=statistics.median(res["ms"]),
                ratio=statistics.median(res["ms"]) / one,
                peak_rss=res["peak_rss"],
                note=_rank_note(res, single["peak_rss"]),
                rss_ratio=res["peak_rss"] / single["peak_rss"],
                wait_ms=res["wait_ms"],
                fwd_bytes=res["fwd_bytes"],
                bwd_bytes=res["bwd_bytes"],
            )
        )
    return rows


def _weak_rows(
    size: DistSize, cfg: BenchConfig, log: Callable[[str], None] | None
) -> list[dict[str, Any]]:
    """Compute time per rank (layer minus exchange wait) at fixed targets per rank."""
    nr, k = size.weak_nodes, size.layer_k
    case = (
        f"weak scaling: SelfAttentionConv (embed {_EMBED}, {_HEADS} heads) forward + backward, "
        f"{nr:,} targets x {k} in-edges per rank (kNN, sorted by x, contiguous parts), "
        f"1 thread per rank, {os.cpu_count()} cores"
    )
    rows: list[dict[str, Any]] = []
    base_ms = None
    for p in size.weak_parts:
        if log is not None:
            log(f"running [distributed] weak scaling, P={p}")
        with tempfile.TemporaryDirectory() as folder:
            job = {
                "nodes": nr * p,
                "k": k,
                "parts": p,
                "seed": cfg.seed,
                "folder": folder,
                "embed": _EMBED,
                "heads": _HEADS,
                "reps": size.reps,
            }
            _run({**job, "job": "make", "method": "contiguous", "sort": True}, size)
            ranks = _run_ranks(job, p, size.timeout)
        # Compute: CPU time of each rank's main thread (the ranks share the cores);
        # the wall-clock time minus the exchange wait goes in the note.
        compute = [statistics.median(r["cpu_ms"]) for r in ranks]
        unblocked = [
            statistics.median(a - b for a, b in zip(r["ms"], r["wait_ms"], strict=True))
            for r in ranks
        ]
        slow = max(compute)
        base_ms = slow if base_ms is None else base_ms
        per = ", ".join(f"{c:.0f}" for c in compute)
        walls = ", ".join(f"{c:.0f}" for c in unblocked)
        waits = ", ".join(f"{statistics.median(r['wait_ms']):.0f}" for r in ranks)
        rows.append(
            row(
                "distributed",
                case,
                "weak",
                f"P = {p}",
                "P = 1",
                times_ms=[slow],
                reps=size.reps,
                median_ms=slow,
                ratio=slow / base_ms,
                note=f"CPU ms per rank: {per}; wall minus exchange wait: {walls}; "
                f"exchange wait: {waits}",
                mode_label="compute time per rank: main-thread CPU ms of a forward + backward, "
                "slowest rank",
                compute_ms=compute,
                unblocked_ms=unblocked,
            )
        )
    return rows


def distributed_rows(
    cfg: BenchConfig, log: Callable[[str], None] | None = None
) -> list[dict[str, Any]]:
    """The suite's rows: halo fractions, one process vs P ranks, weak scaling.

    The three parts are independent and each takes minutes at full size: one that
    raises (a rank that dies, a timeout) is an error row, and the others still run.
    """
    size = SIZES["quick" if cfg.quick else "full"]
    if cfg.reps is not None:
        size = dataclasses.replace(size, reps=cfg.reps)
    if log is not None:
        log(f"running [distributed] halo fractions, N={size.halo_nodes:,}")
    parts: list[tuple[str, Callable[[], list[dict[str, Any]]]]] = [
        ("halo fractions", lambda: _halo_rows(size, cfg)),
        ("one process vs P ranks", lambda: _layer_rows(size, cfg, log)),
        ("weak scaling", lambda: _weak_rows(size, cfg, log)),
    ]
    rows: list[dict[str, Any]] = []
    for what, part in parts:
        try:
            rows += part()
        except Exception as err:  # noqa: BLE001 - keep the other parts' rows
            rows.append(error_row("distributed", what, err))
    return rows


def _main(argv: list[str]) -> None:
    """``python -m gnnattn.bench.suites.distributed [--quick] [FIELD=VALUE ...]
    halo|layer|weak ...``: some parts of the suite, each table printed as soon as it is
    done; ``FIELD=VALUE`` changes a size (``layer_nodes=1000000``)."""
    from ..report import format_table

    cfg = BenchConfig(quick="--quick" in argv, suites=("distributed",))
    size = SIZES["quick" if cfg.quick else "full"]
    for arg in argv:
        if "=" in arg:
            field, value = arg.split("=")
            change: dict[str, Any] = {field: int(value)}
            size = dataclasses.replace(size, **change)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    for name in argv:
        if name == "halo":
            rows = _halo_rows(size, cfg)
        elif name == "layer":
            rows = _layer_rows(size, cfg, log)
        elif name == "weak":
            rows = _weak_rows(size, cfg, log)
        else:
            continue
        print(format_table(rows), flush=True)
        print(json.dumps(rows), flush=True)


if __name__ == "__main__":  # pragma: no cover - the suite's parts, one at a time
    _main(sys.argv[1:])
