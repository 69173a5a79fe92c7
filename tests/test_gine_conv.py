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
    edge_index = _graph(17, 60)
    x = 1e3 * torch.randn(17, 5)
    edge_attr = torch.randn(60, 3)
    _assert_same(
        _grads(ours, x, edge_index, edge_attr), _grads(theirs, x, edge_index, edge_attr), 1e-5
    )


def test_bipartite_size_and_int32(small_chunks) -> None:
    ours, theirs = _pair(2)
    g = torch.Generator().manual_seed(3)
    edge_index = torch.stack(
        [torch.randint(0, 9, (31,), generator=g), torch.randint(0, 4, (31,), generator=g)]
    )
    x = (torch.randn(9, 5, dtype=torch.float64), torch.randn(4, 5, dtype=torch.float64))
    edge_attr = torch.randn(31, 2, dtype=torch.float64)
    _assert_same(
        _grads(ours, x, edge_index.int(), edge_attr),
        _grads(theirs, x, edge_index, edge_attr),
        1e-10,
    )
    # No target features: the sum alone, over size[1] targets.
    a = ours((x[0], None), edge_index, edge_attr, size=(9, 6))
    b = theirs((x[0], None), edge_index, edge_attr, size=(9, 6))
    assert a.shape == (6, 3)
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


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
    assert all(s[0] != e or len(s) < 2 or s[1] != d for s in saved_shapes(ours))


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
    # An index out of range: PyG's own error.
    bad = edge_index.clone()
    bad[0, 3] = 8
    with pytest.raises(IndexError, match="edge_index"):
        ours(x, bad, edge_attr)
    # Edge features of the wrong width without edge_dim: PyG's message.
    with pytest.raises(ValueError, match="edge_dim"):
        ours(x, edge_index, edge_attr[:, :3])


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
