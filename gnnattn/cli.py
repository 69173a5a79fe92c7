"""The ``gnnattn`` command.

Each subcommand is a ``_cmd_NAME(args) -> int`` function registered in
:func:`build_parser`; heavier modules are imported inside the command so that
``gnnattn --help`` stays fast. A ``ValueError`` out of a command is a user
error (a bad option value): :func:`main` prints it as one line,
``gnnattn COMMAND: message``, on stderr and returns 2, as argparse does for
its own errors.
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
    print(f"{'graph':<14} {'edges':>6} " + " ".join(f"{b:>9}" for b in ("mp", "sdpa", "fused")))
    worst = 0.0
    with torch.no_grad():
        for name, ei in graphs.items():
            mask = edge_index_to_mask(ei, t)
            ref = dense_self_attention(layer, x, mask)
            cells = []
            for backend in ("mp", "sdpa", "fused"):
                try:
                    err = (layer(x, ei, backend=backend) - ref).abs().max().item()
                except ValueError:  # "sdpa" refuses a graph of no known structure
                    cells.append(f"{'n/a':>9}")
                    continue
                worst = max(worst, err)
                cells.append(f"{err:9.1e}")
            print(f"{name:<14} {ei.shape[1]:>6} " + " ".join(cells))
        err = (layer(x) - mha(x[None], x[None], x[None])[0][0]).abs().max().item()
        worst = max(worst, err)
        print(f"complete graph vs torch.nn.MultiheadAttention: max abs error {err:.1e}")
    ok = worst < 1e-10
    print("agreement: OK (max abs error < 1e-10)" if ok else f"agreement: FAILED ({worst:.1e})")
    return 0 if ok else 1


def _cmd_bench(args: argparse.Namespace) -> int:
    from . import bench

    return bench.main(args)


def _cmd_compare(args: argparse.Namespace) -> int:
    from .compare import compare

    res = compare(
        tokens=args.tokens,
        embed_dim=args.embed_dim,
        num_heads=args.heads,
        dtypes=args.dtype or ("float32", "float16", "bfloat16"),
        causal={"both": (False, True), "yes": (True,), "no": (False,)}[args.causal],
        reps=args.reps,
        seed=args.seed,
        device=args.device,
    )
    print(res.table())
    return 0 if res.ok else 1


def _embed(tokens: list[str], dim: int):
    """Small deterministic embeddings: a generator seeded by a stable hash of each token.

    The same word always gets the same vector (so "The" and "the" differ, but
    two "the" agree), on every machine and run; Python's ``hash`` is salted
    per process, so crc32 is used instead.
    """
    import zlib

    import torch

    rows = []
    for tok in tokens:
        g = torch.Generator().manual_seed(zlib.crc32(tok.encode("utf-8")))
        rows.append(torch.randn(dim, generator=g))
    return torch.stack(rows)


def _cmd_demo(args: argparse.Namespace) -> int:
    import os
    import tempfile

    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt
    import torch

    from . import SelfAttentionConv, causal_graph, complete_graph
    from .compare import compare
    from .viz import draw_attention, draw_heatmap, draw_side_by_side, explore, softmax_steps

    tokens = args.text.split()
    if not tokens:
        raise ValueError("--text is empty; give a sentence, e.g. --text 'The bank of the river'")
    if args.out is None:
        out = tempfile.mkdtemp(prefix="gnnattn-demo-", dir=os.getcwd())
    else:
        out = args.out
        os.makedirs(out, exist_ok=True)
    d, h = 16, 2
    x = _embed(tokens, d)
    torch.manual_seed(args.seed)
    layer = SelfAttentionConv(d, num_heads=h).eval()
    t = len(tokens)
    print(f"tokens ({t}): {tokens}")
    print("each token is a node; self-attention is message passing on the complete graph\n")
    res = compare(layer, x, dtypes=("float32", "float16", "bfloat16"), reps=2)
    print(res.table())

    with torch.no_grad():
        q = layer.lin_query(x).view(t, h, -1)  # (T, H, C)
        k = layer.lin_key(x).view(t, h, -1)
    print("\nhead 0, step by step for the last token:")
    print(softmax_steps(q[:, 0], k[:, 0], t - 1, scale=layer.scale, tokens=tokens))

    paths = []
    with torch.no_grad():
        _, (ei, alpha) = layer(x, complete_graph(t), return_attention_weights=True)
        _, (cei, calpha) = layer(x, causal_graph(t), return_attention_weights=True)
    figs = {
        "attention_graph.png": draw_attention(ei, alpha, tokens=tokens, head=0).figure,
        "heatmap.png": draw_heatmap(ei, alpha, tokens=tokens, head=0).figure,
        "causal_dag.png": draw_attention(cei, calpha, tokens=tokens, head=0).figure,
        "side_by_side.png": draw_side_by_side(ei, alpha, tokens=tokens, head=0),
    }
    print()
    for name, fig in figs.items():
        path = os.path.join(out, name)
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        paths.append(path)
        print(f"wrote {path}")
    # The same weights, every head, in a page to explore; with the scores, so
    # that hovering an edge shows q.k as well as alpha.
    scores = (q[ei[1]] * k[ei[0]]).sum(-1) * layer.scale  # (E, H)
    page = explore((ei, alpha), tokens=tokens, scores=scores, title=f"gnnattn demo: {args.text}")
    path = os.path.join(out, "explorer.html")
    page.save(path)
    print(f"wrote {path} (open it in a browser: hover the edges, click a token)")
    return 0 if res.ok else 1


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
    bench.add_argument(
        "--quick",
        action="store_true",
        help="smoke-test sizes: checks that every candidate runs; its timings mean nothing",
    )
    bench.add_argument(
        "--threads", type=int, default=2, help="torch (and numba) CPU threads (default 2)"
    )
    bench.add_argument(
        "--suite",
        action="append",
        choices=_suites(),
        help="run only this suite (repeatable; default: all but scale): "
        + "; ".join(f"{name}: {text}" for name, text in _suite_help()),
    )
    bench.add_argument(
        "--scale",
        action="store_true",
        help="also run the scale suite (N = 1M nodes: minutes, about 6 GB); not with --quick",
    )
    bench.add_argument("--json", metavar="PATH", help="also write every result to PATH")
    bench.add_argument(
        "--reps", type=int, default=None, help="fixed number of interleaved repetitions"
    )
    bench.add_argument(
        "--no-memory", action="store_true", help="skip the peak-memory call of each candidate"
    )
    bench.set_defaults(func=_cmd_bench)
    cmp = sub.add_parser(
        "compare",
        help="parity table: graph backends vs MultiheadAttention, SDPA, FlexAttention per dtype",
    )
    cmp.add_argument("--tokens", type=int, default=12, help="sequence length T (default 12)")
    cmp.add_argument("--embed-dim", type=int, default=16, help="embedding width (default 16)")
    cmp.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    cmp.add_argument(
        "--dtype",
        action="append",
        choices=["float32", "float16", "bfloat16"],
        help="repeatable (default: all three)",
    )
    cmp.add_argument(
        "--causal", choices=["both", "yes", "no"], default="both", help="masking (default both)"
    )
    cmp.add_argument("--reps", type=int, default=3, help="timed calls per run (default 3)")
    cmp.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    cmp.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    cmp.set_defaults(func=_cmd_compare)
    demo = sub.add_parser(
        "demo",
        help="attention on a sentence: parity table, step-by-step softmax, PNGs, explorer page",
    )
    demo.add_argument(
        "--text", default="The bank of the river", help="the sentence (default %(default)r)"
    )
    demo.add_argument(
        "--out", default=None, help="folder for the PNGs (default: a new ./gnnattn-demo-XXXX)"
    )
    demo.add_argument("--seed", type=int, default=0, help="seed of the layer (default 0)")
    demo.set_defaults(func=_cmd_demo)
    return parser


def _suites() -> tuple[str, ...]:
    from .bench import SUITES

    return SUITES


def _suite_help() -> list[tuple[str, str]]:
    from .bench.suites import REGISTRY

    return [(s.name, s.help) for s in REGISTRY]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``gnnattn`` command with ``argv``; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except ValueError as err:
        message = (str(err).strip().splitlines() or [type(err).__name__])[0]
        print(f"gnnattn {args.command}: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
