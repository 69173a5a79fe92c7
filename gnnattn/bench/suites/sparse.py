"""The ``sparse`` suite: a random graph, every node with the same in-degree.

Baseline: PyG ``TransformerConv`` with the layer's weights (it makes ``|E| x D``
tensors; at N = 20000, 32 in-edges, embed 128 each is 330 MB).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import torch

from ..harness import BenchConfig, Candidate, Case
from .common import (
    attention_layer,
    fused_alone,
    has_compiled_kernels,
    input_pair,
    random_graph,
    transformer_conv,
    with_backend,
)

__all__ = ["SIZES", "sparse_cases"]

# (nodes, in-degree, embed, heads)
SIZES: Mapping[str, tuple[int, int, int, int]] = MappingProxyType(
    {
        "full": (20000, 32, 128, 4),
        "quick": (1000, 8, 32, 4),
    }
)


def sparse_cases(cfg: BenchConfig, device: torch.device) -> list[Case]:
    """The layer on a random graph, every backend, against TransformerConv."""
    from ...graphs import AttentionGraph

    gen = torch.Generator().manual_seed(cfg.seed + 2)
    n, deg, d, h = SIZES["quick" if cfg.quick else "full"]
    torch.manual_seed(cfg.seed)
    layer = attention_layer(d, h, device)
    x, g = input_pair(n, d, device, gen)
    ei = random_graph(n, deg, gen).to(device)
    graph = AttentionGraph(ei, n)
    conv, conv_fn = transformer_conv(layer, ei)
    compiled = has_compiled_kernels(device)
    ref_note = "" if compiled else "reference kernel (no compiled CPU kernel)"
    cands = [
        Candidate("PyG TransformerConv (+out proj)", conv_fn),
        Candidate(
            "gnnattn auto: layer(x, graph)",
            with_backend(layer, "auto", graph),
            note="AttentionGraph built once, outside the timing",
        ),
        Candidate(
            "gnnattn auto: layer(x, ei)",
            with_backend(layer, "auto", ei),
            note="plain edge_index: validated and analysed on every call",
        ),
        Candidate(
            "gnnattn fused operator alone (+proj)",
            fused_alone(layer, graph),
            note="projections + gnnattn.attention(backend='fused'): the layer without its plumbing",
        ),
        Candidate(
            "gnnattn fused: layer(x, graph)", with_backend(layer, "fused", graph), note=ref_note
        ),
        Candidate("gnnattn mp: layer(x, graph)", with_backend(layer, "mp", graph)),
    ]
    info: dict[str, Any] = {
        "num_nodes": n,
        "in_degree": deg,
        "embed_dim": d,
        "heads": h,
        "num_edges": n * deg,
    }
    return [
        Case(
            "sparse",
            f"random graph N={n:,}, {deg} in-edges each, embed {d}, {h} heads, |E|={n * deg:,}",
            x,
            g,
            "PyG TransformerConv (+out proj)",
            cands,
            list(layer.parameters()) + list(conv.parameters()),
            info,
        )
    ]
