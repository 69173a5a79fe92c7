"""PyG's ``GINEConv`` with its messages formed in chunks of edges, never all at once."""

from __future__ import annotations

import torch
from torch import Tensor
from torch_geometric import EdgeIndex
from torch_geometric.nn import GINEConv as PyGGINEConv
from torch_geometric.nn.aggr import SumAggregation
from torch_geometric.typing import OptPairTensor, OptTensor

from ..kernels.edge_sum import relu_edge_sum
from .pyg_path import PYG_HOOKS

__all__ = ["GINEConv"]


class GINEConv(PyGGINEConv):
    r"""The GINE operator of `"Strategies for Pre-training Graph Neural Networks"
    <https://arxiv.org/abs/1905.12265>`_, a drop-in for
    :class:`torch_geometric.nn.GINEConv` (a subclass of it: the same constructor,
    parameters, ``state_dict`` and ``repr``) that never holds its ``[|E|, D]``
    messages.

    .. math::
        \mathbf{x}^{\prime}_i = h_{\mathbf{\Theta}} \left( (1 + \epsilon) \cdot
        \mathbf{x}_i + \sum_{j \in \mathcal{N}(i)} \mathrm{ReLU}
        ( \mathbf{x}_j + \mathbf{W} \mathbf{e}_{j,i} + \mathbf{b} ) \right)

    PyG forms the messages as whole tensors: four ``[|E|, D]`` float tensors
    are alive at once in its forward, and two are kept for the backward (8.2
    GB on a kNN graph of 1M points, 8 edges each, D = 64). Here the sum runs
    in chunks of edges (:func:`gnnattn.kernels.edge_sum.relu_edge_sum`, an
    operator under ``torch.compile`` and ``torch.export``), and the backward
    forms each chunk's messages again instead of keeping them. The outputs
    and gradients are PyG's up to the order of float additions.

    The chunked sum runs for a plain ``[2, |E|]`` ``edge_index`` tensor with
    ``edge_attr`` ``[|E|, F]`` of ``x``'s dtype, ``x`` ``[|V|, D]`` (or a
    pair), no ``size``, the default sum aggregation and flow, and no PyG hooks
    or explainer on the layer; any other call (an ``EdgeIndex``, a sparse
    adjacency, ``torch.jit.trace``) runs PyG's ``propagate`` unchanged. An id
    of ``edge_index`` out of range raises a ``ValueError`` naming it.
    ``torch.jit.script`` is not supported (PyG's layer is);
    ``torch.compile`` and ``torch.export`` are.

    Args:
        nn (torch.nn.Module): :math:`h_{\mathbf{\Theta}}`, mapping ``[|V|, D]``
            to the output width.
        eps (float, optional): the initial :math:`\epsilon`. (default: ``0.``)
        train_eps (bool, optional): learn :math:`\epsilon`. (default: :obj:`False`)
        edge_dim (int, optional): width :math:`F` of ``edge_attr``, mapped to
            :math:`D` by :math:`\mathbf{W}, \mathbf{b}`; ``None``: ``edge_attr``
            is added as it is (``F = D``). (default: :obj:`None`)
        **kwargs: :class:`torch_geometric.nn.conv.MessagePassing`'s.

    Shapes:
        - **input:** ``x`` :math:`(|V|, D)` or a pair :math:`((|V_s|, D), (|V_t|, D))`,
          ``edge_index`` :math:`(2, |E|)`, ``edge_attr`` :math:`(|E|, F)`
        - **output:** :math:`(|V_t|, D_{out})`

    Example:
        >>> import torch
        >>> from torch_geometric.nn import MLP
        >>> conv = GINEConv(MLP([16, 32, 16]), edge_dim=3)
        >>> x = torch.randn(5, 16)
        >>> edge_index = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])
        >>> conv(x, edge_index, torch.randn(4, 3)).shape
        torch.Size([5, 16])
    """

    # The arguments of PyG's propagate call, which PyG reads from the class that
    # defines forward (this one) to generate its propagate.
    propagate_type = {"x": OptPairTensor, "edge_attr": OptTensor}

    def forward(  # type: ignore[override]
        self,
        x: Tensor | tuple[Tensor, Tensor | None],
        edge_index: Tensor,
        edge_attr: Tensor | None = None,
        size: tuple[int, int] | None = None,
    ) -> Tensor:
        pair = (x, x) if isinstance(x, Tensor) else x
        if size is not None or not self._chunked(pair, edge_index, edge_attr):
            return super().forward(x, edge_index, edge_attr, size)
        x_src, x_dst = pair
        assert isinstance(x_src, Tensor) and isinstance(edge_attr, Tensor)
        num_targets = (x_dst if x_dst is not None else x_src).size(0)
        lin = self.lin
        weight, bias = (lin.weight, lin.bias) if lin is not None else (None, None)
        src, dst = edge_index[0], edge_index[1]
        try:
            out = relu_edge_sum(x_src, edge_attr, weight, bias, src, dst, num_targets)
        except (IndexError, RuntimeError):
            # Checked only when the op fails, so a call that works pays nothing.
            _check_index(src, x_src.size(0), "edge_index[0]")
            _check_index(dst, num_targets, "edge_index[1]")
            raise
        if x_dst is not None:
            out = out + (1 + self.eps) * x_dst
        return self.nn(out)

    def _chunked(self, pair: tuple, edge_index: Tensor, edge_attr: Tensor | None) -> bool:
        """Whether a call takes the chunked sum (else PyG's ``propagate``)."""
        x_src, x_dst = pair
        plain = (
            # Not an EdgeIndex (its sparse sizes are PyG's to read), not traced by
            # torch.jit.trace (which would bake the node count into the op call).
            isinstance(edge_index, Tensor)
            and not isinstance(edge_index, EdgeIndex)
            and not torch.jit.is_tracing()
            and edge_index.layout == torch.strided
            and edge_index.dim() == 2
            and edge_index.size(0) == 2
            and not edge_index.is_floating_point()
        )
        lin = self.lin
        # PyG's Linear says in_channels, torch's in_features.
        width = (
            getattr(lin, "in_channels", getattr(lin, "in_features", -1))
            if lin is not None
            else (x_src.size(-1) if isinstance(x_src, Tensor) else -1)
        )
        features = (
            isinstance(x_src, Tensor)
            and x_src.dim() == 2
            and (x_dst is None or (isinstance(x_dst, Tensor) and x_dst.dim() == 2))
            and isinstance(edge_attr, Tensor)
            and edge_attr.dim() == 2
            and edge_attr.size(1) == width
            and edge_attr.dtype == x_src.dtype
        )
        hooks = any(getattr(self, name) for name in PYG_HOOKS)
        return (
            plain
            and features
            and isinstance(self.aggr_module, SumAggregation)
            and self.flow == "source_to_target"
            and not hooks
            and not getattr(self, "_explain", False)
            and self.decomposed_layers == 1
        )


def _check_index(index: Tensor, bound: int, name: str) -> None:
    """Raise a ``ValueError`` naming ``name`` unless every id of ``index`` is in ``[0, bound)``."""
    if index.numel() and (int(index.min()) < 0 or int(index.max()) >= bound):
        raise ValueError(
            f"Expected '{name}' ids in [0, {bound}), got ids in "
            f"[{int(index.min())}, {int(index.max())}]"
        )
