"""The halo exchange: rows to the ranks that read them, their gradients back to their owners.

Forward, :func:`exchange_start` hands the rows other ranks read to one
asynchronous ``all_to_all_single`` with split sizes and returns the buffer it
fills; :func:`exchange_finish` waits for it. Between the two, the caller
computes what does not need the halo. Backward, the halo rows' gradients make
the reverse trip in one ``all_to_all_single`` and are added to their owners'
rows (the backward of the indexing that picked them: an ``index_add``).

Every rank must take part in every exchange, in the same order: each layer
exchanges once in the forward and once in the backward, so every rank must
run the same layers and call ``backward`` on a loss built from its outputs
(an empty one on a rank without targets). Under DDP, whose gradient hooks
all-reduce while the backward runs, give the parts a process group of their
own (``torch.distributed.new_group()``) so the two never interleave.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import Tensor

if TYPE_CHECKING:
    from .part import GraphPart

__all__ = ["exchange_finish", "exchange_start", "group_rank"]


def group_rank(group: Any) -> tuple[int, int]:
    """``(rank, world_size)`` in ``group``; ``(0, 1)`` without ``torch.distributed``."""
    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


class _Pending:
    """The exchange in flight between :func:`exchange_start` and :func:`exchange_finish`."""

    def __init__(self) -> None:
        self.work: Any = None
        self.send: Tensor | None = None  # kept alive until the exchange is done


def _all_to_all(
    out: Tensor,
    inp: Tensor,
    out_counts: list[int],
    in_counts: list[int],
    group: Any,
    async_op: bool,
) -> Any:
    if len(out_counts) == 1:
        # A one-part partition: no other part to exchange with, and no process group
        # needed (whatever the world torch.distributed runs in).
        return None
    return dist.all_to_all_single(out, inp, out_counts, in_counts, group=group, async_op=async_op)


class _Start(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, send: Tensor, part: GraphPart, pending: _Pending) -> Tensor:
        send = send.contiguous()  # (S_r, F), by destination rank
        recv = send.new_empty(sum(part.recv_counts), send.shape[1])  # (H_r, F)
        pending.send = send
        pending.work = _all_to_all(
            recv, send, part.recv_counts, part.send_counts, part.group, async_op=True
        )
        part.traffic["forward"] += send.numel() * send.element_size()
        ctx.part = part
        return recv

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        part: GraphPart = ctx.part
        grad = grad.contiguous()
        back = grad.new_empty(sum(part.send_counts), grad.shape[1])  # (S_r, F)
        _all_to_all(back, grad, part.send_counts, part.recv_counts, part.group, async_op=False)
        part.traffic["backward"] += grad.numel() * grad.element_size()
        # Row by row the gradient of what was sent; the indexing that picked the
        # rows adds it to their owners (a row read by several ranks, once per rank).
        return back, None, None


class _Finish(torch.autograd.Function):
    """Waits for the exchange. It also passes through a tensor computed while waiting, so
    that every rank's backward reaches the exchange (and takes part in the reverse trip)
    even where the received rows feed nothing, as on a rank without boundary targets."""

    @staticmethod
    def forward(ctx: Any, passed: Tensor, recv: Tensor, pending: _Pending) -> tuple[Tensor, Tensor]:
        if pending.work is not None:
            pending.work.wait()
        pending.work = pending.send = None
        return passed.view_as(passed), recv.view_as(recv)

    @staticmethod
    def backward(ctx: Any, g_passed: Tensor, g_recv: Tensor) -> tuple[Tensor, Tensor, None]:
        return g_passed, g_recv, None


def exchange_start(send: Tensor, part: GraphPart) -> tuple[Tensor, _Pending]:
    """Start sending ``send`` ``[S_r, F]`` (the rows of ``part.send_index``, in its order)
    to the ranks that read them; returns the ``[H_r, F]`` halo buffer (not to be read
    before :func:`exchange_finish`)."""
    pending = _Pending()
    return _Start.apply(send, part, pending), pending


def exchange_finish(passed: Tensor, recv: Tensor, pending: _Pending) -> tuple[Tensor, Tensor]:
    """Wait for the halo; returns ``(passed, recv)`` for use."""
    return _Finish.apply(passed, recv, pending)
