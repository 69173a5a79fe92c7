r"""Attention as edges: networkx graphs, dense matrices and drawings of the weights.

Every function here takes what :class:`gnnattn.SelfAttentionConv` returns with
``return_attention_weights=True``: ``edge_index`` ``[2, E]`` (``edge_index[0]``
the source :math:`j`, ``edge_index[1]`` the target :math:`i`) and ``alpha``
``[E, H]`` (or ``[E]`` for one head), where

.. math::
    \alpha_{ij}^h = \frac{\exp(s_{ij}^h)}{\sum_{k \in \mathcal{N}(i)} \exp(s_{ik}^h)}.

Values are kept exactly as given: nothing is min-max normalized and nothing is
dropped unless a filter (``min_weight`` / ``top_k``) asks for it, and then the
drawing's legend says what was hidden. In the dense picture row :math:`i` is
target :math:`i`, so every row of :func:`attention_matrix` sums to 1 over the
edges that exist.

The drawings need matplotlib, the ``viz`` extra (``pip install 'gnnattn[viz]'``);
it is imported only when a drawing function is called.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import networkx as nx
import torch
from torch import Tensor

from .checks import check_int
from .graphs import check_edge_index, mask_to_edge_index

__all__ = [
    "SoftmaxSteps",
    "attention_graph",
    "attention_matrix",
    "draw_attention",
    "draw_attention_heads",
    "draw_heatmap",
    "draw_side_by_side",
    "matrix_to_attention",
    "softmax_steps",
    "to_bertviz",
]


def _pyplot() -> Any:
    try:
        import matplotlib.pyplot as plt
    except ImportError as err:  # pragma: no cover - exercised only without matplotlib
        raise ImportError("gnnattn's drawings need matplotlib: pip install 'gnnattn[viz]'") from err
    return plt


# ---------------------------------------------------------------------- checks


def _num_nodes(edge_index: Tensor, num_nodes: int | None, tokens: Any) -> int:
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


def _check(
    edge_index: Tensor, alpha: Tensor, num_nodes: int | None = None, tokens: Any = None
) -> tuple[Tensor, Tensor, int]:
    """``(edge_index, alpha [E, H], N)`` after checking shapes and ids."""
    if not isinstance(edge_index, Tensor):
        raise TypeError(f"Expected 'edge_index' to be a Tensor, got {type(edge_index).__name__}")
    if not isinstance(alpha, Tensor):
        raise TypeError(f"Expected 'alpha' to be a Tensor, got {type(alpha).__name__}")
    if edge_index.dim() != 2 or edge_index.shape[0] != 2:
        raise ValueError(f"Expected 'edge_index' of shape [2, E], got {list(edge_index.shape)}")
    if alpha.dim() == 1:
        alpha = alpha.unsqueeze(-1)
    if alpha.dim() != 2 or alpha.shape[0] != edge_index.shape[1]:
        raise ValueError(
            f"Expected 'alpha' of shape [E, H] or [E] with E={edge_index.shape[1]} (one row per "
            f"edge of edge_index), got {list(alpha.shape)}"
        )
    if not alpha.is_floating_point():
        raise TypeError(f"Expected 'alpha' of a floating dtype, got {alpha.dtype}")
    if tokens is not None and isinstance(tokens, str):
        raise TypeError("Expected 'tokens' to be a list of strings, got one str (use .split())")
    n = _num_nodes(edge_index, num_nodes, tokens)
    check_edge_index(edge_index, max(n, 1) if edge_index.numel() == 0 else n)
    return edge_index.long(), alpha.detach(), n


def _head_weights(alpha: Tensor, head: int | None) -> Tensor:
    """One weight per edge: head ``head`` of ``alpha [E, H]``, or the mean over heads."""
    h = alpha.shape[1]
    if head is None:
        return alpha.mean(dim=1)
    check_int(head, "head", min=-h)
    if not -h <= head < h:
        raise ValueError(f"Expected 'head' in [0, {h}) (alpha has {h} heads), got {head}")
    return alpha[:, head]


def _which(alpha: Tensor, head: int | None) -> str:
    """The head part of a title: empty for one head, else which head or the mean."""
    if alpha.dim() == 1 or alpha.shape[1] == 1:
        return ""
    return " (mean over heads)" if head is None else f" (head {head})"


def _label_size(label: str) -> float:
    # Node circles have a fixed size: long tokens get a smaller font to fit.
    return 9.0 if len(label) <= 3 else max(6.0, 30.0 / len(label))


def _labels(n: int, tokens: Any) -> list[str]:
    return [str(t) for t in tokens] if tokens is not None else [str(i) for i in range(n)]


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
    edge_index, alpha, n = _check(edge_index, alpha, num_nodes, tokens)
    w = _head_weights(alpha, head).tolist()
    ws = alpha.tolist()
    g = nx.DiGraph()
    for i, label in enumerate(_labels(n, tokens)):
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


def attention_matrix(edge_index: Tensor, alpha: Tensor, num_nodes: int | None = None) -> Tensor:
    r"""The dense ``[H, N, N]`` attention matrices: entry ``[h, i, j]`` is :math:`\alpha_{ij}^h`.

    Row :math:`i` is target :math:`i` (the query), column :math:`j` the source
    (the key); zeros where there is no edge, so each row with an incoming edge
    sums to 1. Duplicate edges add up.

    Args:
        edge_index (Tensor): ``[2, E]``.
        alpha (Tensor): ``[E, H]`` or ``[E]``.
        num_nodes (int, optional): :math:`N`. (default: :obj:`None`, ``edge_index.max() + 1``)

    Shapes:
        - **output:** ``[H, N, N]``, dtype of ``alpha``.

    Example:
        >>> attention_matrix(causal_graph(2), torch.tensor([1.0, 0.25, 0.75]))
        tensor([[[1.0000, 0.0000],
                 [0.2500, 0.7500]]])
    """
    edge_index, alpha, n = _check(edge_index, alpha, num_nodes)
    h = alpha.shape[1]
    out = alpha.new_zeros(h, n, n)
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

    Example:
        >>> [a.shape for a in to_bertviz([(complete_graph(3), torch.full((9, 2), 1 / 3))])]
        [torch.Size([1, 2, 3, 3])]
    """
    if not isinstance(attentions, (list, tuple)):
        raise TypeError(
            f"Expected 'attentions' to be a list of (edge_index, alpha), got "
            f"{type(attentions).__name__}"
        )
    if num_nodes is None:
        sizes = [int(ei.max()) + 1 for ei, _ in attentions if ei.numel()]
        num_nodes = max(sizes, default=0)
    return [attention_matrix(ei, a, num_nodes).unsqueeze(0) for ei, a in attentions]


# --------------------------------------------------------------------- layouts


def _is_complete(g: nx.DiGraph) -> bool:
    n = g.number_of_nodes()
    off = sum(1 for j, i in g.edges if j != i)
    return n > 1 and off == n * (n - 1)


def _is_dag(g: nx.DiGraph) -> bool:
    h = nx.DiGraph(g)
    h.remove_edges_from(list(nx.selfloop_edges(h)))
    return nx.is_directed_acyclic_graph(h)


def _layout(g: nx.DiGraph, layout: str) -> tuple[dict[int, tuple[float, float]], str]:
    """Node positions and the layout actually used."""
    if layout not in ("auto", "circular", "layered", "spring"):
        raise ValueError(
            f"Expected 'layout' to be 'auto', 'circular', 'layered' or 'spring', got {layout!r}"
        )
    n = g.number_of_nodes()
    if layout == "auto":
        if n <= 1:
            layout = "circular"
        elif _is_complete(g):
            layout = "circular"
        elif _is_dag(g) and g.number_of_edges() > 0:
            layout = "layered"
        else:
            layout = "spring"
    if n == 1:
        return {next(iter(g.nodes)): (0.0, 0.0)}, layout
    if layout == "circular":
        # Token 0 at the top, then clockwise: reads like a sentence.
        pos = {
            v: (math.sin(2 * math.pi * k / n), math.cos(2 * math.pi * k / n))
            for k, v in enumerate(sorted(g.nodes))
        }
        return pos, layout
    if layout == "layered":
        h = nx.DiGraph(g)
        h.remove_edges_from(list(nx.selfloop_edges(h)))
        if not nx.is_directed_acyclic_graph(h):
            raise ValueError("Expected a DAG (self-loops aside) for layout='layered', got a cycle")
        # Longest-path depth: every edge points left to right.
        depth: dict[int, int] = {}
        for v in nx.topological_sort(h):
            depth[v] = max((depth[u] + 1 for u in h.predecessors(v)), default=0)
        layers: dict[int, list[int]] = {}
        for v in sorted(h.nodes):
            layers.setdefault(depth[v], []).append(v)
        pos = {}
        for d, vs in layers.items():
            for k, v in enumerate(vs):
                pos[v] = (float(d), (len(vs) - 1) / 2 - k)
        return pos, layout
    raw = nx.spring_layout(g, seed=0)
    return {v: (float(p[0]), float(p[1])) for v, p in raw.items()}, layout


# --------------------------------------------------------------------- drawing


def _filter(
    edges: list[tuple[int, int, float]], min_weight: float, top_k: int | None
) -> tuple[list[tuple[int, int, float]], str]:
    """The edges to draw and a legend line saying what was hidden."""
    check_int(top_k, "top_k", min=1, optional=True)
    if not min_weight >= 0:
        raise ValueError(f"Expected 'min_weight' >= 0, got {min_weight!r}")
    kept = [e for e in edges if e[2] >= min_weight]
    notes = []
    if len(kept) < len(edges):
        notes.append(f"{len(edges) - len(kept)} with weight < {min_weight:g}")
    if top_k is not None:
        by_target: dict[int, list[tuple[int, int, float]]] = {}
        for e in kept:
            by_target.setdefault(e[1], []).append(e)
        top = []
        for es in by_target.values():
            top.extend(sorted(es, key=lambda e: -e[2])[:top_k])
        if len(top) < len(kept):
            notes.append(f"{len(kept) - len(top)} outside the top {top_k} per target")
        kept = top
    shown = f"{len(kept)} of {len(edges)} edges shown"
    return kept, shown + ("; hidden: " + ", ".join(notes) if notes else "")


def _wrap_note(note: str, width: int = 48) -> str:
    """The filter note on short lines, broken between its items, never inside one."""
    lines = []
    for line in note.split("; "):
        lines.append(line if len(line) <= width else line.replace(", ", ",\n"))
    return "\n".join(lines)


def _curve_mid(p0: tuple[float, float], p1: tuple[float, float], rad: float) -> tuple[float, float]:
    # The midpoint of matplotlib's arc3 quadratic Bezier, for the edge label.
    mx, my = (p0[0] + p1[0]) / 2, (p0[1] + p1[1]) / 2
    dx, dy = p1[0] - p0[0], p1[1] - p0[1]
    cx, cy = mx + rad * dy, my - rad * dx
    return 0.25 * p0[0] + 0.5 * cx + 0.25 * p1[0], 0.25 * p0[1] + 0.5 * cy + 0.25 * p1[1]


def draw_attention(
    edge_index: Tensor,
    alpha: Tensor,
    *,
    tokens: list[str] | None = None,
    head: int | None = None,
    num_nodes: int | None = None,
    min_weight: float = 0.0,
    top_k: int | None = None,
    layout: str = "auto",
    edge_labels: bool | None = None,
    max_width: float = 8.0,
    color: str = "tab:blue",
    ax: Any = None,
    title: str | None = None,
) -> Any:
    r"""Draw the weights as a graph: arrows :math:`j \to i`, width and opacity ∝ weight.

    Arrows point the way messages flow (from the source token to the target
    that reads it); a loop on a node is its self-attention weight
    :math:`\alpha_{ii}`. Width is ``max_width * weight`` and opacity the weight
    itself (floored at 0.08 so small edges stay visible), with no
    normalization, so two drawings compare. The layout is circular for a
    complete graph, layered left to right for a DAG (causal attention, where
    every arrow points right), spring otherwise.

    Args:
        edge_index (Tensor): ``[2, E]``.
        alpha (Tensor): ``[E, H]`` or ``[E]``.
        tokens (list of str, optional): node labels. (default: :obj:`None`, indices)
        head (int, optional): which head. (default: :obj:`None`, the mean over heads)
        num_nodes (int, optional): :math:`N`. (default: :obj:`None`)
        min_weight (float, optional): hide edges below this weight.
            (default: ``0.0``)
        top_k (int, optional): keep only the ``top_k`` heaviest incoming edges
            of each target. (default: :obj:`None`)
        layout (str, optional): ``"auto"``, ``"circular"``, ``"layered"`` or
            ``"spring"``. (default: ``"auto"``)
        edge_labels (bool, optional): print each weight on its edge.
            (default: :obj:`None`, when at most 16 edges are shown)
        max_width (float, optional): line width of a weight-1 edge, in points.
            (default: ``8.0``)
        color (str, optional): edge colour. (default: ``"tab:blue"``)
        ax (matplotlib.axes.Axes, optional): where to draw. (default: :obj:`None`, a new figure)
        title (str, optional): axes title. (default: :obj:`None`, one naming the head)

    Returns:
        matplotlib.axes.Axes: the axes; ``ax.graph`` is the drawn
        :class:`networkx.DiGraph` (every edge, filters aside) and
        ``ax.layout_name`` the layout used.

    Example:
        >>> import matplotlib; matplotlib.use("Agg")
        >>> ax = draw_attention(causal_graph(3), torch.rand(6), tokens=["a", "b", "c"])
        >>> ax.layout_name
        'layered'
    """
    plt = _pyplot()
    from matplotlib.lines import Line2D
    from matplotlib.patches import Circle, FancyArrowPatch

    g = attention_graph(edge_index, alpha, tokens=tokens, head=head, num_nodes=num_nodes)
    pos, used = _layout(g, layout)
    if ax is None:
        n = g.number_of_nodes()
        size = (max(5.0, 0.9 * n + 2), 3.6) if used == "layered" else (5.5, 5.5)
        _, ax = plt.subplots(figsize=size)
    edges = [(j, i, float(d["weight"])) for j, i, d in g.edges(data=True)]
    shown, note = _filter(edges, min_weight, top_k)
    show_labels = len(shown) <= 16 if edge_labels is None else edge_labels
    node_r = 0.12 if used != "layered" else 0.16
    # Arcs, not straight lines: j -> i and i -> j then part ways, and in the
    # layered layout long edges bow over the tokens between them.
    rad = 0.12 if used == "circular" else (-0.45 if used == "layered" else 0.15)
    xs = [p[0] for p in pos.values()] or [0.0]
    ys = [p[1] for p in pos.values()] or [0.0]
    cx, cy = sum(xs) / len(xs), sum(ys) / len(ys)
    for j, i, w in shown:
        lw = max(max_width * w, 0.3)
        op = min(max(w, 0.08), 1.0)
        if i == j:
            x, y = pos[i]
            # A loop just outside the node, on the side away from the centre.
            dx, dy = x - cx, y - cy
            norm = math.hypot(dx, dy)
            dx, dy = (dx / norm, dy / norm) if norm > 1e-9 else (0.0, 1.0)
            if used == "layered":
                dx, dy = 0.0, -1.0
            lr = node_r * 0.8
            c = (x + dx * (node_r + lr * 0.7), y + dy * (node_r + lr * 0.7))
            ax.add_patch(Circle(c, lr, fill=False, lw=lw, ec=color, alpha=op, zorder=1))
            if show_labels:
                ax.text(
                    c[0] + dx * lr * 2.0,
                    c[1] + dy * lr * 2.0,
                    f"{w:.2f}",
                    ha="center",
                    va="center",
                    fontsize=7,
                    zorder=4,
                )
            continue
        arrow = FancyArrowPatch(
            pos[j],
            pos[i],
            connectionstyle=f"arc3,rad={rad}",
            arrowstyle="-|>",
            mutation_scale=8 + 2 * lw,
            lw=lw,
            color=color,
            alpha=op,
            shrinkA=14,
            shrinkB=14,
            zorder=1,
        )
        ax.add_patch(arrow)
        if show_labels:
            mx, my = _curve_mid(pos[j], pos[i], rad)
            ax.text(
                mx,
                my,
                f"{w:.2f}",
                ha="center",
                va="center",
                fontsize=7,
                zorder=4,
                bbox={"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.7},
            )
    for v, (x, y) in pos.items():
        ax.add_patch(Circle((x, y), node_r, fc="white", ec="black", lw=1.2, zorder=2))
        label = g.nodes[v]["label"]
        ax.text(x, y, label, ha="center", va="center", fontsize=_label_size(label), zorder=3)
    pad = 0.6
    ax.set_xlim(min(xs) - pad, max(xs) + pad)
    ax.set_ylim(
        min(ys) - pad - (0.5 if used == "layered" else 0),
        max(ys) + pad + (0.3 * (max(xs) - min(xs)) if used == "layered" else 0),
    )
    ax.set_aspect("equal")
    ax.axis("off")
    which = _which(alpha, head)
    ax.set_title(title if title is not None else f"attention{which}: arrow j → i, width ∝ α")
    handles = [
        Line2D([], [], color=color, lw=max_width * 0.5, alpha=0.5, label="α = 0.5"),
        Line2D([], [], color=color, lw=max_width * 0.1, alpha=0.1, label="α = 0.1"),
    ]
    # The filter note is the legend's title, wrapped, so that it fits under
    # the narrow axes of a per-head grid instead of running into the next one.
    legend = ax.legend(
        handles=handles,
        title=_wrap_note(note),
        title_fontsize=7,
        loc="upper center",
        bbox_to_anchor=(0.5, 0.0),
        ncol=2,
        fontsize=7,
        frameon=False,
    )
    legend.get_title().set_multialignment("center")
    ax.graph = g
    ax.layout_name = used
    return ax


def draw_attention_heads(
    edge_index: Tensor,
    alpha: Tensor,
    *,
    tokens: list[str] | None = None,
    num_nodes: int | None = None,
    ncols: int | None = None,
    **kwargs: Any,
) -> Any:
    """One :func:`draw_attention` per head, in a grid.

    Args:
        edge_index (Tensor): ``[2, E]``.
        alpha (Tensor): ``[E, H]``.
        tokens (list of str, optional): node labels. (default: :obj:`None`)
        num_nodes (int, optional): :math:`N`. (default: :obj:`None`)
        ncols (int, optional): grid columns. (default: :obj:`None`, up to 4)
        **kwargs: passed to :func:`draw_attention` (``min_weight``, ``top_k``, ...).

    Returns:
        matplotlib.figure.Figure: with one axes per head.

    Example:
        >>> import matplotlib; matplotlib.use("Agg")
        >>> len(draw_attention_heads(complete_graph(3), torch.full((9, 2), 1 / 3)).axes)
        2
    """
    plt = _pyplot()
    edge_index, alpha, n = _check(edge_index, alpha, num_nodes, tokens)
    h = alpha.shape[1]
    ncols = min(h, 4) if ncols is None else ncols
    check_int(ncols, "ncols", min=1)
    nrows = math.ceil(h / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.5 * ncols, 4.5 * nrows), squeeze=False)
    for k in range(nrows * ncols):
        ax = axes[k // ncols][k % ncols]
        if k >= h:
            ax.remove()
            continue
        draw_attention(
            edge_index,
            alpha,
            tokens=tokens,
            head=k,
            num_nodes=n,
            ax=ax,
            title=f"head {k}",
            **kwargs,
        )
    fig.tight_layout()
    return fig


def draw_heatmap(
    edge_index: Tensor,
    alpha: Tensor,
    *,
    tokens: list[str] | None = None,
    head: int | None = None,
    num_nodes: int | None = None,
    annotate: bool | None = None,
    cmap: str = "Blues",
    ax: Any = None,
    title: str | None = None,
) -> Any:
    r"""The same weights as a matrix: row :math:`i` (target, query), column :math:`j` (source, key).

    Cells without an edge are grey, so a missing edge is not mistaken
    for a weight of 0. The colour scale is fixed to [0, 1].

    Args:
        edge_index (Tensor): ``[2, E]``.
        alpha (Tensor): ``[E, H]`` or ``[E]``.
        tokens (list of str, optional): row and column labels. (default: :obj:`None`)
        head (int, optional): which head. (default: :obj:`None`, the mean over heads)
        num_nodes (int, optional): :math:`N`. (default: :obj:`None`)
        annotate (bool, optional): print every weight. (default: :obj:`None`, when N <= 12)
        cmap (str, optional): matplotlib colour map. (default: ``"Blues"``)
        ax (matplotlib.axes.Axes, optional): where to draw. (default: :obj:`None`)
        title (str, optional): axes title. (default: :obj:`None`)

    Returns:
        matplotlib.axes.Axes

    Example:
        >>> import matplotlib; matplotlib.use("Agg")
        >>> ax = draw_heatmap(complete_graph(2), torch.full((4,), 0.5))
        >>> ax.get_xlabel()
        'source j (key)'
    """
    plt = _pyplot()
    edge_index, alpha, n = _check(edge_index, alpha, num_nodes, tokens)
    w = _head_weights(alpha, head).unsqueeze(-1)
    mat = attention_matrix(edge_index, w, n)[0].float()
    exists = attention_matrix(edge_index, torch.ones_like(w), n)[0] > 0
    if ax is None:
        side = max(3.5, 0.5 * n + 2)
        _, ax = plt.subplots(figsize=(side + 1, side))
    shown = mat.masked_fill(~exists, float("nan")).numpy()
    ax.set_facecolor("#dddddd")
    im = ax.imshow(shown, cmap=cmap, vmin=0.0, vmax=1.0)
    labels = _labels(n, tokens)
    ax.set_xticks(range(n), labels, rotation=45 if n > 4 else 0, ha="right" if n > 4 else "center")
    ax.set_yticks(range(n), labels)
    ax.set_xlabel("source j (key)")
    ax.set_ylabel("target i (query)")
    if annotate if annotate is not None else n <= 12:
        for i in range(n):
            for j in range(n):
                if exists[i, j]:
                    v = float(mat[i, j])
                    ax.text(
                        j,
                        i,
                        f"{v:.2f}",
                        ha="center",
                        va="center",
                        fontsize=8,
                        color="white" if v > 0.6 else "black",
                    )
    which = _which(alpha, head)
    ax.set_title(title if title is not None else f"attention matrix{which}: rows sum to 1")
    ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="α")
    return ax


def draw_side_by_side(
    edge_index: Tensor,
    alpha: Tensor,
    *,
    tokens: list[str] | None = None,
    head: int | None = None,
    num_nodes: int | None = None,
    **kwargs: Any,
) -> Any:
    """The graph and the matrix of one computation next to each other, same numbers.

    Args:
        edge_index (Tensor): ``[2, E]``.
        alpha (Tensor): ``[E, H]`` or ``[E]``.
        tokens (list of str, optional): labels. (default: :obj:`None`)
        head (int, optional): which head. (default: :obj:`None`, the mean)
        num_nodes (int, optional): :math:`N`. (default: :obj:`None`)
        **kwargs: passed to :func:`draw_attention`.

    Returns:
        matplotlib.figure.Figure: graph on the left, matrix on the right.

    Example:
        >>> import matplotlib; matplotlib.use("Agg")
        >>> len(draw_side_by_side(complete_graph(2), torch.full((4,), 0.5)).axes)  # + colorbar
        3
    """
    plt = _pyplot()
    edge_index, alpha, n = _check(edge_index, alpha, num_nodes, tokens)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 5.5))
    draw_attention(edge_index, alpha, tokens=tokens, head=head, num_nodes=n, ax=a1, **kwargs)
    draw_heatmap(edge_index, alpha, tokens=tokens, head=head, num_nodes=n, ax=a2)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------- step by step


@dataclass
class SoftmaxSteps:
    r"""The softmax of one target, step by step (see :func:`softmax_steps`).

    Attributes:
        target (int): the target :math:`i`.
        sources (list of int): its sources :math:`j`, in edge order.
        labels (list of str): their labels.
        scores (list of float): :math:`s_{ij} = \text{scale}\, q_i \cdot k_j`.
        max (float): :math:`m_i = \max_j s_{ij}`.
        shifted (list of float): :math:`e^{s_{ij} - m_i}`, each in (0, 1].
        total (float): :math:`\sum_j e^{s_{ij} - m_i}`.
        weights (list of float): :math:`\alpha_{ij}`, summing to 1.
    """

    target: int
    sources: list[int]
    labels: list[str]
    scores: list[float]
    max: float
    shifted: list[float]
    total: float
    weights: list[float]

    def table(self) -> str:
        """A plain-text table, one row per incoming edge."""
        rows = [
            f"softmax for target {self.target}: subtract the max, exponentiate, divide by the sum"
        ]
        rows.append(
            f"{'source j':<14} {'s = q.k':>10} {'s - max':>10} {'exp(s-max)':>11} {'alpha':>8}"
        )
        for lab, s, e, w in zip(self.labels, self.scores, self.shifted, self.weights, strict=True):
            rows.append(f"{lab:<14} {s:>10.4f} {s - self.max:>10.4f} {e:>11.5f} {w:>8.5f}")
        rows.append(f"{'max':<14} {self.max:>10.4f}")
        rows.append(f"{'sum':<14} {'':>10} {'':>10} {self.total:>11.5f} {sum(self.weights):>8.5f}")
        return "\n".join(rows)

    def __str__(self) -> str:
        return self.table()


def softmax_steps(
    query: Tensor,
    key: Tensor,
    target: int,
    *,
    edge_index: Tensor | None = None,
    scale: float = 1.0,
    tokens: list[str] | None = None,
) -> SoftmaxSteps:
    r"""The stable softmax of one target's incoming edges, every intermediate kept.

    .. math::
        s_{ij} = \text{scale}\; q_i \cdot k_j,\quad m_i = \max_j s_{ij},\quad
        \alpha_{ij} = \frac{e^{s_{ij} - m_i}}{\sum_k e^{s_{ik} - m_i}}

    Subtracting :math:`m_i` changes nothing mathematically (the factor
    :math:`e^{-m_i}` cancels) but keeps every exponential in (0, 1].

    Args:
        query (Tensor): ``[N, C]`` queries (for simplified attention, ``x``).
        key (Tensor): ``[M, C]`` keys (for simplified attention, ``x`` again).
        target (int): the target :math:`i`.
        edge_index (Tensor, optional): ``[2, E]``; the sources of ``target``.
            (default: :obj:`None`, every key)
        scale (float, optional): multiplies the dot products, e.g.
            :math:`1/\sqrt{C}`. (default: ``1.0``)
        tokens (list of str, optional): labels of the keys. (default: :obj:`None`)

    Example:
        >>> x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
        >>> st = softmax_steps(x, x, 2)
        >>> st.scores, st.max, [round(w, 4) for w in st.weights]
        ([1.0, 1.0, 2.0], 2.0, [0.2119, 0.2119, 0.5761])
    """
    for name, t in (("query", query), ("key", key)):
        if not isinstance(t, Tensor) or t.dim() != 2:
            raise ValueError(
                f"Expected '{name}' of shape [N, C], got {list(getattr(t, 'shape', []))}"
            )
    if query.shape[1] != key.shape[1]:
        raise ValueError(
            f"Expected 'query' and 'key' of one width, got {query.shape[1]} and {key.shape[1]}"
        )
    n, m = query.shape[0], key.shape[0]
    check_int(target, "target")
    if target >= n:
        raise ValueError(f"Expected 'target' an int in [0, {n}), got {target!r}")
    if tokens is not None and len(tokens) != m:
        raise ValueError(f"Expected 'tokens' to hold one label per key ({m}), got {len(tokens)}")
    if edge_index is None:
        src = torch.arange(m)
    else:
        check_edge_index(edge_index, m, n)
        src = edge_index[0][edge_index[1] == target].long().cpu()
    q = query.detach().double()[target]
    s = (key.detach().double()[src] @ q) * scale  # (deg,)
    if src.numel() == 0:
        mx, shifted, total, weights = float("-inf"), s, 0.0, s
    else:
        mx_t = s.max()
        shifted = torch.exp(s - mx_t)
        total_t = shifted.sum()
        weights = shifted / total_t
        mx, total = float(mx_t), float(total_t)
    labels = _labels(m, tokens)
    return SoftmaxSteps(
        target=target,
        sources=src.tolist(),
        labels=[labels[j] for j in src.tolist()],
        scores=s.tolist(),
        max=mx,
        shifted=shifted.tolist(),
        total=total,
        weights=weights.tolist(),
    )
