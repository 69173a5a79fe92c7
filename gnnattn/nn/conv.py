"""Multi-head scaled dot-product self-attention as a PyG message-passing layer."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.typing import OptTensor

from ..checks import check_bool, check_edge_input, check_int, check_like, check_probability, check_x
from ..ops import AttentionOutput, BackendChoice, check_backend
from ..softmax import segment_softmax
from .bias import check_attn_bias
from .parts import AnyGraph, PartLike, attend, choose, graph_or_part
from .pyg_path import PYG_PROPAGATE, PropagatedAttention, takes_pyg_path

__all__ = ["SelfAttentionConv"]


class SelfAttentionConv(PropagatedAttention):
    r"""Multi-head scaled dot-product self-attention over the edges of a graph.

    For every target :math:`i` and head :math:`h` (head dim :math:`C = D / H`):

    .. math::
        \alpha_{ij}^h = \operatorname{softmax}_{j \in \mathcal{N}(i)}
            \left(\frac{(W_Q x_i)^h \cdot (W_K x_j)^h}{\sqrt{C}}
            + (W_E e_{ij})^h\right),
        \qquad
        \mathbf{o}_i = W_O \,\Big\Vert_{h=1}^{H} \sum_{j \in \mathcal{N}(i)}
            \alpha_{ij}^h \left((W_V x_j)^h + (W_{EV} e_{ij})^h\right)

    with :math:`\mathcal{N}(i)` the sources of the edges :math:`j \to i`
    (``edge_index[0]`` is :math:`j`, ``edge_index[1]`` is :math:`i`). The
    edge terms exist only with ``edge_dim`` (:math:`W_E` maps an edge's
    features to one additive score bias per head) and ``edge_value=True``
    (:math:`W_{EV}` adds them to the value, as PyG's ``TransformerConv`` does).
    A call's ``attn_bias`` :math:`b_{ij}^h` (``[|E|, H]``, in the order of the
    graph's edges: a shortest-path distance or a structural encoding per pair)
    is added to the scores as well, beside :math:`(W_E e_{ij})^h`.

    On the complete graph this is exactly :class:`torch.nn.MultiheadAttention`
    (see :meth:`from_torch` / :meth:`to_torch`); with ``causal=True`` it is
    attention with ``is_causal=True``; with edge features it is dense attention
    with the additive float mask :math:`(W_E e_{ij})^h` (and :math:`-\infty`
    where there is no edge). Called on a pair ``(x_src, x_dst)`` it is
    cross-attention: queries from ``x_dst``, keys and values from ``x_src``; on
    the complete bipartite graph that is ``mha(x_dst, x_src, x_src)``. A target
    with no incoming edges gets a zero attention result, so its output is the
    output projection's bias.

    PyG's hooks (``register_message_forward_hook`` ...) and explainers
    (:class:`torch_geometric.explain.Explainer`, whose edge mask scales the
    messages) act on per-edge messages, which the operator never forms: a
    layer with any of them runs PyG's ``propagate`` with :meth:`message`
    (the same outputs; attention dropout from ``F.dropout``), whatever
    ``backend`` says, on a whole graph (not a distributed part).

    Args:
        embed_dim (int): :math:`D`, the width of ``x`` and of the output.
        num_heads (int, optional): :math:`H`; must divide ``embed_dim``.
            (default: ``1``)
        dropout (float, optional): dropout on the attention weights while
            training. (default: ``0.0``)
        bias (bool, optional): biases on the four projections.
            (default: :obj:`True`)
        causal (bool, optional): keep only edges :math:`j \le i` (the graph
            built when no ``edge_index`` is given becomes causal; an explicit
            graph is pruned, and ``edge_attr`` with it: a plain
            ``edge_index`` on every call, an :class:`~gnnattn.AttentionGraph`
            once, by the object itself). (default: :obj:`False`)
        backend (str, optional): the default backend of
            :func:`gnnattn.attention`: ``"auto"``, ``"mp"`` (message passing,
            the reference), ``"sdpa"`` (SDPA, for complete/causal/window
            graphs without edge features) or ``"fused"`` (sparse kernel: every
            option, dropout and edge features included); a call can override
            it (``layer(x, graph, backend="mp")``), and
            :meth:`backend_for` says which one a call takes and why.
            (default: ``"auto"``)
        edge_dim (int, optional): width of ``edge_attr``; enables the per-head
            score bias :math:`W_E e_{ij}`. (default: :obj:`None`)
        edge_value (bool, optional): also add :math:`W_{EV} e_{ij}` to the
            values (needs ``edge_dim``). (default: :obj:`False`)

    Shapes:
        - **input:** node features ``[|V|, D]`` or a pair ``([M, D], [N, D])``
          (sources, targets), optional graph (an
          :class:`~gnnattn.AttentionGraph` or ``edge_index`` ``[2, |E|]``), optional
          ``edge_attr`` ``[|E|, edge_dim]``, optional ``batch`` ``[|V|]``
        - **output:** ``[|V|, D]`` (``[N, D]`` for a pair); with
          ``return_attention_weights=True`` also
          ``(edge_index [2, |E|], alpha [|E|, H])``. ``alpha`` is taken
          *before* dropout and differentiable; on ``"sdpa"`` and ``"fused"`` it is
          a softmax of the scores recomputed on the edges.

    Example:
        >>> layer = SelfAttentionConv(8, num_heads=2)
        >>> layer
        SelfAttentionConv(8, heads=2)
        >>> x = torch.randn(5, 8)
        >>> layer(x).shape
        torch.Size([5, 8])
        >>> graph = AttentionGraph.causal(5)  # build once, pass to every call
        >>> out, (ei, alpha) = layer(x, graph, return_attention_weights=True)
        >>> alpha.shape
        torch.Size([15, 2])
        >>> conv = SelfAttentionConv(8, num_heads=2, edge_dim=3)
        >>> ei = torch.tensor([[0, 1, 2], [1, 2, 0]])
        >>> conv(x[:3], ei, torch.randn(3, 3)).shape
        torch.Size([3, 8])
        >>> layer((torch.randn(7, 8), torch.randn(2, 8))).shape  # cross-attention
        torch.Size([2, 8])
    """

    # The arguments of the propagate call, for PyG's generated propagate (it
    # would otherwise parse them from this module's source).
    propagate_type = {
        "query": Tensor,
        "key": Tensor,
        "value": Tensor,
        "score_bias": OptTensor,
        "edge_attr": OptTensor,
    }

    def __init__(
        self,
        embed_dim: int,
        num_heads: int = 1,
        *,
        dropout: float = 0.0,
        bias: bool = True,
        causal: bool = False,
        backend: str = "auto",
        edge_dim: int | None = None,
        edge_value: bool = False,
    ) -> None:
        super().__init__(aggr="add", node_dim=0)
        check_int(embed_dim, "embed_dim", min=1)
        check_int(num_heads, "num_heads", min=1)
        if embed_dim % num_heads:
            raise ValueError(
                f"Expected 'embed_dim' divisible by 'num_heads', got embed_dim={embed_dim} "
                f"and num_heads={num_heads} (head dim would be {embed_dim / num_heads:g})"
            )
        check_probability(dropout, "dropout")
        check_bool(bias, "bias")
        check_bool(causal, "causal")
        check_bool(edge_value, "edge_value")
        check_int(edge_dim, "edge_dim", min=1, optional=True)
        if edge_value and edge_dim is None:
            raise ValueError(
                "Expected 'edge_dim' with edge_value=True (the width of edge_attr), got None"
            )
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.dropout = dropout
        self.causal = causal
        self.backend = check_backend(backend)
        self.edge_dim = edge_dim
        self.edge_value = edge_value
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.lin_query = torch.nn.Linear(embed_dim, embed_dim, bias=bias)
        self.lin_key = torch.nn.Linear(embed_dim, embed_dim, bias=bias)
        self.lin_value = torch.nn.Linear(embed_dim, embed_dim, bias=bias)
        self.lin_out = torch.nn.Linear(embed_dim, embed_dim, bias=bias)
        # A bias on the score map would add one constant per head to every
        # score of a target: softmax cancels it, so there is none.
        self.lin_edge: torch.nn.Linear | None = None
        self.lin_edge_value: torch.nn.Linear | None = None
        if edge_dim is not None:
            self.lin_edge = torch.nn.Linear(edge_dim, num_heads, bias=False)
            if edge_value:
                self.lin_edge_value = torch.nn.Linear(edge_dim, embed_dim, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``nn.MultiheadAttention``'s initialisation: its packed ``[3D, D]`` input
        projection Xavier-uniform, the output projection ``Linear``'s own, zero biases."""
        super().reset_parameters()
        # Xavier's bound on MHA's in_proj_weight [3D, D] (fan_out 3D): on each
        # [D, D] block alone it would be sqrt(2) wider than MHA's.
        d = self.embed_dim
        bound = math.sqrt(6.0 / (d + 3 * d))
        for lin in (self.lin_query, self.lin_key, self.lin_value):
            torch.nn.init.uniform_(lin.weight, -bound, bound)
            if lin.bias is not None:
                torch.nn.init.zeros_(lin.bias)
        self.lin_out.reset_parameters()
        if self.lin_out.bias is not None:
            torch.nn.init.zeros_(self.lin_out.bias)
        for edge_lin in (self.lin_edge, self.lin_edge_value):
            if edge_lin is not None:
                edge_lin.reset_parameters()

    def forward(
        self,
        x: Tensor | tuple[Tensor, Tensor],
        edge_index: PartLike | None = None,
        edge_attr: Tensor | None = None,
        *,
        batch: Tensor | None = None,
        attn_bias: Tensor | None = None,
        return_attention_weights: bool = False,
        backend: str | None = None,
    ) -> Tensor | tuple[Tensor, tuple[Tensor, Tensor]]:
        """Attend over ``edge_index`` (default: the complete or causal graph).

        Args:
            x (Tensor or (Tensor, Tensor)): node features ``[|V|, D]``, or
                ``(x_src [M, D], x_dst [N, D])`` for cross-attention on a
                bipartite graph (``edge_index[0]`` indexes ``x_src``,
                ``edge_index[1]`` indexes ``x_dst``).
            edge_index (AttentionGraph or Tensor, optional): the graph: an
                :class:`~gnnattn.AttentionGraph` (built once, analysed once),
                a ``[2, |E|]`` edge index (messages ``edge_index[0] ->
                edge_index[1]``; validated and analysed on every call), a
                ``torch_geometric.EdgeIndex`` or a ``torch.sparse`` ``adj_t``;
                default: the complete (causal) graph, or the complete
                bipartite graph for a pair. (default: :obj:`None`)
            edge_attr (Tensor, optional): ``[|E|, edge_dim]`` features of the
                edges, in the order of the given edges. (default: :obj:`None`)
            batch (Tensor, optional): sorted sequence id of every node: one
                complete (or causal) graph per sequence; not together with
                ``edge_index``. (default: :obj:`None`)
            attn_bias (Tensor, optional): ``[|E|, H]`` added to the scores, one
                row per edge of the graph in its ``edge_index`` order (for a
                causal layer, of the edges as given or as kept).
                (default: :obj:`None`)
            return_attention_weights (bool, optional): also return
                ``(edge_index, alpha)``. (default: :obj:`False`)
            backend (str, optional): this call's backend instead of the
                layer's. (default: :obj:`None`)
        """
        graph, x_src, x_dst, edge_attr = self._inputs(x, edge_index, edge_attr, batch)
        if attn_bias is not None:
            attn_bias = self._check_attn_bias(attn_bias, graph, x_dst)
        h, c = self.num_heads, self.head_dim
        n_src, n_dst = x_src.shape[0], x_dst.shape[0]
        score_bias = None
        if self.lin_edge is not None and edge_attr is not None:
            score_bias = self.lin_edge(edge_attr)  # (E, H)
        if attn_bias is not None:
            score_bias = attn_bias if score_bias is None else score_bias + attn_bias
        q = self.lin_query(x_dst).view(n_dst, h, c)  # (N, H, C)
        k = self.lin_key(x_src).view(n_src, h, c)  # (M, H, C)
        v = self.lin_value(x_src).view(n_src, h, c)  # (M, H, C)
        backend = self.backend if backend is None else check_backend(backend)
        if takes_pyg_path(self):
            o, alpha = self._propagate(q, k, v, graph, score_bias, edge_attr)
        else:
            o, alpha = self._attend(
                q, k, v, graph, score_bias, edge_attr, return_attention_weights, backend
            )
        out = self.lin_out(o.reshape(n_dst, self.embed_dim))  # (N, D)
        if return_attention_weights:
            assert alpha is not None
            return out, (graph.edge_index, alpha)
        return out

    def _attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        graph: AnyGraph,
        score_bias: Tensor | None,
        edge_attr: Tensor | None,
        need_weights: bool,
        backend: str,
    ) -> tuple[Tensor, Tensor | None]:
        """``(out [N, H, C], alpha [|E|, H] or None)`` from gnnattn's operator."""
        # W_EV e_ij enters the values through the operator's edge_value: the
        # fused path aggregates the raw features and maps the aggregate, so no
        # [E, D] tensor is made (the same function: lin_edge_value has no bias).
        edge_value = self.lin_edge_value.weight if self.lin_edge_value is not None else None
        res = attend(
            q,
            k,
            v,
            graph,
            scale=self.scale,
            score_bias=score_bias,
            dropout_p=self.dropout if self.training else 0.0,
            backend=backend,
            need_weights=need_weights,
            edge_attr=edge_attr if edge_value is not None else None,
            edge_value=edge_value,
        )
        if isinstance(res, AttentionOutput):
            return res.out, res.weights
        return res, None

    def _propagate(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        graph: AnyGraph,
        score_bias: Tensor | None,
        edge_attr: Tensor | None,
    ) -> tuple[Tensor, Tensor | None]:
        """``(out [N, H, C], alpha [|E|, H])`` from PyG's ``propagate`` and :meth:`message`,
        where hooks and explainers see the messages."""
        return self.propagate_over(
            graph,
            self.causal,
            size=(k.shape[0], q.shape[0]),
            query=q,
            key=k,
            value=v,
            score_bias=score_bias,
            edge_attr=edge_attr if self.lin_edge_value is not None else None,
        )

    # The annotations name no alias (OptTensor): PyG copies them into the
    # propagate it generates, whose module sees only torch's names.
    def message(
        self,
        query_i: Tensor,
        key_j: Tensor,
        value_j: Tensor,
        score_bias: Tensor | None,
        edge_attr: Tensor | None,
        index: Tensor,
        ptr: Tensor | None,
        size_i: int | None,
    ) -> Tensor:
        """The attention message ``alpha_ij (W_V x_j + W_EV e_ij)``, ``[|E|, H, C]``: the
        operator's, formed per edge."""
        alpha = (query_i * key_j).sum(dim=-1) * self.scale
        if score_bias is not None:
            alpha = alpha + score_bias
        # gnnattn's softmax, not PyG's: a target whose scores are all -inf gets zero
        # weights (PyG's gives NaN), as on the operator's path.
        assert size_i is not None  # propagate sizes the targets from query_i
        alpha = segment_softmax(alpha, index, size_i)
        self._alpha = alpha
        alpha = F.dropout(alpha, p=self.dropout, training=self.training)
        if edge_attr is not None and self.lin_edge_value is not None:
            value_j = value_j + self.lin_edge_value(edge_attr).view(-1, *value_j.shape[1:])
        return value_j * alpha.unsqueeze(-1)

    def backend_for(
        self,
        x: Tensor | tuple[Tensor, Tensor],
        edge_index: PartLike | None = None,
        edge_attr: Tensor | None = None,
        *,
        batch: Tensor | None = None,
        attn_bias: Tensor | None = None,
        backend: str | None = None,
    ) -> BackendChoice:
        """The backend the call ``self(x, edge_index, edge_attr, batch=batch,
        attn_bias=attn_bias)`` takes, and why.

        Example:
            >>> layer = SelfAttentionConv(8, num_heads=2)
            >>> ei = torch.tensor([[0, 1, 2], [1, 2, 0]])
            >>> layer.backend_for(torch.randn(3, 8), ei).backend
            'fused'
        """
        graph, _, x_dst, edge_attr = self._inputs(x, edge_index, edge_attr, batch)
        if attn_bias is not None:
            self._check_attn_bias(attn_bias, graph, x_dst)
        backend = self.backend if backend is None else check_backend(backend)
        if takes_pyg_path(self):
            return PYG_PROPAGATE
        return choose(
            x_dst.new_empty(0, self.num_heads, self.head_dim),
            graph,
            backend=backend,
            score_bias=edge_attr is not None or attn_bias is not None,
            dropout_p=self.dropout if self.training else 0.0,
            edge_attr=edge_attr is not None and self.edge_value,
        )

    def _inputs(
        self,
        x: Tensor | tuple[Tensor, Tensor],
        edge_index: PartLike | None,
        edge_attr: Tensor | None,
        batch: Tensor | None,
    ) -> tuple[AnyGraph, Tensor, Tensor, Tensor | None]:
        """``(graph, x_src, x_dst, edge_attr)`` checked, with ``edge_attr`` on the graph's edges."""
        x_src, x_dst, bipartite = self._split_x(x)
        graph = graph_or_part(
            edge_index,
            num_src=x_src.shape[0],
            num_dst=x_dst.shape[0],
            device=x_dst.device,
            batch=batch,
            causal=self.causal,
            bipartite=bipartite,
        )
        edge_attr = self._check_edge_attr(edge_attr, edge_index, graph, x_dst)
        return graph, x_src, x_dst, edge_attr

    # ----------------------------------------------------------------- input

    def _split_x(self, x: Tensor | tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor, bool]:
        if isinstance(x, (tuple, list)):
            if len(x) != 2:
                raise ValueError(
                    f"Expected 'x' to be a Tensor or a pair (x_src, x_dst), got a "
                    f"{type(x).__name__} of length {len(x)}"
                )
            x_src, x_dst = x
            check_x(x_src, self.embed_dim, "x[0]")
            check_x(x_dst, self.embed_dim, "x[1]")
            if x_src.device != x_dst.device:
                raise ValueError(
                    f"Expected 'x[0]' and 'x[1]' on one device, got {x_src.device} and "
                    f"{x_dst.device}"
                )
            if x_src.dtype != x_dst.dtype:
                raise TypeError(
                    f"Expected 'x[0]' and 'x[1]' of one dtype, got {x_src.dtype} and {x_dst.dtype}"
                )
            check_like(x_src, self.lin_query.weight)
            return x_src, x_dst, True
        check_x(x, self.embed_dim)
        check_like(x, self.lin_query.weight)
        return x, x, False

    def _check_edge_attr(
        self,
        edge_attr: Tensor | None,
        edge_index: PartLike | None,
        graph: AnyGraph,
        x: Tensor,
    ) -> Tensor | None:
        if edge_attr is None:
            if self.edge_dim is not None:
                raise ValueError(
                    f"Expected 'edge_attr' of shape [E, {self.edge_dim}] (the layer has "
                    f"edge_dim={self.edge_dim}), got None"
                )
            return None
        if self.edge_dim is None:
            raise ValueError(
                "Got 'edge_attr' but the layer has edge_dim=None; build it with "
                "SelfAttentionConv(..., edge_dim=edge_attr.shape[1])"
            )
        if not isinstance(edge_attr, Tensor):
            raise TypeError(f"Expected 'edge_attr' to be a Tensor, got {type(edge_attr).__name__}")
        if edge_index is None:
            raise ValueError(
                "Expected an explicit 'edge_index' with 'edge_attr' (its rows follow the edges "
                "of edge_index), got edge_index=None; pass e.g. complete_graph(N)"
            )
        if edge_attr.dim() != 2 or edge_attr.shape[1] != self.edge_dim:
            hint = " (use edge_attr.view(-1, 1))" if edge_attr.dim() == 1 else ""
            raise ValueError(
                f"Expected 'edge_attr' of shape [{graph.num_edges}, {self.edge_dim}] (one row "
                f"per edge of edge_index), got {list(edge_attr.shape)}{hint}"
            )
        check_edge_input(edge_attr, x, "edge_attr")
        # Rows follow the given edges; a causal layer's graph may have dropped some.
        return graph.select_edges(edge_attr)

    def _check_attn_bias(self, attn_bias: Tensor, graph: AnyGraph, x: Tensor) -> Tensor:
        """``attn_bias`` checked (shape, device, ``x``'s dtype), its rows the graph's edges."""
        attn_bias = check_attn_bias(attn_bias, graph, self.num_heads, x.device)
        check_edge_input(attn_bias, x, "attn_bias")
        return attn_bias

    # ----------------------------------------------------------------- interop

    @classmethod
    def from_torch(cls, mha: torch.nn.MultiheadAttention, **kwargs) -> SelfAttentionConv:
        """A layer with the weights of ``mha`` (outputs equal on the complete graph).

        Args:
            mha (torch.nn.MultiheadAttention): with or without biases; ``kdim``
                and ``vdim`` must equal ``embed_dim``, and ``add_bias_kv`` /
                ``add_zero_attn`` are not supported.
            **kwargs: ``causal``, ``backend``, ``edge_dim``, ``edge_value`` for
                the new layer (edge maps keep their fresh initialization).
        """
        if not isinstance(mha, torch.nn.MultiheadAttention):
            raise TypeError(
                f"Expected 'mha' to be a torch.nn.MultiheadAttention, got {type(mha).__name__}"
            )
        if mha.bias_k is not None or mha.add_zero_attn:
            raise ValueError(
                "Expected 'mha' without add_bias_kv and add_zero_attn (they add keys that are "
                "not nodes of the graph), got a module that uses them"
            )
        if not mha._qkv_same_embed_dim:
            raise ValueError(
                f"Expected 'mha' with kdim == vdim == embed_dim (self-attention), got "
                f"kdim={mha.kdim}, vdim={mha.vdim}, embed_dim={mha.embed_dim}"
            )
        taken = sorted(set(kwargs) & {"embed_dim", "num_heads", "dropout", "bias"})
        if taken:
            raise TypeError(
                f"Expected 'kwargs' among causal, backend, edge_dim and edge_value, got "
                f"{taken}: they come from 'mha'"
            )
        bias = mha.in_proj_bias is not None
        w = mha.in_proj_weight.detach()
        layer = cls(mha.embed_dim, mha.num_heads, dropout=mha.dropout, bias=bias, **kwargs)
        # Move before copying: copying float64 weights into float32 ones first
        # would round them.
        layer = layer.to(device=w.device, dtype=w.dtype)
        d = mha.embed_dim
        with torch.no_grad():
            for i, lin in enumerate((layer.lin_query, layer.lin_key, layer.lin_value)):
                lin.weight.copy_(w[i * d : (i + 1) * d])
                if bias:
                    lin.bias.copy_(mha.in_proj_bias.detach()[i * d : (i + 1) * d])
            layer.lin_out.weight.copy_(mha.out_proj.weight.detach())
            if mha.out_proj.bias is not None and layer.lin_out.bias is not None:
                layer.lin_out.bias.copy_(mha.out_proj.bias.detach())
        layer.train(mha.training)
        return layer

    def to_torch(self, batch_first: bool = True) -> torch.nn.MultiheadAttention:
        """An equal ``torch.nn.MultiheadAttention`` (complete graph; pass
        ``is_causal``/``attn_mask`` to it yourself for causal attention).

        Args:
            batch_first (bool, optional): of the returned module.
                (default: :obj:`True`)
        """
        if self.edge_dim is not None:
            raise ValueError(
                f"Expected a layer without edge features to convert, got edge_dim="
                f"{self.edge_dim} (nn.MultiheadAttention has no edge inputs)"
            )
        w = self.lin_query.weight
        bias = self.lin_query.bias is not None
        mha = torch.nn.MultiheadAttention(
            self.embed_dim,
            self.num_heads,
            dropout=self.dropout,
            bias=bias,
            batch_first=batch_first,
            device=w.device,
            dtype=w.dtype,
        )
        with torch.no_grad():
            mha.in_proj_weight.copy_(
                torch.cat([self.lin_query.weight, self.lin_key.weight, self.lin_value.weight])
            )
            if bias:
                mha.in_proj_bias.copy_(
                    torch.cat([self.lin_query.bias, self.lin_key.bias, self.lin_value.bias])
                )
            mha.out_proj.weight.copy_(self.lin_out.weight)
            if bias:
                mha.out_proj.bias.copy_(self.lin_out.bias)
        mha.train(self.training)
        return mha

    def __repr__(self) -> str:
        extra = ", causal=True" if self.causal else ""
        if self.edge_dim is not None:
            extra += f", edge_dim={self.edge_dim}"
        if self.edge_value:
            extra += ", edge_value=True"
        return f"{self.__class__.__name__}({self.embed_dim}, heads={self.num_heads}{extra})"
