"""Replicated parameters, summed gradients: P ranks train as one process would.

Each rank's loss is its targets' share of the full-graph loss (the sum over
its targets divided by the number of targets of the whole graph, not of the
rank), so the sum over ranks of the gradients is the gradient of the
full-graph loss.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from .exchange import group_rank

__all__ = ["all_reduce_gradients", "broadcast_parameters"]


def all_reduce_gradients(module: torch.nn.Module, group: Any = None) -> None:
    """Sum every parameter's gradient over the ranks, in place: one flat all-reduce per
    dtype and device, so mixed precision keeps each gradient in its own dtype.

    A parameter without a gradient on this rank counts as zeros there, so every rank
    reduces the same buffers whatever its graph touched. One that no rank gave a
    gradient keeps ``grad=None``, as in one process (an optimizer skips it; a zero
    gradient would still move it by weight decay or momentum).
    """
    if group_rank(group)[1] == 1:
        return
    params = [p for p in module.parameters() if p.requires_grad]
    if not params:
        return
    # Which parameters some rank gave a gradient: one small all-reduce of flags.
    flags = torch.tensor([p.grad is not None for p in params], dtype=torch.int32)
    flags = flags.to(params[0].device)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=group)
    groups: dict[tuple[torch.dtype, torch.device], list[torch.nn.Parameter]] = {}
    for p, used in zip(params, flags.tolist(), strict=True):
        if used:
            groups.setdefault((p.dtype, p.device), []).append(p)
    for ps in groups.values():
        flat = torch.cat(
            [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in ps]
        )
        dist.all_reduce(flat, group=group)
        for p, total in zip(ps, flat.split([p.numel() for p in ps]), strict=True):
            if p.grad is None:
                p.grad = total.view_as(p).clone()
            else:
                p.grad.copy_(total.view_as(p))


def broadcast_parameters(module: torch.nn.Module, src: int = 0, group: Any = None) -> None:
    """Give every rank the parameters and buffers of rank ``src`` (a rank within
    ``group`` when one is given), so that the replicas start equal."""
    if group_rank(group)[1] == 1:
        return
    root = dist.get_global_rank(group, src) if group is not None else src
    for t in [*module.parameters(), *module.buffers()]:
        dist.broadcast(t.data, src=root, group=group)
