"""Drawing: the attention weights as a graph of arrows and as a matrix, with matplotlib.

Values are drawn exactly as given: nothing is min-max normalized and nothing is
dropped unless a filter (``min_weight`` / ``top_k``, or ``max_edges`` when a
drawing would hold more than 500 arrows) asks for it, and then the drawing's
legend says what was hidden. Edge width is ``max_width * alpha`` and opacity
``alpha``, so two drawings compare.

Tokens and titles are drawn as plain text: ``"$x$"`` is those three
characters, never matplotlib math. Graphs too large to read are refused at
once with a ``ValueError`` that says how to look at them instead (more than
100 nodes for a graph drawing, 200 for a matrix; see
:mod:`gnnattn.viz.limits`): every function takes ``around=node, hops=2`` to
draw one node's neighbourhood, labelled with the original node ids.

matplotlib is the ``viz`` extra (``pip install 'gnnattn[viz]'``); it is
imported only when a drawing function is called.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ..checks import check_float, check_int
from . import marks
from .convert import (
    Edge,
    attention_graph,
    attention_matrix,
    check_attention,
    check_weights,
    filter_edges,
    head_weights,
    labels_of,
)
from .layout import layout as node_layout
from .limits import MAX_DRAWN_EDGES, MAX_DRAWN_NODES, MAX_MATRIX_NODES, check_readable
from .neighbourhood import neighbourhood
from .text import PLAIN, check_str, clean, shorten

__all__ = ["draw_attention", "draw_attention_heads", "draw_heatmap", "draw_side_by_side"]

Point = tuple[float, float]

# The longest row or column label of a matrix, in characters; a longer one is cut with "…".
MAX_TICK_CHARS = 24


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


def _check_look(ax: Any, title: Any, **flags: Any) -> None:
    """Type checks of the arguments that only change how a drawing looks."""
    from matplotlib.axes import Axes

    if ax is not None and not isinstance(ax, Axes):
        raise TypeError(f"Expected 'ax' to be a matplotlib Axes or None, got {type(ax).__name__}")
    check_str(title, "title", optional=True)
    for name, value in flags.items():
        if value is not None and not isinstance(value, bool):
            raise TypeError(f"Expected '{name}' to be a bool or None, got {type(value).__name__}")


def _check_drawing(ax: Any, title: Any, edge_labels: Any, max_width: Any, color: Any) -> float:
    """The checks of :func:`draw_attention`'s looks; returns ``max_width`` as a float."""
    from matplotlib.colors import is_color_like

    _check_look(ax, title, edge_labels=edge_labels)
    if not is_color_like(color):
        raise ValueError(f"Expected 'color' to be a matplotlib colour, got {color!r}")
    return check_float(max_width, "max_width", lo=0.0)


def _select(
    edge_index: Tensor,
    alpha: Tensor,
    tokens: Any,
    num_nodes: int | None,
    around: int | None,
    hops: int,
) -> tuple[Tensor, Tensor, list[str]]:
    """The edges, weights and labels to draw: the whole graph, or the neighbourhood ``around``.

    In a neighbourhood the labels are the tokens or the original node ids.
    """
    check_int(hops, "hops", min=1)  # even without 'around', where it is unused
    edge_index, alpha, n = check_attention(edge_index, alpha, num_nodes, tokens)
    check_weights(alpha)
    labels = labels_of(n, tokens)
    if around is None:
        return edge_index, alpha, labels
    nb = neighbourhood(edge_index, around, hops, n)
    edge_index, alpha = nb.edges(edge_index, alpha)
    return edge_index, alpha, nb.rows(labels)


def _draw_graph(ax: Any, g: Any, pos: dict[int, Point], shown: list[Edge], st: Any) -> None:
    """Arrows, loops and nodes, with arrows and labels sized to the axes as laid out."""
    st.node_pt = st.node_r * marks.points_per_unit(ax)
    for j, i, w in shown:
        if i == j:
            marks.draw_loop(ax, pos[i], w, st)
        else:
            marks.draw_arrow(ax, pos[j], pos[i], w, st)
    marks.draw_nodes(ax, pos, {v: g.nodes[v]["label"] for v in pos}, st)


def draw_attention(
    edge_index: Tensor,
    alpha: Tensor,
    *,
    tokens: Sequence[str] | None = None,
    head: int | None = None,
    num_nodes: int | None = None,
    around: int | None = None,
    hops: int = 2,
    min_weight: float = 0.0,
    top_k: int | None = None,
    max_edges: int = MAX_DRAWN_EDGES,
    layout: str = "auto",
    edge_labels: bool | None = None,
    max_width: float = 8.0,
    color: Any = "tab:blue",
    ax: Any = None,
    title: str | None = None,
) -> Any:
    r"""Draw the weights as a graph: arrows :math:`j \to i`, width and opacity ∝ weight.

    A loop is :math:`\alpha_{ii}`; width ``max_width * weight``, opacity the
    weight (at least 0.08), never rescaled. Layout: circular (complete graph),
    layered (DAG), else spring. Labels are plain text, fitted to their circle.
    More than 100 nodes: a ``ValueError`` at once (draw ``around`` a node);
    more than ``max_edges`` edges: cut to the top k per target that fit, as
    the legend says (see :mod:`gnnattn.viz.limits`).

    Args:
        edge_index (Tensor): ``[2, E]``.
        alpha (Tensor): ``[E, H]`` or ``[E]``.
        tokens (list of str, optional): node labels. (default: :obj:`None`, the ids)
        head (int, optional): which head. (default: :obj:`None`, the mean over heads)
        num_nodes (int, optional): :math:`N`. (default: :obj:`None`)
        around (int, optional): only this node's ``hops``-hop in-neighbourhood,
            labelled by original id or token. (default: :obj:`None`)
        hops (int, optional): the neighbourhood's depth. (default: ``2``)
        min_weight (float, optional): hide lighter edges. (default: ``0.0``)
        top_k (int, optional): keep each target's ``top_k`` heaviest. (default: :obj:`None`)
        max_edges (int, optional): most edges drawn. (default: ``500``)
        layout (str, optional): ``"auto"``, ``"circular"``, ``"layered"`` or
            ``"spring"``. (default: ``"auto"``)
        edge_labels (bool, optional): print each weight on its edge.
            (default: :obj:`None`, when at most 16 edges are shown)
        max_width (float, optional): points of a weight-1 edge. (default: ``8.0``)
        color (optional): edge colour, any matplotlib colour. (default: ``"tab:blue"``)
        ax (matplotlib.axes.Axes, optional): where to draw. (default: :obj:`None`)
        title (str, optional): axes title. (default: :obj:`None`, one naming the head)

    Returns:
        matplotlib.axes.Axes: ``ax.graph`` is the :class:`networkx.DiGraph`
        drawn, ``ax.layout_name`` the layout used.

    Example:
        >>> import matplotlib; matplotlib.use("Agg")
        >>> ax = draw_attention(causal_graph(3), torch.rand(6), tokens=["a", "$x$", "c"])
        >>> ax.layout_name, ax.texts[-2].get_text()
        ('layered', '$x$')
    """
    plt = _pyplot()
    max_width = _check_drawing(ax, title, edge_labels, max_width, color)
    edge_index, alpha, labels = _select(edge_index, alpha, tokens, num_nodes, around, hops)
    check_readable(len(labels), MAX_DRAWN_NODES, "draw_attention")
    g = attention_graph(edge_index, alpha, tokens=labels, head=head)
    edges: list[Edge] = [(j, i, float(d["weight"])) for j, i, d in g.edges(data=True)]
    shown, note = filter_edges(edges, min_weight, top_k, max_edges)
    pos, used = node_layout(g, layout)
    labelled = len(shown) <= 16 if edge_labels is None else edge_labels
    st = marks.style_for(used, pos, max_width, color, labelled)
    box = marks.limits(pos, shown, st)
    if ax is None:
        _, ax = plt.subplots(figsize=marks.figure_size(box, st))
    marks.frame(ax, box)
    _draw_graph(ax, g, pos, shown, st)
    where = "" if around is None else f" around node {around} ({hops} in-hop{'s' * (hops > 1)})"
    default = f"attention{where}{_which(alpha, head)}: arrow j → i, width ∝ α"
    ax.set_title(clean(title) if title is not None else default, **PLAIN)
    marks.legend(ax, note, st)
    ax.graph, ax.layout_name = g, used
    return ax


def draw_attention_heads(
    edge_index: Tensor,
    alpha: Tensor,
    *,
    tokens: Sequence[str] | None = None,
    num_nodes: int | None = None,
    around: int | None = None,
    hops: int = 2,
    ncols: int | None = None,
    **kwargs: Any,
) -> Any:
    """One :func:`draw_attention` per head, in a grid.

    Args:
        edge_index (Tensor): ``[2, E]``.
        alpha (Tensor): ``[E, H]``.
        tokens (list of str, optional): node labels. (default: :obj:`None`)
        num_nodes (int, optional): :math:`N`. (default: :obj:`None`)
        around (int, optional): draw only this node's neighbourhood. (default: :obj:`None`)
        hops (int, optional): the neighbourhood's depth. (default: ``2``)
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
    edge_index, alpha, labels = _select(edge_index, alpha, tokens, num_nodes, around, hops)
    check_readable(len(labels), MAX_DRAWN_NODES, "draw_attention_heads")
    h = alpha.shape[1]
    ncols = min(h, 4) if ncols is None else ncols
    check_int(ncols, "ncols", min=1)
    nrows = math.ceil(h / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.5 * ncols, 4.5 * nrows), squeeze=False)
    title = kwargs.pop("title", None)
    for k in range(nrows * ncols):
        ax = axes[k // ncols][k % ncols]
        if k >= h:
            ax.remove()
            continue
        draw_attention(
            edge_index, alpha, tokens=labels, head=k, ax=ax, title=title or f"head {k}", **kwargs
        )
    fig.tight_layout()
    return fig


def draw_heatmap(
    edge_index: Tensor,
    alpha: Tensor,
    *,
    tokens: Sequence[str] | None = None,
    head: int | None = None,
    num_nodes: int | None = None,
    around: int | None = None,
    hops: int = 2,
    annotate: bool | None = None,
    cmap: Any = "Blues",
    ax: Any = None,
    title: str | None = None,
) -> Any:
    r"""The same weights as a matrix: row :math:`i` (target, query), column :math:`j` (source, key).

    Cells without an edge are grey, so a missing edge is not mistaken for a
    weight of 0. The colour scale is fixed to [0, 1]. Rows and columns are
    labelled (plain text) up to 64 nodes, a label longer than 24 characters
    cut to its first 24 and an ellipsis; more than 200 nodes are refused at
    once with a ``ValueError`` (draw ``around`` a node instead).

    Args:
        edge_index (Tensor): ``[2, E]``.
        alpha (Tensor): ``[E, H]`` or ``[E]``.
        tokens (list of str, optional): row and column labels. (default: :obj:`None`)
        head (int, optional): which head. (default: :obj:`None`, the mean over heads)
        num_nodes (int, optional): :math:`N`. (default: :obj:`None`)
        around (int, optional): only this node's neighbourhood. (default: :obj:`None`)
        hops (int, optional): the neighbourhood's depth. (default: ``2``)
        annotate (bool, optional): print every weight. (default: :obj:`None`, when N <= 12)
        cmap (str or Colormap, optional): the colour map. (default: ``"Blues"``)
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
    _check_look(ax, title, annotate=annotate)
    edge_index, alpha, labels = _select(edge_index, alpha, tokens, num_nodes, around, hops)
    n = len(labels)
    check_readable(n, MAX_MATRIX_NODES, "draw_heatmap")
    w = head_weights(alpha, head).unsqueeze(-1)
    mat = attention_matrix(edge_index, w, n)[0].float()
    exists = attention_matrix(edge_index, torch.ones_like(w), n)[0] > 0
    if ax is None:
        side = min(12.0, max(3.5, 0.5 * n + 2))
        _, ax = plt.subplots(figsize=(side + 1, side))
    ax.set_facecolor("#dddddd")
    im = ax.imshow(mat.masked_fill(~exists, float("nan")).numpy(), cmap=cmap, vmin=0.0, vmax=1.0)
    _matrix_labels(ax, labels)
    if annotate if annotate is not None else n <= 12:
        for i, j in exists.nonzero().tolist():
            v = float(mat[i, j])
            colour = "white" if v > 0.6 else "black"
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=8, color=colour)
    which = _which(alpha, head)
    ax.set_title(
        clean(title) if title is not None else f"attention matrix{which}: rows sum to 1", **PLAIN
    )
    ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="α")
    return ax


def _matrix_labels(ax: Any, labels: list[str]) -> None:
    """Row and column labels (plain text) while they can be read, up to 64; else none."""
    n = len(labels)
    ax.set_xlabel("source j (key)")
    ax.set_ylabel("target i (query)")
    if n > 64:
        ax.set_xticks([])
        ax.set_yticks([])
        return
    size = 10.0 if n <= 24 else 7.0
    slant = {"rotation": 45, "ha": "right"} if n > 4 else {}
    # A tick label is not fitted to a box: a 20k-character token made a 210k-px-wide image.
    labels = [shorten(t, MAX_TICK_CHARS) for t in labels]
    ax.set_xticks(range(n), labels, fontsize=size, **slant, **PLAIN)
    ax.set_yticks(range(n), labels, fontsize=size, **PLAIN)


def draw_side_by_side(
    edge_index: Tensor,
    alpha: Tensor,
    *,
    tokens: Sequence[str] | None = None,
    head: int | None = None,
    num_nodes: int | None = None,
    around: int | None = None,
    hops: int = 2,
    **kwargs: Any,
) -> Any:
    """The graph and the matrix of one computation next to each other, same numbers.

    Args:
        edge_index (Tensor): ``[2, E]``.
        alpha (Tensor): ``[E, H]`` or ``[E]``.
        tokens (list of str, optional): labels. (default: :obj:`None`)
        head (int, optional): which head. (default: :obj:`None`, the mean)
        num_nodes (int, optional): :math:`N`. (default: :obj:`None`)
        around (int, optional): only this node's neighbourhood. (default: :obj:`None`)
        hops (int, optional): the neighbourhood's depth. (default: ``2``)
        **kwargs: passed to :func:`draw_attention`.

    Returns:
        matplotlib.figure.Figure: graph on the left, matrix on the right.

    Example:
        >>> import matplotlib; matplotlib.use("Agg")
        >>> len(draw_side_by_side(complete_graph(2), torch.full((4,), 0.5)).axes)  # + colorbar
        3
    """
    plt = _pyplot()
    edge_index, alpha, labels = _select(edge_index, alpha, tokens, num_nodes, around, hops)
    check_readable(len(labels), MAX_DRAWN_NODES, "draw_side_by_side")
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 5.5))
    draw_attention(edge_index, alpha, tokens=labels, head=head, ax=a1, **kwargs)
    draw_heatmap(edge_index, alpha, tokens=labels, head=head, ax=a2)
    fig.tight_layout()
    return fig
