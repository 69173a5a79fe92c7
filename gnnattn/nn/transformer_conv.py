"""PyG's ``TransformerConv`` (UniMP), the same module on gnnattn's operator."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.nn import Linear, MessagePassing
from torch_geometric.typing import OptTensor

from ..checks import (
    check_edge_input,
    check_int,
    check_like,
    check_probability,
    check_tensor,
    check_x,
)
from ..ops import AttentionOutput, BackendChoice, check_backend
from ..softmax import segment_softmax
from .parts import AnyGraph, PartLike, attend, choose, graph_or_part
from .pyg_path import PYG_PROPAGATE, pyg_edge_index, takes_pyg_path

__all__ = ["TransformerConv"]


def _channels(value: int | tuple[int, int], name: str) -> tuple[int, int]:
    """``(source, target)`` widths, each positive or ``-1`` (lazy: read from the first call)."""
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValueError(f"Expected '{name}' an int or a pair of ints, got {value!r}")
        _check_width(value[0], f"{name}[0]")
        _check_width(value[1], f"{name}[1]")
        return int(value[0]), int(value[1])
    _check_width(value, name)
    return value, value


def _check_width(value: Any, name: str) -> None:
    """Raise unless ``value`` is a positive int or ``-1`` (lazy)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"Expected '{name}' to be an int, got {type(value).__name__}")
    if value < 1 and value != -1:
        raise ValueError(f"Expected '{name}' to be a positive int or -1 (lazy), got {value}")


def _width(lin: Linear) -> int | None:
    """The input width of ``lin``; ``None`` while lazy (its first call, or a loaded
    ``state_dict``, sets it)."""
    # PyG's Linear keeps in_channels in step with its weight (-1 while lazy),
    # a plain int where the lazy weight's shape cannot be read.
    return lin.in_channels if lin.in_channels > 0 else None


class TransformerConv(MessagePassing):
    r"""The graph transformer operator of `"Masked Label Prediction: Unified
    Message Passing Model for Semi-Supervised Classification"
    <https://arxiv.org/abs/2009.03509>`_, a drop-in for
    :class:`torch_geometric.nn.TransformerConv`: the same constructor,
    submodules, parameter names, call and outputs, so ``load_state_dict``
    works both ways (the fused path reads ``lin_edge``'s weight without
    calling it: forward hooks on ``lin_edge`` run on PyG's path only, taken with
    a message hook or an explainer).

    .. math::
        \mathbf{x}^{\prime}_i = \mathbf{W}_1 \mathbf{x}_i +
        \sum_{j \in \mathcal{N}(i)} \alpha_{i,j} \left(\mathbf{W}_2 \mathbf{x}_{j}
        + \mathbf{W}_6 \mathbf{e}_{ij}\right),
        \qquad
        \alpha_{i,j} = \textrm{softmax} \left(
        \frac{(\mathbf{W}_3\mathbf{x}_i)^{\top} (\mathbf{W}_4\mathbf{x}_j
        + \mathbf{W}_6 \mathbf{e}_{ij})}{\sqrt{d}} \right)

    per head, concatenated (or averaged, ``concat=False``), with the gated
    skip :math:`\beta_i \mathbf{W}_1 \mathbf{x}_i + (1 - \beta_i)
    \mathbf{m}_i`, :math:`\beta_i = \sigma(\mathbf{w}_5^{\top} [\mathbf{W}_1
    \mathbf{x}_i, \mathbf{m}_i, \mathbf{W}_1 \mathbf{x}_i - \mathbf{m}_i])`
    when ``beta=True``.

    What differs from PyG's: it runs on :func:`gnnattn.attention` (the fused
    kernels by default), where the edge term never becomes an
    :math:`|E| \times HC` tensor: :math:`\mathbf{q}_i \cdot \mathbf{W}_6
    \mathbf{e}_{ij} = (\mathbf{W}_6^{\top} \mathbf{q}_i) \cdot
    \mathbf{e}_{ij}` and :math:`\sum_j \alpha_{ij} \mathbf{W}_6 \mathbf{e}_{ij}
    = \mathbf{W}_6 \sum_j \alpha_{ij} \mathbf{e}_{ij}`; and attention dropout
    draws its mask from gnnattn's counter-based stream (the same
    distribution, another mask than ``F.dropout``'s). The attention weights
    returned are those before dropout, as PyG's.

    PyG's hooks (``register_message_forward_hook`` ...) and explainers
    (:class:`torch_geometric.explain.Explainer`, whose edge mask scales the
    messages) act on per-edge messages, which the fused path never forms: a
    layer with any of them, or built with a ``MessagePassing`` option other
    than the defaults (an ``aggr`` other than ``"add"``, which PyG's layer
    applies to the weighted values, so the result is no longer attention;
    ``flow="target_to_source"``; ``decomposed_layers``), runs PyG's
    ``propagate`` and :meth:`message`, as PyG's layer does, whatever
    ``backend`` says.

    Args:
        in_channels (int or tuple): size of each input sample, or
            ``(source, target)`` sizes for bipartite graphs; ``-1`` reads a
            size from the first call (lazy, as PyG's: ``to_hetero`` builds
            its layers so).
        out_channels (int): :math:`C`, size of each output per head.
        heads (int, optional): :math:`H`. (default: ``1``)
        concat (bool, optional): concatenate the heads (else average them).
            (default: :obj:`True`)
        beta (bool, optional): the gated skip (with ``root_weight``).
            (default: :obj:`False`)
        dropout (float, optional): attention dropout in training.
            (default: ``0.0``)
        edge_dim (int, optional): width of ``edge_attr``; ``-1`` reads it from
            the first call. (default: :obj:`None`)
        bias (bool, optional): biases of the projections. (default: :obj:`True`)
        root_weight (bool, optional): add the skip :math:`\mathbf{W}_1
            \mathbf{x}_i`. (default: :obj:`True`)
        backend (str, optional): ``"auto"``, ``"fused"``, ``"mp"`` (the
            message-passing reference) or ``"sdpa"``; a call can override
            it, and :meth:`backend_for` says which one a call takes and why.
            (default: ``"auto"``)
        **kwargs: :class:`torch_geometric.nn.conv.MessagePassing`'s
            (``aggr`` defaults to ``"add"``).

    Shapes:
        - **input:** ``x`` ``[|V|, F_in]`` or ``([|V_s|, F_s], [|V_t|, F_t])``,
          ``edge_index`` ``[2, |E|]`` (or an ``EdgeIndex``, a ``torch.sparse``
          ``adj_t``, an :class:`~gnnattn.AttentionGraph`), ``edge_attr``
          ``[|E|, edge_dim]``
        - **output:** ``[|V_t|, H C]`` (``concat``) or ``[|V_t|, C]``; with
          ``return_attention_weights``, also ``(edge_index, alpha [|E|, H])``

    Example:
        >>> conv = TransformerConv(16, 8, heads=2, edge_dim=3)
        >>> conv
        TransformerConv(16, 8, heads=2)
        >>> ei = torch.tensor([[0, 1, 2, 2], [1, 2, 0, 1]])
        >>> conv(torch.randn(3, 16), ei, torch.randn(4, 3)).shape
        torch.Size([3, 16])
    """

    # The arguments of the propagate call, for PyG's generated propagate (it
    # would otherwise parse them from this module's source).
    propagate_type = {"query": Tensor, "key": Tensor, "value": Tensor, "edge_attr": OptTensor}

    def __init__(
        self,
        in_channels: int | tuple[int, int],
        out_channels: int,
        heads: int = 1,
        concat: bool = True,
        beta: bool = False,
        dropout: float = 0.0,
        edge_dim: int | None = None,
        bias: bool = True,
        root_weight: bool = True,
        *,
        backend: str = "auto",
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("aggr", "add")
        super().__init__(node_dim=0, **kwargs)
        src, dst = _channels(in_channels, "in_channels")
        check_int(out_channels, "out_channels", min=1)
        check_int(heads, "heads", min=1)
        check_probability(dropout, "dropout")
        if edge_dim is not None:
            _check_width(edge_dim, "edge_dim")
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.heads = heads
        self.beta = beta and root_weight
        self.root_weight = root_weight
        self.concat = concat
        self.dropout = dropout
        self.edge_dim = edge_dim
        self.backend = check_backend(backend)
        # message() parks the weights here and forward resets it to None, as
        # in PyG's layer; the fused path parks nothing.
        self._alpha: Tensor | None = None
        hc = heads * out_channels
        # PyG's Linear, as PyG's layer: lazy with -1, the same state_dict.
        self.lin_key = Linear(src, hc, bias=bias)
        self.lin_query = Linear(dst, hc, bias=bias)
        self.lin_value = Linear(src, hc, bias=bias)
        self.lin_edge: Linear | None = None
        if edge_dim is not None:
            self.lin_edge = Linear(edge_dim, hc, bias=False)
        width = hc if concat else out_channels
        self.lin_skip = Linear(dst, width, bias=bias)
        self.lin_beta: Linear | None = None
        if self.beta:
            self.lin_beta = Linear(3 * width, 1, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """PyG's initialisation (each ``Linear``'s own)."""
        super().reset_parameters()
        for lin in (self.lin_key, self.lin_query, self.lin_value, self.lin_edge, self.lin_skip):
            if lin is not None:
                lin.reset_parameters()
        if self.lin_beta is not None:
            self.lin_beta.reset_parameters()

    def forward(
        self,
        x: Tensor | tuple[Tensor, Tensor],
        edge_index: PartLike,
        edge_attr: Tensor | None = None,
        return_attention_weights: bool | None = None,
        *,
        backend: str | None = None,
    ) -> Tensor | tuple[Tensor, tuple[Tensor, Tensor]]:
        """Attend over ``edge_index``; PyG's call.

        Args:
            x (Tensor or (Tensor, Tensor)): node features, or ``(x_src, x_dst)``.
            edge_index (Tensor, EdgeIndex, torch.sparse or AttentionGraph):
                the edges ``edge_index[0] -> edge_index[1]``.
            edge_attr (Tensor, optional): ``[|E|, edge_dim]`` in the order of
                ``edge_index``. (default: :obj:`None`)
            return_attention_weights (bool, optional): when set (to any
                bool, as in PyG), also return ``(edge_index, alpha)``.
                (default: :obj:`None`)
            backend (str, optional): this call's backend instead of the
                layer's. (default: :obj:`None`)
        """
        graph, x_src, x_dst, edge_attr = self._inputs(x, edge_index, edge_attr)
        h, c = self.heads, self.out_channels
        q = self.lin_query(x_dst).view(-1, h, c)  # (N, H, C)
        k = self.lin_key(x_src).view(-1, h, c)  # (M, H, C)
        v = self.lin_value(x_src).view(-1, h, c)  # (M, H, C)
        need_weights = isinstance(return_attention_weights, bool)
        backend = self.backend if backend is None else check_backend(backend)
        if takes_pyg_path(self):
            o, alpha = self._propagate(q, k, v, graph, edge_attr)
        else:
            o, alpha = self._attend(q, k, v, graph, edge_attr, need_weights, backend)
        out = o.reshape(-1, h * c) if self.concat else o.mean(dim=1)  # (N, H*C) or (N, C)
        if self.root_weight:
            x_r = self.lin_skip(x_dst)
            if self.lin_beta is not None:
                b = self.lin_beta(torch.cat([out, x_r, out - x_r], dim=-1)).sigmoid()
                out = b * x_r + (1 - b) * out
            else:
                out = out + x_r
        if need_weights:
            assert alpha is not None
            given = edge_index if isinstance(edge_index, Tensor) else edge_index.edge_index
            return out, (given, alpha)
        return out

    def _attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        graph: AnyGraph,
        edge_attr: Tensor | None,
        need_weights: bool,
        backend: str,
    ) -> tuple[Tensor, Tensor | None]:
        """``(out [N, H, C], alpha [|E|, H] or None)`` from gnnattn's operator."""
        w_edge = self.lin_edge.weight if self.lin_edge is not None else None  # (H*C, F)
        res = attend(
            q,
            k,
            v,
            graph,
            scale=1.0 / math.sqrt(self.out_channels),
            edge_attr=edge_attr,
            edge_key=w_edge,
            edge_value=w_edge,
            dropout_p=self.dropout if self.training else 0.0,
            backend=backend,
            need_weights=need_weights,
        )
        return (res.out, res.weights) if isinstance(res, AttentionOutput) else (res, None)

    def _propagate(
        self, q: Tensor, k: Tensor, v: Tensor, graph: AnyGraph, edge_attr: Tensor | None
    ) -> tuple[Tensor, Tensor | None]:
        """``(out [N, H, C], alpha [|E|, H])`` from PyG's ``propagate`` and :meth:`message`,
        where hooks and explainers see the messages."""
        edge_index = pyg_edge_index(graph, type(self).__name__)
        out = self.propagate(edge_index, query=q, key=k, value=v, edge_attr=edge_attr)
        alpha, self._alpha = self._alpha, None
        return out, alpha

    # The annotations name no alias (OptTensor): PyG copies them into the
    # propagate it generates, whose module sees only torch's names.
    def message(
        self,
        query_i: Tensor,
        key_j: Tensor,
        value_j: Tensor,
        edge_attr: Tensor | None,
        index: Tensor,
        ptr: Tensor | None,
        size_i: int | None,
    ) -> Tensor:
        """PyG's message: ``alpha_ij (W_2 x_j + W_6 e_ij)``, ``[|E|, H, C]``."""
        if self.lin_edge is not None:
            assert edge_attr is not None
            edge_attr = self.lin_edge(edge_attr).view(-1, self.heads, self.out_channels)
            key_j = key_j + edge_attr
        alpha = (query_i * key_j).sum(dim=-1) / math.sqrt(self.out_channels)
        # gnnattn's softmax, not PyG's: a target whose scores are all -inf gets zero
        # weights (PyG's gives NaN), as on the operator's path.
        assert size_i is not None  # propagate sizes the targets from query_i
        alpha = segment_softmax(alpha, index, size_i)
        self._alpha = alpha
        alpha = F.dropout(alpha, p=self.dropout, training=self.training)
        out = value_j if edge_attr is None else value_j + edge_attr
        return out * alpha.view(-1, self.heads, 1)

    def backend_for(
        self,
        x: Tensor | tuple[Tensor, Tensor],
        edge_index: PartLike,
        edge_attr: Tensor | None = None,
        *,
        backend: str | None = None,
    ) -> BackendChoice:
        """The backend the call ``self(x, edge_index, edge_attr)`` takes, and why.

        Example:
            >>> conv = TransformerConv(8, 4, heads=2)
            >>> ei = torch.tensor([[0, 1, 2], [1, 2, 0]])
            >>> conv.backend_for(torch.randn(3, 8), ei)
            BackendChoice(backend='fused', reason='sparse graph: the fused cpu kernel')
        """
        graph, _, x_dst, edge_attr = self._inputs(x, edge_index, edge_attr)
        backend = self.backend if backend is None else check_backend(backend)
        if takes_pyg_path(self):
            return PYG_PROPAGATE
        return choose(
            x_dst.new_empty(0, self.heads, self.out_channels),
            graph,
            backend=backend,
            dropout_p=self.dropout if self.training else 0.0,
            edge_attr=edge_attr is not None,
        )

    def _inputs(
        self,
        x: Tensor | tuple[Tensor, Tensor],
        edge_index: PartLike,
        edge_attr: Tensor | None,
    ) -> tuple[AnyGraph, Tensor, Tensor, Tensor | None]:
        """``(graph, x_src, x_dst, edge_attr)`` checked, with ``edge_attr`` on the graph's edges."""
        if isinstance(x, Tensor):
            x_src = x_dst = check_x(x, _width(self.lin_query))
        else:
            x_src, x_dst = self._pair(x)
        check_like(x_src, self.lin_key.weight, "x" if x_src is x else "x[0]")
        check_like(x_dst, self.lin_query.weight, "x" if x_dst is x else "x[1]")
        graph = graph_or_part(
            edge_index,
            num_src=x_src.shape[0],
            num_dst=x_dst.shape[0],
            device=x_dst.device,
            bipartite=not isinstance(x, Tensor),
        )
        return graph, x_src, x_dst, self._edge_attr(edge_attr, graph, x_dst)

    def _pair(self, x: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        if not isinstance(x, (tuple, list)) or len(x) != 2:
            raise TypeError(
                f"Expected 'x' to be a Tensor or a pair (x_src, x_dst), got {type(x).__name__}"
            )
        return (
            check_x(x[0], _width(self.lin_key), "x[0]"),
            check_x(x[1], _width(self.lin_query), "x[1]"),
        )

    def _edge_attr(self, edge_attr: Tensor | None, graph: AnyGraph, x: Tensor) -> Tensor | None:
        lin = self.lin_edge
        if lin is None:
            # PyG ignores edge_attr without edge_dim: so does this layer.
            return None
        width = _width(lin)
        shown = "F" if width is None else width
        if edge_attr is None:
            raise ValueError(
                f"Expected 'edge_attr' of shape [E, {shown}] (the layer has "
                f"edge_dim={self.edge_dim}), got None"
            )
        check_tensor(edge_attr, "edge_attr")
        if edge_attr.dim() == 1 and width == 1:
            edge_attr = edge_attr.view(-1, 1)
        if (
            edge_attr.dim() != 2
            or edge_attr.shape[0] != graph.num_edges
            or edge_attr.shape[1] != (width or edge_attr.shape[1])
        ):
            raise ValueError(
                f"Expected 'edge_attr' of shape [{graph.num_edges}, {shown}], got "
                f"{list(edge_attr.shape)}"
            )
        check_edge_input(edge_attr, x, "edge_attr")
        if width is None:
            # A lazy edge_dim (-1): the fused path reads lin_edge's weight without
            # calling lin_edge, so its width is set here, as its first call would.
            lin.initialize_parameters(lin, (edge_attr,))
        return graph.select_edges(edge_attr)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.in_channels}, {self.out_channels}, heads={self.heads})"
