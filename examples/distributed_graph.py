"""One graph across many processes: node classification with the graph split over torchrun ranks.

The graph is the k-nearest-neighbour graph of random points in the unit cube;
a node's class is the octant it lies in (8 classes), its features are its
coordinates plus Gaussian noise and a few channels of pure noise, so a node
alone is often ambiguous near an octant's walls and its neighbours' features
help (attention over the kNN edges). Half the nodes, drawn at random, are
labelled for training; the rest are the validation set.

Every rank makes the same graph from --seed and splits it with
``gnnattn.distributed.partition`` (METIS by default) into P parts, keeping its
own: its targets, their incoming edges, and the halo rows the layers exchange
with the other ranks. The model's parameters are replicated; each rank's loss
is its labelled targets' share of the whole graph's mean cross-entropy, and
``all_reduce_gradients`` sums the gradients, so P ranks take the steps one
process takes on the whole graph (up to the order of float32 sums). Gloo on
CPUs. Launch with torchrun:

    # one machine, 2 processes
    torchrun --standalone --nproc_per_node 2 examples/distributed_graph.py --quick

    # several machines (see docs/distributed.md): on each
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --nnodes 2 --nproc_per_node 2 \\
        --rdzv-backend c10d --rdzv-endpoint HOST:29500 --rdzv-id RUN --max-restarts 3 \\
        examples/distributed_graph.py --resume --out SHARED_DIR

Rank 0 prints the loss of every step and a last line ``RESULT {...}`` (losses,
accuracies, every rank's parameter digest). Every --ckpt-every steps rank 0
writes ``distributed_graph_ckpt.pt`` in --out atomically: model, optimizer,
step and the losses so far, nothing per rank (no step draws random numbers),
so ``--resume`` continues it on any number of ranks, e.g. a run of 2 ranks on
1; under ``torchrun --max-restarts N`` a crashed rank restarts the group from
it. A checkpoint of another graph or model is refused.

Every rank builds the whole graph (seconds at the default size) rather than
rank 0 partitioning it and saving the parts (``Partition.save``, then
``GraphPart.load``): the machines then share nothing but the checkpoint folder,
and no part file can be stale. For a graph too large for one machine, save the
parts once and load them instead.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from common import (  # examples/common.py, next to this file
    fail_once,
    init_distributed,
    load_field,
    param_digest,
    parse_training_args,
    resume_on_every_rank,
    save_checkpoint,
    training_parser,
)
from scipy.spatial import cKDTree

import gnnattn
from gnnattn.distributed import (
    METHODS,
    GraphPart,
    all_reduce_gradients,
    broadcast_parameters,
    partition,
)

CKPT_NAME = "distributed_graph_ckpt.pt"  # in --out; always the latest (written by rank 0)
CKPT_FIELDS = {
    "losses": (
        lambda v: isinstance(v, list) and all(isinstance(x, float) for x in v),
        "a list of floats, the loss of every step so far",
    )
}
NOISE = 0.15  # the standard deviation of the noise on the coordinates
NOISE_CHANNELS = 5  # features that are noise only
CLASSES = 8  # octants


def make_graph(nodes: int, k: int, seed: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The kNN graph (each node attends to its k nearest points, itself included) and
    ``[features, labels, train mask]`` of every node, the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    pos = torch.rand(nodes, 3, generator=g, dtype=torch.float64)
    _, nbr = cKDTree(pos.numpy()).query(pos.numpy(), k=k)  # (N, k) exact, deterministic
    edge_index = torch.stack(
        [torch.as_tensor(nbr).reshape(-1), torch.arange(nodes).repeat_interleave(k)]
    )
    labels = ((pos > 0.5).long() * torch.tensor([1, 2, 4])).sum(1)  # the octant, 0..7
    noisy = pos - 0.5 + NOISE * torch.randn(nodes, 3, generator=g, dtype=torch.float64)
    features = torch.cat([noisy, torch.randn(nodes, NOISE_CHANNELS, generator=g)], 1).float()
    train = torch.rand(nodes, generator=g) < 0.5
    return edge_index, [features, labels, train]


def my_part(edge_index: torch.Tensor, nodes: int, method: str, seed: int) -> GraphPart:
    """This rank's part; checks that every rank split the graph alike (METIS is
    deterministic for a given seed, but a rank on another version might not be)."""
    split = partition(edge_index, dist.get_world_size(), method=method, num_nodes=nodes, seed=seed)
    digest = hashlib.sha256(split.owner.numpy().tobytes()).hexdigest()
    digests: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(digests, digest)
    if len(set(digests)) != 1:
        raise RuntimeError(f"The ranks split the graph differently ({method!r}): {digests}")
    return split.part(dist.get_rank())


class NodeClassifier(torch.nn.Module):
    """Linear -> ``gnnattn.GraphTransformer`` over the graph -> Linear to the classes."""

    def __init__(self, in_dim: int, dim: int, heads: int, layers: int) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(in_dim, dim)
        self.body = gnnattn.GraphTransformer(layers, dim, heads, 2 * dim)  # no dropout
        self.head = torch.nn.Linear(dim, CLASSES)

    def forward(self, x: torch.Tensor, graph) -> torch.Tensor:
        return self.head(self.body(self.embed(x), graph))


def train(model, opt, part: GraphPart, data: list[torch.Tensor], args, losses: list[float]):
    """Full-graph steps from ``len(losses) + 1`` to ``args.steps``: each one forward over
    this rank's part; the loss of the step (summed over the ranks) appended to ``losses``."""
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y, train_mask = (part.shard(t) for t in data)
    labelled = int(data[2].sum())  # of the whole graph: the ranks' losses add up to its mean
    for step in range(len(losses) + 1, args.steps + 1):
        t0 = time.perf_counter()
        logits = model(x, part)
        loss = F.cross_entropy(logits[train_mask], y[train_mask], reduction="sum") / labelled
        opt.zero_grad(set_to_none=True)
        loss.backward()  # the halo rows' gradients go back to their ranks here
        all_reduce_gradients(model)  # summed: the gradient of the whole graph's loss
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item())
        if rank == 0:
            print(
                f"step {step}: loss {losses[-1]:.5f} ({time.perf_counter() - t0:.2f} s)", flush=True
            )
        if args.ckpt_every and (step % args.ckpt_every == 0 or step == args.steps) and rank == 0:
            state = {"config": args.config, "step": step, "model": model.state_dict()}
            state |= {"optimizer": opt.state_dict(), "losses": losses}
            save_checkpoint(args.out / CKPT_NAME, state)
        if rank == min(1, world - 1):  # rank 1; rank 0 when it runs alone
            fail_once(args.out, step)  # a test hook (GNNATTN_FAIL_AT_STEP), see common.py


@torch.no_grad()
def accuracy(model, part: GraphPart, data: list[torch.Tensor]) -> dict[str, float]:
    """Training and validation accuracy over the whole graph (counts summed over the ranks)."""
    x, y, train_mask = (part.shard(t) for t in data)
    right = model(x, part).argmax(1) == y
    counts = torch.tensor(
        [right[train_mask].sum(), train_mask.sum(), right[~train_mask].sum(), (~train_mask).sum()],
        dtype=torch.float64,
    )
    dist.all_reduce(counts)
    return {
        "train_accuracy": (counts[0] / counts[1]).item(),
        "val_accuracy": (counts[2] / counts[3]).item(),
    }


def parse_args(argv: list[str] | None = None):
    p = training_parser(__doc__.split("\n")[0], ckpt_name=CKPT_NAME, batch_size=0, sequences=False)
    p.add_argument("--nodes", type=int, default=None, help="N, the points of the graph")
    p.add_argument("--k", type=int, default=None, help="neighbours per node, itself included")
    p.add_argument("--partition", choices=METHODS, default="metis", help="how to split the graph")
    p.add_argument(
        "--timeout",
        type=float,
        default=90.0,
        help="seconds a collective waits for the other ranks before it fails (a dead peer)",
    )
    quick = {"steps": 20, "nodes": 1000, "k": 8, "embed_dim": 16, "layers": 2}
    full = {"steps": 200, "nodes": 200_000, "k": 16, "embed_dim": 64, "layers": 3}
    args = parse_training_args(p, argv, ckpt_name=CKPT_NAME, quick=quick, full=full)
    if not 1 <= args.k <= args.nodes:
        p.error(f"--k: expected 1 to --nodes ({args.nodes}) neighbours, got {args.k}")
    # What shapes the run (not P, nor --partition: they only reorder float32 sums).
    keys = ("nodes", "k", "seed", "embed_dim", "layers", "heads", "lr")
    args.config = {key: getattr(args, key) for key in keys}
    return args


def main(argv: list[str] | None = None) -> dict | None:
    args = parse_args(argv)
    if "RANK" not in os.environ:
        raise SystemExit(
            "distributed_graph.py runs under torchrun, e.g.\n"
            "  torchrun --standalone --nproc_per_node 2 examples/distributed_graph.py --quick"
        )
    # Collectives fail after --timeout instead of waiting 30 minutes for a dead rank.
    init_distributed("gloo", timedelta(seconds=args.timeout), name="distributed_graph")
    rank, world = dist.get_rank(), dist.get_world_size()
    edge_index, data = make_graph(args.nodes, args.k, args.seed)
    part = my_part(edge_index, args.nodes, args.partition, args.seed)
    torch.manual_seed(args.seed)
    model = NodeClassifier(data[0].shape[1], args.embed_dim, args.heads, args.layers)
    broadcast_parameters(model)  # equal already (same seed); made sure of
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    args.out.mkdir(parents=True, exist_ok=True)
    ckpt = resume_on_every_rank(args.resume, CKPT_FIELDS, args.config, model)
    losses: list[float] = []
    if ckpt is not None and ckpt["step"] > args.steps:
        raise SystemExit(
            f"{args.resume} is at step {ckpt['step']}, past --steps {args.steps}: raise "
            "--steps, or start a new run"
        )
    if ckpt is not None:
        load_field(args.resume, "optimizer", lambda: opt.load_state_dict(ckpt["optimizer"]))
        losses = list(ckpt["losses"][: ckpt["step"]])
    start, t0 = len(losses), time.perf_counter()
    train(model, opt, part, data, args, losses)
    seconds = (time.perf_counter() - t0) / max(args.steps - start, 1)
    digests: list[str | None] = [None] * world
    dist.all_gather_object(digests, param_digest(model))
    result = {"world_size": world, "nodes": args.nodes, "edges": edge_index.shape[1]}
    result |= {"partition": args.partition, "halo_rows": part.halo.numel(), "steps": args.steps}
    result |= {"losses": losses, **accuracy(model, part, data), "seconds_per_step": seconds}
    result |= {"digests": digests, "identical": len(set(digests)) == 1}
    if rank == 0:
        print(
            f"{world} processes, {args.nodes} nodes, {args.steps} steps ({seconds:.3f} s each); "
            f"loss {losses[0]:.4f} -> {losses[-1]:.4f}; validation accuracy "
            f"{result['val_accuracy']:.3f}; the same parameters on all ranks: {result['identical']}"
        )
        print("RESULT " + json.dumps(result), flush=True)
    dist.destroy_process_group()
    return result if rank == 0 else None


if __name__ == "__main__":
    main()
