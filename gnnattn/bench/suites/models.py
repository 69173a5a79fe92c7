"""The ``models`` suite: models built on the graph object.

* ``GraphTransformer`` (from ``nn.TransformerEncoder`` weights) against the
  encoder itself, with the graph built from ``batch`` on every call and built
  once;
* causal pruning: a causal layer on a complete ``edge_index`` (pruned on every
  call), on an ``AttentionGraph`` of it (pruned once), and on the causal graph.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import torch
from torch import Tensor

from ..harness import BenchConfig, Candidate, Case
from .common import attention_layer, input_pair
from .dense import SIZES as DENSE_SIZES

__all__ = ["SIZES", "model_cases"]

# GraphTransformer vs nn.TransformerEncoder: (sequences, tokens, embed, heads, layers)
SIZES: Mapping[str, tuple[int, int, int, int, int]] = MappingProxyType(
    {
        "full": (16, 128, 64, 4, 2),
        "quick": (4, 32, 32, 4, 2),
    }
)


def model_cases(cfg: BenchConfig, device: torch.device) -> list[Case]:
    """The transformer stack, and causal pruning (forward only)."""
    gen = torch.Generator().manual_seed(cfg.seed + 4)
    return [_transformer_case(cfg, device, gen), _causal_case(cfg, device, gen)]


def _transformer_case(cfg: BenchConfig, device: torch.device, gen: torch.Generator) -> Case:
    """``GraphTransformer`` against the ``nn.TransformerEncoder`` it was made from."""
    from ...graphs import AttentionGraph
    from ...nn import GraphTransformer

    b, t, d, h, num_layers = SIZES["quick" if cfg.quick else "full"]
    torch.manual_seed(cfg.seed)
    enc_layer = torch.nn.TransformerEncoderLayer(
        d, h, 4 * d, 0.0, batch_first=True, norm_first=True
    )
    encoder = torch.nn.TransformerEncoder(
        enc_layer, num_layers, norm=torch.nn.LayerNorm(d), enable_nested_tensor=False
    )
    encoder = encoder.to(device).eval()
    model = GraphTransformer.from_torch(encoder).to(device).eval()
    batch = torch.arange(b, device=device).repeat_interleave(t)  # (B*T,)
    graph = AttentionGraph.from_batch(batch)
    x, g = input_pair(b * t, d, device, gen)

    def torch_fn(x: Tensor) -> Tensor:
        return encoder(x.view(b, t, d)).reshape(b * t, d)  # (B*T, D)

    info: dict[str, Any] = {
        "sequences": b,
        "tokens": t,
        "embed_dim": d,
        "heads": h,
        "layers": num_layers,
    }
    return Case(
        "models",
        f"GraphTransformer vs nn.TransformerEncoder, {b} x {t} tokens, embed {d}, "
        f"{h} heads, {num_layers} layers (eval)",
        x,
        g,
        "nn.TransformerEncoder",
        [
            Candidate("nn.TransformerEncoder", torch_fn),
            Candidate(
                "GraphTransformer(x, batch=batch)",
                lambda x: model(x, batch=batch),
                note="graph object built from batch on every call",
            ),
            Candidate(
                "GraphTransformer(x, graph)",
                lambda x: model(x, graph),
                note="AttentionGraph.from_batch built once",
            ),
        ],
        [*encoder.parameters(), *model.parameters()],
        info,
        modes=("fwd",),
    )


def _causal_case(cfg: BenchConfig, device: torch.device, gen: torch.Generator) -> Case:
    """A causal layer on a complete ``edge_index`` (pruned per call), on a graph
    object of it (pruned once) and on the causal graph."""
    from ...graphs import AttentionGraph, causal_graph, complete_graph

    dense = DENSE_SIZES["quick" if cfg.quick else "full"]
    t, d, h = dense["seq"], dense["dim"], dense["heads"]
    torch.manual_seed(cfg.seed)
    layer = attention_layer(d, h, device, causal=True)
    x, g = input_pair(t, d, device, gen)
    complete_ei = complete_graph(t, device=device)
    causal_ei = causal_graph(t, device=device)
    complete_obj = AttentionGraph(complete_ei)
    # Built once, on the case's device, as the baseline's causal_ei is: the row times
    # the layer on the structured graph, not the graph's build.
    causal_obj = AttentionGraph.causal(t, device=device)
    return Case(
        "models",
        f"SelfAttentionConv(causal=True), T={t}, embed {d}, {h} heads",
        x,
        g,
        "layer(x, causal_graph(T))",
        [
            Candidate("layer(x, causal_graph(T))", lambda x: layer(x, causal_ei)),
            Candidate(
                "layer(x, complete edge_index)",
                lambda x: layer(x, complete_ei),
                note="pruned to j <= i and analysed on every call",
            ),
            Candidate(
                "layer(x, AttentionGraph(complete edge_index))",
                lambda x: layer(x, complete_obj),
                note="object built once: its causal view is pruned once, then kept",
            ),
            Candidate(
                "layer(x, AttentionGraph.causal(T))",
                lambda x: layer(x, causal_obj),
                note="object built once",
            ),
        ],
        list(layer.parameters()),
        {"T": t, "embed_dim": d, "heads": h},
        modes=("fwd",),
    )
