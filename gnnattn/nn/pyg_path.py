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

from torch import Tensor
from torch_geometric.nn import MessagePassing
from torch_geometric.nn.aggr import SumAggregation

from ..distributed import GraphPart, SequencePart
from ..ops import BackendChoice
from .parts import AnyGraph

__all__ = ["PYG_HOOKS", "PYG_PROPAGATE", "pyg_edge_index", "takes_pyg_path"]

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
