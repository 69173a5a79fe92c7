"""Building blocks the suites share: layers with nonzero biases, the peers with
gnnattn's weights, inputs, random graphs.

The peers compute gnnattn's operator with gnnattn's weights:

* ``torch.nn.MultiheadAttention`` (from :meth:`SelfAttentionConv.to_torch`,
  ``batch_first=True``, ``need_weights=False``) and raw
  :func:`torch.nn.functional.scaled_dot_product_attention` on ``[1, H, T, C]``
  between the same four projections;
* FlexAttention with a block mask, where it exists. On the CPU it runs eagerly
  (no ``torch.compile``), which materializes the score matrix: a floor for
  "what a block mask buys without a compiler", not FlexAttention's best;
* PyG ``TransformerConv`` (``heads=H, out_channels=C, concat=True,
  root_weight=False``) with gnnattn's query/key/value weights copied in and
  gnnattn's output projection applied after it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..harness import BenchConfig, Candidate

__all__ = [
    "attention_layer",
    "edge_skip",
    "flex",
    "fused_alone",
    "has_compiled_kernels",
    "input_pair",
    "mha",
    "projected",
    "random_graph",
    "transformer_conv",
    "with_backend",
]


def has_compiled_kernels(device: torch.device) -> bool:
    from ... import kernels

    return kernels.get(device) is not kernels.reference


def attention_layer(d: int, h: int, device: torch.device, causal: bool = False) -> Any:
    """A ``SelfAttentionConv`` in eval mode with nonzero biases (so a path that
    drops one shows in the diff column)."""
    from ...nn import SelfAttentionConv

    layer = SelfAttentionConv(d, num_heads=h, causal=causal).to(device).eval()
    with torch.no_grad():
        for lin in (layer.lin_query, layer.lin_key, layer.lin_value, layer.lin_out):
            lin.bias.normal_(0, 0.1)
    return layer


def with_backend(layer: Any, backend: str, graph: Any = None) -> Callable[[Tensor], Tensor]:
    """``layer(x, graph)`` on ``backend``; ``graph`` is an ``AttentionGraph`` (built
    once, by the case) or a plain ``edge_index`` (analysed on every call)."""

    def fn(x: Tensor) -> Tensor:
        layer.backend = backend
        return layer(x, graph)

    return fn


def projected(
    layer: Any, attend: Callable[[Tensor, Tensor, Tensor], Tensor]
) -> Callable[[Tensor], Tensor]:
    """``attend`` on ``[1, H, T, C]`` between gnnattn's own projections."""
    h, c, d = layer.num_heads, layer.head_dim, layer.embed_dim

    def fn(x: Tensor) -> Tensor:
        t = x.shape[0]
        q = layer.lin_query(x).view(1, t, h, c).transpose(1, 2)  # (1, H, T, C)
        k = layer.lin_key(x).view(1, t, h, c).transpose(1, 2)  # (1, H, T, C)
        v = layer.lin_value(x).view(1, t, h, c).transpose(1, 2)  # (1, H, T, C)
        o = attend(q, k, v)  # (1, H, T, C)
        return layer.lin_out(o.transpose(1, 2).reshape(t, d))  # (T, D)

    return fn


def mha(layer: Any, causal: bool, t: int, device: torch.device) -> tuple[Any, Callable]:
    """``nn.MultiheadAttention`` with the layer's weights, and a call on ``[T, D]``."""
    module = layer.to_torch(batch_first=True).eval()
    mask = None
    if causal:
        # MultiheadAttention takes is_causal only as a hint next to a mask.
        mask = torch.ones(t, t, dtype=torch.bool, device=device).triu(1)

    def fn(x: Tensor) -> Tensor:
        xb = x.unsqueeze(0)  # (1, T, D)
        out = module(xb, xb, xb, need_weights=False, attn_mask=mask, is_causal=causal)[0]
        return out[0]

    return module, fn


def transformer_conv(layer: Any, edge_index: Tensor, device: torch.device) -> tuple[Any, Callable]:
    """PyG TransformerConv with gnnattn's weights, followed by gnnattn's output projection."""
    from torch_geometric.nn import TransformerConv

    h, c, d = layer.num_heads, layer.head_dim, layer.embed_dim
    conv = TransformerConv(d, c, heads=h, concat=True, root_weight=False).to(device).eval()
    with torch.no_grad():
        for name in ("lin_query", "lin_key", "lin_value"):
            ours, theirs = getattr(layer, name), getattr(conv, name)
            theirs.weight.copy_(ours.weight)
            theirs.bias.copy_(ours.bias)

    def fn(x: Tensor) -> Tensor:
        return layer.lin_out(conv(x, edge_index))

    return conv, fn


def flex(layer: Any, causal: bool, t: int, device: torch.device) -> Candidate:
    """FlexAttention with a block mask between the layer's projections, where it exists."""
    name = "flex_attention (block mask, eager)" if device.type == "cpu" else "flex_attention"
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError as err:
        return Candidate(name, skip=f"unavailable ({err})")

    def mask_mod(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx if causal else q_idx >= 0

    try:
        block_mask = create_block_mask(mask_mod, None, None, t, t, device=str(device))
    except Exception as err:  # noqa: BLE001 - any failure means: not available here
        return Candidate(name, skip=f"unavailable ({type(err).__name__})")
    scale = layer.scale

    def attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return flex_attention(q, k, v, block_mask=block_mask, scale=scale)  # type: ignore[return-value]

    note = "no torch.compile: materializes the scores" if device.type == "cpu" else ""
    return Candidate(name, projected(layer, attend), note=note)


def input_pair(n: int, d: int, device: torch.device, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """``x`` (a leaf that requires grad) and the upstream gradient, ``[n, d]`` each."""
    x = torch.randn(n, d, generator=gen).to(device).requires_grad_()
    g = torch.randn(n, d, generator=gen).to(device)
    return x, g


def edge_skip(num_edges: int, d: int, cfg: BenchConfig) -> str | None:
    """Why a candidate that makes ``|E| x D`` tensors is not run, or ``None``."""
    if num_edges * d > cfg.max_edge_floats:
        gib = num_edges * d * 4 / 2**30
        return f"skipped (memory): |E| x D = {gib:.0f} GiB per tensor"
    return None


def fused_alone(layer: Any, graph: Any) -> Callable[[Tensor], Tensor]:
    """The fused operator between the layer's projections, with no layer plumbing."""
    from ...ops import fused_attention

    h, c, d = layer.num_heads, layer.head_dim, layer.embed_dim

    def fn(x: Tensor) -> Tensor:
        n = x.shape[0]
        q = layer.lin_query(x).view(n, h, c)  # (N, H, C)
        k = layer.lin_key(x).view(n, h, c)  # (N, H, C)
        v = layer.lin_value(x).view(n, h, c)  # (N, H, C)
        out, _ = fused_attention(q, k, v, graph, layer.scale)
        return layer.lin_out(out.reshape(n, d))  # (N, D)

    return fn


def random_graph(n: int, deg: int, gen: torch.Generator) -> Tensor:
    """``[2, n * deg]`` int64: every node gets ``deg`` in-edges from uniform random sources.

    Grouped by target (as the builders and PyG's sorted ``edge_index`` are),
    sources in random order within a target; duplicate edges are allowed and
    rare, and every implementation treats them as separate edges.
    """
    src = torch.randint(0, n, (n * deg,), generator=gen)
    dst = torch.arange(n).repeat_interleave(deg)
    return torch.stack([src, dst])
