"""Ring attention (``gnnattn.distributed.ring``) equals dense attention.

One launch of 4 gloo ranks of one thread (``tests/ranks.py``; starting ranks
costs far more than the cases) runs every case on rings of 1, 2, 3 and 4 ranks
(subgroups of the last ranks, so group ranks differ from global ones): complete
and causal, contiguous and zig-zag, ``T`` not divisible by ``P``, ``T < P``
(ranks without tokens), several heads, ``Cv != C``, the gradients of ``q``,
``k``, ``v`` and of the log-sum-exp, and one sequence of 1500 tokens. Each rank
computes the dense reference itself; this process asserts on the errors.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from ranks import run_ranks

from gnnattn.distributed import SequencePart, ring_attention, sequence_shard
from gnnattn.distributed.ring import LAYOUTS

WORLD = 4
SIZES = [1, 2, 3, 4]
TOL = 1e-10  # float64


def _cases() -> list[dict[str, Any]]:
    cases = []
    for p in SIZES:
        # T < P (a rank without tokens), T < 2P (zig-zag ranks with one chunk),
        # and T divisible by neither P nor 2P.
        lengths = sorted({max(p - 1, 1), 2 * p - 1, 6 * p + 5})
        for t in lengths:
            for causal in (False, True):
                for layout in LAYOUTS:
                    h, c, cv = (3, 4, 5) if t % 2 else (2, 6, 3)
                    case = dict(P=p, T=t, H=h, C=c, Cv=cv, causal=causal, layout=layout)
                    cases.append({**case, "seed": len(cases)})
    big = dict(P=4, T=1500, H=2, C=8, Cv=4, causal=True, layout="zigzag", seed=99)
    # The shard of zig-zag computed as if contiguous (same sizes: 2P divides T):
    # a wrong block order that the checks below must see.
    wrong = dict(P=4, T=64, H=2, C=4, Cv=4, causal=True, layout="zigzag", seed=7)
    return [*cases, big, {**wrong, "wrong_layout": True}]


@pytest.fixture(scope="module")
def launched() -> dict[str, Any]:
    ranks = run_ranks(
        "dist_ring_workers:suite", WORLD, timeout=300, cases=_cases(), sizes=SIZES, nonfinite_T=23
    )
    return {"ranks": ranks, "check": [r for rank in ranks for r in rank["check"]]}


def test_ring_equals_dense(launched: dict[str, Any]) -> None:
    done = [r for r in launched["check"] if not r["case"].get("wrong_layout")]
    assert len(done) == sum(c["P"] for c in _cases() if not c.get("wrong_layout"))
    bad = [(r["case"], r["rank"], r["err"]) for r in done if max(r["err"].values()) > TOL]
    assert not bad, bad
    for r in done:
        if r["rows"]:  # not trivially zero: out and every gradient carry numbers
            assert min(r["size"].values()) > 1e-3, (r["case"], r["size"])


def test_every_token_is_computed_once(launched: dict[str, Any]) -> None:
    rows: dict[tuple, list[int]] = {}
    for r in launched["check"]:
        rows.setdefault(tuple(sorted(r["case"].items())), []).append(r["rows"])
    for key, counts in rows.items():
        case = dict(key)
        assert len(counts) == case["P"] and sum(counts) == case["T"], (case, counts)
    assert any(0 in counts for counts in rows.values())  # T < P was run


def test_wrong_block_order_is_caught(launched: dict[str, Any]) -> None:
    wrong = [r for r in launched["check"] if r["case"].get("wrong_layout")]
    assert len(wrong) == 4
    assert max(r["err"]["out"] for r in wrong) > 1e-2


def test_unsupported_options_raise_on_every_rank(launched: dict[str, Any]) -> None:
    for rank in launched["ranks"]:
        msgs = rank["errors"]
        for option in ("score_bias", "edge_attr", "edge_key", "edge_value"):
            assert msgs[option].startswith("ValueError") and option in msgs[option]
            assert "never built" in msgs[option]
        assert "dropout_p" in msgs["dropout_p"] and "need_weights" in msgs["need_weights"]
        assert "'backend'" in msgs["backend"] and "'ring'" in msgs["backend"]
        assert msgs["rows"].startswith("ValueError") and "part.shard" in msgs["rows"]
        assert msgs["shard"].startswith("ValueError") and "[7, ...]" in msgs["shard"]
        assert "sequence_shard(T=13" in msgs["sizes"] and "[4, 3, 3, 3]" in msgs["sizes"]
        assert "same heads" in msgs["heads"]
        assert "'causal' and 'layout'" in msgs["mask"] and "[3, 2, 4, 4, 2, 1, 0]" in msgs["mask"]
        assert msgs["default_shard"] == "True"
        assert msgs["dropout_one"] == "True"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_nonfinite_contract(launched: dict[str, Any], layout: str) -> None:
    for rank in launched["ranks"]:
        res = rank["nonfinite"][layout]
        assert res["nan_where_expected"], res
        assert res["err_elsewhere"] < 1e-12, res  # a future token's NaN value is no edge
        assert res["dq_finite_before"], res


@pytest.mark.parametrize(
    "dtype,tol", [("torch.float32", 1e-5), ("torch.float16", 2e-3), ("torch.bfloat16", 2e-2)]
)
def test_low_precision_keeps_dtypes(launched: dict[str, Any], dtype: str, tol: float) -> None:
    for rank in launched["ranks"]:
        res = rank["dtypes"][dtype]
        # out and the gradients in the inputs' dtype, lse in float32 (the reductions').
        assert res["dtypes"] == [dtype, "torch.float32", dtype, dtype, dtype], res
        assert res["err"] < tol and res["grads_finite"], res


# In-process: no process group needed.


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("t,p", [(10, 3), (7, 4), (3, 4), (0, 2), (100, 1), (1001, 8)])
def test_sequence_shard_partitions_the_sequence(layout: str, t: int, p: int) -> None:
    shards = [sequence_shard(t, layout=layout, rank=r, world_size=p) for r in range(p)]
    assert torch.equal(torch.cat(shards).sort().values, torch.arange(t))
    assert all(torch.equal(s, s.sort().values) for s in shards)  # ascending
    sizes = [len(s) for s in shards]
    assert max(sizes) - min(sizes) <= (1 if layout == "contiguous" else 2)
    if layout == "zigzag" and t >= 2 * p:
        # Balanced causal work: the pairs j <= i of each rank's targets.
        work = [int((s + 1).sum()) for s in shards]
        assert max(work) - min(work) <= 2 * t, work


def test_sequence_shard_layouts() -> None:
    assert sequence_shard(10, rank=0, world_size=3).tolist() == [0, 1, 2, 3]
    assert sequence_shard(8, layout="zigzag", rank=1, world_size=2).tolist() == [2, 3, 4, 5]
    assert sequence_shard(1, layout="zigzag", rank=1, world_size=2).tolist() == []


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(num_tokens=-1, rank=0, world_size=1), ValueError, "'num_tokens'"),
        (dict(num_tokens=4, layout="ring", rank=0, world_size=1), ValueError, "'layout'"),
        (dict(num_tokens=4, rank=2, world_size=2), ValueError, "'rank' in \\[0, 2\\)"),
        (dict(num_tokens=4, rank=0), ValueError, "both given or both None"),
        (dict(num_tokens=4, rank=0, world_size=0), ValueError, "'world_size'"),
        (dict(num_tokens=4.0, rank=0, world_size=1), TypeError, "'num_tokens'"),
    ],
)
def test_sequence_shard_errors(kwargs: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        sequence_shard(**kwargs)


def test_checks_before_any_communication() -> None:
    x = torch.randn(4, 2, 3)
    with pytest.raises(TypeError, match="'q' to be a Tensor"):
        ring_attention([1.0], x, x)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'k' of shape \\[T_local, H, C\\]"):
        ring_attention(x, x[0], x)
    with pytest.raises(ValueError, match="'v' \\[T_local, H, Cv\\]"):
        ring_attention(x, x, x[:3])
    with pytest.raises(TypeError, match="'k' of dtype"):
        ring_attention(x, x.long(), x)
    with pytest.raises(ValueError, match="'layout'"):
        ring_attention(x, x, x, layout="striped")
    with pytest.raises(ValueError, match="'scale'"):
        ring_attention(x, x, x, scale=float("nan"))
    if not dist.is_initialized():
        with pytest.raises(ValueError, match="dist.init_process_group"):
            ring_attention(x, x, x)
        with pytest.raises(ValueError, match="dist.init_process_group"):
            SequencePart(4)
        with pytest.raises(ValueError, match="'rank' and 'world_size'"):
            sequence_shard(4)
