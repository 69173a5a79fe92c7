"""The tiny GPT trained data-parallel: torch.distributed DistributedDataParallel.

Every process holds a replica of the model of ``tiny_gpt.py``; each draws its
own random windows of the text, gradients are averaged across processes after
every backward, so all replicas stay identical. The gloo backend runs on CPUs,
NCCL where every process has a GPU. Launch with torchrun:

    # one machine, 2 processes (CPU)
    torchrun --standalone --nproc_per_node 2 examples/ddp_train.py --quick

    # several machines, surviving the loss of one (see docs/distributed.md): on each
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --nnodes 2 --nproc_per_node 2 \\
        --rdzv-backend c10d --rdzv-endpoint HOST:29500 --rdzv-id RUN --max-restarts 3 \\
        examples/ddp_train.py --resume --out SHARED_DIR

Each rank writes its final parameters to ``ddp_rank{RANK}.pt`` in --out (the
test suite checks that they are identical); rank 0 prints the loss and a last
line ``RESULT {...}``.

Surviving faults: every --ckpt-every steps rank 0 writes ``ddp_ckpt.pt`` in
--out (model, optimizer, step, and the random states of every rank, gathered),
atomically. With --resume every rank continues from it (rank 0 reads it and
sends it to the others). Under ``torchrun --max-restarts N`` a rank that dies
makes torchrun restart the whole group, which resumes from the last
checkpoint:

    torchrun --standalone --nproc_per_node 2 --max-restarts 3 \\
        examples/ddp_train.py --quick --resume

The resumed run is bitwise the uninterrupted one on 2 gloo ranks (the tests
check it). With more ranks it may differ in the last bits: the first step after
a resume reduces gradients in DDP's initial buckets, not the rebuilt ones, and
a ring all-reduce over 3 or more ranks sums in an order that depends on them.
"""

from __future__ import annotations

import json
import math
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from common import (  # examples/common.py, next to this file
    NUMBER_FIELD,
    RNG_PER_RANK_FIELD,
    fail_once,
    init_distributed,
    param_digest,
    parse_training_args,
    resume_on_every_rank,
    rng_state,
    run_config,
    save_checkpoint,
    set_rng_state,
    training_parser,
)
from tiny_gpt import CharGPT, batches, cross_entropy, evaluate, load_data, sequences
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

CKPT_NAME = "ddp_ckpt.pt"  # in --out; always the latest (replaced atomically by rank 0)
#: This script's checkpoint fields, beyond those of every checkpoint (``common.COMMON_FIELDS``).
CKPT_FIELDS = {"rng": RNG_PER_RANK_FIELD, "loss_start": NUMBER_FIELD}


def save(args, step: int, model: torch.nn.Module, opt, gen: torch.Generator, extra: dict) -> None:
    """Rank 0 writes the checkpoint after ``step``, with every rank's random states.

    One file holds them all, so a checkpoint is whole or absent: never rank 0 at
    one step and rank 1 at another. Every rank must call this (a collective).
    """
    rngs: list[dict | None] = [None] * dist.get_world_size()
    dist.all_gather_object(rngs, rng_state(gen))
    if dist.get_rank() == 0:
        state = {
            "config": extra["config"],
            "step": step,
            "model": {k: v.cpu() for k, v in model.state_dict().items()},
            "optimizer": opt.state_dict(),
            "rng": rngs,
            "loss_start": extra["loss_start"],
        }
        save_checkpoint(args.out / CKPT_NAME, state)


def train(
    model: torch.nn.Module, train_data: torch.Tensor, args, ckpt: dict | None, extra: dict
) -> float:
    """Train ``model`` in place under DistributedDataParallel; returns the seconds taken.

    Continues from ``ckpt`` (the model's weights already loaded) if given; saves a
    checkpoint with ``extra`` in it every ``args.ckpt_every`` steps. The DDP wrapper
    is local to this function, so it is freed on return.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    device = next(model.parameters()).device
    ddp = DistributedDataParallel(
        model, device_ids=None if device.type == "cpu" else [device.index]
    )
    opt = torch.optim.AdamW(ddp.parameters(), lr=args.lr, weight_decay=0.01)
    # Each rank samples its own windows: data parallelism.
    gen = torch.Generator().manual_seed(1000 + rank)
    start = 0
    if ckpt is not None:
        opt.load_state_dict(ckpt["optimizer"])
        set_rng_state(ckpt["rng"][rank], gen)  # this rank's own batches continue
        start = ckpt["step"]
    it = batches(train_data, args.block, args.batch_size, gen)
    graph = sequences(args.batch_size, args.block, device)  # the same graph for every step
    t0 = time.perf_counter()
    bar = tqdm(
        range(start + 1, args.steps + 1),
        desc=f"rank {rank}/{world}",
        initial=start,
        total=args.steps,
        disable=rank != 0,
        mininterval=1.0,
    )
    for step in bar:
        x, y = next(it)
        loss = cross_entropy(ddp(x.to(device), graph), y.to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()  # gradients all-reduced (averaged) across ranks here
        opt.step()
        avg = loss.detach().clone()
        dist.all_reduce(avg)
        bar.set_postfix(loss=f"{avg.item() / world:.3f}", refresh=False)
        if args.ckpt_every and (step % args.ckpt_every == 0 or step == args.steps):
            save(args, step, model, opt, gen, extra)
        if rank == min(1, world - 1):  # rank 1; rank 0 when it runs alone
            fail_once(args.out, step)  # a test hook (GNNATTN_FAIL_AT_STEP), see common.py
    bar.close()
    return time.perf_counter() - t0


def report(model: torch.nn.Module, val_data: torch.Tensor, args, loss_start: float, seconds: float):
    """Every rank's parameter digest to rank 0, which evaluates and prints ``RESULT``."""
    rank, world = dist.get_rank(), dist.get_world_size()
    digests: list[str | None] = [None] * world
    dist.all_gather_object(digests, param_digest(model))  # the last collective
    if rank != 0:
        return None
    loss_end = evaluate(model, val_data, args.block, 2, args.seed)
    same = len(set(digests)) == 1
    print(
        f"{world} processes, {args.steps} steps in {seconds:.1f} s; validation loss "
        f"{loss_start:.3f} -> {loss_end:.3f}; parameters identical on all ranks: {same}"
    )
    result = {
        "world_size": world,
        "steps": args.steps,
        "loss_start": loss_start,
        "loss_end": loss_end,
        "digests": digests,
        "identical": same,
    }
    print("RESULT " + json.dumps(result), flush=True)
    return result


def parse_args(argv: list[str] | None = None):
    p = training_parser(__doc__.split("\n")[0], ckpt_name=CKPT_NAME, batch_size=16)
    p.add_argument(
        "--timeout",
        type=float,
        default=90.0,
        help="seconds a collective waits for the other ranks before it fails (a dead peer)",
    )
    quick = {"steps": 60, "block": 32, "embed_dim": 32, "layers": 2}
    full = {"steps": 2000, "block": 96, "embed_dim": 128, "layers": 4}
    return parse_training_args(p, argv, ckpt_name=CKPT_NAME, quick=quick, full=full)


def main(argv: list[str] | None = None) -> dict | None:
    args = parse_args(argv)
    if "RANK" not in os.environ:
        raise SystemExit(
            "ddp_train.py runs under torchrun, e.g.\n"
            "  torchrun --standalone --nproc_per_node 2 examples/ddp_train.py --quick"
        )
    use_cuda = torch.cuda.is_available()
    # Every collective (and the rendezvous) fails with an error after --timeout instead
    # of waiting the default 10-30 minutes for a rank that died.
    init_distributed(
        "nccl" if use_cuda else "gloo", timedelta(seconds=args.timeout), name="ddp_train"
    )
    rank, world = dist.get_rank(), dist.get_world_size()
    device = (
        torch.device("cuda", int(os.environ["LOCAL_RANK"])) if use_cuda else torch.device("cpu")
    )
    if use_cuda:
        torch.cuda.set_device(device)
    text = load_data()
    torch.manual_seed(args.seed)  # the same initial weights everywhere (DDP also broadcasts)
    model = CharGPT(len(text.vocab), args.block, args.embed_dim, args.heads, args.layers)
    model = model.to(device)
    args.out.mkdir(parents=True, exist_ok=True)
    # One data stream (and random state) per rank: the number of ranks shapes the run.
    config = run_config(args, text.vocab, world_size=world)
    ckpt = resume_on_every_rank(args.resume, CKPT_FIELDS, config, model)
    if ckpt is not None:
        loss_start = ckpt["loss_start"]
    else:
        loss_start = evaluate(model, text.val, args.block, 2, args.seed) if rank == 0 else math.nan
    # The DDP wrapper (and its C++ Reducer, which holds the process group) lives only
    # inside train(): it is gone before destroy_process_group() below, see the note there.
    extra = {"config": config, "loss_start": loss_start}
    seconds = train(model, text.train, args, ckpt, extra)
    torch.save({k: v.cpu() for k, v in model.state_dict().items()}, args.out / f"ddp_rank{rank}.pt")
    result = report(model, text.val, args, loss_start, seconds)
    # No barrier here: all_gather_object in report() already synchronized the ranks, and
    # rank 0's evaluation is local. Only Python ProcessGroup objects still hold the
    # group now (the DDP Reducer is gone with train()), and their destructor releases
    # the GIL while it joins gloo's worker threads. Had DDP's Reducer held the last
    # reference (``ddp`` alive in this frame), the group would be destroyed when the
    # Reducer is, with the GIL held, and a worker thread still freeing the Python
    # tensors of a finished collective waits for the GIL forever: the rank hangs at
    # exit (rank 1, in up to 1 launch in 4 on 2 busy CPU cores; removing only the
    # barrier that stood here does not help).
    dist.destroy_process_group()
    return result


if __name__ == "__main__":
    main()
