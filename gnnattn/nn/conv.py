"""Multi-head scaled dot-product self-attention as a PyG message-passing layer."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.nn import MessagePassing

from ..ops import BACKENDS, Graph, dense_attention, fused_attention, make_graph, resolve_backend
from ..softmax import _scatter_softmax

__all__ = ["SelfAttentionConv"]


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


class SelfAttentionConv(MessagePassing):
    r"""Multi-head scaled dot-product self-attention over the edges of a graph.

    For every target :math:`i` and head :math:`h` (head dim :math:`C = D / H`):

    .. math::
        \alpha_{ij}^h = \operatorname{softmax}_{j \in \mathcal{N}(i)}
            \left(\frac{(W_Q x_i)^h \cdot (W_K x_j)^h}{\sqrt{C}}\right),
        \qquad
        \mathbf{o}_i = W_O \,\Big\Vert_{h=1}^{H} \sum_{j \in \mathcal{N}(i)}
            \alpha_{ij}^h (W_V x_j)^h

    with :math:`\mathcal{N}(i)` the sources of the edges :math:`j \to i`
    (``edge_index[0]`` is :math:`j`, ``edge_index[1]`` is :math:`i`). On the
    complete graph this is exactly :class:`torch.nn.MultiheadAttention`
    (see :meth:`from_torch` / :meth:`to_torch`); with ``causal=True`` it is
    attention with ``is_causal=True``. A target with no incoming edges gets a
    zero attention result, so its output is the output projection's bias.

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
            ``edge_index`` is pruned). (default: :obj:`False`)
        backend (str, optional): ``"auto"``, ``"mp"`` (message passing, the
            reference), ``"dense"`` (SDPA, for complete/causal/window graphs) or
            ``"fused"`` (sparse kernel); see :mod:`gnnattn.ops`.
            (default: ``"auto"``)

    Shapes:
        - **input:** node features ``[|V|, D]``, optional ``edge_index``
          ``[2, |E|]``, optional ``batch`` ``[|V|]``
        - **output:** ``[|V|, D]``; with ``return_attention_weights=True`` also
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
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.dropout = dropout
        self.causal = causal
        self.backend = check_backend(backend)
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.lin_query = torch.nn.Linear(embed_dim, embed_dim, bias=bias)
        self.lin_key = torch.nn.Linear(embed_dim, embed_dim, bias=bias)
        self.lin_value = torch.nn.Linear(embed_dim, embed_dim, bias=bias)
        self.lin_out = torch.nn.Linear(embed_dim, embed_dim, bias=bias)
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

    def forward(
        self,
        x: Tensor,
        edge_index: Tensor | None = None,
        *,
        batch: Tensor | None = None,
        return_attention_weights: bool = False,
    ) -> Tensor | tuple[Tensor, tuple[Tensor, Tensor]]:
        """Attend over ``edge_index`` (default: the complete or causal graph).

        Args:
            x (Tensor): node features ``[|V|, D]``.
            edge_index (Tensor, optional): ``[2, |E|]``, messages
                ``edge_index[0] -> edge_index[1]``. (default: :obj:`None`)
            batch (Tensor, optional): sorted sequence id of every node: one
                complete (or causal) graph per sequence; not together with
                ``edge_index``. (default: :obj:`None`)
            return_attention_weights (bool, optional): also return
                ``(edge_index, alpha)``. (default: :obj:`False`)
        """
        check_x(x, self.embed_dim)
        n = x.shape[0]
        graph = make_graph(n, edge_index, batch, causal=self.causal, device=x.device)
        dropout_active = self.training and self.dropout > 0
        backend = resolve_backend(self.backend, graph, x.device, dropout_active=dropout_active)

        q = self.lin_query(x).view(n, self.num_heads, self.head_dim)  # (N, H, C)
        k = self.lin_key(x).view(n, self.num_heads, self.head_dim)  # (N, H, C)
        v = self.lin_value(x).view(n, self.num_heads, self.head_dim)  # (N, H, C)
        out, alpha = self._attend(q, k, v, graph, backend, return_attention_weights)
        out = self.lin_out(out.reshape(n, self.embed_dim))  # (N, D)
        if return_attention_weights:
            assert alpha is not None
            return out, (graph.edge_index, alpha)
        return out

    def _attend(
        self, q: Tensor, k: Tensor, v: Tensor, graph: Graph, backend: str, need_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        if backend == "dense":
            p = self.dropout if self.training else 0.0
            return dense_attention(
                q, k, v, graph, self.scale, dropout_p=p, need_weights=need_weights
            )
        if backend == "fused":
            return fused_attention(q, k, v, graph, self.scale, need_weights=need_weights)
        out = self.propagate(
            graph.edge_index, query=q, key=k, value=v, size=(q.shape[0], q.shape[0])
        )
        alpha, self._alpha = self._alpha, None
        return out, alpha

    def message(
        self,
        query_i: Tensor,
        key_j: Tensor,
        value_j: Tensor,
        index: Tensor,
        ptr: Tensor | None,
        size_i: int | None,
    ) -> Tensor:
        score = (query_i * key_j).sum(dim=-1) * self.scale  # (E, H)
        alpha = _scatter_softmax(score, index, size_i if size_i is not None else 0)
        self._alpha = alpha
        alpha = F.dropout(alpha, p=self.dropout, training=self.training)
        return value_j * alpha.unsqueeze(-1)  # (E, H, C)

    @classmethod
    def from_torch(cls, mha: torch.nn.MultiheadAttention, **kwargs) -> SelfAttentionConv:
        """A layer with the weights of ``mha`` (outputs equal on the complete graph).

        Args:
            mha (torch.nn.MultiheadAttention): with or without biases; ``kdim``
                and ``vdim`` must equal ``embed_dim`` (self-attention), and
                ``add_bias_kv`` / ``add_zero_attn`` are not supported.
            **kwargs: ``causal`` and ``backend`` for the new layer.
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
        return f"{self.__class__.__name__}({self.embed_dim}, heads={self.num_heads})"
