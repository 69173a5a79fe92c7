"""The ``"tiles"`` backend and its block plan (issue 27): equal to the message-passing
reference in float64 at 1e-10, forward and gradients, with every option, on awkward
graphs and on every builder; the dropout mask of the CSR kernels; the non-finite
contract; ``"auto"``'s choice."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from test_nonfinite import DTYPES, SETTINGS, _inputs, _same, _same_grad, cases, reference

from gnnattn import AttentionGraph, attention, backend_for
from gnnattn.graphs import (
    bigbird_graph,
    blocks,
    causal_graph,
    complete_graph,
    dilated_window_graph,
    sliding_window_graph,
)
from gnnattn.graphs.blocks import block_plan, fill_estimate, plan_tiles
from gnnattn.kernels import COMPILED
from gnnattn.ops import choice, operator

TOL = dict(atol=1e-10, rtol=0)
H = 2


def _random(n: int, m: int, e: int, seed: int) -> torch.Tensor:
    """``e`` random edges (duplicates included), shuffled: the CSR has a permutation."""
    g = torch.Generator().manual_seed(seed)
    return torch.stack(
        [torch.randint(0, m, (e,), generator=g), torch.randint(0, n, (e,), generator=g)]
    )


def _leaves(n, m, e, *, c=4, cv=4, f=0, seed=0, logits=1.0):
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_()

    x = {
        "q": (torch.randn(n, H, c, generator=g, dtype=torch.float64) * logits).requires_grad_(),
        "k": r(m, H, c),
        "v": r(m, H, cv),
        "score_bias": r(e, H),
    }
    if f:
        x |= {"edge_attr": r(e, f), "edge_key": r(H * c, f), "edge_value": r(H * cv, f)}
    return x


def _run(graph, x, backend, *, full, dropout_p=0.0, scale=None, grads=True, no_grad=()):
    """One call (the same dropout key every time) and the leaves' gradients."""
    torch.manual_seed(11)
    kw = {n: (t.detach() if n in no_grad else t) for n, t in x.items() if n not in "qkv"}
    r = attention(
        x["q"], x["k"], x["v"], graph, scale=scale, dropout_p=dropout_p, backend=backend,
        return_lse=full, need_weights=full, **kw,
    )  # fmt: skip
    out = r.out if full else r
    if full:
        assert r.backend == backend
    leaves = [t for n, t in x.items() if n not in no_grad]
    go = torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=out.dtype)
    if not grads:
        return r, []
    g = torch.autograd.grad(out, leaves, go, allow_unused=True)
    return r, [torch.zeros_like(t) if d is None else d for t, d in zip(leaves, g, strict=True)]


def _compare(graph, x, *, dropout_p=0.0, scale=None, grads=True, against="mp"):
    """Run ``"tiles"`` and ``against`` on the same inputs (the same dropout key) and
    compare the output, lse, weights and every leaf's gradient at 1e-10: with the
    lse and weights asked for (the tiles' own kernel), with the output only (the
    CPU's fused attention kernel where the call allows it), and with the per-edge
    tensors taken as constants (there it allows a score bias)."""
    kw = dict(dropout_p=dropout_p, scale=scale, grads=grads)
    (a, ga), (b, gb) = (_run(graph, x, be, full=True, **kw) for be in ("tiles", against))
    torch.testing.assert_close(a.out, b.out, **TOL)
    torch.testing.assert_close(a.lse, b.lse, **TOL)
    torch.testing.assert_close(a.weights, b.weights, **TOL)
    for name, da, db in zip(x, ga, gb, strict=True):
        torch.testing.assert_close(da, db, **TOL, msg=f"d{name}")
    for no_grad in ((), tuple(n for n in x if n not in "qkv")):
        (c, gc), (d, gd) = (
            _run(graph, x, be, full=False, no_grad=no_grad, **kw) for be in ("tiles", against)
        )
        torch.testing.assert_close(c, d, **TOL)
        for name, dc, dd in zip([n for n in x if n not in no_grad], gc, gd, strict=True):
            torch.testing.assert_close(dc, dd, **TOL, msg=f"d{name}, {no_grad} constant")
    return a


# --------------------------------------------------------------------------- awkward graphs

AWKWARD = {
    # name: (num_dst, num_src, edge_index)
    "random 37 x 37, duplicates": (37, 37, _random(37, 37, 300, 0)),
    "one node": (1, 1, torch.tensor([[0], [0]])),
    "one node, no edge": (1, 1, torch.zeros(2, 0, dtype=torch.long)),
    "empty graph": (5, 5, torch.zeros(2, 0, dtype=torch.long)),
    "isolated targets": (70, 70, _random(70, 70, 400, 1)[:, _random(70, 70, 400, 1)[1] % 3 != 0]),
    "hub target": (
        130,
        130,
        torch.cat(
            [
                _random(130, 130, 200, 2),
                torch.stack([torch.arange(130), torch.zeros(130, dtype=torch.long)]),
            ],
            1,
        ),
    ),
    "bipartite 45 <- 19": (45, 19, _random(45, 19, 260, 3)),
    "bipartite 3 <- 200": (3, 200, _random(3, 200, 350, 4)),
}


@pytest.mark.parametrize("name", list(AWKWARD))
@pytest.mark.parametrize("options", ["none", "score_bias", "edge_features", "all"])
def test_tiles_equal_mp_on_awkward_graphs(name, options):
    n, m, ei = AWKWARD[name]
    graph = AttentionGraph(ei, n, num_src=m if m != n else None)
    x = _leaves(
        n,
        m,
        ei.shape[1],
        cv=5 if "3 <-" in name else 4,
        f=3 if "edge" in options else 0,
        seed=len(name),
    )
    if options in ("none", "edge_features"):
        del x["score_bias"]
    _compare(graph, x, dropout_p=0.3 if options == "all" else 0.0)


def test_logits_scaled_by_1e3():
    # Scores in the thousands: the stable softmax keeps every weight finite.
    ei = _random(50, 50, 600, 5)
    x = _leaves(50, 50, 600, seed=5, logits=1e3)
    res = _compare(AttentionGraph(ei, 50), x)
    assert res.out.isfinite().all() and (res.weights.max() == 1.0)


def test_many_chunks_and_buckets(monkeypatch):
    # Blocks of many sizes, in chunks of at most 4096 slots (a window of the
    # 300-block alone is more: a chunk of one window).
    monkeypatch.setattr(blocks, "CHUNK_SLOTS", 4096)
    lengths = [300, 7, 50, 1, 2, 90, 33]
    batch = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    graph = AttentionGraph(complete_graph(batch=batch))
    plan = block_plan(graph)
    assert plan.num_buckets >= 3 and len(plan.chunks) > plan.num_buckets
    assert all(
        c.rows.shape[0] == 1 or c.rows.numel() * c.cols.shape[1] <= 4096 for c in plan.chunks
    )
    n = sum(lengths)
    _compare(graph, _leaves(n, n, graph.num_edges, seed=6), dropout_p=0.2)


# --------------------------------------------------------------------------- every builder


def _builders():
    batch = torch.repeat_interleave(torch.arange(4), torch.tensor([9, 1, 33, 20]))
    return {
        "complete_graph": AttentionGraph(complete_graph(63)),
        "causal_graph": AttentionGraph(causal_graph(70)),
        "complete, batched": AttentionGraph(complete_graph(batch=batch)),
        "causal, batched": AttentionGraph(causal_graph(batch=batch)),
        "AttentionGraph.complete(lengths)": AttentionGraph.complete(lengths=[5, 40, 3]),
        "sliding_window_graph": AttentionGraph(sliding_window_graph(150, window=9)),
        "sliding_window_graph, causal, batched": AttentionGraph(
            sliding_window_graph(batch=batch, window=4, causal=True)
        ),
        "AttentionGraph.window": AttentionGraph.window(100, window=20),
        "dilated_window_graph": dilated_window_graph(120, window=3, dilation=4),
        "bigbird_graph": bigbird_graph(160, block_size=16, num_global=8, num_random_blocks=2),
        "random": AttentionGraph(_random(90, 90, 700, 7), 90),
        "random, bipartite": AttentionGraph(_random(90, 40, 500, 8), 90, num_src=40),
    }


BUILDERS = list(_builders())


@pytest.mark.parametrize("name", BUILDERS)
@pytest.mark.parametrize("options", ["none", "score_bias", "dropout", "edge_features", "all"])
def test_tiles_equal_mp_on_every_builder(name, options):
    graph = _builders()[name]
    n, m, e = graph.num_dst, graph.num_src, graph.num_edges
    f = 2 if options in ("edge_features", "all") else 0
    x = _leaves(n, m, e, f=f, seed=BUILDERS.index(name))
    if options not in ("score_bias", "all"):
        del x["score_bias"]
    p = 0.25 if options in ("dropout", "all") else 0.0
    _compare(graph, x, dropout_p=p, scale=0.3 if options == "all" else None)


@pytest.mark.parametrize("name", ["complete, batched", "random", "random, bipartite"])
def test_dropout_mask_is_the_fused_kernels(name):
    graph = _builders()[name]
    x = _leaves(graph.num_dst, graph.num_src, graph.num_edges, seed=2)
    del x["score_bias"]
    _compare(graph, x, dropout_p=0.4, against="fused")
    # Another seed, another mask.
    torch.manual_seed(12)
    other = attention(x["q"], x["k"], x["v"], graph, dropout_p=0.4, backend="tiles")
    torch.manual_seed(11)
    same = attention(x["q"], x["k"], x["v"], graph, dropout_p=0.4, backend="tiles")
    assert not torch.allclose(other, same)


def test_gradcheck_with_dropout_and_edge_features():
    ei = _random(6, 5, 14, 9)
    graph = AttentionGraph(ei, 6, num_src=5)
    x = _leaves(6, 5, 14, c=2, cv=2, f=2, seed=9)

    def fn(*leaves):
        torch.manual_seed(7)  # the same key, so the same mask, on every evaluation
        kw = dict(zip(x, leaves, strict=True))
        res = attention(
            kw.pop("q"), kw.pop("k"), kw.pop("v"), graph, dropout_p=0.3, backend="tiles",
            return_lse=True, need_weights=True, **kw,
        )  # fmt: skip
        return res.out, res.lse.masked_fill(res.lse.isinf(), 0.0)

    assert torch.autograd.gradcheck(fn, tuple(x.values()))


def test_lse_gradient_equals_mp():
    ei = _random(20, 20, 90, 10)
    graph = AttentionGraph(ei, 20)
    x = _leaves(20, 20, 90, seed=10)
    grads = []
    for backend in ("tiles", "mp"):
        lse = attention(x["q"], x["k"], x["v"], graph, backend=backend, return_lse=True).lse
        loss = lse.masked_fill(lse.isinf(), 0.0).square().sum()
        grads.append(torch.autograd.grad(loss, [x["q"], x["k"]]))
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, **TOL)


def test_edge_permutation_invariance_and_weights_sum_to_one():
    n = 60
    ei = _random(n, n, 500, 11)
    x = _leaves(n, n, 500, f=2, seed=11)
    perm = torch.randperm(500, generator=torch.Generator().manual_seed(0))
    per_edge = ("score_bias", "edge_attr")
    rest = {name: t for name, t in x.items() if name not in "qkv"}
    a = attention(x["q"], x["k"], x["v"], AttentionGraph(ei, n), backend="tiles",
                  need_weights=True, **rest)  # fmt: skip
    permuted = {name: (t[perm] if name in per_edge else t) for name, t in rest.items()}
    b = attention(x["q"], x["k"], x["v"], AttentionGraph(ei[:, perm], n), backend="tiles",
                  need_weights=True, **permuted)  # fmt: skip
    torch.testing.assert_close(a.out, b.out, **TOL)
    torch.testing.assert_close(a.weights[perm], b.weights, **TOL)
    sums = torch.zeros(n, H, dtype=torch.float64).index_add_(0, ei[1], a.weights.detach())
    has = torch.zeros(n, dtype=torch.bool).index_fill_(0, ei[1], True)
    torch.testing.assert_close(sums[has], torch.ones_like(sums[has]), **TOL)
    assert (sums[~has] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_lower_precision_agrees_with_float64(dtype):
    graph = AttentionGraph(sliding_window_graph(200, window=6))
    x = _leaves(200, 200, graph.num_edges, seed=12)
    want = attention(x["q"], x["k"], x["v"], graph, backend="mp", score_bias=x["score_bias"])
    q, k, v, b = (t.detach().to(dtype) for t in x.values())
    got = attention(q, k, v, graph, backend="tiles", score_bias=b, return_lse=True)
    assert got.out.dtype == dtype and got.lse.dtype == torch.float32
    tol = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 5e-2}[dtype]
    torch.testing.assert_close(got.out.double(), want.detach(), atol=tol, rtol=tol)


def test_which_kernel_runs(monkeypatch):
    """The CPU's fused attention kernel where the call allows it, the tiles' own
    kernel elsewhere (dropout, weights, a bias with a gradient, a lse with one)."""
    from gnnattn.kernels import tiles as kernel

    if kernel._FLASH is None:
        pytest.skip("no fused CPU attention op in this torch")
    ran = []
    flash = kernel._flash
    monkeypatch.setattr(kernel, "_flash", lambda *a: ran.append(1) or flash(*a))
    graph = AttentionGraph(sliding_window_graph(50, window=3))
    x = _leaves(50, 50, graph.num_edges, seed=4)
    q, k, v, b = x.values()
    cases = [
        (True, {}),
        (True, {"score_bias": b.detach()}),
        (True, {"return_lse": True, "_no_grad": True}),
        (False, {"score_bias": b}),
        (False, {"return_lse": True}),
        (False, {"need_weights": True}),
        (False, {"dropout_p": 0.1}),
        (False, {"score_bias": b.detach().index_fill(0, torch.tensor([3]), math.inf)}),
    ]
    for flash_runs, kw in cases:
        ran.clear()
        with torch.set_grad_enabled(not kw.pop("_no_grad", False)):
            attention(q, k, v, graph, backend="tiles", **kw)
        assert bool(ran) == flash_runs, kw
    ran.clear()
    attention(q, k, torch.randn(50, H, 6, dtype=q.dtype), graph, backend="tiles")
    assert not ran  # values wider than the keys


@pytest.mark.slow
@pytest.mark.parametrize("options", ["plain", "bias, weights"])
def test_tiles_under_torch_compile(options):
    # Both kernels traced by torch.compile (graph breaks allowed), equal to eager.
    graph = AttentionGraph(sliding_window_graph(80, window=5))
    x = _leaves(80, 80, graph.num_edges, seed=8)
    kw = {"score_bias": x["score_bias"], "need_weights": True} if options != "plain" else {}

    def f(q, k, v):
        res = attention(q, k, v, graph, backend="tiles", **kw)
        return res.out * 2 + res.weights.sum() if kw else res

    want = f(x["q"], x["k"], x["v"])
    got = torch.compile(f)(x["q"], x["k"], x["v"])
    torch.testing.assert_close(got, want, **TOL)
    for a, b in zip(
        torch.autograd.grad(got.sum(), [x["q"], x["k"]]),
        torch.autograd.grad(want.sum(), [x["q"], x["k"]]),
        strict=True,
    ):
        torch.testing.assert_close(a, b, **TOL)


def test_layers_run_tiles():
    from gnnattn import SelfAttentionConv

    torch.manual_seed(0)
    layer = SelfAttentionConv(16, 4, edge_dim=3, edge_value=True).double()
    ei = _random(40, 40, 300, 13)
    xin = torch.randn(40, 16, dtype=torch.float64)
    ea = torch.randn(300, 3, dtype=torch.float64)
    a, (_, wa) = layer(xin, ei, ea, backend="tiles", return_attention_weights=True)
    b, (_, wb) = layer(xin, ei, ea, backend="mp", return_attention_weights=True)
    torch.testing.assert_close(a, b, **TOL)
    torch.testing.assert_close(wa, wb, **TOL)


# --------------------------------------------------------------------------- non-finite rules


@SETTINGS
@given(cases(), st.sampled_from(DTYPES), st.sampled_from([(), ("bias",)]))
def test_tiles_meet_the_non_finite_contract(case, dtype, options):
    """NaN, +-inf and huge values in q, k, v (routed to the fused kernel) and in the
    score bias (kept in the tiles): the output is NaN exactly where the reference's is."""
    n, ei, spots, seed = case
    x = _inputs(n, ei.shape[1], spots, seed, dtype, options)
    want = reference(x["q"], x["k"], x["v"], ei[0], ei[1], n, 0.5, x["bias"])
    got = attention(
        x["q"], x["k"], x["v"], AttentionGraph(ei, n), scale=0.5, score_bias=x["bias"],
        backend="tiles", return_lse=True,
    )  # fmt: skip
    # q, k, v that are not finite, or whose scores may overflow, take the fused kernel.
    routed = not operator._sdpa_safe(x["q"], x["k"], x["v"], 0.5)
    assert got.backend == ("fused" if routed else "tiles")
    _same(got.out, want, dtype, f"tiles {dtype} out")


@SETTINGS
@given(cases(), st.sampled_from([torch.float64, torch.float32]))
def test_tiles_gradients_meet_the_non_finite_contract(case, dtype):
    n, ei, spots, seed = case
    # Only the bias gets the special values here: the tiles' own rules (q, k and v
    # that are not finite go to the fused kernel, tested in test_nonfinite.py).
    spots = [("bias", pos, value) for _, pos, value in spots]
    x = _inputs(n, ei.shape[1], spots, seed, dtype, ("bias",))
    leaves = {name: t.clone().requires_grad_() for name, t in x.items()}
    g = torch.randn(n, 2, 3, generator=torch.Generator().manual_seed(seed + 1), dtype=dtype)
    q, k, v, bias = leaves.values()
    want = reference(q, k, v, ei[0], ei[1], n, 0.5, bias)
    want_grads = torch.autograd.grad(want, [q, k, v, bias], g.to(want.dtype))
    got = attention(q, k, v, AttentionGraph(ei, n), scale=0.5, score_bias=bias, backend="tiles")
    _same(got.detach(), want.detach(), dtype, f"tiles {dtype} out")
    got_grads = torch.autograd.grad(got, [q, k, v, bias], g, allow_unused=True)
    inf = any(math.isinf(value) for _, _, value in spots)
    huge = any(abs(value) == 1e30 for _, _, value in spots)
    for name, a, b in zip(leaves, got_grads, want_grads, strict=True):
        a = torch.zeros_like(leaves[name]) if a is None else a
        b = torch.zeros_like(leaves[name], dtype=want.dtype) if b is None else b
        _same_grad(a, b, dtype, f"tiles {dtype} d{name}", exact=not inf, values=not huge)


def test_a_nan_value_reaches_only_its_targets():
    # A window shares its columns: a NaN value must not reach the window's
    # other rows through 0 * NaN (the call takes the fused kernel).
    graph = AttentionGraph(sliding_window_graph(100, window=2))
    q, k, v = (torch.randn(100, 2, 4, dtype=torch.float64) for _ in range(3))
    v[50] = math.nan
    res = attention(q, k, v, graph, backend="tiles", return_lse=True)
    nan_rows = res.out.isnan().any(-1).any(-1).nonzero().view(-1).tolist()
    assert nan_rows == [48, 49, 50, 51, 52] and res.backend == "fused"


def test_minus_inf_bias_masks_edges_and_rows():
    ei = _random(30, 30, 200, 14)
    graph = AttentionGraph(ei, 30)
    x = _leaves(30, 30, 200, seed=14)
    bias = x["score_bias"].detach().clone()
    bias[ei[1] == ei[1][0]] = -math.inf  # every edge of one target
    bias[::7] = -math.inf
    x["score_bias"] = bias.requires_grad_()
    res = _compare(graph, x)
    assert (res.out[ei[1][0]] == 0).all() and res.lse[ei[1][0]].isneginf().all()


# --------------------------------------------------------------------------- the plan


@pytest.mark.parametrize("block", [1, 5, 16, 64])
def test_plan_slots_hold_their_edges(block):
    n, m = 57, 33
    ei = _random(n, m, 400, 15)
    graph = AttentionGraph(ei, n, num_src=m)
    plan = plan_tiles(graph, block)
    seen = torch.zeros(ei.shape[1], dtype=torch.long)
    for ch in plan.chunks:
        w, r = ch.rows.shape
        k = ch.cols.shape[1]
        assert r <= max(block, 8) + 7 and r % 8 == 0 and k % 16 == 0
        win, rest = ch.slot // (r * k), ch.slot % (r * k)
        assert torch.equal(ch.rows[win, rest // k], ei[1][ch.edge])
        assert torch.equal(ch.cols[win, rest % k], ei[0][ch.edge])
        assert torch.equal(ch.edge, graph.csr.perm[ch.pos])
        if ch.masked is not None:
            assert not ch.masked.view(-1)[ch.slot].any()
            live = ch.out_rows.view(-1) < n
            assert int((~ch.masked.view(-1, k)[live]).sum()) == ch.slot.numel()
            if ch.key_masked is not None:  # the same mask on every row with edges
                keys = ch.key_masked.unsqueeze(1).expand(w, r, k).reshape(-1, k)
                assert torch.equal(ch.masked.view(-1, k)[live], keys[live])
        seen[ch.edge] += 1
    assert (seen == 1).all()  # every edge, once (duplicates in columns of their own)
    # Every target's row, or the zero row for a target without edges.
    deg = torch.bincount(ei[1], minlength=n)
    assert (plan.take[deg == 0] == plan.num_rows).all()
    assert plan.fill == pytest.approx(400 / plan.slots)


def test_plan_windows_respect_batches_and_are_kept():
    batch = torch.repeat_interleave(torch.arange(3), torch.tensor([100, 30, 70]))
    # Causal blocks: windows of equal length (multiples of 8) within each block,
    # never two blocks in one window.
    causal = AttentionGraph(causal_graph(batch=batch))
    plan = block_plan(causal, 64)
    assert block_plan(causal, 64) is plan and fill_estimate(causal, 64) == plan.fill
    starts = torch.cat([c.rows[:, 0] for c in plan.chunks])
    assert sorted(starts.tolist()) == [0, 56, 100, 130, 170]
    for c in plan.chunks:
        rows, cols = batch[c.rows], batch[c.cols]  # (n, R), (n, K)
        assert (rows == rows[:, :1]).all() and (cols == rows[:, :1]).all()
    # Complete blocks: a block's windows have the same columns and are merged,
    # one tile per block (the kernels block its rows themselves).
    complete = block_plan(AttentionGraph(complete_graph(batch=batch)), 64)
    starts = torch.cat([c.rows[:, 0] for c in complete.chunks])
    assert sorted(starts.tolist()) == [0, 100, 130] and complete.num_windows == 3
    # Their masks are padding columns only: key-padding masks.
    assert all(c.key_masked is not None for c in complete.chunks if c.masked is not None)
    assert all(c.key_masked is None for c in plan.chunks)
    assert complete.fill > 0.85


@pytest.mark.slow
def test_plan_is_fast_and_estimate_cheap_for_200k_nodes():
    import time

    n = 200_000
    graph = AttentionGraph(_random(n, n, 16 * n, 16), n)
    _ = graph.csr
    t0 = time.perf_counter()
    est = fill_estimate(graph)
    t1 = time.perf_counter()
    assert est < 0.05 and t1 - t0 < 5.0
    window = AttentionGraph(sliding_window_graph(n, window=8))
    t0 = time.perf_counter()
    plan = block_plan(window)
    assert time.perf_counter() - t0 < 20.0 and plan.fill > 0.2


# --------------------------------------------------------------------------- auto


def test_auto_takes_tiles_where_the_fill_pays_and_fused_elsewhere():
    q = torch.zeros(4096, 8, 64)
    window = AttentionGraph(sliding_window_graph(4096, window=128))
    choice_ = backend_for(q, window)
    assert choice_.backend == "tiles" and "fill" in choice_.reason
    rnd = AttentionGraph(_random(4096, 4096, 16 * 4096, 17), 4096)
    if "cpu" in COMPILED:
        assert backend_for(q, rnd).backend == "fused"
    # Small graphs keep the fused kernel (a tile call costs more than it saves).
    small = AttentionGraph(sliding_window_graph(12, window=1))
    assert backend_for(torch.zeros(12, 2, 4), small).backend != "tiles"
    assert "tiles" in choice.BACKENDS and choice.DECLARATIONS["tiles"].devices is None


def test_auto_runs_what_backend_for_says():
    graph = AttentionGraph(sliding_window_graph(4096, window=128))
    q, k, v = (torch.randn(4096, 2, 8) for _ in range(3))
    res = attention(q, k, v, graph, return_lse=True)
    assert res.backend == backend_for(q, graph).backend == "tiles"


@pytest.mark.parametrize(
    "graph",
    [
        AttentionGraph.window(300, window=9),
        AttentionGraph.window(257, window=20, causal=True),
        AttentionGraph(sliding_window_graph(200, window=5, batch=torch.arange(200) // 70)),
    ],
    ids=["window", "causal window", "batched windows"],
)
@pytest.mark.parametrize("bias", [False, True])
def test_banded_chunks_read_strided_views_without_a_gradient(graph, bias, monkeypatch):
    # The interior windows of a window graph are bands: without a gradient the
    # fused kernel reads them as strided views of q, k, v (no gather). The
    # result is the message-passing reference's.
    from gnnattn.graphs import blocks
    from gnnattn.kernels import tiles as kernel

    if kernel._FLASH is None:
        pytest.skip("no fused CPU attention op in this torch")
    plan = block_plan(graph, 16)
    assert any(ch.band is not None for ch in plan.chunks)
    views = []
    band_views = kernel._band_views
    monkeypatch.setattr(kernel, "_band_views", lambda *a: views.append(1) or band_views(*a))
    monkeypatch.setattr(blocks, "default_block", lambda device: 16)
    x = _leaves(graph.num_dst, graph.num_src, graph.num_edges, seed=8)
    kw = {"score_bias": x["score_bias"].detach()} if bias else {}
    with torch.no_grad():
        got = attention(x["q"], x["k"], x["v"], graph, backend="tiles", **kw)
        want = attention(x["q"], x["k"], x["v"], graph, backend="mp", **kw)
    assert views
    torch.testing.assert_close(got, want, **TOL)


def test_values_of_width_zero_have_gradients():
    # The backward inferred a [-1, Cv] shape from zero elements (RuntimeError).
    g = AttentionGraph.causal(4)
    q, k = (torch.randn(4, 2, 3, dtype=torch.float64, requires_grad=True) for _ in range(2))
    v = torch.randn(4, 2, 0, dtype=torch.float64, requires_grad=True)

    def grads(backend):
        out = attention(q, k, v, g, backend=backend, return_lse=True)
        assert out.backend == backend and out.out.shape == (4, 2, 0)
        return torch.autograd.grad(out.out.sum() + out.lse.sum(), (q, k, v))

    torch.testing.assert_close(grads("tiles"), grads("mp"), atol=1e-10, rtol=1e-10)
