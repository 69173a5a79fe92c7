"""Self-attention without trainable weights: the lesson's first formulation."""

from __future__ import annotations

from torch import Tensor

from ..checks import check_bool, check_float, check_x
from ..graphs import AttentionGraph, GraphLike, as_graph
from ..ops import AttentionOutput, BackendChoice, attention, backend_for, check_backend
from ..softmax import segment_softmax
from .pyg_path import PYG_PROPAGATE, PropagatedAttention, takes_pyg_path

__all__ = ["SimplifiedAttention"]


class SimplifiedAttention(PropagatedAttention):
    r"""Simplified self-attention: the raw dot products of the inputs are the scores.

    .. math::
        \omega_{ij} = s \, \mathbf{x}_i^\top \mathbf{x}_j, \qquad
        \alpha_{ij} = \frac{\exp(\omega_{ij})}{\sum_{k \in \mathcal{N}(i)} \exp(\omega_{ik})},
        \qquad
        \mathbf{z}_i = \sum_{j \in \mathcal{N}(i)} \alpha_{ij} \mathbf{x}_j

    (computed stably: the per-target maximum is subtracted before ``exp``). On
    the complete graph :math:`Z = \operatorname{softmax}(s X X^\top) X`,
    row-wise. There are no parameters: the layer shows what attention does
    before :math:`W_Q, W_K, W_V` are added. With PyG hooks or an explainer on
    it, it runs PyG's ``propagate`` with :meth:`message` (the same outputs),
    as :class:`SelfAttentionConv` does.

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
        graph = self._graph(x, edge_index, batch)
        n, d = x.shape
        backend = self.backend if backend is None else check_backend(backend)
        if takes_pyg_path(self):
            # Hooks and explainers act on per-edge messages, which the operator never forms.
            out, alpha = self.propagate_over(graph, self.causal, x=x, size=(n, n))
            if return_attention_weights:
                assert alpha is not None
                return out, (graph.edge_index, alpha)
            return out
        h = x.view(n, 1, d)  # (N, 1, d): one head whose q = k = v = x
        res = attention(
            h,
            h,
            h,
            graph,
            scale=self.scale,
            backend=backend,
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
        if takes_pyg_path(self):
            return PYG_PROPAGATE
        return backend_for(
            x.new_empty(0, 1, x.shape[1]),
            graph,
            backend=self.backend if backend is None else check_backend(backend),
        )

    # The arguments of the propagate call, for PyG's generated propagate (it
    # would otherwise parse them from this module's source).
    propagate_type = {"x": Tensor}

    def message(
        self, x_i: Tensor, x_j: Tensor, index: Tensor, ptr: Tensor | None, size_i: int | None
    ) -> Tensor:
        """The message ``alpha_ij x_j``, ``[|E|, d]``: the operator's, formed per edge."""
        # gnnattn's softmax (stable; zeros for a target of -inf scores), as the operator's.
        assert size_i is not None  # propagate sizes the targets from x_i
        alpha = segment_softmax((x_i * x_j).sum(dim=-1) * self.scale, index, size_i)
        self._alpha = alpha
        return x_j * alpha.unsqueeze(-1)

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
