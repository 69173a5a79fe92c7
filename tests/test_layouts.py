"""The CPU's counting sorts (gnnattn.kernels.cpu.layouts) against the torch versions.

``to_csr``, ``transpose_csr`` and ``detect_structure`` take the compiled path
on CPU tensors; the torch path (any device, and inside torch.compile) must
give the same tensors, order of ties included, since the kernels' sums follow it.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from gnnattn.graphs import csr as csr_mod
from gnnattn.graphs.builders import causal_graph, complete_graph, sliding_window_graph
from gnnattn.kernels.cpu import layouts


def _cases():
    gen = torch.Generator().manual_seed(0)
    yield "empty", torch.zeros(2, 0, dtype=torch.long), 3, 4
    yield "one node", torch.tensor([[0], [0]]), 1, 1
    yield "isolated", torch.tensor([[0, 2, 2], [2, 0, 2]]), 5, 5
    for trial in range(40):
        n, m, e = (int(torch.randint(1, 50, (), generator=gen)) for _ in range(3))
        ei = torch.stack(
            [
                torch.randint(0, m, (e * 3,), generator=gen),
                torch.randint(0, n, (e * 3,), generator=gen),
            ]
        )
        if trial % 3 == 0:  # grouped by target already (kept in its order)
            ei = ei[:, torch.argsort(ei[1], stable=True)]
        if trial % 5 == 0:  # a hub, duplicates included
            ei[1, : ei.shape[1] // 2] = 0
        yield f"random {trial}", ei, n, m
    yield "int32", torch.tensor([[3, 1, 0, 1], [1, 0, 1, 0]], dtype=torch.int32), 2, 4


@pytest.mark.parametrize(
    "name,ei,n,m", list(_cases()), ids=lambda c: c if isinstance(c, str) else ""
)
def test_layouts_equal_the_torch_versions(name, ei, n, m):
    got = csr_mod.to_csr(ei, n, m)
    want = csr_mod._to_csr_torch(ei, n, m)
    assert torch.equal(got.ptr, want.ptr) and torch.equal(got.col, want.col)
    assert (got.perm is None) == (want.perm is None)
    if want.perm is not None:
        assert torch.equal(got.perm, want.perm)
    for dtype in (torch.int32, torch.int64):
        a = csr_mod.transpose_csr(got.ptr, got.col, m, dtype=dtype)
        b = csr_mod._transpose_csr_torch(want.ptr, want.col, m, dtype)
        for x, y in zip(a, b, strict=True):
            assert torch.equal(x, y) and x.dtype == y.dtype


@pytest.mark.parametrize(
    "name,ei,n,m", list(_cases()), ids=lambda c: c if isinstance(c, str) else ""
)
def test_a_graph_makes_the_layouts_and_plans_of_the_separate_passes(name, ei, n, m):
    # AttentionGraph builds its CSR with the plan (and its CSC with that plan) in
    # one compiled pass each: the same arrays as to_csr, transpose_csr and
    # plan_tensors make one at a time.
    from gnnattn import AttentionGraph
    from gnnattn.kernels.library import plan_tensors

    g = AttentionGraph(ei, n, num_src=m if m != n else None)
    want = csr_mod.to_csr(ei, n, m)
    assert torch.equal(g.csr.ptr, want.ptr) and torch.equal(g.csr.col, want.col)
    assert (g.csr.perm is None) == (want.perm is None)
    if want.perm is not None:
        assert torch.equal(g.csr.perm, want.perm)
    plan = g.peek(("plan", "cpu", "csr"))  # made with the CSR, before any call
    assert plan is not None
    assert torch.equal(plan, plan_tensors(want.ptr, want.col, m))
    tcsc = csr_mod._transpose_csr_torch(want.ptr, want.col, m, g.csc.row.dtype)
    for x, y in zip(g.csc, tcsc, strict=True):
        assert torch.equal(x, y) and x.dtype == y.dtype
    assert torch.equal(g.kernel_plan("csc"), plan_tensors(*tcsc[:2], n, perm=tcsc[2]))


def test_a_graph_names_the_id_out_of_range():
    from gnnattn import AttentionGraph

    with pytest.raises(ValueError, match=r"'edge_index'\[1\] below the number of nodes 3, got 3"):
        AttentionGraph(torch.tensor([[0, 1], [3, 0]]), 3)
    with pytest.raises(ValueError, match=r"node ids >= 0, got -1"):
        AttentionGraph(torch.tensor([[0, -1], [1, 0]]), 2)
    with pytest.raises(ValueError, match=r"'edge_index'\[0\] below the number of nodes 2"):
        AttentionGraph(torch.tensor([[0, 5], [1, 0]]), 3, num_src=2)


@pytest.mark.parametrize(
    "graph",
    [
        causal_graph(7),
        complete_graph(5),
        sliding_window_graph(9, window=2),
        torch.tensor([[0, 1, 1], [0, 0, 1]]),
    ],
)
def test_row_ranges_equal_the_torch_check(graph):
    c = csr_mod.to_csr(graph, int(graph.max()) + 1)
    want = bool((c.ptr.diff() > 0).all()) and all(
        bool((c.col[a + 1 : b] - c.col[a : b - 1] == 1).all())
        for a, b in zip(c.ptr[:-1].tolist(), c.ptr[1:].tolist(), strict=True)
    )
    assert layouts.rows_are_ranges(c.ptr, c.col) == want


def test_ids_out_of_range_raise_instead_of_writing_out_of_bounds():
    with pytest.raises(ValueError, match=r"'edge_index\[1\]' in \[0, 3\), got 3"):
        csr_mod.to_csr(torch.tensor([[0, 1], [3, 0]]), 3)
    with pytest.raises(ValueError, match=r"'edge_index\[0\]' in \[0, 2\), got -1"):
        csr_mod.to_csr(torch.tensor([[0, -1], [1, 0]]), 2)
    with pytest.raises(ValueError, match="'col'"):
        csr_mod.transpose_csr(torch.tensor([0, 1, 2]), torch.tensor([0, 5]), 2)
    with pytest.raises(ValueError, match="'ptr'"):
        csr_mod.transpose_csr(torch.tensor([0, 3, 2]), torch.tensor([0, 1]), 2)


def test_graphs_build_without_numba():
    # numba is optional: without it the torch versions build the layouts.
    code = (
        "import sys; sys.modules['numba'] = None\n"
        "import torch\n"
        "from gnnattn import AttentionGraph, SelfAttentionConv\n"
        "from gnnattn.kernels import COMPILED\n"
        "assert 'cpu' not in COMPILED\n"
        "g = AttentionGraph(torch.tensor([[0, 1, 2, 1], [1, 2, 0, 0]]), 3)\n"
        "out = SelfAttentionConv(4, 1)(torch.randn(3, 4), g)\n"
        "print(g.structure, list(out.shape), g.csc.perm.tolist())\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["None", "[3,", "4]", "[2,", "0,", "3,", "1]"]
