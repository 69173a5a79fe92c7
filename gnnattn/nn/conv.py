"""Multi-head scaled dot-product self-attention as a PyG message-passing layer."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.nn import MessagePassing

from ..graphs import check_edge_index
from ..ops import BACKENDS, Graph, dense_attention, fused_attention, make_graph, resolve_backend
from ..softmax import _scatter_softmax

__all__ = ["SelfAttentionConv", "complete_bipartite_graph"]


def check_x(x: Tensor, width: int | None = None, name: str = "x") -> None:
    """Raise if ``x`` is not a floating ``[N, width]`` tensor."""
    if not isinstance(x, Tensor):
        raise TypeError(f"Expected '{name}' to be a Tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(
            f"Expected '{name}' of shape [N, {width if width is not None else 'F'}] "
            f"(one row per node), got {list(x.shape)}"
        )
    if width is not None and x.shape[1] != width:
        raise ValueError(f"Expected '{name}' of shape [N, {width}], got {list(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"Expected '{name}' of a floating dtype, got {x.dtype}")


def check_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"Expected 'backend' to be one of {BACKENDS}, got {backend!r}")
    return backend


def _check_edge_index_static(edge_index: Tensor, device: torch.device) -> None:
    """The checks of :func:`check_edge_index` that need no tensor values.

    Under ``torch.compile`` reading ``edge_index.max()`` would break the
    graph; shape, dtype and device are known while tracing.
    """
    if not isinstance(edge_index, Tensor):
        raise TypeError(f"Expected 'edge_index' to be a Tensor, got {type(edge_index).__name__}")
    if edge_index.dim() != 2 or edge_index.shape[0] != 2:
        raise ValueError(f"Expected 'edge_index' of shape [2, E], got {list(edge_index.shape)}")
    if edge_index.dtype not in (torch.int64, torch.int32):
        raise TypeError(
            f"Expected 'edge_index' of dtype torch.int64 (or int32), got {edge_index.dtype}"
        )
    if edge_index.device != device:
        raise ValueError(
            f"Expected 'edge_index' on device {device} (the device of x), got {edge_index.device}"
        )


def complete_bipartite_graph(
    num_src: int, num_dst: int, *, device: torch.device | str | None = None
) -> Tensor:
    r"""Every target attends to every source: the edges of cross-attention.

    .. math::
        \mathcal{E} = \{(j, i) : 0 \le j < M,\ 0 \le i < N\}

    Args:
        num_src (int): number of sources :math:`M` (keys / values).
        num_dst (int): number of targets :math:`N` (queries).
        device (torch.device, optional): where to build the edges.
            (default: :obj:`None`, the CPU)

    Shapes:
        - **output:** ``[2, M * N]`` int64, sorted by target then source.

    Example:
        >>> from gnnattn.nn import complete_bipartite_graph
        >>> complete_bipartite_graph(3, 2)
        tensor([[0, 1, 2, 0, 1, 2],
                [0, 0, 0, 1, 1, 1]])
    """
    for name, v in (("num_src", num_src), ("num_dst", num_dst)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"Expected '{name}' to be an int >= 0, got {v!r}")
    src = torch.arange(num_src, device=device).repeat(num_dst)  # (N * M,)
    dst = torch.arange(num_dst, device=device).repeat_interleave(num_src)  # (N * M,)
    return torch.stack([src, dst])


def _static_graph(n: int, causal: bool, device: torch.device) -> Graph:
    """The complete / causal graph of one sequence without data-dependent sizes.

    The builders of :mod:`gnnattn.graphs` size their output with
    ``int(deg.sum())``, which ``torch.compile`` cannot trace; here every size
    is a function of ``n`` alone. Same edges, same order.
    """
    if causal:
        dst, src = torch.tril_indices(n, n, device=device)  # row-major: by target, then source
        ei = torch.stack([src, dst])
    else:
        ei = complete_bipartite_graph(n, n, device=device)
    return Graph(ei, n, "causal" if causal else "complete", [n] if n else [])


class SelfAttentionConv(MessagePassing):
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

    On the complete graph this is exactly :class:`torch.nn.MultiheadAttention`
    (see :meth:`from_torch` / :meth:`to_torch`); with ``causal=True`` it is
    attention with ``is_causal=True``; with edge features it is dense attention
    with the additive float mask :math:`(W_E e_{ij})^h` (and :math:`-\infty`
    where there is no edge). Called on a pair ``(x_src, x_dst)`` it is
    cross-attention: queries from ``x_dst``, keys and values from ``x_src``; on
    the complete bipartite graph that is ``mha(x_dst, x_src, x_src)``. A target
    with no incoming edges gets a zero attention result, so its output is the
    output projection's bias.

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
            ``edge_index`` is pruned, and ``edge_attr`` with it).
            (default: :obj:`False`)
        backend (str, optional): ``"auto"``, ``"mp"`` (message passing, the
            reference), ``"dense"`` (SDPA, for complete/causal/window graphs) or
            ``"fused"`` (sparse kernel); see :mod:`gnnattn.ops`. Edge score
            biases run on ``"mp"`` and ``"fused"``; ``edge_value`` and attention
            dropout on sparse graphs only on ``"mp"`` (``"auto"`` picks it).
            (default: ``"auto"``)
        edge_dim (int, optional): width of ``edge_attr``; enables the per-head
            score bias :math:`W_E e_{ij}`. (default: :obj:`None`)
        edge_value (bool, optional): also add :math:`W_{EV} e_{ij}` to the
            values (needs ``edge_dim``). (default: :obj:`False`)

    Shapes:
        - **input:** node features ``[|V|, D]`` or a pair ``([M, D], [N, D])``
          (sources, targets), optional ``edge_index`` ``[2, |E|]``, optional
          ``edge_attr`` ``[|E|, edge_dim]``, optional ``batch`` ``[|V|]``
        - **output:** ``[|V|, D]`` (``[N, D]`` for a pair); with
          ``return_attention_weights=True`` also
          ``(edge_index [2, |E|], alpha [|E|, H])``. ``alpha`` is taken
          *before* dropout; on the ``"fused"`` backend it is recomputed from the
          saved log-sum-exp and carries no gradient.

    Example:
        >>> layer = SelfAttentionConv(8, num_heads=2)
        >>> layer
        SelfAttentionConv(8, heads=2)
        >>> x = torch.randn(5, 8)
        >>> layer(x).shape
        torch.Size([5, 8])
        >>> out, (ei, alpha) = layer(x, causal_graph(5), return_attention_weights=True)
        >>> alpha.shape
        torch.Size([15, 2])
        >>> conv = SelfAttentionConv(8, num_heads=2, edge_dim=3)
        >>> ei = torch.tensor([[0, 1, 2], [1, 2, 0]])
        >>> conv(x[:3], ei, torch.randn(3, 3)).shape
        torch.Size([3, 8])
        >>> layer((torch.randn(7, 8), torch.randn(2, 8))).shape  # cross-attention
        torch.Size([2, 8])
    """

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
        if isinstance(embed_dim, bool) or not isinstance(embed_dim, int) or embed_dim <= 0:
            raise ValueError(f"Expected 'embed_dim' to be a positive int, got {embed_dim!r}")
        if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads <= 0:
            raise ValueError(f"Expected 'num_heads' to be a positive int, got {num_heads!r}")
        if embed_dim % num_heads:
            raise ValueError(
                f"Expected 'embed_dim' divisible by 'num_heads', got embed_dim={embed_dim} "
                f"and num_heads={num_heads} (head dim would be {embed_dim / num_heads:g})"
            )
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"Expected 'dropout' in [0, 1), got {dropout}")
        if edge_dim is not None and (
            isinstance(edge_dim, bool) or not isinstance(edge_dim, int) or edge_dim <= 0
        ):
            raise ValueError(f"Expected 'edge_dim' to be a positive int or None, got {edge_dim!r}")
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
        self.edge_value = bool(edge_value)
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
        self._alpha: Tensor | None = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform projections and zero biases, as ``nn.MultiheadAttention``."""
        super().reset_parameters()
        for lin in (self.lin_query, self.lin_key, self.lin_value):
            torch.nn.init.xavier_uniform_(lin.weight)
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
        edge_index: Tensor | None = None,
        edge_attr: Tensor | None = None,
        *,
        batch: Tensor | None = None,
        return_attention_weights: bool = False,
    ) -> Tensor | tuple[Tensor, tuple[Tensor, Tensor]]:
        """Attend over ``edge_index`` (default: the complete or causal graph).

        Args:
            x (Tensor or (Tensor, Tensor)): node features ``[|V|, D]``, or
                ``(x_src [M, D], x_dst [N, D])`` for cross-attention on a
                bipartite graph (``edge_index[0]`` indexes ``x_src``,
                ``edge_index[1]`` indexes ``x_dst``).
            edge_index (Tensor, optional): ``[2, |E|]``, messages
                ``edge_index[0] -> edge_index[1]``; default: the complete
                (causal) graph, or the complete bipartite graph for a pair.
                (default: :obj:`None`)
            edge_attr (Tensor, optional): ``[|E|, edge_dim]`` features of the
                edges of ``edge_index``, in its order. (default: :obj:`None`)
            batch (Tensor, optional): sorted sequence id of every node: one
                complete (or causal) graph per sequence; not together with
                ``edge_index``. (default: :obj:`None`)
            return_attention_weights (bool, optional): also return
                ``(edge_index, alpha)``. (default: :obj:`False`)
        """
        x_src, x_dst, bipartite = self._split_x(x)
        n_src, n_dst = x_src.shape[0], x_dst.shape[0]
        edge_attr = self._check_edge_attr(edge_attr, edge_index, x_dst)
        graph, edge_attr, keep = self._graph(
            n_src, n_dst, edge_index, edge_attr, batch, bipartite, x_dst.device
        )
        dropout_active = self.training and self.dropout > 0

        h, c = self.num_heads, self.head_dim
        score_bias: Tensor | None = None
        value_edge: Tensor | None = None
        if edge_attr is not None:
            assert self.lin_edge is not None
            score_bias = self.lin_edge(edge_attr)  # (E, H)
            if self.lin_edge_value is not None:
                value_edge = self.lin_edge_value(edge_attr).view(-1, h, c)  # (E, H, C)
        if keep is not None:
            # Edges j > i of an explicit graph under torch.compile: masked
            # rather than pruned, which would give a data-dependent |E|.
            mask = torch.zeros(keep.shape[0], 1, dtype=x_dst.dtype, device=x_dst.device)
            mask = mask.masked_fill(~keep.view(-1, 1), float("-inf"))  # (E, 1)
            score_bias = mask if score_bias is None else score_bias + mask
        backend = self._resolve(graph, x_dst.device, dropout_active, score_bias, value_edge)

        q = self.lin_query(x_dst).view(n_dst, h, c)  # (N, H, C)
        k = self.lin_key(x_src).view(n_src, h, c)  # (M, H, C)
        v = self.lin_value(x_src).view(n_src, h, c)  # (M, H, C)
        out, alpha = self._attend(
            q, k, v, graph, backend, return_attention_weights, score_bias, value_edge
        )
        out = self.lin_out(out.reshape(n_dst, self.embed_dim))  # (N, D)
        if return_attention_weights:
            assert alpha is not None
            return out, (graph.edge_index, alpha)
        return out

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
            self._check_like_params(x_src, "x")
            return x_src, x_dst, True
        check_x(x, self.embed_dim)
        self._check_like_params(x, "x")
        return x, x, False

    def _check_like_params(self, x: Tensor, name: str) -> None:
        w = self.lin_query.weight
        if x.device != w.device:
            raise ValueError(
                f"Expected '{name}' on the layer's device {w.device}, got {x.device} "
                f"(move one with .to())"
            )
        # Under autocast the projections cast x themselves.
        if x.dtype != w.dtype and not torch.is_autocast_enabled(x.device.type):
            raise TypeError(
                f"Expected '{name}' of the layer's dtype {w.dtype}, got {x.dtype} "
                f"(convert with layer.to({x.dtype}) or x.to({w.dtype}), or use torch.autocast)"
            )

    def _check_edge_attr(
        self, edge_attr: Tensor | None, edge_index: Tensor | None, x: Tensor
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
        _check_edge_index_static(edge_index, x.device)
        e = edge_index.shape[1]
        if edge_attr.dim() != 2 or edge_attr.shape[0] != e or edge_attr.shape[1] != self.edge_dim:
            hint = " (use edge_attr.view(-1, 1))" if edge_attr.dim() == 1 else ""
            raise ValueError(
                f"Expected 'edge_attr' of shape [{e}, {self.edge_dim}] (one row per edge of "
                f"edge_index), got {list(edge_attr.shape)}{hint}"
            )
        if not edge_attr.is_floating_point():
            raise TypeError(f"Expected 'edge_attr' of a floating dtype, got {edge_attr.dtype}")
        if edge_attr.device != x.device:
            raise ValueError(
                f"Expected 'edge_attr' on device {x.device} (the device of x), got "
                f"{edge_attr.device}"
            )
        return edge_attr

    def _graph(
        self,
        n_src: int,
        n_dst: int,
        edge_index: Tensor | None,
        edge_attr: Tensor | None,
        batch: Tensor | None,
        bipartite: bool,
        device: torch.device,
    ) -> tuple[Graph, Tensor | None, Tensor | None]:
        """``(graph, edge_attr, keep)``: the graph, ``edge_attr`` pruned with it,
        and (only under ``torch.compile``) a mask of the edges to keep."""
        compiling = torch.compiler.is_compiling()
        if bipartite:
            if self.causal:
                raise ValueError(
                    "Expected a single 'x' with causal=True (causal order relates tokens of one "
                    "sequence), got a pair (x_src, x_dst); give the cross-attention graph as "
                    "edge_index instead"
                )
            if batch is not None:
                raise ValueError(
                    "Expected no 'batch' with a pair (x_src, x_dst): 'batch' builds square "
                    "graphs; pass the cross-attention graph as 'edge_index'"
                )
            if edge_index is None:
                ei = complete_bipartite_graph(n_src, n_dst, device=device)
            else:
                if compiling:
                    _check_edge_index_static(edge_index, device)
                else:
                    check_edge_index(edge_index, n_src, n_dst, device=device)
                ei = edge_index.long()
            return Graph(ei, n_dst, num_src=n_src), edge_attr, None
        if compiling and batch is None:
            if edge_index is None:
                return _static_graph(n_dst, self.causal, device), None, None
            _check_edge_index_static(edge_index, device)
            ei = edge_index.long()
            keep = (ei[0] <= ei[1]) if self.causal else None
            return Graph(ei, n_dst), edge_attr, keep
        if edge_index is not None and self.causal:
            check_edge_index(edge_index, n_src, device=device)
            keep = edge_index[0] <= edge_index[1]
            if not bool(keep.all()):
                edge_index = edge_index[:, keep]
                if edge_attr is not None:
                    edge_attr = edge_attr[keep]
        graph = make_graph(n_dst, edge_index, batch, causal=self.causal, device=device)
        return graph, edge_attr, None

    def _resolve(
        self,
        graph: Graph,
        device: torch.device,
        dropout_active: bool,
        score_bias: Tensor | None,
        value_edge: Tensor | None,
    ) -> str:
        if graph.num_src is not None and self.backend == "dense":
            raise ValueError(
                "backend='dense' does not do cross-attention (a pair (x_src, x_dst)); use "
                "backend='fused', 'mp' or 'auto'"
            )
        if value_edge is not None:
            if self.backend in ("dense", "fused"):
                raise ValueError(
                    f"backend={self.backend!r} cannot add edge features to the values "
                    f"(edge_value=True); use backend='mp' or 'auto'"
                )
            return "mp"
        return resolve_backend(
            self.backend,
            graph,
            device,
            dropout_active=dropout_active,
            has_bias=score_bias is not None,
        )

    # ----------------------------------------------------------------- compute

    def _attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        graph: Graph,
        backend: str,
        need_weights: bool,
        score_bias: Tensor | None = None,
        value_edge: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        if backend == "dense":
            p = self.dropout if self.training else 0.0
            return dense_attention(
                q, k, v, graph, self.scale, dropout_p=p, need_weights=need_weights
            )
        if backend == "fused":
            return fused_attention(
                q, k, v, graph, self.scale, bias=score_bias, need_weights=need_weights
            )
        out = self.propagate(
            graph.edge_index,
            query=q,
            key=k,
            value=v,
            score_bias=score_bias,
            value_edge=value_edge,
            size=(k.shape[0], q.shape[0]),
        )
        alpha, self._alpha = self._alpha, None
        return out, alpha

    def message(
        self,
        query_i: Tensor,
        key_j: Tensor,
        value_j: Tensor,
        score_bias: Tensor | None,
        value_edge: Tensor | None,
        index: Tensor,
        ptr: Tensor | None,
        size_i: int | None,
    ) -> Tensor:
        score = (query_i * key_j).sum(dim=-1) * self.scale  # (E, H)
        if score_bias is not None:
            score = score + score_bias  # (E, H)
        alpha = _scatter_softmax(score, index, size_i if size_i is not None else 0)
        self._alpha = alpha
        alpha = F.dropout(alpha, p=self.dropout, training=self.training)
        if value_edge is not None:
            value_j = value_j + value_edge  # (E, H, C)
        return value_j * alpha.unsqueeze(-1)  # (E, H, C)

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
        extra = f", edge_dim={self.edge_dim}" if self.edge_dim is not None else ""
        if self.edge_value:
            extra += ", edge_value=True"
        return f"{self.__class__.__name__}({self.embed_dim}, heads={self.num_heads}{extra})"
