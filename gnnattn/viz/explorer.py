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
target's max and sum, and marks the same edge in the other view; clicking a
token keeps only its incoming edges and shows its softmax step by step
(subtract the max, exponentiate, divide by the sum); selectors pick the layer
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
load and repaint times are in the README ("See it").

**Scale.** Arrays are written compactly (base64 of little-endian uint16 or
int32 source ids, int32 CSR row pointers, float32 weights per head), so the
file grows linearly: 2.7 bytes per edge (uint16 ids) plus 5.3 per edge and
head (10.7 with ``scores``), plus 0.32 MB of fixed code. A layer with more
than ``max_edges`` edges is cut in Python to the top k edges per target (the
largest k that fits), and the page says so. Hovering tests only the drawn
edges, in one pass.
"""

from __future__ import annotations

import base64
import html
import importlib.resources
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import networkx as nx
import numpy as np
import torch
from torch import Tensor

from ..checks import check_int
from .convert import check_attention, labels_of, top_k_per_target
from .layout import LAYOUTS, choose_layout, circular, layered, spring

__all__ = ["AttentionExplorer", "explore"]

D3_VERSION = "7.9.2"
# Edge width in px of a weight-1 edge, and the opacity floor: what the legend states.
MAX_WIDTH = 6.0
OPACITY_FLOOR = 0.05
# The spring layout runs on each target's heaviest edges only: networkx's
# force layout slows with every edge, and the weak edges would only pull every
# node towards the centre.
SPRING_EDGES_PER_TARGET = 8
# Arc bend of an edge (matplotlib's arc3 ``rad``), per layout, as in the drawings.
_RAD = MappingProxyType({"circular": 0.12, "layered": -0.45, "spring": 0.15, "given": 0.15})


@dataclass
class _Layer:
    """One layer, ready to write: edges sorted by target then source, maybe cut."""

    name: str
    edge_index: Tensor  # [2, E] int64
    alpha: Tensor  # [E, H] float32
    scores: Tensor | None  # [E, H] float32
    stats: dict[str, Tensor]  # [H, N] float32, of the full rows (before any cut)
    edges_in: int  # edges before the cut
    note: str | None


class AttentionExplorer:
    """An explorer page: :meth:`save` writes it; in Jupyter it displays inline.

    Made by :func:`explore`. Attributes: ``html`` (the page), ``num_nodes``,
    ``num_edges`` (per layer, as written), ``layout`` (the layout used:
    ``"circular"``, ``"layered"``, ``"spring"`` or ``"given"``) and ``notes``
    (what the page says was cut).

    Example:
        >>> page = explore((causal_graph(2), torch.tensor([1.0, 0.25, 0.75])))
        >>> page.num_nodes, page.num_edges, page.layout
        (2, [3], 'layered')
    """

    def __init__(
        self, page: str, *, num_nodes: int, num_edges: list[int], layout: str, notes: list[str]
    ) -> None:
        self.html = page
        self.num_nodes = num_nodes
        self.num_edges = num_edges
        self.layout = layout
        self.notes = notes

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


# ------------------------------------------------------------------- inputs


def _as_layers(attentions: Any) -> list[tuple[Tensor, Tensor]]:
    one = (
        isinstance(attentions, tuple)
        and len(attentions) == 2
        and all(isinstance(t, Tensor) for t in attentions)
    )
    if one:
        return [attentions]
    if not isinstance(attentions, (list, tuple)) or not all(
        isinstance(a, (list, tuple)) and len(a) == 2 for a in attentions
    ):
        raise TypeError(
            "Expected 'attentions' to be (edge_index, alpha) or a list of them (one per "
            f"layer), got {type(attentions).__name__}"
        )
    if not attentions:
        raise ValueError("Expected 'attentions' to hold at least one (edge_index, alpha), got []")
    return [(a[0], a[1]) for a in attentions]


def _as_scores(scores: Any, count: int) -> list[Tensor | None]:
    if scores is None:
        return [None] * count
    if isinstance(scores, Tensor):
        scores = [scores]
    if not isinstance(scores, (list, tuple)) or len(scores) != count:
        got = len(scores) if isinstance(scores, (list, tuple)) else type(scores).__name__
        raise ValueError(
            f"Expected 'scores' to hold one tensor (or None) per layer ({count}), got {got}"
        )
    return list(scores)


def _check_values(alpha: Tensor, scores: Tensor | None, layer: int) -> None:
    bad = ~torch.isfinite(alpha)
    if bool(bad.any()):
        e = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"Expected finite weights in 'alpha' (layer {layer}), got {float(alpha[e].max())} "
            f"at edge {e}"
        )
    if bool((alpha < 0).any()):
        e = int((alpha < 0).nonzero()[0, 0])
        raise ValueError(
            f"Expected weights >= 0 in 'alpha' (layer {layer}), got {float(alpha[e].min())} "
            f"at edge {e}"
        )
    if scores is not None:
        if scores.shape != alpha.shape:
            raise ValueError(
                f"Expected 'scores' of layer {layer} shaped like its alpha {list(alpha.shape)}, "
                f"got {list(scores.shape)}"
            )
        # -inf is a masked edge (weight 0); NaN and +inf are mistakes.
        if bool((torch.isnan(scores) | (scores == math.inf)).any()):
            raise ValueError(f"Expected 'scores' of layer {layer} without NaN or +inf")


def _positions_given(pos: Any, n: int) -> np.ndarray:
    if isinstance(pos, Mapping):
        missing = [v for v in range(n) if v not in pos]
        if missing:
            raise ValueError(
                f"Expected 'pos' to place every node 0..{n - 1}, got none for {missing[:5]}"
            )
        arr = np.array([pos[v] for v in range(n)], dtype=np.float64).reshape(n, -1)
    else:
        arr = (pos.detach().cpu().numpy() if isinstance(pos, Tensor) else np.asarray(pos)).astype(
            np.float64
        )
    if arr.shape != (n, 2):
        raise ValueError(
            f"Expected 'pos' of shape [{n}, 2] (one (x, y) per node), got {list(arr.shape)}"
        )
    if not np.isfinite(arr).all():
        raise ValueError("Expected finite coordinates in 'pos', got NaN or inf")
    return arr


# -------------------------------------------------------------- preparation


def _row_stats(
    edge_index: Tensor, alpha: Tensor, scores: Tensor | None, n: int
) -> dict[str, Tensor]:
    """Per target and head: the max and sum of alpha, and of the scores m_i, sum exp(s - m_i)."""
    h = alpha.shape[1]
    dst = edge_index[1].view(-1, 1).expand(-1, h)
    zeros = alpha.new_zeros(n, h)
    stats = {
        "amax": zeros.scatter_reduce(0, dst, alpha, "amax", include_self=True),
        "asum": zeros.scatter_add(0, dst, alpha),
    }
    if scores is not None:
        m = alpha.new_full((n, h), -math.inf).scatter_reduce(0, dst, scores, "amax")
        # A row whose scores are all -inf has weights 0: shift by 0, not by -inf.
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        stats["smax"] = m
        stats["ssum"] = zeros.scatter_add(0, dst, torch.exp(scores - m[edge_index[1]]))
    return {k: v.t().contiguous() for k, v in stats.items()}


def _prepare(
    edge_index: Tensor,
    alpha: Tensor,
    scores: Tensor | None,
    n: int,
    name: str,
    max_edges: int,
) -> _Layer:
    alpha = alpha.float().cpu()
    scores = None if scores is None else scores.detach().float().cpu().reshape(alpha.shape)
    edge_index = edge_index.cpu()
    stats = _row_stats(edge_index, alpha, scores, n)
    e_in = edge_index.shape[1]
    note = None
    if e_in > max_edges:
        # The largest k whose top-k per target fits in max_edges (at least 1).
        deg = torch.bincount(edge_index[1], minlength=n)
        lo, hi = 1, int(deg.max())
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if int(deg.clamp(max=mid).sum()) <= max_edges else (lo, mid - 1)
        keep = top_k_per_target(edge_index, alpha, lo)
        edge_index, alpha = edge_index[:, keep], alpha[keep]
        scores = None if scores is None else scores[keep]
        note = (
            f"{name}: {e_in:,} edges cut to the {lo} heaviest incoming edges of each target "
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
        stats=stats,
        edges_in=e_in,
        note=note,
    )


def _layout(first: _Layer, full_edges: Tensor, n: int, layout: str) -> tuple[np.ndarray, str]:
    """Positions ``[N, 2]`` (y up) and the layout's name."""
    name = choose_layout(full_edges, n, layout)
    if n == 0:
        return np.zeros((0, 2)), name
    if n == 1:
        return np.zeros((1, 2)), name
    if name == "circular":
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


def _payload(
    layers: list[_Layer],
    labels: list[str],
    xy: np.ndarray,
    layout: str,
    notes: list[str],
    empty: str | None,
) -> dict[str, Any]:
    n = len(labels)
    idx = "<u2" if n <= 65535 else "<i4"
    out = []
    for lay in layers:
        src, dst = lay.edge_index[0], lay.edge_index[1]
        rowptr = torch.zeros(n + 1, dtype=torch.int64)
        rowptr[1:] = torch.cumsum(torch.bincount(dst, minlength=n), 0)
        out.append(
            {
                "name": lay.name,
                "heads": lay.alpha.shape[1],
                "edgesIn": lay.edges_in,
                "src": _b64(src.numpy().astype(idx)),
                "rowptr": _b64(rowptr.numpy().astype("<i4")),
                "alpha": _f32(lay.alpha.t().contiguous()),  # [H, E]: one run per head
                "scores": None if lay.scores is None else _f32(lay.scores.t().contiguous()),
                "amax": _f32(lay.stats["amax"]),
                "asum": _f32(lay.stats["asum"]),
                "smax": _f32(lay.stats["smax"]) if "smax" in lay.stats else None,
                "ssum": _f32(lay.stats["ssum"]) if "ssum" in lay.stats else None,
                "note": lay.note,
            }
        )
    return {
        "n": n,
        "idx": "u16" if idx == "<u2" else "i32",
        "labels": labels,
        "x": _b64(xy[:, 0].astype("<f4")),
        # The page's y grows downwards; layouts have y up.
        "y": _b64((-xy[:, 1]).astype("<f4")),
        "layout": layout,
        # The bend in page coordinates: the y flip mirrors matplotlib's arc3.
        "rad": -_RAD[layout],
        "maxWidth": MAX_WIDTH,
        "opacityFloor": OPACITY_FLOOR,
        "layers": out,
        "notes": notes,
        "empty": empty,
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


def _count_nodes(pairs: list[Any], num_nodes: int | None, tokens: Any, pos: Any) -> int:
    """``num_nodes``, or the most that the edges, ``tokens`` and ``pos`` imply."""
    if num_nodes is not None:
        check_int(num_nodes, "num_nodes")
        return num_nodes
    n = max(
        (int(ei.max()) + 1 for ei, _ in pairs if isinstance(ei, Tensor) and ei.numel()),
        default=0,
    )
    n = max(n, len(tokens) if tokens is not None else 0)
    if pos is not None and not isinstance(pos, Mapping):
        n = max(n, len(pos))
    return n


def _checked_layers(pairs: list[Any], score_list: list[Any], n: int, tokens: Any) -> list[Any]:
    """Every layer's ``(edge_index, alpha, scores)`` checked, scores as ``[E, H]`` or ``None``."""
    checked = []
    for k, ((ei, a), s) in enumerate(zip(pairs, score_list, strict=True)):
        ei, a, _ = check_attention(ei, a, n, tokens)
        if s is not None and not isinstance(s, Tensor):
            raise TypeError(
                f"Expected 'scores' of layer {k} to be a Tensor, got {type(s).__name__}"
            )
        if s is not None:
            s = s.detach().unsqueeze(-1) if s.dim() == 1 else s.detach()
        _check_values(a, s, k)
        checked.append((ei, a, s))
    return checked


def _default_title(layers: list[Any], n: int) -> str:
    total = sum(lay.edges_in for lay in layers)
    heads = max(lay.alpha.shape[1] for lay in layers)
    return (
        f"gnnattn attention explorer: {n} nodes, {total:,} edges in {len(layers)} "
        f"layer{'s' if len(layers) > 1 else ''}, {heads} head{'s' if heads > 1 else ''}"
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
) -> AttentionExplorer:
    r"""An interactive page of the attention weights: graph and matrix, linked.

    Args:
        attentions: ``(edge_index, alpha)`` as a layer returns it with
            ``return_attention_weights=True``, or a list of them, one per
            layer (each layer may have its own edges and number of heads).
        tokens (list of str, optional): one label per node. (default:
            :obj:`None`, the node ids)
        pos (optional): node positions, ``{node: (x, y)}`` or ``[N, 2]``
            (y up); they win over ``layout``. (default: :obj:`None`)
        scores (optional): the scores :math:`s_{ij}` before the softmax,
            shaped like ``alpha`` (a tensor, or a list with one per layer,
            ``None`` where unknown); the page then shows them and the
            target's max :math:`m_i`. (default: :obj:`None`: the page shows
            :math:`s_{ij} - m_i`, which ``alpha`` determines)
        num_nodes (int, optional): :math:`N`. (default: :obj:`None`, from the
            edges, ``tokens`` and ``pos``)
        layout (str, optional): ``"auto"``, ``"circular"``, ``"layered"`` or
            ``"spring"``, computed from the first layer's edges.
            (default: ``"auto"``)
        layer_names (list of str, optional): names in the layer selector.
            (default: :obj:`None`, ``"layer 0"``, ...)
        title (str, optional): the page's title. (default: :obj:`None`)
        max_edges (int, optional): a layer with more edges is cut to the top
            k per target that fit, and the page says so. (default: ``100000``)

    Shapes:
        - **edge_index:** ``[2, E]`` per layer; **alpha:** ``[E, H]`` or ``[E]``
        - **output:** an :class:`AttentionExplorer`; the page's size grows
          linearly in :math:`E \cdot H`.

    Returns:
        AttentionExplorer: ``save(path)`` writes the HTML file.

    Example:
        >>> ei = complete_graph(3)
        >>> page = explore((ei, torch.full((9, 2), 1 / 3)), tokens=["a", "b", "c"])
        >>> page.layout, page.num_edges, "<canvas" in page.html
        ('circular', [9], True)
    """
    pairs = _as_layers(attentions)
    score_list = _as_scores(scores, len(pairs))
    check_int(max_edges, "max_edges", min=1)
    if layout not in LAYOUTS:
        raise ValueError(
            f"Expected 'layout' to be 'auto', 'circular', 'layered' or 'spring', got {layout!r}"
        )
    if tokens is not None and isinstance(tokens, str):
        raise TypeError("Expected 'tokens' to be a list of strings, got one str (use .split())")
    if layer_names is not None and len(layer_names) != len(pairs):
        raise ValueError(
            f"Expected 'layer_names' to hold one name per layer ({len(pairs)}), "
            f"got {len(layer_names)}"
        )
    n = _count_nodes(pairs, num_nodes, tokens, pos)
    names = (
        list(layer_names) if layer_names is not None else [f"layer {k}" for k in range(len(pairs))]
    )
    checked = _checked_layers(pairs, score_list, n, tokens)
    layers = [_prepare(ei, a, s, n, names[k], max_edges) for k, (ei, a, s) in enumerate(checked)]
    if pos is not None:
        xy, used = _positions_given(pos, n), "given"
    else:
        xy, used = _layout(layers[0], checked[0][0], n, layout)
    notes = [lay.note for lay in layers if lay.note]
    if n == 0:
        empty: str | None = "This graph is empty: no nodes and no edges."
    elif all(lay.edge_index.shape[1] == 0 for lay in layers):
        empty = f"This graph has no edges ({n} nodes): nothing to draw."
    else:
        empty = None
    if title is None:
        title = _default_title(layers, n)
    page = _render(_payload(layers, labels_of(n, tokens), xy, used, notes, empty), title)
    return AttentionExplorer(
        page,
        num_nodes=n,
        num_edges=[lay.edge_index.shape[1] for lay in layers],
        layout=used,
        notes=notes,
    )
