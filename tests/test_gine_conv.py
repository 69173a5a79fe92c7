"""gnnattn.nn.GINEConv: PyG's GINEConv with its messages summed in chunks of edges.

Checked against PyG's own layer with the same weights (float64 at 1e-10: the
two differ only in the order of float additions), with chunks of a few edges
so that every call crosses chunk boundaries; that no ``[|E|, D]`` tensor is
kept for the backward; that the calls it does not take go to PyG unchanged;
and the operator's registration (opcheck).
"""

from __future__ import annotations

import pytest
import torch
from torch_geometric.nn import MLP
from torch_geometric.nn import GINEConv as PyGGINEConv

from gnnattn.kernels import edge_sum
from gnnattn.nn import GINEConv


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    # 12 values per chunk: 2-3 edges at D = 5, so every graph below spans chunks.
    monkeypatch.setattr(edge_sum, "CHUNK_ELEMENTS", 12)


def _pair(edge_dim: int | None, d: int = 5, train_eps: bool = False, dtype=torch.float64):
    torch.manual_seed(0)
    ours = GINEConv(MLP([d, 7, 3]), eps=0.25, train_eps=train_eps, edge_dim=edge_dim).to(dtype)
    theirs = PyGGINEConv(MLP([d, 7, 3]), eps=0.25, train_eps=train_eps, edge_dim=edge_dim).to(dtype)
    theirs.load_state_dict(ours.state_dict())
    ours.eval(), theirs.eval()  # the MLP's batch norm: the same running statistics
    return ours, theirs


def _chunked_only(layer: GINEConv) -> GINEConv:
    """``layer`` with PyG's propagate made to fail: a call that passes took the chunked sum."""

    def fail(*args, **kwargs):
        raise AssertionError("the call took PyG's propagate, not the chunked sum")

    layer.propagate = fail  # type: ignore[method-assign]
    return layer


def _graph(n: int, e: int, *, isolated: int = 0, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    # The last `isolated` nodes get no in-edges.
    return torch.stack(
        [
            torch.randint(0, n, (e,), generator=g),
            torch.randint(0, max(n - isolated, 1), (e,), generator=g),
        ]
    )


def _grads(layer, x, edge_index, edge_attr, **kw):
    layer.zero_grad(set_to_none=True)
    xs = [t.clone().requires_grad_() for t in ((x,) if isinstance(x, torch.Tensor) else x)]
    ea = edge_attr.clone().requires_grad_()
    out = layer(xs[0] if len(xs) == 1 else tuple(xs), edge_index, ea, **kw)
    weight = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)
    (out * weight).sum().backward()
    params = {name.removeprefix("_orig_mod."): p.grad for name, p in layer.named_parameters()}
    return out, [t.grad for t in xs], ea.grad, params


def _assert_same(a, b, tol: float) -> None:
    out_a, gx_a, ge_a, gp_a = a
    out_b, gx_b, ge_b, gp_b = b
    torch.testing.assert_close(out_a, out_b, rtol=tol, atol=tol)
    for u, v in zip(gx_a, gx_b, strict=True):
        torch.testing.assert_close(u, v, rtol=tol, atol=tol)
    torch.testing.assert_close(ge_a, ge_b, rtol=tol, atol=tol)
    assert gp_a.keys() == gp_b.keys()
    for name in gp_a:
        if gp_b[name] is None:
            assert gp_a[name] is None, name
        else:
            torch.testing.assert_close(gp_a[name], gp_b[name], rtol=tol, atol=tol, msg=name)


@pytest.mark.parametrize("edge_dim", [None, 4])
@pytest.mark.parametrize(
    "n, e, isolated",
    [(1, 1, 0), (1, 0, 0), (6, 0, 0), (13, 29, 3), (40, 200, 0)],
    ids=["one-node", "one-node-no-edges", "empty", "isolated", "dense-ish"],
)
def test_matches_pyg_float64(small_chunks, edge_dim, n, e, isolated) -> None:
    ours, theirs = _pair(edge_dim, train_eps=True)
    _chunked_only(ours)
    edge_index = _graph(n, e, isolated=isolated)
    x = torch.randn(n, 5, dtype=torch.float64)
    edge_attr = torch.randn(e, edge_dim or 5, dtype=torch.float64)
    _assert_same(
        _grads(ours, x, edge_index, edge_attr), _grads(theirs, x, edge_index, edge_attr), 1e-10
    )


def test_matches_pyg_float32_logits_scaled(small_chunks) -> None:
    # Features of size 1e3: the ReLU's active set is the same, the sums agree
    # to float32's relative rounding of a few additions.
    ours, theirs = _pair(3, dtype=torch.float32)
    _chunked_only(ours)
    edge_index = _graph(17, 60)
    x = 1e3 * torch.randn(17, 5)
    edge_attr = torch.randn(60, 3)
    _assert_same(
        _grads(ours, x, edge_index, edge_attr), _grads(theirs, x, edge_index, edge_attr), 1e-5
    )


@pytest.mark.parametrize("where", ["x", "edge_attr"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_inputs_match_pyg(small_chunks, where, bad) -> None:
    # torch's ReLU backward passes the gradient where its output is NaN (its mask
    # is "not <= 0"): the chunked backward must too, or a NaN message's gradient
    # to x, the edge map and its bias is dropped.
    ours, theirs = _pair(4, train_eps=True)
    _chunked_only(ours)
    edge_index = _graph(13, 29, isolated=3)
    x = torch.randn(13, 5, dtype=torch.float64)
    edge_attr = torch.randn(29, 4, dtype=torch.float64)
    (x if where == "x" else edge_attr)[2, 1] = bad
    a, b = _grads(ours, x, edge_index, edge_attr), _grads(theirs, x, edge_index, edge_attr)
    close = {"rtol": 1e-10, "atol": 1e-10, "equal_nan": True}
    torch.testing.assert_close(a[0], b[0], **close)
    torch.testing.assert_close(a[1], b[1], **close)
    torch.testing.assert_close(a[2], b[2], **close)
    for name, grad in a[3].items():
        torch.testing.assert_close(grad, b[3][name], msg=name, **close)


def test_bipartite_and_int32(small_chunks) -> None:
    ours, theirs = _pair(2)
    _chunked_only(ours)
    g = torch.Generator().manual_seed(3)
    edge_index = torch.stack(
        [torch.randint(0, 9, (31,), generator=g), torch.randint(0, 4, (31,), generator=g)]
    )
    x = (torch.randn(9, 5, dtype=torch.float64), torch.randn(4, 5, dtype=torch.float64))
    edge_attr = torch.randn(31, 2, dtype=torch.float64)
    # int32 ids against PyG's int64 (PyG's own backward is wrong with int32 ids on
    # torch 2.13: its scatter's gather with an expanded int32 index).
    _assert_same(
        _grads(ours, x, edge_index.int(), edge_attr),
        _grads(theirs, x, edge_index, edge_attr),
        1e-10,
    )
    # No target features: the sum alone, one row per source (PyG's size rule).
    torch.testing.assert_close(
        ours((x[0], None), edge_index, edge_attr),
        theirs((x[0], None), edge_index, edge_attr),
        rtol=1e-10,
        atol=1e-10,
    )


def test_double_backward_matches_pyg(small_chunks) -> None:
    # A gradient penalty: the gradient of x's gradient reaches the parameters.
    ours, theirs = _pair(3)
    _chunked_only(ours)
    edge_index = _graph(12, 40)
    x = torch.randn(12, 5, dtype=torch.float64)
    edge_attr = torch.randn(40, 3, dtype=torch.float64)

    def penalty_grads(layer, from_x):
        xx = x.clone().requires_grad_()
        # Or edge features made from x (its endpoints' difference): the op's inputs then
        # depend on each other, and each path must be counted once.
        ea = (xx[edge_index[0]] - xx[edge_index[1]])[:, :3] if from_x else edge_attr
        (gx,) = torch.autograd.grad(layer(xx, edge_index, ea).sum(), xx, create_graph=True)
        wrt = [xx, *layer.parameters()]
        return torch.autograd.grad(gx.square().sum(), wrt, allow_unused=True)

    for from_x in (False, True):
        pairs = zip(penalty_grads(ours, from_x), penalty_grads(theirs, from_x), strict=True)
        for a, b in pairs:
            if b is None:
                assert a is None or not a.abs().any()
            else:
                torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_export_with_dynamic_sizes_and_jit_trace() -> None:
    ours, _ = _pair(3)
    ei_a, ei_b = _graph(10, 30), _graph(15, 47, seed=2)
    xa, xb = torch.randn(10, 5, dtype=torch.float64), torch.randn(15, 5, dtype=torch.float64)
    ea, eb = torch.randn(30, 3, dtype=torch.float64), torch.randn(47, 3, dtype=torch.float64)
    n, e = torch.export.Dim("n", min=2), torch.export.Dim("e", min=2)
    program = torch.export.export(ours, (xa, ei_a, ea), dynamic_shapes=({0: n}, {1: e}, {0: e}))
    assert any("relu_edge_sum" in str(node.target) for node in program.graph.nodes)
    torch.testing.assert_close(program.module()(xb, ei_b, eb), ours(xb, ei_b, eb))
    # torch.jit.trace takes PyG's path: the trace holds no node count.
    traced = torch.jit.trace(ours, (xa, ei_a, ea), check_trace=False)
    torch.testing.assert_close(traced(xb, ei_b, eb), ours(xb, ei_b, eb))


def test_no_edge_by_feature_tensor_is_kept_for_backward() -> None:
    ours, theirs = _pair(3)
    n, e, d = 50, 400, 5
    edge_index = _graph(n, e)
    x = torch.randn(n, d, dtype=torch.float64, requires_grad=True)
    edge_attr = torch.randn(e, 3, dtype=torch.float64)

    def saved_shapes(layer) -> list[tuple[int, ...]]:
        shapes: list[tuple[int, ...]] = []

        def pack(t: torch.Tensor) -> torch.Tensor:
            shapes.append(tuple(t.shape))
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            layer(x, edge_index, edge_attr)
        return shapes

    assert (e, d) in saved_shapes(theirs)  # the check can fail: PyG keeps its messages
    assert all(len(s) < 2 or s[:2] != (e, d) for s in saved_shapes(ours))


def test_other_calls_take_pyg_path() -> None:
    ours, theirs = _pair(None)
    edge_index = _graph(8, 20)
    x = torch.randn(8, 5, dtype=torch.float64)
    edge_attr = torch.randn(20, 5, dtype=torch.float64)
    # A message hook runs: the call went through PyG's propagate.
    seen = []
    handle = ours.register_message_forward_hook(lambda *args: seen.append(1))
    torch.testing.assert_close(ours(x, edge_index, edge_attr), theirs(x, edge_index, edge_attr))
    assert seen
    handle.remove()
    # An id out of range: a ValueError naming the row of edge_index.
    bad = edge_index.clone()
    bad[0, 3] = 8
    with pytest.raises(ValueError, match=r"edge_index\[0\]"):
        ours(x, bad, edge_attr)
    bad = edge_index.clone()
    bad[1, 5] = -1
    with pytest.raises(ValueError, match=r"edge_index\[1\]"):
        ours(x, bad, edge_attr)
    # Edge features of the wrong width without edge_dim: PyG's message.
    with pytest.raises(ValueError, match="edge_dim"):
        ours(x, edge_index, edge_attr[:, :3])


@pytest.mark.parametrize("kw", [{"flow": "target_to_source"}, {"aggr": "mean"}])
def test_other_flow_and_aggregation_are_pyg_s(kw) -> None:
    torch.manual_seed(0)
    ours = GINEConv(MLP([5, 3]), edge_dim=2, **kw).double().eval()
    theirs = PyGGINEConv(MLP([5, 3]), edge_dim=2, **kw).double().eval()
    theirs.load_state_dict(ours.state_dict())
    edge_index = torch.tensor([[0, 1, 2, 3], [5, 5, 5, 4]])
    x, edge_attr = torch.randn(6, 5, dtype=torch.float64), torch.randn(4, 2, dtype=torch.float64)
    torch.testing.assert_close(ours(x, edge_index, edge_attr), theirs(x, edge_index, edge_attr))


def test_size_and_edge_index_object_are_pyg_s() -> None:
    from torch_geometric import EdgeIndex

    ours, theirs = _pair(2)
    edge_index = torch.tensor([[0, 1, 2, 3], [1, 1, 2, 0]])
    x, edge_attr = torch.randn(8, 5, dtype=torch.float64), torch.randn(4, 2, dtype=torch.float64)
    a = ours((x, None), EdgeIndex(edge_index, sparse_size=(8, 10)), edge_attr)
    b = theirs((x, None), EdgeIndex(edge_index, sparse_size=(8, 10)), edge_attr)
    assert a.shape == (10, 3)
    torch.testing.assert_close(a, b)
    with pytest.raises(ValueError):
        ours(x, edge_index, edge_attr, size=(9, 8))
    torch.testing.assert_close(
        ours((x, None), edge_index, edge_attr, size=(8, 6)),
        theirs((x, None), edge_index, edge_attr, size=(8, 6)),
    )


def test_compiles_without_graph_break(small_chunks) -> None:
    ours, _ = _pair(4)
    edge_index = _graph(11, 30)
    x = torch.randn(11, 5, dtype=torch.float64)
    edge_attr = torch.randn(30, 4, dtype=torch.float64)
    compiled = torch.compile(ours, fullgraph=True, backend="aot_eager")
    _assert_same(
        _grads(compiled, x, edge_index, edge_attr), _grads(ours, x, edge_index, edge_attr), 1e-12
    )


@pytest.mark.parametrize("weight", [True, False])
@pytest.mark.parametrize("n, e", [(1, 0), (1, 3), (7, 0), (9, 23)])
def test_opcheck(small_chunks, weight, n, e) -> None:
    g = torch.Generator().manual_seed(n + e)
    d, f = 5, (3 if weight else 5)
    x = torch.randn(n, d, dtype=torch.float64, generator=g, requires_grad=True)
    ea = torch.randn(e, f, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(d, f, dtype=torch.float64, generator=g, requires_grad=True) if weight else None
    b = torch.randn(d, dtype=torch.float64, generator=g, requires_grad=True) if weight else None
    src = torch.randint(0, n, (e,), generator=g)
    dst = torch.randint(0, max(n - 1, 1), (e,), generator=g)
    torch.library.opcheck(torch.ops.gnnattn.relu_edge_sum, (x, ea, w, b, src, dst, n))
    out = edge_sum.relu_edge_sum(x, ea, w, b, src, dst, n)
    ref = edge_sum.relu_edge_sum_reference(x, ea, w, b, src, dst, n)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
