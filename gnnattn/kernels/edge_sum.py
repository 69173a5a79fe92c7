r"""GINE's aggregation, :math:`\sum_{j \to i} \mathrm{ReLU}(x_j + W e_{ji} + b)`, in
chunks of edges, as the operators ``gnnattn::relu_edge_sum`` and its backward.

PyG's ``GINEConv`` forms its messages as whole ``[|E|, D]`` tensors: the
gathered ``x_j``, ``lin(edge_attr)``, their sum and its ReLU are alive at once
in the forward, and autograd keeps two of them for the backward. On a kNN graph
of a million points (8 edges each, D = 64) that is 8.2 GB. Here the edges are
taken :data:`CHUNK_ELEMENTS` values at a time: each chunk's messages are formed,
added into their targets and dropped, and the backward forms them again (one
gather and one small matrix product per chunk, less than the forward's cost)
instead of keeping them. Peak memory is the inputs, the output and a few
chunk-sized buffers; the sum is the same, up to the order of float additions.

Plain torch (``index_select``, ``linear``, ``index_add_``), so one code path
serves every device; the ops make it one opaque node for ``torch.compile`` and
``torch.export``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .common import under_func_transform
from .library import differentiable_backward

__all__ = ["CHUNK_ELEMENTS", "relu_edge_sum", "relu_edge_sum_reference"]

#: Values per chunk buffer (8 MB of float32): large enough that the per-chunk
#: Python and dispatch overhead is noise next to the chunk's work, small enough
#: to stay in the last-level cache's order of size.
CHUNK_ELEMENTS = 1 << 21


def _chunks(num_edges: int, width: int) -> list[slice]:
    """The edge slices of :data:`CHUNK_ELEMENTS` values of width ``width`` each."""
    step = max(1, CHUNK_ELEMENTS // max(width, 1))
    return [slice(a, a + step) for a in range(0, num_edges, step)]


def _pre(x: Tensor, e: Tensor, w: Tensor | None, b: Tensor | None, src: Tensor) -> Tensor:
    """The chunk's messages before the ReLU: ``x[src] + e W^T + b``  # (chunk, D)."""
    pre = x.index_select(0, src)
    return pre.add_(F.linear(e, w, b) if w is not None else e)


@torch.library.custom_op("gnnattn::relu_edge_sum", mutates_args=())
def _fwd(
    x: Tensor,
    edge_attr: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    src: Tensor,
    dst: Tensor,
    num_targets: int,
) -> Tensor:
    out = x.new_zeros(num_targets, x.size(1))
    for s in _chunks(src.numel(), x.size(1)):
        out.index_add_(0, dst[s], _pre(x, edge_attr[s], weight, bias, src[s]).relu_())
    return out


@_fwd.register_fake
def _fwd_fake(x, edge_attr, weight, bias, src, dst, num_targets):  # type: ignore[no-untyped-def]
    return x.new_empty(num_targets, x.size(1))


@torch.library.custom_op("gnnattn::relu_edge_sum_bwd", mutates_args=())
def _bwd(
    grad: Tensor,
    x: Tensor,
    edge_attr: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    src: Tensor,
    dst: Tensor,
    need_edge: bool,
    need_weight: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(dx, d edge_attr, dW, db)``; the ones not needed (or without a weight) are empty."""
    dx = torch.zeros_like(x)
    de = torch.zeros_like(edge_attr) if need_edge else edge_attr.new_empty(0)
    linear = weight is not None and need_weight
    dw = torch.zeros_like(weight) if weight is not None and need_weight else x.new_empty(0)
    db = torch.zeros_like(bias) if linear and bias is not None else x.new_empty(0)
    for s in _chunks(src.numel(), x.size(1)):
        e = edge_attr[s]
        # The gradient reaches a message where its ReLU was active, and, as torch's
        # ReLU backward lets it (its mask is "not <= 0"), where the message is NaN.
        g = grad.index_select(0, dst[s]).mul_(~(_pre(x, e, weight, bias, src[s]) <= 0))
        dx.index_add_(0, src[s], g)
        if need_edge:
            de[s] = g @ weight if weight is not None else g
        if linear:
            dw.addmm_(g.t(), e)
            if bias is not None:
                db.add_(g.sum(0))
    return dx, de, dw, db


@_bwd.register_fake
def _bwd_fake(grad, x, edge_attr, weight, bias, src, dst, need_edge, need_weight):  # type: ignore[no-untyped-def]
    linear = weight is not None and need_weight
    return (
        torch.empty_like(x),
        torch.empty_like(edge_attr) if need_edge else edge_attr.new_empty(0),
        torch.empty_like(weight) if linear else x.new_empty(0),
        torch.empty_like(bias) if linear and bias is not None else x.new_empty(0),
    )


def _setup(ctx: Any, inputs: tuple, output: Tensor) -> None:
    x, edge_attr, weight, bias, src, dst, _ = inputs
    ctx.save_for_backward(x, edge_attr, weight, bias, src, dst)


def _backward(ctx: Any, grad: Tensor) -> tuple:
    x, edge_attr, weight, bias, src, dst = ctx.saved_tensors
    need = ctx.needs_input_grad
    if torch.is_grad_enabled():
        # A double backward (create_graph=True: a gradient penalty, forces):
        # the one-piece reference, whose [|E|, D] messages autograd can
        # differentiate again. Only this case pays their memory.
        def forward(x: Tensor, edge_attr: Tensor, weight: Tensor | None, bias: Tensor | None):
            return (relu_edge_sum_reference(x, edge_attr, weight, bias, src, dst, grad.shape[0]),)

        inputs = {0: x, 1: edge_attr, 2: weight, 3: bias}
        return differentiable_backward(ctx, forward, inputs, (grad,), 7)
    dx, de, dw, db = torch.ops.gnnattn.relu_edge_sum_bwd(
        grad.contiguous(), x, edge_attr, weight, bias, src, dst, need[1], need[2] or need[3]
    )
    return (
        dx if need[0] else None,
        de if need[1] else None,
        dw if need[2] else None,
        db if need[3] else None,
        None,
        None,
        None,
    )


_fwd.register_autograd(_backward, setup_context=_setup)


def relu_edge_sum(
    x: Tensor,
    edge_attr: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    src: Tensor,
    dst: Tensor,
    num_targets: int,
) -> Tensor:
    r"""GINE's edge sum in chunks of edges, never holding the ``[|E|, D]`` messages.

    .. math::
        \mathrm{out}_i = \sum_{e = (j \to i)} \mathrm{ReLU}(x_j + W a_e + b)

    (``W a_e + b`` is ``a_e`` itself when ``weight`` is ``None``). The
    backward forms each chunk's messages again instead of keeping them. The
    inputs are trusted (:class:`gnnattn.nn.GINEConv` checks them).

    Args:
        x (Tensor): source features.
        edge_attr (Tensor): edge features.
        weight (Tensor, optional): :math:`W`, or ``None``.
        bias (Tensor, optional): :math:`b`, or ``None``.
        src (Tensor): source id of each edge (int32 or int64).
        dst (Tensor): target id of each edge (int32 or int64).
        num_targets (int): the number of rows of the result.

    Shapes:
        - **input:** ``x`` :math:`(|V_s|, D)`, ``edge_attr`` :math:`(|E|, F)`
          (:math:`F = D` without a weight), ``weight`` :math:`(D, F)`,
          ``bias`` :math:`(D)`, ``src`` and ``dst`` :math:`(|E|)`
        - **output:** :math:`(\text{num\_targets}, D)`, in ``x``'s dtype

    Example:
        >>> x, a = torch.ones(3, 2), torch.zeros(2, 2)
        >>> relu_edge_sum(x, a, None, None, torch.tensor([0, 1]), torch.tensor([2, 2]), 3)
        tensor([[0., 0.],
                [0., 0.],
                [2., 2.]])
    """
    if under_func_transform():
        # torch.func (grad, vmap) cannot run the op's generated autograd: the reference's
        # torch ops, with its [|E|, D] messages, compose with the transforms.
        return relu_edge_sum_reference(x, edge_attr, weight, bias, src, dst, num_targets)
    # num_targets as given: a size traced by torch.export stays symbolic.
    return torch.ops.gnnattn.relu_edge_sum(
        x.contiguous(), edge_attr.contiguous(), weight, bias, src, dst, num_targets
    )


def relu_edge_sum_reference(
    x: Tensor,
    edge_attr: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    src: Tensor,
    dst: Tensor,
    num_targets: int,
) -> Tensor:
    r""":func:`relu_edge_sum` in one piece, as PyG's ``GINEConv`` computes it: the
    ``[|E|, D]`` messages :math:`\mathrm{ReLU}(x_{src(e)} + W a_e + b)` formed at once,
    then :math:`\mathrm{out}_i = \sum_{e: dst(e) = i} m_e`. The tests' reference,
    and the double backward's (which differentiates it)."""
    msg = (
        x.index_select(0, src)
        + (F.linear(edge_attr, weight, bias) if weight is not None else edge_attr)
    ).relu()
    # Made from msg, not x: inside torch.func.vmap msg is batched where x may not be
    # (an ensemble's weights), and an unbatched buffer cannot take a batched sum in place.
    return msg.new_zeros(num_targets, x.size(1)).index_add_(0, dst, msg)
