"""The ``pyg`` suite: gnnattn's drop-in PyG layers against PyG's, with the same weights.

* ``GPSConv`` (a ``GINConv`` local layer, 64 channels, 4 heads, batch norm) on
  a batch of graphs of skewed sizes: 256 graphs of 10 to 500 nodes, most of
  them small (``10 + 490 u^3`` for uniform ``u``, seeded), 4 random in-edges
  per node inside its graph. PyG's layer pads every graph to the largest one
  for its global attention; gnnattn's attends within each graph as it is.
  Forward in evaluation mode (PyG's ``MultiheadAttention`` takes its fast
  path there); forward + backward in training mode with dropout 0 (batch
  statistics; deterministic, so the outputs are comparable).

* ``TransformerConv`` (4 heads x 32, 128 channels in) on a graph of N nodes
  with 32 random in-edges each, with ``edge_dim=16`` and without edge
  features, forward and forward + backward; gnnattn's gets the graph as an
  :class:`~gnnattn.AttentionGraph` built once (as a user keeps it), PyG's the
  ``edge_index``.

Rows: PyG's layer (the baseline), gnnattn's with ``backend="auto"`` (the note
says what ``"auto"`` took and why) and with ``backend="fused"``; all share one
``state_dict``. A new layer adds its builder to :data:`CASE_BUILDERS`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import torch
from torch import Tensor

from ..harness import BenchConfig, Candidate, Case
from .common import input_pair

__all__ = ["CASE_BUILDERS", "GPS_SIZES", "GPSSize", "TC_SIZES", "pyg_cases"]


@dataclass(frozen=True)
class GPSSize:
    """One ``GPSConv`` case: ``graphs`` graphs of ``min_nodes`` to ``max_nodes`` nodes."""

    graphs: int
    min_nodes: int
    max_nodes: int
    channels: int
    heads: int
    degree: int


GPS_SIZES: Mapping[str, GPSSize] = MappingProxyType(
    {
        "full": GPSSize(256, 10, 500, 64, 4, 4),
        "quick": GPSSize(8, 5, 40, 32, 4, 4),
    }
)

PYG_GPS = "PyG GPSConv"
GPS_AUTO = "gnnattn GPSConv (auto)"
GPS_FUSED = "gnnattn GPSConv (fused)"


def skewed_batch(size: GPSSize, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """A sorted ``batch`` vector of skewed graph sizes and ``edge_index`` inside each graph.

    Shapes:
        - **output:** ``batch`` ``[N]``, ``edge_index`` ``[2, N * degree]``
          (``degree`` random sources in its own graph for every node)
    """
    u = torch.rand(size.graphs, generator=gen)
    span = size.max_nodes - size.min_nodes
    sizes = (size.min_nodes + span * u**3).round().long()  # (B,) most graphs small
    batch = torch.repeat_interleave(torch.arange(size.graphs), sizes)  # (N,)
    n = batch.numel()
    starts = torch.cumsum(sizes, 0) - sizes  # (B,)
    dst = torch.arange(n).repeat_interleave(size.degree)  # (N * deg,)
    g = batch[dst]
    offset = (torch.rand(dst.numel(), generator=gen) * sizes[g]).long()
    src = starts[g] + offset
    return batch, torch.stack([src, dst])


def _gps_pair(size: GPSSize, device: torch.device) -> tuple[Any, Any]:
    """PyG's ``GPSConv`` (random nonzero biases) and gnnattn's with its ``state_dict``."""
    import torch_geometric.nn as pyg_nn

    from ...nn import GPSConv

    def local() -> torch.nn.Module:
        c = size.channels
        mlp = torch.nn.Sequential(torch.nn.Linear(c, c), torch.nn.ReLU(), torch.nn.Linear(c, c))
        return pyg_nn.GINConv(mlp)

    ref = pyg_nn.GPSConv(size.channels, local(), heads=size.heads).to(device)
    with torch.no_grad():
        # MultiheadAttention starts with zero biases: nonzero ones show a path that drops one.
        for p in ref.attn.parameters():
            if p.dim() == 1:
                p.normal_(0, 0.1)
    ours = GPSConv(size.channels, local(), heads=size.heads).to(device)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def gps_cases(cfg: BenchConfig, device: torch.device) -> list[Case]:
    """``GPSConv`` on skewed graph sizes: forward (eval) and forward+backward (train)."""
    size = GPS_SIZES["quick" if cfg.quick else "full"]
    gen = torch.Generator().manual_seed(cfg.seed + 20)
    batch, edge_index = skewed_batch(size, gen)
    batch, edge_index = batch.to(device), edge_index.to(device)
    n = batch.numel()
    torch.manual_seed(cfg.seed)
    ref, ours = _gps_pair(size, device)
    lengths = torch.bincount(batch)
    edges = int((lengths**2).sum())
    padded = int(lengths.numel() * int(lengths.max()) ** 2)
    desc = (
        f"GPSConv (GINConv, {size.channels} channels, {size.heads} heads), {size.graphs} graphs "
        f"of {int(lengths.min())}-{int(lengths.max())} nodes (skewed), N={n:,}, attention "
        f"pairs {edges:,} (padded: {padded:,})"
    )
    info: dict[str, Any] = {
        "graphs": size.graphs,
        "num_nodes": n,
        "channels": size.channels,
        "heads": size.heads,
        "attention_pairs": edges,
        "padded_pairs": padded,
        "local_edges": edge_index.shape[1],
    }
    cases = []
    for mode, training in (("fwd", False), ("fwdbwd", True)):
        r, auto = copy.deepcopy(ref).train(training), copy.deepcopy(ours).train(training)
        # The same weights with "fused" as its default backend (GPSConv's call
        # passes its keywords to the local conv, so no per-call override).
        fused = type(ours)(
            size.channels, copy.deepcopy(ours.conv), heads=size.heads, backend="fused"
        )
        fused.load_state_dict(ours.state_dict())
        fused = fused.to(device).train(training)
        x, g = input_pair(n, size.channels, device, gen)
        choice = auto.backend_for(x, batch)

        def call(m: torch.nn.Module) -> Callable[[Tensor], Tensor]:
            return lambda inp: m(inp, edge_index, batch)

        cands = [
            Candidate(PYG_GPS, call(r), note="to_dense_batch: every graph padded to the largest"),
            Candidate(GPS_AUTO, call(auto), note=f"auto took '{choice.backend}' ({choice.reason})"),
            Candidate(GPS_FUSED, call(fused), note="sparse kernel on the graphs' node pairs"),
        ]
        state = "train mode, dropout 0" if training else "eval"
        cases.append(
            Case(
                "pyg",
                f"{desc} ({state})",
                x,
                g,
                PYG_GPS,
                cands,
                [*r.parameters(), *auto.parameters(), *fused.parameters()],
                info,
                modes=(mode,),
            )
        )
    return cases


PYG_TC = "PyG TransformerConv"
TC = "gnnattn TransformerConv (auto)"
#: ``TransformerConv`` cases: nodes, in-edges per node, heads, channels per head.
TC_SIZES: Mapping[str, tuple[int, int, int, int]] = MappingProxyType(
    {"full": (20_000, 32, 4, 32), "quick": (300, 8, 2, 8)}
)
TC_EDGE_DIM = 16


def _call(
    layer: torch.nn.Module, edges: Any, edge_attr: Tensor | None
) -> Callable[[Tensor], Tensor]:
    return lambda x: layer(x, edges, edge_attr)


def transformer_conv_cases(cfg: BenchConfig, device: torch.device) -> list[Case]:
    """``TransformerConv`` with and without ``edge_dim``: forward, forward+backward."""
    import torch_geometric.nn as pyg_nn

    from ...graphs import AttentionGraph
    from ...nn import TransformerConv
    from ...ops import backend_for

    n, deg, heads, c = TC_SIZES["quick" if cfg.quick else "full"]
    gen = torch.Generator().manual_seed(cfg.seed + 30)
    src = torch.randint(0, n, (n * deg,), generator=gen)
    edge_index = torch.stack([src, torch.arange(n).repeat_interleave(deg)]).to(device)
    graph = AttentionGraph(edge_index, n)
    d = heads * c
    cases = []
    for edge_dim in (TC_EDGE_DIM, None):
        torch.manual_seed(cfg.seed)
        ref = pyg_nn.TransformerConv(d, c, heads=heads, edge_dim=edge_dim).to(device)
        ours = TransformerConv(d, c, heads=heads, edge_dim=edge_dim).to(device)
        ours.load_state_dict(ref.state_dict())
        ea = None
        if edge_dim is not None:
            ea = torch.randn(edge_index.shape[1], edge_dim, generator=gen).to(device)
        x, g = input_pair(n, d, device, gen)
        q = x.new_empty(0, heads, c)
        choice = backend_for(q, graph, edge_attr=ea is not None)
        note = f"auto took '{choice.backend}' ({choice.reason})"
        cands = [
            Candidate(PYG_TC, _call(ref, edge_index, ea)),
            Candidate(TC, _call(ours, graph, ea), note=note),
        ]
        desc = (
            f"TransformerConv ({d} in, {heads} heads x {c}, edge_dim {edge_dim}), N={n:,}, "
            f"{deg} in-edges per node, |E|={edge_index.shape[1]:,}"
        )
        info = {"num_nodes": n, "num_edges": edge_index.shape[1], "edge_dim": edge_dim}
        params = [*ref.parameters(), *ours.parameters()]
        cases.append(Case("pyg", desc, x, g, PYG_TC, cands, params, info))
    return cases


#: The builders of the suite's cases, in the order they run.
CASE_BUILDERS: tuple[Callable[[BenchConfig, torch.device], list[Case]], ...] = (
    gps_cases,
    transformer_conv_cases,
)


def pyg_cases(cfg: BenchConfig, device: torch.device) -> list[Case]:
    """Every case of the suite, from each builder of :data:`CASE_BUILDERS`."""
    return [case for build in CASE_BUILDERS for case in build(cfg, device)]
