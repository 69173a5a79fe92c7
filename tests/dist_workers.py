"""What each rank runs in tests/test_distributed.py (launched by tests/ranks.py).

Every rank builds the same seeded graph, model and inputs, computes the
single-process reference over the whole graph itself (the graphs are small),
then its part's forward and backward, and returns the largest differences:
outputs of its targets, gradients of the inputs and edge features it owns,
and the parameters' gradients summed over the ranks. The full-graph loss is
linear in the outputs, ``(out * w).sum()``, so the sum of the ranks' losses
is the single-process loss.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

import gnnattn
from gnnattn import AttentionGraph, GraphTransformer, TransformerConv
from gnnattn.distributed import Partition, SequencePart, all_reduce_gradients, partition


def _graph(case: dict[str, Any], g: torch.Generator) -> tuple[torch.Tensor, int, int]:
    """``(edge_index, num_src, num_dst)``: random edges plus the case's special nodes."""
    n, m = case["n"], case.get("m", case["n"])
    e = case.get("e", 4 * n)
    ei = torch.stack(
        [torch.randint(0, m, (e,), generator=g), torch.randint(0, n, (e,), generator=g)]
    )
    extra = []
    if case.get("hub"):  # target 0 reads every source
        extra.append(torch.stack([torch.arange(m), torch.zeros(m, dtype=torch.int64)]))
    if case.get("isolated"):  # the last 3 targets have no in-edges; the last 3 sources no out-edges
        keep = (ei[1] < n - 3) & (ei[0] < m - 3)
        ei = ei[:, keep]
    if extra:
        ei = torch.cat([ei, *extra], 1)
    return ei, m, n


def _model(case: dict[str, Any]) -> torch.nn.Module:
    torch.manual_seed(1)
    if case["model"] == "transformer":
        return GraphTransformer(
            case.get("layers", 2),
            12,
            3,
            ffn_dim=16,
            causal=case.get("causal", False),
            edge_dim=case.get("edge_dim"),
            edge_value=case.get("edge_value", False),
        ).double()
    in_ch = (7, 5) if case.get("bipartite") else 7
    return TransformerConv(in_ch, 4, heads=2, edge_dim=case.get("edge_dim"), beta=True).double()


def _owner(case: dict[str, Any], graph: AttentionGraph, world: int) -> Partition:
    if case.get("owner") == "empty_rank":  # the last rank owns no targets
        owner = torch.arange(graph.num_dst) % max(world - 1, 1)
        return Partition(graph, owner, world, "given")
    if case.get("owner") == "all_remote":  # target 1's sources all live elsewhere
        owner = torch.arange(graph.num_dst) % world
        return Partition(graph, owner, world, "given")
    return partition(graph, world, method=case["method"], seed=3)


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item() if a.numel() else 0.0


def check(cases: list[dict[str, Any]], worlds: list[int]) -> dict[int, list[dict[str, float]]]:
    """Every case on P ranks for each P of ``worlds`` (the first P ranks of the launch, in a
    group of their own: one launch serves every P); per P, this rank's largest differences
    to one process, per case (nothing where this rank is not among the P)."""
    out = {}
    for world in worlds:
        group = dist.new_group(list(range(world)))  # collective: every rank makes it
        if dist.get_rank() < world:
            out[world] = _check(cases, group) + [_sequence(group)]
        dist.barrier()
    return out


def _check(cases: list[dict[str, Any]], group: Any) -> list[dict[str, float]]:
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    results = []
    for case in cases:
        g = torch.Generator().manual_seed(case.get("seed", 0))
        ei, m, n = _graph(case, g)
        if case.get("owner") == "all_remote":
            # Target 1 reads sources that are all on other ranks (ids != 1 mod world).
            srcs = torch.tensor(
                [s for s in range(m) if s % world != 1 % world][:5], dtype=torch.int64
            )
            ei = torch.cat([ei[:, ei[1] != 1], torch.stack([srcs, torch.ones_like(srcs)])], 1)
        bip = bool(case.get("bipartite"))
        graph = AttentionGraph(ei, n, num_src=m if bip else None, causal=case.get("causal", False))
        model = _model(case)
        d_src = 7 if case["model"] == "conv" else 12
        d_dst = 5 if bip else d_src
        x_src = torch.randn(m, d_src, generator=g, dtype=torch.float64, requires_grad=True)
        x_dst = torch.randn(n, d_dst, generator=g, dtype=torch.float64, requires_grad=True)
        f = case.get("edge_dim")
        ea = None
        if f is not None:
            ea = torch.randn(ei.shape[1], f, generator=g, dtype=torch.float64, requires_grad=True)
        # One process: the whole graph.
        x_full = (x_src, x_dst) if bip else x_src
        backend = case.get("backend")
        out = model(x_full, graph, ea, backend=backend)
        w = torch.randn(out.shape, generator=g, dtype=torch.float64)
        (out * w).sum().backward()
        ref = {
            "out": out.detach(),
            "x_src": x_src.grad.clone(),
            "x_dst": x_dst.grad.clone() if bip else None,
            "ea": ea.grad.clone() if ea is not None else None,
            "params": [p.grad.clone() for p in model.parameters()],
        }
        for t in (x_src, x_dst, ea):
            if t is not None:
                t.grad = None
        model.zero_grad(set_to_none=True)
        # This rank's part.
        part = _owner(case, graph, world).part(rank, group)
        x_loc = (part.shard_src(x_src), part.shard(x_dst)) if bip else part.shard(x_src)
        ea_loc = part.shard_edges(ea) if ea is not None else None
        out_p = model(x_loc, part, ea_loc, backend=backend)
        (out_p * part.shard(w)).sum().backward()
        all_reduce_gradients(model, group)
        err = {
            "out": (out_p - part.shard(ref["out"])).abs().max().item() if out_p.numel() else 0.0,
            "params": max(
                (p.grad - r).abs().max().item()
                for p, r in zip(model.parameters(), ref["params"], strict=True)
            ),
        }
        # Input gradients: each rank holds its own rows' (the halo's came back to it).
        own_src = part.sources if bip else part.targets
        gx = x_src.grad if x_src.grad is not None else torch.zeros_like(x_src)
        err["x_src"] = (
            (gx[own_src] - ref["x_src"][own_src]).abs().max().item() if own_src.numel() else 0.0
        )
        if bip:
            gd = x_dst.grad if x_dst.grad is not None else torch.zeros_like(x_dst)
            t = part.targets
            err["x_dst"] = _diff(gd[t], ref["x_dst"][t])
        if ea is not None:
            ge = ea.grad if ea.grad is not None else torch.zeros_like(ea)
            ids = part.edge_ids
            err["ea"] = _diff(ge[ids], ref["ea"][ids])
        err["scale"] = ref["out"].abs().max().item()
        err["targets"] = part.num_targets
        err["halo"] = part.halo.numel()
        results.append(err)
    return results


def traffic(n: int, heads: int, channels: int) -> dict[str, Any]:
    """One SelfAttentionConv forward and backward: the bytes counted by the part, and what
    the halo rows times the row size say they should be."""
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(5)
    ei = torch.randint(0, n, (2, 5 * n), generator=g)
    part = partition(AttentionGraph(ei, n), world, method="random", seed=1).part(rank)
    torch.manual_seed(0)
    conv = gnnattn.SelfAttentionConv(heads * channels, heads).double()
    x = torch.randn(n, heads * channels, generator=g, dtype=torch.float64)
    out = conv(part.shard(x), part)
    out.sum().backward()
    row = 2 * heads * channels * 8  # one key and one value row, float64
    return {
        "forward": part.traffic["forward"],
        "backward": part.traffic["backward"],
        "sent_rows": part.send_index.numel(),
        "halo_rows": part.halo.numel(),
        "row_bytes": row,
    }


def _sequence(group: Any) -> dict[str, float]:
    """A causal GraphTransformer on a SequencePart (ring, zigzag) against the whole sequence."""
    t = 23
    torch.manual_seed(2)
    model = GraphTransformer(2, 12, 3, ffn_dim=16, causal=True).double()
    g = torch.Generator().manual_seed(7)
    x = torch.randn(t, 12, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(t, 12, generator=g, dtype=torch.float64)
    (model(x) * w).sum().backward()
    ref_x, ref_p = x.grad.clone(), [p.grad.clone() for p in model.parameters()]
    x.grad = None
    model.zero_grad(set_to_none=True)
    part = SequencePart(t, causal=True, layout="zigzag", group=group)
    out = model(part.shard(x), part)
    (out * part.shard(w)).sum().backward()
    all_reduce_gradients(model, group)
    with torch.no_grad():
        ref = model(x)
    params = zip(model.parameters(), ref_p, strict=True)
    own = part.tokens
    return {
        "out": _diff(out, ref[own]),
        "params": max(_diff(p.grad, r) for p, r in params),
        "x_src": _diff(x.grad[own], ref_x[own]),
        "scale": ref.abs().max().item(),
        "targets": own.numel(),
        "halo": 1,
    }


def training_helpers() -> dict[str, Any]:
    """all_reduce_gradients and broadcast_parameters on 3 ranks, and a one-part partition
    used in that world."""
    from gnnattn import SelfAttentionConv
    from gnnattn.distributed import broadcast_parameters

    rank = dist.get_rank()
    res: dict[str, Any] = {}
    # Mixed precision, an unused parameter and a held reference to a gradient.
    torch.manual_seed(0)
    low = torch.nn.Linear(3, 3).bfloat16()
    model = torch.nn.ModuleDict({"low": low, "full": torch.nn.Linear(3, 3)})
    model["unused"] = torch.nn.Linear(3, 3)
    x = torch.full((2, 3), float(rank + 1)).bfloat16()
    model["full"](model["low"](x).float()).sum().backward()
    held = model["full"].bias.grad
    all_reduce_gradients(model)
    res["dtypes"] = [str(p.grad.dtype) for p in model["low"].parameters()]
    res["unused_grad_is_none"] = model["unused"].weight.grad is None
    res["in_place"] = held is model["full"].bias.grad
    res["bias_grad"] = model["full"].bias.grad.tolist()  # 2 rows per rank, 3 ranks: 6
    # broadcast_parameters' src is a rank within its group: here global rank 1.
    group = dist.new_group([1, 2])
    lin = torch.nn.Linear(2, 2)
    torch.nn.init.constant_(lin.weight, float(rank))
    if rank in (1, 2):
        broadcast_parameters(lin, src=0, group=group)
    res["weight"] = lin.weight.flatten().tolist()
    # A one-part partition needs no exchange, whatever the world size.
    g = torch.Generator().manual_seed(3)
    graph = AttentionGraph(torch.randint(0, 12, (2, 40), generator=g), 12)
    torch.manual_seed(0)
    conv = SelfAttentionConv(8, 2)
    xs = torch.randn(12, 8, generator=g)
    part = partition(graph, 1).part(0)
    res["one_part"] = (conv(part.shard(xs), part) - conv(xs, graph)).abs().max().item()
    return res
