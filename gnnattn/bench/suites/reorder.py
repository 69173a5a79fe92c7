"""The ``reorder`` suite: graphs with locality whose ids were shuffled, as given and
reordered with :func:`gnnattn.graphs.reorder` (reverse Cuthill-McKee).

* a k-nearest-neighbour graph of uniform random points in the unit cube
  (``scipy.spatial.cKDTree``; random points come in no order, so their ids
  are shuffled by construction);
* a 2-D grid with its 8 neighbours and itself, ids shuffled, with the grid's
  own row-major ids as a third candidate.

The reordered candidate is the whole round trip for one layer:
``order.restore(layer(order.apply(x), graph_r))`` (the row gathers of ``x``
and of the output included, forward and backward); a model that keeps its
data in the new order pays them once, not per layer. Finding the order
(``reorder``) and building ``graph_r`` happen once, outside the timing, and
their time is in the row's note.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import torch
from torch import Tensor

from ..harness import BenchConfig, Candidate, Case
from .common import attention_layer, input_pair, knn_graph, random_points, with_backend

__all__ = ["SIZES", "reorder_cases"]

SIZES: Mapping[str, dict[str, Any]] = MappingProxyType(
    {
        # knn: (points, k); grid: side; layer: (embed, heads)
        "full": {"knn": (200_000, 16), "grid": 448, "layer": (128, 4)},
        "quick": {"knn": (2_000, 8), "grid": 30, "layer": (32, 4)},
    }
)


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
    knn = knn_graph(random_points(n, gen), k)
    cases = _case(cfg, "kNN graph of random 3-D points", knn, None, device)
    side = sizes["grid"]
    grid = _grid_graph(side)
    shuffle = torch.randperm(side * side, generator=gen)  # old id -> new id
    cases += _case(cfg, "2-D grid, 8 neighbours", shuffle[grid], shuffle, device)
    return cases


def _operator(graph: Any, heads: int) -> Any:
    from ...ops import attention

    def fn(x: Tensor) -> Tensor:
        n, d = x.shape
        q = x.view(n, heads, d // heads)
        # Distinct k and v rows (one array for both would halve the gathers).
        k, v = q * 0.5, q * 2.0
        out = attention(q, k, v, graph, backend="fused")
        assert isinstance(out, Tensor)
        return out.reshape(n, d)

    return fn


def _case(
    cfg: BenchConfig, name: str, ei: Tensor, shuffle: Tensor | None, device: torch.device
) -> list[Case]:
    from ...graphs import AttentionGraph, Reordering, permute, reorder

    d, h = SIZES["quick" if cfg.quick else "full"]["layer"]
    n = int(ei.max()) + 1
    gen = torch.Generator().manual_seed(cfg.seed + 8)
    torch.manual_seed(cfg.seed)
    layer = attention_layer(d, h, device)
    x, g = input_pair(n, d, device, gen)
    ei = ei.to(device)
    graph = AttentionGraph(ei, n)
    t0 = time.perf_counter()
    order = reorder(graph)
    t_order = time.perf_counter() - t0
    t0 = time.perf_counter()
    graph_r = permute(graph, order.perm)
    _ = graph_r.csr, graph_r.csc
    t_build = time.perf_counter() - t0
    fn_r = with_backend(layer, "auto", graph_r)
    cands = [
        Candidate("shuffled ids: layer(x, graph)", with_backend(layer, "auto", graph)),
        Candidate(
            "reordered (RCM): restore(layer(apply(x), graph_r))",
            lambda x: order.restore(fn_r(order.apply(x))),
            note=f"reorder() {t_order:.2f} s and permute() {t_build:.2f} s, once",
        ),
    ]
    if shuffle is not None:
        # The grid's own row-major order: row-major node r is shuffled node shuffle[r].
        own = Reordering(shuffle, torch.argsort(shuffle))
        graph_o = permute(graph, own.perm)
        _ = graph_o.csr, graph_o.csc
        fn_o = with_backend(layer, "auto", graph_o)
        cands.append(
            Candidate(
                "row-major ids: restore(layer(apply(x), graph_o))",
                lambda x: own.restore(fn_o(own.apply(x))),
            )
        )
    e = graph.num_edges
    title = f"{name}, N={n:,}, |E|={e:,}, embed {d}, {h} heads"
    info = {"num_nodes": n, "num_edges": e, "embed_dim": d, "heads": h, "reorder_s": t_order}
    # The attention operator alone (q = x, k = x / 2, v = 2 x, no projections):
    # what the node order changes, without the four [N, D] x [D, D] matmuls.
    op_r = _operator(graph_r, h)
    operator = [
        Candidate("shuffled ids: attention(q, k, v)", _operator(graph, h)),
        Candidate(
            "reordered (RCM): restore(attention(apply(...)))",
            lambda x: order.restore(op_r(order.apply(x))),
        ),
    ]
    return [
        Case(
            "reorder",
            f"{title}: the layer",
            x,
            g,
            cands[0].name,
            cands,
            list(layer.parameters()),
            info,
        ),
        Case(
            "reorder",
            f"{title}: the attention operator only",
            x,
            g,
            operator[0].name,
            operator,
            [],
            info,
        ),
    ]
