"""Dilated-window and BigBird graphs against dense masks made pair by pair."""

from __future__ import annotations

import itertools
import sys

import pytest
import torch

from gnnattn import (
    AttentionGraph,
    SelfAttentionConv,
    attention,
    bigbird_graph,
    complete_graph,
    dense_self_attention,
    dilated_window_graph,
    edge_index_to_mask,
    mask_to_edge_index,
    sliding_window_graph,
)
from gnnattn.graphs import Pattern, is_sorted_by_target, pattern_of

TOL = 1e-10


def batch_of(lengths):
    return torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))


def pairs(lengths):
    """``(i, j, pos_i, pos_j, T, seq)`` for every pair of positions of one sequence."""
    start = 0
    for s, t in enumerate(lengths):
        for pi, pj in itertools.product(range(t), repeat=2):
            yield start + pi, start + pj, pi, pj, t, s
        start += t


def dilated_mask(lengths, w, d, causal):
    n = sum(lengths)
    m = torch.zeros(n, n, dtype=torch.bool)
    for i, j, pi, pj, _, _ in pairs(lengths):
        delta = pi - pj
        m[i, j] = delta % d == 0 and abs(delta) <= w * d and (delta >= 0 or not causal)
    return m


def bigbird_mask(lengths, b, w, g, random_blocks, causal):
    """BigBird's mask from its definition, given the drawn random blocks per query block."""
    n = sum(lengths)
    m = torch.zeros(n, n, dtype=torch.bool)
    first_block = [0]
    for t in lengths:
        first_block.append(first_block[-1] + -(-t // b))
    for i, j, pi, pj, _, s in pairs(lengths):
        qi, qj = pi // b, pj // b
        rand = set(random_blocks[first_block[s] + qi].tolist()) - {-1}
        m[i, j] = (abs(qi - qj) <= w or qj in rand or pj < g or pi < g) and (pj <= pi or not causal)
    return m


def check_layout(g: AttentionGraph, mask: torch.Tensor) -> None:
    ei = g.edge_index
    assert ei.dtype == torch.int64 and is_sorted_by_target(ei)
    assert g.csr.perm is None  # the CSR is the edges as built
    assert torch.equal(edge_index_to_mask(ei, mask.shape[0]), mask)
    # Sorted by target then source, no repeats: the row-major order of the mask.
    assert torch.equal(mask_to_edge_index(mask), ei)


@pytest.mark.parametrize("lengths", [[1], [9], [3, 1, 11], [17]])
@pytest.mark.parametrize("causal", [False, True])
def test_dilated_window_matches_its_dense_mask(lengths, causal):
    n = sum(lengths)
    for w, d in itertools.product(range(4), range(1, 5)):
        mask = dilated_mask(lengths, w, d, causal)
        by_lengths = dilated_window_graph(window=w, dilation=d, causal=causal, lengths=lengths)
        check_layout(by_lengths, mask)
        by_batch = dilated_window_graph(
            n, window=w, dilation=d, causal=causal, batch=batch_of(lengths)
        )
        assert torch.equal(by_batch.edge_index, by_lengths.edge_index)
        assert by_lengths.is_causal == causal or bool(
            (by_lengths.edge_index[0] <= by_lengths.edge_index[1]).all()
        )
        p = pattern_of(by_lengths)
        assert p == Pattern("dilated_window", tuple(lengths), causal, w, d)


def test_dilation_one_is_the_sliding_window():
    g = dilated_window_graph(40, window=3, dilation=1)
    assert g.structure is not None and g.structure.kind == "window" and g.structure.window == 3
    assert g.num_edges == 40 * 7 - 2 * (3 + 2 + 1)
    assert pattern_of(g).dilation == 1


def test_dilated_window_degrees():
    t, w, d = 200, 4, 5
    for causal in (False, True):
        deg = dilated_window_graph(t, window=w, dilation=d, causal=causal).csr.ptr.diff()
        pos = torch.arange(t)
        inside = (pos >= w * d) & (pos < t - w * d)
        assert bool((deg[inside] == (w + 1 if causal else 2 * w + 1)).all())
        assert int(deg.max()) == (w + 1 if causal else 2 * w + 1) and int(deg.min()) >= 1


BIGBIRD = [  # lengths, block, window blocks, global tokens, random blocks
    ([30], 4, 1, 4, 2),
    ([23], 3, 0, 0, 3),
    ([5, 17, 1, 26], 4, 1, 2, 1),
    ([40], 8, 2, 5, 4),  # more random blocks asked for than are left to draw
    ([12], 2, 1, 100, 1),  # more global tokens than tokens
]


@pytest.mark.parametrize("lengths, b, w, g, r", BIGBIRD)
@pytest.mark.parametrize("causal", [False, True])
def test_bigbird_matches_its_dense_mask(lengths, b, w, g, r, causal):
    kw = dict(block_size=b, window_blocks=w, num_global=g, num_random_blocks=r, causal=causal)
    graph = bigbird_graph(lengths=lengths, seed=3, **kw)
    p = pattern_of(graph)
    assert p is not None and p.kind == "bigbird" and (p.block_size, p.window) == (b, w)
    assert (p.num_global, p.num_random, p.seed, p.causal) == (g, r, 3, causal)
    nblocks = [-(-t // b) for t in lengths]
    rand = p.random_blocks
    assert rand.shape == (sum(nblocks), r) and rand.dtype == torch.int64
    check_layout(graph, bigbird_mask(lengths, b, w, g, rand, causal))
    # The random blocks, checked against the rule they were drawn by.
    row = 0
    for t, nb in zip(lengths, nblocks, strict=True):
        for q in range(nb):
            eligible = {
                k
                for k in range(nb)
                if (q - k > w if causal else abs(q - k) > w) and min((k + 1) * b, t) > g
            }
            drawn = [k for k in rand[row].tolist() if k >= 0]
            assert drawn == sorted(set(drawn)) and set(drawn) <= eligible
            assert len(drawn) == min(r, len(eligible))
            assert rand[row, len(drawn) :].eq(-1).all()
            row += 1
    by_batch = bigbird_graph(sum(lengths), batch=batch_of(lengths), seed=3, **kw)
    assert torch.equal(by_batch.edge_index, graph.edge_index)


def test_bigbird_is_deterministic_given_its_seed():
    kw = dict(block_size=16, window_blocks=1, num_global=16, num_random_blocks=3)
    a, b = bigbird_graph(1024, seed=5, **kw), bigbird_graph(1024, seed=5, **kw)
    assert torch.equal(a.edge_index, b.edge_index)
    assert torch.equal(pattern_of(a).random_blocks, pattern_of(b).random_blocks)
    # The global generator is neither read nor advanced.
    torch.manual_seed(123)
    before = torch.get_rng_state()
    c = bigbird_graph(1024, seed=5, **kw)
    assert torch.equal(torch.get_rng_state(), before) and torch.equal(a.edge_index, c.edge_index)
    other = bigbird_graph(1024, seed=6, **kw)
    assert not torch.equal(pattern_of(other).random_blocks, pattern_of(a).random_blocks)


def test_bigbird_degrees():
    t, b, w, g, r = 1024, 16, 1, 32, 3
    deg = bigbird_graph(
        t, block_size=b, window_blocks=w, num_global=g, num_random_blocks=r, seed=0
    ).csr.ptr.diff()
    pos = torch.arange(t)
    assert bool((deg[pos < g] == t).all())  # global tokens read every token
    # Away from the global tokens and the ends: the window, the random blocks, the globals.
    inside = (pos >= g + (w + 1) * b) & (pos < t - (w + 1) * b)
    assert bool((deg[inside] == (2 * w + 1 + r) * b + g).all())
    causal = bigbird_graph(
        t, block_size=b, window_blocks=w, num_global=g, num_random_blocks=r, causal=True
    ).csr.ptr.diff()
    assert bool((causal <= pos + 1).all()) and bool((causal[pos < g] == pos[pos < g] + 1).all())


@pytest.mark.parametrize(
    "make",
    [
        lambda **kw: dilated_window_graph(window=2, dilation=3, **kw),
        lambda **kw: bigbird_graph(block_size=4, window_blocks=1, num_global=3, **kw),
    ],
    ids=["dilated", "bigbird"],
)
@pytest.mark.parametrize("causal", [False, True])
def test_attention_on_patterns_equals_dense_attention(make, causal):
    lengths = [29, 6, 17]
    graph = make(lengths=lengths, causal=causal)
    mask = edge_index_to_mask(graph.edge_index, sum(lengths))
    n, h, c = sum(lengths), 2, 4
    q, k, v = (torch.randn(n, h, c, dtype=torch.float64) for _ in range(3))
    s = torch.einsum("ihc,jhc->hij", q, k) * c**-0.5
    p = torch.softmax(s.masked_fill(~mask, float("-inf")), -1)  # (H, N, N)
    want = torch.einsum("hij,jhc->ihc", p, v)
    for backend in ("mp", "fused", "auto"):
        got = attention(q, k, v, graph, backend=backend)
        assert torch.allclose(got, want, atol=TOL), backend
    layer = SelfAttentionConv(8, 2).double()
    x = torch.randn(n, 8, dtype=torch.float64, requires_grad=True)
    ref = dense_self_attention(layer, x, mask)
    (g_ref,) = torch.autograd.grad(ref.square().sum(), x)
    for backend in ("mp", "fused"):
        out = layer(x, graph, backend=backend)
        (g_out,) = torch.autograd.grad(out.square().sum(), x)
        assert torch.allclose(out, ref, atol=TOL) and torch.allclose(g_out, g_ref, atol=TOL)


def test_pattern_bad_input():
    with pytest.raises(ValueError, match="'dilation'"):
        dilated_window_graph(5, window=1, dilation=0)
    with pytest.raises(ValueError, match="'window'"):
        dilated_window_graph(5, window=-1, dilation=2)
    with pytest.raises(TypeError, match="'window'"):
        dilated_window_graph(5, window=1.5, dilation=2)
    with pytest.raises(ValueError, match="'block_size'"):
        bigbird_graph(5, block_size=0)
    for name in ("window_blocks", "num_global", "num_random_blocks"):
        with pytest.raises(ValueError, match=f"'{name}'"):
            bigbird_graph(5, **{name: -1})
    with pytest.raises(ValueError, match="'lengths' or 'batch'"):
        bigbird_graph(batch=torch.zeros(3, dtype=torch.long), lengths=[3])
    with pytest.raises(ValueError, match="'num_nodes' or 'batch'"):
        dilated_window_graph(window=1, dilation=2)


def test_empty_and_tiny():
    assert dilated_window_graph(0, window=2, dilation=2).num_edges == 0
    assert bigbird_graph(0).num_edges == 0
    one = bigbird_graph(1, block_size=4, num_global=0, num_random_blocks=2)
    assert one.edge_index.tolist() == [[0], [0]]


@pytest.mark.parametrize(
    "kw",
    [
        dict(num_global=10**7, num_random_blocks=0),
        dict(window_blocks=10**7, num_global=0, num_random_blocks=0),
        dict(num_random_blocks=10**7, num_global=0),
    ],
)
def test_bigbird_arguments_past_the_sequence_cost_no_memory(kw):
    # Each reads every block of a 64-token sequence: the complete graph. Their
    # [Q, 2w + 1], [Q, g / b] and [Q, r] candidate tables took gigabytes.
    g = bigbird_graph(64, block_size=1, **kw)
    assert torch.equal(g.edge_index, complete_graph(64))
    assert pattern_of(g).random_blocks.shape[1] <= 64


def test_an_unbounded_sliding_window_is_the_complete_graph():
    assert torch.equal(sliding_window_graph(5, window=sys.maxsize), complete_graph(5))
