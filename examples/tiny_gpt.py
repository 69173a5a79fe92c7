"""A character-level GPT built from gnnattn layers, trained on Shakespeare's sonnets.

Each training sequence of T characters is a causal graph (edge j -> i iff
j <= i); a mini-batch of B sequences is one block-diagonal graph of B * T
nodes with a PyG-style batch vector. The model is token embedding + learned
positions + a causal :class:`gnnattn.nn.GraphTransformer` + a linear head. The
script trains it, plots the loss, samples text, and draws the attention DAG of
the last layer over a generated sample.

    python examples/tiny_gpt.py            # about a minute on 2 CPU cores
    python examples/tiny_gpt.py --quick    # under a minute

Outputs (in --out): ``tiny_gpt_loss.png``, ``tiny_gpt_attention.png``,
``tiny_gpt_explorer.html`` (every layer and head, in a browser),
``tiny_gpt.json`` (losses and the sample). The last line printed is
``RESULT {...}`` with the same JSON.

Every --ckpt-every steps (and at the end) the run writes ``tiny_gpt_ckpt.pt``:
model, optimizer, LR schedule, step, the random states of torch and of the
batch sampler, and the loss history (see ``checkpoints.py``). An interrupted
run continues with --resume and ends bitwise where the uninterrupted run ends:

    python examples/tiny_gpt.py --resume   # no checkpoint in --out yet: starts fresh
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from checkpoints import (  # examples/checkpoints.py, next to this file
    check_config,
    fail_once,
    load_model_state,
    read_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from torch import Tensor
from tqdm import tqdm

from gnnattn import AttentionGraph
from gnnattn.nn import GraphTransformer, LearnedPositionalEncoding
from gnnattn.viz import explore

DATA = Path(__file__).resolve().parent / "data" / "sonnets.txt"
CKPT_NAME = "tiny_gpt_ckpt.pt"  # in --out; always the latest (replaced atomically)


class CharGPT(torch.nn.Module):
    """Token embedding + positions + causal graph transformer + linear head.

    Shapes:
        - **input:** ``idx`` ``[B, T]`` int64 character ids, ``T <= block_size``
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
            num_layers,
            embed_dim,
            num_heads,
            4 * embed_dim,
            dropout,
            causal=True,
            activation="gelu",
        )
        self.head = torch.nn.Linear(embed_dim, vocab_size)

    def forward(self, idx: Tensor, *, return_attention_weights: bool = False):
        b, t = idx.shape
        batch = torch.arange(b, device=idx.device).repeat_interleave(t)  # (B*T,)
        # One causal graph per sequence; the object knows its structure, so
        # every layer runs SDPA on it without building a single edge.
        graph = AttentionGraph.causal(batch=batch)
        x = self.tok(idx.reshape(b * t))  # (B*T, D): one node per character
        x = self.pos(x, batch=batch)
        res = self.blocks(x, graph, return_attention_weights=return_attention_weights)
        x, weights = res if return_attention_weights else (res, None)
        logits = self.head(x).view(b, t, -1)  # (B, T, V)
        return (logits, weights) if return_attention_weights else logits

    @torch.no_grad()
    def generate(self, idx: Tensor, steps: int, temperature: float = 0.8) -> Tensor:
        """Append ``steps`` sampled characters to ``idx`` ``[1, T0]``."""
        for _ in range(steps):
            logits = self(idx[:, -self.block_size :])[:, -1]  # (1, V)
            probs = torch.softmax(logits / temperature, dim=-1)
            idx = torch.cat([idx, torch.multinomial(probs, 1)], dim=1)
        return idx


def load_text(path: Path = DATA) -> tuple[str, list[str]]:
    text = path.read_text(encoding="utf-8")
    return text, sorted(set(text))


def batches(data: Tensor, block: int, batch_size: int, gen: torch.Generator):
    """Random windows: inputs ``[B, T]`` and next-character targets ``[B, T]``."""
    while True:
        start = torch.randint(0, data.numel() - block - 1, (batch_size,), generator=gen)
        rows = start.view(-1, 1) + torch.arange(block + 1).view(1, -1)  # (B, T+1)
        chunk = data[rows]
        yield chunk[:, :-1], chunk[:, 1:]


@torch.no_grad()
def evaluate(model: CharGPT, data: Tensor, block: int, n_batches: int, seed: int) -> float:
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    it = batches(data, block, 32, gen)
    losses = []
    for _ in range(n_batches):
        x, y = next(it)
        logits = model(x)
        losses.append(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).item())
    model.train()
    return sum(losses) / len(losses)


def shown(chars: str) -> list[str]:
    """One label per character; newline and space made visible."""
    return ["\u23ce" if c == "\n" else "\u2423" if c == " " else c for c in chars]


def draw_attention_dag(chars: str, edge_index: Tensor, alpha: Tensor, path: Path) -> None:
    """The causal attention DAG of one sample: node = character, edge j -> i with
    width ~ alpha_ij (mean over heads); per target only the 3 strongest edges."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from gnnattn.viz import draw_attention

    ax = draw_attention(
        edge_index,
        alpha,
        tokens=shown(chars),
        top_k=3,
        edge_labels=False,
        title="last layer's attention over a generated sample (mean over heads, top 3 per target)",
    )
    ax.figure.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(ax.figure)


def plot_losses(steps: list[int], train: list[float], val: list[tuple[int, float]], path: Path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(steps, train, label="train (batch)", alpha=0.6)
    ax.plot([s for s, _ in val], [v for _, v in val], "o-", label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats / char)")
    ax.set_title("tiny GPT on the sonnets")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="a small run, under a minute")
    p.add_argument("--steps", type=int, default=None, help="training steps")
    p.add_argument("--block", type=int, default=None, help="context length T")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--embed-dim", type=int, default=None)
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--dropout", type=float, default=None)
    p.add_argument("--sample", type=int, default=None, help="characters to generate")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("gnnattn-demo-out"))
    p.add_argument(
        "--ckpt-every",
        type=int,
        default=100,
        help=f"write --out/{CKPT_NAME} every this many steps and at the end (0: never)",
    )
    p.add_argument(
        "--resume",
        type=Path,
        nargs="?",
        const=Path(""),
        default=None,
        help=f"continue from a checkpoint (default: --out/{CKPT_NAME}); none there: start fresh",
    )
    p.add_argument(
        "--fail-at-step",
        type=int,
        default=None,
        help="for tests: exit with status 1 after this step, once (a file in --out records it)",
    )
    a = p.parse_args(argv)
    if a.ckpt_every < 0:
        p.error(f"--ckpt-every: expected a number of steps >= 0, got {a.ckpt_every}")
    if a.resume == Path(""):
        a.resume = a.out / CKPT_NAME
    # The text is small (10 KB): a bigger model, or many more steps, memorizes
    # it (train loss falls below 1 while the held-out sonnets get worse).
    a.steps = a.steps or (250 if a.quick else 600)
    a.block = a.block or (48 if a.quick else 64)
    a.embed_dim = a.embed_dim or 64
    a.layers = a.layers or 2
    a.dropout = (0.0 if a.quick else 0.2) if a.dropout is None else a.dropout
    a.sample = a.sample or (120 if a.quick else 400)
    return a


def build(args: argparse.Namespace, vocab_size: int) -> CharGPT:
    torch.manual_seed(args.seed)
    return CharGPT(vocab_size, args.block, args.embed_dim, args.heads, args.layers, args.dropout)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    text, vocab = load_text()
    stoi = {c: i for i, c in enumerate(vocab)}
    data = torch.tensor([stoi[c] for c in text])
    split = int(0.9 * data.numel())
    train_data, val_data = data[:split], data[split:]
    model = build(args, len(vocab))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, args.lr, total_steps=args.steps)
    n_eval = 4 if args.quick else 10
    gen = torch.Generator().manual_seed(args.seed)
    # Everything that shapes the run: a checkpoint of another run is refused.
    config = {
        "vocab": "".join(vocab),
        "block": args.block,
        "embed_dim": args.embed_dim,
        "layers": args.layers,
        "heads": args.heads,
        "dropout": args.dropout,
        "lr": args.lr,
        "batch_size": args.batch_size,
        "steps": args.steps,  # the length of the LR schedule
        "seed": args.seed,
        "eval_batches": n_eval,
    }
    start, steps, losses, val = 0, [], [], []
    ckpt = None
    if args.resume is not None:
        ckpt = read_checkpoint(args.resume)
        if ckpt is None:
            print(f"no checkpoint at {args.resume}: starting fresh")
    if ckpt is not None:
        check_config(ckpt, config, args.resume)
        load_model_state(model, ckpt["model"], args.resume)
        opt.load_state_dict(ckpt["optimizer"])
        sched.load_state_dict(ckpt["scheduler"])
        # Last: building the model above drew from torch's generator.
        set_rng_state(ckpt["rng"], gen)
        start = ckpt["step"]
        steps, losses, val = ckpt["steps"], ckpt["losses"], ckpt["val"]
        print(f"resumed from {args.resume} at step {start}")
    else:
        val = [(0, evaluate(model, val_data, args.block, n_eval, args.seed))]
    print(
        f"vocab {len(vocab)} chars, {data.numel()} chars of text; ln(vocab) = "
        f"{math.log(len(vocab)):.3f}; step 0 validation loss {val[0][1]:.3f}"
    )
    # The batches depend only on gen's state: restored, they continue where they were.
    it = batches(train_data, args.block, args.batch_size, gen)
    t0 = time.perf_counter()
    bar = tqdm(
        range(start + 1, args.steps + 1),
        desc="training",
        initial=start,
        total=args.steps,
        mininterval=1.0,
    )
    for step in bar:
        x, y = next(it)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        steps.append(step)
        losses.append(loss.item())
        bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
        if step % max(1, args.steps // 5) == 0 or step == args.steps:
            val.append((step, evaluate(model, val_data, args.block, n_eval, args.seed)))
        if args.ckpt_every and (step % args.ckpt_every == 0 or step == args.steps):
            save_checkpoint(
                args.out / CKPT_NAME,
                {
                    "config": config,
                    "step": step,
                    "model": model.state_dict(),
                    "optimizer": opt.state_dict(),
                    "scheduler": sched.state_dict(),
                    "rng": rng_state(gen),
                    "steps": steps,
                    "losses": losses,
                    "val": val,
                },
            )
        fail_once(args.out, step, args.fail_at_step)
    train_s = time.perf_counter() - t0
    plot_losses(steps, losses, val, args.out / "tiny_gpt_loss.png")

    model.eval()
    prompt = torch.tensor([[stoi[c] for c in "Shall I "]])
    sample_ids = model.generate(prompt, args.sample)[0]
    sample = "".join(vocab[i] for i in sample_ids.tolist())
    print("--- sample ---")
    print(sample)
    print("--------------")
    # The attention DAG of the last layer over the sample's last characters.
    tail = sample_ids[-min(24, args.block) :].view(1, -1)
    with torch.no_grad():
        _, weights = model(tail, return_attention_weights=True)
    edge_index, alpha = weights[-1]
    draw_attention_dag(
        "".join(vocab[i] for i in tail[0].tolist()),
        edge_index,
        alpha,
        args.out / "tiny_gpt_attention.png",
    )
    # Every layer and head over the sample's last block, as a page to explore.
    block = sample_ids[-args.block :].view(1, -1)
    with torch.no_grad():
        _, weights = model(block, return_attention_weights=True)
    explore(
        weights,
        tokens=shown("".join(vocab[i] for i in block[0].tolist())),
        title="tiny GPT: attention over a generated sample",
    ).save(args.out / "tiny_gpt_explorer.html")

    result = {
        "loss_start": val[0][1],
        "loss_end": val[-1][1],
        "loss_curve": val,
        "train_loss_first": losses[0],
        "train_loss_last": sum(losses[-10:]) / len(losses[-10:]),
        "steps": args.steps,
        "train_seconds": round(train_s, 2),
        "sample": sample,
    }
    (args.out / "tiny_gpt.json").write_text(json.dumps(result, indent=2))
    print(
        f"validation loss {result['loss_start']:.3f} -> {result['loss_end']:.3f} "
        f"in {args.steps} steps ({train_s:.1f} s); plots in {args.out}/"
    )
    print("RESULT " + json.dumps({k: v for k, v in result.items() if k != "sample"}))
    return result


if __name__ == "__main__":
    main()
