"""The same transformer as graph attention and as dense attention: equal outputs, timings.

A two-layer ``torch.nn.TransformerEncoder`` and its twin
:class:`gnnattn.nn.GraphTransformer` (converted with ``from_torch``, same
weights) run on the same batch of B causal sequences of T tokens. For every
gnnattn backend ("mp": message passing, "sdpa": SDPA on the detected
structure, "fused": the sparse CSR kernel, "tiles": block tiles), chosen per call with
``model(x, graph, backend=...)``, it checks the outputs and input gradients
against torch and times forward + backward (median of a few runs; the ratios
are what matters on a noisy machine).

    python examples/graph_vs_dense.py          # T = 64, 128, 256, 512
    python examples/graph_vs_dense.py --quick  # T = 32, 64

Writes ``graph_vs_dense.json`` and ``graph_vs_dense.png`` to --out; the last
line printed is ``RESULT {...}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor
from tqdm import tqdm

import gnnattn.ops
from gnnattn import AttentionGraph, causal_graph
from gnnattn.nn import GraphTransformer

BACKENDS = tuple(b for b in gnnattn.ops.BACKENDS if b != "auto")


def median_seconds(fn: Callable[[], Tensor], reps: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def twins(dim: int, heads: int) -> tuple[torch.nn.TransformerEncoder, GraphTransformer]:
    """A seeded 2-layer ``torch.nn.TransformerEncoder`` and the same weights as a causal
    ``GraphTransformer`` (``from_torch``)."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(
        dim, heads, 4 * dim, 0.0, batch_first=True, norm_first=True
    )
    twin = torch.nn.TransformerEncoder(
        layer, 2, norm=torch.nn.LayerNorm(dim), enable_nested_tensor=False
    ).eval()
    return twin, GraphTransformer.from_torch(twin, causal=True).eval()


def run(t: int, batch_size: int, dim: int, heads: int, reps: int) -> dict:
    twin, model = twins(dim, heads)
    x = torch.randn(batch_size, t, dim, requires_grad=True)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(t)
    ref = twin(x, mask=mask, is_causal=True)  # (B, T, D)
    (ref_g,) = torch.autograd.grad(ref.sum(), x)
    nodes = x.detach().reshape(batch_size * t, dim).requires_grad_()  # (B*T, D): one node per token
    # The graph as explicit edges, wrapped once: the object detects the causal
    # blocks (so "auto" runs SDPA) and keeps its CSR for the sparse backends.
    graph = AttentionGraph(causal_graph(batch=torch.arange(batch_size).repeat_interleave(t)))

    row: dict = {"T": t, "edges": graph.num_edges}
    row["torch_s"] = median_seconds(
        lambda: twin(x, mask=mask, is_causal=True).sum().backward(), reps
    )
    for backend in BACKENDS:  # chosen per call: the model is never changed
        out = model(nodes, graph, backend=backend)
        (g,) = torch.autograd.grad(out.sum(), nodes)
        row[f"{backend}_maxdiff"] = max(
            (out - ref.reshape(-1, dim)).abs().max().item(),
            (g - ref_g.reshape(-1, dim)).abs().max().item(),
        )
        row[f"{backend}_s"] = median_seconds(
            lambda b=backend: model(nodes, graph, backend=b).sum().backward(), reps
        )
    return row


def figure(rows: list[dict]):
    """The timings on log axes, ticks as plain numbers (2, 5, 10, 20 ms; the Ts run)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, NullLocator

    fig, ax = plt.subplots(figsize=(6, 4))
    ts = [r["T"] for r in rows]
    ax.plot(ts, [r["torch_s"] * 1e3 for r in rows], "k--o", label="torch TransformerEncoder")
    for backend in BACKENDS:
        ax.plot(ts, [r[f"{backend}_s"] * 1e3 for r in rows], "-o", label=f'gnnattn "{backend}"')
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    # matplotlib's log ticks read "6x10^0"; plain numbers read at a glance.
    ax.set_xticks(ts, [str(t) for t in ts])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("tokens per sequence T")
    ax.set_ylabel("forward + backward (ms, median)")
    ax.set_title("the same causal transformer: graph vs dense")
    ax.legend()
    fig.tight_layout()
    return fig


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib.pyplot as plt

    fig = figure(rows)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes, a few seconds")
    p.add_argument("--tokens", type=int, nargs="+", default=None, help="sequence lengths T")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--out", type=Path, default=Path("gnnattn-demo-out"))
    args = p.parse_args(argv)
    tokens = args.tokens or ([32, 64] if args.quick else [64, 128, 256, 512])
    reps = args.reps or (3 if args.quick else 7)
    args.out.mkdir(parents=True, exist_ok=True)

    rows = [run(t, args.batch_size, args.dim, args.heads, reps) for t in tqdm(tokens, desc="T")]
    head = f"{'T':>5} {'edges':>8} {'torch ms':>9}" + "".join(
        f" {b + ' ms':>9} {'x torch':>7} {'maxdiff':>8}" for b in BACKENDS
    )
    print(head)
    for r in rows:
        line = f"{r['T']:>5} {r['edges']:>8} {r['torch_s'] * 1e3:>9.2f}"
        for b in BACKENDS:
            line += (
                f" {r[f'{b}_s'] * 1e3:>9.2f} {r[f'{b}_s'] / r['torch_s']:>7.2f}"
                f" {r[f'{b}_maxdiff']:>8.1e}"
            )
        print(line)
    plot(rows, args.out / "graph_vs_dense.png")
    worst = max(r[f"{b}_maxdiff"] for r in rows for b in BACKENDS)
    result = {"rows": rows, "max_abs_diff": worst}
    (args.out / "graph_vs_dense.json").write_text(json.dumps(result, indent=2))
    print(f"largest difference to torch over all backends and sizes: {worst:.2e}")
    print("RESULT " + json.dumps({"max_abs_diff": worst, "tokens": tokens}))
    return result


if __name__ == "__main__":
    main()
