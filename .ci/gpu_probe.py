"""One section of the GPU probe run by ``.ci/gpu``; writes ``$OUT/<section>.json`` when done.

    python3 .ci/gpu_probe.py SECTION [--dry-run]

Sections, in order of value: ``tests`` (the Triton/CUDA tests), ``softmax``
(copy bandwidth, then segment softmax forward and backward, given the graph's
plan, against PyG's ``utils.softmax``), ``attention`` (fused attention at
N = 1M against the bytes it gathers, PyG ``TransformerConv``, SDPA and
compiled FlexAttention), ``options`` (the fused kernels called with plans:
forward + backward with dropout and raw edge features against without, by
``triton.testing.do_bench``; that a planned call never synchronises),
``tiles`` (the ``tiles`` bench suite: sliding window, batched
variable-length graphs, dilated window, BigBird, a reordered kNN graph and a
random graph against compiled FlexAttention and the CSR kernel, cases in that
order while the section's time lasts), ``correctness`` (at scale, against a
float64 reference, score bias and dropout included; offsets past 2**31;
deterministic backward), ``registers`` (registers and spills of every kernel
compiled in this process, after compiling them at the probe's sizes).

Achieved bandwidths are reported as fractions of the copy bandwidth measured
in the same section (``softmax``: the segment softmax forward and backward,
``attention``: the CSR forward's gathers), with the best of each in
``fraction_of_copy``.

``--dry-run`` runs every section end to end on the CPU at tiny sizes through
Triton's interpreter (times are then meaningless and say so): the test suite
runs it, so that the first real GPU run does not die on a typo.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# Sizes per mode: the on a GPU, tiny ones for the dry run.
SIZES: dict[str, dict[str, Any]] = {
    "gpu": {
        "copy_bytes": 2 << 30,
        "softmax_edges": 32 << 20,
        "softmax_hub": 2 << 20,
        "attn_nodes": 1 << 20,
        "attn_conv_nodes": [1 << 20, 1 << 19, 1 << 18, 1 << 17, 1 << 16],
        "seq": 4096,
        "window": 128,
        "check_nodes": 20_000,
        "opt_graph": (1 << 19, 32, 8, 64),  # N, degree, heads, head dim
        "big_softmax": True,
        "compile_graph": (50_000, 16),  # the train suite's kNN graph: nodes, neighbours
        "gps": (1_000_000, 8, 64, 4),  # issue 29's GPS layer: nodes, kNN k, embed, heads
        "reps": 10,
    },
    "dry": {
        "copy_bytes": 1 << 20,
        "softmax_edges": 1024,
        "softmax_hub": 300,
        "attn_nodes": 256,
        "attn_conv_nodes": [256, 128],
        "seq": 64,
        "window": 8,
        "check_nodes": 48,
        "opt_graph": (16, 6, 2, 16),
        "big_softmax": False,
        "compile_graph": (300, 8),
        "gps": (300, 8, 16, 2),
        "reps": 1,
    },
}


def _out_dir() -> Path:
    out = Path(os.environ.get("OUT", "gpu-out"))
    out.mkdir(parents=True, exist_ok=True)
    return out


def _write(section: str, result: dict[str, Any]) -> None:
    path = _out_dir() / f"{section}.json"
    path.write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps(result, indent=1, default=str)[:4000])


# --------------------------------------------------------------------------- timing


class Timer:
    """Median time of a callable: CUDA events on a GPU, the wall clock on the CPU."""

    def __init__(self, device: str, reps: int) -> None:
        self.device, self.reps = device, reps

    def __call__(self, fn: Callable[[], Any]) -> float:
        import torch

        fn()  # warm-up (compiles)
        times = []
        for _ in range(self.reps):
            if self.device == "cuda":
                start, end = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        times.sort()
        return times[len(times) // 2]


def _peak(device: str, fn: Callable[[], Any]) -> int | None:
    """Peak bytes allocated during ``fn`` above what was live before (CUDA only)."""
    import torch

    if device != "cuda":
        fn()
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return int(torch.cuda.max_memory_allocated() - base)


def _is_oom(err: BaseException) -> bool:
    return "out of memory" in str(err).lower() or type(err).__name__ == "OutOfMemoryError"


# --------------------------------------------------------------------------- sections


def section_tests(dry: bool) -> dict[str, Any]:
    """The Triton and CUDA tests (no offline compile on the device)."""
    select = "triton_ops_has_the_reference_api" if dry else "(triton or cuda or gpu) and not sm90"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", select]
    cmd += ["tests/test_triton_kernels.py", "tests/test_triton_edge.py", "tests/test_layers.py"]
    cmd += ["tests/test_triton_tiles.py", "tests/test_graph_object.py"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    tail = (proc.stdout + proc.stderr)[-6000:]
    summary = [line for line in tail.splitlines() if " passed" in line or " failed" in line]
    return {
        "returncode": proc.returncode,
        "summary": summary[-1] if summary else None,
        "seconds": time.perf_counter() - t0,
        "tail": tail,
    }


def section_softmax(dry: bool, device: str, sizes: dict[str, Any]) -> dict[str, Any]:
    """Copy bandwidth, then segment softmax forward/backward vs PyG's utils.softmax."""
    import torch
    from torch_geometric.utils import softmax as pyg_softmax

    from gnnattn.kernels import triton_attention as ta
    from gnnattn.kernels import triton_softmax as ts

    timer = Timer(device, sizes["reps"])
    copy_gbps = _copy_gbps(timer, device, sizes["copy_bytes"])
    rows = []
    e_total = sizes["softmax_edges"]
    for graph in ("degree 32", "hub"):
        deg = 32
        if graph == "degree 32":
            n = e_total // deg
            ptr = torch.arange(n + 1, device=device, dtype=torch.int64) * deg
        else:
            hub = sizes["softmax_hub"]
            n = (e_total - hub) // deg
            rest = torch.arange(0, n + 1, device=device, dtype=torch.int64) * deg + hub
            ptr = torch.cat([torch.zeros(1, dtype=torch.int64, device=device), rest])
            n += 1
        e = int(ptr[-1])
        index = torch.repeat_interleave(torch.arange(n, device=device), ptr.diff())
        # The plan a graph keeps (any ids in range serve as its columns): the
        # timed calls then check nothing and never synchronise.
        plan = ta.plan(ptr, index, n)
        # The dry run checks the code paths, which are the same for bfloat16.
        dtypes = (torch.float32,) if dry else (torch.float32, torch.bfloat16)
        for h in (1, 8):
            for dtype in dtypes:
                x = (torch.randn(e, h, device=device) * 3).to(dtype)
                g = torch.randn(e, h, device=device).to(dtype)
                itemsize = x.element_size()
                row: dict[str, Any] = {"graph": graph, "E": e, "H": h, "dtype": str(dtype)}
                try:
                    y = ts.segment_softmax_fwd(x, ptr, plan=plan)
                    t_f = timer(lambda: ts.segment_softmax_fwd(x, ptr, plan=plan))  # noqa: B023
                    t_b = timer(lambda: ts.segment_softmax_bwd(y, g, ptr, plan=plan))  # noqa: B023
                    xr = x.detach().requires_grad_()

                    def pyg_fwd() -> Any:
                        return pyg_softmax(x, index, num_nodes=n)  # noqa: B023

                    def pyg_fwdbwd() -> None:
                        pyg_softmax(xr, index, num_nodes=n).backward(g)  # noqa: B023

                    t_pf = timer(pyg_fwd)
                    t_pfb = timer(pyg_fwdbwd)
                    fwd_bytes, bwd_bytes = 2 * e * h * itemsize, 3 * e * h * itemsize
                    row.update(
                        fwd_ms=t_f * 1e3,
                        bwd_ms=t_b * 1e3,
                        fwd_gbps=fwd_bytes / t_f / 1e9,
                        bwd_gbps=bwd_bytes / t_b / 1e9,
                        fwd_fraction_of_copy=fwd_bytes / t_f / 1e9 / copy_gbps,
                        bwd_fraction_of_copy=bwd_bytes / t_b / 1e9 / copy_gbps,
                        pyg_fwd_ms=t_pf * 1e3,
                        pyg_fwdbwd_ms=t_pfb * 1e3,
                        speedup_fwd_vs_pyg=t_pf / t_f,
                        speedup_fwdbwd_vs_pyg=t_pfb / (t_f + t_b),
                        max_abs_diff_vs_pyg=float((y.float() - pyg_fwd().float()).abs().max()),
                    )
                except Exception as err:  # noqa: BLE001 - recorded, the probe goes on
                    row["error"] = f"{type(err).__name__}: {str(err)[:300]}"
                rows.append(row)
    ok = [r for r in rows if "error" not in r]
    best = {
        f"{pass_}_best": max((r[f"{pass_}_fraction_of_copy"] for r in ok), default=None)
        for pass_ in ("fwd", "bwd")
    }
    return {"copy_gbps": copy_gbps, "fraction_of_copy": best, "goal": 0.7, "rows": rows}


def _copy_gbps(timer: Timer, device: str, nbytes: int) -> float:
    """Read + write bandwidth of one ``clone`` of ``nbytes``."""
    import torch

    buf = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
    return 2 * nbytes / timer(buf.clone) / 1e9


def _random_graph(n: int, deg: int, device: str, seed: int = 0):
    import torch

    gen = torch.Generator(device="cpu").manual_seed(seed)
    src = torch.randint(0, n, (n * deg,), generator=gen).to(device)
    dst = torch.arange(n, device=device).repeat_interleave(deg)
    return torch.stack([src, dst])


def section_attention(dry: bool, device: str, sizes: dict[str, Any]) -> dict[str, Any]:
    """Fused attention at scale vs the bytes it gathers, TransformerConv, SDPA, FlexAttention."""
    import torch
    import torch.nn.functional as F

    from gnnattn import AttentionGraph, SelfAttentionConv
    from gnnattn.ops import attention

    timer = Timer(device, sizes["reps"])
    copy_gbps = _copy_gbps(timer, device, sizes["copy_bytes"])
    res: dict[str, Any] = {
        "copy_gbps": copy_gbps,
        "fused": [],
        "transformer_conv": [],
        "complete": {},
        "window": {},
    }
    n, deg, h, c = sizes["attn_nodes"], 32, 8, 64
    graph = AttentionGraph(_random_graph(n, deg, device), n)
    _ = graph.csr, graph.csc  # built once, outside the timings
    e = graph.num_edges
    for dtype in (torch.bfloat16, torch.float32):
        q, k, v = (torch.randn(n, h, c, device=device, dtype=dtype) for _ in range(3))
        row: dict[str, Any] = {"N": n, "E": e, "H": h, "C": c, "dtype": str(dtype)}
        try:
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]

            def fwd() -> Any:
                return attention(q, k, v, graph, backend="fused")  # noqa: B023

            def fwdbwd() -> None:
                attention(*leaves, graph, backend="fused").sum().backward()  # noqa: B023

            t_f, t_fb = timer(fwd), timer(fwdbwd)
            # Bytes the gathers need: one k and one v row per edge and head,
            # plus q and out once per target.
            item = q.element_size()
            gathered = e * h * 2 * c * item + 2 * n * h * c * item
            row.update(
                fwd_ms=t_f * 1e3,
                fwdbwd_ms=t_fb * 1e3,
                fwd_gather_gbps=gathered / t_f / 1e9,
                fwd_fraction_of_copy=gathered / t_f / 1e9 / copy_gbps,
                peak_fwdbwd_bytes=_peak(device, fwdbwd),
            )
        except Exception as err:  # noqa: BLE001
            row["error"] = f"{type(err).__name__}: {str(err)[:300]}"
        res["fused"].append(row)
    # PyG TransformerConv at the largest N that fits, and the fused layer at the same N.
    from torch_geometric.nn import TransformerConv

    d = h * c
    for n_conv in sizes["attn_conv_nodes"]:
        row = {"N": n_conv}
        try:
            ei = _random_graph(n_conv, deg, device, seed=1)
            conv = TransformerConv(d, c, heads=h, root_weight=False).to(device)
            layer = SelfAttentionConv(d, h, backend="fused").to(device)
            g2 = AttentionGraph(ei, n_conv)
            x = torch.randn(n_conv, d, device=device, requires_grad=True)
            t_conv = timer(lambda: conv(x, ei).sum().backward())  # noqa: B023
            peak_conv = _peak(device, lambda: conv(x, ei).sum().backward())  # noqa: B023
            t_ours = timer(lambda: layer(x, g2).sum().backward())  # noqa: B023
            peak_ours = _peak(device, lambda: layer(x, g2).sum().backward())  # noqa: B023
            row.update(
                conv_fwdbwd_ms=t_conv * 1e3,
                ours_fwdbwd_ms=t_ours * 1e3,
                speedup=t_conv / t_ours,
                conv_peak_bytes=peak_conv,
                ours_peak_bytes=peak_ours,
            )
            res["transformer_conv"].append(row)
            break
        except Exception as err:  # noqa: BLE001
            row["error"] = "out of memory" if _is_oom(err) else f"{type(err).__name__}: {err}"[:300]
            res["transformer_conv"].append(row)
            if device == "cuda":
                torch.cuda.empty_cache()
    # The complete graph: layer(x) vs SDPA on the same projections.
    t = sizes["seq"]
    dt = torch.bfloat16 if device == "cuda" else torch.float32
    layer = SelfAttentionConv(512, 8).to(device=device, dtype=dt).eval()
    x = torch.randn(t, 512, device=device, dtype=dt)

    def sdpa() -> Any:
        qh = layer.lin_query(x).view(1, t, 8, 64).transpose(1, 2)
        kh = layer.lin_key(x).view(1, t, 8, 64).transpose(1, 2)
        vh = layer.lin_value(x).view(1, t, 8, 64).transpose(1, 2)
        o = F.scaled_dot_product_attention(qh, kh, vh)
        return layer.lin_out(o.transpose(1, 2).reshape(t, 512))

    with torch.no_grad():
        t_layer, t_sdpa = timer(lambda: layer(x)), timer(sdpa)
    res["complete"] = {"T": t, "layer_ms": t_layer * 1e3, "sdpa_ms": t_sdpa * 1e3,
                       "ratio": t_layer / t_sdpa}  # fmt: skip
    # A window graph: the fused kernel vs compiled FlexAttention with a block mask.
    w = sizes["window"]
    wgraph = AttentionGraph.window(t, window=w, device=device)
    row = {"T": t, "window": w}
    # The same weights in a layer built for the fused backend.
    fused = SelfAttentionConv(512, 8, backend="fused").to(device=device, dtype=dt).eval()
    fused.load_state_dict(layer.state_dict())
    with torch.no_grad():
        row["fused_ms"] = timer(lambda: fused(x, wgraph)) * 1e3
    if dry:
        row["flex"] = "skipped in the dry run (torch.compile)"
    else:
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention

            mask = create_block_mask(
                lambda b, hh, i, j: (i - j).abs() <= w, None, None, t, t, device=device
            )
            flex = torch.compile(flex_attention)

            def flex_layer() -> Any:
                qh = layer.lin_query(x).view(1, t, 8, 64).transpose(1, 2)
                kh = layer.lin_key(x).view(1, t, 8, 64).transpose(1, 2)
                vh = layer.lin_value(x).view(1, t, 8, 64).transpose(1, 2)
                o = flex(qh, kh, vh, block_mask=mask)
                return layer.lin_out(o.transpose(1, 2).reshape(t, 512))

            with torch.no_grad():
                row["flex_ms"] = timer(flex_layer) * 1e3
            row["ratio_fused_vs_flex"] = row["fused_ms"] / row["flex_ms"]
        except Exception as err:  # noqa: BLE001
            row["flex"] = f"{type(err).__name__}: {str(err)[:300]}"
    res["window"] = row
    fractions = [r["fwd_fraction_of_copy"] for r in res["fused"] if "fwd_fraction_of_copy" in r]
    res["fraction_of_copy"] = {"csr_fwd_best": max(fractions, default=None)}
    return res


def section_tiles(dry: bool, device: str, sizes: dict[str, Any]) -> dict[str, Any]:
    """The ``tiles`` bench suite, case by case in order of value, until 60% of the section's
    budget is spent (a case started then may still finish); ratios to each case's baseline
    (compiled FlexAttention where it has one)."""
    import torch

    from gnnattn.bench.harness import BenchConfig, run_case
    from gnnattn.bench.suites.tiles import CASE_BUILDERS
    from gnnattn.ops import BACKENDS

    budget = float(os.environ.get("GNNATTN_PROBE_BUDGET", "90"))
    cfg = BenchConfig(device=device, quick=dry, memory=False, min_reps=3, max_reps=10)
    cfg.budget_s = 0.5 if dry else 2.0
    dev = torch.device(device)
    t0 = time.perf_counter()
    keep = ("candidate", "baseline", "status", "median_ms", "ratio", "max_abs_diff", "note")
    # The summary first (the log shows the JSON's first 4000 characters): per case and
    # mode, each row's ratio to the baseline, or its status.
    res: dict[str, Any] = {
        "summary": {},
        "tiles_backend": "tiles" in BACKENDS,
        "not_run": [],
        "cases": [],
    }
    for name, build in CASE_BUILDERS.items():
        if time.perf_counter() - t0 > 0.6 * budget:
            res["not_run"].append(name)
            continue
        try:
            for case in build(cfg, dev):
                for mode in case.modes:
                    rows = run_case(case, mode, cfg)
                    res["cases"].append(
                        {
                            "case": case.name,
                            "mode": mode,
                            "baseline": case.baseline,
                            "rows": [{k: r[k] for k in keep} for r in rows],
                        }
                    )
                    res["summary"][f"{name} {mode}"] = {
                        r["candidate"]: r["ratio"] if r["ratio"] is not None else r["status"]
                        for r in rows
                    }
        except Exception as err:  # noqa: BLE001 - recorded, the probe goes on
            res["cases"].append({"case": name, "error": f"{type(err).__name__}: {str(err)[:300]}"})
        if device == "cuda":
            torch.cuda.empty_cache()
        # What is done survives a timeout, which replaces tiles.json with its marker.
        (_out_dir() / "tiles.partial.json").write_text(json.dumps(res, indent=1, default=str))
    res["seconds_in_cases"] = time.perf_counter() - t0
    return res


def _index_tensors(graph: Any) -> tuple[Any, Any, tuple[Any, Any, Any]]:
    """The graph's CSR and transposed CSR with int64 ids, as the Triton kernels take them."""
    csr, csc = graph.csr, graph.csc
    return csr.ptr, csr.col.long(), (csc.ptr, csc.row.long(), csc.perm.long())


def section_options(dry: bool, device: str, sizes: dict[str, Any]) -> dict[str, Any]:
    """The fused kernels with plans: fwd+bwd with dropout / raw edge features (F = 16) vs
    without; no sync."""
    import torch

    from gnnattn import AttentionGraph
    from gnnattn.kernels import triton_attention as ta
    from gnnattn.kernels.common import Dropout

    n, deg, h, c = sizes["opt_graph"]
    graph = AttentionGraph(_random_graph(n, deg, device, seed=3), n)
    ptr, col, csc = _index_tensors(graph)
    plan, csc_plan = ta.plan(ptr, col, n), ta.plan(csc[0], csc[1], n)
    e = col.numel()
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    q, k, v, go = (torch.randn(n, h, c, device=device, dtype=dtype) for _ in range(4))
    drop = Dropout(0.1, (1 << 62) + 0x9E37_79B9, 0)
    ea = torch.randn(e, 16, device=device, dtype=dtype)
    eq, ge = (torch.randn(n, h, 16, device=device, dtype=dtype) for _ in range(2))
    edge = {"edge_attr": ea, "edge_query": eq}
    variants = {
        "plain": {},
        "dropout": {"dropout": drop},
        "edge_attr_F16": edge,
    }
    if not dry:  # the dry run's interpreter pays seconds per variant: one edge variant there
        variants["edge_attr_F16+dropout"] = {**edge, "dropout": drop}

    def step(opts: dict[str, Any]) -> None:
        res = ta.attention_fwd(q, k, v, ptr, col, c**-0.5, plan=plan, **opts)
        bw = {"grad_edge_out": ge, "edge_out": res[2]} if "edge_attr" in opts else {}
        ta.attention_bwd(
            q, k, v, res[0], res[1], go, ptr, col, c**-0.5, csc=csc, plan=plan,
            csc_plan=csc_plan, **opts, **bw,
        )  # fmt: skip

    if device == "cuda":
        import triton.testing

        def bench(fn: Callable[[], Any]) -> float:  # CUDA events, median, in seconds
            return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") / 1e3

        timing = "triton.testing.do_bench (CUDA events, median)"
    else:
        bench, timing = Timer(device, sizes["reps"]), "wall clock (interpreter: meaningless)"
    res: dict[str, Any] = {"N": n, "E": e, "H": h, "C": c, "dtype": str(dtype), "timing": timing}
    rows: dict[str, Any] = {}
    for name, opts in variants.items():
        try:
            rows[name] = {"fwdbwd_ms": bench(lambda: step(opts)) * 1e3}  # noqa: B023
        except Exception as err:  # noqa: BLE001 - recorded, the probe goes on
            rows[name] = {"error": f"{type(err).__name__}: {str(err)[:300]}"}
    plain = rows["plain"].get("fwdbwd_ms")
    for row in rows.values():
        if plain and "fwdbwd_ms" in row:
            row["ratio_vs_plain"] = row["fwdbwd_ms"] / plain
    res["fwdbwd"] = rows
    # Given plans, a call never waits for the device (and a new seed compiles nothing).
    if device == "cuda":
        opts = {**variants["dropout"], **edge}  # the edge path must not sync either
        step(opts)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            step({**opts, "dropout": Dropout(0.1, 12_345, 7)})
            res["planned_call_syncs"] = False
        except RuntimeError as err:
            res["planned_call_syncs"] = f"{type(err).__name__}: {str(err)[:300]}"
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
    else:
        res["planned_call_syncs"] = "not checked (no CUDA)"
    return res


def section_correctness(dry: bool, device: str, sizes: dict[str, Any]) -> dict[str, Any]:
    """At scale against float64 references; offsets past 2**31; deterministic backward."""
    import torch

    from gnnattn import AttentionGraph
    from gnnattn.kernels import reference as ref
    from gnnattn.kernels import triton_attention as ta
    from gnnattn.kernels import triton_softmax as ts
    from gnnattn.kernels.common import Dropout

    res: dict[str, Any] = {}
    n, deg, h, c = sizes["check_nodes"], 32, 8, 64
    ei = _random_graph(n, deg, device, seed=2)
    # One hub target and one hub source, so the split paths run at scale.
    ei[1, : 4 * deg] = 0
    ei[0, -8 * deg :] = 1
    graph = AttentionGraph(ei, n)
    ptr, col, csc = _index_tensors(graph)
    plans = dict(plan=ta.plan(ptr, col, n))
    bplans = dict(csc=csc, csc_plan=ta.plan(csc[0], csc[1], n), **plans)
    q, k, v = (torch.randn(n, h, c, device=device) for _ in range(3))
    out, lse = ta.attention_fwd(q, k, v, ptr, col, 0.125, **plans)
    go = torch.randn_like(out)
    dq, dk, dv, dbias = ta.attention_bwd(q, k, v, out, lse, go, ptr, col, 0.125, **bplans)
    assert dbias is None
    d64 = [t.double() for t in (q, k, v)]
    ro, rl = ref.attention_fwd(*d64, ptr, col, 0.125)
    want = ref.attention_bwd(*d64, ro, rl, go.double(), ptr, col, 0.125)
    fin = torch.isfinite(rl)  # lse = -inf for targets without edges, on both sides
    res["lse_inf_where_reference_inf"] = bool(torch.equal(torch.isfinite(lse), fin))
    res["max_abs_err"] = {
        "out": float((out.double() - ro).abs().max()),
        "lse": float((lse.double()[fin] - rl[fin]).abs().max()),
        **{
            name: float((g.double() - w).abs().max())
            for name, g, w in zip(("dq", "dk", "dv"), (dq, dk, dv), want[:3], strict=True)
        },
    }
    again = ta.attention_bwd(q, k, v, out, lse, go, ptr, col, 0.125, **bplans)
    res["backward_bitwise_identical"] = all(
        torch.equal(a, b) for a, b in zip((dq, dk, dv), again[:3], strict=True)
    )
    # Score bias and dropout together, against float64.
    e = col.numel()
    bias = torch.randn(e, h, device=device)
    opts = dict(dropout=Dropout(0.2, (1 << 62) + 77, 1_000))
    out, lse = ta.attention_fwd(q, k, v, ptr, col, 0.125, bias, **opts, **plans)
    grads = ta.attention_bwd(q, k, v, out, lse, go, ptr, col, 0.125, bias, **opts, **bplans)
    ro, rl = ref.attention_fwd(*d64, ptr, col, 0.125, bias.double(), **opts)
    want = ref.attention_bwd(*d64, ro, rl, go.double(), ptr, col, 0.125, bias.double(), **opts)
    names = ("dq", "dk", "dv", "dbias")
    res["max_abs_err_options"] = {
        "out": float((out.double() - ro).abs().max()),
        **{
            name: float((g.double() - w).abs().max())
            for name, g, w in zip(names, grads, want, strict=True)
        },
    }
    del grads, want, ro, rl
    if sizes["big_softmax"]:
        # E * H = 2**31 + 2**24 in float16: the last segment lies past 2**31 elements.
        e, hh = (1 << 28) + (1 << 21), 8
        x = torch.randn(e, hh, device=device, dtype=torch.float16)
        ptr = torch.arange(4097, device=device) * e // 4096
        y = ts.segment_softmax_fwd(x, ptr)
        tail = slice(int(ptr[-2]), e)
        err = (y[tail].float() - torch.softmax(x[tail].float(), 0)).abs().max()
        res["softmax_past_2_31_max_abs_err"] = float(err)
        del x, y
    else:
        res["softmax_past_2_31"] = "skipped in the dry run"
    return res


def section_registers(dry: bool, device: str, sizes: dict[str, Any]) -> dict[str, Any]:
    """Registers and spills of every kernel compiled in this process."""
    import torch

    from gnnattn.kernels import triton_attention as ta
    from gnnattn.kernels import triton_softmax as ts
    from gnnattn.kernels.common import Dropout
    from gnnattn.kernels.triton_attention import backward as ta_bwd
    from gnnattn.kernels.triton_attention import forward as ta_fwd

    # Compile every kernel at a small size (each specialisation is what counts);
    # 600 edges per target are split at the GPU's default chunk.
    n, h, c, per = (512, 8, 64, 600) if not dry else (8, 2, 16, 70)
    ptr = torch.arange(n + 1, device=device) * per
    e = int(ptr[-1])
    col = torch.randint(0, n, (e,), device=device)
    q, k, v = (torch.randn(n, h, c, device=device, dtype=torch.bfloat16) for _ in range(3))
    bias = torch.randn(e, h, device=device, dtype=torch.bfloat16)
    for opts in ({}, {"dropout": Dropout(0.1, 1, 0)}):
        out, lse = ta.attention_fwd(q, k, v, ptr, col, 0.125, bias, **opts)
        grads = ta.attention_bwd(
            q, k, v, out, lse, torch.randn_like(out), ptr, col, 0.125, bias, **opts
        )
        assert len(grads) == 4
    x = torch.randn(e, h, device=device)
    ts.segment_softmax_bwd(ts.segment_softmax_fwd(x, ptr), x, ptr)
    if dry or device != "cuda":
        return {"kernels": "none compiled (interpreter)"}
    kernels = {}
    for mod in (ta_fwd, ta_bwd, ts):  # the modules that define the kernels
        for name in dir(mod):
            fn = getattr(mod, name)
            caches = getattr(fn, "device_caches", None)
            if not caches:
                continue
            for dev_cache in caches.values():
                for key, kern in dev_cache[0].items():
                    try:
                        kern._init_handles()
                        kernels[f"{name}[{len(kernels)}]"] = {
                            "n_regs": kern.n_regs,
                            "n_spills": kern.n_spills,
                            "key": str(key)[:200],
                        }
                    except Exception as err:  # noqa: BLE001
                        kernels[f"{name}[{len(kernels)}]"] = {"error": str(err)[:200]}
    return {"kernels": kernels}


def section_compile(dry: bool, device: str, sizes: dict[str, Any]) -> dict[str, Any]:
    """``torch.compile`` and ``torch.export`` on the kernels' operators (Triton on CUDA): the
    ``train`` suite's step eager vs compiled, their parity, the fused op in the compiled
    graph, and an AOTInductor package round trip."""
    import copy

    import torch
    import torch.nn.functional as F

    from gnnattn.bench.suites.train import NodeClassifier, _data
    from gnnattn.nn import GraphTransformer

    n, k = sizes["compile_graph"]
    dev = torch.device(device)
    data = _data(n, k, dev, torch.Generator().manual_seed(1))
    data.graph.prepare()
    torch.manual_seed(0)
    eager = NodeClassifier(0.1).to(dev).train()
    twin = copy.deepcopy(eager)
    seen: set[Any] = set()

    def spy(gm: Any, example: Any) -> Any:
        seen.update(str(node.target) for node in gm.graph.nodes if node.op == "call_function")
        from torch._inductor.compile_fx import compile_fx

        return compile_fx(gm, example)

    compiled = torch.compile(twin, fullgraph=True, backend=spy)
    opts = {id(m): torch.optim.Adam(m.parameters(), lr=1e-3) for m in (eager, twin)}

    def step(model: Any, owner: Any) -> Any:
        opt = opts[id(owner)]
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(data.x, data.graph, data.edge_attr), data.y)
        loss.backward()
        opt.step()
        return loss

    t0 = time.perf_counter()
    step(compiled, twin)
    if device == "cuda":
        torch.cuda.synchronize()
    first_s = time.perf_counter() - t0
    timer = Timer(device, sizes["reps"])
    eager_s = timer(lambda: step(eager, eager))
    compiled_s = timer(lambda: step(compiled, twin))
    res: dict[str, Any] = {
        "N": n, "E": data.graph.num_edges, "first_call_s": first_s,
        "eager_step_ms": eager_s * 1e3, "compiled_step_ms": compiled_s * 1e3,
        "ratio_compiled_vs_eager": compiled_s / eager_s,
        "fused_op_in_compiled_graph": any("gnnattn.attention_fwd" in t for t in seen),
    }  # fmt: skip
    # Parity: the same weights in eval mode (no dropout), compiled against eager.
    twin.load_state_dict(eager.state_dict())
    eager.eval(), twin.eval()
    with torch.no_grad():
        want = eager(data.x, data.graph, data.edge_attr)
        got = compiled(data.x, data.graph, data.edge_attr)
    res["compiled_max_abs_diff"] = float((got - want).abs().max())

    class Served(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = GraphTransformer(2, 64, 4, edge_dim=4, edge_value=True)

        def forward(self, x: Any, edge_index: Any, edge_attr: Any) -> Any:
            return self.encoder(x, edge_index, edge_attr)

    served = Served().to(dev).eval()
    ei, x = data.graph.edge_index, torch.randn(n, 64, device=dev)
    nodes, edges = torch.export.Dim("nodes", min=2), torch.export.Dim("edges", min=2)
    try:
        ep = torch.export.export(
            served, (x, ei, data.edge_attr), dynamic_shapes=({0: nodes}, {1: edges}, {0: edges})
        )
        with torch.no_grad():
            want = served(x, ei, data.edge_attr)
            res["export_max_abs_diff"] = float(
                (ep.module()(x, ei, data.edge_attr) - want).abs().max()
            )
            path = torch._inductor.aoti_compile_and_package(
                ep, package_path=os.path.join(os.environ.get("OUT", "."), "served.pt2")
            )
            loaded = torch._inductor.aoti_load_package(path)
            res["aoti_max_abs_diff"] = float((loaded(x, ei, data.edge_attr) - want).abs().max())
    except Exception as err:  # noqa: BLE001 - recorded, the probe goes on
        res["export_error"] = f"{type(err).__name__}: {str(err)[:500]}"
    # The operators' registration on this device: opcheck of the fused op (fake
    # kernel, autograd, AOT dispatch), on the graph above at a small width.
    from gnnattn.kernels.library import draw_key

    g, h = data.graph, 2
    q, kk, vv = (torch.randn(g.num_dst, h, 8, device=dev, requires_grad=True) for _ in range(3))
    ptr, col = g.kernel_layout("csr")
    tptr, trow, tperm = g.kernel_layout("csc")
    args = (q, kk, vv, ptr, col, g.kernel_plan("csr"), tptr, trow, tperm, g.kernel_plan("csc"),
            None, None, None, draw_key(), 0.35, 0.1)  # fmt: skip
    try:
        torch.library.opcheck(torch.ops.gnnattn.attention_fwd.default, args)
        res["opcheck_attention_fwd"] = "ok"
    except Exception as err:  # noqa: BLE001 - recorded, the probe goes on
        res["opcheck_attention_fwd"] = f"{type(err).__name__}: {str(err)[:500]}"
    return res


def section_gps(dry: bool, device: str, sizes: dict[str, Any]) -> dict[str, Any]:
    """Issue 29's GPS layer (``gnnattn bench --scale``'s, GINEConv local conv, Exphormer
    attention) on the kNN graph of 1M points: forward + backward time and peak memory."""
    import torch

    from gnnattn.bench.suites.scale import gps_case

    n, k, d, h = sizes["gps"]
    case = gps_case(n, k, d, h, seed=0, device=device)
    layer, x, g = case["layer"], case["x"], case["grad"]
    ei, edge_attr, graph = case["edge_index"], case["edge_attr"], case["graph"]

    def fwdbwd() -> None:
        x.grad = None
        layer.zero_grad(set_to_none=True)
        layer(x, ei, attn_graph=graph, edge_attr=edge_attr).backward(g)

    timer = Timer(device, max(1, min(3, sizes["reps"])))
    seconds = timer(fwdbwd)
    peak = _peak(device, fwdbwd)
    return {
        "nodes": n,
        "knn_edges": int(ei.shape[1]),
        "attn_edges": int(graph.num_edges),
        "fwdbwd_s": seconds,
        "peak_bytes_above_inputs": peak,
        "max_allocated_bytes": torch.cuda.max_memory_allocated() if device == "cuda" else None,
        "knn_s": case["knn_s"],
        "graph_s": case["graph_s"],
        "note": "times mean nothing in a dry run" if dry else "",
    }


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("section", choices=SECTIONS)
    parser.add_argument("--dry-run", action="store_true", help="CPU, interpreter, tiny sizes")
    args = parser.parse_args()
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported
    import torch

    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        _write(args.section, {"status": "skipped", "why": "no CUDA device"})
        return 2
    sizes = SIZES["dry" if args.dry_run else "gpu"]
    info = {
        "section": args.section,
        "dry_run": args.dry_run,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu (interpreter)",
    }
    t0 = time.perf_counter()
    try:
        if args.section == "tests":
            result = section_tests(args.dry_run)
        else:
            fn = globals()[f"section_{args.section}"]
            result = fn(args.dry_run, device, sizes)
        status = "ok"
        if args.section == "tests" and result["returncode"] != 0:
            status = "failed"
    except Exception as err:  # noqa: BLE001 - the JSON says what broke
        import traceback

        result, status = {"error": traceback.format_exc()[-4000:]}, "error"
        print(err, file=sys.stderr)
    _write(args.section, {**info, "status": status, "seconds": time.perf_counter() - t0, **result})
    return 0 if status == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
