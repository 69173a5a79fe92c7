"""The attention operator: every backend equal to dense attention, with every option.

Dense references are computed here from the definition (a ``[H, N, M]`` score
matrix with ``-inf`` where there is no edge), in float64, so agreement to
1e-10 says the backends compute the same function, not that they share code.
"""

from __future__ import annotations

import importlib
import inspect
import math
import pkgutil
import re
import sys
import threading
import types
import warnings

import numpy as np
import pytest
import torch

import gnnattn
from gnnattn import AttentionGraph, attention, backend_for
from gnnattn import kernels as kernels_pkg
from gnnattn.kernels.common import Dropout, dropout_keep
from gnnattn.ops import MessagePassingAttention, dropout_mask
from gnnattn.ops import choice as choice_mod

SPARSE_BACKENDS = ("mp", "fused")


def _graph_without_duplicates(n: int, m: int, e: int, seed: int) -> torch.Tensor:
    """A random bipartite edge set (no duplicates, so a dense matrix can hold it),
    in shuffled order, with target 0 isolated."""
    g = torch.Generator().manual_seed(seed)
    pairs = torch.randperm(n * m, generator=g)[:e]
    src, dst = pairs % m, pairs // m
    keep = dst != 0
    return torch.stack([src[keep], dst[keep]])


def _dense(q, k, v, edge_index, scale, score_bias=None, keep=None, p=0.0):
    """The definition, through ``[H, N, M]`` matrices (float64)."""
    n, h, _ = q.shape
    m, cv = k.shape[0], v.shape[2]
    src, dst = edge_index
    s = torch.einsum("nhc,mhc->hnm", q, k) * scale  # (H, N, M)
    bias = torch.full((h, n, m), -math.inf, dtype=q.dtype)
    bias[:, dst, src] = 0.0 if score_bias is None else score_bias.T
    s = s + bias
    has_edge = torch.isfinite(bias[0]).any(-1)  # (N,)
    # A target without edges: its row is all -inf; softmax would give NaN
    # (and NaN gradients), so take it over zeros and multiply by 0.
    s = torch.where(has_edge.view(1, n, 1), s, torch.zeros_like(s))
    lse = torch.where(has_edge.view(-1, 1), torch.logsumexp(s, dim=-1).T, -math.inf)  # (N, H)
    p_mat = torch.softmax(s, dim=-1) * has_edge.view(1, n, 1)  # (H, N, M)
    if keep is not None:
        f = torch.zeros(h, n, m, dtype=q.dtype)
        f[:, dst, src] = keep.T.to(q.dtype) / (1 - p)
        p_mat = p_mat * f
    out = torch.einsum("hnm,mhc->nhc", p_mat, v)
    weights = (torch.softmax(s, dim=-1) * has_edge.view(1, n, 1))[:, dst, src].T
    assert out.shape == (n, h, cv)
    return out, lse, weights


def _inputs(n=9, m=7, h=2, c=3, cv=4, e=30, seed=0, dtype=torch.float64):
    torch.manual_seed(seed)
    ei = _graph_without_duplicates(n, m, e, seed)
    q = torch.randn(n, h, c, dtype=dtype, requires_grad=True)
    k = torch.randn(m, h, c, dtype=dtype, requires_grad=True)
    v = torch.randn(m, h, cv, dtype=dtype, requires_grad=True)
    sb = torch.randn(ei.shape[1], h, dtype=dtype, requires_grad=True)
    return ei, q, k, v, sb


@pytest.mark.parametrize("backend", SPARSE_BACKENDS)
@pytest.mark.parametrize("options", ["none", "score_bias", "dropout", "all"])
def test_sparse_backends_equal_dense(backend, options):
    ei, q, k, v, sb = _inputs()
    graph = AttentionGraph(ei, q.shape[0], num_src=k.shape[0])
    use_sb = sb if options in ("score_bias", "all") else None
    p = 0.3 if options in ("dropout", "all") else 0.0
    torch.manual_seed(11)
    res = attention(
        q, k, v, graph, score_bias=use_sb, dropout_p=p, backend=backend, return_lse=True,
        need_weights=True,
    )  # fmt: skip
    assert res.backend == backend
    keep = None
    if p:
        # The mask the call drew: the same torch seed gives the same key.
        torch.manual_seed(11)
        keep = dropout_mask(graph, gnnattn.kernels.library.draw_key(), p, q.shape[1])
    want_out, want_lse, want_w = _dense(q, k, v, ei, 3**-0.5, use_sb, keep, p)
    torch.testing.assert_close(res.out, want_out, atol=1e-10, rtol=0)
    torch.testing.assert_close(res.lse, want_lse, atol=1e-10, rtol=0)
    torch.testing.assert_close(res.weights, want_w, atol=1e-10, rtol=0)
    leaves = [t for t in (q, k, v, use_sb) if t is not None]
    go = torch.randn_like(want_out)
    got = torch.autograd.grad(res.out, leaves, go)
    want = torch.autograd.grad(want_out, leaves, go)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


@pytest.mark.parametrize("kind", ["complete", "causal"])
def test_every_backend_equal_dense_on_structured_graphs(kind):
    torch.manual_seed(3)
    n, h, c = 6, 2, 4
    graph = AttentionGraph.complete(n) if kind == "complete" else AttentionGraph.causal(n)
    q, k, v = (torch.randn(n, h, c, dtype=torch.float64, requires_grad=True) for _ in range(3))
    want_out, want_lse, _ = _dense(q, k, v, graph.edge_index, 0.5)
    go = torch.randn_like(want_out)
    want_grads = torch.autograd.grad(want_out, (q, k, v), go)
    for backend in ("sdpa", "mp", "fused", "auto"):
        res = attention(q, k, v, graph, backend=backend, return_lse=True)
        torch.testing.assert_close(res.out, want_out, atol=1e-10, rtol=0)
        torch.testing.assert_close(res.lse, want_lse, atol=1e-10, rtol=0)
        grads = torch.autograd.grad(res.out, (q, k, v), go)
        for a, b in zip(grads, want_grads, strict=True):
            torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_lse_in_the_accumulation_dtype_on_every_backend(dtype):
    # Half inputs: float32 lse everywhere (the kernels keep it so), agreeing to
    # the half inputs' rounding of the scores (about 2^-8 relative, times |s| < 8).
    torch.manual_seed(4)
    graph = AttentionGraph.complete(5)
    q, k, v = (torch.randn(5, 2, 8).to(dtype) for _ in range(3))
    want = attention(q.double(), k.double(), v.double(), graph, backend="mp", return_lse=True)
    for backend in ("sdpa", "mp", "fused"):
        lse = attention(q, k, v, graph, backend=backend, return_lse=True).lse
        assert lse.dtype == torch.float32, backend
        torch.testing.assert_close(lse.double(), want.lse, atol=0.1, rtol=0)


@pytest.mark.parametrize("backend", ["mp", "fused", "tiles"])
def test_edge_terms_of_another_dtype_keep_the_dtypes_of_q(backend):
    """A float64 score bias and edge terms with half q: out and weights in q's dtype,
    lse in the accumulation dtype, on the reference as on the kernels; the values
    agree with float64 to the half rounding of the inputs (about 2^-8 relative)."""
    torch.manual_seed(5)
    graph = AttentionGraph(torch.tensor([[0, 1, 2, 2, 3, 0], [1, 2, 0, 1, 1, 1]]), 5)
    q, k, v = (torch.randn(5, 2, 4, dtype=torch.float64) for _ in range(3))
    extra = dict(
        score_bias=torch.randn(6, 2, dtype=torch.float64),
        edge_attr=torch.randn(6, 3, dtype=torch.float64),
        edge_key=torch.randn(8, 3, dtype=torch.float64),
        edge_value=torch.randn(8, 3, dtype=torch.float64),
    )
    want = attention(q, k, v, graph, backend="mp", **extra)
    half = [t.half() for t in (q, k, v)]
    got = attention(*half, graph, backend=backend, return_lse=True, need_weights=True, **extra)
    assert got.out.dtype == got.weights.dtype == torch.float16
    assert got.lse.dtype == torch.float32
    torch.testing.assert_close(got.out.double(), want, atol=0.05, rtol=0.02)


@pytest.mark.parametrize(
    "backend, options",
    # sdpa takes no score bias or edge features: its options are none.
    [("fused", "none"), ("fused", "all"), ("tiles", "none"), ("tiles", "all"), ("sdpa", "none")],
)
def test_the_lse_is_differentiable_on_every_backend(backend, options):
    """A loss of the output and the log-sum-exp (or of the lse alone): every backend's
    gradients are mp's (float64), with a score bias, edge features and dropout."""
    torch.manual_seed(6)
    graph = AttentionGraph.complete(lengths=[4, 3, 5])
    e = graph.num_edges
    leaves = [torch.randn(12, 2, 4, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    extra = {}
    if options == "all":
        extra = dict(
            score_bias=torch.randn(e, 2, dtype=torch.float64, requires_grad=True),
            edge_attr=torch.randn(e, 3, dtype=torch.float64, requires_grad=True),
            edge_key=torch.randn(8, 3, dtype=torch.float64, requires_grad=True),
            edge_value=torch.randn(8, 3, dtype=torch.float64, requires_grad=True),
            dropout_p=0.25,
        )
    inputs = leaves + [t for t in extra.values() if isinstance(t, torch.Tensor)]
    grads = {}
    for name in ("mp", backend):
        torch.manual_seed(7)  # the same dropout mask
        res = attention(*leaves, graph, backend=name, return_lse=True, **extra)
        weight = torch.linspace(-1, 1, res.out.numel(), dtype=torch.float64).view_as(res.out)
        both = torch.autograd.grad((res.out * weight).sum() + res.lse.sin().sum(), inputs)
        torch.manual_seed(7)
        res = attention(*leaves, graph, backend=name, return_lse=True, **extra)
        alone = torch.autograd.grad(res.lse.sum(), leaves[:2])
        grads[name] = (*both, *alone)
    for a, b in zip(grads[backend], grads["mp"], strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


def test_the_lse_of_an_all_masked_target_passes_zero_gradients():
    """A target whose every score is -inf has lse -inf; a loss that masks it out gets
    zero gradients from it on every backend, not mp's NaN (log(0)'s 0 / 0)."""
    torch.manual_seed(8)
    graph = AttentionGraph.complete(5)
    leaves = [torch.randn(5, 2, 4, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    bias = torch.zeros(graph.num_edges, 2, dtype=torch.float64)
    bias[graph.edge_index[1] == 2] = -math.inf
    grads = {}
    for name in ("mp", "fused", "tiles"):
        res = attention(*leaves, graph, backend=name, return_lse=True, score_bias=bias)
        assert torch.isneginf(res.lse[2]).all()
        loss = res.out.sum() + res.lse.masked_fill(res.lse.isinf(), 0).sum()
        grads[name] = torch.autograd.grad(loss, leaves)
        assert all(g.isfinite().all() for g in grads[name]), name
        assert (grads[name][0][2] == 0).all(), name
    for name in ("fused", "tiles"):
        for a, b in zip(grads[name], grads["mp"], strict=True):
            torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


@pytest.mark.parametrize("backend", ["mp", "fused", "tiles", "sdpa"])
def test_zero_nodes_give_zero_gradients_on_every_backend(backend):
    q = torch.randn(0, 2, 4, requires_grad=True)
    out = attention(q, q, q, AttentionGraph.complete(lengths=[]), backend=backend)
    (grad,) = torch.autograd.grad(out.sum(), q)
    assert out.shape == (0, 2, 4) and grad.shape == (0, 2, 4)


@pytest.mark.parametrize("backend", ["mp", "fused", "sdpa", "tiles", "auto"])
def test_dropout_one_drops_every_weight(backend):
    # F.dropout(p=1)'s bound, which PyG's layers take: a zero output with zero
    # gradients to q, k and v; the weights and lse are those before dropout.
    graph = AttentionGraph.window(9, window=2)
    q, k, v = (torch.randn(9, 2, 3, dtype=torch.float64, requires_grad=True) for _ in range(3))
    kept = attention(q, k, v, graph, backend=backend, need_weights=True, return_lse=True)
    res = attention(
        q, k, v, graph, dropout_p=1.0, backend=backend, need_weights=True, return_lse=True
    )
    assert res.backend == kept.backend
    assert torch.equal(res.out, torch.zeros_like(res.out))
    torch.testing.assert_close(res.weights, kept.weights, atol=1e-12, rtol=0)
    torch.testing.assert_close(res.lse, kept.lse, atol=1e-12, rtol=0)
    grads = torch.autograd.grad(res.out.sum(), (q, k, v))
    assert all(torch.equal(g, torch.zeros_like(g)) for g in grads)
    assert backend_for(q, graph, backend=backend, dropout_p=1.0) == backend_for(
        q, graph, backend=backend
    )
    with pytest.raises(ValueError, match=r"'dropout_p' in \[0, 1\], got 1.5"):
        attention(q, k, v, graph, dropout_p=1.5, backend=backend)


@pytest.mark.parametrize("maps", ["shared", "separate"])
def test_weights_are_differentiable_on_every_backend(maps):
    # An attention regulariser's gradient (through the weights alone) reaches q, k,
    # the bias, the edge features and their maps as through mp's weights. "shared"
    # is TransformerConv's one edge map: the fused kernel's per-head edge path.
    n, h, c, f = 23, 2, 3, 4
    gen = torch.Generator().manual_seed(5)
    ei = torch.randint(0, n, (2, 90), generator=gen)
    graph = AttentionGraph(ei, n)
    leaves = {
        "q": torch.randn(n, h, c, generator=gen, dtype=torch.float64),
        "k": torch.randn(n, h, c, generator=gen, dtype=torch.float64),
        "score_bias": torch.randn(90, h, generator=gen, dtype=torch.float64),
        "edge_attr": torch.randn(90, f, generator=gen, dtype=torch.float64),
        "edge_key": torch.randn(h * c, f, generator=gen, dtype=torch.float64),
    }
    v = torch.randn(n, h, c, dtype=torch.float64, generator=gen)
    probe = torch.randn(90, h, generator=gen, dtype=torch.float64)
    results = {}
    for backend in ("mp", "fused", "tiles"):
        x = {name: t.clone().requires_grad_() for name, t in leaves.items()}
        value = x["edge_key"] if maps == "shared" else x["edge_key"] * 0.5
        res = attention(
            x["q"],
            x["k"],
            v,
            graph,
            score_bias=x["score_bias"],
            edge_attr=x["edge_attr"],
            edge_key=x["edge_key"],
            edge_value=value,
            backend=backend,
            need_weights=True,
        )
        assert res.backend == backend
        grads = torch.autograd.grad((res.weights * probe).sum(), list(x.values()))
        results[backend] = (res.weights.detach(), grads)
    for backend in ("fused", "tiles"):
        torch.testing.assert_close(results[backend][0], results["mp"][0], atol=1e-12, rtol=0)
        for name, got, want in zip(leaves, results[backend][1], results["mp"][1], strict=True):
            torch.testing.assert_close(got, want, atol=1e-10, rtol=0, msg=f"{backend}: d{name}")


@pytest.mark.parametrize("backend", ["fused", "sdpa"])
def test_differentiable_weights_keep_no_edge_tensors_for_the_backward(backend):
    # The weights' per-edge products are recomputed in the backward: asking for the
    # weights (to plot them, say) keeps no |E| x H x C gather alive with them.
    n, h, c = 60, 2, 16
    graph = (
        AttentionGraph.complete(lengths=[20, 40])
        if backend == "sdpa"
        else AttentionGraph(torch.randint(0, n, (2, 1500), generator=torch.Generator()), n)
    )
    q, k, v = (torch.randn(n, h, c, dtype=torch.float64, requires_grad=True) for _ in range(3))

    def saved_bytes(need_weights: bool) -> int:
        seen = {}

        def pack(t):
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            res = attention(q, k, v, graph, backend=backend, need_weights=need_weights)
        assert not need_weights or res.weights.requires_grad
        return sum(seen.values())

    gather = graph.num_edges * h * c * 8  # one [E, H, C] float64 tensor
    assert saved_bytes(True) - saved_bytes(False) < gather / 4


@pytest.mark.parametrize("backend", ["mp", "fused", "sdpa", "tiles"])
def test_no_head_gives_empty_results_in_the_autograd_graph(backend):
    # H = 0: empty out, lse and weights, each with a (zero) gradient to q, k, v, as a
    # loss of any of them needs.
    graph = AttentionGraph.causal(6)
    q, k, v = (torch.randn(6, 0, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    res = attention(q, k, v, graph, scale=0.5, backend=backend, need_weights=True, return_lse=True)
    assert res.out.shape == (6, 0, 4) and res.lse.shape == (6, 0)
    assert res.weights.shape == (graph.num_edges, 0)
    for t in (res.out, res.lse, res.weights):
        grads = torch.autograd.grad(t.sum(), (q, k, v), allow_unused=True, retain_graph=True)
        assert all(g is None or not g.any() for g in grads)


def test_dropout_same_mask_on_mp_and_fused_and_kept_fraction():
    n, h = 400, 4
    ei = torch.randint(0, n, (2, 6000), generator=torch.Generator().manual_seed(0))
    graph = AttentionGraph(ei, n)
    q, k, v = (torch.randn(n, h, 8, dtype=torch.float64) for _ in range(3))
    outs = []
    for backend in SPARSE_BACKENDS:
        torch.manual_seed(123)
        outs.append(attention(q, k, v, graph, dropout_p=0.25, backend=backend))
    torch.testing.assert_close(outs[0], outs[1], atol=1e-12, rtol=0)
    # Another seed, another mask.
    torch.manual_seed(124)
    assert not torch.allclose(outs[0], attention(q, k, v, graph, dropout_p=0.25, backend="fused"))
    # The kept fraction: binomial, within 6 standard deviations (a false
    # alarm once in 10^9 runs).
    for p in (0.1, 0.5):
        keep = dropout_keep(Dropout(p, seed=2**40 + 7, offset=3), 6000, h, torch.device("cpu"))
        trials = keep.numel()
        sd = math.sqrt(trials * p * (1 - p))
        assert abs(int(keep.sum()) - trials * (1 - p)) < 6 * sd


@pytest.mark.parametrize("backend", SPARSE_BACKENDS)
def test_gradcheck_with_a_fixed_dropout_mask(backend):
    ei, q, k, v, sb = _inputs(n=5, m=4, e=12, seed=2)
    graph = AttentionGraph(ei, 5, num_src=4)

    def fn(q, k, v, sb):
        torch.manual_seed(7)  # the same key, so the same mask, on every evaluation
        return attention(q, k, v, graph, score_bias=sb, dropout_p=0.4, backend=backend)

    assert torch.autograd.gradcheck(fn, (q, k, v, sb))


@pytest.mark.parametrize(
    "backend, graph",
    [
        ("fused", "random"),  # its edge features by the algebra, and per edge and head
        ("fused", "shared"),
        ("sdpa", "blocks"),  # the CPU's block kernel
    ],
)
def test_second_derivatives_are_mps(backend, graph):
    """A gradient penalty (``create_graph=True``: WGAN-GP, MAML): the compiled kernels'
    gradients have no graph of their own, so a double backward takes the torch
    reference's; its gradients, and the penalty's, are mp's (float64)."""
    extra = {}
    if graph == "blocks":
        g = AttentionGraph.complete(lengths=[2, 5])
        assert backend_for(torch.zeros(7, 2, 3), g).backend == "sdpa"  # "auto" too
        torch.manual_seed(9)
        q, k, v = (torch.randn(7, 2, 3, dtype=torch.float64, requires_grad=True) for _ in "qkv")
        inputs = [q, k, v]
    else:
        ei, q, k, v, sb = _inputs(cv=3, e=20, seed=4)
        g = AttentionGraph(ei, q.shape[0], num_src=k.shape[0])
        ea = torch.randn(ei.shape[1], 3, dtype=torch.float64, requires_grad=True)
        wk = torch.randn(2 * 3, 3, dtype=torch.float64, requires_grad=True)
        wv = wk if graph == "shared" else torch.randn(2 * 3, 3, dtype=torch.float64)
        extra = dict(score_bias=sb, edge_attr=ea, edge_key=wk, edge_value=wv.requires_grad_())
        extra["dropout_p"] = 0.3
        inputs = [q, k, v, sb, ea, wk] + ([wv] if wv is not wk else [])
    results = {}
    for name in ("mp", backend):
        torch.manual_seed(7)  # the same dropout mask
        out = attention(q, k, v, g, backend=name, **extra)
        weight = torch.linspace(-1, 1, out.numel(), dtype=torch.float64).view_as(out)
        grads = torch.autograd.grad((out * weight).sum(), inputs, create_graph=True)
        penalty = sum(gr.square().sum() for gr in grads)
        results[name] = (*grads, *torch.autograd.grad(penalty, inputs))
    for i, (a, b) in enumerate(zip(results[backend], results["mp"], strict=True)):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0, msg=str(i))


def test_per_call_backend_override_and_threads():
    torch.manual_seed(0)
    layer = gnnattn.SelfAttentionConv(16, 4, edge_dim=3, edge_value=True).double().eval()
    n = 40
    ei = torch.randint(0, n, (2, 300))
    graph = AttentionGraph(ei, n)
    x = torch.randn(n, 16, dtype=torch.float64)
    ea = torch.randn(300, 3, dtype=torch.float64)
    want = {b: layer(x, graph, ea, backend=b) for b in SPARSE_BACKENDS}
    torch.testing.assert_close(want["mp"], want["fused"], atol=1e-10, rtol=0)
    assert layer.backend == "auto"  # the override changed nothing on the layer
    results: dict[tuple[int, str], torch.Tensor] = {}
    errors: list[BaseException] = []

    def run(t: int) -> None:
        try:
            for i in range(5):
                b = SPARSE_BACKENDS[(t + i) % 2]
                results[(t * 5 + i, b)] = layer(x, graph, ea, backend=b)
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    assert len(results) == 20
    for (_, b), out in results.items():
        assert torch.equal(out, want[b])


def test_backend_for_says_why_and_auto_warns_on_large_graphs_on_mp(monkeypatch):
    q = torch.zeros(4, 1, 8)
    assert backend_for(q, AttentionGraph.complete(4)).backend == "sdpa"
    sparse = AttentionGraph(torch.tensor([[0, 1, 2], [1, 2, 3]]), 4)
    choice = backend_for(q, sparse, dropout_p=0.1, score_bias=True)
    assert choice.backend == "fused" and "sparse" in choice.reason
    with pytest.raises(ValueError, match="sdpa"):
        backend_for(q, sparse, backend="sdpa")
    with pytest.raises(ValueError, match="per-edge score biases"):
        backend_for(q, AttentionGraph.complete(4), backend="sdpa", score_bias=True)
    # No compiled kernel: "auto" falls back to message passing and, on a
    # large graph, says so once per graph, whatever the warnings filter.
    decl = dict(choice_mod.DECLARATIONS)
    decl["fused"] = decl["fused"]._replace(devices=frozenset())
    monkeypatch.setattr(choice_mod, "DECLARATIONS", types.MappingProxyType(decl))
    monkeypatch.setattr(choice_mod, "_WARN_EDGES", 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            gnnattn.attention(q, q, q, sparse)
        choice = backend_for(q, sparse)
    assert [str(w.message).count("message-passing path") for w in caught] == [1]
    assert caught[0].filename == __file__  # points at the caller's line
    assert choice.backend == "mp" and "no compiled kernel" in choice.reason
    again = AttentionGraph(torch.tensor([[0, 1, 2], [1, 2, 3]]), 4)
    with pytest.warns(UserWarning, match="message-passing path"):
        gnnattn.attention(q, q, q, again)  # a new graph: warned again
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert backend_for(q, AttentionGraph(torch.tensor([[0], [1]]), 4)).backend == "mp"


def test_layer_backend_for_matches_what_runs():
    layer = gnnattn.SelfAttentionConv(8, 2, dropout=0.1, edge_dim=2, edge_value=True)
    x = torch.randn(6, 8)
    ei = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])
    ea = torch.randn(4, 2)
    assert layer.backend_for(x, ei, ea).backend == "fused"
    assert gnnattn.SelfAttentionConv(8, 2).backend_for(x).backend == "sdpa"
    assert layer.backend_for(x, ei, ea, backend="mp") == ("mp", "asked for")


def test_planning_once_per_graph(monkeypatch):
    """The kernels' plans (checks and work split) are made once per graph and layout."""
    cpu = kernels_pkg.get(torch.device("cpu"))
    if cpu is kernels_pkg.reference:
        pytest.skip("numba is not installed")
    calls: list[int] = []

    def counting(real):
        def plan(indices, col, *args, **kwargs):
            # csr_plan_tensors takes the [2, E] edges, the others a CSR's (ptr, col).
            calls.append(col.numel() if isinstance(col, torch.Tensor) else indices.shape[1])
            return real(indices, col, *args, **kwargs)

        return plan

    # Every graph's backward over its transposed CSR (not a small graph's pass over the CSR).
    monkeypatch.setattr(cpu.backward, "CSR_SOURCE_PASS_MAX", 0)
    # A graph on the host makes its CSR (and its CSC) with the plan in one pass.
    for name in ("plan_tensors", "csr_plan_tensors", "csc_plan_tensors"):
        monkeypatch.setattr(cpu, name, counting(getattr(cpu, name)))
    n = 50
    graph = AttentionGraph(torch.randint(0, n, (2, 400)), n)
    layer = gnnattn.SelfAttentionConv(8, 2, dropout=0.2, edge_dim=2, edge_value=True)
    x = torch.randn(n, 8)
    ea = torch.randn(400, 2)
    for _ in range(3):
        layer(x, graph, ea).sum().backward()
    assert calls == [400, 400]  # the CSR's plan and the transposed CSR's, once each
    # A new graph object plans again: the plans live on the object, not in a cache.
    layer(x, AttentionGraph(graph.edge_index, n), ea)
    assert len(calls) == 4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_call_makes_no_host_sync_once_planned():
    n = 300
    graph = AttentionGraph(torch.randint(0, n, (2, 4000)), n).to("cuda")
    q, k, v = (torch.randn(n, 4, 16, device="cuda", requires_grad=True) for _ in range(3))
    attention(q, k, v, graph, backend="fused", dropout_p=0.1).sum().backward()  # plans made
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = attention(q, k, v, graph, backend="fused", dropout_p=0.1)
        out.sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_operator_errors_name_the_argument():
    g = AttentionGraph.causal(4)
    q = torch.randn(4, 2, 3)
    with pytest.raises(ValueError, match="'q' of shape"):
        attention(q[0], q, q, g)
    with pytest.raises(TypeError, match="'graph'"):
        attention(q, q, q, torch.tensor([[0], [1]]))
    with pytest.raises(ValueError, match="'score_bias' of shape"):
        attention(q, q, q, g, score_bias=torch.zeros(3, 2))
    with pytest.raises(ValueError, match="'dropout_p'"):
        attention(q, q, q, g, dropout_p=float("nan"))
    with pytest.raises(ValueError, match="'backend'"):
        attention(q, q, q, g, backend="dense")
    with pytest.raises(ValueError, match="'scale' to be a finite float"):
        attention(q, q, q, g, scale=float("inf"))


# Module-level values that are not state: immutable data, and what Python
# and the typing machinery put there.
_IMMUTABLE = (str, bytes, int, float, complex, bool, type(None), frozenset, tuple, range)


def _put_there_by_triton_interpreter(name: str, value: object) -> bool:
    """Under ``TRITON_INTERPRET=1`` Triton runs a ``@triton.jit`` function's source
    in its module's globals and leaves its own objects there (``chunks`` holds
    jit helpers too): those very objects are Triton's, not the package's state."""
    interp = sys.modules.get("triton.runtime.interpreter")
    return interp is not None and getattr(interp, name, None) is value


def test_no_module_level_mutable_state():
    offenders = []
    for info in pkgutil.walk_packages(gnnattn.__path__, "gnnattn."):
        if info.name.endswith("__main__") or ".kernels.triton" in info.name:
            continue
        mod = importlib.import_module(info.name)
        for name, value in vars(mod).items():
            if name.startswith("__") or name == "__all__":
                continue
            if isinstance(value, _IMMUTABLE) or inspect.ismodule(value):
                continue
            if inspect.isclass(value) or inspect.isroutine(value) or callable(value):
                continue
            if isinstance(
                value,
                (
                    types.MappingProxyType,
                    types.UnionType,
                    torch.dtype,
                    torch.device,
                    np.generic,
                    re.Pattern,  # compiled regular expressions are immutable
                ),
            ):
                continue
            if (
                isinstance(value, MessagePassingAttention)
                and not any(True for _ in value.parameters())
                and not any(True for _ in value.buffers())
            ):
                # The message-passing formulation itself: no parameters, no
                # buffers, nothing kept between calls.
                continue
            if type(value).__module__ in ("typing", "__future__"):
                continue
            if _put_there_by_triton_interpreter(name, value):
                continue
            offenders.append(f"{info.name}.{name}: {type(value).__name__}")
    assert not offenders, offenders
