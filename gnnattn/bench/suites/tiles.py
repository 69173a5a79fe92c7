r"""The ``tiles`` suite: graphs with locality, where block kernels can run at matrix-product
speed (issue 27), against compiled FlexAttention and against the CSR kernel.

Operator cases call :func:`gnnattn.attention` on ``q``, ``k``, ``v`` ``[N, H, C]``
(the leaf ``x`` is ``[3, N, H, C]``: ``q, k, v = x``), and the peers on the same
tensors seen as ``[1, H, N, C]``:

* **sliding window** (:math:`|i - j| \le w`), **dilated window**
  (:func:`~gnnattn.dilated_window_graph`) and **BigBird**
  (:func:`~gnnattn.bigbird_graph`) on one sequence. Forward: the baseline is
  FlexAttention under ``torch.compile`` with the pattern's ``BlockMask``
  (eager in ``--quick``, which does not compile). Forward + backward: on the
  CPU, where Flex has no backward, dense SDPA with the pattern as a boolean
  mask; on CUDA, compiled Flex again.
* **batched variable-length graphs**: 256 graphs of 10-498 nodes (the ``pyg``
  suite's skewed sizes), complete within each, H = 4, C = 16. Forward:
  against Flex with a document mask (built by a compiled
  ``create_block_mask``: eagerly it takes about 13 GB at N = 35k);
  forward + backward: against ``"auto"`` (the bucketed SDPA).

Layer cases time ``SelfAttentionConv(128, 4 heads)`` forward and forward +
backward, the graph built once:

* **kNN graph of 200k random 3-D points** (k = 16), reordered along the
  Hilbert curve of the points (:func:`gnnattn.reorder` with ``pos``); the
  data lives in the new order (as a model keeps it). The baseline is the
  ``"fused"`` CSR kernel on the same order; one row runs it on the points'
  original (random) ids, its input and output gathered between the orders.
  The case name gives :func:`gnnattn.tile_fill` at B = 64 before and after.
* **random graph**, same size and in-degree: ``"auto"`` must keep the CSR
  kernel (ratio to ``"fused"`` about 1; its note says what it took).

Every case has a ``gnnattn tiles`` row: it runs ``backend="tiles"`` when
``gnnattn.ops.BACKENDS`` has it, and says it is not there otherwise.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..harness import BenchConfig, Candidate, Case
from .common import attention_layer, input_pair, knn_graph, random_graph, random_points

__all__ = ["CASE_BUILDERS", "SIZES", "tiles_cases"]

SIZES: Mapping[str, dict[str, Any]] = MappingProxyType(
    {
        # seq: (T, H, C); window: w; dilated: (w, d); bigbird: (b, window blocks, g, r);
        # batched: (graphs, min nodes, max nodes, H, C); knn: (points, k, embed, heads);
        # fill: the row window of tile_fill.
        "full": {
            "seq": (4096, 8, 64),
            "window": 128,
            "dilated": (64, 2),
            "bigbird": (64, 1, 64, 3),
            "batched": (256, 10, 500, 4, 16),
            "knn": (200_000, 16, 128, 4),
            "fill": 64,
        },
        "quick": {
            "seq": (256, 2, 16),
            "window": 16,
            "dilated": (8, 2),
            "bigbird": (16, 1, 16, 2),
            "batched": (8, 5, 40, 2, 8),
            "knn": (2_000, 8, 32, 4),
            "fill": 64,
        },
    }
)

TILES = "gnnattn tiles"
FLEX = "FlexAttention (compiled, BlockMask)"
FLEX_EAGER = "FlexAttention (eager, BlockMask)"
SDPA_MASK = "dense SDPA, boolean mask"


def _has_tiles() -> bool:
    from ...ops import BACKENDS

    return "tiles" in BACKENDS


def _qkv(
    n: int, h: int, c: int, device: torch.device, gen: torch.Generator
) -> tuple[Tensor, Tensor]:
    """The leaf ``x`` ``[3, N, H, C]`` (``q, k, v = x``) and the upstream gradient ``[N, H, C]``."""
    x = torch.randn(3, n, h, c, generator=gen).to(device).requires_grad_()
    return x, torch.randn(n, h, c, generator=gen).to(device)


def _ours(graph: Any, backend: str) -> Callable[[Tensor], Tensor]:
    from ...ops import attention

    def fn(x: Tensor) -> Tensor:
        out = attention(x[0], x[1], x[2], graph, backend=backend)
        assert isinstance(out, Tensor)
        return out

    return fn


def _heads_first(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``q, k, v`` of ``x`` ``[3, N, H, C]`` as ``[1, H, N, C]`` views (no copies)."""
    q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in x.unbind(0))
    return q, k, v


def _sdpa_mask(mask: Tensor) -> Callable[[Tensor], Tensor]:
    def fn(x: Tensor) -> Tensor:
        o = F.scaled_dot_product_attention(*_heads_first(x), attn_mask=mask)
        return o[0].transpose(0, 1)  # (N, H, C)

    return fn


def _flex(mask_mod: Callable[..., Tensor], x: Tensor, g: Tensor, compiled: bool) -> Candidate:
    """FlexAttention with the block mask of ``mask_mod`` (made once, outside the timing);
    compiled, its first calls (forward; forward + backward on CUDA) are made here, so
    that the harness's warm-up times a call, not a compile."""
    name = FLEX if compiled else FLEX_EAGER
    n, device = x.shape[1], x.device
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError as err:
        return Candidate(name, skip=f"unavailable (no FlexAttention in torch: {err})")
    t0 = time.perf_counter()
    try:
        # Compiled, the mask is made block by block (eagerly, N = 35k takes 13 GB).
        make = torch.compile(create_block_mask) if compiled else create_block_mask
        block_mask = make(mask_mod, None, None, n, n, device=str(device))
    except Exception as err:  # noqa: BLE001 - any failure means: not available here
        return Candidate(name, skip=f"unavailable (block mask: {type(err).__name__}: {err})"[:200])
    made_s = time.perf_counter() - t0
    # Static shapes: the cases' sizes differ, and a dynamic kernel would be slower.
    attend = torch.compile(flex_attention, dynamic=False) if compiled else flex_attention

    def fn(inp: Tensor) -> Tensor:
        if not torch.is_grad_enabled():
            # A view of a leaf keeps requires_grad under no_grad, and on the CPU Flex
            # refuses any input that requires grad (it has no backward there).
            inp = inp.detach()
        with warnings.catch_warnings():
            # Eager flex_attention warns that it is unfused: in --quick it runs as it is.
            warnings.simplefilter("ignore", UserWarning)
            o = attend(*_heads_first(inp), block_mask=block_mask)
        assert isinstance(o, Tensor)
        return o[0].transpose(0, 1)  # (N, H, C)

    note = (
        f"BlockMask made once in {made_s:.1f} s ({_empty_blocks(block_mask):.0f}% of blocks empty)"
    )
    if compiled:
        t0 = time.perf_counter()
        try:
            with torch.no_grad():
                fn(x)
            if device.type == "cuda":
                fn(x).backward(g)
                x.grad = None
        except Exception as err:  # noqa: BLE001 - a peer that fails here is reported, not run
            return Candidate(name, skip=f"error: {type(err).__name__}: {err}"[:200])
        note += f"; first calls {time.perf_counter() - t0:.1f} s (compiling, or Inductor's cache)"
    return Candidate(name, fn, note=note)


def _empty_blocks(block_mask: Any) -> float:
    """The share (%) of the mask's blocks that no query block visits, from its block
    counts: ``BlockMask.sparsity()`` divides by the sequence's area instead, and is
    negative when the length is not a multiple of the block size."""
    q_tiles = block_mask.kv_num_blocks.numel()  # B * H * query blocks
    kv_tiles = -(-block_mask.seq_lengths[1] // block_mask.BLOCK_SIZE[1])
    used = int(block_mask.kv_num_blocks.sum())
    if block_mask.full_kv_num_blocks is not None:
        used += int(block_mask.full_kv_num_blocks.sum())
    return 100.0 * (1.0 - used / (q_tiles * kv_tiles))


def _ours_candidates(graph: Any, x: Tensor) -> list[Candidate]:
    """``"auto"`` (its note: what it took and why), ``"fused"`` and ``"tiles"``."""
    from ...ops import backend_for

    choice = backend_for(x[0], graph)
    cands = [
        Candidate(
            "gnnattn auto",
            _ours(graph, "auto"),
            note=f"auto took '{choice.backend}' ({choice.reason})",
        )
    ]
    cands.append(Candidate("gnnattn fused (CSR)", _ours(graph, "fused")))
    cands.append(_tiles(lambda: _ours(graph, "tiles")))
    return cands


def _tiles(make: Callable[[], Callable[[Tensor], Tensor]]) -> Candidate:
    if not _has_tiles():
        return Candidate(TILES, skip="skipped: no 'tiles' backend in gnnattn.ops.BACKENDS yet")
    return Candidate(TILES, make())


def _sequence_cases(
    cfg: BenchConfig,
    device: torch.device,
    title: str,
    graph: Any,
    mask_mod: Callable[..., Tensor],
    info: dict[str, Any],
) -> list[Case]:
    """Forward against Flex; forward + backward against SDPA with the mask (CPU) or
    Flex (CUDA)."""
    from ...graphs import edge_index_to_mask

    t, h, c = SIZES["quick" if cfg.quick else "full"]["seq"]
    gen = torch.Generator().manual_seed(cfg.seed + 60)
    x, g = _qkv(t, h, c, device, gen)
    flex = _flex(mask_mod, x, g, compiled=not cfg.quick)
    mask = edge_index_to_mask(graph.edge_index, t)  # (T, T) bool, mask[i, j]: j -> i
    sdpa = Candidate(SDPA_MASK, _sdpa_mask(mask), note="the [T, T] mask made once")
    ours = _ours_candidates(graph, x)
    name = f"{title}, T={t:,}, H={h}, C={c}, |E|={graph.num_edges:,}"
    info = {**info, "T": t, "heads": h, "head_dim": c, "num_edges": graph.num_edges}
    fwd_base = flex if flex.fn is not None else sdpa
    bwd_base = flex if device.type == "cuda" and flex.fn is not None else sdpa
    # Flex unavailable: its row stays, saying why, as in the batched cases.
    fwd = [fwd_base, *ours, sdpa if fwd_base is flex else flex]
    cuda_flex = [flex] if device.type == "cuda" else []  # the CPU's Flex has no backward
    bwd = [bwd_base, *ours, *([sdpa] if bwd_base is flex else cuda_flex)]
    return [
        Case("tiles", name, x, g, fwd_base.name, fwd, [], info, modes=("fwd",)),
        Case("tiles", name, x, g, bwd_base.name, bwd, [], info, modes=("fwdbwd",)),
    ]


def _window_cases(cfg: BenchConfig, device: torch.device) -> list[Case]:
    from ...graphs import AttentionGraph

    sizes = SIZES["quick" if cfg.quick else "full"]
    t, w = sizes["seq"][0], sizes["window"]
    graph = AttentionGraph.window(t, window=w, device=device)

    def mask_mod(b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        return (i - j).abs() <= w

    return _sequence_cases(cfg, device, f"sliding window w={w}", graph, mask_mod, {"window": w})


def _dilated_cases(cfg: BenchConfig, device: torch.device) -> list[Case]:
    from ...graphs import dilated_window_graph

    sizes = SIZES["quick" if cfg.quick else "full"]
    t, (w, d) = sizes["seq"][0], sizes["dilated"]
    graph = dilated_window_graph(t, window=w, dilation=d, device=device)

    def mask_mod(b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        return ((i - j) % d == 0) & ((i - j).abs() <= w * d)

    title = f"dilated window w={w}, dilation {d}"
    return _sequence_cases(cfg, device, title, graph, mask_mod, {"window": w, "dilation": d})


def _bigbird_cases(cfg: BenchConfig, device: torch.device) -> list[Case]:
    from ...graphs import bigbird_graph, pattern_of

    sizes = SIZES["quick" if cfg.quick else "full"]
    t, (b, wb, g, r) = sizes["seq"][0], sizes["bigbird"]
    graph = bigbird_graph(
        t,
        block_size=b,
        window_blocks=wb,
        num_global=g,
        num_random_blocks=r,
        seed=cfg.seed,
        device=device,
    )
    pattern = pattern_of(graph)
    assert pattern is not None and pattern.random_blocks is not None
    # The key blocks of each query block (window and random), as a table the mask reads.
    nb = -(-t // b)
    blocks = torch.zeros(nb, nb, dtype=torch.bool)
    q = torch.arange(nb)
    blocks[(q[:, None] - q[None, :]).abs() <= wb] = True
    rand = pattern.random_blocks
    rows = q[:, None].expand_as(rand)
    blocks[rows[rand >= 0], rand[rand >= 0]] = True
    blocks = blocks.to(device)

    def mask_mod(bb: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        return blocks[i // b, j // b] | (j < g) | (i < g)

    title = f"BigBird blocks of {b}, window {2 * wb + 1} blocks, {r} random, {g} global"
    info = {"block_size": b, "window_blocks": wb, "num_global": g, "num_random_blocks": r}
    return _sequence_cases(cfg, device, title, graph, mask_mod, info)


def _batched_cases(cfg: BenchConfig, device: torch.device) -> list[Case]:
    from ...graphs import AttentionGraph
    from .pyg import GPSSize, skewed_batch

    graphs, lo, hi, h, c = SIZES["quick" if cfg.quick else "full"]["batched"]
    # The pyg suite's GPSConv sizes (same seed): the batches issue 27 measured.
    batch, _ = skewed_batch(
        GPSSize(graphs, lo, hi, 0, h, 0), torch.Generator().manual_seed(cfg.seed + 20)
    )
    lengths = torch.bincount(batch)
    n = batch.numel()
    graph = AttentionGraph.complete(lengths=lengths.tolist(), device=device)
    gen = torch.Generator().manual_seed(cfg.seed + 61)
    x, g = _qkv(n, h, c, device, gen)
    doc = batch.to(device)

    def mask_mod(b: Tensor, hh: Tensor, i: Tensor, j: Tensor) -> Tensor:
        return doc[i] == doc[j]

    flex = _flex(mask_mod, x, g, compiled=not cfg.quick)
    ours = _ours_candidates(graph, x)
    name = (
        f"{graphs} graphs of {int(lengths.min())}-{int(lengths.max())} nodes, complete within "
        f"each, N={n:,}, H={h}, C={c}, |E|={graph.num_edges:,}"
    )
    info = {
        "graphs": graphs,
        "num_nodes": n,
        "heads": h,
        "head_dim": c,
        "num_edges": graph.num_edges,
    }
    fwd_base = flex.name if flex.fn is not None else "gnnattn auto"
    return [
        Case("tiles", name, x, g, fwd_base, [flex, *ours], [], info, modes=("fwd",)),
        Case("tiles", name, x, g, "gnnattn auto", ours, [], info, modes=("fwdbwd",)),
    ]


def _layer_case(
    name: str, layer: Any, x: Tensor, g: Tensor, cands: list[Candidate], info: dict[str, Any]
) -> Case:
    return Case("tiles", name, x, g, cands[0].name, cands, list(layer.parameters()), info)


def _knn_cases(cfg: BenchConfig, device: torch.device) -> list[Case]:
    from ...graphs import AttentionGraph, permute, reorder, tile_fill

    sizes = SIZES["quick" if cfg.quick else "full"]
    n, k, d, h = sizes["knn"]
    block = sizes["fill"]
    gen = torch.Generator().manual_seed(cfg.seed + 62)
    pos = random_points(n, gen)
    ei = knn_graph(pos, k)
    graph = AttentionGraph(ei, n)
    t0 = time.perf_counter()
    order = reorder(graph, pos=pos)
    t_order = time.perf_counter() - t0
    graph_r = permute(graph, order.perm)
    fill = tile_fill(graph, block=block), tile_fill(graph_r, block=block)
    graph, graph_r = graph.to(device), graph_r.to(device)
    torch.manual_seed(cfg.seed)
    layer = attention_layer(d, h, device)
    x, g = input_pair(n, d, device, gen)  # in the new (Hilbert) order
    perm, inv = order.perm.to(device), order.inv.to(device)

    def call(gr: Any, backend: str) -> Callable[[Tensor], Tensor]:
        return lambda inp: layer(inp, gr, backend=backend)

    def original_ids(inp: Tensor) -> Tensor:
        # The rows back in the points' own order, the layer there, and the result in
        # the new order again: the same output, on random ids.
        return layer(inp[inv], graph, backend="fused")[perm]

    choice = layer.backend_for(x, graph_r)
    auto_note = f"auto took '{choice.backend}' ({choice.reason})"
    cands = [
        Candidate("gnnattn fused (CSR), Hilbert order", call(graph_r, "fused")),
        Candidate("gnnattn auto, Hilbert order", call(graph_r, "auto"), note=auto_note),
        _tiles(lambda: call(graph_r, "tiles")),
        Candidate(
            "gnnattn fused (CSR), random ids",
            original_ids,
            note="x and the output gathered between the orders in the timed call",
        ),
    ]
    name = (
        f"kNN graph of random 3-D points, N={n:,}, k={k}, SelfAttentionConv({d}, {h} heads); "
        f"tile fill at B={block}: {fill[0]:.3f} random ids, {fill[1]:.3f} Hilbert order "
        f"(reorder {t_order:.2f} s)"
    )
    info = {
        "num_nodes": n,
        "k": k,
        "embed_dim": d,
        "heads": h,
        "num_edges": graph.num_edges,
        "fill_block": block,
        "fill_before": fill[0],
        "fill_after": fill[1],
        "reorder_s": t_order,
    }
    return [_layer_case(name, layer, x, g, cands, info)]


def _random_cases(cfg: BenchConfig, device: torch.device) -> list[Case]:
    from ...graphs import AttentionGraph, tile_fill

    sizes = SIZES["quick" if cfg.quick else "full"]
    n, k, d, h = sizes["knn"]
    gen = torch.Generator().manual_seed(cfg.seed + 63)
    ei = random_graph(n, k, gen)
    graph = AttentionGraph(ei, n)
    fill = tile_fill(graph, block=sizes["fill"])
    graph = graph.to(device)
    torch.manual_seed(cfg.seed)
    layer = attention_layer(d, h, device)
    x, g = input_pair(n, d, device, gen)
    choice = layer.backend_for(x, graph)
    cands = [
        Candidate("gnnattn fused (CSR)", lambda inp: layer(inp, graph, backend="fused")),
        Candidate(
            "gnnattn auto",
            lambda inp: layer(inp, graph, backend="auto"),
            note=f"auto took '{choice.backend}' ({choice.reason}); must keep the CSR kernel",
        ),
        _tiles(lambda: lambda inp: layer(inp, graph, backend="tiles")),
    ]
    name = (
        f"random graph, N={n:,}, {k} in-edges each, SelfAttentionConv({d}, {h} heads); "
        f"tile fill at B={sizes['fill']}: {fill:.3f}"
    )
    info = {"num_nodes": n, "in_degree": k, "embed_dim": d, "heads": h, "fill": fill}
    return [_layer_case(name, layer, x, g, cands, info)]


#: The suite's cases by name, in the order they run (and of value: ``.ci/gpu`` runs
#: them in this order while its time lasts).
CASE_BUILDERS: Mapping[str, Callable[[BenchConfig, torch.device], list[Case]]] = MappingProxyType(
    {
        "window": _window_cases,
        "batched": _batched_cases,
        "dilated": _dilated_cases,
        "bigbird": _bigbird_cases,
        "knn": _knn_cases,
        "random": _random_cases,
    }
)


def tiles_cases(cfg: BenchConfig, device: torch.device) -> list[Case]:
    """Every case of the suite (each builder makes its inputs and graphs)."""
    cases: list[Case] = []
    for build in CASE_BUILDERS.values():
        cases += build(cfg, device)
    return cases
