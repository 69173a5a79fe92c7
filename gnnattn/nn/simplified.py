"""Self-attention without trainable weights: the lesson's first formulation."""

from __future__ import annotations

from torch import Tensor
from torch_geometric.nn import MessagePassing

from ..checks import check_bool, check_float, check_x
from ..graphs import AttentionGraph, GraphLike, as_graph
from ..ops import AttentionOutput, BackendChoice, attention, backend_for, check_backend
from .pyg_path import takes_pyg_path

__all__ = ["SimplifiedAttention"]


class SimplifiedAttention(MessagePassing):
    r"""Simplified self-attention: the raw dot products of the inputs are the scores.

    .. math::
        \omega_{ij} = s \, \mathbf{x}_i^\top \mathbf{x}_j, \qquad
        \alpha_{ij} = \frac{\exp(\omega_{ij})}{\sum_{k \in \mathcal{N}(i)} \exp(\omega_{ik})},
        \qquad
        \mathbf{z}_i = \sum_{j \in \mathcal{N}(i)} \alpha_{ij} \mathbf{x}_j

    (computed stably: the per-target maximum is subtracted before ``exp``). On
    the complete graph :math:`Z = \operatorname{softmax}(s X X^\top) X`,
    row-wise. There are no parameters: the layer shows what attention does
    before :math:`W_Q, W_K, W_V` are added. It always runs gnnattn's operator,
    which forms no per-edge messages: PyG hooks and explainers on it are
    refused with a ``ValueError`` (:class:`SelfAttentionConv` takes them).

    Args:
        scale (float, optional): :math:`s`, multiplies the dot products; the
            lesson uses ``1`` (transformers use :math:`1/\sqrt{d}`).
            (default: ``1.0``)
        causal (bool, optional): keep only edges :math:`j \le i`.
            (default: :obj:`False`)
        backend (str, optional): ``"auto"``, ``"mp"``, ``"sdpa"`` or
            ``"fused"``, as in :class:`SelfAttentionConv`; a call can override
            it, and :meth:`backend_for` says which one a call takes and why.
            (default: ``"auto"``)

    Shapes:
        - **input:** ``x`` ``[|V|, d]``, optional graph (an
          :class:`~gnnattn.AttentionGraph` or ``edge_index`` ``[2, |E|]``),
          optional ``batch`` ``[|V|]``
        - **output:** ``[|V|, d]``; with ``return_attention_weights=True`` also
          ``(edge_index [2, |E|], alpha [|E|])``

    Example:
        >>> x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
        >>> attn = SimplifiedAttention()
        >>> z, (ei, alpha) = attn(x, return_attention_weights=True)
        >>> alpha[:3]  # weights of target 0 over sources 0, 1, 2
        tensor([0.4223, 0.1554, 0.4223])
    """

    def __init__(self, scale: float = 1.0, *, causal: bool = False, backend: str = "auto") -> None:
        super().__init__(aggr="add", node_dim=0)
        self.scale = check_float(scale, "scale", finite=True)
        check_bool(causal, "causal")
        self.causal = causal
        self.backend = check_backend(backend)

    def forward(
        self,
        x: Tensor,
        edge_index: GraphLike | None = None,
        *,
        batch: Tensor | None = None,
        return_attention_weights: bool = False,
        backend: str | None = None,
    ) -> Tensor | tuple[Tensor, tuple[Tensor, Tensor]]:
        """Attend over ``edge_index`` (default: the complete or causal graph).

        ``edge_index`` is an :class:`~gnnattn.AttentionGraph` or anything it
        takes (see :class:`SelfAttentionConv`); ``batch`` builds one complete
        (causal) graph per sequence instead; ``backend`` overrides the
        layer's for this call.
        """
        if takes_pyg_path(self):
            # Silently skipping them would explain nothing and call no hook.
            raise ValueError(
                "Expected a SimplifiedAttention without PyG hooks, an explainer or "
                "MessagePassing options: it runs gnnattn's operator only, which forms no "
                "per-edge messages for them; got them set. Use SelfAttentionConv, which "
                "takes PyG's propagate for them, or set layer.explain = False to explain "
                "a model around this layer"
            )
        graph = self._graph(x, edge_index, batch)
        n, d = x.shape
        h = x.view(n, 1, d)  # (N, 1, d): one head whose q = k = v = x
        res = attention(
            h,
            h,
            h,
            graph,
            scale=self.scale,
            backend=self.backend if backend is None else check_backend(backend),
            need_weights=return_attention_weights,
        )
        if isinstance(res, AttentionOutput):
            assert res.weights is not None
            return res.out.view(n, d), (graph.edge_index, res.weights.view(-1))
        return res.view(n, d)

    def backend_for(
        self,
        x: Tensor,
        edge_index: GraphLike | None = None,
        *,
        batch: Tensor | None = None,
        backend: str | None = None,
    ) -> BackendChoice:
        """The backend the call ``self(x, edge_index, batch=batch)`` takes, and why.

        Example:
            >>> SimplifiedAttention(causal=True).backend_for(torch.randn(4, 2)).backend
            'sdpa'
        """
        graph = self._graph(x, edge_index, batch)
        return backend_for(
            x.new_empty(0, 1, x.shape[1]),
            graph,
            backend=self.backend if backend is None else check_backend(backend),
        )

    def _graph(
        self, x: Tensor, edge_index: GraphLike | None, batch: Tensor | None
    ) -> AttentionGraph:
        check_x(x)
        n = x.shape[0]
        return as_graph(
            edge_index, num_src=n, num_dst=n, device=x.device, batch=batch, causal=self.causal
        )

    def __repr__(self) -> str:
        causal = ", causal=True" if self.causal else ""
        return f"{self.__class__.__name__}(scale={self.scale:g}{causal})"
