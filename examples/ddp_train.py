"""The tiny GPT trained data-parallel: torch.distributed DistributedDataParallel.

Every process holds a replica of the model of ``tiny_gpt.py``; each draws its
own random windows of the text, gradients are averaged across processes after
every backward, so all replicas stay identical. The gloo backend runs on CPUs,
NCCL where every process has a GPU. Launch with torchrun:

    # one machine, 2 processes (CPU)
    torchrun --standalone --nproc_per_node 2 examples/ddp_train.py --quick

    # several machines, surviving the loss of one (see the README): on each
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

import argparse
import hashlib
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from checkpoints import (  # noqa: E402
    check_config,
    fail_once,
    load_model_state,
    read_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from tiny_gpt import CharGPT, batches, evaluate, load_text  # noqa: E402

CKPT_NAME = "ddp_ckpt.pt"  # in --out; always the latest (replaced atomically by rank 0)


def param_digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def train(
    model: torch.nn.Module,
    train_data: torch.Tensor,
    args: argparse.Namespace,
    steps: int,
    block: int,
    device: torch.device,
    rank: int,
    world: int,
    ckpt: dict | None,
    extra: dict,
) -> float:
    """Train ``model`` in place under DistributedDataParallel; returns the seconds taken.

    Continues from ``ckpt`` (the model's weights already loaded) if given; saves a
    checkpoint with ``extra`` in it every ``args.ckpt_every`` steps. The DDP wrapper
    is local to this function, so it is freed on return.
    """
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
    it = batches(train_data, block, args.batch_size, gen)
    t0 = time.perf_counter()
    bar = tqdm(
        range(start + 1, steps + 1),
        desc=f"rank {rank}/{world}",
        initial=start,
        total=steps,
        disable=rank != 0,
        mininterval=1.0,
    )
    for step in bar:
        x, y = next(it)
        logits = ddp(x.to(device))
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.to(device).reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()  # gradients all-reduced (averaged) across ranks here
        opt.step()
        avg = loss.detach().clone()
        dist.all_reduce(avg)
        bar.set_postfix(loss=f"{avg.item() / world:.3f}", refresh=False)
        if args.ckpt_every and (step % args.ckpt_every == 0 or step == steps):
            # One file holds every rank's random states, so a checkpoint is whole
            # or absent: never rank 0 at one step and rank 1 at another.
            rngs: list[dict | None] = [None] * world
            dist.all_gather_object(rngs, rng_state(gen))
            if rank == 0:
                state = {
                    "config": extra["config"],
                    "step": step,
                    "model": {k: v.cpu() for k, v in model.state_dict().items()},
                    "optimizer": opt.state_dict(),
                    "rng": rngs,
                    "loss_start": extra["loss_start"],
                }
                save_checkpoint(args.out / CKPT_NAME, state)
        if rank == min(1, world - 1):  # rank 1; rank 0 when it runs alone
            fail_once(args.out, step, args.fail_at_step)
    bar.close()
    return time.perf_counter() - t0


def init_distributed(backend: str, timeout: timedelta) -> None:
    """``dist.init_process_group`` that also works after torchrun restarted the group.

    By default torchrun's agent hosts the store the ranks meet in, and keeps it across
    restarts (``TORCHELASTIC_USE_AGENT_STORE=True``). The keys through which the ranks
    of the first attempt exchanged their addresses are still there when the group
    restarts, so a restarted rank may read a dead peer's address and fail to connect
    (pytorch/pytorch#135712; here 3 restarts in 4 failed). Each attempt therefore meets
    under a prefix of its own: ``TORCHELASTIC_RESTART_COUNT``, the same for all ranks of
    one torchrun agent (on several machines it may differ between agents, hence the
    README's ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, which gives each attempt a new
    store and takes the plain path below).
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        dist.init_process_group(backend, timeout=timeout)
        return
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout
    )
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    dist.init_process_group(
        backend,
        store=dist.PrefixStore(f"ddp_train/attempt_{attempt}", store),
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        timeout=timeout,
    )


def resume(path: Path | None, config: dict, rank: int) -> dict | None:
    """The checkpoint to continue from on every rank, or None (no --resume, or no file).

    Rank 0 reads the file and broadcasts what it found (the checkpoint, nothing, or the
    error), so only rank 0 needs to see it and every rank decides alike: a bad file
    raises the same ValueError everywhere instead of leaving the others waiting.
    """
    if path is None:
        return None
    found: list = [None]
    if rank == 0:
        try:
            found[0] = read_checkpoint(path)
        except ValueError as e:
            found[0] = str(e)
        if found[0] is None:
            print(f"no checkpoint at {path}: starting fresh", flush=True)
    dist.broadcast_object_list(found, src=0)
    ckpt = found[0]
    if isinstance(ckpt, str):
        raise ValueError(ckpt)
    if ckpt is not None:
        check_config(ckpt, config, path)
        if rank == 0:
            print(f"resumed from {path} at step {ckpt['step']}", flush=True)
    return ckpt


def main(argv: list[str] | None = None) -> dict | None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="a small run, under a minute")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--block", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=16, help="per process")
    p.add_argument("--embed-dim", type=int, default=None)
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("gnnattn-demo-out"))
    p.add_argument(
        "--timeout",
        type=float,
        default=90.0,
        help="seconds a collective waits for the other ranks before it fails (a dead peer)",
    )
    p.add_argument(
        "--ckpt-every",
        type=int,
        default=100,
        help=f"rank 0 writes --out/{CKPT_NAME} every this many steps and at the end (0: never)",
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
        help="for tests: rank 1 exits with status 1 after this step, once (a file in --out "
        "records it); under torchrun --max-restarts the group restarts",
    )
    args = p.parse_args(argv)
    if args.ckpt_every < 0:
        p.error(f"--ckpt-every: expected a number of steps >= 0, got {args.ckpt_every}")
    if args.resume == Path(""):
        args.resume = args.out / CKPT_NAME
    steps = args.steps or (60 if args.quick else 2000)
    block = args.block or (32 if args.quick else 96)
    dim = args.embed_dim or (32 if args.quick else 128)
    layers = args.layers or (2 if args.quick else 4)

    if "RANK" not in os.environ:
        raise SystemExit(
            "ddp_train.py runs under torchrun, e.g.\n"
            "  torchrun --standalone --nproc_per_node 2 examples/ddp_train.py --quick"
        )
    use_cuda = torch.cuda.is_available()
    # Every collective (and the rendezvous) fails with an error after --timeout instead
    # of waiting the default 10-30 minutes for a rank that died.
    init_distributed("nccl" if use_cuda else "gloo", timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    device = (
        torch.device("cuda", int(os.environ["LOCAL_RANK"])) if use_cuda else torch.device("cpu")
    )
    if use_cuda:
        torch.cuda.set_device(device)

    text, vocab = load_text()
    stoi = {c: i for i, c in enumerate(vocab)}
    data = torch.tensor([stoi[c] for c in text])
    split = int(0.9 * data.numel())
    train_data, val_data = data[:split], data[split:]

    torch.manual_seed(args.seed)  # the same initial weights everywhere (DDP also broadcasts)
    model = CharGPT(len(vocab), block, dim, args.heads, layers).to(device)
    args.out.mkdir(parents=True, exist_ok=True)
    # Everything that shapes the run: a checkpoint of another run is refused.
    config = {
        "vocab": "".join(vocab),
        "block": block,
        "embed_dim": dim,
        "layers": layers,
        "heads": args.heads,
        "lr": args.lr,
        "batch_size": args.batch_size,
        "seed": args.seed,
        "world_size": world,  # one data stream (and random state) per rank
    }
    try:
        ckpt = resume(args.resume, config, rank)
        if ckpt is not None:
            load_model_state(model, ckpt["model"], args.resume)
    except ValueError:
        # Every rank raises the same error (all hold the same checkpoint, see resume());
        # leave the group cleanly.
        dist.destroy_process_group()
        raise
    if ckpt is not None:
        loss_start = ckpt["loss_start"]
    else:
        loss_start = evaluate(model, val_data, block, 2, args.seed) if rank == 0 else float("nan")
    # The DDP wrapper (and its C++ Reducer, which holds the process group) lives only
    # inside train(): it is gone before destroy_process_group() below, see the note there.
    extra = {"config": config, "loss_start": loss_start}
    seconds = train(model, train_data, args, steps, block, device, rank, world, ckpt, extra)

    torch.save({k: v.cpu() for k, v in model.state_dict().items()}, args.out / f"ddp_rank{rank}.pt")
    digests: list[str | None] = [None] * world
    dist.all_gather_object(digests, param_digest(model))  # the last collective
    result = None
    if rank == 0:
        loss_end = evaluate(model, val_data, block, 2, args.seed)
        same = len(set(digests)) == 1
        print(
            f"{world} processes, {steps} steps in {seconds:.1f} s; validation loss "
            f"{loss_start:.3f} -> {loss_end:.3f}; parameters identical on all ranks: {same}"
        )
        result = {
            "world_size": world,
            "steps": steps,
            "loss_start": loss_start,
            "loss_end": loss_end,
            "digests": digests,
            "identical": same,
        }
        print("RESULT " + json.dumps(result), flush=True)
    # No barrier here: all_gather_object above already synchronized the ranks, and
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
