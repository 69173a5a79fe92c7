"""gnnattn.nn.TransformerConv against PyG's TransformerConv with the same weights."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch_geometric.nn as pyg_nn

from gnnattn import AttentionGraph
from gnnattn.nn import TransformerConv

OPTIONS = list(
    itertools.product(
        [None, 3],  # edge_dim
        [True, False],  # concat
        [False, True],  # beta
        [True, False],  # root_weight
        [1, 3],  # heads
    )
)


def _pair(in_channels, out_channels, **kwargs):
    torch.manual_seed(0)
    ref = pyg_nn.TransformerConv(in_channels, out_channels, **kwargs).double()
    ours = TransformerConv(in_channels, out_channels, **kwargs).double()
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def _graph(n_src, n_dst, e, seed):
    gen = torch.Generator().manual_seed(seed)
    ei = torch.stack(
        [
            torch.randint(0, n_src, (e,), generator=gen),
            torch.randint(0, n_dst - 1, (e,), generator=gen),
        ]
    )
    ei = torch.cat([ei, ei[:, :3]], dim=1)  # duplicate edges; target n_dst - 1 isolated
    return ei


def _close(a, b, what):
    torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9, msg=what)


@pytest.mark.parametrize("backend", ["mp", "fused"])
@pytest.mark.parametrize(("edge_dim", "concat", "beta", "root_weight", "heads"), OPTIONS)
def test_parity_with_pyg(backend, edge_dim, concat, beta, root_weight, heads):
    kw = dict(heads=heads, concat=concat, beta=beta, root_weight=root_weight, edge_dim=edge_dim)
    ref, ours = _pair(8, 5, **kw)
    ei = _graph(11, 11, 40, heads)
    x = torch.randn(11, 8, dtype=torch.float64, requires_grad=True)
    ea = torch.randn(ei.shape[1], 3, dtype=torch.float64, requires_grad=True) if edge_dim else None
    out_r, (ei_r, a_r) = ref(x, ei, ea, return_attention_weights=True)
    out_o, (ei_o, a_o) = ours(x, ei, ea, return_attention_weights=True, backend=backend)
    _close(out_o, out_r, "out")
    assert torch.equal(ei_o, ei_r)
    _close(a_o, a_r, "alpha")
    g = torch.randn_like(out_r)
    inputs = [x] + ([ea] if ea is not None else [])
    # lin_skip exists without root_weight (as in PyG) and gets no gradient.
    grads_r = torch.autograd.grad(out_r, inputs + list(ref.parameters()), g, allow_unused=True)
    grads_o = torch.autograd.grad(out_o, inputs + list(ours.parameters()), g, allow_unused=True)
    names = (
        ["x"] + (["edge_attr"] if ea is not None else []) + [n for n, _ in ours.named_parameters()]
    )
    for name, a, b in zip(names, grads_o, grads_r, strict=True):
        assert (a is None) == (b is None), name
        if a is not None:
            _close(a, b, f"d{name}")


@pytest.mark.parametrize("backend", ["mp", "fused"])
@pytest.mark.parametrize("edge_dim", [None, 2])
def test_bipartite_with_channel_pairs(backend, edge_dim):
    ref, ours = _pair((6, 4), 3, heads=2, edge_dim=edge_dim)
    ei = _graph(9, 5, 20, 1)
    xs, xd = torch.randn(9, 6, dtype=torch.float64), torch.randn(5, 4, dtype=torch.float64)
    ea = torch.randn(ei.shape[1], 2, dtype=torch.float64) if edge_dim else None
    _close(ours((xs, xd), ei, ea, backend=backend), ref((xs, xd), ei, ea), "out")


def test_state_dict_both_ways_and_repr():
    for kw in (dict(heads=2), dict(heads=4, edge_dim=3, beta=True, concat=False)):
        ref, ours = _pair(8, 4, **kw)
        assert list(ours.state_dict()) == list(ref.state_dict())
        ref.load_state_dict(ours.state_dict())
        assert repr(ours) == repr(ref)


def test_weights_do_not_depend_on_edge_order():
    _, ours = _pair(8, 4, heads=2, edge_dim=3)
    ei = _graph(10, 10, 30, 2)
    x, ea = (
        torch.randn(10, 8, dtype=torch.float64),
        torch.randn(ei.shape[1], 3, dtype=torch.float64),
    )
    out, (_, a) = ours(x, ei, ea, return_attention_weights=True)
    perm = torch.randperm(ei.shape[1])
    out_p, (_, a_p) = ours(x, ei[:, perm], ea[perm], return_attention_weights=True)
    _close(out_p, out, "out")
    _close(a_p, a[perm], "alpha")


def test_takes_an_attention_graph_and_edge_index_types():
    _, ours = _pair(8, 4, heads=2, edge_dim=3)
    ei = _graph(10, 10, 30, 3)
    x, ea = (
        torch.randn(10, 8, dtype=torch.float64),
        torch.randn(ei.shape[1], 3, dtype=torch.float64),
    )
    want = ours(x, ei, ea)
    _close(ours(x, AttentionGraph(ei, 10), ea), want, "AttentionGraph")
    from torch_geometric import EdgeIndex

    _close(ours(x, EdgeIndex(ei, sparse_size=(10, 10)), ea), want, "EdgeIndex")


def test_errors():
    with pytest.raises(ValueError, match="edge_attr"):
        TransformerConv(4, 2, edge_dim=3)(torch.randn(3, 4), torch.tensor([[0], [1]]))
    with pytest.raises(ValueError, match="out_channels"):
        TransformerConv(4, 0)
    with pytest.raises(ValueError, match="dropout"):
        TransformerConv(4, 2, dropout=float("nan"))
