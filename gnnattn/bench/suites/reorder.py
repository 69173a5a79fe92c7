"""The ``reorder`` suite: graphs with locality whose ids were shuffled, as given and
reordered with :func:`gnnattn.graphs.reorder` (reverse Cuthill-McKee).

* a k-nearest-neighbour graph of uniform random points in the unit cube
  (``scipy.spatial.cKDTree``; random points come in no order, so their ids
  are shuffled by construction);
* a 2-D grid with its 8 neighbours and itself, ids shuffled, with the grid's
  own row-major ids as a third candidate.

The reordered candidate is the whole round trip a user runs:
``layer(x[perm], graph_r)[inv]`` (the gathers of ``x`` and of the output
included); finding the order (``reorder``) and building ``graph_r`` happen
once, outside the timing, and their time is in the case's note.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import Tensor

from ..harness import BenchConfig, Candidate, Case
from .common import attention_layer, input_pair, with_backend

__all__ = ["SIZES", "reorder_cases"]

SIZES: dict[str, dict[str, Any]] = {
    # knn: (points, k); grid: side; layer: (embed, heads)
    "full": {"knn": (200_000, 16), "grid": 448, "layer": (128, 4)},
    "quick": {"knn": (2_000, 8), "grid": 30, "layer": (32, 4)},
}


def _knn_graph(n: int, k: int, gen: torch.Generator) -> Tensor:
    """``j -> i`` for the ``k`` nearest points ``j`` of each point ``i`` (itself included)."""
    from scipy.spatial import cKDTree

    pts = torch.rand(n, 3, generator=gen, dtype=torch.float64).numpy()
    _, nbr = cKDTree(pts).query(pts, k=k)
    src = torch.from_numpy(nbr.reshape(-1)).long()
    dst = torch.arange(n).repeat_interleave(k)
    return torch.stack([src, dst])


def _grid_graph(side: int) -> Tensor:
    """The 8-neighbourhood of a ``side x side`` grid plus self-loops, row-major ids."""
    r = torch.arange(side).view(-1, 1).expand(side, side).reshape(-1)
    c = torch.arange(side).view(1, -1).expand(side, side).reshape(-1)
    src, dst = [], []
    for dr in (-1, 0, 1):
        for dc in (-1, 0, 1):
            ok = (r + dr >= 0) & (r + dr < side) & (c + dc >= 0) & (c + dc < side)
            dst.append((r * side + c)[ok])
            src.append(((r + dr) * side + (c + dc))[ok])
    ei = torch.stack([torch.cat(src), torch.cat(dst)])
    return ei[:, torch.argsort(ei[1], stable=True)]  # grouped by target


def reorder_cases(cfg: BenchConfig, device: torch.device) -> list[Case]:
    """Shuffled vs reordered, forward and forward+backward of one layer."""
    try:
        import scipy  # noqa: F401
    except ImportError:  # pragma: no cover - scipy is a dependency
        return []
    sizes = SIZES["quick" if cfg.quick else "full"]
    gen = torch.Generator().manual_seed(cfg.seed + 7)
    n, k = sizes["knn"]
    cases = [_case(cfg, "kNN graph of random 3-D points", _knn_graph(n, k, gen), None, device)]
    side = sizes["grid"]
    grid = _grid_graph(side)
    shuffle = torch.randperm(side * side, generator=gen)  # old id -> new id
    cases.append(_case(cfg, "2-D grid, 8 neighbours", shuffle[grid], shuffle, device))
    return cases


def _case(
    cfg: BenchConfig, name: str, ei: Tensor, shuffle: Tensor | None, device: torch.device
) -> Case:
    from ...graphs import AttentionGraph, permute, reorder

    d, h = SIZES["quick" if cfg.quick else "full"]["layer"]
    n = int(ei.max()) + 1
    gen = torch.Generator().manual_seed(cfg.seed + 8)
    torch.manual_seed(cfg.seed)
    layer = attention_layer(d, h, device)
    x, g = input_pair(n, d, device, gen)
    ei = ei.to(device)
    graph = AttentionGraph(ei, n)
    t0 = time.perf_counter()
    perm, inv = reorder(graph)
    t_order = time.perf_counter() - t0
    t0 = time.perf_counter()
    graph_r = permute(graph, perm)
    _ = graph_r.csr
    t_build = time.perf_counter() - t0
    perm, inv = perm.to(device), inv.to(device)
    fn_r = with_backend(layer, "auto", graph_r)
    cands = [
        Candidate("shuffled ids: layer(x, graph)", with_backend(layer, "auto", graph)),
        Candidate(
            "reordered (RCM): layer(x[perm], graph_r)[inv]",
            lambda x: fn_r(x[perm])[inv],
            note=f"reorder() {t_order:.2f} s and permute() {t_build:.2f} s, once",
        ),
    ]
    if shuffle is not None:
        # The grid's own row-major order: row-major node r is shuffled node shuffle[r].
        order = shuffle.to(device)  # new (row-major) id -> id in the shuffled graph
        back = torch.argsort(shuffle).to(device)
        graph_o = permute(graph, order)
        fn_o = with_backend(layer, "auto", graph_o)
        cands.append(
            Candidate(
                "row-major ids: layer(x[order], graph_o)[back]", lambda x: fn_o(x[order])[back]
            )
        )
    e = graph.num_edges
    return Case(
        "reorder",
        f"{name}, N={n:,}, |E|={e:,}, embed {d}, {h} heads",
        x,
        g,
        "shuffled ids: layer(x, graph)",
        cands,
        list(layer.parameters()),
        {"num_nodes": n, "num_edges": e, "embed_dim": d, "heads": h, "reorder_s": t_order},
    )
