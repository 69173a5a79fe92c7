"""``torch.func`` transforms (``grad``, ``vmap``, ``jvp``, ``jacrev``) over the softmax,
the operator and the layers: they run the torch-op paths and give autograd's numbers.

Inside a transform ``"auto"`` takes ``"mp"`` (the compiled kernels' operators do
not compose with the transforms); the results are compared in float64 with the
layers' own eager calls, which take the fused kernels.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.func import functional_call, grad, jacfwd, jacrev, jvp, stack_module_state, vmap
from torch_geometric.nn import MLP, GINConv

from gnnattn import AttentionGraph, backend_for, scatter_softmax
from gnnattn.nn import GINEConv, GPSConv, GraphTransformer, SelfAttentionConv, TransformerConv

# float64 against float64 on other summation orders (the kernels' against torch's).
TOL = 1e-10


def _index(e: int, seed: int) -> torch.Tensor:
    """A sorted segment index of ``e`` entries, with empty segments between."""
    g = torch.Generator().manual_seed(seed)
    return torch.sort(torch.randint(0, max(e // 3, 1) + 2, (e,), generator=g)).values


# 7 entries take the small-input path; 40,000 x 2 is past the compiled kernels'
# threshold, which a transform must not take.
@pytest.mark.parametrize("e", [7, 40_000])
def test_scatter_softmax_composes_with_transforms(e: int) -> None:
    idx = _index(e, e)
    g = torch.Generator().manual_seed(1)
    src = torch.randn(e, 2, dtype=torch.float64, generator=g)
    w = torch.randn(e, 2, dtype=torch.float64, generator=g)

    def loss(s: torch.Tensor) -> torch.Tensor:
        return (scatter_softmax(s, idx) * w).sum()

    leaf = src.clone().requires_grad_()
    loss(leaf).backward()
    assert leaf.grad is not None
    torch.testing.assert_close(grad(loss)(src), leaf.grad, rtol=0, atol=TOL)

    batch = torch.randn(3, e, 2, dtype=torch.float64, generator=g)
    looped = torch.stack([scatter_softmax(b, idx) for b in batch])
    torch.testing.assert_close(vmap(lambda s: scatter_softmax(s, idx))(batch), looped)
    per_sample = torch.stack([grad(loss)(b) for b in batch])
    torch.testing.assert_close(vmap(grad(loss))(batch), per_sample, rtol=0, atol=TOL)

    # Forward mode (the Function's jvp) against reverse mode's Jacobian-vector product.
    t = torch.randn(e, 2, dtype=torch.float64, generator=g)
    _, tangent = jvp(lambda s: scatter_softmax(s, idx), (src,), (t,))
    _, ref = torch.autograd.functional.jvp(lambda s: scatter_softmax(s, idx), src, t)
    torch.testing.assert_close(tangent, ref, rtol=0, atol=TOL)
    if e < 100:
        soft = lambda s: scatter_softmax(s, idx)  # noqa: E731
        torch.testing.assert_close(jacfwd(soft)(src), jacrev(soft)(src), rtol=0, atol=TOL)


def test_scatter_softmax_half_under_grad() -> None:
    """A float16 softmax's gradient under ``grad`` is autograd's: both read the weights
    the forward kept in float32."""
    idx = _index(9, 0)
    src = torch.randn(9, 2, generator=torch.Generator().manual_seed(2)).half()

    def loss(s: torch.Tensor) -> torch.Tensor:
        return scatter_softmax(s, idx).float().square().sum()

    leaf = src.clone().requires_grad_()
    loss(leaf).backward()
    got = grad(loss)(src)
    assert got.dtype == torch.float16
    torch.testing.assert_close(got, leaf.grad, rtol=0, atol=0)


def test_scatter_softmax_refuses_a_batched_index() -> None:
    idx = _index(7, 3)
    src = torch.randn(7, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match="'index' shared by the calls of torch.func.vmap"):
        vmap(lambda i: scatter_softmax(src, i))(torch.stack([idx, idx]))


def test_compiled_grad_of_the_softmax() -> None:
    """``torch.compile`` of a ``grad`` (Dynamo traces the transform) over the segment
    softmax of the ``"mp"`` path (``scatter_softmax`` reads its index's range on the
    host): no graph break, the eager transform's numbers."""
    from gnnattn.softmax import segment_softmax

    idx = _index(7, 4)
    src = torch.randn(7, 2, dtype=torch.float64)

    def g(s: torch.Tensor) -> torch.Tensor:
        return grad(lambda t: segment_softmax(t, idx, int(idx[-1]) + 1).square().sum())(s)

    compiled = torch.compile(g, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(src), g(src), rtol=0, atol=TOL)


def _graph(n: int = 12, seed: int = 0) -> tuple[torch.Tensor, AttentionGraph]:
    ei = torch.randint(0, n, (2, 4 * n), generator=torch.Generator().manual_seed(seed))
    return ei, AttentionGraph(ei, n)


def test_backend_for_inside_a_transform() -> None:
    _, graph = _graph()
    q = torch.randn(12, 2, 4, dtype=torch.float64)
    seen: dict[str, Any] = {}

    def probe(x: torch.Tensor) -> torch.Tensor:
        seen["auto"] = backend_for(x, graph)
        for name in ("fused", "sdpa", "tiles"):
            with pytest.raises(ValueError, match=f"backend='{name}' does not run inside a torch"):
                backend_for(x, graph, backend=name)
        seen["mp"] = backend_for(x, graph, backend="mp")
        return x.sum()

    grad(probe)(q)
    assert seen["auto"].backend == "mp" and "torch.func" in seen["auto"].reason
    assert seen["mp"] == ("mp", "asked for")
    # Outside the transform, the same call takes the fused kernel again.
    assert backend_for(q, graph).backend == "fused"


Args = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], tuple]


def _layers() -> dict[str, tuple[Callable[[], torch.nn.Module], Args]]:
    """Each layer's factory, and its call's arguments from ``(x, edge_index, edge_attr
    [|E|, 3], batch)``."""
    with_edges: Args = lambda x, ei, ea, b: (x, ei, ea)  # noqa: E731
    plain: Args = lambda x, ei, ea, b: (x, ei)  # noqa: E731
    gin = lambda: GINConv(MLP([8, 8]))  # noqa: E731
    return {
        "SelfAttentionConv": (lambda: SelfAttentionConv(8, 2), plain),
        "SelfAttentionConv edges": (lambda: SelfAttentionConv(8, 2, edge_dim=3), with_edges),
        "TransformerConv": (lambda: TransformerConv(8, 4, heads=2, edge_dim=3), with_edges),
        "GraphTransformer": (lambda: GraphTransformer(2, 8, 2, edge_dim=3), with_edges),
        "GPSConv": (lambda: GPSConv(8, gin(), heads=2), plain),
        # The batch's graphs are read on the host (numba), the exphormer graph too.
        "GPSConv batch": (lambda: GPSConv(8, gin(), heads=2), lambda x, ei, ea, b: (x, ei, b)),
        "GPSConv exphormer": (lambda: GPSConv(8, gin(), heads=2, attn_type="exphormer"), plain),
        "GINEConv": (lambda: GINEConv(MLP([8, 8]), edge_dim=3), with_edges),
    }


@pytest.mark.parametrize("name", list(_layers()))
def test_layer_gradients_under_grad_and_vmap(name: str) -> None:
    """``grad`` over the parameters and ``vmap(grad)`` per sample equal autograd's
    gradients of the layer's eager calls (which take the fused kernels)."""
    make, args = _layers()[name]
    torch.manual_seed(0)
    layer = make().double().eval()
    ei, _ = _graph()
    g = torch.Generator().manual_seed(3)
    xs = torch.randn(3, 12, 8, dtype=torch.float64, generator=g)
    ea = torch.randn(ei.shape[1], 3, dtype=torch.float64, generator=g)
    batch = torch.tensor([0] * 5 + [1] * 7)
    params = {k: p.detach() for k, p in layer.named_parameters()}

    def loss(p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return functional_call(layer, p, args(x, ei, ea, batch)).square().sum()

    expected = []
    for x in xs:
        layer.zero_grad()
        loss(dict(layer.named_parameters()), x).backward()
        expected.append({k: p.grad.clone() for k, p in layer.named_parameters()})
    got = grad(loss)(params, xs[0])
    for k in params:
        torch.testing.assert_close(got[k], expected[0][k], rtol=0, atol=TOL, msg=k)
    per_sample = vmap(grad(loss), in_dims=(None, 0))(params, xs)
    for k in params:
        want = torch.stack([e[k] for e in expected])
        torch.testing.assert_close(per_sample[k], want, rtol=0, atol=TOL, msg=k)


@pytest.mark.parametrize("name", list(_layers()))
def test_ensembles_of_weights_under_vmap(name: str) -> None:
    """``vmap`` over stacked weights (an ensemble, torch.func's ``stack_module_state``)
    equals each model's own eager call: the messages are batched where ``x`` is not."""
    make, args = _layers()[name]
    torch.manual_seed(1)
    models = [make().double().eval() for _ in range(2)]
    ei, _ = _graph(seed=6)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(12, 8, dtype=torch.float64, generator=g)
    ea = torch.randn(ei.shape[1], 3, dtype=torch.float64, generator=g)
    call = args(x, ei, ea, torch.tensor([0] * 6 + [1] * 6))
    params, buffers = stack_module_state(models)  # type: ignore[arg-type]
    base = copy.deepcopy(models[0]).to("meta")
    got = vmap(lambda p, b: functional_call(base, (p, b), call))(params, buffers)
    want = torch.stack([m(*call) for m in models])
    torch.testing.assert_close(got, want, rtol=0, atol=TOL)


def test_attention_dropout_under_grad_draws_the_eager_mask() -> None:
    """In training mode the transform's ``"mp"`` drops the edges an eager ``"mp"`` call
    drops with the same seed (the counter-based stream): the same gradients."""
    torch.manual_seed(0)
    layer = SelfAttentionConv(8, 2, dropout=0.4, backend="auto").double().train()
    ei, graph = _graph()
    x = torch.randn(12, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    params = {k: p.detach() for k, p in layer.named_parameters()}

    def loss(p: dict[str, torch.Tensor]) -> torch.Tensor:
        return functional_call(layer, p, (x, graph)).square().sum()

    torch.manual_seed(7)
    got = grad(loss)(params)
    layer.backend = "mp"
    torch.manual_seed(7)
    loss(dict(layer.named_parameters())).backward()
    for k, p in layer.named_parameters():
        assert p.grad is not None
        torch.testing.assert_close(got[k], p.grad, rtol=0, atol=TOL, msg=k)
    assert any(bool(got[k].ne(0).any()) for k in got)


def test_feed_forward_dropout_under_grad() -> None:
    """A training ``GraphTransformer`` (attention and feed-forward dropout) runs under
    ``grad``: the feed-forward takes torch's dropout there (the compiled stream is an
    operator the transform cannot differentiate), so its mask is torch's, not the
    eager call's; the gradients are finite and reach every weight matrix."""
    torch.manual_seed(0)
    model = GraphTransformer(2, 8, 2, dropout=0.2).double().train()
    ei, _ = _graph()
    x = torch.randn(12, 8, dtype=torch.float64)
    params = {k: p.detach() for k, p in model.named_parameters()}
    got = grad(lambda p: functional_call(model, p, (x, ei)).square().sum())(params)
    assert all(bool(t.isfinite().all()) for t in got.values())
    weights = [k for k in got if k.endswith("weight") and got[k].dim() == 2]
    assert weights and all(bool(got[k].ne(0).any()) for k in weights)


def test_graph_first_used_inside_a_transform_keeps_plain_tensors() -> None:
    """A graph whose edges and CSR are first made inside ``grad`` (a causal graph makes
    them on first use) keeps ordinary tensors, not the transform's wrapped ones (dead
    after it, and unreadable by the kernels): an eager fused call on it afterwards
    gives the transform's gradient."""
    from torch._C._functorch import is_functorch_wrapped_tensor

    graph = AttentionGraph.causal(12)
    layer = SelfAttentionConv(8, 2).double()
    x = torch.randn(12, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    inside = grad(lambda xx: layer(xx, graph).square().sum())(x)
    made = (graph.edge_index, *graph.csr)
    assert not any(is_functorch_wrapped_tensor(t) for t in made if t is not None)
    leaf = x.clone().requires_grad_()
    layer(leaf, graph, backend="fused").square().sum().backward()
    torch.testing.assert_close(leaf.grad, inside, rtol=0, atol=TOL)


def test_vmap_over_graphs_is_refused() -> None:
    layer = SelfAttentionConv(8, 2).double()
    x = torch.randn(12, 8, dtype=torch.float64)
    ei = torch.stack([_graph(seed=s)[0] for s in range(2)])  # (2, 2, E)
    with pytest.raises(ValueError, match="'edge_index' shared by the calls of torch.func.vmap"):
        vmap(lambda e: layer(x, e))(ei)
