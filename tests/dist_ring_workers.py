"""Worker functions of ``tests/test_ring.py``, run on every rank by ``tests/ranks.py``.

Every rank builds the same seeded whole-sequence ``q``, ``k``, ``v`` (float64),
computes dense attention and its gradients itself, runs the ring on its shard
and returns its largest errors; the test process asserts on them.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
import torch.distributed as dist

from gnnattn.distributed import SequencePart, ring_attention, sequence_shard


def _inputs(case: dict[str, Any]) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(case["seed"])
    t, h, c, cv = case["T"], case["H"], case["C"], case["Cv"]
    q, k = (torch.randn(t, h, c, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(t, h, cv, generator=g, dtype=torch.float64)
    go = torch.randn(t, h, cv, generator=g, dtype=torch.float64)  # d loss / d out
    gl = torch.randn(t, h, generator=g, dtype=torch.float64)  # d loss / d lse
    return q, k, v, go, gl


def dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool):
    """Plain softmax attention of the whole sequence: ``(out [T, H, Cv], lse [T, H])``."""
    s = torch.einsum("ihc,jhc->hij", q, k) / math.sqrt(q.shape[2])  # [H, T, T]
    if causal:
        t = q.shape[0]
        s = s.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), -math.inf)
    return torch.einsum("hij,jhc->ihc", s.softmax(-1), v), s.logsumexp(-1).T


def _max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max()) if a.numel() else 0.0


def _one(case: dict[str, Any], group: Any) -> dict[str, Any]:
    q, k, v, go, gl = _inputs(case)
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse = dense(*full, case["causal"])
    ((out * go).sum() + (lse * gl).sum()).backward()
    part = SequencePart(case["T"], causal=case["causal"], layout=case["layout"], group=group)
    local = [part.shard(t).requires_grad_() for t in (q, k, v)]
    if case.get("wrong_layout"):  # the shard of one layout, computed as another's
        r_out, r_lse = ring_attention(
            *local, causal=True, layout="contiguous", group=group, return_lse=True
        )
    else:
        res = part.attention(*local, return_lse=True)
        assert res.backend == "ring" and res.weights is None
        r_out, r_lse = res.out, res.lse
    ((r_out * part.shard(go)).sum() + (r_lse * part.shard(gl)).sum()).backward()
    refs = [out, lse, *(t.grad for t in full)]
    gots = [r_out, r_lse, *(t.grad for t in local)]
    names = ["out", "lse", "dq", "dk", "dv"]
    return {
        "case": case,
        "rank": part.rank,
        "rows": len(part.tokens),
        "err": {n: _max_err(g, part.shard(r)) for n, g, r in zip(names, gots, refs, strict=True)},
        # Non-trivial: the largest entry of what the ring returned (zero would be suspect).
        "size": {
            n: float(g.abs().max()) if g.numel() else 0.0 for n, g in zip(names, gots, strict=True)
        },
    }


def check(cases: list[dict[str, Any]], sizes: list[int]) -> list[dict[str, Any]]:
    """Run each case on the ring of its ``case["P"]`` ranks (a subgroup of the
    last ranks when smaller than the world, so group ranks are not global ones)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    groups = {}
    for p in sizes:  # every rank creates every group, in the same order
        members = list(range(world - p, world))
        groups[p] = (None if p == world else dist.new_group(members), rank in members)
    results = []
    for case in cases:
        group, member = groups[case["P"]]
        if member:
            results.append(_one(case, group))
    return results


def _message(fn: Any) -> str:
    try:
        fn()
    except (ValueError, TypeError) as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


def errors() -> dict[str, str]:
    """The messages of bad calls, on every rank (none may hang)."""
    rank, last = dist.get_rank(), dist.get_world_size() - 1
    part = SequencePart(7, causal=True)
    q = part.shard(torch.randn(7, 2, 4))
    t = torch.randn(1, 1)
    bad = {
        "score_bias": lambda: part.attention(q, q, q, score_bias=t),
        "edge_attr": lambda: part.attention(q, q, q, edge_attr=t),
        "edge_key": lambda: part.attention(q, q, q, edge_key=t),
        "edge_value": lambda: part.attention(q, q, q, edge_value=t),
        "dropout_p": lambda: part.attention(q, q, q, dropout_p=0.1),
        "need_weights": lambda: part.attention(q, q, q, need_weights=True),
        "backend": lambda: part.attention(q, q, q, backend="sdpa"),
        "rows": lambda: part.attention(q[1:], q[1:], q[1:]),
        "shard": lambda: part.shard(torch.randn(6, 2)),
        # One rank with a row too many: every rank raises (the sizes are
        # gathered first), so none waits for a block that never comes.
        "sizes": lambda: ring_attention(*([torch.randn(3 + (rank == last), 2, 4)] * 3)),
        "heads": lambda: ring_attention(*[torch.randn(3, 1 + (rank == 0), 4)] * 3),
        "mask": lambda: ring_attention(*[torch.randn(3, 2, 4)] * 3, causal=rank == 0),
    }
    msgs = {name: _message(fn) for name, fn in bad.items()}
    msgs["default_shard"] = str(sequence_shard(7).tolist() == part.tokens.tolist())
    # p = 1 drops every weight (a layer's dropout=1 in training): zeros, no refusal.
    qg = q.clone().requires_grad_()
    out = part.attention(qg, qg, qg, dropout_p=1.0)
    out.sum().backward()
    msgs["dropout_one"] = str(not out.any().item() and not qg.grad.any().item())
    return msgs


def nonfinite(T: int, layout: str) -> dict[str, Any]:
    """NaN in one value and one query of a causal sequence: only the targets that
    see them turn NaN (a value of a future token is not an edge)."""
    q, k, v, go, _ = _inputs({"seed": 5, "T": T, "H": 2, "C": 4, "Cv": 3})
    j0, i0 = T // 2, T // 3
    vn, qn = v.clone(), q.clone()
    vn[j0, 1, 0] = math.nan
    qn[i0, 0, 2] = math.nan
    clean, _ = dense(q, k, v, True)
    part = SequencePart(T, causal=True, layout=layout)
    ql = part.shard(qn).requires_grad_()
    out = part.attention(ql, part.shard(k), part.shard(vn))
    (out * part.shard(go)).sum().backward()
    ids = part.tokens
    nan_rows = (ids >= j0) | (ids == i0)
    return {
        "nan_where_expected": bool(
            out[nan_rows.nonzero().squeeze(1)].isnan().flatten(1).any(1).all()
        ),
        "err_elsewhere": _max_err(out[~nan_rows], clean[ids][~nan_rows]),
        "dq_finite_before": bool(ql.grad[(ids < min(i0, j0))].isfinite().all()),
    }


def dtypes() -> dict[str, Any]:
    """float32 / float16 / bfloat16 on the ring (reduced in float32): dtypes kept, errors."""
    q, k, v, go, _ = _inputs({"seed": 3, "T": 37, "H": 2, "C": 8, "Cv": 4})
    ref, _ = dense(q, k, v, True)
    part = SequencePart(37, causal=True, layout="zigzag")
    res = {}
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        x = [part.shard(t).to(dt).requires_grad_() for t in (q, k, v)]
        out = part.attention(*x, return_lse=True)
        (out.out.double() * part.shard(go)).sum().backward()
        res[str(dt)] = {
            "dtypes": [str(t.dtype) for t in (out.out, out.lse, *(t.grad for t in x))],
            "err": _max_err(out.out.double(), part.shard(ref)),
            "grads_finite": all(bool(t.grad.isfinite().all()) for t in x),
        }
    return res


def timing(T: int, H: int, C: int, causal: bool, layout: str, repeat: int) -> dict[str, float]:
    """Wall and CPU seconds of this rank's forward + backward of the ring, float32
    (best of ``repeat``; not a test: ``README.md``'s figure)."""
    part = SequencePart(T, causal=causal, layout=layout)
    g = torch.Generator().manual_seed(0)
    x = [part.shard(torch.randn(T, H, C, generator=g)).requires_grad_() for _ in range(3)]
    wall = cpu = math.inf
    for _ in range(repeat):
        dist.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        part.attention(*x).sum().backward()
        c1 = time.process_time()
        dist.barrier()
        wall, cpu = min(wall, time.perf_counter() - t0), min(cpu, c1 - c0)
    return {"seconds": wall, "cpu": cpu}


def suite(cases: list[dict[str, Any]], sizes: list[int], nonfinite_T: int) -> dict[str, Any]:
    """Everything ``test_ring.py`` checks, in one launch (starting ranks is the slow part)."""
    return {
        "check": check(cases, sizes),
        "errors": errors(),
        "dtypes": dtypes(),
        "nonfinite": {lay: nonfinite(nonfinite_T, lay) for lay in ("contiguous", "zigzag")},
    }
