"""What the ``distributed`` suite runs in processes of their own (``python -m`` this module).

Each job takes one JSON argument and prints one JSON line, its result:

* ``make``: random 3-D points, their kNN graph (``k`` nearest, itself
  included), optionally ids sorted by the first coordinate (a local order);
  writes the whole graph (``graph.pt``: ``edge_index`` and ``num_nodes``, what
  ``gnnattn partition`` reads) and the one-time partition, one file per rank.
* ``single``: the whole graph in one process: one ``SelfAttentionConv``
  forward + backward, times and peak resident set.
* ``rank``: one of P gloo ranks; loads only its part's file, runs the same
  layer on its rows, and reports times, the exchange's wait and bytes, and
  its peak resident set.

Exchange wait: the bench wraps the exchange's ``all_to_all_single`` call
(``gnnattn.distributed.exchange._all_to_all``) and adds up the seconds spent
in it and in waiting for it: in the forward, starting it and the ``wait()``
after the interior targets' attention (what that attention did not hide); in
the backward, the blocking reverse trip. It is time a rank spent blocked in
the exchange, which also absorbs waiting for a slower rank.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from types import MappingProxyType
from typing import Any

__all__ = ["peak_rss"]


def peak_rss() -> int:
    """This process's peak resident set (``VmHWM``), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM"):
                return int(line.split()[1]) * 1024
    return 0  # pragma: no cover - Linux has VmHWM


def _make(args: dict[str, Any]) -> dict[str, Any]:
    import torch

    from ...distributed import partition
    from .common import knn_graph, random_points

    n, k, p = args["nodes"], args["k"], args["parts"]
    gen = torch.Generator().manual_seed(args["seed"] + 40)
    t0 = time.perf_counter()
    pos = random_points(n, gen)
    if args.get("sort"):
        pos = pos[pos[:, 0].argsort()]
    ei = knn_graph(pos, k)
    del pos
    knn_s = time.perf_counter() - t0
    out = Path(args["folder"])
    out.mkdir(parents=True, exist_ok=True)
    torch.save({"edge_index": ei, "num_nodes": n}, out / "graph.pt")
    t0, c0 = time.perf_counter(), time.process_time()
    part = partition(ei, p, method=args["method"], num_nodes=n, seed=args["seed"])
    partition_s, partition_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    del ei
    t0 = time.perf_counter()
    part.save(out)
    save_s = time.perf_counter() - t0
    return {
        "knn_s": knn_s,
        "partition_s": partition_s,
        "partition_cpu_s": partition_cpu_s,
        "save_s": save_s,
        "halo_fraction": part.halo_fraction(),
        "peak_rss": peak_rss(),
    }


def _layer(args: dict[str, Any]) -> Any:
    import torch

    from .common import attention_layer

    torch.manual_seed(args["seed"])
    layer = attention_layer(args["embed"], args["heads"], torch.device("cpu"))
    return layer.train()


def _time_fwdbwd(
    layer: Any, x: Any, graph: Any, g: Any, reps: int, sync: Any
) -> tuple[list[float], list[float]]:
    """A warm-up forward + backward, then ``reps`` timed ones, ``sync()`` before each:
    wall-clock ms, and ms of CPU time of this (the main) thread, which on a machine
    with more runnable threads than cores leaves out the time the thread waited for a
    core (and the time it was blocked in the exchange)."""
    ms, cpu_ms = [], []
    for i in range(reps + 1):
        x.grad = None
        for prm in layer.parameters():
            prm.grad = None
        sync()
        t0, c0 = time.perf_counter(), time.thread_time()
        layer(x, graph).backward(g)
        if i:
            ms.append((time.perf_counter() - t0) * 1e3)
            cpu_ms.append((time.thread_time() - c0) * 1e3)
    return ms, cpu_ms


def _single(args: dict[str, Any]) -> dict[str, Any]:
    import torch

    from ...graphs import AttentionGraph

    torch.set_num_threads(args["threads"])
    data = torch.load(Path(args["folder"]) / "graph.pt", weights_only=True)
    n = data["num_nodes"]
    graph = AttentionGraph(data["edge_index"], n)
    del data
    gen = torch.Generator().manual_seed(args["seed"] + 41)
    x = torch.randn(n, args["embed"], generator=gen).requires_grad_()
    g = torch.randn(n, args["embed"], generator=gen)
    ms, cpu_ms = _time_fwdbwd(_layer(args), x, graph, g, args["reps"], lambda: None)
    return {"ms": ms, "cpu_ms": cpu_ms, "peak_rss": peak_rss(), "edges": graph.num_edges}


class _Timed:
    """An asynchronous exchange whose ``wait()`` is timed."""

    def __init__(self, work: Any, clock: list[float]) -> None:
        self.work, self.clock = work, clock

    def wait(self) -> Any:
        t0 = time.perf_counter()
        res = self.work.wait()
        self.clock[0] += time.perf_counter() - t0
        return res


def _instrument() -> list[float]:
    """Wrap the exchange's all_to_all: returns the clock it adds its seconds to."""
    from ...distributed import exchange

    clock = [0.0]
    inner = exchange._all_to_all

    def timed(
        out: Any, inp: Any, out_counts: list[int], in_counts: list[int], group: Any, async_op: bool
    ) -> Any:
        t0 = time.perf_counter()
        work = inner(out, inp, out_counts, in_counts, group, async_op)
        clock[0] += time.perf_counter() - t0
        return None if work is None else _Timed(work, clock)

    setattr(exchange, "_all_to_all", timed)  # noqa: B010 - the bench's instrument
    return clock


def _rank(args: dict[str, Any]) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from ...distributed import GraphPart

    torch.set_num_threads(1)
    rank, world = args["rank"], args["parts"]
    dist.init_process_group(
        "gloo", init_method=f"file://{args['store']}", rank=rank, world_size=world
    )
    try:
        rss_start = peak_rss()
        part = GraphPart.load(Path(args["folder"]) / f"part-{rank}-of-{world}.pt")
        gen = torch.Generator().manual_seed(args["seed"] + 100 + rank)
        x = torch.randn(part.num_targets, args["embed"], generator=gen).requires_grad_()
        g = torch.randn(part.num_targets, args["embed"], generator=gen)
        layer = _layer(args)
        clock = _instrument()
        waits: list[float] = []

        def sync() -> None:
            dist.barrier()
            waits.append(clock[0])

        ms, cpu_ms = _time_fwdbwd(layer, x, part, g, args["reps"], sync)
        waits.append(clock[0])
        wait_ms = [(b - a) * 1e3 for a, b in zip(waits[1:-1], waits[2:], strict=True)]
        calls = args["reps"] + 1
        return {
            "ms": ms,
            "cpu_ms": cpu_ms,
            "wait_ms": wait_ms,
            "peak_rss": peak_rss(),
            "rss_start": rss_start,
            "fwd_bytes": part.traffic["forward"] // calls,
            "bwd_bytes": part.traffic["backward"] // calls,
            "targets": part.num_targets,
            "halo": int(part.halo.numel()),
            "edges": part.num_edges,
        }
    finally:
        dist.destroy_process_group()


JOBS = MappingProxyType({"make": _make, "single": _single, "rank": _rank})

if __name__ == "__main__":  # pragma: no cover - run by the distributed suite
    job = json.loads(sys.argv[1])
    result = JOBS[job.pop("job")](job)
    result["loadavg"] = list(os.getloadavg())
    print(json.dumps(result))
