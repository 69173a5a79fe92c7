r"""The benchmark suite behind ``gnnattn bench``.

Every case runs gnnattn's backends and the peers it has to keep up with *in one
process, on the same inputs and the same weights*:

* ``torch.nn.MultiheadAttention`` (from :meth:`SelfAttentionConv.to_torch`,
  ``batch_first=True``, ``need_weights=False``) and raw
  :func:`torch.nn.functional.scaled_dot_product_attention` on ``[1, H, T, C]``
  (with the same four projections around it, so it is the same operator);
* FlexAttention with a block mask, where ``torch.nn.attention.flex_attention``
  exists. On the CPU it runs eagerly (no ``torch.compile``), which
  materializes the score matrix: a floor for "what a block mask buys without
  a compiler", not FlexAttention's best;
* PyG ``TransformerConv`` (``heads=H, out_channels=C, concat=True,
  root_weight=False``) with gnnattn's query/key/value weights copied in and
  gnnattn's output projection applied after it, so it computes the same
  operator;
* PyG ``torch_geometric.utils.softmax`` (with ``index`` and with ``ptr``) for
  the segment-softmax suite.

How it measures:

* **Interleaved repetitions.** Each repetition runs every candidate once,
  round-robin (the starting candidate rotates), so a noisy neighbour or a
  frequency change hits all candidates alike; the table shows medians and the
  ratio of each median to the case's named baseline. One untimed warm-up call
  per candidate comes first (numba compiles, caches fill).
* **Forward** runs under ``torch.no_grad()`` (inference; MHA takes its fast
  path there). **Forward+backward** times the forward and ``backward`` of a
  fixed upstream gradient with respect to the input and all weights.
* **Correctness.** Every row reports the max abs difference of its output
  (forward) or of the gradient of the input (forward+backward) against the
  baseline's, so a fast but wrong path shows.
* **Peak memory.** On CUDA, ``torch.cuda.max_memory_allocated`` over one call,
  minus what was allocated before it. On the CPU, one extra call under
  ``torch.profiler.profile(profile_memory=True)``: the allocator's
  allocation/free events are replayed in time order and the peak of the
  running sum is reported. Both count the bytes of torch tensors allocated
  during the call above what was live before it (inputs and weights are not
  counted); memory that a kernel allocates outside torch's allocator (numba
  scratch arrays, MKL/oneDNN workspaces) is *not* seen, and neither is
  allocator caching or fragmentation. It is a like-for-like tensor footprint,
  not the process's resident set.
* Candidates that would materialize ``|E| x D`` tensors beyond
  ``--max-edge-floats`` (the message-passing path, TransformerConv, and the
  fused backend while it runs through the pure-torch reference kernel) are
  not run: the table says ``skipped (memory)``.

The figures depend on the machine; ``--json`` stores them together with the
CPU model, thread count and library versions, which is how a figure should be
quoted.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["SUITES", "BenchConfig", "machine_info", "main", "run"]

SUITES = ("complete", "causal", "edge_index", "sparse", "softmax", "models")
MODES = ("fwd", "fwdbwd")
_MODE_LABEL = {"fwd": "forward", "fwdbwd": "forward+backward"}


@dataclass
class BenchConfig:
    """What to run and how.

    Attributes:
        device: ``"cpu"`` or ``"cuda"``.
        quick: tiny sizes for a smoke run.
        threads: ``torch.set_num_threads`` (and numba's) on the CPU.
        suites: which suites to run, in :data:`SUITES` order.
        min_reps / max_reps: bounds on the interleaved repetitions.
        budget_s: target seconds of timed repetitions per case and mode; the
            number of repetitions is ``budget_s / (one round)``, clamped.
        max_call_s: a candidate whose warm-up call takes longer gets one
            timed repetition (in the first round), not ``reps``.
        max_edge_floats: skip candidates that would hold more than this many
            ``|E| x D`` floats in one tensor.
        memory: measure peak memory (one extra call per candidate).
        seed: for inputs and weights.
    """

    device: str = "cpu"
    quick: bool = False
    threads: int = 2
    suites: tuple[str, ...] = SUITES
    min_reps: int = 3
    max_reps: int = 15
    budget_s: float = 20.0
    max_call_s: float = 10.0
    max_edge_floats: int = 1 << 29
    memory: bool = True
    seed: int = 0


# Sizes: the cases; --quick shrinks them to a smoke run.
_SIZES: dict[str, dict[str, Any]] = {
    "full": {
        "complete": [256, 1024, 4096],
        "seq": 1024,
        "dim": 512,
        "heads": 8,
        "sparse": (20000, 32, 128, 4),
        "softmax": (10_000_000, 4, 32),
        # GraphTransformer vs nn.TransformerEncoder: (sequences, tokens, embed, heads, layers)
        "model": (16, 128, 64, 4, 2),
    },
    "quick": {
        "complete": [64, 128],
        "seq": 128,
        "dim": 64,
        "heads": 4,
        "sparse": (1000, 8, 32, 4),
        "softmax": (100_000, 4, 32),
        "model": (4, 32, 32, 4, 2),
    },
}


# --------------------------------------------------------------------------- cases


@dataclass
class Candidate:
    """One implementation in a case: ``fn(x) -> output``."""

    name: str
    fn: Callable[[Tensor], Tensor] | None = None
    skip: str | None = None
    note: str = ""


@dataclass
class Case:
    """One input size of a suite, with its candidates and the baseline they are compared to.

    ``x`` is the tensor the gradient is taken with respect to (a leaf with
    ``requires_grad``); ``grad`` the upstream gradient used in backward;
    ``params`` every weight whose ``.grad`` must be cleared between calls.
    ``tag`` marks the case a target of the issue refers to.
    """

    suite: str
    name: str
    x: Tensor
    grad: Tensor
    baseline: str
    candidates: list[Candidate]
    params: list[Tensor] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    tag: str | None = None
    modes: tuple[str, ...] = MODES


def _has_compiled_kernels(device: torch.device) -> bool:
    from . import kernels

    return kernels.get(device) is not kernels.reference


def _attention_layer(d: int, h: int, device: torch.device, causal: bool = False):
    from .nn import SelfAttentionConv

    layer = SelfAttentionConv(d, num_heads=h, causal=causal).to(device).eval()
    # Nonzero biases, so that a path that drops one shows in the diff column.
    with torch.no_grad():
        for lin in (layer.lin_query, layer.lin_key, layer.lin_value, layer.lin_out):
            lin.bias.normal_(0, 0.1)
    return layer


def _with_backend(layer, backend: str, graph: Any = None):
    """``layer(x, graph)`` on ``backend``; ``graph`` is an ``AttentionGraph`` (built
    once, by the case) or a plain ``edge_index`` (analysed on every call)."""

    def fn(x: Tensor) -> Tensor:
        layer.backend = backend
        return layer(x, graph)

    return fn


def _projected(layer, attend: Callable[[Tensor, Tensor, Tensor], Tensor]):
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


def _mha(layer, causal: bool, t: int, device: torch.device):
    mha = layer.to_torch(batch_first=True).eval()
    mask = None
    if causal:
        # MultiheadAttention takes is_causal only as a hint next to a mask.
        mask = torch.ones(t, t, dtype=torch.bool, device=device).triu(1)

    def fn(x: Tensor) -> Tensor:
        xb = x.unsqueeze(0)  # (1, T, D)
        out = mha(xb, xb, xb, need_weights=False, attn_mask=mask, is_causal=causal)[0]
        return out[0]

    return mha, fn


def _transformer_conv(layer, edge_index: Tensor, device: torch.device):
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


def _flex(layer, causal: bool, t: int, device: torch.device) -> Candidate:
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
        return flex_attention(q, k, v, block_mask=block_mask, scale=scale)

    note = "no torch.compile: materializes the scores" if device.type == "cpu" else ""
    return Candidate(name, _projected(layer, attend), note=note)


def _input(n: int, d: int, device: torch.device, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    x = torch.randn(n, d, generator=gen).to(device).requires_grad_()
    g = torch.randn(n, d, generator=gen).to(device)
    return x, g


def _edge_skip(num_edges: int, d: int, cfg: BenchConfig) -> str | None:
    if num_edges * d > cfg.max_edge_floats:
        gib = num_edges * d * 4 / 2**30
        return f"skipped (memory): |E| x D = {gib:.0f} GiB per tensor"
    return None


def _dense_cases(cfg: BenchConfig, sizes: dict[str, Any], device: torch.device) -> list[Case]:
    """The complete suite (several T) and the causal suite."""
    from .graphs import causal_graph, complete_graph

    gen = torch.Generator().manual_seed(cfg.seed)
    d, h = sizes["dim"], sizes["heads"]
    compiled = _has_compiled_kernels(device)
    cases = []
    runs: list[tuple[str, int]] = []
    if "complete" in cfg.suites:
        runs += [("complete", t) for t in sizes["complete"]]
    if "causal" in cfg.suites:
        runs.append(("causal", sizes["seq"]))
    for suite, t in runs:
        causal = suite == "causal"
        torch.manual_seed(cfg.seed)
        layer = _attention_layer(d, h, device, causal=causal)
        x, g = _input(t, d, device, gen)
        num_edges = t * (t + 1) // 2 if causal else t * t
        mha, mha_fn = _mha(layer, causal, t, device)
        big = _edge_skip(num_edges, d, cfg)
        cands = [
            Candidate("nn.MultiheadAttention", mha_fn),
            Candidate(
                "F.sdpa [1,H,T,C] (+proj)",
                _projected(
                    layer,
                    functools.partial(
                        F.scaled_dot_product_attention, is_causal=causal, scale=layer.scale
                    ),
                ),
            ),
            Candidate("gnnattn auto: layer(x)", _with_backend(layer, "auto")),
            Candidate("gnnattn sdpa: layer(x)", _with_backend(layer, "sdpa")),
            Candidate(
                "gnnattn fused: layer(x)",
                _with_backend(layer, "fused"),
                skip=None if compiled else big,
                note="" if compiled else "reference kernel (no compiled CPU kernel)",
            ),
            Candidate("gnnattn mp: layer(x)", _with_backend(layer, "mp"), skip=big),
            _flex(layer, causal, t, device),
        ]
        params = list(layer.parameters()) + list(mha.parameters())
        if big is None:
            ei = causal_graph(t, device=device) if causal else complete_graph(t, device=device)
            conv, conv_fn = _transformer_conv(layer, ei, device)
            cands.append(Candidate("PyG TransformerConv (+out proj)", conv_fn))
            params += list(conv.parameters())
        else:
            cands.append(Candidate("PyG TransformerConv (+out proj)", skip=big))
        tag = None
        if t == sizes["seq"]:
            tag = suite
        cases.append(
            Case(
                suite,
                f"T={t}, embed {d}, {h} heads, |E|={num_edges:,}",
                x,
                g,
                "nn.MultiheadAttention",
                cands,
                params,
                {"T": t, "embed_dim": d, "heads": h, "num_edges": num_edges},
                tag,
            )
        )
    return cases


def _edge_index_case(cfg: BenchConfig, sizes: dict[str, Any], device: torch.device) -> Case:
    """The complete graph given as a plain ``edge_index``: structure has to be detected."""
    from .graphs import AttentionGraph, complete_graph

    gen = torch.Generator().manual_seed(cfg.seed + 1)
    t, d, h = sizes["seq"], sizes["dim"], sizes["heads"]
    torch.manual_seed(cfg.seed)
    layer = _attention_layer(d, h, device)
    x, g = _input(t, d, device, gen)
    ei = complete_graph(t, device=device)
    graph = AttentionGraph(ei)
    mha, mha_fn = _mha(layer, False, t, device)
    compiled = _has_compiled_kernels(device)
    big = _edge_skip(t * t, d, cfg)
    cands = [
        Candidate("nn.MultiheadAttention", mha_fn),
        Candidate(
            "gnnattn auto: layer(x, ei)",
            _with_backend(layer, "auto", ei),
            note="plain edge_index: validated and analysed on every call",
        ),
        Candidate(
            "gnnattn auto: layer(x, graph)",
            _with_backend(layer, "auto", graph),
            note="AttentionGraph(ei) built once, outside the timing",
        ),
        Candidate("gnnattn auto: layer(x)", _with_backend(layer, "auto")),
        Candidate("gnnattn sdpa: layer(x, graph)", _with_backend(layer, "sdpa", graph)),
        Candidate(
            "gnnattn fused: layer(x, graph)",
            _with_backend(layer, "fused", graph),
            skip=None if compiled else big,
            note="" if compiled else "reference kernel (no compiled CPU kernel)",
        ),
        Candidate("gnnattn mp: layer(x, graph)", _with_backend(layer, "mp", graph), skip=big),
    ]
    return Case(
        "edge_index",
        f"complete graph as edge_index, T={t}, embed {d}, {h} heads, |E|={t * t:,}",
        x,
        g,
        "nn.MultiheadAttention",
        cands,
        list(layer.parameters()) + list(mha.parameters()),
        {"T": t, "embed_dim": d, "heads": h, "num_edges": t * t},
        "edge_index",
    )


def _fused_alone(layer, graph):
    """The fused operator between the layer's projections, with no layer plumbing."""
    from .ops import fused_attention

    h, c, d = layer.num_heads, layer.head_dim, layer.embed_dim

    def fn(x: Tensor) -> Tensor:
        n = x.shape[0]
        q = layer.lin_query(x).view(n, h, c)  # (N, H, C)
        k = layer.lin_key(x).view(n, h, c)  # (N, H, C)
        v = layer.lin_value(x).view(n, h, c)  # (N, H, C)
        out, _ = fused_attention(q, k, v, graph, layer.scale)
        return layer.lin_out(out.reshape(n, d))  # (N, D)

    return fn


def _sparse_case(cfg: BenchConfig, sizes: dict[str, Any], device: torch.device) -> Case:
    """A random graph: every node gets ``deg`` in-edges from random sources."""
    from .graphs import AttentionGraph

    gen = torch.Generator().manual_seed(cfg.seed + 2)
    n, deg, d, h = sizes["sparse"]
    torch.manual_seed(cfg.seed)
    layer = _attention_layer(d, h, device)
    x, g = _input(n, d, device, gen)
    # Sorted by target (as the builders sort); duplicate sources are allowed
    # and rare, and every implementation treats them as separate edges.
    src = torch.randint(0, n, (n * deg,), generator=gen)
    dst = torch.arange(n).repeat_interleave(deg)
    ei = torch.stack([src, dst]).to(device)
    graph = AttentionGraph(ei, n)
    conv, conv_fn = _transformer_conv(layer, ei, device)
    compiled = _has_compiled_kernels(device)
    ref_note = "" if compiled else "reference kernel (no compiled CPU kernel)"
    cands = [
        Candidate("PyG TransformerConv (+out proj)", conv_fn),
        Candidate(
            "gnnattn auto: layer(x, graph)",
            _with_backend(layer, "auto", graph),
            note="AttentionGraph built once, outside the timing",
        ),
        Candidate(
            "gnnattn auto: layer(x, ei)",
            _with_backend(layer, "auto", ei),
            note="plain edge_index: validated, sorted and analysed on every call",
        ),
        Candidate(
            "gnnattn fused operator alone (+proj)",
            _fused_alone(layer, graph),
            note="projections + ops.fused_attention: the layer without its plumbing",
        ),
        Candidate(
            "gnnattn fused: layer(x, graph)", _with_backend(layer, "fused", graph), note=ref_note
        ),
        Candidate("gnnattn mp: layer(x, graph)", _with_backend(layer, "mp", graph)),
    ]
    return Case(
        "sparse",
        f"random graph N={n:,}, {deg} in-edges each, embed {d}, {h} heads, |E|={n * deg:,}",
        x,
        g,
        "PyG TransformerConv (+out proj)",
        cands,
        list(layer.parameters()) + list(conv.parameters()),
        {"num_nodes": n, "in_degree": deg, "embed_dim": d, "heads": h, "num_edges": n * deg},
        "sparse",
    )


def _softmax_case(cfg: BenchConfig, sizes: dict[str, Any], device: torch.device) -> Case:
    """Segment softmax over a sorted index (about ``deg`` entries per segment)."""
    from torch_geometric.utils import softmax as pyg_softmax

    from .softmax import scatter_softmax

    gen = torch.Generator().manual_seed(cfg.seed + 3)
    e, h, deg = sizes["softmax"]
    n = max(e // deg, 1)
    index = torch.randint(0, n, (e,), generator=gen).sort().values.to(device)
    ptr = torch.zeros(n + 1, dtype=torch.long, device=device)
    torch.cumsum(torch.bincount(index, minlength=n), 0, out=ptr[1:])
    x = (torch.randn(e, h, generator=gen) * 3).to(device).requires_grad_()
    g = torch.randn(e, h, generator=gen).to(device)
    cands = [
        Candidate("PyG utils.softmax(index)", lambda s: pyg_softmax(s, index, num_nodes=n)),
        Candidate("PyG utils.softmax(ptr)", lambda s: pyg_softmax(s, ptr=ptr)),
        Candidate("gnnattn scatter_softmax(index)", lambda s: scatter_softmax(s, index, n)),
    ]
    return Case(
        "softmax",
        f"E={e:,}, H={h}, {n:,} segments (sorted index)",
        x,
        g,
        "PyG utils.softmax(index)",
        cands,
        [],
        {"num_edges": e, "heads": h, "num_segments": n},
        "softmax",
    )


def _model_cases(cfg: BenchConfig, sizes: dict[str, Any], device: torch.device) -> list[Case]:
    """Models built on the graph object: the transformer stack, and causal pruning."""
    from .graphs import AttentionGraph, causal_graph, complete_graph
    from .nn import GraphTransformer

    gen = torch.Generator().manual_seed(cfg.seed + 4)
    b, t, d, h, num_layers = sizes["model"]
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
    x, g = _input(b * t, d, device, gen)

    def torch_fn(x: Tensor) -> Tensor:
        return encoder(x.view(b, t, d)).reshape(b * t, d)  # (B*T, D)

    model_case = Case(
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
        {"sequences": b, "tokens": t, "embed_dim": d, "heads": h, "layers": num_layers},
        "model",
        modes=("fwd",),
    )
    # Causal pruning: a causal layer on a complete edge_index vs on the causal one.
    t2, d2, h2 = sizes["seq"], sizes["dim"], sizes["heads"]
    torch.manual_seed(cfg.seed)
    layer = _attention_layer(d2, h2, device, causal=True)
    x2, g2 = _input(t2, d2, device, gen)
    complete_ei = complete_graph(t2, device=device)
    causal_ei = causal_graph(t2, device=device)
    complete_obj = AttentionGraph(complete_ei)
    causal_case = Case(
        "models",
        f"SelfAttentionConv(causal=True), T={t2}, embed {d2}, {h2} heads",
        x2,
        g2,
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
                "layer(x, AttentionGraph.causal(T))", lambda x: layer(x, AttentionGraph.causal(t2))
            ),
        ],
        list(layer.parameters()),
        {"T": t2, "embed_dim": d2, "heads": h2},
        "causal_prune",
        modes=("fwd",),
    )
    return [model_case, causal_case]


def build_cases(cfg: BenchConfig) -> list[Case]:
    """Every case of the selected suites, inputs and weights built from ``cfg.seed``."""
    device = torch.device(cfg.device)
    sizes = _SIZES["quick" if cfg.quick else "full"]
    if device.type == "cuda" and not cfg.quick:
        # The GPU affords longer sequences for the dense paths.
        sizes = {**sizes, "complete": [*sizes["complete"], 16384]}
    cases = _dense_cases(cfg, sizes, device)
    if "edge_index" in cfg.suites:
        cases.append(_edge_index_case(cfg, sizes, device))
    if "sparse" in cfg.suites:
        cases.append(_sparse_case(cfg, sizes, device))
    if "softmax" in cfg.suites:
        cases.append(_softmax_case(cfg, sizes, device))
    if "models" in cfg.suites:
        cases += _model_cases(cfg, sizes, device)
    order = {s: i for i, s in enumerate(SUITES)}
    return sorted(cases, key=lambda c: order[c.suite])


# --------------------------------------------------------------------------- measuring


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _call(case: Case, cand: Candidate, mode: str) -> Tensor:
    """One call: the output (forward) or the input's gradient (forward+backward)."""
    assert cand.fn is not None
    if mode == "fwd":
        with torch.no_grad():
            return cand.fn(case.x)
    for p in (case.x, *case.params):
        p.grad = None
    out = cand.fn(case.x)
    out.backward(case.grad)
    assert case.x.grad is not None
    return case.x.grad


def _timed(case: Case, cand: Candidate, mode: str) -> tuple[float, Tensor]:
    device = case.x.device
    _sync(device)
    t0 = time.perf_counter()
    out = _call(case, cand, mode)
    _sync(device)
    return time.perf_counter() - t0, out


def _peak_bytes(case: Case, cand: Candidate, mode: str) -> int:
    """Peak bytes of torch tensors allocated during one call, above what was live before."""
    device = case.x.device
    for p in (case.x, *case.params):
        p.grad = None
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        out = _call(case, cand, mode)
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - base
        del out
        return int(peak)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = _call(case, cand, mode)
    del out
    events = prof.profiler.kineto_results.events()
    # "[memory]" events carry +bytes for an allocation and -bytes for a free.
    timeline = sorted(
        (ev.start_ns(), ev.nbytes())
        for ev in events
        if ev.name() == "[memory]" and ev.device_type() == torch.autograd.DeviceType.CPU
    )
    cur = peak = 0
    for _, nbytes in timeline:
        cur += nbytes
        peak = max(peak, cur)
    return peak


def _max_abs_diff(a: Tensor, b: Tensor) -> float:
    if a.shape != b.shape:
        return math.inf
    if a.numel() == 0:
        return 0.0
    return float((a.detach().double() - b.detach().double()).abs().max())


def _row(case: Case, cand: Candidate, mode: str, **kw: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "suite": case.suite,
        "case": case.name,
        "tag": case.tag,
        "mode": mode,
        "candidate": cand.name,
        "baseline": case.baseline,
        "status": "ok",
        "median_ms": None,
        "times_ms": [],
        "reps": 0,
        "ratio": None,
        "peak_bytes": None,
        "mem_ratio": None,
        "max_abs_diff": None,
        "note": cand.note,
    }
    row.update(kw)
    return row


def _run_mode(case: Case, mode: str, cfg: BenchConfig) -> list[dict[str, Any]]:
    rows = {c.name: _row(case, c, mode) for c in case.candidates}
    active: list[Candidate] = []
    reference: Tensor | None = None
    reference_name = case.baseline
    estimate: dict[str, float] = {}
    # The baseline runs first so its output is there to compare the others to.
    order = sorted(case.candidates, key=lambda c: c.name != case.baseline)
    for cand in order:
        row = rows[cand.name]
        if cand.skip is not None:
            row["status"] = cand.skip
            continue
        try:
            seconds, out = _timed(case, cand, mode)
        except NotImplementedError as err:
            # For example FlexAttention has no backward on the CPU.
            row["status"] = f"n/a: {str(err).splitlines()[0][:120]}"
            continue
        except Exception as err:  # noqa: BLE001 - a failing candidate must not stop the bench
            row["status"] = f"error: {type(err).__name__}: {str(err).splitlines()[0][:120]}"
            continue
        if reference is None:
            reference, reference_name = out.detach().clone(), cand.name
        row["max_abs_diff"] = _max_abs_diff(out, reference)
        if reference_name != case.baseline:
            row["note"] = (row["note"] + "; " if row["note"] else "") + f"diff vs {reference_name}"
        del out
        estimate[cand.name] = seconds
        active.append(cand)
        if seconds > cfg.max_call_s:
            row["note"] = (row["note"] + "; " if row["note"] else "") + "1 rep (slow)"
    del reference
    slow = {c.name for c in active if estimate[c.name] > cfg.max_call_s}
    round_s = sum(estimate[c.name] for c in active if c.name not in slow)
    reps = cfg.min_reps
    if round_s > 0:
        reps = int(min(cfg.max_reps, max(cfg.min_reps, cfg.budget_s // round_s)))
    limit = {c.name: 1 if c.name in slow else reps for c in active}
    for r in range(reps if active else 0):
        shift = r % len(active)
        for cand in active[shift:] + active[:shift]:
            if rows[cand.name]["reps"] >= limit[cand.name]:
                continue
            seconds, out = _timed(case, cand, mode)
            del out
            rows[cand.name]["times_ms"].append(seconds * 1e3)
            rows[cand.name]["reps"] += 1
    if cfg.memory:
        # After the timing, so that the profiler's own work cannot disturb it.
        for cand in order:
            if cand.name in estimate:
                rows[cand.name]["peak_bytes"] = _peak_bytes(case, cand, mode)
    for p in (case.x, *case.params):
        p.grad = None
    for row in rows.values():
        if row["times_ms"]:
            row["median_ms"] = statistics.median(row["times_ms"])
    base = rows[case.baseline]
    for row in rows.values():
        if row["median_ms"] is not None and base["median_ms"]:
            row["ratio"] = row["median_ms"] / base["median_ms"]
        if row["peak_bytes"] is not None and base["peak_bytes"]:
            row["mem_ratio"] = row["peak_bytes"] / base["peak_bytes"]
    return [rows[c.name] for c in case.candidates]


# --------------------------------------------------------------------------- targets


@dataclass
class Target:
    """A number the issue asks for, checked on one run's rows."""

    label: str
    tag: str
    mode: str
    candidate: str
    baseline: str
    kind: str  # "slowdown_le" (candidate/baseline <= v), "speedup_ge", "memory_le"
    value: float


TARGETS = [
    Target(
        "complete, layer(x), forward",
        "complete",
        "fwd",
        "gnnattn auto: layer(x)",
        "nn.MultiheadAttention",
        "slowdown_le",
        1.5,
    ),
    Target(
        "complete as explicit edge_index, forward",
        "edge_index",
        "fwd",
        "gnnattn auto: layer(x, ei)",
        "nn.MultiheadAttention",
        "slowdown_le",
        10.0,
    ),
    Target(
        "sparse random graph, forward",
        "sparse",
        "fwd",
        "gnnattn auto: layer(x, ei)",
        "PyG TransformerConv (+out proj)",
        "speedup_ge",
        5.0,
    ),
    Target(
        "sparse random graph, forward+backward",
        "sparse",
        "fwdbwd",
        "gnnattn auto: layer(x, ei)",
        "PyG TransformerConv (+out proj)",
        "speedup_ge",
        3.0,
    ),
    Target(
        "sparse random graph, forward+backward, peak memory",
        "sparse",
        "fwdbwd",
        "gnnattn auto: layer(x, ei)",
        "PyG TransformerConv (+out proj)",
        "memory_le",
        1 / 3,
    ),
    Target(
        "scatter_softmax, forward",
        "softmax",
        "fwd",
        "gnnattn scatter_softmax(index)",
        "PyG utils.softmax(index)",
        "speedup_ge",
        2.0,
    ),
]


def check_targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Evaluate :data:`TARGETS` on a run's rows (targets whose case did not run are left out)."""
    out = []
    for tgt in TARGETS:
        found = {r["candidate"]: r for r in rows if r["tag"] == tgt.tag and r["mode"] == tgt.mode}
        if not found:
            continue
        cand, base = found.get(tgt.candidate), found.get(tgt.baseline)
        res: dict[str, Any] = {
            "target": tgt.label,
            "case": (cand or base or {}).get("case"),
            "mode": tgt.mode,
            "candidate": tgt.candidate,
            "baseline": tgt.baseline,
            "kind": tgt.kind,
            "value": tgt.value,
            "measured": None,
            "ok": None,
        }
        if tgt.kind == "memory_le":
            if cand and base and cand["peak_bytes"] is not None and base["peak_bytes"]:
                res["measured"] = cand["peak_bytes"] / base["peak_bytes"]
                res["ok"] = res["measured"] <= tgt.value
        elif cand and base and cand["median_ms"] and base["median_ms"]:
            slowdown = cand["median_ms"] / base["median_ms"]
            if tgt.kind == "slowdown_le":
                res["measured"], res["ok"] = slowdown, slowdown <= tgt.value
            else:
                res["measured"], res["ok"] = 1 / slowdown, 1 / slowdown >= tgt.value
        out.append(res)
    return out


# --------------------------------------------------------------------------- reporting


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _git_commit() -> str | None:
    here = os.path.dirname(os.path.abspath(__file__))
    with contextlib.suppress(Exception):
        res = subprocess.run(
            ["git", "-C", here, "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
        )
        if res.returncode == 0:
            return res.stdout.strip()
    return None


def machine_info(cfg: BenchConfig) -> dict[str, Any]:
    """Where the figures come from: CPU, threads, device and versions."""
    import torch_geometric

    from . import __version__, kernels

    info: dict[str, Any] = {
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "device": cfg.device,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_geometric": torch_geometric.__version__,
        "gnnattn": __version__,
        "gnnattn_commit": _git_commit(),
        "kernels": kernels.get(torch.device(cfg.device)).__name__,
    }
    with contextlib.suppress(OSError):
        # Other processes on a 2-core machine stall OpenMP barriers: quote
        # figures only from runs on a quiet machine.
        info["loadavg"] = list(os.getloadavg())
    with contextlib.suppress(ImportError):
        import numba

        info["numba"] = numba.__version__
        info["numba_threads"] = numba.get_num_threads()
    if cfg.device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name(torch.device(cfg.device))
    return info


def _fmt_ms(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def _fmt_ratio(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.2f}x" if v < 100 else f"{v:.0f}x"


def _fmt_mib(v: int | None) -> str:
    return "-" if v is None else f"{v / 2**20:.1f}"


def _fmt_diff(v: float | None) -> str:
    return "-" if v is None else f"{v:.1e}"


def format_table(rows: list[dict[str, Any]], targets: list[dict[str, Any]]) -> str:
    """The results as a plain-text table, one block per case and mode."""
    lines: list[str] = []
    width = max((len(r["candidate"]) for r in rows), default=20) + 1
    head = (
        f"{'candidate':<{width}} {'median ms':>10} {'x base':>8} {'peak MiB':>9} "
        f"{'x base':>7} {'max|diff|':>9} {'reps':>4}  note"
    )
    key = None
    for r in rows:
        if (r["suite"], r["case"], r["mode"]) != key:
            key = (r["suite"], r["case"], r["mode"])
            lines += [
                "",
                f"[{r['suite']}] {r['case']} -- {_MODE_LABEL[r['mode']]} "
                f"(baseline: {r['baseline']})",
                head,
            ]
        if r["status"] != "ok":
            lines.append(f"{r['candidate']:<{width}} {r['status']}")
            continue
        lines.append(
            f"{r['candidate']:<{width}} {_fmt_ms(r['median_ms']):>10} "
            f"{_fmt_ratio(r['ratio']):>8} {_fmt_mib(r['peak_bytes']):>9} "
            f"{_fmt_ratio(r['mem_ratio']):>7} {_fmt_diff(r['max_abs_diff']):>9} "
            f"{r['reps']:>4}  {r['note']}"
        )
    if targets:
        lines += ["", "targets (issue 3):"]
        for t in targets:
            if t["measured"] is None:
                verdict, got = "n/a", "not measured"
            else:
                verdict = "PASS" if t["ok"] else "FAIL"
                if t["kind"] == "memory_le":
                    got = f"peak memory {t['measured']:.2f}x (target <= {t['value']:.2f}x)"
                elif t["kind"] == "speedup_ge":
                    got = f"speedup {t['measured']:.2f}x (target >= {t['value']:g}x)"
                else:
                    got = f"{t['measured']:.2f}x the baseline's time (target <= {t['value']:g}x)"
            lines.append(
                f"  {verdict:<4} {t['target']}: {t['candidate']} vs {t['baseline']}: {got}"
            )
    return "\n".join(lines)


# --------------------------------------------------------------------------- driver


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        # FlexAttention warns on every eager CPU use; the table notes it once.
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile")
        warnings.filterwarnings("ignore", message=".*is_causal.*")
        yield


def run(cfg: BenchConfig, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the selected suites and return ``{"machine", "config", "suites", "rows", "targets"}``."""
    device = torch.device(cfg.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("Expected a CUDA device for --device cuda, but torch sees none")
    if device.type == "cpu":
        torch.set_num_threads(cfg.threads)
        with contextlib.suppress(Exception):
            import numba

            limit = numba.config.NUMBA_NUM_THREADS  # type: ignore[attr-defined]
            numba.set_num_threads(min(cfg.threads, limit))
    torch.manual_seed(cfg.seed)
    machine = machine_info(cfg)
    start = time.perf_counter()
    rows: list[dict[str, Any]] = []
    with _quiet():
        cases = build_cases(cfg)
        for case in cases:
            # Free the previous case's cyclic garbage (autograd graphs hold big tensors).
            gc.collect()
            for mode in case.modes:
                if log is not None:
                    log(f"running [{case.suite}] {case.name} -- {_MODE_LABEL[mode]}")
                rows += _run_mode(case, mode, cfg)
            del case
    cases.clear()
    gc.collect()
    with contextlib.suppress(OSError):
        machine["loadavg_end"] = list(os.getloadavg())
    config = {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(cfg).items()}
    return {
        "machine": machine,
        "config": config,
        "suites": [s for s in SUITES if s in cfg.suites],
        "rows": rows,
        "targets": [] if cfg.quick else check_targets(rows),
        "seconds": time.perf_counter() - start,
    }


def main(args: Any) -> int:
    """``gnnattn bench``: run, print the table, optionally write JSON."""
    suites = tuple(s for s in SUITES if not args.suite or s in args.suite)
    cfg = BenchConfig(
        device=args.device,
        quick=args.quick,
        threads=args.threads,
        suites=suites,
        memory=not args.no_memory,
    )
    if args.quick:
        cfg.min_reps, cfg.max_reps, cfg.budget_s = 2, 3, 1.0
    if args.reps is not None:
        cfg.min_reps = cfg.max_reps = args.reps

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    result = run(cfg, log)
    m = result["machine"]
    print(
        f"gnnattn bench on {m['cpu']} ({m['threads']} threads), device {m['device']}"
        + (f" ({m['gpu']})" if "gpu" in m else "")
        + f", torch {m['torch']}, torch_geometric {m['torch_geometric']}, kernels {m['kernels']}"
        + (", --quick sizes" if cfg.quick else "")
    )
    if "loadavg" in m:
        print(
            f"load average (1/5/15 min) before: {' '.join(f'{v:.2f}' for v in m['loadavg'])}, "
            f"after: {' '.join(f'{v:.2f}' for v in m.get('loadavg_end', []))}"
        )
    print(
        "median of interleaved repetitions; 'x base' = median / baseline median; peak MiB = "
        "torch tensor bytes allocated during one call; max|diff| vs the baseline's output "
        "(forward) or input gradient (forward+backward)"
    )
    print(format_table(result["rows"], result["targets"]))
    print(f"\n{result['seconds']:.0f} s in all")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, default=str)
    return 0
