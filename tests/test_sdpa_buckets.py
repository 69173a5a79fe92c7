"""The ``"sdpa"`` backend on blocks of different lengths: bucketed by length.

Every block is checked against dense attention on that block alone (float64,
1e-10), outputs and gradients, for awkward mixes of lengths; the plan's
buckets are checked to cover every block once within the padding bound; and
a change to one graph's rows must leave every other graph's outputs and
gradients exactly as they were (no padding mask leaks between graphs).
Complete blocks short enough for the block kernel take it on the CPU; the
``complete_buckets`` cases force them into buckets too.
"""

from __future__ import annotations

import math

import pytest
import torch

from gnnattn import AttentionGraph, attention
from gnnattn.ops import sdpa
from gnnattn.ops.sdpa import MAX_PADDING, sdpa_plan

H, C = 2, 3
MIXES = {
    "ones": [1, 1, 1],
    "one_and_two": [1, 2, 1, 2, 2],
    "primes": [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31],
    "huge_and_tiny": [97, 1, 2, 1, 3, 1, 1, 2, 5, 1],
    "tiny_then_huge": [1, 1, 2, 64, 63, 1],
    "shuffled": [9, 40, 1, 38, 12, 11, 40, 7, 39],
}


def _graph(kind: str, lengths: list[int]) -> AttentionGraph:
    if kind in ("complete", "complete_buckets"):
        return AttentionGraph.complete(lengths=lengths)
    if kind == "causal":
        return AttentionGraph.causal(lengths=lengths)
    return AttentionGraph.window(window=3, lengths=lengths, causal=kind == "causal_window")


def _block_mask(kind: str, t: int) -> torch.Tensor:
    """``[T, T]`` which keys each query of one block attends (``True`` = attend)."""
    d = torch.arange(t).view(-1, 1) - torch.arange(t).view(1, -1)
    if kind in ("complete", "complete_buckets"):
        return torch.ones(t, t, dtype=torch.bool)
    if kind == "causal":
        return d >= 0
    if kind == "causal_window":
        return (d >= 0) & (d <= 3)
    return d.abs() <= 3


def _per_block(q, k, v, kind, lengths, scale):
    """Dense attention on every block alone, from the definition."""
    outs, start = [], 0
    for t in lengths:
        sl = slice(start, start + t)
        s = torch.einsum("nhc,mhc->hnm", q[sl], k[sl]) * scale  # (H, T, T)
        s = s.masked_fill(~_block_mask(kind, t), -math.inf)
        outs.append(torch.einsum("hnm,mhc->nhc", torch.softmax(s, -1), v[sl]))
        start += t
    return torch.cat(outs)


def _qkv(n: int, seed: int = 0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, H, C, generator=g, dtype=dtype).requires_grad_() for _ in range(3)]


@pytest.fixture
def buckets_only(monkeypatch):
    """Complete blocks in buckets too (not the block kernel, which takes the short ones)."""
    monkeypatch.setattr(sdpa, "BLOCK_KERNEL_MAX", 0)


@pytest.mark.parametrize(
    "kind", ["complete", "complete_buckets", "causal", "window", "causal_window"]
)
@pytest.mark.parametrize("mix", list(MIXES))
def test_bucketed_equals_dense_per_block(kind: str, mix: str, request) -> None:
    if kind == "complete_buckets":
        request.getfixturevalue("buckets_only")
    lengths = MIXES[mix]
    graph = _graph(kind, lengths)
    if kind in ("window", "causal_window") and graph.structure.kind != kind:
        pytest.skip("every block fits in the window: the graph is complete/causal")
    q, k, v = _qkv(sum(lengths))
    got = attention(q, k, v, graph, scale=0.7, backend="sdpa")
    want = _per_block(q, k, v, kind, lengths, 0.7)
    torch.testing.assert_close(got, want, atol=1e-10, rtol=0)
    go = torch.randn_like(want)
    grads = torch.autograd.grad(got, (q, k, v), go)
    wants = torch.autograd.grad(want, (q, k, v), go)
    for a, b in zip(grads, wants, strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


def test_plan_covers_every_block_once_within_the_padding_bound() -> None:
    lengths = tuple(MIXES["huge_and_tiny"] + MIXES["primes"] + MIXES["shuffled"])
    plan = sdpa_plan(lengths, torch.device("cpu"))
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    assert sum(b.blocks for b in plan.buckets) == len(lengths)
    assert plan.rows.numel() == sum(b.blocks * b.length for b in plan.buckets)
    pos, seen = 0, []
    for bucket in plan.buckets:
        rows = plan.rows[pos : pos + bucket.blocks * bucket.length].view(bucket.blocks, -1)
        real = []
        for r in rows.tolist():
            block = starts.index(r[0])  # a padded row repeats its own block's last row
            t = lengths[block]
            assert r == [starts[block] + min(i, t - 1) for i in range(bucket.length)]
            real.append(t)
            seen.append(block)
        assert max(real) == bucket.length
        assert sum(t * t for t in real) >= (1 - MAX_PADDING) * bucket.blocks * bucket.length**2
        pos += bucket.blocks * bucket.length
    assert sorted(seen) == list(range(len(lengths)))
    # take: every row's own padded position, each real position once.
    assert torch.equal(plan.rows[plan.take], torch.arange(sum(lengths)))
    assert plan.take.unique().numel() == sum(lengths)


def test_plan_is_built_once_per_graph() -> None:
    # Causal: complete blocks this short take the block kernel, without buckets.
    graph = AttentionGraph.causal(lengths=[3, 1, 4])
    q, k, v = _qkv(8)
    attention(q, k, v, graph, backend="sdpa")
    key = ("sdpa_plan", "cpu")
    plan = graph.derived(key, lambda: pytest.fail("the plan was not kept on the graph"))
    attention(q, k, v, graph, backend="sdpa")
    assert graph.derived(key, lambda: None) is plan


@pytest.mark.parametrize("kind", ["complete", "complete_buckets", "causal", "window"])
def test_no_padding_leaks_between_graphs(kind: str, request) -> None:
    """Changing one graph's rows (to huge values) changes no other graph's
    output, and no other graph's rows get gradient from it."""
    if kind == "complete_buckets":
        request.getfixturevalue("buckets_only")
    lengths = [5, 1, 40, 6, 38, 2, 39]
    graph = _graph(kind, lengths)
    q, k, v = _qkv(sum(lengths), seed=1)
    base = attention(q, k, v, graph, backend="sdpa")
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    for g in range(len(lengths)):
        rows = slice(starts[g], starts[g] + lengths[g])
        q2, k2, v2 = (t.detach().clone() for t in (q, k, v))
        for t in (q2, k2, v2):
            t[rows] = 1e3 * torch.randn(lengths[g], H, C, dtype=t.dtype)
        out = attention(q2, k2, v2, graph, backend="sdpa")
        others = torch.ones(sum(lengths), dtype=torch.bool)
        others[rows] = False
        assert torch.equal(out[others], base[others].detach())
        # Gradient of this graph's outputs reaches no other graph's inputs.
        grads = torch.autograd.grad(base[rows].sum(), (q, k, v), retain_graph=True)
        for grad in grads:
            assert not grad[others].any()


def test_empty_and_single_graph() -> None:
    q, k, v = _qkv(0)
    out = attention(q, k, v, AttentionGraph.complete(lengths=[]), backend="sdpa")
    assert out.shape == (0, H, C)
    q, k, v = _qkv(1)
    out = attention(q, k, v, AttentionGraph.complete(lengths=[1]), backend="sdpa")
    torch.testing.assert_close(out, v, atol=1e-12, rtol=0)


def test_dropout_stays_inside_each_graph() -> None:
    """With attention dropout, an output row is still a combination of its own
    graph's values only (zero values elsewhere give zero there)."""
    lengths = [7, 1, 30, 3, 29]
    graph = AttentionGraph.complete(lengths=lengths)
    q, k, _ = _qkv(sum(lengths), seed=2)
    v = torch.zeros(sum(lengths), H, C, dtype=torch.float64)
    v[7:8] = 1.0  # only the single-node graph has nonzero values
    torch.manual_seed(0)
    out = attention(q, k, v, graph, dropout_p=0.5, backend="sdpa")
    # Its own row is its value dropped (0) or kept and rescaled (2).
    assert set(out[7:8].flatten().tolist()) <= {0.0, 2.0}
    assert not torch.cat([out[:7], out[8:]]).any()


@pytest.mark.parametrize("special", [math.nan, math.inf, 1e200, 1e150])
def test_non_finite_values_stay_in_their_graph(special: float) -> None:
    """The non-finite contract through the operator (with "auto" a NaN or inf input,
    or a finite one whose scores may overflow, 1e200 squared in float64, goes to
    the fused kernel; a huge one whose scores cannot, 1e150, stays on "sdpa"):
    only the graph of the special row can turn non-finite."""
    lengths = [4, 1, 23, 2, 21]
    graph = AttentionGraph.complete(lengths=lengths)
    q, k, v = (t.detach() for t in _qkv(sum(lengths), seed=3))
    for t in (q, k):
        t[9] = special  # a row of the third graph (rows 5..27)
    on_sdpa = special == 1e150  # scores up to 3 * 1e300: finite in float64
    if not on_sdpa:
        # Asked for by name, SDPA refuses inputs its kernels would get wrong; "auto"
        # takes the fused kernel for them.
        with pytest.raises(ValueError, match="backend='sdpa' takes finite"):
            attention(q, k, v, graph, backend="sdpa")
    out = attention(q, k, v, graph, backend="sdpa" if on_sdpa else "auto")
    ref = attention(q, k, v, graph, backend="mp")
    assert torch.equal(out.isnan(), ref.isnan())
    assert torch.isfinite(torch.cat([out[:5], out[28:]])).all()
    fin = torch.isfinite(ref)
    torch.testing.assert_close(out[fin], ref[fin], atol=1e-10, rtol=0)


@pytest.mark.parametrize("causal", [False, True])
def test_weights_on_edges_equal_mps_with_their_gradient(causal):
    # The weights of a batch of blocks: on the edges (linear in |E|, not a pass over
    # every edge per block), differentiable as mp's are.
    lengths = [3, 7, 1, 5]
    graph = (
        AttentionGraph.causal(lengths=lengths)
        if causal
        else AttentionGraph.complete(lengths=lengths)
    )
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(16, 2, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    grads = []
    for backend in ("mp", "sdpa"):
        qq = q.clone().requires_grad_()
        res = attention(qq, k, v, graph, backend=backend, need_weights=True)
        assert res.backend == backend
        (res.weights * torch.arange(res.weights.numel()).view_as(res.weights)).sum().backward()
        grads.append((res.weights.detach(), qq.grad))
    torch.testing.assert_close(grads[1][0], grads[0][0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grads[1][1], grads[0][1], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("lengths", [[6], [3, 3], [5, 3, 1]])
@pytest.mark.parametrize("scale", [0.0, -1.0])
def test_causal_blocks_with_a_scale_of_zero_or_less_equal_mp(lengths, scale):
    # torch's SDPA with is_causal gave NaN rows for these scales (finite inputs):
    # "auto" took it on every causal graph.
    g = AttentionGraph.causal(lengths=lengths)
    n = sum(lengths)
    q, k, v = (torch.randn(n, H, C, dtype=torch.float64, requires_grad=True) for _ in range(3))
    got = attention(q, k, v, g, scale=scale, backend="sdpa")
    ref = attention(q, k, v, g, scale=scale, backend="mp")
    torch.testing.assert_close(got, ref, atol=1e-10, rtol=1e-10)
    grads = torch.autograd.grad(got.square().sum(), (q, k, v))
    refs = torch.autograd.grad(ref.square().sum(), (q, k, v))
    for a, b in zip(grads, refs, strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)
