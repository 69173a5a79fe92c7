r"""Graph-transformer blocks: attention over a graph + feed-forward, residuals, LayerNorm.

On the complete graph :class:`GraphTransformerLayer` is exactly
:class:`torch.nn.TransformerEncoderLayer` (``batch_first=True``) and
:class:`GraphTransformer` is :class:`torch.nn.TransformerEncoder`; on any other
graph the attention runs over its edges (a causal DAG, a molecule, a citation
graph), the feed-forward stays per node.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from types import MappingProxyType

import torch
import torch.nn.functional as F
from torch import Tensor

from ..checks import check_bool, check_float, check_int, check_tensor, check_x
from ..ops import BackendChoice, relu_dropout
from .bias import check_attn_bias
from .conv import SelfAttentionConv
from .dropout import Dropout
from .parts import AnyGraph, PartLike, graph_or_part

__all__ = ["GraphTransformer", "GraphTransformerLayer"]

_ACTIVATIONS: Mapping[str, Callable[[Tensor], Tensor]] = MappingProxyType(
    {"relu": F.relu, "gelu": F.gelu}
)


def _activation(activation: str | Callable[[Tensor], Tensor]) -> Callable[[Tensor], Tensor]:
    if isinstance(activation, str):
        if activation not in _ACTIVATIONS:
            raise ValueError(
                f"Expected 'activation' to be one of {sorted(_ACTIVATIONS)} or a callable, "
                f"got {activation!r}"
            )
        return _ACTIVATIONS[activation]
    if not callable(activation):
        raise TypeError(
            f"Expected 'activation' to be a str or a callable, got {type(activation).__name__}"
        )
    return activation


def _self_attention_input(x: object, width: int) -> None:
    """A block is self-attention with a residual: ``x`` is one ``[|V|, D]`` tensor (checked
    before the first norm, whose own error would not name ``x``)."""
    if isinstance(x, (tuple, list)):
        raise TypeError(
            "Expected 'x' to be a Tensor [N, D] (a transformer block attends within one set "
            "of nodes and adds x back), got a pair; for (x_src, x_dst) use "
            "SelfAttentionConv or TransformerConv"
        )
    check_x(x, width)


class GraphTransformerLayer(torch.nn.Module):
    r"""A transformer encoder layer whose self-attention runs over a graph.

    With :math:`\mathrm{SA}` the :class:`~gnnattn.SelfAttentionConv` over the
    edges and :math:`\mathrm{FF}(x) = W_2\,\sigma(W_1 x + b_1) + b_2`:

    .. math::
        \text{norm\_first:}\quad
        x \leftarrow x + \mathrm{SA}(\mathrm{LN}_1(x)),\quad
        x \leftarrow x + \mathrm{FF}(\mathrm{LN}_2(x))

    .. math::
        \text{post-norm:}\quad
        x \leftarrow \mathrm{LN}_1(x + \mathrm{SA}(x)),\quad
        x \leftarrow \mathrm{LN}_2(x + \mathrm{FF}(x))

    (dropout after the attention, inside and after the feed-forward, by
    :class:`gnnattn.nn.Dropout`: on the CPU the attention kernels' stream,
    several times faster than torch's). The
    submodules carry :class:`torch.nn.TransformerEncoderLayer`'s names
    (``self_attn``, ``linear1``, ``linear2``, ``norm1``, ``norm2``), and with
    the same weights the outputs are equal on the complete graph of each
    sequence (:meth:`from_torch` / :meth:`to_torch`).

    Args:
        embed_dim (int): :math:`D`, the width of the nodes.
        num_heads (int): attention heads; must divide ``embed_dim``.
        ffn_dim (int, optional): hidden width of the feed-forward.
            (default: ``4 * embed_dim``)
        dropout (float, optional): on the attention weights, inside and after
            the feed-forward and after the attention. (default: ``0.0``)
        activation (str or callable, optional): ``"relu"``, ``"gelu"`` or a
            function. (default: ``"relu"``)
        norm_first (bool, optional): pre-norm (LayerNorm before each
            sub-block) or post-norm (after each residual; the original
            transformer and torch's default). (default: :obj:`True`)
        causal (bool, optional): attend only to :math:`j \le i`.
            (default: :obj:`False`)
        bias (bool, optional): biases in the linear maps and LayerNorms.
            (default: :obj:`True`)
        layer_norm_eps (float, optional): LayerNorm epsilon. (default: ``1e-5``)
        edge_dim (int, optional): edge-feature width, passed to the attention.
            (default: :obj:`None`)
        edge_value (bool, optional): edge features also enter the values.
            (default: :obj:`False`)
        backend (str, optional): the attention backend. (default: ``"auto"``)

    A call's ``attn_bias`` ``[|E|, H]`` (a shortest-path distance or a
    structural encoding per pair, in the graph's ``edge_index`` order) is added
    to the attention scores (`PyG#9511
    <https://github.com/pyg-team/pytorch_geometric/issues/9511>`_); it runs on
    the fused kernels.

    Shapes:
        - **input:** ``x`` ``[|V|, D]``, optional ``edge_index`` ``[2, |E|]``,
          ``edge_attr`` ``[|E|, edge_dim]``, ``batch`` ``[|V|]``,
          ``attn_bias`` ``[|E|, H]``
        - **output:** ``[|V|, D]``; with ``return_attention_weights=True`` also
          ``(edge_index, alpha [|E|, H])``

    Example:
        >>> from gnnattn.nn import GraphTransformerLayer
        >>> layer = GraphTransformerLayer(16, 4)
        >>> layer
        GraphTransformerLayer(16, heads=4, ffn_dim=64, norm_first=True)
        >>> x = torch.randn(10, 16)
        >>> layer(x, batch=torch.tensor([0] * 4 + [1] * 6)).shape
        torch.Size([10, 16])
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        ffn_dim: int | None = None,
        dropout: float = 0.0,
        *,
        activation: str | Callable[[Tensor], Tensor] = "relu",
        norm_first: bool = True,
        causal: bool = False,
        bias: bool = True,
        layer_norm_eps: float = 1e-5,
        edge_dim: int | None = None,
        edge_value: bool = False,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        ffn_dim = 4 * embed_dim if ffn_dim is None else ffn_dim
        check_int(ffn_dim, "ffn_dim", min=1)
        check_bool(norm_first, "norm_first")
        # torch.nn.LayerNorm takes any eps; a NaN or negative one only shows as NaN outputs.
        layer_norm_eps = check_float(layer_norm_eps, "layer_norm_eps", lo=0.0, finite=True)
        self.self_attn = SelfAttentionConv(
            embed_dim,
            num_heads,
            dropout=dropout,
            bias=bias,
            causal=causal,
            backend=backend,
            edge_dim=edge_dim,
            edge_value=edge_value,
        )
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.ffn_dim = ffn_dim
        self.norm_first = norm_first
        self.activation = _activation(activation)
        self.linear1 = torch.nn.Linear(embed_dim, ffn_dim, bias=bias)
        self.linear2 = torch.nn.Linear(ffn_dim, embed_dim, bias=bias)
        self.norm1 = torch.nn.LayerNorm(embed_dim, eps=layer_norm_eps, bias=bias)
        self.norm2 = torch.nn.LayerNorm(embed_dim, eps=layer_norm_eps, bias=bias)
        self.dropout = Dropout(dropout)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.reset_parameters()

    @property
    def causal(self) -> bool:
        return self.self_attn.causal

    def reset_parameters(self) -> None:
        """Re-initialize every submodule (as freshly built)."""
        self.self_attn.reset_parameters()
        for m in (self.linear1, self.linear2, self.norm1, self.norm2):
            m.reset_parameters()

    def forward(
        self,
        x: Tensor,
        edge_index: PartLike | None = None,
        edge_attr: Tensor | None = None,
        *,
        batch: Tensor | None = None,
        attn_bias: Tensor | None = None,
        return_attention_weights: bool = False,
        backend: str | None = None,
    ) -> Tensor | tuple[Tensor, tuple[Tensor, Tensor]]:
        """One block over ``edge_index`` (default: complete/causal graph per sequence).

        Args:
            x (Tensor): ``[|V|, D]``.
            edge_index (AttentionGraph or Tensor, optional): the graph, as in
                :class:`~gnnattn.SelfAttentionConv`. (default: :obj:`None`)
            edge_attr (Tensor, optional): ``[|E|, edge_dim]``.
                (default: :obj:`None`)
            batch (Tensor, optional): sequence id of every node, instead of
                ``edge_index``. (default: :obj:`None`)
            attn_bias (Tensor, optional): ``[|E|, H]`` added to the attention
                scores, in the graph's ``edge_index`` order.
                (default: :obj:`None`)
            return_attention_weights (bool, optional): also return
                ``(edge_index, alpha)`` of the attention. (default: :obj:`False`)
            backend (str, optional): the attention's backend for this call
                instead of the layer's. (default: :obj:`None`)
        """
        _self_attention_input(x, self.embed_dim)
        h = self.norm1(x) if self.norm_first else x
        res = self.self_attn(
            h,
            edge_index,
            edge_attr,
            batch=batch,
            attn_bias=attn_bias,
            return_attention_weights=return_attention_weights,
            backend=backend,
        )
        if isinstance(res, tuple):
            sa, weights = res
        else:
            sa, weights = res, None
        if self.norm_first:
            x = x + self.dropout1(sa)
            x = x + self._ff(self.norm2(x))
        else:
            x = self.norm1(x + self.dropout1(sa))
            x = self.norm2(x + self._ff(x))
        if weights is not None:
            return x, weights
        return x

    def backend_for(
        self,
        x: Tensor,
        edge_index: PartLike | None = None,
        edge_attr: Tensor | None = None,
        *,
        batch: Tensor | None = None,
        attn_bias: Tensor | None = None,
        backend: str | None = None,
    ) -> BackendChoice:
        """The backend the attention of ``self(x, edge_index, edge_attr, batch=batch,
        attn_bias=attn_bias)`` takes, and why (:meth:`SelfAttentionConv.backend_for
        <gnnattn.SelfAttentionConv.backend_for>` of ``self_attn``).

        Example:
            >>> from gnnattn.nn import GraphTransformerLayer
            >>> layer = GraphTransformerLayer(16, 4, causal=True)
            >>> layer.backend_for(torch.randn(6, 16)).backend
            'sdpa'
        """
        # The attention sees norm1(x) under norm_first: the same shape, dtype and device.
        return self.self_attn.backend_for(
            x, edge_index, edge_attr, batch=batch, attn_bias=attn_bias, backend=backend
        )

    def _ff(self, x: Tensor) -> Tensor:
        h = self.linear1(x)  # (N, ffn_dim)
        if self.activation is F.relu and isinstance(self.dropout, Dropout):
            # One pass, whose backward reads only its output (the mask is the
            # same one self.dropout(F.relu(h)) draws).
            h = relu_dropout(h, self.dropout.p, self.training)
        else:
            h = self.dropout(self.activation(h))
        return self.dropout2(self.linear2(h))

    @classmethod
    def from_torch(
        cls, encoder_layer: torch.nn.TransformerEncoderLayer, **kwargs
    ) -> GraphTransformerLayer:
        """A layer with the weights of ``encoder_layer`` (equal on the complete graph).

        Args:
            encoder_layer (torch.nn.TransformerEncoderLayer): any
                ``batch_first``; its activation (relu, gelu or a callable) is kept.
            **kwargs: ``causal``, ``backend``, ``edge_dim``, ``edge_value`` for
                the new layer.
        """
        if not isinstance(encoder_layer, torch.nn.TransformerEncoderLayer):
            raise TypeError(
                f"Expected 'encoder_layer' to be a torch.nn.TransformerEncoderLayer, got "
                f"{type(encoder_layer).__name__}"
            )
        t = encoder_layer
        attn = SelfAttentionConv.from_torch(t.self_attn, **kwargs)
        layer = cls(
            attn.embed_dim,
            attn.num_heads,
            t.linear1.out_features,
            t.dropout.p,
            activation=t.activation,
            norm_first=t.norm_first,
            causal=attn.causal,
            bias=t.linear1.bias is not None,
            layer_norm_eps=t.norm1.eps,
            edge_dim=attn.edge_dim,
            edge_value=attn.edge_value,
            backend=attn.backend,
        )
        layer = layer.to(device=t.linear1.weight.device, dtype=t.linear1.weight.dtype)
        if attn.edge_dim is not None:
            # Keep the fresh edge maps, drawn in the new layer.
            assert layer.self_attn.lin_edge is not None and attn.lin_edge is not None
            attn.lin_edge.load_state_dict(layer.self_attn.lin_edge.state_dict())
            if attn.lin_edge_value is not None and layer.self_attn.lin_edge_value is not None:
                attn.lin_edge_value.load_state_dict(layer.self_attn.lin_edge_value.state_dict())
        layer.self_attn = attn
        for name in ("linear1", "linear2", "norm1", "norm2"):
            getattr(layer, name).load_state_dict(getattr(t, name).state_dict())
        layer.train(t.training)
        return layer

    def to_torch(self) -> torch.nn.TransformerEncoderLayer:
        """An equal ``torch.nn.TransformerEncoderLayer`` (``batch_first=True``)."""
        w = self.linear1.weight
        t = torch.nn.TransformerEncoderLayer(
            self.embed_dim,
            self.num_heads,
            self.ffn_dim,
            self.dropout.p,
            activation=self.activation,
            layer_norm_eps=self.norm1.eps,
            batch_first=True,
            norm_first=self.norm_first,
            bias=self.linear1.bias is not None,
            device=w.device,
            dtype=w.dtype,
        )
        t.self_attn = self.self_attn.to_torch(batch_first=True)
        for name in ("linear1", "linear2", "norm1", "norm2"):
            getattr(t, name).load_state_dict(getattr(self, name).state_dict())
        t.train(self.training)
        return t

    def __repr__(self) -> str:
        causal = ", causal=True" if self.causal else ""
        return (
            f"{self.__class__.__name__}({self.embed_dim}, heads={self.num_heads}, "
            f"ffn_dim={self.ffn_dim}, norm_first={self.norm_first}{causal})"
        )


class GraphTransformer(torch.nn.Module):
    r"""A stack of :class:`GraphTransformerLayer` on one graph, with an optional final norm.

    Equal to :class:`torch.nn.TransformerEncoder` with the same layers (and its
    ``norm``) on the complete graph. One :class:`~gnnattn.AttentionGraph`
    (made from ``batch`` or the given ``edge_index``, or the one given) is
    passed to every layer, so the graph is analysed once per call; build it
    once yourself to analyse it once for good.

    Args:
        num_layers (int): number of blocks.
        embed_dim (int): :math:`D`.
        num_heads (int): attention heads.
        ffn_dim (int, optional): feed-forward width. (default: ``4 * embed_dim``)
        dropout (float, optional): dropout of every block. (default: ``0.0``)
        final_norm (bool, optional): a LayerNorm after the last block; the
            default is ``norm_first`` (pre-norm stacks need one, post-norm
            stacks end normalized). (default: :obj:`None`)
        **kwargs: the other arguments of :class:`GraphTransformerLayer`
            (``activation``, ``norm_first``, ``causal``, ``edge_dim``, ...).

    Shapes:
        - **input:** ``x`` ``[|V|, D]``, optional ``edge_index``,
          ``edge_attr``, ``batch`` as in :class:`GraphTransformerLayer`
        - **output:** ``[|V|, D]``

    Example:
        >>> from gnnattn.nn import GraphTransformer
        >>> model = GraphTransformer(2, 16, 4, causal=True)
        >>> model(torch.randn(6, 16)).shape
        torch.Size([6, 16])
    """

    def __init__(
        self,
        num_layers: int,
        embed_dim: int,
        num_heads: int,
        ffn_dim: int | None = None,
        dropout: float = 0.0,
        *,
        final_norm: bool | None = None,
        **kwargs,
    ) -> None:
        super().__init__()
        check_int(num_layers, "num_layers", min=1)
        self.layers = torch.nn.ModuleList(
            GraphTransformerLayer(embed_dim, num_heads, ffn_dim, dropout, **kwargs)
            for _ in range(num_layers)
        )
        first = self._layer(0)
        if final_norm is None:
            final_norm = first.norm_first
        self.norm: torch.nn.Module | None = None
        if final_norm:
            self.norm = torch.nn.LayerNorm(
                embed_dim, eps=first.norm1.eps, bias=first.norm1.bias is not None
            )
        self.num_layers = num_layers
        self.embed_dim = embed_dim
        self.num_heads = num_heads

    def _layer(self, i: int) -> GraphTransformerLayer:
        layer = self.layers[i]
        assert isinstance(layer, GraphTransformerLayer)
        return layer

    @property
    def causal(self) -> bool:
        return self._layer(0).causal

    def reset_parameters(self) -> None:
        """Re-initialize every block and the final norm."""
        for i in range(self.num_layers):
            self._layer(i).reset_parameters()
        if isinstance(self.norm, torch.nn.LayerNorm):
            self.norm.reset_parameters()

    def forward(
        self,
        x: Tensor,
        edge_index: PartLike | None = None,
        edge_attr: Tensor | None = None,
        *,
        batch: Tensor | None = None,
        attn_bias: Tensor | None = None,
        return_attention_weights: bool = False,
        backend: str | None = None,
    ) -> Tensor | tuple[Tensor, list[tuple[Tensor, Tensor]]]:
        """All blocks over one graph (default: complete/causal graph per sequence).

        Args:
            x (Tensor): ``[|V|, D]``.
            edge_index (AttentionGraph or Tensor, optional): the graph, as in
                :class:`~gnnattn.SelfAttentionConv`. (default: :obj:`None`)
            edge_attr (Tensor, optional): ``[|E|, edge_dim]``, used by every
                block. (default: :obj:`None`)
            batch (Tensor, optional): sequence id of every node, instead of
                ``edge_index``. (default: :obj:`None`)
            attn_bias (Tensor, optional): ``[|E|, H]`` added to the scores of
                every block, in the graph's ``edge_index`` order.
                (default: :obj:`None`)
            return_attention_weights (bool, optional): also return one
                ``(edge_index, alpha [|E|, H])`` per block. (default: :obj:`False`)
            backend (str, optional): every block's attention backend for this
                call instead of the layers'. (default: :obj:`None`)
        """
        _self_attention_input(x, self.embed_dim)
        graph, edge_attr = self._inputs(x, edge_index, edge_attr, batch)
        if attn_bias is not None:
            # Aligned with the graph's edges once, for every block.
            attn_bias = check_attn_bias(attn_bias, graph, self.num_heads, x.device)
        weights: list[tuple[Tensor, Tensor]] = []
        for layer in self.layers:
            res = layer(
                x,
                graph,
                edge_attr,
                attn_bias=attn_bias,
                return_attention_weights=return_attention_weights,
                backend=backend,
            )
            if isinstance(res, tuple):
                x, w = res
                weights.append(w)
            else:
                x = res
        if self.norm is not None:
            x = self.norm(x)
        if return_attention_weights:
            return x, weights
        return x

    def backend_for(
        self,
        x: Tensor,
        edge_index: PartLike | None = None,
        edge_attr: Tensor | None = None,
        *,
        batch: Tensor | None = None,
        attn_bias: Tensor | None = None,
        backend: str | None = None,
    ) -> list[BackendChoice]:
        """The backend each block's attention takes in ``self(x, edge_index, edge_attr,
        batch=batch)``, and why: one per block, as ``return_attention_weights`` gives
        one ``(edge_index, alpha)`` per block (blocks may have backends of their own).

        Example:
            >>> from gnnattn.nn import GraphTransformer
            >>> model = GraphTransformer(2, 16, 4)
            >>> [c.backend for c in model.backend_for(torch.randn(6, 16))]
            ['sdpa', 'sdpa']
        """
        graph, edge_attr = self._inputs(x, edge_index, edge_attr, batch)
        if attn_bias is not None:
            attn_bias = check_attn_bias(attn_bias, graph, self.num_heads, x.device)
        return [
            self._layer(i).backend_for(x, graph, edge_attr, attn_bias=attn_bias, backend=backend)
            for i in range(self.num_layers)
        ]

    def _inputs(
        self,
        x: Tensor,
        edge_index: PartLike | None,
        edge_attr: Tensor | None,
        batch: Tensor | None,
    ) -> tuple[AnyGraph, Tensor | None]:
        """One graph object for every block, and ``edge_attr`` on its edges."""
        # Built (validated, pruned, analysed) once per call, whatever form the
        # graph came in.
        graph = graph_or_part(
            edge_index,
            num_src=x.shape[0],
            num_dst=x.shape[0],
            device=x.device,
            batch=batch,
            causal=self.causal,
        )
        if edge_attr is not None:
            # Checked as the layers check it, then aligned with the graph's
            # edges once for every layer.
            check_tensor(edge_attr, "edge_attr")
            # Its width before the pruning below, whose message would count kept rows.
            edge_dim = self._layer(0).self_attn.edge_dim
            if edge_dim is not None and (edge_attr.dim() != 2 or edge_attr.shape[1] != edge_dim):
                raise ValueError(
                    f"Expected 'edge_attr' of shape [E, {edge_dim}] (one row per edge of "
                    f"edge_index; the layers have edge_dim={edge_dim}), got "
                    f"{list(edge_attr.shape)}"
                )
            if edge_index is None:
                raise ValueError(
                    "Expected an explicit 'edge_index' with 'edge_attr' (its rows follow the "
                    "edges of edge_index), got edge_index=None"
                )
            edge_attr = graph.select_edges(edge_attr)
        return graph, edge_attr

    @classmethod
    def from_torch(cls, encoder: torch.nn.TransformerEncoder, **kwargs) -> GraphTransformer:
        """A stack with the weights of ``encoder`` (its layers and ``norm``).

        Args:
            encoder (torch.nn.TransformerEncoder): of
                :class:`~torch.nn.TransformerEncoderLayer` blocks.
            **kwargs: ``causal``, ``backend``, ... for every layer.
        """
        if not isinstance(encoder, torch.nn.TransformerEncoder):
            raise TypeError(
                f"Expected 'encoder' to be a torch.nn.TransformerEncoder, got "
                f"{type(encoder).__name__}"
            )
        layers = [GraphTransformerLayer.from_torch(t, **kwargs) for t in encoder.layers]
        first = layers[0]
        model = cls(
            len(layers),
            first.embed_dim,
            first.num_heads,
            first.ffn_dim,
            final_norm=encoder.norm is not None,
            norm_first=first.norm_first,
        )
        model.layers = torch.nn.ModuleList(layers)
        if encoder.norm is not None:
            model.norm = copy.deepcopy(encoder.norm)
        model.train(encoder.training)
        return model

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}({self.num_layers}, {self.embed_dim}, "
            f"heads={self.num_heads})"
        )
