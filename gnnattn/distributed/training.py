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
    """Sum every parameter's gradient over the ranks, in place (one flat all-reduce).

    A parameter without a gradient on this rank counts as zeros, so every rank
    reduces the same flat buffer whatever its graph touched.
    """
    if group_rank(group)[1] == 1:
        return
    params = [p for p in module.parameters() if p.requires_grad]
    if not params:
        return
    flat = torch.cat(
        [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params]
    )
    dist.all_reduce(flat, group=group)
    offset = 0
    for p in params:
        n = p.numel()
        p.grad = flat[offset : offset + n].view_as(p).clone()
        offset += n


def broadcast_parameters(module: torch.nn.Module, src: int = 0, group: Any = None) -> None:
    """Give every rank rank ``src``'s parameters and buffers (replicas start equal)."""
    if group_rank(group)[1] == 1:
        return
    for t in [*module.parameters(), *module.buffers()]:
        dist.broadcast(t.data, src=src, group=group)
