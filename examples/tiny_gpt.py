"""A character-level GPT built from gnnattn layers, trained on Shakespeare's sonnets.

Each training sequence of T characters is a causal graph (edge j -> i iff
j <= i); a mini-batch of B sequences is one block-diagonal graph of B * T
nodes, an ``AttentionGraph.causal(lengths=[T] * B)`` built once and passed to
every step. The model is token embedding + learned positions + a causal
:class:`gnnattn.nn.GraphTransformer` + a linear head. The script trains it,
plots the loss, samples text, and draws the attention DAG of the last layer
over a generated sample.

    python examples/tiny_gpt.py            # about a minute on 2 CPU cores
    python examples/tiny_gpt.py --quick    # under a minute

Outputs (in --out): ``tiny_gpt_loss.png``, ``tiny_gpt_attention.png``,
``tiny_gpt_explorer.html`` (every layer and head, in a browser),
``tiny_gpt.json`` (losses and the sample). The last line printed is
``RESULT {...}`` with the same JSON.

Every --ckpt-every steps (and at the end) the run writes ``tiny_gpt_ckpt.pt``:
model, optimizer, LR schedule, step, the random states of torch and of the
batch sampler, and the loss history (see ``common.py``). An interrupted run
continues with --resume and ends bitwise where the uninterrupted run ends:

    python examples/tiny_gpt.py --resume   # no checkpoint in --out yet: starts fresh
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from common import (  # examples/common.py, next to this file
    NUMBER_FIELD,
    RNG_FIELD,
    check_config,
    fail_once,
    load_field,
    load_model_state,
    parse_training_args,
    read_checkpoint,
    rng_state,
    run_config,
    save_checkpoint,
    set_rng_state,
    training_parser,
)
from torch import Tensor
from tqdm import tqdm

from gnnattn import AttentionGraph
from gnnattn.nn import GraphTransformer, LearnedPositionalEncoding
from gnnattn.viz import draw_attention, explore

DATA = Path(__file__).resolve().parent / "data" / "sonnets.txt"
CKPT_NAME = "tiny_gpt_ckpt.pt"  # in --out; always the latest (replaced atomically)

#: This script's checkpoint fields, beyond those of every checkpoint (``common.COMMON_FIELDS``).
CKPT_FIELDS = {
    "scheduler": (lambda v: isinstance(v, dict), "an LR scheduler state dict"),
    "rng": RNG_FIELD,
    "steps": (
        lambda v: isinstance(v, list) and all(type(s) is int for s in v),
        "a list of step numbers",
    ),
    "losses": (
        lambda v: isinstance(v, list) and all(NUMBER_FIELD[0](x) for x in v),
        "a list of losses",
    ),
    "val": (
        lambda v: (
            isinstance(v, list)
            and all(
                isinstance(p, (list, tuple))
                and len(p) == 2
                and type(p[0]) is int
                and NUMBER_FIELD[0](p[1])
                for p in v
            )
        ),
        "a list of (step, loss) pairs",
    ),
}


def sequences(b: int, t: int, device: torch.device | str | None = None) -> AttentionGraph:
    """``b`` causal sequences of ``t`` tokens as one graph (from the lengths: no edges are
    built, nothing is read back from the device). Build it once per shape."""
    return AttentionGraph.causal(lengths=[t] * b, device=device)


class CharGPT(torch.nn.Module):
    """Token embedding + positions + causal graph transformer + linear head.

    Shapes:
        - **input:** ``idx`` ``[B, T]`` int64 character ids, ``T <= block_size``;
          optional ``graph``: ``sequences(B, T)``, made here when not given
        - **output:** logits ``[B, T, vocab_size]``
    """

    def __init__(
        self,
        vocab_size: int,
        block_size: int,
        embed_dim: int = 64,
        num_heads: int = 4,
        num_layers: int = 2,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.block_size = block_size
        self.tok = torch.nn.Embedding(vocab_size, embed_dim)
        self.pos = LearnedPositionalEncoding(block_size, embed_dim)
        self.blocks = GraphTransformer(
            num_layers, embed_dim, num_heads, 4 * embed_dim, dropout, causal=True, activation="gelu"
        )
        self.head = torch.nn.Linear(embed_dim, vocab_size)

    def forward(
        self, idx: Tensor, graph: AttentionGraph | None = None, *, return_attention_weights=False
    ):
        b, t = idx.shape
        # The graph knows its structure (causal blocks), so every layer runs SDPA on it.
        graph = sequences(b, t, idx.device) if graph is None else graph
        x = self.tok(idx.reshape(b * t))  # (B*T, D): one node per character
        x = self.pos(x, torch.arange(t, device=idx.device).repeat(b))
        res = self.blocks(x, graph, return_attention_weights=return_attention_weights)
        x, weights = res if return_attention_weights else (res, None)
        logits = self.head(x).view(b, t, -1)  # (B, T, V)
        return (logits, weights) if return_attention_weights else logits

    @torch.no_grad()
    def generate(self, idx: Tensor, steps: int, temperature: float = 0.8) -> Tensor:
        """Append ``steps`` sampled characters to ``idx`` ``[1, T0]``."""
        graphs: dict[int, AttentionGraph] = {}  # one per context length
        for _ in range(steps):
            ctx = idx[:, -self.block_size :]
            t = ctx.shape[1]
            if t not in graphs:
                graphs[t] = sequences(1, t, idx.device)
            logits = self(ctx, graphs[t])[:, -1]  # (1, V)
            probs = torch.softmax(logits / temperature, dim=-1)
            idx = torch.cat([idx, torch.multinomial(probs, 1)], dim=1)
        return idx


@dataclass
class Text:
    """The sonnets as character ids: 90% to train on, the rest held out."""

    vocab: list[str]
    train: Tensor
    val: Tensor

    def encode(self, s: str) -> Tensor:
        stoi = {c: i for i, c in enumerate(self.vocab)}
        return torch.tensor([stoi[c] for c in s])

    def decode(self, ids: Tensor) -> str:
        return "".join(self.vocab[i] for i in ids.tolist())


def load_data(path: Path = DATA) -> Text:
    raw = path.read_text(encoding="utf-8")
    text = Text(sorted(set(raw)), torch.empty(0), torch.empty(0))
    data = text.encode(raw)
    split = int(0.9 * data.numel())
    text.train, text.val = data[:split], data[split:]
    return text


def batches(data: Tensor, block: int, batch_size: int, gen: torch.Generator) -> Iterator:
    """Random windows: inputs ``[B, T]`` and next-character targets ``[B, T]``."""
    while True:
        start = torch.randint(0, data.numel() - block - 1, (batch_size,), generator=gen)
        rows = start.view(-1, 1) + torch.arange(block + 1).view(1, -1)  # (B, T+1)
        chunk = data[rows]
        yield chunk[:, :-1], chunk[:, 1:]


def cross_entropy(logits: Tensor, y: Tensor) -> Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


@torch.no_grad()
def evaluate(model: torch.nn.Module, data: Tensor, block: int, n_batches: int, seed: int) -> float:
    """Mean loss over ``n_batches`` fixed batches of 32 windows (the same every call)."""
    model.eval()
    device = next(model.parameters()).device
    it = batches(data, block, 32, torch.Generator().manual_seed(seed))
    graph = sequences(32, block, device)  # one graph for every batch
    total = 0.0
    for _ in range(n_batches):
        x, y = next(it)
        total += cross_entropy(model(x.to(device), graph), y.to(device)).item()
    model.train()
    return total / n_batches


@dataclass
class Run:
    """What a training run continues from: its model, optimizer, schedule, batch sampler
    and history. ``start`` is the last step done (0 for a fresh run)."""

    model: CharGPT
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LRScheduler
    gen: torch.Generator  # draws the batches
    start: int = 0
    steps: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    val: list[tuple[int, float]] = field(default_factory=list)

    def state(self, config: dict, step: int) -> dict:
        """The checkpoint after ``step``."""
        return {
            "config": config,
            "step": step,
            "model": self.model.state_dict(),
            "optimizer": self.opt.state_dict(),
            "scheduler": self.sched.state_dict(),
            "rng": rng_state(self.gen),
            "steps": self.steps,
            "losses": self.losses,
            "val": self.val,
        }

    def resume(self, ckpt: dict, config: dict, path: Path) -> None:
        check_config(ckpt, config, path)
        load_model_state(self.model, ckpt["model"], path)
        load_field(path, "optimizer", lambda: self.opt.load_state_dict(ckpt["optimizer"]))
        load_field(path, "scheduler", lambda: self.sched.load_state_dict(ckpt["scheduler"]))
        # Last: building the model drew from torch's generator.
        load_field(path, "rng", lambda: set_rng_state(ckpt["rng"], self.gen))
        self.start = ckpt["step"]
        self.steps, self.losses, self.val = ckpt["steps"], ckpt["losses"], ckpt["val"]


def train(run: Run, text: Text, args, config: dict) -> float:
    """Steps ``run.start + 1 .. args.steps``, checkpoints included; returns the seconds taken."""
    it = batches(text.train, args.block, args.batch_size, run.gen)
    graph = sequences(args.batch_size, args.block)  # the same graph for every step
    t0 = time.perf_counter()
    bar = tqdm(
        range(run.start + 1, args.steps + 1),
        desc="training",
        initial=run.start,
        total=args.steps,
        mininterval=1.0,
    )
    for step in bar:
        x, y = next(it)
        loss = cross_entropy(run.model(x, graph), y)
        run.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(run.model.parameters(), 1.0)
        run.opt.step()
        run.sched.step()
        run.steps.append(step)
        run.losses.append(loss.item())
        bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
        if step % max(1, args.steps // 5) == 0 or step == args.steps:
            run.val.append(
                (step, evaluate(run.model, text.val, args.block, config["eval_batches"], args.seed))
            )
        if args.ckpt_every and (step % args.ckpt_every == 0 or step == args.steps):
            save_checkpoint(args.out / CKPT_NAME, run.state(config, step))
        fail_once(args.out, step)  # a test hook (GNNATTN_FAIL_AT_STEP), see common.py
    return time.perf_counter() - t0


def shown(chars: str) -> list[str]:
    """One label per character; newline and space made visible."""
    return ["\u23ce" if c == "\n" else "\u2423" if c == " " else c for c in chars]


def plot_losses(run: Run, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(run.steps, run.losses, label="train (batch)", alpha=0.6)
    ax.plot([s for s, _ in run.val], [v for _, v in run.val], "o-", label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats / char)")
    ax.set_title("tiny GPT on the sonnets")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


@torch.no_grad()
def show(model: CharGPT, text: Text, args) -> str:
    """Sample from the model; draw the last layer's attention DAG over the sample's last
    characters (``tiny_gpt_attention.png``: per target its 3 strongest edges, width ~
    alpha, mean over heads) and every layer and head as a page to explore."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    model.eval()
    ids = model.generate(text.encode("Shall I ")[None], args.sample)[0]
    sample = text.decode(ids)
    print(f"--- sample ---\n{sample}\n--------------")
    tail = ids[-min(24, args.block) :]
    _, weights = model(tail[None], return_attention_weights=True)
    title = "last layer's attention over a generated sample (mean over heads, top 3 per target)"
    ax = draw_attention(
        *weights[-1], tokens=shown(text.decode(tail)), top_k=3, edge_labels=False, title=title
    )
    ax.figure.savefig(args.out / "tiny_gpt_attention.png", dpi=110, bbox_inches="tight")
    plt.close(ax.figure)
    block = ids[-args.block :]
    _, weights = model(block[None], return_attention_weights=True)
    page = explore(
        weights,
        tokens=shown(text.decode(block)),
        title="tiny GPT: attention over a generated sample",
    )
    page.save(args.out / "tiny_gpt_explorer.html")
    return sample


def parse_args(argv: list[str] | None = None):
    p = training_parser(__doc__.split("\n")[0], ckpt_name=CKPT_NAME, batch_size=32)
    p.add_argument("--dropout", type=float, default=None)
    p.add_argument("--sample", type=int, default=None, help="characters to generate")
    # The text is small (10 KB): a bigger model, or many more steps, memorizes
    # it (train loss falls below 1 while the held-out sonnets get worse).
    quick = {"steps": 250, "block": 48, "embed_dim": 64, "layers": 2, "dropout": 0.0, "sample": 120}
    full = {"steps": 600, "block": 64, "embed_dim": 64, "layers": 2, "dropout": 0.2, "sample": 400}
    return parse_training_args(p, argv, ckpt_name=CKPT_NAME, quick=quick, full=full)


def build(args, vocab_size: int) -> Run:
    """The model (seeded), its optimizer and LR schedule, and the batch sampler."""
    torch.manual_seed(args.seed)
    model = CharGPT(vocab_size, args.block, args.embed_dim, args.heads, args.layers, args.dropout)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, args.lr, total_steps=args.steps)
    return Run(model, opt, sched, torch.Generator().manual_seed(args.seed))


def start(run: Run, args, config: dict, text: Text) -> None:
    """Continue from the checkpoint of --resume if there is one; else evaluate step 0."""
    ckpt = read_checkpoint(args.resume, CKPT_FIELDS) if args.resume is not None else None
    if ckpt is not None:
        run.resume(ckpt, config, args.resume)
        print(f"resumed from {args.resume} at step {run.start}")
        return
    if args.resume is not None:
        print(f"no checkpoint at {args.resume}: starting fresh")
    run.val = [(0, evaluate(run.model, text.val, args.block, config["eval_batches"], args.seed))]


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    text = load_data()
    run = build(args, len(text.vocab))
    # "steps" is the length of the LR schedule.
    extra = {"dropout": args.dropout, "steps": args.steps, "eval_batches": 4 if args.quick else 10}
    config = run_config(args, text.vocab, **extra)
    start(run, args, config, text)
    print(
        f"vocab {len(text.vocab)} chars, {text.train.numel() + text.val.numel()} chars of "
        f"text; ln(vocab) = {math.log(len(text.vocab)):.3f}; step 0 validation loss "
        f"{run.val[0][1]:.3f}"
    )
    train_s = train(run, text, args, config)
    plot_losses(run, args.out / "tiny_gpt_loss.png")
    sample = show(run.model, text, args)
    result = {
        "loss_start": run.val[0][1],
        "loss_end": run.val[-1][1],
        "loss_curve": run.val,
        "train_loss_first": run.losses[0],
        "train_loss_last": sum(run.losses[-10:]) / len(run.losses[-10:]),
        "steps": args.steps,
        "train_seconds": round(train_s, 2),
        "sample": sample,
    }
    (args.out / "tiny_gpt.json").write_text(json.dumps(result, indent=2))
    print(
        f"validation loss {result['loss_start']:.3f} -> {result['loss_end']:.3f} in "
        f"{args.steps} steps ({train_s:.1f} s); plots in {args.out}/"
    )
    print("RESULT " + json.dumps({k: v for k, v in result.items() if k != "sample"}))
    return result


if __name__ == "__main__":
    main()
