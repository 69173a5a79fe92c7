"""Node positions for attention graphs, shared by the drawings and the explorer page.

Complete graphs go on a circle (token 0 at the top, then clockwise, so it
reads like a sentence), DAGs such as causal attention in layers left to right
(longest-path depth: every edge points right), anything else by networkx's
spring layout (seeded, so a drawing is reproducible).
"""

from __future__ import annotations

import math

import networkx as nx
import torch
from torch import Tensor

__all__ = ["LAYOUTS", "choose_layout", "layout", "positions"]

LAYOUTS = ("auto", "circular", "layered", "spring")

Pos = dict[int, tuple[float, float]]


def check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(
            f"Expected 'layout' to be 'auto', 'circular', 'layered' or 'spring', got {layout!r}"
        )


def is_complete(edge_index: Tensor, n: int) -> bool:
    """Every ordered pair of distinct nodes has an edge (self-loops and duplicates aside)."""
    src, dst = edge_index[0].long(), edge_index[1].long()
    off = src != dst
    pairs = torch.unique(dst[off] * n + src[off]).numel()
    return n > 1 and pairs == n * (n - 1)


def without_self_loops(g: nx.DiGraph) -> nx.DiGraph:
    h = nx.DiGraph(g)
    h.remove_edges_from(list(nx.selfloop_edges(h)))
    return h


def is_dag(edge_index: Tensor, n: int) -> bool:
    """A DAG once self-loops are set aside (e.g. causal attention)."""
    src, dst = edge_index[0].long(), edge_index[1].long()
    if bool((src <= dst).all()) or bool((src >= dst).all()):
        return True  # every edge points one way along the node order: acyclic
    # Most graphs that are not DAGs have an edge both ways: found without networkx.
    if bool(torch.isin(src * n + dst, dst * n + src).logical_and(src != dst).any()):
        return False
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    g.add_edges_from(zip(src.tolist(), dst.tolist(), strict=True))
    return nx.is_directed_acyclic_graph(without_self_loops(g))


def choose_layout(edge_index: Tensor, n: int, layout: str = "auto") -> str:
    """The layout ``"auto"`` stands for: circular, layered or spring."""
    check_layout(layout)
    if layout != "auto":
        return layout
    if n <= 1 or is_complete(edge_index, n):
        return "circular"
    if edge_index.shape[1] > 0 and is_dag(edge_index, n):
        return "layered"
    return "spring"


def circular(nodes: list[int]) -> Pos:
    n = len(nodes)
    return {
        v: (math.sin(2 * math.pi * k / n), math.cos(2 * math.pi * k / n))
        for k, v in enumerate(sorted(nodes))
    }


def layered(g: nx.DiGraph) -> Pos:
    h = without_self_loops(g)
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
    return pos


def spring(g: nx.DiGraph) -> Pos:
    # networkx switches to its energy method at 500 nodes, which costs seconds
    # per 25 iterations there: fewer iterations keep a 1000-node page quick.
    iterations = 50 if g.number_of_nodes() < 500 else 25
    try:
        raw = nx.spring_layout(g, seed=0, iterations=iterations)
    except ImportError as err:  # pragma: no cover - exercised only without scipy
        raise ImportError(
            f"networkx's spring layout of {g.number_of_nodes()} nodes needs scipy: "
            "pip install 'gnnattn[viz]', or pass layout='circular' or positions"
        ) from err
    return {v: (float(p[0]), float(p[1])) for v, p in raw.items()}


def layout(g: nx.DiGraph, name: str) -> tuple[Pos, str]:
    """Positions of the nodes of ``g`` and the layout actually used (``"auto"`` resolved)."""
    check_layout(name)
    n = g.number_of_nodes()
    if name == "auto":
        edges = list(g.edges)
        ei = torch.tensor(edges, dtype=torch.long).t() if edges else torch.zeros(2, 0).long()
        name = choose_layout(ei, n) if n > 1 else "circular"
    return positions(g, name), name


def positions(g: nx.DiGraph, name: str) -> Pos:
    """Positions of the nodes of ``g`` in layout ``name`` (not ``"auto"``)."""
    if g.number_of_nodes() == 1:
        return {next(iter(g.nodes)): (0.0, 0.0)}
    if name == "circular":
        return circular(list(g.nodes))
    if name == "layered":
        return layered(g)
    return spring(g)
