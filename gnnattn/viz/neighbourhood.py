r"""One node's neighbourhood: the nodes whose messages reach it, and the attention among them.

A graph too large to read whole is read one node at a time: ``around=i,
hops=2`` keeps node :math:`i`, the sources of its incoming edges, and their
sources (found with :func:`torch_geometric.utils.k_hop_subgraph` along the
edges' direction :math:`j \to i`), with every edge between two kept nodes.
The kept nodes are renumbered ``0 .. M-1`` for drawing, but
:attr:`Neighbourhood.nodes` keeps the original ids, and the drawings and the
explorer label the nodes with them (or with their tokens). Weights are kept as
they are, edge for edge: a kept target whose sources were not all kept (on
the border) has weights that sum to less than 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import Tensor
from torch_geometric.utils import k_hop_subgraph

from ..checks import check_int
from ..graphs import check_edge_index, check_edge_index_static

__all__ = ["Neighbourhood", "neighbourhood"]

T = TypeVar("T")


@dataclass(frozen=True)
class Neighbourhood:
    """The kept nodes of a graph: ``nodes[k]`` is the original id of local node ``k``.

    Made by :func:`neighbourhood`. ``centre`` is the local index of the node
    the neighbourhood is around, ``num_nodes`` the size of the whole graph.
    """

    nodes: Tensor  # [M] int64, sorted
    centre: int
    num_nodes: int

    def edges(self, edge_index: Tensor, *per_edge: Tensor) -> tuple[Tensor, ...]:
        """The edges between kept nodes, renumbered, then each ``per_edge`` tensor cut alike.

        Args:
            edge_index (Tensor): ``[2, E]`` over the whole graph's ids.
            *per_edge (Tensor): tensors with one row per edge (``alpha``, ``scores``).

        Returns:
            tuple: ``(edge_index [2, E'], *rows)``, edges in their original order.
        """
        local = torch.full((self.num_nodes,), -1, dtype=torch.long, device=edge_index.device)
        local[self.nodes.to(edge_index.device)] = torch.arange(
            self.nodes.numel(), device=edge_index.device
        )
        ei = local[edge_index.long()]
        keep = (ei >= 0).all(dim=0)
        return (ei[:, keep], *(t[keep.to(t.device)] for t in per_edge))

    def rows(self, values: Sequence[T] | Tensor) -> Any:
        """The kept nodes' entries of a per-node list or tensor (tokens, positions, colours)."""
        if isinstance(values, Tensor):
            return values[self.nodes.to(values.device)]
        return [values[v] for v in self.nodes.tolist()]

    def labels(self, tokens: Sequence[str] | None) -> list[str]:
        """One label per kept node: its token, or its original id."""
        if tokens is not None:
            return [str(t) for t in self.rows(tokens)]
        return [str(v) for v in self.nodes.tolist()]


def neighbourhood(
    edge_index: Tensor, around: int, hops: int = 2, num_nodes: int | None = None
) -> Neighbourhood:
    r"""The nodes within ``hops`` incoming edges of node ``around`` (itself included).

    Args:
        edge_index (Tensor): ``[2, E]``, messages ``edge_index[0] -> edge_index[1]``.
        around (int): the node to look around, an original id.
        hops (int, optional): how many edges back from ``around``. (default: ``2``)
        num_nodes (int, optional): :math:`N`. (default: :obj:`None`, ``edge_index.max() + 1``)

    Returns:
        Neighbourhood: the kept nodes; its :meth:`~Neighbourhood.edges` cuts
        ``edge_index`` and ``alpha`` alike.

    Example:
        >>> ei = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])  # a path 0 -> 1 -> 2 -> 3 -> 4
        >>> nb = neighbourhood(ei, around=3, hops=2)
        >>> nb.nodes.tolist(), nb.labels(None)
        ([1, 2, 3], ['1', '2', '3'])
        >>> sub, alpha = nb.edges(ei, torch.tensor([0.1, 0.2, 0.3, 0.4]))
        >>> sub.tolist(), alpha.tolist()
        ([[0, 1], [1, 2]], [0.20000000298023224, 0.30000001192092896])
    """
    check_int(num_nodes, "num_nodes", optional=True)
    ei = check_edge_index_static(edge_index)
    n = int(ei.max()) + 1 if num_nodes is None and ei.numel() else num_nodes or 0
    check_edge_index(ei, n, n)  # a negative or too large id would be read as a node
    check_int(hops, "hops", min=1)
    if isinstance(around, bool) or not isinstance(around, int):
        raise TypeError(f"Expected 'around' to be an int (a node id), got {type(around).__name__}")
    if not 0 <= around < n:
        raise ValueError(f"Expected 'around' to be a node id in [0, {n}), got {around}")
    # source_to_target: the nodes whose messages flow into `around`.
    subset, _, _, _ = k_hop_subgraph(
        around, hops, ei.long().cpu(), num_nodes=n, flow="source_to_target"
    )
    nodes = torch.sort(subset).values
    centre = int(torch.searchsorted(nodes, torch.tensor(around)))
    return Neighbourhood(nodes=nodes, centre=centre, num_nodes=n)
