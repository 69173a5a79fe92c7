"""The dense suites: ``complete`` (several T), ``causal``, and ``edge_index`` (the
complete graph handed over as a plain edge set, so its structure must be detected).

Baseline: ``nn.MultiheadAttention`` with the layer's weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import torch

from ... import peers
from ..harness import BenchConfig, Candidate, Case
from .common import (
    attention_layer,
    edge_skip,
    flex,
    has_compiled_kernels,
    input_pair,
    mha,
    transformer_conv,
    with_backend,
)

__all__ = ["SIZES", "causal_cases", "complete_cases", "edge_index_cases"]

SIZES: Mapping[str, dict[str, Any]] = MappingProxyType(
    {
        "full": {"complete": [256, 1024, 4096], "seq": 1024, "dim": 512, "heads": 8},
        "quick": {"complete": [64, 128], "seq": 128, "dim": 64, "heads": 4},
    }
)

_REFERENCE_NOTE = "reference kernel (no compiled CPU kernel)"


def _sizes(cfg: BenchConfig, device: torch.device) -> dict[str, Any]:
    sizes = SIZES["quick" if cfg.quick else "full"]
    if device.type == "cuda" and not cfg.quick:
        # The GPU affords longer sequences for the dense paths.
        sizes = {**sizes, "complete": [*sizes["complete"], 16384]}
    return sizes


def _dense_case(
    cfg: BenchConfig, suite: str, t: int, d: int, h: int, device: torch.device, gen: torch.Generator
) -> Case:
    from ...graphs import causal_graph, complete_graph

    causal = suite == "causal"
    compiled = has_compiled_kernels(device)
    torch.manual_seed(cfg.seed)
    layer = attention_layer(d, h, device, causal=causal)
    x, g = input_pair(t, d, device, gen)
    num_edges = t * (t + 1) // 2 if causal else t * t
    torch_mha, mha_fn = mha(layer, causal, t)
    big = edge_skip(num_edges, d, cfg)
    cands = [
        Candidate("nn.MultiheadAttention", mha_fn),
        Candidate("F.sdpa [1,H,T,C] (+proj)", peers.sdpa(layer, t, causal=causal)),
        Candidate("gnnattn auto: layer(x)", with_backend(layer, "auto")),
        Candidate("gnnattn sdpa: layer(x)", with_backend(layer, "sdpa")),
        Candidate(
            "gnnattn fused: layer(x)",
            with_backend(layer, "fused"),
            skip=None if compiled else big,
            note="" if compiled else _REFERENCE_NOTE,
        ),
        Candidate("gnnattn mp: layer(x)", with_backend(layer, "mp"), skip=big),
        flex(layer, causal, t, device),
    ]
    params = list(layer.parameters()) + list(torch_mha.parameters())
    if big is None:
        ei = causal_graph(t, device=device) if causal else complete_graph(t, device=device)
        conv, conv_fn = transformer_conv(layer, ei)
        cands.append(Candidate("PyG TransformerConv (+out proj)", conv_fn))
        params += list(conv.parameters())
    else:
        cands.append(Candidate("PyG TransformerConv (+out proj)", skip=big))
    return Case(
        suite,
        f"T={t}, embed {d}, {h} heads, |E|={num_edges:,}",
        x,
        g,
        "nn.MultiheadAttention",
        cands,
        params,
        {"T": t, "embed_dim": d, "heads": h, "num_edges": num_edges},
    )


def complete_cases(cfg: BenchConfig, device: torch.device) -> list[Case]:
    """``layer(x)`` on the complete graph, several sequence lengths."""
    sizes = _sizes(cfg, device)
    gen = torch.Generator().manual_seed(cfg.seed)
    d, h = sizes["dim"], sizes["heads"]
    return [_dense_case(cfg, "complete", t, d, h, device, gen) for t in sizes["complete"]]


def causal_cases(cfg: BenchConfig, device: torch.device) -> list[Case]:
    """``layer(x)`` with ``causal=True``."""
    sizes = _sizes(cfg, device)
    gen = torch.Generator().manual_seed(cfg.seed + 5)
    return [_dense_case(cfg, "causal", sizes["seq"], sizes["dim"], sizes["heads"], device, gen)]


def edge_index_cases(cfg: BenchConfig, device: torch.device) -> list[Case]:
    """The complete graph given as a plain ``edge_index``: structure has to be detected."""
    from ...graphs import AttentionGraph, complete_graph

    sizes = _sizes(cfg, device)
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    t, d, h = sizes["seq"], sizes["dim"], sizes["heads"]
    torch.manual_seed(cfg.seed)
    layer = attention_layer(d, h, device)
    x, g = input_pair(t, d, device, gen)
    ei = complete_graph(t, device=device)
    graph = AttentionGraph(ei)
    torch_mha, mha_fn = mha(layer, False, t)
    compiled = has_compiled_kernels(device)
    big = edge_skip(t * t, d, cfg)
    cands = [
        Candidate("nn.MultiheadAttention", mha_fn),
        Candidate(
            "gnnattn auto: layer(x, ei)",
            with_backend(layer, "auto", ei),
            note="plain edge_index: validated and analysed on every call",
        ),
        Candidate(
            "gnnattn auto: layer(x, graph)",
            with_backend(layer, "auto", graph),
            note="AttentionGraph(ei) built once, outside the timing",
        ),
        Candidate("gnnattn auto: layer(x)", with_backend(layer, "auto")),
        Candidate("gnnattn sdpa: layer(x, graph)", with_backend(layer, "sdpa", graph)),
        Candidate(
            "gnnattn fused: layer(x, graph)",
            with_backend(layer, "fused", graph),
            skip=None if compiled else big,
            note="" if compiled else _REFERENCE_NOTE,
        ),
        Candidate("gnnattn mp: layer(x, graph)", with_backend(layer, "mp", graph), skip=big),
    ]
    return [
        Case(
            "edge_index",
            f"complete graph as edge_index, T={t}, embed {d}, {h} heads, |E|={t * t:,}",
            x,
            g,
            "nn.MultiheadAttention",
            cands,
            list(layer.parameters()) + list(torch_mha.parameters()),
            {"T": t, "embed_dim": d, "heads": h, "num_edges": t * t},
        )
    ]
