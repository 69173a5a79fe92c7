"""gnnattn.nn.TransformerConv against PyG's TransformerConv with the same weights."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch_geometric.nn as pyg_nn
from torch_geometric.data import HeteroData

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
    with pytest.raises(ValueError, match=r"'dropout' in \[0, 1\], got 1.5"):
        TransformerConv(4, 2, dropout=1.5)
    with pytest.raises(ValueError, match=r"'edge_dim' to be a positive int or -1 \(lazy\), got 0"):
        TransformerConv(4, 2, edge_dim=0)
    with pytest.raises(
        ValueError, match=r"'in_channels' to be a positive int or -1 \(lazy\), got 0"
    ):
        TransformerConv(0, 2)
    with pytest.raises(ValueError, match=r"'in_channels\[1\]' to be a positive int or -1.*-2"):
        TransformerConv((4, -2), 2)
    with pytest.raises(TypeError, match=r"'in_channels\[0\]' to be an int, got str"):
        TransformerConv(("4", 4), 2)


# --------------------------------------------------------------- lazy channels, kwargs


@pytest.mark.parametrize(
    ("lazy", "fixed"), [(-1, 8), ((-1, -1), (6, 4)), ((-1, 4), (6, 4)), ((6, -1), (6, 4))]
)
def test_lazy_in_channels_load_pygs_weights_both_ways(lazy, fixed):
    ref, _ = _pair(fixed, 3, heads=2, edge_dim=2, beta=True)
    ours = TransformerConv(lazy, 3, heads=2, edge_dim=-1, beta=True).double()
    assert repr(ours) == repr(pyg_nn.TransformerConv(lazy, 3, heads=2))
    ei = _graph(9, 5 if isinstance(fixed, tuple) else 9, 20, 4)
    if isinstance(fixed, tuple):
        x = (torch.randn(9, 6, dtype=torch.float64), torch.randn(5, 4, dtype=torch.float64))
    else:
        x = torch.randn(9, 8, dtype=torch.float64)
    ea = torch.randn(ei.shape[1], 2, dtype=torch.float64)
    # PyG's weights into a lazy layer: its Linear takes their shapes.
    ours.load_state_dict(ref.state_dict())
    _close(ours(x, ei, ea), ref(x, ei, ea), "PyG's weights in a lazy layer")
    # A lazy layer's first call sets its widths; its weights load into PyG's layer.
    torch.manual_seed(1)
    fresh = TransformerConv(lazy, 3, heads=2, edge_dim=-1, beta=True).double()
    out = fresh(x, ei, ea)
    assert out.dtype == torch.float64
    ref.load_state_dict(fresh.state_dict())
    _close(ref(x, ei, ea), out, "a lazy layer's weights in PyG's")


@pytest.mark.parametrize("backend", ["mp", "fused"])
def test_dropout_one_drops_every_weight_as_pygs(backend):
    ref, ours = _pair(6, 3, heads=2, edge_dim=2, dropout=1.0)
    ours.backend = backend
    ei = _graph(7, 7, 20, 5)
    ea = torch.randn(ei.shape[1], 2, dtype=torch.float64)
    outs, grads = [], []
    for conv in (ref, ours):
        x = torch.randn(7, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
        out, (_, alpha) = conv(x, ei, ea, return_attention_weights=True)
        out.sum().backward()
        outs.append((out, alpha))
        grads.append([p.grad for p in conv.parameters()])
    _close(outs[1][0], outs[0][0], "output: the skip alone")
    _close(outs[1][1], outs[0][1], "weights before dropout")
    for g_ours, g_ref in zip(grads[1], grads[0], strict=True):
        _close(g_ours, g_ref, "gradients (zero for q, k, v and the edge map)")
    ours.eval()
    assert ours(torch.randn(7, 6, dtype=torch.float64), ei, ea).isfinite().all()


def test_a_lazy_edge_dim_takes_the_first_width_then_checks_it():
    conv = TransformerConv(4, 3, edge_dim=-1)
    ei = torch.tensor([[0, 1, 2], [1, 2, 0]])
    with pytest.raises(ValueError, match=r"'edge_attr' of shape \[3, F\], got \[3\]"):
        conv(torch.randn(3, 4), ei, torch.randn(3))
    conv(torch.randn(3, 4), ei, torch.randn(3, 5))
    assert conv.lin_edge.weight.shape == (3, 5)
    with pytest.raises(ValueError, match=r"'edge_attr' of shape \[3, 5\], got \[3, 2\]"):
        conv(torch.randn(3, 4), ei, torch.randn(3, 2))


def test_a_lazy_layer_checks_the_widths_it_has():
    conv = TransformerConv((-1, 4), 3)
    ei = torch.tensor([[0, 1], [1, 0]])
    with pytest.raises(ValueError, match=r"Expected 'x\[1\]' of shape \[N, 4\], got \[2, 5\]"):
        conv((torch.randn(2, 6), torch.randn(2, 5)), ei)
    conv((torch.randn(2, 6), torch.randn(2, 4)), ei)
    with pytest.raises(ValueError, match=r"Expected 'x\[0\]' of shape \[N, 6\], got \[2, 7\]"):
        conv((torch.randn(2, 7), torch.randn(2, 4)), ei)


def _hetero() -> HeteroData:
    gen = torch.Generator().manual_seed(0)
    data = HeteroData()
    data["a"].x = torch.randn(4, 8, generator=gen, dtype=torch.float64)
    data["b"].x = torch.randn(3, 6, generator=gen, dtype=torch.float64)
    data["a", "to", "b"].edge_index = torch.tensor([[0, 1, 3, 2], [0, 2, 1, 1]])
    data["b", "rev", "a"].edge_index = torch.tensor([[0, 2, 1], [0, 1, 3]])
    return data


class _Net(torch.nn.Module):
    def __init__(self, conv_cls: type) -> None:
        super().__init__()
        self.conv = conv_cls((-1, -1), 4, heads=2)

    def forward(self, x, edge_index):
        return self.conv(x, edge_index)


def test_to_hetero_with_lazy_channels_equals_pygs():
    data = _hetero()
    ref = pyg_nn.to_hetero(_Net(pyg_nn.TransformerConv), data.metadata()).double()
    ours = pyg_nn.to_hetero(_Net(TransformerConv), data.metadata()).double()
    want = ref(data.x_dict, data.edge_index_dict)  # sets the widths of each edge type
    ours.load_state_dict(ref.state_dict())
    got = ours(data.x_dict, data.edge_index_dict)
    assert set(got) == {"a", "b"}
    for key in got:
        _close(got[key], want[key], key)


@pytest.mark.parametrize(
    "kwargs", [dict(aggr="add"), dict(aggr="mean"), dict(aggr="max"), dict(flow="target_to_source")]
)
def test_message_passing_kwargs_as_in_pygs_layer(kwargs):
    # PyG hands them to MessagePassing; another aggregation than "add" aggregates the
    # weighted values otherwise (no longer attention), and PyG's propagate runs it.
    ref, ours = _pair(8, 3, heads=2, edge_dim=2, **kwargs)
    assert ours.aggr == ref.aggr and ours.flow == ref.flow
    ei = _graph(10, 10, 30, 5)
    x = torch.randn(10, 8, dtype=torch.float64)
    ea = torch.randn(ei.shape[1], 2, dtype=torch.float64)
    out_r, (_, a_r) = ref(x, ei, ea, return_attention_weights=True)
    out_o, (_, a_o) = ours(x, ei, ea, return_attention_weights=True)
    _close(out_o, out_r, "out")
    _close(a_o, a_r, "alpha")
    default = kwargs == dict(aggr="add")
    assert (ours.backend_for(x, ei, ea).backend == "propagate") != default


# --------------------------------------------------------------- edge_attr dtype, device


def test_edge_attr_of_another_dtype_or_device_is_refused():
    conv = TransformerConv(8, 4, edge_dim=3)
    x, ei = torch.randn(4, 8), torch.tensor([[0, 1, 2], [1, 2, 3]])
    with pytest.raises(
        TypeError, match=r"'edge_attr' of dtype torch.float32 \(the dtype of x\), got torch.float64"
    ):
        conv(x, ei, torch.randn(3, 3, dtype=torch.float64))
    with pytest.raises(TypeError, match=r"'edge_attr' of a floating dtype, got torch.int64"):
        conv(x, ei, torch.ones(3, 3, dtype=torch.long))
    with pytest.raises(
        ValueError, match=r"'edge_attr' on device cpu \(the device of x\), got meta"
    ):
        conv(x, ei, torch.randn(3, 3, device="meta"))
    with pytest.raises(TypeError, match="'edge_attr' of dtype"):
        conv.backend_for(x, ei, torch.randn(3, 3, dtype=torch.float64))


def test_edge_attr_under_autocast_takes_any_floating_dtype():
    conv = TransformerConv(8, 4, heads=2, edge_dim=3)
    x, ei = torch.randn(4, 8), torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]])
    ea = torch.randn(4, 3)
    ref = conv(x, ei, ea)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for x_in in (x, x.bfloat16()):
            out = conv(x_in, ei, ea)
            assert out.dtype == torch.bfloat16
            assert (out.float() - ref).abs().max() < 0.1
