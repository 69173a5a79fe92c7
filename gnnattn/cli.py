"""The ``gnnattn`` command.

Each subcommand is a ``_cmd_NAME(args) -> int`` function registered in
:func:`build_parser`; heavier modules are imported inside the command so that
``gnnattn --help`` stays fast.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

__all__ = ["build_parser", "main"]


def _cmd_check(args: argparse.Namespace) -> int:
    import torch

    from . import (
        SelfAttentionConv,
        causal_graph,
        complete_graph,
        edge_index_to_mask,
        sliding_window_graph,
    )
    from .dense import dense_self_attention

    torch.manual_seed(args.seed)
    t, d, h = args.tokens, 16, 4
    x = torch.randn(t, d, dtype=torch.float64)
    layer = SelfAttentionConv(d, num_heads=h).double().eval()
    mha = layer.to_torch()
    # Without duplicate edges, which a dense mask cannot express.
    sparse = torch.randint(0, t, (2, 3 * t)).unique(dim=1)
    graphs = {
        "complete": complete_graph(t),
        "causal": causal_graph(t),
        "window w=2": sliding_window_graph(t, window=2),
        "random sparse": sparse,
    }
    print(f"graph attention vs dense attention, T={t}, embed {d}, {h} heads, float64")
    print(f"{'graph':<14} {'edges':>6} " + " ".join(f"{b:>9}" for b in ("mp", "dense", "fused")))
    worst = 0.0
    with torch.no_grad():
        for name, ei in graphs.items():
            mask = edge_index_to_mask(ei, t)
            ref = dense_self_attention(layer, x, mask)
            cells = []
            for backend in ("mp", "dense", "fused"):
                layer.backend = backend
                try:
                    err = (layer(x, ei) - ref).abs().max().item()
                except ValueError:
                    cells.append(f"{'n/a':>9}")
                    continue
                worst = max(worst, err)
                cells.append(f"{err:9.1e}")
            print(f"{name:<14} {ei.shape[1]:>6} " + " ".join(cells))
        layer.backend = "auto"
        err = (layer(x) - mha(x[None], x[None], x[None])[0][0]).abs().max().item()
        worst = max(worst, err)
        print(f"complete graph vs torch.nn.MultiheadAttention: max abs error {err:.1e}")
    ok = worst < 1e-10
    print("agreement: OK (max abs error < 1e-10)" if ok else f"agreement: FAILED ({worst:.1e})")
    return 0 if ok else 1


def _cmd_bench(args: argparse.Namespace) -> int:
    from . import bench

    return bench.main(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gnnattn", description="Transformer self-attention as message passing over a graph."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser(
        "check", help="print graph-vs-dense agreement of every backend on small graphs"
    )
    check.add_argument("--tokens", type=int, default=12, help="sequence length T (default 12)")
    check.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    check.set_defaults(func=_cmd_check)
    bench = sub.add_parser(
        "bench",
        help="time gnnattn's backends against MultiheadAttention, SDPA, FlexAttention and PyG",
    )
    bench.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    bench.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    bench.add_argument(
        "--threads", type=int, default=2, help="torch (and numba) CPU threads (default 2)"
    )
    bench.add_argument(
        "--suite",
        action="append",
        choices=["complete", "causal", "edge_index", "sparse", "softmax"],
        help="run only this suite (repeatable; default: all)",
    )
    bench.add_argument("--json", metavar="PATH", help="also write every result to PATH")
    bench.add_argument(
        "--reps", type=int, default=None, help="fixed number of interleaved repetitions"
    )
    bench.add_argument(
        "--no-memory", action="store_true", help="skip the peak-memory call of each candidate"
    )
    bench.set_defaults(func=_cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
