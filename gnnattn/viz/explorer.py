r"""The attention explorer: one self-contained HTML page with the graph and the matrix, linked.

:func:`explore` takes what the layers return with
``return_attention_weights=True`` (one ``(edge_index, alpha)``, or a list with
one per layer, as :class:`gnnattn.nn.GraphTransformer` returns it) and gives an
:class:`AttentionExplorer`: ``save(path)`` writes the page, and Jupyter shows it
inline. The page works offline, from disk: every script is inlined and nothing
is fetched.

On the page: the graph (edges :math:`j \to i`, width and opacity proportional
to :math:`\alpha_{ij}`, never rescaled; the legend gives the scale) beside the
``N x N`` matrix (row = target, colour scale fixed to [0, 1]); hovering an edge
or a cell shows the exact weight (4 significant digits), the score, the
target's max and sum (of its whole row, also where a neighbourhood or
``max_edges`` cut it), and marks the same edge in the other view; duplicate
edges add up in their cell, as in :func:`~gnnattn.viz.attention_matrix`;
clicking a token keeps only its incoming edges and shows its softmax step by
step (subtract the max, exponentiate, divide by the sum); selectors pick the layer
and the head (or the mean over heads, labelled as such); sliders keep the top
k edges per target and hide weights below a minimum. Without ``scores`` the
page still knows :math:`s_{ij} - m_i` exactly: :math:`\ln \alpha_{ij} - \ln
\max_j \alpha_{ij}`, and the sum :math:`\sum_j e^{s_{ij} - m_i} = 1 / \max_j
\alpha_{ij}`.

Layouts come from networkx (:mod:`gnnattn.viz.layout`): circular for a
complete graph, layered left to right for a DAG such as causal attention,
spring otherwise (on each target's 8 heaviest edges, weighted by the weight:
the strong edges shape the picture, and it stays fast); positions given by the
caller win.

**Why d3 on a canvas.** The drawing library is d3 (v7.9.2, ISC licence,
vendored from the npm package as ``assets/d3.min.js`` with its licence in
``assets/d3.LICENSE``; the licence is also repeated in every page): 281 KB,
no dependencies, inlined so the page opens offline. The edges are stroked on
a ``<canvas>`` in 256 weight levels (one path per level); d3 does zoom and
pan, the node quadtree for hit-testing, the colour scale and the DOM. The
alternatives considered (cytoscape.js, plotly, sigma.js) and the page's measured
load and repaint times are in ``docs/explorer.md``.

**Scale.** Arrays are written compactly (base64 of little-endian uint16 or
int32 source ids, int32 CSR row pointers, float32 weights per head), so the
file grows linearly: 2.7 bytes per edge (uint16 ids) plus 5.3 per edge and
head (10.7 with ``scores``), plus 0.32 MB of fixed code. A layer with more
than ``max_edges`` edges is cut in Python to the top k edges per target (the
largest k that fits), and the page says so. Hovering tests only the drawn
edges, in one pass. Labels longer than
:data:`~gnnattn.viz.text.MAX_LABEL_CHARS` are cut before writing (the page
says so); the JSON block holds no ``<`` at all, so no label can close its
``<script>``.

**Structure.** ``structure=edge_index`` (a molecule's bonds under attention
over the complete graph) is written as unordered pairs and drawn first, as
thin grey straight lines under the attention arcs.
"""

from __future__ import annotations

import base64
import html
import importlib.resources
import json
import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import networkx as nx
import numpy as np
import torch
from torch import Tensor

from ..graphs import check_edge_index
from .convert import labels_of, top_k_per_target
from .groups import Groups, node_groups
from .inputs import (
    as_layers,
    as_scores,
    check_options,
    checked_layers,
    count_nodes,
    positions_given,
)
from .layout import choose_layout, circular, layered, spring
from .limits import MAX_MATRIX_NODES
from .neighbourhood import neighbourhood
from .text import MAX_LABEL_CHARS, clean, shorten

__all__ = ["AttentionExplorer", "explore"]

D3_VERSION = "7.9.2"
# Edge width in px of a weight-1 edge, and the opacity floor: what the legend states.
MAX_WIDTH = 6.0
OPACITY_FLOOR = 0.05
# The spring layout runs on each target's heaviest edges only: networkx's
# force layout slows with every edge, and the weak edges would only pull every
# node towards the centre.
SPRING_EDGES_PER_TARGET = 8
# Up to this many nodes a given structure is laid out by Kamada-Kawai.
STRUCTURE_KK_NODES = 100
# Arc bend of an edge (matplotlib's arc3 ``rad``), per layout, as in the drawings.
_RAD = MappingProxyType({"circular": 0.12, "layered": -0.45, "spring": 0.15, "given": 0.15})


@dataclass
class _Rows:
    """Each target's full row, before the neighbourhood's and ``max_edges``' cuts."""

    stats: dict[str, Tensor]  # [N, H] float32: max and sum of alpha, m_i and sum exp(s - m_i)
    degree: Tensor  # [N] int64: incoming edges

    def take(self, nodes: Tensor) -> _Rows:
        """The rows of ``nodes`` (a neighbourhood's original ids), in that order."""
        return _Rows({k: v[nodes] for k, v in self.stats.items()}, self.degree[nodes])


@dataclass
class _Layer:
    """One layer, ready to write: edges sorted by target then source, maybe cut."""

    name: str
    edge_index: Tensor  # [2, E] int64
    alpha: Tensor  # [E, H] float32
    scores: Tensor | None  # [E, H] float32
    rows: _Rows  # of the full rows, before any cut
    edges_in: int  # edges before the max_edges cut
    cut_rows: Tensor | None  # [N] bool: rows that max_edges cut (None: no cut)
    note: str | None


class AttentionExplorer:
    """An explorer page: :meth:`save` writes it; in Jupyter it displays inline.

    Made by :func:`explore`. Attributes: ``html`` (the page), ``num_nodes``,
    ``num_edges`` (per layer, as written), ``layout`` (the layout used:
    ``"circular"``, ``"layered"``, ``"spring"`` or ``"given"``), ``notes``
    (what the page says was cut) and ``num_structure_edges`` (the undirected
    edges of ``structure`` drawn, or ``None`` without one).

    Example:
        >>> page = explore((causal_graph(2), torch.tensor([1.0, 0.25, 0.75])))
        >>> page.num_nodes, page.num_edges, page.layout
        (2, [3], 'layered')
    """

    def __init__(
        self,
        page: str,
        *,
        num_nodes: int,
        num_edges: list[int],
        layout: str,
        notes: list[str],
        num_structure_edges: int | None = None,
    ) -> None:
        self.html = page
        self.num_nodes = num_nodes
        self.num_edges = num_edges
        self.layout = layout
        self.notes = notes
        self.num_structure_edges = num_structure_edges

    def save(self, path: str | Path) -> Path:
        """Write the page to ``path`` (UTF-8); returns the path."""
        path = Path(path)
        path.write_text(self.html, encoding="utf-8")
        return path

    def _repr_html_(self) -> str:
        # In an iframe, so that the page's script and style stay out of the notebook's.
        return (
            f'<iframe srcdoc="{html.escape(self.html, quote=True)}" '
            'style="width: 100%; height: 900px; border: 1px solid #ddd" '
            'sandbox="allow-scripts"></iframe>'
        )

    def __repr__(self) -> str:
        return (
            f"AttentionExplorer(nodes={self.num_nodes}, edges={self.num_edges}, "
            f"layout={self.layout!r}, {len(self.html.encode('utf-8')) / 1e6:.2f} MB)"
        )


# -------------------------------------------------------------- preparation


def _row_stats(
    edge_index: Tensor, alpha: Tensor, scores: Tensor | None, n: int
) -> dict[str, Tensor]:
    """Per target and head, ``[N, H]``: max and sum of alpha, and m_i, sum exp(s - m_i)."""
    h = alpha.shape[1]
    dst = edge_index[1].view(-1, 1).expand(-1, h)
    zeros = alpha.new_zeros(n, h)
    stats = {
        "amax": zeros.scatter_reduce(0, dst, alpha, "amax", include_self=True),
        "asum": zeros.scatter_add(0, dst, alpha),
    }
    if scores is not None:
        m = alpha.new_full((n, h), -math.inf).scatter_reduce(0, dst, scores, "amax")
        # A row whose scores are all -inf has weights 0 and no max to subtract:
        # its m_i shows as -inf, its sum (shifted by 0, not by -inf) as 0.
        shift = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        stats["smax"] = m
        stats["ssum"] = zeros.scatter_add(0, dst, torch.exp(scores - shift[edge_index[1]]))
    return stats


def _full_rows(edge_index: Tensor, alpha: Tensor, scores: Tensor | None, n: int) -> _Rows:
    """The rows of a whole layer, as the softmax saw them."""
    edge_index = edge_index.cpu()
    stats = _row_stats(
        edge_index, alpha.float().cpu(), None if scores is None else scores.float().cpu(), n
    )
    return _Rows(stats, torch.bincount(edge_index[1], minlength=n))


def _fitting_k(deg: Tensor, max_edges: int) -> int:
    """The largest k whose top k edges per target fit in ``max_edges`` (at least 1)."""
    lo, hi = 1, int(deg.max())
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if int(deg.clamp(max=mid).sum()) <= max_edges else (lo, mid - 1)
    return lo


def _prepare(
    edge_index: Tensor,
    alpha: Tensor,
    scores: Tensor | None,
    rows: _Rows,
    name: str,
    max_edges: int,
) -> _Layer:
    """One layer as the page reads it: cut to ``max_edges`` (top k per target), then sorted."""
    n = rows.degree.numel()
    alpha = alpha.float().cpu()
    scores = None if scores is None else scores.detach().float().cpu().reshape(alpha.shape)
    edge_index = edge_index.cpu()
    e_in = edge_index.shape[1]
    note, cut_rows = None, None
    if e_in > max_edges:
        deg = torch.bincount(edge_index[1], minlength=n)
        k = _fitting_k(deg, max_edges)
        cut_rows = deg > k
        keep = top_k_per_target(edge_index, alpha, k)
        edge_index, alpha = edge_index[:, keep], alpha[keep]
        scores = None if scores is None else scores[keep]
        note = (
            f"{name}: {e_in:,} edges cut to the {k} heaviest incoming edges of each target "
            f"(by the largest weight over the heads) before writing: {edge_index.shape[1]:,} "
            f"kept (max_edges={max_edges:,}); rows of cut targets sum to less than 1"
        )
    # Sorted by target, then source: CSR row pointers for the page, and a
    # binary search finds a matrix cell's edge.
    order = torch.argsort(edge_index[1] * max(n, 1) + edge_index[0], stable=True)
    return _Layer(
        name=name,
        edge_index=edge_index[:, order],
        alpha=alpha[order],
        scores=None if scores is None else scores[order],
        rows=rows,
        edges_in=e_in,
        cut_rows=cut_rows,
        note=note,
    )


def _structure_layout(g: nx.Graph) -> dict[int, tuple[float, float]]:
    """Positions from the given structure: Kamada-Kawai for a small connected one, else spring."""
    # Kamada-Kawai draws a small molecule as chemists do (a benzene ring as a
    # hexagon, where the spring layout folds a hydrogen inside); it costs
    # O(N^2) and 0.4 s at 100 nodes, and puts separate components on a circle.
    if g.number_of_nodes() <= STRUCTURE_KK_NODES and nx.is_connected(g):
        try:
            raw = nx.kamada_kawai_layout(g)
        except ImportError:  # pragma: no cover - scipy is in the viz extra
            return spring(g)
        return {v: (float(p[0]), float(p[1])) for v, p in raw.items()}
    return spring(g)


def _layout(
    first: _Layer, full_edges: Tensor, n: int, layout: str, structure: Tensor | None
) -> tuple[np.ndarray, str]:
    """Positions ``[N, 2]`` (y up) and the layout's name."""
    # A given structure (a molecule's bonds) is the shape to draw: attention
    # over a complete graph has none, and a circle would hide the molecule.
    by_structure = structure is not None and structure.shape[1] > 0 and layout in ("auto", "spring")
    name = "spring" if by_structure else choose_layout(full_edges, n, layout)
    if n == 0:
        return np.zeros((0, 2)), name
    if n == 1:
        return np.zeros((1, 2)), name
    if by_structure and structure is not None:
        # Undirected: networkx's spring pulls both ends of an edge only in a Graph.
        g = nx.Graph()
        g.add_nodes_from(range(n))
        g.add_edges_from(zip(structure[0].tolist(), structure[1].tolist(), strict=True))
        pos = _structure_layout(g)
    elif name == "circular":
        pos = circular(list(range(n)))
    else:
        ei = first.edge_index
        if name == "spring":
            keep = top_k_per_target(ei, first.alpha, SPRING_EDGES_PER_TARGET)
            ei, w = ei[:, keep], first.alpha[keep].amax(dim=1)
        else:
            w = first.alpha.amax(dim=1)
        g = nx.DiGraph()
        g.add_nodes_from(range(n))
        g.add_weighted_edges_from(zip(ei[0].tolist(), ei[1].tolist(), w.tolist(), strict=True))
        pos = layered(g) if name == "layered" else spring(g)
    return np.array([pos[v] for v in range(n)], dtype=np.float64), name


# ------------------------------------------------------------------ writing


def _b64(a: np.ndarray) -> str:
    # Little-endian, as every browser's typed arrays are on the machines that run them.
    return base64.b64encode(np.ascontiguousarray(a).tobytes()).decode("ascii")


def _f32(t: Tensor) -> str:
    return _b64(t.numpy().astype("<f4"))


def _count(k: int, noun: str) -> str:
    """``"1 node"``, ``"2 nodes"``, ``"1,000 nodes"``."""
    return f"{k:,} {noun}{'s' * (k != 1)}"


def _empty_note(layers: list[_Layer], n: int) -> str | None:
    if n == 0:
        return "This graph is empty: no nodes and no edges."
    if all(lay.edge_index.shape[1] == 0 for lay in layers):
        return f"This graph has no edges ({_count(n, 'node')}): nothing to draw."
    return None


def _matrix_note(n: int) -> str | None:
    if n <= MAX_MATRIX_NODES:
        return None
    return (
        f"The matrix is not drawn above {MAX_MATRIX_NODES} nodes ({n:,} here): a cell would be "
        "a pixel or less. Look at one node's neighbourhood with explore(..., around=node, "
        "hops=2), or click a node for its incoming edges and softmax."
    )


def _heads_first(t: Tensor) -> str:
    """``[N, H]`` or ``[E, H]`` written as ``[H, N]`` or ``[H, E]``: one run per head."""
    return _f32(t.t().contiguous())


def _layer_payload(lay: _Layer, n: int, idx: str) -> dict[str, Any]:
    src, dst = lay.edge_index[0], lay.edge_index[1]
    rowptr = torch.zeros(n + 1, dtype=torch.int64)
    rowptr[1:] = torch.cumsum(torch.bincount(dst, minlength=n), 0)
    stats = lay.rows.stats
    return {
        "name": lay.name,
        "heads": lay.alpha.shape[1],
        "edgesIn": lay.edges_in,
        "src": _b64(src.numpy().astype(idx)),
        "rowptr": _b64(rowptr.numpy().astype("<i4")),
        "alpha": _heads_first(lay.alpha),
        "scores": None if lay.scores is None else _heads_first(lay.scores),
        "amax": _heads_first(stats["amax"]),
        "asum": _heads_first(stats["asum"]),
        "smax": _heads_first(stats["smax"]) if "smax" in stats else None,
        "ssum": _heads_first(stats["ssum"]) if "ssum" in stats else None,
        # Each target's incoming edges in the whole layer: the page says "k of
        # d kept" where the neighbourhood or max_edges cut its row.
        "degree": _b64(lay.rows.degree.numpy().astype("<i4")),
        # The rows max_edges cut: a missing cell there may be a cut edge.
        "cutRows": None if lay.cut_rows is None else _b64(lay.cut_rows.numpy().astype("u1")),
        "note": lay.note,
    }


def _payload(layers: list[_Layer], view: _View, xy: np.ndarray, layout: str) -> dict[str, Any]:
    n = len(view.labels)
    idx = "<u2" if n <= 65535 else "<i4"
    out = [_layer_payload(lay, n, idx) for lay in layers]
    return {
        "n": n,
        "idx": "u16" if idx == "<u2" else "i32",
        "labels": view.labels,
        # The page cuts a longer label too (a page is only written here, but a
        # browser takes seconds to measure 100k combining marks).
        "maxLabel": MAX_LABEL_CHARS,
        # The original node ids of a neighbourhood (None: node k is node k).
        "ids": view.ids,
        "groups": None if view.groups is None else asdict(view.groups),
        "x": _b64(xy[:, 0].astype("<f4")),
        # The page's y grows downwards; layouts have y up.
        "y": _b64((-xy[:, 1]).astype("<f4")),
        "layout": layout,
        # The bend in page coordinates: the y flip mirrors matplotlib's arc3.
        "rad": -_RAD[layout],
        "maxWidth": MAX_WIDTH,
        "opacityFloor": OPACITY_FLOOR,
        "layers": out,
        # Notes about the whole page; each layer's own note is shown with its layer.
        "notes": view.notes,
        "empty": _empty_note(layers, n),
        "matrixNote": _matrix_note(n),
        "structure": None
        if view.structure is None
        else {
            "count": view.structure.shape[1],
            "a": _b64(view.structure[0].numpy().astype(idx)),
            "b": _b64(view.structure[1].numpy().astype(idx)),
        },
    }


def _asset(name: str) -> str:
    return (importlib.resources.files(__package__) / "assets" / name).read_text("utf-8")


def _render(payload: dict[str, Any], title: str) -> str:
    from .. import __version__

    # Inside <script>, "</script>" would end the block: no "<" at all in the JSON.
    data = json.dumps(payload, separators=(",", ":")).replace("<", "\\u003c")
    licence = _asset("d3.LICENSE").replace("*/", "* /")
    parts = {
        "__TITLE__": html.escape(title),
        "__VERSION__": __version__,
        "__D3_VERSION__": D3_VERSION,
        "__DATA__": data,
        "__D3__": f"/*! d3 v{D3_VERSION}, https://d3js.org\n{licence}*/\n{_asset('d3.min.js')}",
        "__JS__": _asset("explorer.js"),
    }
    # One pass: text put in is never searched for placeholders again.
    return re.sub("|".join(parts), lambda m: parts[m.group(0)], _asset("explorer.html"))


def _default_title(layers: list[Any], view: _View) -> str:
    total = sum(lay.edges_in for lay in layers)
    heads = max(lay.alpha.shape[1] for lay in layers)
    where = "" if view.around is None else f" around node {view.around} ({view.hops} in-hops)"
    return (
        f"gnnattn attention explorer: {_count(len(view.labels), 'node')}{where}, "
        f"{_count(total, 'edge')} in {_count(len(layers), 'layer')}, {_count(heads, 'head')}"
    )


@dataclass
class _View:
    """What the page shows: every node, or the neighbourhood ``around`` (renumbered)."""

    layers: list[Any]  # (edge_index, alpha, scores, _Rows) per layer, shown numbering
    labels: list[str]
    ids: list[int] | None  # original ids of a neighbourhood
    xy: np.ndarray | None  # given positions
    groups: Groups | None
    around: int | None
    hops: int
    structure: Tensor | None = None  # [2, S] undirected pairs, smaller id first
    notes: list[str] = field(default_factory=list)  # about the whole page


def _checked_structure(structure: Any, n: int) -> Tensor | None:
    """``structure`` checked against the ``n`` nodes, as a plain int64 CPU tensor."""
    if structure is None:
        return None
    ei = check_edge_index(structure, n, name="structure")
    # A torch_geometric EdgeIndex is a Tensor subclass whose ops keep its metadata.
    return ei.detach().as_subclass(Tensor).long().cpu()


def _undirected(ei: Tensor, n: int) -> Tensor:
    """Each unordered pair ``{j, i}`` of ``ei`` once, smaller id first; self-loops dropped.

    A bond is drawn as one line whichever way it was listed (PyG lists both).
    """
    a, b = torch.minimum(ei[0], ei[1]), torch.maximum(ei[0], ei[1])
    keep = a != b
    key = torch.unique(a[keep] * max(n, 1) + b[keep])
    return torch.stack([key // max(n, 1), key % max(n, 1)])


def _short_labels(view: _View, names: list[str]) -> list[str]:
    """Cut over-long labels, class names and layer names (the page says so); returns the names."""
    count = 0

    def cut(texts: list[str]) -> list[str]:
        nonlocal count
        out = [shorten(t) for t in texts]
        count += sum(a is not b for a, b in zip(out, texts, strict=True))
        return out

    view.labels = cut(view.labels)
    if view.groups is not None:
        view.groups = Groups(cut(view.groups.names), view.groups.of)
    names = cut(names)
    if count:
        view.notes.append(
            f"{count:,} label{'s' * (count > 1)} longer than {MAX_LABEL_CHARS} characters cut to "
            f"their first {MAX_LABEL_CHARS} and '\u2026'"
        )
    return names


def _view(
    checked: list[Any],
    n: int,
    tokens: Any,
    pos: Any,
    node_color: Any,
    around: Any,
    hops: Any,
    structure: Tensor | None,
) -> _View:
    labels = labels_of(n, tokens)
    xy = None if pos is None else positions_given(pos, n)
    groups = None if node_color is None else node_groups(node_color, n)
    # The rows as the softmax saw them, before the neighbourhood cuts the
    # border's: m_i and the sums are the full rows', and "k of d kept" needs d.
    full = [(ei, a, s, _full_rows(ei, a, s, n)) for ei, a, s in checked]
    if around is None:
        s = None if structure is None else _undirected(structure, n)
        return _View(full, labels, None, xy, groups, None, hops, s)
    nb = neighbourhood(checked[0][0], around, hops, n)
    layers = []
    for ei, a, s, rows in full:
        sub = nb.edges(ei, a) if s is None else nb.edges(ei, a, s)
        layers.append((sub[0], sub[1], None if s is None else sub[2], rows.take(nb.nodes)))
    if groups is not None:
        # Only the classes present in the neighbourhood, in the same order.
        sub = nb.rows(groups.of)
        present = sorted(set(sub))
        index = {g: k for k, g in enumerate(present)}
        groups = Groups([groups.names[g] for g in present], [index[g] for g in sub])
    return _View(
        layers,
        nb.rows(labels),
        nb.nodes.tolist(),
        None if xy is None else xy[nb.nodes.numpy()],
        groups,
        around,
        hops,
        None if structure is None else _undirected(nb.edges(structure)[0], len(nb.nodes)),
    )


def explore(
    attentions: tuple[Tensor, Tensor] | Sequence[tuple[Tensor, Tensor]],
    *,
    tokens: Sequence[str] | None = None,
    pos: Any = None,
    scores: Tensor | Sequence[Tensor | None] | None = None,
    num_nodes: int | None = None,
    layout: str = "auto",
    layer_names: Sequence[str] | None = None,
    title: str | None = None,
    max_edges: int = 100_000,
    node_color: Any = None,
    around: int | None = None,
    hops: int = 2,
    structure: Tensor | None = None,
) -> AttentionExplorer:
    r"""An interactive page of the attention weights: graph and matrix, linked.

    Above 200 nodes (:data:`~gnnattn.viz.limits.MAX_MATRIX_NODES`) the matrix
    is replaced by a note: its cells would be a pixel or less.

    Labels (``tokens``, the class names of ``node_color``, ``layer_names``)
    longer than 200 code points (:data:`~gnnattn.viz.text.MAX_LABEL_CHARS`)
    are cut to their first 200 and an ellipsis before they are written, never
    inside what reads as one character (an accented letter, an emoji
    sequence, a flag); the page's notes and :attr:`AttentionExplorer.notes`
    say how many were cut. Labels are data, never markup: ``"</script>"``,
    right-to-left text, combining marks and emoji are written and drawn as
    they are.

    Args:
        attentions: ``(edge_index, alpha)`` as a layer returns it with
            ``return_attention_weights=True``, or a list with one per layer.
        tokens (list of str, optional): node labels. (default: :obj:`None`, the ids)
        pos (optional): positions ``{node: (x, y)}`` or ``[N, 2]`` (y up),
            winning over ``layout``. (default: :obj:`None`)
        scores (optional): the scores before the softmax, shaped like
            ``alpha`` (or a list, one per layer); shown with the target's max.
            (default: :obj:`None`: :math:`s_{ij} - m_i`, which ``alpha`` gives)
        num_nodes (int, optional): :math:`N`. (default: :obj:`None`, from the inputs)
        layout (str, optional): ``"auto"``, ``"circular"``, ``"layered"`` or
            ``"spring"``, from the first layer. (default: ``"auto"``)
        layer_names (list of str, optional): layer names. (default: :obj:`None`)
        title (str, optional): the page's title. (default: :obj:`None`)
        max_edges (int, optional): a layer with more edges is cut to the top
            k per target that fit, and the page says so. (default: ``100000``)
        node_color (optional): one class per node (an int tensor such as
            ``data.y``, or a list of ints or strings), coloured with a legend.
            (default: :obj:`None`)
        around (int, optional): only this node's ``hops``-hop in-neighbourhood
            (:mod:`gnnattn.viz.neighbourhood`), labelled with the original ids
            or tokens. (default: :obj:`None`, every node)
        hops (int, optional): the neighbourhood's depth. (default: ``2``)
        structure (Tensor, optional): ``[2, E']`` edges of the underlying
            graph over the same nodes (a molecule's bonds, a citation graph),
            drawn under the attention edges as thin grey lines without
            direction (``j -> i`` and ``i -> j`` are one line, self-loops are
            not drawn) and marked in the corner of their matrix cells; a
            checkbox shows or hides them. With ``layout="auto"`` or
            ``"spring"`` (and no ``pos``) the positions come from these
            edges (Kamada-Kawai for a connected structure of up to 100
            nodes, the spring layout otherwise), so that a complete graph
            over a molecule is drawn in the molecule's shape.
            (default: :obj:`None`)

    Shapes:
        - **edge_index:** ``[2, E]`` per layer; **alpha:** ``[E, H]`` or ``[E]``;
          the page's size grows linearly in :math:`E \cdot H`.
        - **structure:** ``[2, E']``, int64 (or int32), ids below :math:`N`.

    Raises:
        TypeError: an argument of the wrong type (``structure`` not a tensor,
            or not an integer one, ...), naming it.
        ValueError: an argument of the wrong shape or value (``structure``
            not ``[2, E']``, or with ids out of range, ...), naming it.

    Returns:
        AttentionExplorer: ``save(path)`` writes the HTML file.

    Example:
        >>> ei = complete_graph(3)
        >>> page = explore((ei, torch.full((9, 2), 1 / 3)), tokens=["a", "b", "c"])
        >>> page.layout, page.num_edges, "<canvas" in page.html
        ('circular', [9], True)
        >>> bonds = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])  # a chain a - b - c
        >>> page = explore((ei, torch.full((9,), 1 / 3)), structure=bonds)
        >>> page.num_structure_edges, page.layout
        (2, 'spring')
    """
    pairs = as_layers(attentions)
    score_list = as_scores(scores, len(pairs))
    names = check_options(len(pairs), layout, max_edges, layer_names, title, hops)
    n = count_nodes(pairs, num_nodes, tokens, pos)
    checked = checked_layers(pairs, score_list, n, tokens)
    bonds = _checked_structure(structure, n)
    view = _view(checked, n, tokens, pos, node_color, around, hops, bonds)
    names = _short_labels(view, names)
    m = len(view.labels)
    layers = [
        _prepare(ei, a, s, rows, names[k], max_edges)
        for k, (ei, a, s, rows) in enumerate(view.layers)
    ]
    if view.xy is not None:
        xy, used = view.xy, "given"
    else:
        xy, used = _layout(layers[0], view.layers[0][0], m, layout, view.structure)
    payload = _payload(layers, view, xy, used)
    page = _render(payload, clean(title) if title is not None else _default_title(layers, view))
    return AttentionExplorer(
        page,
        num_nodes=m,
        num_edges=[lay.edge_index.shape[1] for lay in layers],
        layout=used,
        notes=view.notes + [lay.note for lay in layers if lay.note],
        num_structure_edges=None if view.structure is None else view.structure.shape[1],
    )
