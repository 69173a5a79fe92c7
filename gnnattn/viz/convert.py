r"""Conversion: attention weights as edges, as dense matrices, for bertviz, cut to the top k.

Everything here is a computation on tensors (networkx graphs aside); nothing
draws. The inputs are what the layers return with
``return_attention_weights=True``: ``edge_index`` ``[2, E]`` (``edge_index[0]``
the source :math:`j`, ``edge_index[1]`` the target :math:`i`) and ``alpha``
``[E, H]`` (or ``[E]`` for one head). Values are kept exactly as given.

The nodes are one set, as in self-attention: source :math:`j` and target
:math:`j` are the same node. Cross-attention's weights (a layer called on a pair
``(x_src, x_dst)``) relate two sets; take them as a rectangular matrix with
``attention_matrix(edge_index, alpha, N_dst, num_src=M)``.
"""

from __future__ import annotations

import math
from typing import Any

import networkx as nx
import torch
from torch import Tensor

from ..checks import check_float, check_int
from ..graphs import check_edge_index, mask_to_edge_index
from .text import check_labels, clean

__all__ = [
    "attention_graph",
    "attention_matrix",
    "matrix_to_attention",
    "to_bertviz",
    "top_k_per_target",
]

Edge = tuple[int, int, float]


# ---------------------------------------------------------------------- checks


def num_nodes_of(edge_index: Tensor, num_nodes: int | None, tokens: Any) -> int:
    """:math:`N` from ``num_nodes``, else the edges and the labels; checks the label count."""
    if num_nodes is not None:
        check_int(num_nodes, "num_nodes")
        n = num_nodes
    else:
        n = int(edge_index.max()) + 1 if edge_index.numel() else 0
        # Extra tokens are nodes without edges; too few is an error below.
        n = max(n, len(tokens)) if tokens is not None else n
    if tokens is not None and len(tokens) != n:
        raise ValueError(
            f"Expected 'tokens' to hold one label per node ({n}), got {len(tokens)} labels"
        )
    return n


def check_weights(alpha: Tensor, where: str = "") -> None:
    """Raise unless every weight is finite and >= 0: a drawing or an explorer shows them as
    widths, and NaN, inf or a negative weight would be hidden or drawn as a weight.
    ``where`` follows ``'alpha'`` in the message (e.g. ``" (layer 2)"``)."""
    bad = ~torch.isfinite(alpha) | (alpha < 0)
    if bool(bad.any()):
        e = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"Expected finite weights >= 0 in 'alpha'{where}, got {alpha[e].tolist()} at edge {e}"
        )


def check_attention(
    edge_index: Tensor,
    alpha: Tensor,
    num_nodes: int | None = None,
    tokens: Any = None,
    where: str = "",
) -> tuple[Tensor, Tensor, int]:
    """``(edge_index int64, alpha [E, H] detached, N)`` after checking shapes and ids.

    ``where`` follows the argument's name in a message (e.g. ``" (layer 2)"``).
    """
    if not isinstance(edge_index, Tensor):
        raise TypeError(
            f"Expected 'edge_index'{where} to be a Tensor, got {type(edge_index).__name__}"
        )
    if not isinstance(alpha, Tensor):
        raise TypeError(f"Expected 'alpha'{where} to be a Tensor, got {type(alpha).__name__}")
    if edge_index.dim() != 2 or edge_index.shape[0] != 2:
        raise ValueError(
            f"Expected 'edge_index'{where} of shape [2, E], got {list(edge_index.shape)}"
        )
    if alpha.dim() == 1:
        alpha = alpha.unsqueeze(-1)
    if alpha.dim() != 2 or alpha.shape[0] != edge_index.shape[1]:
        raise ValueError(
            f"Expected 'alpha'{where} of shape [E, H] or [E] with E={edge_index.shape[1]} (one "
            f"row per edge of edge_index), got {list(alpha.shape)}"
        )
    if alpha.shape[1] == 0:
        raise ValueError(
            f"Expected 'alpha'{where} to hold at least one head ([E, H] with H >= 1), got "
            f"{list(alpha.shape)}"
        )
    if not alpha.is_floating_point():
        raise TypeError(f"Expected 'alpha'{where} of a floating dtype, got {alpha.dtype}")
    if tokens is not None:
        check_labels(tokens, "tokens")
    n = num_nodes_of(edge_index, num_nodes, tokens)
    _check_ids(edge_index, n, where)
    return edge_index.long(), alpha.detach(), n


def _check_ids(edge_index: Tensor, n: int, where: str) -> None:
    """:func:`~gnnattn.graphs.check_edge_index`, its message saying ``where``."""
    try:
        check_edge_index(edge_index, max(n, 1) if edge_index.numel() == 0 else n)
    except (TypeError, ValueError) as err:
        if not where:
            raise
        # Its messages name the argument as 'edge_index': the layer goes right after it.
        raise type(err)(str(err).replace("'edge_index'", f"'edge_index'{where}", 1)) from err


def head_weights(alpha: Tensor, head: int | None) -> Tensor:
    """One weight per edge: head ``head`` of ``alpha [E, H]``, or the mean over heads."""
    h = alpha.shape[1]
    if head is None:
        return alpha.mean(dim=1)
    check_int(head, "head", min=-h)
    if not -h <= head < h:
        raise ValueError(f"Expected 'head' in [0, {h}) (alpha has {h} heads), got {head}")
    return alpha[:, head]


def labels_of(n: int, tokens: Any) -> list[str]:
    """One label per node: the tokens (cleaned, see :func:`~gnnattn.viz.text.clean`), or the ids."""
    return [clean(t) for t in tokens] if tokens is not None else [str(i) for i in range(n)]


# ------------------------------------------------------------------ conversion


def attention_graph(
    edge_index: Tensor,
    alpha: Tensor,
    *,
    tokens: list[str] | None = None,
    head: int | None = None,
    num_nodes: int | None = None,
) -> nx.DiGraph:
    r"""The attention weights as a :class:`networkx.DiGraph`, one edge :math:`j \to i` per edge.

    Node :math:`i` has attribute ``label`` (its token, or its index); edge
    :math:`j \to i` has ``weight`` (:math:`\alpha_{ij}` of ``head``, or the mean
    over heads) and ``weights`` (a list, every head). Values are exact.

    Args:
        edge_index (Tensor): ``[2, E]``, messages ``edge_index[0] -> edge_index[1]``.
        alpha (Tensor): ``[E, H]`` or ``[E]`` weights, in the order of ``edge_index``.
        tokens (list of str, optional): one label per node. (default: :obj:`None`)
        head (int, optional): which head gives ``weight``. (default: :obj:`None`, the mean)
        num_nodes (int, optional): :math:`N`; defaults to ``len(tokens)`` or
            ``edge_index.max() + 1``. (default: :obj:`None`)

    Shapes:
        - **edge_index:** ``[2, E]``; **alpha:** ``[E, H]`` or ``[E]``
        - **output:** a DiGraph with :math:`N` nodes and :math:`E` edges
          (duplicate edges are merged, their weights added).

    Example:
        >>> g = attention_graph(causal_graph(2), torch.tensor([1.0, 0.25, 0.75]),
        ...                     tokens=["a", "b"])
        >>> g.nodes[1]["label"], g.edges[0, 1]["weight"]
        ('b', 0.25)
    """
    edge_index, alpha, n = check_attention(edge_index, alpha, num_nodes, tokens)
    w = head_weights(alpha, head).tolist()
    ws = alpha.tolist()
    g = nx.DiGraph()
    for i, label in enumerate(labels_of(n, tokens)):
        g.add_node(i, label=label)
    for e, (j, i) in enumerate(edge_index.t().tolist()):
        if g.has_edge(j, i):
            # A duplicate edge sends two messages: its weights add up.
            d = g.edges[j, i]
            d["weight"] += w[e]
            d["weights"] = [a + b for a, b in zip(d["weights"], ws[e], strict=True)]
        else:
            g.add_edge(j, i, weight=w[e], weights=list(ws[e]))
    return g


def attention_matrix(
    edge_index: Tensor, alpha: Tensor, num_nodes: int | None = None, *, num_src: int | None = None
) -> Tensor:
    r"""The dense ``[H, N, N]`` attention matrices: entry ``[h, i, j]`` is :math:`\alpha_{ij}^h`.

    Row :math:`i` is target :math:`i` (the query), column :math:`j` the source
    (the key); zeros where there is no edge, so each row with an incoming edge
    sums to 1. Duplicate edges add up.

    Args:
        edge_index (Tensor): ``[2, E]``.
        alpha (Tensor): ``[E, H]`` or ``[E]``.
        num_nodes (int, optional): :math:`N`. (default: :obj:`None`, ``edge_index.max() + 1``)
        num_src (int, optional): the sources :math:`M` of cross-attention's weights
            (a bipartite graph): the matrices are then ``[H, N, M]``, ``N`` from
            the targets (``edge_index[1]``) when ``num_nodes`` is not given.
            (default: :obj:`None`, self-attention)

    Shapes:
        - **output:** ``[H, N, N]`` (``[H, N, M]`` with ``num_src``), dtype of ``alpha``.

    Example:
        >>> attention_matrix(causal_graph(2), torch.tensor([1.0, 0.25, 0.75]))
        tensor([[[1.0000, 0.0000],
                 [0.2500, 0.7500]]])
    """
    if num_src is None:
        edge_index, alpha, n = check_attention(edge_index, alpha, num_nodes)
        m = n
    else:
        check_int(num_src, "num_src")
        check_int(num_nodes, "num_nodes", optional=True)
        if num_nodes is None and isinstance(edge_index, Tensor) and edge_index.dim() == 2:
            targets = edge_index[-1]
            num_nodes = int(targets.max()) + 1 if targets.numel() else 0
        # Checked as one set of max(N, M) nodes, then each row against its own set.
        edge_index, alpha, _ = check_attention(edge_index, alpha, max(num_nodes or 0, num_src))
        check_edge_index(edge_index, num_src, num_nodes)
        n, m = int(num_nodes or 0), num_src
    h = alpha.shape[1]
    out = alpha.new_zeros(h, n, m)
    heads = torch.arange(h, device=alpha.device).view(h, 1).expand(h, edge_index.shape[1])
    dst = edge_index[1].to(alpha.device).expand(h, -1)
    src = edge_index[0].to(alpha.device).expand(h, -1)
    out.index_put_((heads, dst, src), alpha.t(), accumulate=True)
    return out


def matrix_to_attention(matrix: Tensor, edge_index: Tensor | None = None) -> tuple[Tensor, Tensor]:
    r"""The way back from :func:`attention_matrix`: ``(edge_index, alpha [E, H])``.

    Args:
        matrix (Tensor): ``[H, N, N]`` or ``[N, N]`` (row = target).
        edge_index (Tensor, optional): the edges to read; keeps edges whose
            weight is exactly 0. (default: :obj:`None`, every entry that is
            non-zero in some head, sorted by target then source)

    Shapes:
        - **output:** ``([2, E], [E, H])``

    Example:
        >>> ei, a = matrix_to_attention(torch.tensor([[1.0, 0.0], [0.25, 0.75]]))
        >>> ei.tolist(), a.squeeze(-1).tolist()
        ([[0, 0, 1], [0, 1, 1]], [1.0, 0.25, 0.75])
    """
    if not isinstance(matrix, Tensor):
        raise TypeError(f"Expected 'matrix' to be a Tensor, got {type(matrix).__name__}")
    if matrix.dim() == 2:
        matrix = matrix.unsqueeze(0)
    if matrix.dim() != 3 or matrix.shape[1] != matrix.shape[2]:
        raise ValueError(
            f"Expected 'matrix' of shape [H, N, N] or [N, N], got {list(matrix.shape)}"
        )
    n = matrix.shape[1]
    if edge_index is None:
        edge_index = mask_to_edge_index(matrix.ne(0).any(0))
    else:
        check_edge_index(edge_index, max(n, 1) if edge_index.numel() == 0 else n)
        edge_index = edge_index.long()
    alpha = matrix[:, edge_index[1], edge_index[0]].t().contiguous()  # (E, H)
    return edge_index, alpha


def to_bertviz(
    attentions: list[tuple[Tensor, Tensor]], num_nodes: int | None = None
) -> list[Tensor]:
    """Per-layer weights in bertviz's format: a list of ``[1, H, N, N]`` tensors.

    Pass the result as ``attention`` to ``bertviz.head_view`` /
    ``model_view`` (bertviz is not a dependency of gnnattn).

    Args:
        attentions (list of (Tensor, Tensor)): one ``(edge_index, alpha)`` per
            layer, as returned with ``return_attention_weights=True``.
        num_nodes (int, optional): :math:`N`. (default: :obj:`None`, from the edges)

    Shapes:
        - **output:** one ``[1, H, N, N]`` tensor per layer.

    Example:
        >>> [a.shape for a in to_bertviz([(complete_graph(3), torch.full((9, 2), 1 / 3))])]
        [torch.Size([1, 2, 3, 3])]
    """
    if not isinstance(attentions, (list, tuple)):
        raise TypeError(
            f"Expected 'attentions' to be a list of (edge_index, alpha), got "
            f"{type(attentions).__name__}"
        )
    for layer, pair in enumerate(attentions):
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2):
            # A lone (edge_index, alpha) is a tuple too: its items are tensors.
            raise TypeError(
                f"Expected 'attentions' to be a list of (edge_index, alpha) pairs (one per "
                f"layer; wrap a single pair in a list), got an item of type {type(pair).__name__}"
            )
        check_attention(pair[0], pair[1], where=f" (layer {layer})")  # before reading ids
    if num_nodes is None:
        sizes = [int(ei.max()) + 1 for ei, _ in attentions if ei.numel()]
        num_nodes = max(sizes, default=0)
    return [attention_matrix(ei, a, num_nodes).unsqueeze(0) for ei, a in attentions]


# ------------------------------------------------------------------ filtering


def top_k_per_target(edge_index: Tensor, weights: Tensor, k: int) -> Tensor:
    r"""Which edges are among the ``k`` heaviest incoming edges of their target.

    For ``weights`` ``[E, H]`` an edge is ranked by its largest weight over
    the heads, so the strongest edges of every head tend to survive. Ties go
    to the edge that comes first in ``edge_index``.

    Args:
        edge_index (Tensor): ``[2, E]``.
        weights (Tensor): ``[E]`` or ``[E, H]``, e.g. ``alpha``.
        k (int): edges kept per target, at least 1.

    Shapes:
        - **output:** a boolean mask ``[E]``; ``edge_index[:, mask]`` keeps
          ``min(in-degree, k)`` edges per target.

    Example:
        >>> top_k_per_target(causal_graph(3), torch.tensor([1.0, .4, .6, .2, .5, .3]), 1)
        tensor([ True, False,  True, False,  True, False])
    """
    if not isinstance(edge_index, Tensor) or edge_index.dim() != 2 or edge_index.shape[0] != 2:
        raise ValueError(
            f"Expected 'edge_index' of shape [2, E], got {list(getattr(edge_index, 'shape', []))}"
        )
    if not isinstance(weights, Tensor) or weights.shape[:1] != edge_index.shape[1:]:
        raise ValueError(
            f"Expected 'weights' of shape [E] or [E, H] with E={edge_index.shape[1]}, "
            f"got {list(getattr(weights, 'shape', []))}"
        )
    if not weights.is_floating_point():
        raise TypeError(f"Expected 'weights' of a floating dtype, got {weights.dtype}")
    if weights.dim() > 1 and math.prod(weights.shape[1:]) == 0:
        raise ValueError(
            f"Expected 'weights' to hold at least one head ([E, H] with H >= 1), got "
            f"{list(weights.shape)}"
        )
    check_int(k, "k", min=1)
    if edge_index.shape[1] == 0:
        return torch.zeros(0, dtype=torch.bool, device=edge_index.device)
    check_edge_index(edge_index, int(edge_index.max()) + 1)  # integer ids, none negative
    w = weights.detach().reshape(weights.shape[0], -1).amax(dim=1).cpu()
    dst = edge_index[1].detach().long().cpu()
    # Heaviest first, then grouped by target (both sorts stable): the rank of
    # an edge within its target is its position after the group's start.
    order = torch.argsort(-w, stable=True)
    order = order[torch.argsort(dst[order], stable=True)]
    counts = torch.bincount(dst[order])
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.arange(order.numel()) - starts[dst[order]]
    keep = torch.zeros(dst.numel(), dtype=torch.bool)
    keep[order[rank < k]] = True
    return keep.to(edge_index.device)


def _top_per_target(edges: list[Edge], k: int) -> list[Edge]:
    by_target: dict[int, list[Edge]] = {}
    for e in edges:
        by_target.setdefault(e[1], []).append(e)
    top = []
    for es in by_target.values():
        top.extend(sorted(es, key=lambda e: -e[2])[:k])
    return top


def filter_edges(
    edges: list[Edge], min_weight: float, top_k: int | None, max_edges: int | None = None
) -> tuple[list[Edge], str]:
    """The edges ``(j, i, weight)`` to draw and a legend line saying what was hidden.

    After ``min_weight`` and ``top_k``, more than ``max_edges`` edges are cut
    to the ``k`` heaviest incoming edges of each target, the largest ``k``
    that fits (at least 1).
    """
    check_int(top_k, "top_k", min=1, optional=True)
    check_int(max_edges, "max_edges", min=1, optional=True)
    min_weight = check_float(min_weight, "min_weight", lo=0.0)
    kept = [e for e in edges if e[2] >= min_weight]
    notes = []
    if len(kept) < len(edges):
        notes.append(f"{len(edges) - len(kept)} with weight < {min_weight:g}")
    if top_k is not None:
        top = _top_per_target(kept, top_k)
        if len(top) < len(kept):
            notes.append(f"{len(kept) - len(top)} outside the top {top_k} per target")
        kept = top
    if max_edges is not None and len(kept) > max_edges:
        deg = torch.bincount(torch.tensor([e[1] for e in kept]))
        k = 1
        while k < int(deg.max()) and int(deg.clamp(max=k + 1).sum()) <= max_edges:
            k += 1
        top = _top_per_target(kept, k)
        notes.append(
            f"{len(kept) - len(top)} outside the top {k} per target (max_edges={max_edges})"
        )
        kept = top
    shown = f"{len(kept)} of {len(edges)} edges shown"
    return kept, shown + ("; hidden: " + ", ".join(notes) if notes else "")
