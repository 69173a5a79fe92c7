"""The marks of a graph drawing: nodes sized to their labels, arrows, loops, frame and legend.

:func:`gnnattn.viz.draw_attention` decides what to draw; this module decides
how it looks. Node circles are as large as the layout's spacing allows, the
figure is sized so that a circle is about half an inch across, and each label
is measured and set in the largest font (at most 11 pt, at least 5 pt) that
fits inside its circle; a label that does not fit even at 5 pt is shortened
with an ellipsis. Every string is drawn as plain text (:data:`~gnnattn.viz.text.PLAIN`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .text import PLAIN, shorten, starts

__all__: list[str] = []

Point = tuple[float, float]

# Figure scale: a node circle this many inches across, and the largest figure side.
NODE_INCHES = 0.48
MAX_INCHES = 16.0
MAX_INCHES_LAYERED = 30.0  # a layered row is long and low
MAX_FONT, MIN_FONT = 11.0, 5.0


def wrap_note(note: str, width: int = 48) -> str:
    """The filter note on short lines, broken between its items, never inside one."""
    lines = []
    for line in note.split("; "):
        lines.append(line if len(line) <= width else line.replace(", ", ",\n"))
    return "\n".join(lines)


def curve_mid(p0: Point, p1: Point, rad: float) -> Point:
    # The midpoint of matplotlib's arc3 quadratic Bezier, for the edge label.
    mx, my = (p0[0] + p1[0]) / 2, (p0[1] + p1[1]) / 2
    dx, dy = p1[0] - p0[0], p1[1] - p0[1]
    cx, cy = mx + rad * dy, my - rad * dx
    return 0.25 * p0[0] + 0.5 * cx + 0.25 * p1[0], 0.25 * p0[1] + 0.5 * cy + 0.25 * p1[1]


@dataclass
class Style:
    """How one graph drawing looks: what :func:`draw_attention` decides once."""

    layout: str
    node_r: float  # data units
    rad: float  # arc bend: j -> i and i -> j part ways, long layered edges bow
    max_width: float
    color: Any
    labels: bool
    centre: Point
    node_pt: float = 14.0  # node radius in points, once the scale is known

    def width(self, w: float) -> float:
        return max(self.max_width * w, 0.3)

    def opacity(self, w: float) -> float:
        # Floored so that small weights stay visible; never renormalized.
        return min(max(w, 0.08), 1.0)


def _spacing(pos: dict[Any, Point]) -> float:
    """The median distance from a node to its nearest other node (1.0 for one node)."""
    pts = list(pos.values())
    if len(pts) < 2:
        return 1.0
    near = []
    for k, (x, y) in enumerate(pts):
        near.append(min(math.hypot(x - u, y - v) for m, (u, v) in enumerate(pts) if m != k))
    near.sort()
    return max(near[len(near) // 2], 1e-6)


def style_for(
    used: str, pos: dict[Any, Point], max_width: float, color: Any, labels: bool
) -> Style:
    """How edges and nodes are drawn in layout ``used``."""
    xs = [p[0] for p in pos.values()] or [0.0]
    ys = [p[1] for p in pos.values()] or [0.0]
    # As large as the spacing allows (0.42 of it: neighbours never touch),
    # and no larger than a token needs beside the layout's extent.
    cap = 0.32 if used == "layered" else 0.14
    return Style(
        layout=used,
        node_r=min(cap, 0.42 * _spacing(pos)),
        # Arcs, not straight lines: j -> i and i -> j then part ways, and in
        # the layered layout long edges bow over the tokens between them.
        rad=0.12 if used == "circular" else (-0.45 if used == "layered" else 0.15),
        max_width=max_width,
        color=color,
        labels=labels,
        centre=(sum(xs) / len(xs), sum(ys) / len(ys)),
    )


def limits(pos: dict[Any, Point], shown: list[Any], st: Style) -> tuple[float, ...]:
    """``(x0, x1, y0, y1)`` around the nodes, their loops and the apexes of the shown arcs."""
    xs = [p[0] for p in pos.values()] or [0.0]
    ys = [p[1] for p in pos.values()] or [0.0]
    pad = st.node_r * 3.2 + 0.1
    lo, hi = min(ys) - pad, max(ys) + pad
    for j, i, _ in shown:
        if i != j:
            my = curve_mid(pos[j], pos[i], st.rad)[1]
            lo, hi = min(lo, my - 0.1), max(hi, my + 0.1)
    return min(xs) - pad, max(xs) + pad, lo, hi


def frame(ax: Any, box: tuple[float, ...]) -> None:
    """Axis limits ``box`` (from :func:`limits`), equal aspect, no axes."""
    ax.set_xlim(box[0], box[1])
    ax.set_ylim(box[2], box[3])
    ax.set_aspect("equal")
    ax.axis("off")


def figure_size(box: tuple[float, ...], st: Style) -> tuple[float, float]:
    """Inches for a new figure: a node ``NODE_INCHES`` across, within ``MAX_INCHES``."""
    w, h = box[1] - box[0], box[3] - box[2]
    longest = MAX_INCHES_LAYERED if st.layout == "layered" else MAX_INCHES
    scale = min(NODE_INCHES / (2 * st.node_r), longest / w, MAX_INCHES / h)
    # Room for the title above and the legend below.
    return max(4.5, w * scale), max(3.0, h * scale + 1.4)


def points_per_unit(ax: Any) -> float:
    """Points per data unit of ``ax`` (aspect equal), as the figure is now laid out."""
    ax.apply_aspect()
    (x0, _), (x1, _) = ax.transData.transform([(0.0, 0.0), (1.0, 0.0)])
    return float(abs(x1 - x0) * 72.0 / ax.figure.dpi)


def fitted(label: str, diameter: float) -> tuple[str, float]:
    """``label`` and the font size (points) at which it fits in a circle ``diameter`` across.

    A label too wide even at the smallest size keeps the most characters that
    fit and an ellipsis, cut between characters (:func:`~gnnattn.viz.text.starts`).
    """
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextToPath

    measure = TextToPath()

    def width(s: str, size: float) -> float:
        return float(measure.get_text_width_height_descent(s, FontProperties(size=size), False)[0])

    # A circle holds a dozen characters: measuring 100k of them would take seconds.
    label = shorten(label)
    room = 0.86 * diameter
    size = min(MAX_FONT, 0.55 * diameter)
    if not label:
        return label, max(size, MIN_FONT)
    # Glyph widths do not scale exactly with the size (hinting): shrink until it fits.
    w = width(label, size)
    while w > room and size > MIN_FONT:
        size = max(MIN_FONT, size * 0.97 * room / w)
        w = width(label, size)
    if w > room:
        label = _cut_to_fit(label, lambda t: width(t, size) <= room)
    return label, max(size, MIN_FONT)


def _cut_to_fit(label: str, fits: Callable[[str], bool]) -> str:
    """The longest prefix of whole characters and an ellipsis that ``fits``; else the first one.

    A longer prefix is never narrower, so a bisection over the character
    boundaries measures log2 of the length, not the length.
    """
    b = starts(label)
    best = label[: b[1]]
    lo, hi = 1, len(b) - 2  # characters kept: never all of them
    while lo <= hi:
        mid = (lo + hi) // 2
        text = label[: b[mid]] + "\u2026"
        if fits(text):
            best, lo = text, mid + 1
        else:
            hi = mid - 1
    return best


def weight_label(ax: Any, xy: Point, w: float, boxed: bool) -> None:
    box = {"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.7}
    ax.text(
        *xy,
        f"{w:.2f}",
        ha="center",
        va="center",
        fontsize=7,
        zorder=4,
        **PLAIN,
        **({"bbox": box} if boxed else {}),
    )


def draw_loop(ax: Any, at: Point, w: float, st: Style) -> None:
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
    ax.add_artist(Circle(c, lr, fill=False, lw=lw, ec=st.color, alpha=op, zorder=1))
    if st.labels:
        weight_label(ax, (c[0] + dx * lr * 2.0, c[1] + dy * lr * 2.0), w, boxed=False)


def draw_arrow(ax: Any, p0: Point, p1: Point, w: float, st: Style) -> None:
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
        # From circle to circle: the arrowhead touches the target's rim.
        shrinkA=st.node_pt + 1,
        shrinkB=st.node_pt + 1,
        zorder=1,
    )
    # add_artist, not add_patch: the limits are set by frame(), and
    # add_patch's data-limit update took half of a large drawing's time.
    ax.add_artist(arrow)
    if st.labels:
        weight_label(ax, curve_mid(p0, p1, st.rad), w, boxed=True)


def draw_nodes(ax: Any, pos: dict[int, Point], labels: dict[int, str], st: Style) -> None:
    """White circles with their labels, each label in the largest font that fits."""
    from matplotlib.patches import Circle

    for v, (x, y) in pos.items():
        ax.add_artist(Circle((x, y), st.node_r, fc="white", ec="black", lw=1.2, zorder=2))
        text, size = fitted(labels[v], 2 * st.node_pt)
        ax.text(x, y, text, ha="center", va="center", fontsize=size, zorder=3, **PLAIN)


def legend(ax: Any, note: str, st: Style) -> None:
    """The real width scale (two sample weights) and, as its title, what was hidden."""
    from matplotlib.lines import Line2D

    handles = [
        Line2D([], [], color=st.color, lw=st.max_width * 0.5, alpha=0.5, label="α = 0.5"),
        Line2D([], [], color=st.color, lw=st.max_width * 0.1, alpha=0.1, label="α = 0.1"),
    ]
    # The filter note is the legend's title, wrapped, so that it fits under
    # the narrow axes of a per-head grid instead of running into the next one.
    box = ax.legend(
        handles=handles,
        title=wrap_note(note),
        title_fontsize=7,
        loc="upper center",
        bbox_to_anchor=(0.5, 0.0),
        ncol=2,
        fontsize=7,
        frameon=False,
    )
    box.get_title().set_multialignment("center")
