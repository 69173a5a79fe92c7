"""When an attention layer runs PyG's ``propagate`` instead of gnnattn's operator.

:class:`~gnnattn.nn.TransformerConv` and :class:`~gnnattn.nn.SelfAttentionConv`
are ``MessagePassing`` modules that attend with :func:`gnnattn.attention`,
which never forms per-edge messages and sums them. What PyG does to a layer's
messages (its hooks on ``propagate``, ``message``, ``aggregate``...; the edge
mask an ``Explainer`` multiplies them by) needs them, and ``MessagePassing``'s
options other than the defaults (another ``aggr``, the reverse ``flow``,
``decomposed_layers``) change what is computed, so a layer with any of these
takes PyG's ``propagate`` with its ``message`` instead.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch_geometric.nn import MessagePassing
from torch_geometric.nn.aggr import SumAggregation

from ..distributed import GraphPart, SequencePart
from ..ops import BackendChoice
from .parts import AnyGraph

__all__ = ["PYG_HOOKS", "PYG_PROPAGATE", "PropagatedAttention", "pyg_edge_index", "takes_pyg_path"]

#: ``MessagePassing``'s own hooks (on propagate, message, aggregate...): a layer that
#: has any takes PyG's path, where they run.
PYG_HOOKS = tuple(
    f"_{stage}_forward_{kind}hooks"
    for stage in ("propagate", "message", "aggregate", "message_and_aggregate", "edge_update")
    for kind in ("pre_", "")
)

#: What ``backend_for`` reports for a layer that :func:`takes_pyg_path`.
PYG_PROPAGATE = BackendChoice(
    "propagate",
    "PyG hooks, an explainer or a MessagePassing option on the layer: PyG's propagate",
)


def takes_pyg_path(module: MessagePassing) -> bool:
    """Whether ``module`` has a PyG hook or an explainer on (they act on messages),
    or a ``MessagePassing`` option that gnnattn's operator does not compute.

    Example:
        >>> from gnnattn.nn import TransformerConv
        >>> conv = TransformerConv(8, 4)
        >>> takes_pyg_path(conv)
        False
        >>> handle = conv.register_message_forward_hook(lambda *args: None)
        >>> takes_pyg_path(conv)
        True
    """
    hooks = any(getattr(module, name) for name in PYG_HOOKS)
    options = (
        not isinstance(module.aggr_module, SumAggregation)
        or module.flow != "source_to_target"
        or module.decomposed_layers != 1
    )
    return hooks or options or bool(getattr(module, "_explain", False))


def pyg_edge_index(graph: AnyGraph, layer: str) -> Tensor:
    """The ``[2, |E|]`` edges ``propagate`` runs over, in the graph's ``edge_index`` order.

    Raises:
        ValueError: for a distributed part (its edges reach rows other ranks hold,
            which PyG's ``propagate`` cannot gather).
    """
    if isinstance(graph, (GraphPart, SequencePart)):
        raise ValueError(
            f"Expected a whole graph as 'edge_index' of a {layer} with PyG hooks, an "
            f"explainer or MessagePassing options (they run on PyG's propagate, which has "
            f"no rows of other ranks), got a {type(graph).__name__}; remove them, or run "
            f"the layer on the whole graph"
        )
    return graph.edge_index


class PropagatedAttention(MessagePassing):
    """The PyG path of an attention layer whose graph may drop edges it was given (a
    causal layer prunes an explicit ``edge_index``).

    :meth:`propagate_over` runs ``propagate`` over the graph's edges, where the
    subclass's ``message`` parks the weights on ``self._alpha``; an explainer's
    edge mask has a row per edge *given*, and :meth:`explain_message` scales each
    message by the row of the edge the graph kept.
    """

    # MessagePassing's explainer state (set by PyG's Explainer), typed for mypy.
    _explain: bool | None
    _edge_mask: Tensor | None
    _apply_sigmoid: bool
    # Only while PyG's propagate runs (no state stays on the layer): the weights
    # message() computes, and the rows of the explainer's edge mask the graph kept.
    _alpha: Tensor
    _explained_rows: Tensor

    def propagate_over(
        self, graph: AnyGraph, pruned: bool, **kwargs: Any
    ) -> tuple[Tensor, Tensor | None]:
        """``(out, alpha)`` of ``propagate(graph.edge_index, **kwargs)``; ``pruned``:
        the graph may hold fewer edges than the caller gave (a causal view)."""
        edge_index = pyg_edge_index(graph, type(self).__name__)
        if self._explain and pruned and self._edge_mask is not None:
            given = torch.arange(self._edge_mask.shape[0], device=edge_index.device)
            self._explained_rows = graph.select_edges(given, "the explainer's edge mask")
        try:
            out = self.propagate(edge_index, **kwargs)
        finally:
            # Off the layer even when the call fails: a layer keeps no call's state.
            self.__dict__.pop("_explained_rows", None)
            alpha = self.__dict__.pop("_alpha", None)
        return out, alpha

    def explain_message(self, inputs: Tensor, dim_size: int | None) -> Tensor:
        """PyG's: the messages scaled by the explainer's edge mask, its rows those of
        the edges the graph kept."""
        mask, rows = self._edge_mask, getattr(self, "_explained_rows", None)
        if mask is None or rows is None:
            return super().explain_message(inputs, dim_size)
        mask = mask.sigmoid() if self._apply_sigmoid else mask
        return inputs * mask[rows].view(-1, *([1] * (inputs.dim() - 1)))
