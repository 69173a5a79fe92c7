"""The ``scale`` suite (``gnnattn bench --scale`` only): one ``SelfAttentionConv`` at
N = 1M nodes, 32 in-edges each, embed 128, 4 heads; time and peak resident set. And
one GPS layer with Exphormer attention on a kNN graph of 1M 3-D points (issue 29).

Each case runs in a fresh Python process, so that its peak resident set
(``VmHWM``) is this case's alone: the imports, the graph, the inputs ``x``
and upstream gradient, and the layer's first forward and backward (which also
builds the graph's transposed CSR; the later calls reuse it and hold the same
tensors). The graph is given two ways: as an int32 CSR adjacency
(``torch.sparse_csr_tensor``, the lean form: the graph keeps its index arrays
and makes no ``[2, E]`` copy) and as an int64 ``edge_index`` grouped by target
(PyG's usual form; 0.5 GB of its own at this size). The baseline is a CSR
SpMM of the same graph with an ``[N, 128]`` matrix in the same process: after
the layer's first call the peak is read, then the baseline's matrices are made
(their memory is not in the peak) and each repetition times one forward, one
forward + backward and one SpMM, in turn, so that the ratios are of interleaved
medians as in the other suites. PyG's ``TransformerConv`` cannot run here: each
of its ``|E| x D`` tensors would be 16 GB.

The GPS case (:data:`GPS_SIZES`): ``GPSConv(64, GINEConv(MLP, edge_dim=3), heads=4,
attn_type="exphormer")`` on the kNN graph of N random 3-D points (``k`` nearest,
itself included; edge features the offsets ``pos_j - pos_i``, as a GraphGPS
model would take a point cloud's), forward and backward in a fresh process: the
kNN graph, the Exphormer graph (the kNN edges both ways, a 3-regular expander,
one virtual node, self-loops) built once and passed as ``attn_graph``, the first
call and the timed calls, and the peak resident set of all of it. ``k = 8`` (7
neighbours and the point itself) is the light end of kNN point-cloud models
(DGCNN takes 20). The local conv is :class:`gnnattn.nn.GINEConv`, PyG's with its
messages summed in chunks of edges: PyG's own holds four ``|E| x D`` float32
tensors at once in its forward (``x_j``, ``lin(edge_attr)``, their sum and its
``relu``; 8.2 GB at N = 1M, k = 8), the note says how much.
PyG's ``GPSConv(attn_type="multihead")`` attends to all :math:`N^2` pairs of
the one graph: it is measured at :data:`PYG_PROBE` nodes in a process of its
own and its time extrapolated (:func:`multihead_status`; on the CPU its memory
grows as :math:`N`, its time as :math:`N^2`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from ..harness import BenchConfig, row

__all__ = [
    "GPS_SIZES",
    "PYG_PROBE",
    "SIZES",
    "gps_case",
    "gps_rows",
    "multihead_status",
    "scale_rows",
]

# (nodes, in-degree, embed, heads, timed repetitions)
SIZES: Mapping[str, tuple[int, int, int, int, int]] = MappingProxyType(
    {
        "full": (1_000_000, 32, 128, 4, 3),
        "quick": (20_000, 8, 32, 4, 2),  # only for tests of the machinery
    }
)
_INPUTS = MappingProxyType(
    {
        "csr": "graph from an int32 CSR adjacency",
        "edge_index": "graph from an int64 edge_index",
        # Issue 18's N = 1M row: PyG's layer with edge features, on the fused
        # kernels by the edge algebra (edge_attr [E, 16] read raw, no E x D tensor).
        "tconv": "TransformerConv(edge_dim=16), graph from an int64 edge_index",
    }
)
TCONV_EDGE_DIM = 16
# Issue 29's GPS layer: (nodes, kNN k, embed, heads, timed repetitions).
GPS_SIZES: Mapping[str, tuple[int, int, int, int, int]] = MappingProxyType(
    {
        "full": (1_000_000, 8, 64, 4, 2),
        "quick": (20_000, 8, 32, 4, 1),  # only for tests of the machinery
    }
)
_GPS = "GPSConv(GINEConv, attn_type='exphormer') forward + backward"
_GPS_PYG = "PyG GPSConv(attn_type='multihead')"
# The N at which PyG's multihead GPSConv is measured (its time extrapolated as N^2).
PYG_PROBE: Mapping[str, int] = MappingProxyType({"full": 32_000, "quick": 2_000})
_SPMM = "CSR SpMM: torch.sparse.mm(A, X [N, embed])"
_FWD = "SelfAttentionConv forward (no grad)"
_FWDBWD = "SelfAttentionConv forward + backward"
_CONV = "PyG TransformerConv (+out proj)"


def scale_rows(cfg: BenchConfig, log: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Run every case in its own process and return its rows."""
    n, deg, d, h, reps = SIZES["quick" if cfg.quick else "full"]
    reps = reps if cfg.reps is None else cfg.reps
    rows: list[dict[str, Any]] = []
    for kind, label in _INPUTS.items():
        case = f"{label}: N={n:,}, {deg} in-edges each, embed {d}, {h} heads, |E|={n * deg:,}"
        if log is not None:
            log(f"running [scale] {case} (in a new process)")
        args = {
            "nodes": n,
            "deg": deg,
            "embed": d,
            "heads": h,
            "reps": reps,
            "input": kind,
            "threads": cfg.threads,
            "seed": cfg.seed,
        }
        out, err = _run_worker(args)
        if out is None:
            status = f"error: {err[0][:160] if err else 'no result'}"
            for mode in ("fwd", "fwdbwd"):
                rows.append(row("scale", case, mode, _names(kind)[mode], _SPMM, status=status))
            continue
        gib = n * deg * d * 4 / 2**30
        conv = f"skipped (memory): |E| x D = {gib:.0f} GiB per tensor"
        for mode, name in _names(kind).items():
            spmm = _timed_row(case, mode, _SPMM, out["spmm_ms"])
            mine = _timed_row(case, mode, name, out[f"{mode}_ms"])
            mine["ratio"] = mine["median_ms"] / spmm["median_ms"]
            mine["peak_rss"] = out["peak_rss"] if mode == "fwdbwd" else None
            if mode == "fwdbwd":
                mine["note"] = (
                    f"first call {out['first_s']:.1f} s; graph + inputs "
                    f"{out['rss_inputs'] / 1e9:.2f} GB resident before it; graph build "
                    f"{out['graph_s']:.1f} s"
                )
            rows += [spmm, mine, row("scale", case, mode, _CONV, _SPMM, status=conv)]
    return rows + gps_rows(cfg, log)


def _run_worker(args: dict[str, Any]) -> tuple[dict[str, Any] | None, list[str]]:
    """``_worker(args)`` in a fresh Python process: its result, or ``None`` and the error."""
    cmd = [sys.executable, "-m", "gnnattn.bench.suites.scale", json.dumps(args)]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, check=False)
        out = json.loads(res.stdout.strip().splitlines()[-1]) if res.returncode == 0 else None
        err = res.stderr.strip().splitlines()[-1:] if res.returncode else []
    except (subprocess.TimeoutExpired, json.JSONDecodeError, IndexError) as exc:
        out, err = None, [f"{type(exc).__name__}"]
    return out, err


def multihead_status(res: dict[str, Any] | None, n: int, err: list[str]) -> str:
    """The status of PyG's ``GPSConv(attn_type="multihead")`` at ``n`` nodes, from its
    forward + backward measured at ``res["nodes"]`` (its time grows as ``N^2``, its
    memory, on the CPU, as ``N``: SDPA's flash kernel takes the padding mask without an
    ``N x N`` tensor)."""
    if res is None:
        return f"error: {err[0][:160] if err else 'no result'}"
    m, s, per_node = res["nodes"], res["s"], res["delta_peak"] / res["nodes"]
    hours = s * (n / m) ** 2 / 3600
    return (
        f"not run (time): {s:.1f} s forward + backward at N={m:,} (conv=None), O(N^2): "
        f"about {hours:.1f} h at N={n:,}; memory O(N) here, {per_node / 1e3:.1f} kB per "
        f"node (24 GB at N={int(24e9 / per_node):,})"
    )


def gps_rows(cfg: BenchConfig, log: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Issue 29's case: one GPS layer with Exphormer attention on a kNN graph, in its own
    process; and where PyG's multihead GPSConv stops fitting."""
    n, k, d, h, reps = GPS_SIZES["quick" if cfg.quick else "full"]
    reps = reps if cfg.reps is None else cfg.reps
    case = f"GPS layer, kNN graph of N={n:,} 3-D points (k={k}), embed {d}, {h} heads"
    if log is not None:
        log(f"running [scale] {case} (in a new process)")
    args = {
        "input": "gps_exphormer",
        "nodes": n,
        "k": k,
        "embed": d,
        "heads": h,
        "reps": reps,
        "threads": cfg.threads,
        "seed": cfg.seed,
    }
    out, err = _run_worker(args)
    probe = {**args, "input": "pyg_multihead", "nodes": PYG_PROBE["quick" if cfg.quick else "full"]}
    pyg_res, pyg_err = _run_worker(probe)
    pyg = row("scale", case, "fwdbwd", _GPS_PYG, _GPS, status=multihead_status(pyg_res, n, pyg_err))
    if out is None:
        status = f"error: {err[0][:160] if err else 'no result'}"
        return [row("scale", case, "fwdbwd", _GPS, _GPS, status=status), pyg]
    mine = _timed_row(case, "fwdbwd", _GPS, out["fwdbwd_ms"])
    mine.update(baseline=_GPS, peak_rss=out["peak_rss"])
    # What PyG's GINEConv would hold at once: x_j, lin(edge_attr), their sum, its relu.
    gine = 4 * out["knn_edges"] * d * 4
    mine["note"] = (
        f"|E| kNN {out['knn_edges']:,}, attention graph {out['attn_edges']:,} edges; "
        f"kNN {out['knn_s']:.1f} s, Exphormer graph {out['graph_s']:.1f} s, first call "
        f"{out['first_s']:.1f} s; {out['rss_inputs'] / 1e9:.2f} GB resident before it, "
        f"gnnattn's GINEConv sums its messages in chunks (PyG's holds {gine / 1e9:.1f} GB "
        f"of them at its peak); load average "
        f"{out['loadavg'][0]:.1f}"
    )
    return [mine, pyg]


def _names(kind: str) -> dict[str, str]:
    """The candidate's name per mode: the SelfAttentionConv, or gnnattn's TransformerConv."""
    if kind == "tconv":
        layer = "gnnattn TransformerConv"
        return {"fwd": f"{layer} forward (no grad)", "fwdbwd": f"{layer} forward + backward"}
    return {"fwd": _FWD, "fwdbwd": _FWDBWD}


def _timed_row(case: str, mode: str, name: str, times: list[float]) -> dict[str, Any]:
    import statistics

    return row(
        "scale",
        case,
        mode,
        name,
        _SPMM,
        times_ms=times,
        reps=len(times),
        median_ms=statistics.median(times),
        ratio=1.0,
    )


def _status() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS", "VmHWM")):
                key, value = line.split(":")
                out[key] = int(value.split()[0]) * 1024
    return out


def _worker(args: dict[str, Any]) -> dict[str, Any]:
    """One case, in this (fresh) process: the numbers :func:`scale_rows` reports."""
    import warnings

    import torch

    from ...graphs import AttentionGraph

    torch.set_num_threads(args["threads"])
    if args["input"] == "gps_exphormer":
        return _gps_worker(args)
    if args["input"] == "pyg_multihead":
        return _pyg_worker(args)
    n, deg, reps = args["nodes"], args["deg"], args["reps"]
    gen = torch.Generator().manual_seed(args["seed"] + 9)
    e = n * deg
    t0 = time.perf_counter()
    ptr = torch.arange(n + 1, dtype=torch.int32) * deg
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "sparse CSR support is in beta"
        if args["input"] == "csr":  # the others: an int64 edge_index
            col = torch.randint(0, n, (e,), generator=gen, dtype=torch.int32)
            adj = torch.sparse_csr_tensor(ptr, col, torch.ones(e, dtype=torch.bool), (n, n))
            graph = AttentionGraph(adj)
            del col
        else:
            src = torch.randint(0, n, (e,), generator=gen)
            ei = torch.stack([src, torch.arange(n).repeat_interleave(deg)])
            del src
            graph = AttentionGraph(ei, n)
    graph_s = time.perf_counter() - t0
    fwd, fwdbwd, xm, res = _layer_part(args, graph, gen)
    # The baseline's matrix is made after the layer's peak was read: its memory is not
    # the layer's. It shares the graph's index arrays and multiplies the layer's input
    # (no copies beside the layer's tensors, which the timed calls keep alive).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        adj_f = torch.sparse_csr_tensor(
            graph.csr.ptr.to(graph.csr.col.dtype), graph.csr.col, torch.ones(e), (n, n)
        )

    def spmm() -> None:
        torch.sparse.mm(adj_f, xm)

    spmm()  # its warm-up call, as the layer's first call was
    # One call of each per repetition, in turn: a noisy neighbour or a change of clock
    # hits the layer and the baseline alike (the ratios are of these medians).
    fwd_ms, fwdbwd_ms, spmm_ms = [], [], []
    for _ in range(reps):
        fwd_ms.append(_ms(fwd))
        fwdbwd_ms.append(_ms(fwdbwd))
        spmm_ms.append(_ms(spmm))
    return {
        **res,
        "fwd_ms": fwd_ms,
        "fwdbwd_ms": fwdbwd_ms,
        "spmm_ms": spmm_ms,
        "graph_s": graph_s,
        "loadavg": list(os.getloadavg()),
    }


def _ms(fn: Callable[[], Any]) -> float:
    """Milliseconds one call of ``fn`` takes."""
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def _layer_part(
    args: dict[str, Any], graph: Any, gen: Any
) -> tuple[Callable[[], Any], Callable[[], Any], Any, dict[str, Any]]:
    """The layer's forward (no grad) and forward + backward, after its first call; its
    input ``x`` (detached); that call's seconds and the process's peak resident set
    through it (the peak: the first call also builds the graph's transposed CSR,
    which later calls reuse)."""
    import torch

    from ...nn import TransformerConv
    from .common import attention_layer

    n, d, h = args["nodes"], args["embed"], args["heads"]
    torch.manual_seed(args["seed"])
    ea = None
    if args["input"] == "tconv":
        layer: Any = TransformerConv(d, d // h, heads=h, edge_dim=TCONV_EDGE_DIM)
        ea = torch.randn(graph.num_edges, TCONV_EDGE_DIM, generator=gen)  # (E, 16)
    else:
        layer = attention_layer(d, h, torch.device("cpu"))
    x = torch.randn(n, d, generator=gen).requires_grad_()
    g = torch.randn(n, d, generator=gen)
    rss_inputs = _status()["VmRSS"]

    def call() -> Any:
        return layer(x, graph) if ea is None else layer(x, graph, ea)

    def fwd() -> None:
        with torch.no_grad():
            call()

    def fwdbwd() -> None:
        x.grad = None
        for p in layer.parameters():
            p.grad = None
        call().backward(g)

    first_s = _ms(fwdbwd) / 1e3
    res = {"first_s": first_s, "peak_rss": _status()["VmHWM"], "rss_inputs": rss_inputs}
    return fwd, fwdbwd, x.detach(), res


def gps_case(n: int, k: int, d: int, h: int, seed: int, device: str = "cpu") -> dict[str, Any]:
    """Issue 29's GPS layer and its inputs on ``device``: ``layer``, ``x``, ``grad`` (the
    upstream gradient), ``edge_index``, ``edge_attr``, ``graph`` (the Exphormer graph),
    and the seconds the kNN graph and the Exphormer graph took (``knn_s``,
    ``graph_s``, both built on the CPU)."""
    import torch

    from ...graphs import exphormer_graph
    from ...nn import GINEConv, GPSConv
    from .common import knn_graph, random_points

    gen = torch.Generator().manual_seed(seed + 29)
    t0 = time.perf_counter()
    pos = random_points(n, gen)
    ei = knn_graph(pos, k)  # (2, n k), itself included
    edge_attr = (pos[ei[0]] - pos[ei[1]]).float()  # (n k, 3) offsets
    del pos
    knn_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    graph = exphormer_graph(ei, n, expander_degree=3, virtual_nodes=1, seed=seed)
    graph_s = time.perf_counter() - t0
    torch.manual_seed(seed)
    mlp = torch.nn.Sequential(torch.nn.Linear(d, d), torch.nn.ReLU(), torch.nn.Linear(d, d))
    layer = GPSConv(d, GINEConv(mlp, edge_dim=3), heads=h, attn_type="exphormer")
    x = torch.randn(n, d, generator=gen)
    grad = torch.randn(n, d, generator=gen)
    return {
        "layer": layer.to(device),
        "x": x.to(device).requires_grad_(),
        "grad": grad.to(device),
        "edge_index": ei.to(device),
        "edge_attr": edge_attr.to(device),
        "graph": graph.to(device) if device != "cpu" else graph,
        "knn_s": knn_s,
        "graph_s": graph_s,
    }


def _gps_worker(args: dict[str, Any]) -> dict[str, Any]:
    """Issue 29's GPS layer: the kNN graph, the Exphormer graph, forward + backward."""
    n, k, d, h, reps = args["nodes"], args["k"], args["embed"], args["heads"], args["reps"]
    case = gps_case(n, k, d, h, args["seed"])
    layer, x, g, ei, edge_attr, graph = (
        case[key] for key in ("layer", "x", "grad", "edge_index", "edge_attr", "graph")
    )
    knn_s, graph_s = case["knn_s"], case["graph_s"]
    del case
    rss_inputs = _status()["VmRSS"]

    def fwdbwd() -> None:
        x.grad = None
        for p in layer.parameters():
            p.grad = None
        layer(x, ei, attn_graph=graph, edge_attr=edge_attr).backward(g)

    t0 = time.perf_counter()
    fwdbwd()
    first_s = time.perf_counter() - t0
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fwdbwd()
        times.append((time.perf_counter() - t0) * 1e3)
    return {
        "fwdbwd_ms": times,
        "first_s": first_s,
        "knn_s": knn_s,
        "graph_s": graph_s,
        "knn_edges": int(ei.shape[1]),
        "attn_edges": int(graph.num_edges),
        "rss_inputs": rss_inputs,
        "peak_rss": _status()["VmHWM"],
        "loadavg": list(os.getloadavg()),
    }


def _pyg_worker(args: dict[str, Any]) -> dict[str, Any]:
    """PyG's ``GPSConv(attn_type="multihead")`` (no local conv: the part that grows as
    ``N^2``) on one graph of ``nodes`` nodes: forward + backward time, peak growth."""
    import torch
    from torch_geometric.nn import GPSConv as PyGGPSConv

    n, d, h = args["nodes"], args["embed"], args["heads"]
    torch.manual_seed(args["seed"])
    layer = PyGGPSConv(d, None, heads=h)
    x = torch.randn(n, d).requires_grad_()
    before = _status()["VmRSS"]
    t0 = time.perf_counter()
    layer(x, torch.zeros(2, 0, dtype=torch.long)).sum().backward()
    return {"nodes": n, "s": time.perf_counter() - t0, "delta_peak": _status()["VmHWM"] - before}


if __name__ == "__main__":  # pragma: no cover - run by scale_rows in a new process
    print(json.dumps(_worker(json.loads(sys.argv[1]))))
