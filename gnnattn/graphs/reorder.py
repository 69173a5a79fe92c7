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

Tile kernels (row windows of :math:`B` targets against the union of their
sources) want more than short gathers: each window's targets should share
their sources. :func:`tile_fill` measures that (edges over tile area), and
the orders differ in it. A space-filling curve of the coordinates keeps a
window's points in one compact blob; on the kNN graph of 200k uniform 3-D
points (``k = 16``) the fill at :math:`B = 64` is 0.016 in random ids, 0.046
after reverse Cuthill-McKee (whose windows are slices of a wave front),
0.064 with METIS parts of :math:`B` nodes, 0.071 on a Morton curve and 0.077
on a Hilbert curve (0.12 / 0.20 / 0.31 at :math:`B = 32 / 16 / 8`)::

    order = reorder(graph, pos=pos)    # Hilbert order of the points
    tile_fill(permute(graph, order.perm), block=64)
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from ..checks import check_int, check_tensor
from .graph import AttentionGraph
from .validate import check_batch

__all__ = ["CURVES", "METHODS", "Reordering", "permute", "reorder", "tile_fill"]

#: The orders :func:`reorder` makes: from the edges (``"rcm"``, ``"metis"``) or, given
#: the nodes' coordinates, along a space-filling curve (:data:`CURVES`).
METHODS = ("rcm", "metis", "hilbert", "morton")

#: The methods that order by coordinates (``pos``).
CURVES = ("hilbert", "morton")


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
        self._check_rows(x, "x")
        return _Rows.apply(x, self.perm.to(x.device), self.inv.to(x.device))

    def restore(self, y: Tensor) -> Tensor:
        """``y[inv]`` (rows back in the original order), with a gather as its backward."""
        self._check_rows(y, "y")
        return _Rows.apply(y, self.inv.to(y.device), self.perm.to(y.device))

    def _check_rows(self, t: Tensor, name: str) -> None:
        # One row per node: a longer tensor (virtual nodes' rows appended) would lose
        # its extra rows silently.
        check_tensor(t, name)
        n = self.perm.numel()
        if t.dim() < 1 or t.shape[0] != n:
            raise ValueError(
                f"Expected '{name}' with {n} rows (one per node of the order), got shape "
                f"{list(t.shape)}"
            )


def _square(graph: AttentionGraph | Tensor, num_nodes: int | None, what: str) -> AttentionGraph:
    if isinstance(graph, AttentionGraph) and num_nodes not in (None, graph.num_nodes):
        raise ValueError(
            f"Expected 'num_nodes' equal to the graph's {graph.num_nodes}, got {num_nodes}"
        )
    g = graph if isinstance(graph, AttentionGraph) else AttentionGraph(graph, num_nodes)
    if g.is_bipartite:
        raise ValueError(
            f"Expected a square graph to {what} (one set of nodes), got a bipartite one with "
            f"{g.num_src} sources and {g.num_dst} targets"
        )
    return g


def reorder(
    graph: AttentionGraph | Tensor,
    num_nodes: int | None = None,
    *,
    method: str | None = None,
    pos: Tensor | None = None,
    block: int = 64,
    batch: Tensor | None = None,
) -> Reordering:
    """An order of the nodes that puts neighbours next to each other.

    * ``"rcm"``: reverse Cuthill-McKee
      (:func:`scipy.sparse.csgraph.reverse_cuthill_mckee`) on the symmetrized
      adjacency (edge directions do not matter for locality): a small
      bandwidth, so short gathers.
    * ``"metis"``: METIS (``pymetis``, the ``distributed`` extra) cuts the
      symmetrized graph into parts of about ``block`` nodes; the parts follow
      each other in reverse Cuthill-McKee order of the graph between them, and
      a part's nodes keep their relative order. Consecutive ids then form
      well-connected groups: tile fill without coordinates.
    * ``"hilbert"``, ``"morton"``: the nodes sorted along a Hilbert or Morton
      (Z-order) curve through their coordinates ``pos`` (scaled alike on
      every axis, so a cube's shape is kept; ties in id order). Points close
      in space get close ids, and consecutive ids make compact blobs: the
      best tile fill for point clouds and meshes (Hilbert's more than
      Morton's, which jumps between quadrants). The edges are not read.

    Args:
        graph (AttentionGraph or Tensor): a square graph, or an ``edge_index``
            (any input :class:`AttentionGraph` takes).
        num_nodes (int, optional): for an ``edge_index``. (default: :obj:`None`)
        method (str, optional): one of :data:`METHODS`; default ``"hilbert"``
            when ``pos`` is given, else ``"rcm"``. (default: :obj:`None`)
        pos (Tensor, optional): ``[N, D]`` coordinates (finite, ``D <= 63``)
            for the curves. (default: :obj:`None`)
        block (int, optional): nodes per METIS part (the tile kernels' row
            window). (default: ``64``)
        batch (Tensor, optional): ``[N]`` sorted graph id of every node (a PyG
            ``Batch``'s): each graph's nodes stay together and the graphs in their
            order (the method's order within each), so the reordered batch is still
            a batch. (default: :obj:`None`)

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
        >>> pos = torch.tensor([[0.0, 0.0], [1.0, 1.0], [0.0, 1.0], [1.0, 0.0]])
        >>> reorder(sliding_window_graph(4, window=1), pos=pos).perm.tolist()  # Hilbert's U
        [0, 2, 1, 3]
    """
    if method is None:
        method = "hilbert" if pos is not None else "rcm"
    if method not in METHODS:
        raise ValueError(f"Expected 'method' in {METHODS}, got {method!r}")
    check_int(block, "block", min=1)
    g = _square(graph, num_nodes, "reorder")
    n = g.num_nodes
    graph_of = check_batch(batch, n).cpu().numpy() if batch is not None else None
    if method in CURVES:
        if pos is None:
            raise ValueError(
                f"Expected 'pos' (the nodes' coordinates, [N, D]) with method={method!r}, "
                "got None; without coordinates use 'rcm' or 'metis'"
            )
        order = _curve_order(_check_pos(pos, n), method)
    else:
        if pos is not None:
            raise ValueError(
                f"Expected 'pos' only with a space-filling curve {CURVES}, got it with "
                f"method={method!r} (which reads the edges alone)"
            )
        adj = _symmetric_adjacency(g)
        if n == 0:
            order = np.empty(0, np.int64)  # scipy's orderings fail on an empty matrix
        else:
            order = _rcm(adj) if method == "rcm" else _metis(adj, block)
    if graph_of is not None:
        # Stable: within a graph, the method's order is kept.
        order = np.asarray(order)[np.argsort(graph_of[order], kind="stable")]
    # Normal tensors even under inference_mode: the order may serve training.
    with torch.inference_mode(False):
        # A copy: scipy's orders are reversed views, which torch cannot take.
        perm = torch.from_numpy(np.array(order, dtype=np.int64))
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(n)
    return Reordering(perm, inv)


def _symmetric_adjacency(g: AttentionGraph) -> Any:
    """``A + A^T`` of the graph as a scipy CSR array (boolean; self-loops kept)."""
    try:
        from scipy.sparse import csr_array
    except ImportError as err:  # pragma: no cover - scipy is a dependency
        raise ImportError("reorder() needs scipy (pip install scipy)") from err
    n = g.num_nodes
    ptr, col, _ = g.csr
    ptr_np = ptr.cpu().numpy()
    col_np = col.cpu().numpy().astype(np.int64 if n >= 2**31 else np.int32, copy=False)
    adj = csr_array((np.ones(col_np.shape[0], bool), col_np, ptr_np), shape=(n, n))
    return csr_array(adj + adj.T)


def _rcm(adj: Any) -> np.ndarray:
    from scipy.sparse.csgraph import reverse_cuthill_mckee

    return reverse_cuthill_mckee(adj, symmetric_mode=True)


def _metis(adj: Any, block: int) -> np.ndarray:
    """Nodes grouped by METIS part (parts of about ``block`` nodes), parts in RCM order."""
    n = adj.shape[0]
    parts = math.ceil(n / block)
    if parts <= 1:
        return np.arange(n)
    try:
        import pymetis
    except ImportError as err:
        raise ImportError(
            "reorder(method='metis') needs the 'pymetis' package: pip install "
            "'gnnattn[distributed]' (or use 'rcm', or a curve given the coordinates)"
        ) from err
    adj = adj.tocoo()
    keep = adj.row != adj.col  # METIS takes no self-loops
    rows, cols = adj.row[keep].astype(np.int64), adj.col[keep].astype(np.int64)
    xadj = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n), out=xadj[1:])
    # coo from a canonical csr is sorted by row: cols is the adjacency in CSR order.
    _, membership = pymetis.part_graph(
        parts, pymetis.CSRAdjacency(adj_starts=xadj, adjacent=cols), options=pymetis.Options(seed=0)
    )
    part = np.asarray(membership, dtype=np.int64)
    # The parts' own graph, ordered by RCM: neighbouring parts get neighbouring ids.
    from scipy.sparse import coo_array, csr_array

    quotient = coo_array((np.ones(rows.shape[0], bool), (part[rows], part[cols])), (parts, parts))
    rank = np.empty(parts, dtype=np.int64)
    rank[_rcm(csr_array(quotient))] = np.arange(parts)
    return np.argsort(rank[part], kind="stable")


def _check_pos(pos: Tensor, n: int) -> np.ndarray:
    check_tensor(pos, "pos")
    if pos.dim() != 2 or pos.shape[0] != n or not 1 <= pos.shape[1] <= 63:
        raise ValueError(
            f"Expected 'pos' of shape [{n}, D] with 1 <= D <= 63 (one row of coordinates "
            f"per node), got {list(pos.shape)}"
        )
    if not (pos.is_floating_point() or pos.dtype in (torch.int32, torch.int64)):
        raise TypeError(f"Expected 'pos' of a real dtype, got {pos.dtype}")
    p = pos.detach().cpu().double().numpy()
    if not np.isfinite(p).all():
        raise ValueError("Expected finite 'pos', got inf or NaN coordinates")
    return p


def _curve_order(p: np.ndarray, method: str) -> np.ndarray:
    """The node order along the curve: coordinates made integers of ``bits`` bits on
    a common scale, their curve index computed, sorted (stable: ties by id)."""
    n, d = p.shape
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    bits = max(1, min(20, 63 // d))
    lo = p.min(0)
    extent = float((p.max(0) - lo).max())
    scale = ((1 << bits) - 1) / extent if extent > 0 else 0.0
    x = np.floor((p - lo) * scale).astype(np.int64).T.copy()  # (D, N)
    if method == "hilbert":
        x = _hilbert_transpose(x, bits)
    code = np.zeros(n, dtype=np.int64)
    for b in range(bits):  # interleave: bit b of axis a goes to b * D + (D - 1 - a)
        for a in range(d):
            code |= ((x[a] >> b) & 1) << (b * d + d - 1 - a)
    return np.argsort(code, kind="stable")


def _hilbert_transpose(x: np.ndarray, bits: int) -> np.ndarray:
    """Skilling's axes-to-transpose (AIP Conf. Proc. 707, 2004), on all points at once:
    ``x`` ``[D, N]`` coordinates in, the Hilbert index in "transposed" form out (its
    bits interleaved across the axes, as a Morton code interleaves coordinates)."""
    d = x.shape[0]
    q = 1 << (bits - 1)
    while q > 1:  # undo the excess work of the Gray code, top bit down
        p = q - 1
        for i in range(d):
            high = (x[i] & q) != 0
            x[0][high] ^= p  # invert the low bits of axis 0
            t = (x[0] ^ x[i]) & p
            t[high] = 0
            x[0] ^= t  # or swap them with axis i's
            x[i] ^= t
        q >>= 1
    for i in range(1, d):  # Gray encode
        x[i] ^= x[i - 1]
    t = np.zeros(x.shape[1], dtype=np.int64)
    q = 1 << (bits - 1)
    while q > 1:
        t[(x[d - 1] & q) != 0] ^= q - 1
        q >>= 1
    x ^= t
    return x


def tile_fill(
    graph: AttentionGraph | Tensor, num_nodes: int | None = None, *, block: int = 64
) -> float:
    r"""How much of its tiles a graph fills: edges over the area of row-window tiles.

    Targets are cut into row windows of ``block`` consecutive ids; a window
    :math:`W` reads the union :math:`U_W` of its targets' sources, compacted
    into dense columns (as tile kernels gather them). The fill is

    .. math::
        \text{fill} = \frac{|\mathcal{E}|}{\sum_W |W| \, |U_W|}

    (:math:`|W| = B` but for a shorter last window): 1 when every window is a
    complete bipartite block, about :math:`1 / B` for a random graph of
    degree much less than the number of nodes. A pure function of the edges
    and the ids, whatever backend runs: what :func:`reorder` changes. Repeated
    edges count once per copy; a graph without edges fills its (empty) tiles: 1.

    Args:
        graph (AttentionGraph or Tensor): any graph, or an ``edge_index``.
        num_nodes (int, optional): for an ``edge_index``. (default: :obj:`None`)
        block (int, optional): :math:`B`, targets per row window. (default: ``64``)

    Example:
        >>> from gnnattn.graphs import complete_graph, sliding_window_graph
        >>> tile_fill(complete_graph(8), block=4)
        1.0
        >>> tile_fill(sliding_window_graph(8, window=1), block=4)  # 22 edges / (4*5 + 4*5)
        0.55
    """
    check_int(block, "block", min=1)
    g = graph if isinstance(graph, AttentionGraph) else AttentionGraph(graph, num_nodes)
    ptr, col, _ = g.csr
    e = col.numel()
    if e == 0:
        return 1.0
    n, m = g.num_dst, g.num_src
    deg = ptr.diff().cpu()
    window = torch.repeat_interleave(torch.arange(n) // block, deg)  # (E,) window of each edge
    pairs = torch.unique(window * m + col.cpu().long())  # distinct (window, source)
    columns = torch.bincount(pairs // m, minlength=math.ceil(n / block))  # (W,) |U_W|
    rows = torch.full_like(columns, block)
    rows[-1] = n - block * (columns.numel() - 1)
    return e / float((rows * columns).sum())


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
    if perm.dtype.is_floating_point or perm.dtype.is_complex or perm.dtype == torch.bool:
        raise TypeError(f"Expected 'perm' of an integer dtype, got {perm.dtype}")
    perm = perm.to(g.device, torch.int64)
    if n and bool(((perm < 0) | (perm >= n)).any()):
        raise ValueError(
            f"Expected 'perm' to be a permutation of 0..{n - 1}, got ids in "
            f"[{int(perm.min())}, {int(perm.max())}]"
        )
    inv = torch.full((n,), -1, dtype=torch.int64, device=g.device)
    inv[perm] = torch.arange(n, device=g.device)
    if n and bool((inv < 0).any()):
        raise ValueError("Expected 'perm' to be a permutation of 0..N-1, got repeated ids")
    return AttentionGraph(inv[g.edge_index], n)
