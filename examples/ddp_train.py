"""The tiny GPT trained data-parallel: torch.distributed DistributedDataParallel.

Every process holds a replica of the model of ``tiny_gpt.py``; each draws its
own random windows of the text, gradients are averaged across processes after
every backward, so all replicas stay identical. The gloo backend runs on CPUs,
NCCL where every process has a GPU. Launch with torchrun:

    # one machine, 2 processes (CPU)
    torchrun --standalone --nproc_per_node 2 examples/ddp_train.py --quick

    # several machines: the same command on each, with its own --node_rank
    torchrun --nnodes 2 --node_rank 0 --nproc_per_node 2 \\
        --master_addr HOST_OF_RANK_0 --master_port 29500 examples/ddp_train.py

Each rank writes its final parameters to ``ddp_rank{RANK}.pt`` in --out (the
test suite checks that they are identical); rank 0 prints the loss and a last
line ``RESULT {...}``.
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
from tiny_gpt import CharGPT, batches, evaluate, load_text  # noqa: E402


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
) -> float:
    """Train ``model`` in place under DistributedDataParallel; returns the seconds taken.

    The DDP wrapper is local to this function, so it is freed on return.
    """
    ddp = DistributedDataParallel(
        model, device_ids=None if device.type == "cpu" else [device.index]
    )
    opt = torch.optim.AdamW(ddp.parameters(), lr=args.lr, weight_decay=0.01)
    # Each rank samples its own windows: data parallelism.
    it = batches(train_data, block, args.batch_size, torch.Generator().manual_seed(1000 + rank))
    t0 = time.perf_counter()
    bar = tqdm(range(steps), desc=f"rank {rank}/{world}", disable=rank != 0, mininterval=1.0)
    for _ in bar:
        x, y = next(it)
        logits = ddp(x.to(device))
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.to(device).reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()  # gradients all-reduced (averaged) across ranks here
        opt.step()
        avg = loss.detach().clone()
        dist.all_reduce(avg)
        bar.set_postfix(loss=f"{avg.item() / world:.3f}", refresh=False)
    bar.close()
    return time.perf_counter() - t0


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
    args = p.parse_args(argv)
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
    dist.init_process_group("nccl" if use_cuda else "gloo", timeout=timedelta(seconds=args.timeout))
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
    loss_start = evaluate(model, val_data, block, 2, args.seed) if rank == 0 else float("nan")
    # The DDP wrapper (and its C++ Reducer, which holds the process group) lives only
    # inside train(): it is gone before destroy_process_group() below, see the note there.
    seconds = train(model, train_data, args, steps, block, device, rank, world)

    args.out.mkdir(parents=True, exist_ok=True)
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
