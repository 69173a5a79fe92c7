"""Building blocks the suites share: layers with nonzero biases, the peers as
candidates, inputs, random and kNN graphs.

The peers themselves (``nn.MultiheadAttention``, raw SDPA, FlexAttention,
PyG ``TransformerConv`` and ``utils.softmax``, each with gnnattn's weights)
are written once, in :mod:`gnnattn.peers`, for the bench and for
:mod:`gnnattn.compare`; here they become :class:`~gnnattn.bench.harness.Candidate`
objects.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ... import peers
from ..harness import BenchConfig, Candidate

__all__ = [
    "attention_layer",
    "edge_skip",
    "flex",
    "fused_alone",
    "has_compiled_kernels",
    "input_pair",
    "knn_graph",
    "mha",
    "random_graph",
    "random_points",
    "transformer_conv",
    "with_backend",
]


def has_compiled_kernels(device: torch.device) -> bool:
    """Whether ``device`` has compiled fused kernels (numba on the CPU, Triton on CUDA)."""
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
    """``layer(x, graph, backend=backend)``: the backend chosen for this call only (the
    layer is shared by the candidates and never changed); ``graph`` is an
    ``AttentionGraph`` (built once, by the case) or a plain ``edge_index``
    (analysed on every call)."""

    def fn(x: Tensor) -> Tensor:
        return layer(x, graph, backend=backend)

    return fn


def mha(layer: Any, causal: bool, t: int) -> tuple[Any, Callable[[Tensor], Tensor]]:
    """``nn.MultiheadAttention`` with the layer's weights, and a call on ``[T, D]``."""
    module, fn = peers.mha(layer, t, causal=causal)
    return module, lambda x: fn(x)[0]


def transformer_conv(layer: Any, edge_index: Tensor) -> tuple[Any, Callable[[Tensor], Tensor]]:
    """PyG ``TransformerConv`` with gnnattn's weights, followed by gnnattn's output projection."""
    return peers.transformer_conv(layer, edge_index)


def flex(layer: Any, causal: bool, t: int, device: torch.device) -> Candidate:
    """FlexAttention with a block mask between the layer's projections, where it exists."""
    name = "flex_attention (block mask, eager)" if device.type == "cpu" else "flex_attention"
    try:
        fn = peers.flex(layer, t, causal=causal)
    except peers.PeerUnavailable as err:
        return Candidate(name, skip=f"unavailable ({err})")
    note = "no torch.compile: materializes the scores" if device.type == "cpu" else ""
    return Candidate(name, fn, note=note)


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
    """``gnnattn.attention(..., backend="fused")`` between the layer's projections: the
    operator with no layer plumbing."""
    from ...ops import attention

    def fn(x: Tensor) -> Tensor:
        q, k, v = peers.split_heads(layer, x)  # (N, H, C)
        out = attention(q, k, v, graph, scale=layer.scale, backend="fused")
        assert isinstance(out, Tensor)
        return peers.merge_heads(layer, out)  # (N, D)

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


def random_points(n: int, gen: torch.Generator) -> Tensor:
    """``[n, 3]`` float64 points, uniform in the unit cube (in no particular order)."""
    return torch.rand(n, 3, generator=gen, dtype=torch.float64)


def knn_graph(pos: Tensor, k: int) -> Tensor:
    """``j -> i`` for the ``k`` nearest points ``j`` of each point ``i`` (itself included).

    ``[2, n * k]`` int64, grouped by target; found with ``scipy.spatial.cKDTree``.
    """
    from scipy.spatial import cKDTree

    pts = pos.detach().cpu().double().numpy()
    _, nbr = cKDTree(pts).query(pts, k=k)
    src = torch.from_numpy(nbr.reshape(-1)).long()
    dst = torch.arange(pos.shape[0]).repeat_interleave(k)
    return torch.stack([src, dst])
