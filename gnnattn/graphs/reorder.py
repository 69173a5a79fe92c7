"""Node orders that keep neighbours close in memory.

The fused kernels gather one row of ``k``/``v`` (forward) or ``q``/``dout``
(backward) per edge. When the ids of a node's neighbours are scattered over
``[0, N)``, every gather is a cache miss once those arrays outgrow the caches;
when they are close to the node's own id, consecutive targets share most of
their rows and the gathers hit. :func:`reorder` finds such an order (reverse
Cuthill-McKee: a breadth-first order from a peripheral node that keeps the
bandwidth of the adjacency matrix small) and :func:`permute` relabels a graph
with it::

    order = reorder(graph)             # (perm, inv): perm[new] = old id, inv[old] = new id
    graph_r = permute(graph, order.perm)  # built once, like any graph object
    out = order.restore(layer(order.apply(x), graph_r))  # == layer(x, graph)

Best, keep the data in the new order for the whole model (reorder the
features and labels once, when loading them) and restore only what leaves
it; :meth:`Reordering.apply` / :meth:`Reordering.restore` are ``x[perm]``
and ``y[inv]`` whose backward is a gather rather than a scatter-add.

It pays on graphs with locality whose ids do not show it (meshes, grids,
k-nearest-neighbour graphs of points, road networks, with ids in file or hash
order) once ``N * H * C`` floats exceed the last-level cache; it does nothing
for random graphs (no order has locality) nor for graphs whose ids already
follow it. The order is for graphs without one of their own: causal
attention's ``j <= i`` is about the ids, so never reorder a causal graph.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from .graph import AttentionGraph

__all__ = ["METHODS", "Reordering", "permute", "reorder"]

METHODS = ("rcm",)


class _Rows(torch.autograd.Function):
    """``x[index]`` for a permutation ``index``: the backward is a gather by its
    inverse, not the scatter-add that ``x[index]``'s backward must do for
    arbitrary indices (atomics or a sort, several times slower)."""

    @staticmethod
    def forward(ctx, x: Tensor, index: Tensor, inverse: Tensor) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(inverse)
        return x.index_select(0, index)

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        (inverse,) = ctx.saved_tensors
        return grad.index_select(0, inverse), None, None


class Reordering(NamedTuple):
    """A node order and its inverse.

    Attributes:
        perm: ``[N]`` int64: new id -> old id (``x[perm]`` puts rows in the new order).
        inv: ``[N]`` int64: old id -> new id (``out[inv]`` puts them back).
    """

    perm: Tensor
    inv: Tensor

    def apply(self, x: Tensor) -> Tensor:
        """``x[perm]`` (rows in the new order), with a gather as its backward."""
        return _Rows.apply(x, self.perm.to(x.device), self.inv.to(x.device))

    def restore(self, y: Tensor) -> Tensor:
        """``y[inv]`` (rows back in the original order), with a gather as its backward."""
        return _Rows.apply(y, self.inv.to(y.device), self.perm.to(y.device))


def _square(graph: AttentionGraph | Tensor, num_nodes: int | None, what: str) -> AttentionGraph:
    g = graph if isinstance(graph, AttentionGraph) else AttentionGraph(graph, num_nodes)
    if g.is_bipartite:
        raise ValueError(
            f"Expected a square graph to {what} (one set of nodes), got a bipartite one with "
            f"{g.num_src} sources and {g.num_dst} targets"
        )
    return g


def reorder(
    graph: AttentionGraph | Tensor, num_nodes: int | None = None, *, method: str = "rcm"
) -> Reordering:
    """An order of the nodes that puts neighbours next to each other.

    ``"rcm"``: reverse Cuthill-McKee (:func:`scipy.sparse.csgraph.reverse_cuthill_mckee`)
    on the symmetrized adjacency (edge directions do not matter for locality).

    Args:
        graph (AttentionGraph or Tensor): a square graph, or an ``edge_index``
            (any input :class:`AttentionGraph` takes).
        num_nodes (int, optional): for an ``edge_index``. (default: :obj:`None`)
        method (str, optional): ``"rcm"``. (default: ``"rcm"``)

    Returns:
        :class:`Reordering` ``(perm, inv)``, int64 on the CPU.

    Example:
        >>> from gnnattn.graphs import sliding_window_graph
        >>> shuffle = torch.tensor([3, 0, 5, 1, 4, 2])  # old id -> shuffled id
        >>> ei = shuffle[sliding_window_graph(6, window=1)]  # a path, ids shuffled
        >>> perm, inv = reorder(ei)
        >>> new = inv[ei]  # the same edges, nodes renamed
        >>> (new[0] - new[1]).abs().max().item()  # neighbours are adjacent again
        1
    """
    if method not in METHODS:
        raise ValueError(f"Expected 'method' in {METHODS}, got {method!r}")
    g = _square(graph, num_nodes, "reorder")
    try:
        from scipy.sparse import csr_array
        from scipy.sparse.csgraph import reverse_cuthill_mckee
    except ImportError as err:  # pragma: no cover - scipy is a dependency
        raise ImportError("reorder() needs scipy (pip install scipy)") from err
    n = g.num_nodes
    ptr, col, _ = g.csr
    ptr_np = ptr.cpu().numpy()
    col_np = col.cpu().numpy().astype(np.int64 if n >= 2**31 else np.int32, copy=False)
    adj = csr_array((np.ones(col_np.shape[0], bool), col_np, ptr_np), shape=(n, n))
    order = reverse_cuthill_mckee(csr_array(adj + adj.T), symmetric_mode=True)
    perm = torch.from_numpy(np.ascontiguousarray(order, dtype=np.int64))
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(n)
    return Reordering(perm, inv)


def permute(
    graph: AttentionGraph | Tensor, perm: Tensor, num_nodes: int | None = None
) -> AttentionGraph:
    """The graph with its nodes renamed: node ``perm[i]`` becomes node ``i``.

    The edges keep their order, so edge features (``edge_attr``) still line
    up with them; the new graph sorts its own CSR once, as any graph object.

    Args:
        graph (AttentionGraph or Tensor): a square graph or ``edge_index``.
        perm (Tensor): ``[N]`` new id -> old id, as from :func:`reorder`.
        num_nodes (int, optional): for an ``edge_index``. (default: :obj:`None`)

    Returns:
        A new :class:`AttentionGraph` on the graph's device.
    """
    g = _square(graph, num_nodes, "permute")
    n = g.num_nodes
    if not isinstance(perm, Tensor) or perm.dim() != 1 or perm.numel() != n:
        shape = list(perm.shape) if isinstance(perm, Tensor) else type(perm).__name__
        raise ValueError(f"Expected 'perm' of shape [{n}] (one entry per node), got {shape}")
    perm = perm.to(g.device, torch.int64)
    inv = torch.full((n,), -1, dtype=torch.int64, device=g.device)
    inv[perm] = torch.arange(n, device=g.device)
    if n and bool((inv < 0).any()):
        raise ValueError("Expected 'perm' to be a permutation of 0..N-1, got repeated ids")
    return AttentionGraph(inv[g.edge_index], n)
