"""Drawing: the attention weights as a graph of arrows and as a matrix, with matplotlib.

Values are drawn exactly as given: nothing is min-max normalized and nothing is
dropped unless a filter (``min_weight`` / ``top_k``) asks for it, and then the
drawing's legend says what was hidden. Edge width is ``max_width * alpha`` and
opacity ``alpha``, so two drawings compare.

matplotlib is the ``viz`` extra (``pip install 'gnnattn[viz]'``); it is
imported only when a drawing function is called.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..checks import check_int
from .convert import (
    Edge,
    attention_graph,
    attention_matrix,
    check_attention,
    filter_edges,
    head_weights,
    labels_of,
)
from .layout import layout as node_layout

__all__ = ["draw_attention", "draw_attention_heads", "draw_heatmap", "draw_side_by_side"]

Point = tuple[float, float]


def _pyplot() -> Any:
    try:
        import matplotlib.pyplot as plt
    except ImportError as err:  # pragma: no cover - exercised only without matplotlib
        raise ImportError("gnnattn's drawings need matplotlib: pip install 'gnnattn[viz]'") from err
    return plt


def _which(alpha: Tensor, head: int | None) -> str:
    """The head part of a title: empty for one head, else which head or the mean."""
    if alpha.dim() == 1 or alpha.shape[1] == 1:
        return ""
    return " (mean over heads)" if head is None else f" (head {head})"


def _label_size(label: str) -> float:
    # Node circles have a fixed size: long tokens get a smaller font to fit.
    return 9.0 if len(label) <= 3 else max(6.0, 30.0 / len(label))


def _wrap_note(note: str, width: int = 48) -> str:
    """The filter note on short lines, broken between its items, never inside one."""
    lines = []
    for line in note.split("; "):
        lines.append(line if len(line) <= width else line.replace(", ", ",\n"))
    return "\n".join(lines)


def _curve_mid(p0: Point, p1: Point, rad: float) -> Point:
    # The midpoint of matplotlib's arc3 quadratic Bezier, for the edge label.
    mx, my = (p0[0] + p1[0]) / 2, (p0[1] + p1[1]) / 2
    dx, dy = p1[0] - p0[0], p1[1] - p0[1]
    cx, cy = mx + rad * dy, my - rad * dx
    return 0.25 * p0[0] + 0.5 * cx + 0.25 * p1[0], 0.25 * p0[1] + 0.5 * cy + 0.25 * p1[1]


@dataclass
class _Style:
    """How one graph drawing looks: what :func:`draw_attention` decides once."""

    layout: str
    node_r: float
    rad: float  # arc bend: j -> i and i -> j part ways, long layered edges bow
    max_width: float
    color: str
    labels: bool
    centre: Point

    def width(self, w: float) -> float:
        return max(self.max_width * w, 0.3)

    def opacity(self, w: float) -> float:
        # Floored so that small weights stay visible; never renormalized.
        return min(max(w, 0.08), 1.0)


def _weight_label(ax: Any, xy: Point, w: float, boxed: bool) -> None:
    box = {"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.7}
    ax.text(
        *xy,
        f"{w:.2f}",
        ha="center",
        va="center",
        fontsize=7,
        zorder=4,
        **({"bbox": box} if boxed else {}),
    )


def _draw_loop(ax: Any, at: Point, w: float, st: _Style) -> None:
    """Self-attention alpha_ii: a loop just outside the node, away from the centre."""
    from matplotlib.patches import Circle

    x, y = at
    dx, dy = x - st.centre[0], y - st.centre[1]
    norm = math.hypot(dx, dy)
    dx, dy = (dx / norm, dy / norm) if norm > 1e-9 else (0.0, 1.0)
    if st.layout == "layered":
        dx, dy = 0.0, -1.0  # below the row: the arcs bow above it
    lr = st.node_r * 0.8
    c = (x + dx * (st.node_r + lr * 0.7), y + dy * (st.node_r + lr * 0.7))
    lw, op = st.width(w), st.opacity(w)
    ax.add_patch(Circle(c, lr, fill=False, lw=lw, ec=st.color, alpha=op, zorder=1))
    if st.labels:
        _weight_label(ax, (c[0] + dx * lr * 2.0, c[1] + dy * lr * 2.0), w, boxed=False)


def _draw_arrow(ax: Any, p0: Point, p1: Point, w: float, st: _Style) -> None:
    """Edge j -> i: an arc from the source to the target, width and opacity from alpha."""
    from matplotlib.patches import FancyArrowPatch

    lw = st.width(w)
    arrow = FancyArrowPatch(
        p0,
        p1,
        connectionstyle=f"arc3,rad={st.rad}",
        arrowstyle="-|>",
        mutation_scale=8 + 2 * lw,
        lw=lw,
        color=st.color,
        alpha=st.opacity(w),
        shrinkA=14,
        shrinkB=14,
        zorder=1,
    )
    ax.add_patch(arrow)
    if st.labels:
        _weight_label(ax, _curve_mid(p0, p1, st.rad), w, boxed=True)


def _draw_nodes(ax: Any, pos: dict[int, Point], labels: dict[int, str], node_r: float) -> None:
    from matplotlib.patches import Circle

    for v, (x, y) in pos.items():
        ax.add_patch(Circle((x, y), node_r, fc="white", ec="black", lw=1.2, zorder=2))
        ax.text(
            x, y, labels[v], ha="center", va="center", fontsize=_label_size(labels[v]), zorder=3
        )


def _frame(ax: Any, pos: dict[int, Point], used: str) -> None:
    """Axis limits around the nodes (room above a layered row for its arcs), no axes."""
    xs = [p[0] for p in pos.values()] or [0.0]
    ys = [p[1] for p in pos.values()] or [0.0]
    pad = 0.6
    ax.set_xlim(min(xs) - pad, max(xs) + pad)
    ax.set_ylim(
        min(ys) - pad - (0.5 if used == "layered" else 0),
        max(ys) + pad + (0.3 * (max(xs) - min(xs)) if used == "layered" else 0),
    )
    ax.set_aspect("equal")
    ax.axis("off")


def _legend(ax: Any, note: str, st: _Style) -> None:
    """The real width scale (two sample weights) and, as its title, what was hidden."""
    from matplotlib.lines import Line2D

    handles = [
        Line2D([], [], color=st.color, lw=st.max_width * 0.5, alpha=0.5, label="α = 0.5"),
        Line2D([], [], color=st.color, lw=st.max_width * 0.1, alpha=0.1, label="α = 0.1"),
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


def _style_for(
    used: str, pos: dict[Any, Any], max_width: float, color: Any, labels: bool
) -> _Style:
    """How edges are drawn in layout ``used``."""
    xs = [p[0] for p in pos.values()] or [0.0]
    ys = [p[1] for p in pos.values()] or [0.0]
    return _Style(
        layout=used,
        node_r=0.12 if used != "layered" else 0.16,
        # Arcs, not straight lines: j -> i and i -> j then part ways, and in
        # the layered layout long edges bow over the tokens between them.
        rad=0.12 if used == "circular" else (-0.45 if used == "layered" else 0.15),
        max_width=max_width,
        color=color,
        labels=labels,
        centre=(sum(xs) / len(xs), sum(ys) / len(ys)),
    )


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

    Shapes:
        - **edge_index:** ``[2, E]``; **alpha:** ``[E, H]`` or ``[E]``

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
    g = attention_graph(edge_index, alpha, tokens=tokens, head=head, num_nodes=num_nodes)
    pos, used = node_layout(g, layout)
    if ax is None:
        n = g.number_of_nodes()
        size = (max(5.0, 0.9 * n + 2), 3.6) if used == "layered" else (5.5, 5.5)
        _, ax = plt.subplots(figsize=size)
    edges: list[Edge] = [(j, i, float(d["weight"])) for j, i, d in g.edges(data=True)]
    shown, note = filter_edges(edges, min_weight, top_k)
    st = _style_for(
        used, pos, max_width, color, len(shown) <= 16 if edge_labels is None else edge_labels
    )
    for j, i, w in shown:
        if i == j:
            _draw_loop(ax, pos[i], w, st)
        else:
            _draw_arrow(ax, pos[j], pos[i], w, st)
    _draw_nodes(ax, pos, {v: g.nodes[v]["label"] for v in pos}, st.node_r)
    _frame(ax, pos, used)
    which = _which(alpha, head)
    ax.set_title(title if title is not None else f"attention{which}: arrow j → i, width ∝ α")
    _legend(ax, note, st)
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
    edge_index, alpha, n = check_attention(edge_index, alpha, num_nodes, tokens)
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
    edge_index, alpha, n = check_attention(edge_index, alpha, num_nodes, tokens)
    w = head_weights(alpha, head).unsqueeze(-1)
    mat = attention_matrix(edge_index, w, n)[0].float()
    exists = attention_matrix(edge_index, torch.ones_like(w), n)[0] > 0
    if ax is None:
        side = max(3.5, 0.5 * n + 2)
        _, ax = plt.subplots(figsize=(side + 1, side))
    shown = mat.masked_fill(~exists, float("nan")).numpy()
    ax.set_facecolor("#dddddd")
    im = ax.imshow(shown, cmap=cmap, vmin=0.0, vmax=1.0)
    labels = labels_of(n, tokens)
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
    edge_index, alpha, n = check_attention(edge_index, alpha, num_nodes, tokens)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 5.5))
    draw_attention(edge_index, alpha, tokens=tokens, head=head, num_nodes=n, ax=a1, **kwargs)
    draw_heatmap(edge_index, alpha, tokens=tokens, head=head, num_nodes=n, ax=a2)
    fig.tight_layout()
    return fig
