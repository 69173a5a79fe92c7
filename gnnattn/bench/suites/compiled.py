"""The ``compile`` suite: eager against ``torch.compile``, and small graphs against PyG.

* **train**: the ``train`` suite's model and kNN graph (``GraphTransformer``,
  dropout 0.1, ``edge_dim=4``, ``edge_value``), one training step (forward,
  cross-entropy, backward, Adam) eager and with ``torch.compile(model,
  fullgraph=True)`` (Inductor); the same weights and dropout keys per call;
* **sparse layer**: ``TransformerConv(64, 16, heads=4, edge_dim=4)`` on a
  random graph (16 in-edges per node), forward + backward, eager and compiled;
* **small graphs**: ``TransformerConv(64, 16, heads=4, edge_dim=16)`` and
  ``GPSConv(64, GINConv, heads=4)`` on DataLoader-like batches of 32 and 256
  molecule-sized graphs (15-40 nodes, a chain plus ring bonds, both ways:
  about 2.3 edges per node), PyG's layer against gnnattn's with the same
  weights, eager and compiled. One timed call runs forward + backward on each
  of 10 batches in turn, as a training loop meets them; the graphs are given
  as a PyG user gives them (``edge_index`` and ``batch`` per call; the
  compiled GPSConv gets its ``AttentionGraph`` built and prepared per batch,
  outside the compiled region but inside the timed call).

Each compiled row's note gives its first call (compilation included) next to
the eager call: the compile time; a first call that raises (no C++ compiler for
Inductor, an error in it) makes the compiled row an error row and the eager rows
still run. Ratios are to the eager row (train, sparse layer) or to PyG's layer
(small graphs), from the same interleaved run. max|diff| is the sparse layer's
output, or the last batch's output of the small graphs, against the baseline's
(the same weights, no dropout); the train step is not compared (the compiled
model's dropout need not draw eager's masks).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..harness import BenchConfig, Candidate, Case, error_row, error_status, run_case
from .train import NodeClassifier, _data

__all__ = ["SIZES", "compile_rows", "molecule_batch"]

#: Per size: (train nodes, kNN k), (sparse nodes, in-edges), small-graph batch sizes.
SIZES: Mapping[str, tuple[tuple[int, int], tuple[int, int], tuple[int, ...]]] = MappingProxyType(
    {
        "full": ((50_000, 16), (20_000, 16), (32, 256)),
        "quick": ((2_000, 16), (1_000, 8), (8,)),
    }
)
BATCHES = 10
EAGER, COMPILED = "gnnattn eager", "gnnattn torch.compile"


def molecule_batch(graphs: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """A PyG-style batch of molecule-sized graphs: ``batch`` ``[N]`` and ``edge_index``.

    Each graph has 15-40 nodes: a chain (bonds ``i - 1 -- i``) and one ring
    bond per 6 nodes, each bond as two directed edges, sorted by target.
    """
    sizes = torch.randint(15, 41, (graphs,), generator=gen)
    starts = torch.cumsum(sizes, 0) - sizes
    src, dst = [], []
    for s, t in zip(starts.tolist(), sizes.tolist(), strict=True):
        chain = torch.arange(s + 1, s + t)
        a = torch.cat([chain - 1, s + torch.randint(0, t, (t // 6,), generator=gen)])
        b = torch.cat([chain, s + torch.randint(0, t, (t // 6,), generator=gen)])
        keep = a != b
        src += [a[keep], b[keep]]
        dst += [b[keep], a[keep]]
    ei = torch.stack([torch.cat(src), torch.cat(dst)])
    ei = ei[:, torch.argsort(ei[1] * int(sizes.sum()) + ei[0])]
    return torch.repeat_interleave(torch.arange(graphs), sizes), ei


def _first_call_s(fn: Callable[[], Any]) -> float:
    """The first call's seconds; compiled from scratch (Inductor's on-disk cache of an
    earlier run would otherwise make the compile time look like a cache read)."""
    t0 = time.perf_counter()
    with torch._inductor.config.patch(fx_graph_cache=False):
        fn()
    return time.perf_counter() - t0


def _compiled(fn: Callable[[Tensor], Any], dummy: Tensor, eager_s: float | None) -> Candidate:
    """The compiled candidate, after its first call (the compile) is made and timed here;
    a first call that raises (no C++ compiler, an Inductor error) makes it a candidate
    with that error as its status, so that the case's other rows still run."""
    try:
        first = _first_call_s(lambda: fn(dummy))
    except Exception as err:  # noqa: BLE001 - one failed compile must not stop the suite
        return Candidate(COMPILED, skip=error_status(err))
    eager = "" if eager_s is None else f" (eager {eager_s * 1e3:.0f} ms)"
    return Candidate(COMPILED, fn, note=f"first call {first:.1f} s{eager}: the compile time")


def _train_case(cfg: BenchConfig, device: torch.device) -> Case:
    (n, k), _, _ = SIZES["quick" if cfg.quick else "full"]
    data = _data(n, k, device, torch.Generator().manual_seed(cfg.seed + 10))
    data.graph.prepare()
    torch.manual_seed(cfg.seed)
    base = NodeClassifier(0.1).to(device).train()

    def step(model: Any) -> Callable[[Tensor], Tensor]:
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        calls = [0]

        def fn(_: Tensor) -> Tensor:
            torch.manual_seed(cfg.seed + calls[0])
            calls[0] += 1
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(data.x, data.graph, data.edge_attr), data.y)
            loss.backward()
            opt.step()
            return loss.detach()

        return fn

    eager = step(copy.deepcopy(base))
    compiled = step(torch.compile(copy.deepcopy(base), fullgraph=True))
    e = data.graph.num_edges
    name = f"train step: GraphTransformer (2 x 64, 4 heads, dropout 0.1, edge_dim 4), kNN N={n:,}, |E|={e:,}"  # noqa: E501
    # Not compared: the compiled model's dropout need not draw eager's masks.
    return _case(name, device, eager, compiled, compare=False)


def _step_case(
    name: str, device: torch.device, baseline: str, cands: list[Candidate], compare: bool
) -> Case:
    """A case of whole steps (each candidate runs its own forward and backward); with
    ``compare``, each candidate's output (what its step returns) against the baseline's."""
    dummy = torch.zeros(1, device=device)
    return Case(
        "compile",
        name,
        dummy,
        dummy,
        baseline,
        cands,
        modes=("step",),
        compare=compare,
        memory=False,
    )


def _case(
    name: str,
    device: torch.device,
    eager: Callable[[Tensor], Any],
    compiled: Callable[[Tensor], Any],
    compare: bool,
) -> Case:
    """Eager (the baseline) and compiled, the compiled one's first call made and timed here,
    after eager's first call (numba's kernels compiled, the graph's caches filled)."""
    dummy = torch.zeros(1, device=device)
    eager_s = _first_call_s(lambda: eager(dummy))
    cands = [Candidate(EAGER, eager), _compiled(compiled, dummy, eager_s)]
    return _step_case(name, device, EAGER, cands, compare)


def _sparse_case(cfg: BenchConfig, device: torch.device) -> Case:
    from ...graphs import AttentionGraph
    from ...nn import TransformerConv

    _, (n, deg), _ = SIZES["quick" if cfg.quick else "full"]
    gen = torch.Generator().manual_seed(cfg.seed + 40)
    src = torch.randint(0, n, (n * deg,), generator=gen)
    ei = torch.stack([src, torch.arange(n).repeat_interleave(deg)]).to(device)
    graph = AttentionGraph(ei, n).prepare()
    ea = torch.randn(n * deg, 4, generator=gen).to(device)
    x = torch.randn(n, 64, generator=gen).to(device).requires_grad_()
    torch.manual_seed(cfg.seed)
    layer = TransformerConv(64, 16, heads=4, edge_dim=4).to(device)
    compiled_layer = torch.compile(layer, fullgraph=True)

    def run(m: Callable[..., Tensor]) -> Callable[[Tensor], Tensor]:
        def fn(_: Tensor) -> Tensor:
            out = m(x, graph, ea)
            out.square().mean().backward()
            return out.detach()

        return fn

    name = f"sparse layer: TransformerConv(64, 16, heads=4, edge_dim=4) fwd+bwd, N={n:,}, {deg} in-edges"  # noqa: E501
    return _case(name, device, run(layer), run(compiled_layer), compare=True)


def _small_cases(cfg: BenchConfig, device: torch.device) -> list[Case]:
    _, _, sizes = SIZES["quick" if cfg.quick else "full"]
    gen = torch.Generator().manual_seed(cfg.seed + 50)
    cases = []
    for graphs in sizes:
        batches = []
        for _ in range(BATCHES):
            b, ei = molecule_batch(graphs, gen)
            x = torch.randn(b.numel(), 64, generator=gen)
            ea = torch.randn(ei.shape[1], 16, generator=gen)
            batches.append(tuple(t.to(device) for t in (x, ei, ea, b)))
        nodes = sum(t[0].shape[0] for t in batches) / BATCHES
        edges = sum(t[1].shape[1] for t in batches) / BATCHES
        desc = f"{graphs} molecule-sized graphs per batch (~{nodes:.0f} nodes, ~{edges:.0f} edges), {BATCHES} batches fwd+bwd"  # noqa: E501
        cases.append(_small_tc(desc, device, batches, cfg.seed))
        cases.append(_small_gps(desc, device, batches, cfg.seed))
    return cases


def _loop(
    call: Callable[[tuple[Tensor, ...]], Tensor], batches: list
) -> Callable[[Tensor], Tensor]:
    """Forward + backward of ``call`` on every batch in turn; returns the last batch's
    output (detached), what the case compares."""

    def fn(_: Tensor) -> Tensor:
        out = None
        for batch in batches:
            x = batch[0].requires_grad_()
            out = call(batch)
            out.square().mean().backward()
            x.grad = None
        assert out is not None
        return out.detach()

    return fn


def _small_case(
    name: str,
    device: torch.device,
    batches: list,
    peer: tuple[str, Callable[[tuple[Tensor, ...]], Tensor]],
    eager: Callable[[tuple[Tensor, ...]], Tensor],
    compiled: Callable[[tuple[Tensor, ...]], Tensor],
) -> Case:
    """PyG's layer (the baseline), gnnattn's eager and compiled, each over every batch,
    with the same weights: the last batch's outputs are compared; the compiled one's
    first call (its compile) is made and timed here."""
    cands = [
        Candidate(peer[0], _loop(peer[1], batches)),
        Candidate(EAGER, _loop(eager, batches)),
        _compiled(_loop(compiled, batches), torch.zeros(1, device=device), None),
    ]
    return _step_case(name, device, peer[0], cands, compare=True)


def _small_tc(desc: str, device: torch.device, batches: list, seed: int) -> Case:
    import torch_geometric.nn as pyg_nn

    from ...nn import TransformerConv

    torch.manual_seed(seed)
    ref = pyg_nn.TransformerConv(64, 16, heads=4, edge_dim=16).to(device)
    ours = TransformerConv(64, 16, heads=4, edge_dim=16).to(device)
    ours.load_state_dict(ref.state_dict())
    comp = torch.compile(copy.deepcopy(ours), dynamic=True)
    name = f"small graphs: TransformerConv(64, 16, heads=4, edge_dim=16), {desc}"
    return _small_case(
        name,
        device,
        batches,
        ("PyG TransformerConv", lambda b: ref(b[0], b[1], b[2])),
        lambda b: ours(b[0], b[1], b[2]),
        lambda b: comp(b[0], b[1], b[2]),
    )


def _small_gps(desc: str, device: torch.device, batches: list, seed: int) -> Case:
    from ...graphs import AttentionGraph
    from .pyg import GPSSize, _gps_pair

    torch.manual_seed(seed)
    ref, ours = _gps_pair(GPSSize(1, 1, 1, 64, 4, 2), device)
    ref.train(), ours.train()
    comp = torch.compile(copy.deepcopy(ours), dynamic=True)

    def compiled(b: tuple[Tensor, ...]) -> Tensor:
        # Built and prepared outside the compiled region, as compiling needs.
        return comp(b[0], b[1], b[3], attn_graph=AttentionGraph.from_batch(b[3]).prepare())

    name = f"small graphs: GPSConv(64, GINConv, heads=4), train mode, {desc}"
    return _small_case(
        name,
        device,
        batches,
        ("PyG GPSConv", lambda b: ref(b[0], b[1], b[3])),
        lambda b: ours(b[0], b[1], b[3]),
        compiled,
    )


def compile_rows(
    cfg: BenchConfig, log: Callable[[str], None] | None = None
) -> list[dict[str, Any]]:
    """Every case of the suite, run through the interleaved harness; a part that raises
    (making its inputs, an eager first call) is an error row, and the others still run."""
    device = torch.device(cfg.device)
    rows: list[dict[str, Any]] = []
    builders: list[tuple[str, Callable[[], Case | list[Case]]]] = [
        ("train step", lambda: _train_case(cfg, device)),
        ("sparse layer", lambda: _sparse_case(cfg, device)),
        ("small graphs", lambda: _small_cases(cfg, device)),
    ]
    for what, build in builders:
        try:
            made = build()
            for case in made if isinstance(made, list) else [made]:
                if log is not None:
                    log(f"running [compile] {case.name}")
                rows += run_case(case, "step", cfg)
        except Exception as err:  # noqa: BLE001 - keep the other parts' rows
            rows.append(error_row("compile", what, err))
    return rows
