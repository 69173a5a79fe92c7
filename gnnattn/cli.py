"""The ``gnnattn`` command.

Each subcommand is a ``_cmd_NAME(args) -> int`` function registered in
:func:`build_parser`; heavier modules are imported inside the command so that
``gnnattn --help`` stays fast.

User errors never end in a traceback: an option out of range, a path that
cannot be a folder, a device that is not there are refused while parsing (the
``type=`` functions below), and a ``ValueError`` out of a command (a
combination of options the library refuses) or an ``OSError`` (a write that
failed) is caught in :func:`main`. Both print one line, ``gnnattn COMMAND:
message``, on stderr and end with status 2, argparse's convention (the parser's
usage text is left out: ``--help`` shows it).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from .distributed import METHODS

__all__ = ["DEMO_MAX_TOKENS", "DEMO_OUT", "build_parser", "main"]

#: ``gnnattn demo --text`` is cut to this many tokens: the heatmap (T^2 labelled
#: cells) and the explorer page (T^2 edges) are unreadable, and slow, beyond it.
DEMO_MAX_TOKENS = 64

#: Up to this many tokens the demo's graph drawings show every edge; past it, each
#: target's DEMO_DRAW_TOP_K heaviest.
DEMO_DRAW_ALL = 8
DEMO_DRAW_TOP_K = 3

#: The demo's output folder when ``--out`` is not given (as the README says).
DEMO_OUT = "gnnattn-demo-out"


class _Parser(argparse.ArgumentParser):
    """argparse, but an error is one line on stderr (no usage text) and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message}\n")


def _int_in(lo: int, hi: int | None = None) -> Callable[[str], int]:
    """An argparse ``type=``: an int in ``[lo, hi]`` (no upper bound when ``hi`` is None)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an int, got {text!r}") from None
        if value < lo or (hi is not None and value > hi):
            want = f"an int >= {lo}" if hi is None else f"an int in [{lo}, {hi}]"
            raise argparse.ArgumentTypeError(f"expected {want}, got {value}")
        return value

    return parse


#: The largest --tokens of ``gnnattn check`` (float64 on complete graphs of T^2 edges).
CHECK_MAX_TOKENS = 256
#: The largest --tokens, --embed-dim and --heads of ``gnnattn compare`` (its float64
#: reference holds [H, T, T] weights).
COMPARE_MAX = 1024
# torch.manual_seed takes seeds up to 2**64 - 1; negative ones are folded in, so refused.
_SEED = _int_in(0, 2**64 - 1)
# gnnattn.distributed.partition's seed is an int64.
_PARTITION_SEED = _int_in(0, 2**63 - 1)


def _device(text: str) -> str:
    """An argparse ``type=``: ``cpu``, ``cuda`` or ``cuda:N``, present on this machine."""
    m = re.fullmatch(r"cpu|cuda(?::(\d+))?", text)
    if m is None:
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {text!r}")
    if text != "cpu":
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise argparse.ArgumentTypeError(
                f"expected a device torch can use, got {text!r}, but torch {torch.__version__} "
                f"sees no CUDA device"
            )
        if m.group(1) is not None and int(m.group(1)) >= count:
            raise argparse.ArgumentTypeError(
                f"expected a CUDA device index below {count} (the devices torch sees), got {text!r}"
            )
    return text


def _first_existing(path: str) -> str:
    """The longest prefix of ``path`` (itself included) that exists."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    return probe


def _out_dir(text: str) -> str:
    """An argparse ``type=``: a folder that exists or can be made (no file in the way)."""
    if not text:
        raise argparse.ArgumentTypeError("expected a folder, got an empty path")
    if os.path.exists(text) and not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"expected a folder, got {text!r}, which is a file")
    found = _first_existing(text)
    if not os.path.isdir(found):
        raise argparse.ArgumentTypeError(
            f"expected a folder that can be made, got {text!r}: {found!r} is a file"
        )
    return text


def _make_out(out: str) -> None:
    """Make the ``--out`` folder and write a probe file in it, so that a folder the
    command cannot write in (no permission, a read-only or virtual file system) is
    refused before a run of minutes, not by the first file after it."""
    import tempfile

    try:
        os.makedirs(out, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as err:
        raise ValueError(f"--out: expected a folder to write in, got {out!r}: {err}") from err


def _text(text: str) -> str:
    """An argparse ``type=``: text that is UTF-8 (a shell passes other bytes as lone
    surrogates, which no file or page can hold)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise argparse.ArgumentTypeError(
            f"expected UTF-8 text, got bytes that are not UTF-8 at character {err.start}"
        ) from None
    return text


def _out_file(text: str) -> str:
    """An argparse ``type=``: a file to write, checked before a run of minutes, not after."""
    if not text:
        raise argparse.ArgumentTypeError("expected a file to write, got ''")
    if text.endswith(("/", os.sep)) or os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"expected a file to write, got {text!r}, a folder")
    parent = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(parent):
        raise argparse.ArgumentTypeError(
            f"expected a file in an existing folder, got {text!r} ({parent!r} is not a folder)"
        )
    # Probed, not os.access: that says yes to any path for root, and knows nothing
    # of read-only or virtual file systems. A new file's folder gets a temporary
    # file (the path itself is not made: it may be a dangling link); an existing
    # regular file is opened to append (its bytes kept). A pipe or a device is
    # not opened: a reader would take the probe's close for the end.
    import tempfile

    try:
        if not os.path.exists(text):
            with tempfile.TemporaryFile(dir=parent):
                pass
        elif os.path.isfile(text):
            with open(text, "a"):
                pass
        elif not os.access(text, os.W_OK):
            raise PermissionError(13, "Permission denied")
    except OSError as err:
        raise argparse.ArgumentTypeError(
            f"expected a file that can be written, got {text!r}: {err.strerror}"
        ) from None
    return text


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
    from .ops import BACKENDS

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
    backends = [b for b in BACKENDS if b != "auto"]
    print(f"{'graph':<14} {'edges':>6} " + " ".join(f"{b:>9}" for b in backends))
    worst = 0.0
    with torch.no_grad():
        for name, ei in graphs.items():
            mask = edge_index_to_mask(ei, t)
            ref = dense_self_attention(layer, x, mask)
            cells = []
            for backend in backends:
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

    if args.embed_dim % args.heads:
        raise ValueError(
            f"--heads: expected a divisor of --embed-dim {args.embed_dim}, got {args.heads}"
        )
    res = compare(
        tokens=args.tokens,
        embed_dim=args.embed_dim,
        num_heads=args.heads,
        # A repeated --dtype is one run, as a repeated --suite of bench.
        dtypes=tuple(dict.fromkeys(args.dtype))
        if args.dtype
        else ("float32", "float16", "bfloat16"),
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
    if len(tokens) > DEMO_MAX_TOKENS:
        print(
            f"--text has {len(tokens)} tokens; the demo takes the first {DEMO_MAX_TOKENS} "
            f"(its maximum: the heatmap and the page show all T^2 edges)"
        )
        tokens = tokens[:DEMO_MAX_TOKENS]
    out = args.out
    _make_out(out)
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

    with torch.no_grad():
        _, (ei, alpha) = layer(x, complete_graph(t), return_attention_weights=True)
        _, (cei, calpha) = layer(x, causal_graph(t), return_attention_weights=True)
    # Each arrow costs matplotlib milliseconds (its path is clipped to the node
    # circles on every draw) and T^2 of them are unreadable anyway: past
    # DEMO_DRAW_ALL tokens the graph drawings keep each target's heaviest edges,
    # so their time grows with T, not T^2. The heatmap and the page keep every edge.
    top_k = None if t <= DEMO_DRAW_ALL else DEMO_DRAW_TOP_K
    if top_k is not None:
        print(
            f"\nthe graph drawings show each token's {top_k} heaviest incoming edges "
            f"(more than {DEMO_DRAW_ALL} tokens); heatmap.png and explorer.html show all {t * t}"
        )
    figs = [
        (
            "attention_graph.png",
            draw_attention(ei, alpha, tokens=tokens, head=0, top_k=top_k).figure,
        ),
        ("heatmap.png", draw_heatmap(ei, alpha, tokens=tokens, head=0).figure),
        ("causal_dag.png", draw_attention(cei, calpha, tokens=tokens, head=0, top_k=top_k).figure),
        ("side_by_side.png", draw_side_by_side(ei, alpha, tokens=tokens, head=0, top_k=top_k)),
    ]
    print()
    for name, fig in figs:
        path = os.path.join(out, name)
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        print(f"wrote {path}")
    # The same weights, every head, in a page to explore; with the scores, so
    # that hovering an edge shows q.k as well as alpha.
    scores = (q[ei[1]] * k[ei[0]]).sum(-1) * layer.scale  # (E, H)
    title = f"gnnattn demo: {' '.join(tokens)}"
    page = explore((ei, alpha), tokens=tokens, scores=scores, title=title)
    path = os.path.join(out, "explorer.html")
    page.save(path)
    print(f"wrote {path} (open it in a browser: hover the edges, click a token)")
    return 0 if res.ok else 1


def _read_graph(path: str) -> tuple[Any, int | None]:
    """``(edge_index, num_nodes)`` from a ``torch.save`` file: a ``[2, E]`` integer tensor,
    or a dict with ``"edge_index"`` and optionally ``"num_nodes"``."""
    import torch

    try:
        data = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as err:  # pickle, zip and I/O errors alike: not a torch.save file
        raise ValueError(
            f"could not read {path!r} as a torch.save file: {type(err).__name__}: {err}"
        ) from None
    num_nodes = None
    if isinstance(data, dict):
        if "edge_index" not in data:
            raise ValueError(
                f"expected a dict with 'edge_index' in {path!r}, got keys {list(data)}"
            )
        num_nodes = data.get("num_nodes")
        if num_nodes is not None and (
            isinstance(num_nodes, bool) or not isinstance(num_nodes, int)
        ):
            raise ValueError(f"expected 'num_nodes' an int in {path!r}, got {num_nodes!r}")
        data = data["edge_index"]
    if not isinstance(data, torch.Tensor):
        raise ValueError(
            f"expected a [2, E] edge_index tensor (or a dict holding one) in {path!r}, "
            f"got {type(data).__name__}"
        )
    integer = not (data.is_floating_point() or data.is_complex() or data.dtype == torch.bool)
    if data.dim() != 2 or data.shape[0] != 2 or not integer:
        raise ValueError(
            f"expected an integer edge_index of shape [2, E] in {path!r}, "
            f"got {data.dtype} of shape {list(data.shape)}"
        )
    return data.long(), num_nodes


def _cmd_partition(args: argparse.Namespace) -> int:
    import time

    import torch

    from ._progress import bar, ticking, write
    from .distributed import partition
    from .graphs import AttentionGraph

    n_parts = args.parts
    # One step per phase (read, check and index, split, statistics) and per part
    # file; the split is most of the time (METIS at 1M nodes: minutes), so the bar
    # shows the time spent, not a time left.
    with bar(4 + n_parts, "reading the graph", eta=False) as progress:
        edge_index, num_nodes = _read_graph(args.graph)
        progress.update()
        t0 = time.perf_counter()
        progress.set_description("checking and indexing the graph")
        graph = AttentionGraph(edge_index, num_nodes, causal=args.causal)
        _make_out(args.out)  # once the graph is taken, before a split of minutes
        progress.update()
        progress.set_description(f"{args.method}: splitting into {n_parts} parts")
        try:
            with ticking(progress):
                part = partition(graph, n_parts, method=args.method, seed=args.seed)
        except ImportError as err:  # METIS without pymetis
            raise ValueError(str(err)) from None
        progress.update()
        seconds = time.perf_counter() - t0
        graph = part.graph
        write(
            f"{args.graph}: N={graph.num_dst:,} targets, {graph.num_edges:,} edges"
            + (" (causal)" if graph.is_causal else "")
            + f"; {args.method} into {n_parts} parts in {seconds:.1f} s"
        )
        paths = []
        for r in range(n_parts):
            progress.set_description(f"writing part {r + 1} of {n_parts}")
            paths.append(part.save_part(args.out, r))
            progress.update()
        progress.set_description("counting halo rows")
        src, dst = graph.edge_index
        targets = torch.bincount(part.owner, minlength=n_parts)
        edges = torch.bincount(part.owner[dst], minlength=n_parts)
        remote = part.src_owner[src] != part.owner[dst]
        key = torch.unique(part.owner[dst[remote]] * graph.num_src + src[remote])
        halo = torch.bincount(key // graph.num_src, minlength=n_parts)
        progress.update()
        progress.set_description("partition")
    for r, path in enumerate(paths):
        print(
            f"rank {r}: {int(targets[r]):,} targets, {int(halo[r]):,} halo rows, "
            f"{int(edges[r]):,} edges -> {path}"
        )
    print(f"halo rows / owned rows: {100 * part.halo_fraction():.1f}%")
    return 0


def _warmup_steps(device: str) -> list[tuple[str, Callable[[], None]]]:
    """What ``gnnattn warmup`` runs: a forward and backward of each kind of call a model
    makes, float32, on a small sparse graph (each compiles its own kernels)."""
    import torch

    from . import GPSConv, SelfAttentionConv, TransformerConv, scatter_softmax
    from .nn import GraphTransformerLayer

    g = torch.Generator().manual_seed(0)
    n, d, heads = 64, 16, 2
    ei = torch.randint(0, n, (2, 8 * n), generator=g).unique(dim=1).to(device)
    e = ei.shape[1]
    x = torch.randn(n, d, generator=g).to(device)
    ea = torch.randn(e, 4, generator=g).to(device)

    def step(module: torch.nn.Module, *args: Any, train: bool, **kwargs: Any) -> None:
        module = module.to(device).train(train)
        out = module(*args, **kwargs)
        out = out[0] if isinstance(out, tuple) else out
        out.sum().backward()

    # A graph as sparse as a batch of molecules (2 edges per target): TransformerConv's
    # edge term goes to the kernels per edge and head there, kernels of their own.
    few, few_ea = ei[:, : 2 * n], ea[: 2 * n]
    sizes = torch.tensor([n // 2, n // 4, n // 4 - 1, 1])
    batch = torch.repeat_interleave(torch.arange(4), sizes).to(device)  # (N,)

    def edge_step(module: torch.nn.Module, train: bool, sparse: bool = False) -> None:
        # Edge features as data, and as the output of an edge encoder (their
        # gradient is a kernel of its own).
        edges, attr = (few, few_ea) if sparse else (ei, ea)
        step(module, x, edges, attr, train=train)
        step(module, x, edges, attr.clone().requires_grad_(), train=train)

    def softmax() -> None:
        # Large enough for the kernel (small inputs take torch's path).
        src = torch.randn(1 << 16, 2, generator=g).to(device).requires_grad_()
        index = torch.arange(1 << 16, device=device) // 16
        scatter_softmax(src, index).sum().backward()

    return [
        ("attention", lambda: step(SelfAttentionConv(d, heads), x, ei, train=False)),
        (
            "attention weights",
            lambda: step(
                SelfAttentionConv(d, heads), x, ei, train=False, return_attention_weights=True
            ),
        ),
        (
            "attention dropout",
            lambda: step(SelfAttentionConv(d, heads, dropout=0.1), x, ei, train=True),
        ),
        (
            "score bias",
            lambda: step(SelfAttentionConv(d, heads, edge_dim=4), x, ei, ea, train=False),
        ),
        (
            "score bias, dropout",
            lambda: step(
                SelfAttentionConv(d, heads, dropout=0.1, edge_dim=4), x, ei, ea, train=True
            ),
        ),
        (
            "edge values",
            lambda: edge_step(SelfAttentionConv(d, heads, edge_dim=4, edge_value=True), False),
        ),
        (
            "edge values, dropout",
            lambda: edge_step(
                SelfAttentionConv(d, heads, dropout=0.1, edge_dim=4, edge_value=True), True
            ),
        ),
        ("edge features", lambda: edge_step(TransformerConv(d, 8, heads, edge_dim=4), False)),
        (
            "edge features, dropout",
            lambda: edge_step(TransformerConv(d, 8, heads, dropout=0.1, edge_dim=4), True),
        ),
        (
            "edge features, small graphs",
            lambda: edge_step(TransformerConv(d, 8, heads, edge_dim=4), False, sparse=True),
        ),
        (
            "edge features, small graphs, dropout",
            lambda: edge_step(
                TransformerConv(d, 8, heads, dropout=0.1, edge_dim=4), True, sparse=True
            ),
        ),
        (
            "cross-attention",
            lambda: step(SelfAttentionConv(d, heads), (x, x[: n // 2]), ei % (n // 2), train=False),
        ),
        ("segment softmax", softmax),
        (
            # Graphs of different sizes, complete within each: the block kernel.
            "global attention over a batch of graphs",
            lambda: step(GPSConv(d, None, heads=heads), x, ei, batch, train=True),
        ),
        (
            "activation dropout",
            lambda: step(GraphTransformerLayer(d, heads, dropout=0.1), x, ei, train=True),
        ),
    ]


def _cmd_warmup(args: argparse.Namespace) -> int:
    import logging
    import time

    import torch

    from ._progress import bar, write
    from .kernels import COMPILED

    device = torch.device(args.device)
    if device.type not in COMPILED:
        package = "numba" if device.type == "cpu" else "triton"
        print(f"no compiled kernels for {device.type} ({package} is not installed): nothing to do")
        return 0
    counter: Any = None
    where = "Triton's cache (TRITON_CACHE_DIR, default ~/.triton/cache)"
    if device.type == "cpu":
        from .kernels.cpu import _cache as counter

        where = counter.cache_dir()
    before = counter.compiles if counter is not None else 0
    steps = _warmup_steps(str(device))
    # The first-compile notice would repeat what this command says.
    notice = logging.getLogger("gnnattn.kernels")
    level = notice.level
    notice.setLevel(logging.ERROR)
    t0 = time.perf_counter()
    try:
        with bar(len(steps), "gnnattn warmup", unit="call") as progress:
            write(f"compiling the {device.type} kernels (float32) into {where}")
            for name, run in steps:
                progress.set_postfix_str(name)
                run()
                progress.update()
    finally:
        notice.setLevel(level)
    seconds = time.perf_counter() - t0
    if counter is None:
        print(f"ran {len(steps)} calls in {seconds:.1f} s; compiled kernels are in {where}")
    elif counter.compiles > before:
        print(
            f"compiled {counter.compiles - before} kernels in {seconds:.1f} s; later runs "
            f"load them from {where}"
        )
    else:
        print(f"every kernel was compiled already ({seconds:.1f} s): {where}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="gnnattn", description="Transformer self-attention as message passing over a graph."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_add_check, _add_bench, _add_compare, _add_demo, _add_partition, _add_warmup):
        add(sub)
    return parser


def _add_check(sub: Any) -> None:
    check = sub.add_parser(
        "check", help="print graph-vs-dense agreement of every backend on small graphs"
    )
    check.add_argument(
        "--tokens",
        type=_int_in(1, CHECK_MAX_TOKENS),
        default=12,
        help=f"sequence length T, 1 to {CHECK_MAX_TOKENS} (default 12)",
    )
    check.add_argument("--seed", type=_SEED, default=0, help="random seed (default 0)")
    check.set_defaults(func=_cmd_check)


def _add_bench(sub: Any) -> None:
    bench = sub.add_parser(
        "bench",
        help="time gnnattn's backends against MultiheadAttention, SDPA, FlexAttention and PyG",
    )
    bench.add_argument("--device", type=_device, default="cpu", help="cpu or cuda (default cpu)")
    bench.add_argument(
        "--quick",
        action="store_true",
        help="smoke-test sizes: checks that every candidate runs (exit status 1 if one "
        "stopped by an error); its timings mean nothing",
    )
    bench.add_argument(
        "--threads",
        type=_int_in(1, 1024),
        default=2,
        help="torch (and numba) CPU threads, at least 1 (default 2)",
    )
    bench.add_argument(
        "--suite",
        action="append",
        choices=_suites(),
        help=f"run only this suite (repeatable; default: every suite but {_flagged_suites()}): "
        + "; ".join(f"{name}: {text}" for name, text in _suite_help()),
    )
    bench.add_argument(
        "--scale",
        action="store_true",
        help="also run the scale suite, beside the default suites or those named with --suite "
        "(N = 1M nodes: minutes, about 6 GB); not with --quick",
    )
    bench.add_argument(
        "--json", metavar="PATH", type=_out_file, help="also write every result to PATH"
    )
    bench.add_argument(
        "--reps",
        type=_int_in(1, 10_000),
        default=None,
        help="fixed number of timed repetitions per case and mode, at least 1, the scale and "
        "distributed suites' included (default: as many as fit each case's time budget; "
        "a fixed few in scale and distributed)",
    )
    bench.add_argument(
        "--no-memory", action="store_true", help="skip the peak-memory call of each candidate"
    )
    bench.set_defaults(func=_cmd_bench)


def _add_compare(sub: Any) -> None:
    cmp = sub.add_parser(
        "compare",
        help="parity table: graph backends vs MultiheadAttention, SDPA, FlexAttention per dtype",
    )
    cmp.add_argument(
        "--tokens",
        type=_int_in(1, COMPARE_MAX),
        default=12,
        help=f"sequence length T, 1 to {COMPARE_MAX} (default 12)",
    )
    cmp.add_argument(
        "--embed-dim",
        type=_int_in(1, COMPARE_MAX),
        default=16,
        help=f"embedding width, 1 to {COMPARE_MAX} (default 16)",
    )
    cmp.add_argument(
        "--heads",
        type=_int_in(1, COMPARE_MAX),
        default=4,
        help="attention heads, dividing --embed-dim (default 4)",
    )
    cmp.add_argument(
        "--dtype",
        action="append",
        choices=["float32", "float16", "bfloat16"],
        help="repeatable (default: all three)",
    )
    cmp.add_argument(
        "--causal", choices=["both", "yes", "no"], default="both", help="masking (default both)"
    )
    cmp.add_argument(
        "--reps", type=_int_in(1, 1000), default=3, help="timed calls per run (default 3)"
    )
    cmp.add_argument("--seed", type=_SEED, default=0, help="random seed (default 0)")
    cmp.add_argument("--device", type=_device, default="cpu", help="cpu or cuda (default cpu)")
    cmp.set_defaults(func=_cmd_compare)


def _add_demo(sub: Any) -> None:
    demo = sub.add_parser(
        "demo",
        help="attention on a sentence: parity table, step-by-step softmax, PNGs, explorer page",
    )
    demo.add_argument(
        "--text",
        type=_text,
        default="The bank of the river",
        help=f"the sentence; words past the first {DEMO_MAX_TOKENS} are dropped, saying so "
        "(default %(default)r)",
    )
    demo.add_argument(
        "--out",
        type=_out_dir,
        default=DEMO_OUT,
        help="folder for the PNGs and the page, made if missing; files of an earlier run "
        "are replaced (default %(default)s/)",
    )
    demo.add_argument("--seed", type=_SEED, default=0, help="seed of the layer (default 0)")
    demo.set_defaults(func=_cmd_demo)


def _in_file(text: str) -> str:
    """An argparse ``type=``: a file that exists."""
    if not os.path.isfile(text):
        what = "a folder" if os.path.isdir(text) else "not there"
        raise argparse.ArgumentTypeError(f"expected a graph file, got {text!r} ({what})")
    return text


def _add_partition(sub: Any) -> None:
    part = sub.add_parser(
        "partition",
        help="split a graph over P ranks once and write one file per rank (GraphPart.load)",
        description="Reads GRAPH, a torch.save file of a [2, E] integer edge_index (source "
        "row 0, target row 1) or of a dict {'edge_index': ..., 'num_nodes': N} (N optional: "
        "else the largest id + 1), splits it by target and writes part-R-of-P.pt for each "
        "rank R into --out; each rank then reads only its own file with "
        "gnnattn.distributed.GraphPart.load.",
    )
    part.add_argument("graph", type=_in_file, help="the graph file (torch.save)")
    part.add_argument("--parts", type=_int_in(1, 1 << 16), required=True, help="P, the ranks")
    part.add_argument(
        "--method", choices=METHODS, default="metis", help="how to split (default metis)"
    )
    part.add_argument("--causal", action="store_true", help="keep only the edges j <= i")
    part.add_argument(
        "--seed", type=_PARTITION_SEED, default=0, help="seeds METIS and random (default 0)"
    )
    part.add_argument(
        "--out", type=_out_dir, required=True, help="folder for the part files, made if missing"
    )
    part.set_defaults(func=_cmd_partition)


def _add_warmup(sub: Any) -> None:
    warm = sub.add_parser(
        "warmup",
        help="compile the kernels ahead (numba on the CPU: once per environment), for a "
        "first epoch without the wait",
        description="Runs a forward and backward of each kind of attention call on a small "
        "graph, so that the kernels a model needs are compiled and cached now (numba's "
        "cache: NUMBA_CACHE_DIR, else __pycache__ beside the kernels) instead of during a "
        "first epoch; useful in a container build or a CI setup step.",
    )
    warm.add_argument("--device", type=_device, default="cpu", help="cpu or cuda (default cpu)")
    warm.set_defaults(func=_cmd_warmup)


def _suites() -> tuple[str, ...]:
    from .bench import SUITES

    return SUITES


def _flagged_suites() -> str:
    """The suites a run without ``--suite`` leaves out (they run only when asked for), in
    words: ``"compile, scale and distributed"``."""
    from .bench.suites import REGISTRY

    names = [s.name for s in REGISTRY if s.flag is not None]
    return " and ".join([", ".join(names[:-1]), names[-1]]) if len(names) > 1 else names[0]


def _suite_help() -> list[tuple[str, str]]:
    from .bench.suites import REGISTRY

    return [(s.name, s.help) for s in REGISTRY]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``gnnattn`` command with ``argv``; returns the exit status (2: a user error)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as done:  # --help, or a parse error already printed on one line
        return done.code if isinstance(done.code, int) else 2
    try:
        return int(args.func(args))
    except (ValueError, OSError) as err:  # OSError: a write that failed (a full disk)
        message = (str(err).strip().splitlines() or [type(err).__name__])[0]
        print(f"gnnattn {args.command}: {message}", file=sys.stderr)
        return 2
    except MemoryError as err:  # a graph too large for this machine (its largest node id)
        detail = (str(err).strip().splitlines() or ["MemoryError"])[0].rstrip(".")
        print(
            f"gnnattn {args.command}: out of memory ({detail}): is the input as large as its "
            "node ids and sizes say?",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
