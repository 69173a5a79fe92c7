"""Every attention layer of ``gnnattn.nn`` has ``backend_for``, and it names the backend the
same call actually runs (read from the operator's dispatch, not from the layer)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import gnnattn.nn
from gnnattn import AttentionGraph, complete_graph, sliding_window_graph
from gnnattn.nn import (
    GPSConv,
    GraphTransformer,
    GraphTransformerLayer,
    SelfAttentionConv,
    SimplifiedAttention,
    TransformerConv,
)
from gnnattn.ops import BackendChoice, operator

# The names of gnnattn.nn that run no attention (so have no backend_for).
NOT_ATTENTION = {
    "Dropout",
    "GINEConv",
    "GraphPositionalEncoding",
    "LearnedPositionalEncoding",
    "SinusoidalPositionalEncoding",
    "sequence_positions",
}
ATTENTION = {
    "GPSConv",
    "GraphTransformer",
    "GraphTransformerLayer",
    "SelfAttentionConv",
    "SimplifiedAttention",
    "TransformerConv",
}

N, D, H = 12, 8, 2


def test_every_attention_layer_has_backend_for() -> None:
    # A new layer in __all__ fails here until it is sorted into one of the two sets
    # (and, if it attends, given a backend_for and cases below).
    assert set(gnnattn.nn.__all__) == NOT_ATTENTION | ATTENTION
    for name in sorted(ATTENTION):
        assert callable(getattr(getattr(gnnattn.nn, name), "backend_for", None)), name
    assert {case[0].split(":")[0] for case in CASES} == ATTENTION


@pytest.fixture
def ran(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The backends :func:`gnnattn.attention` dispatches to, in call order."""
    calls: list[str] = []

    def spy(name: str, fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def run(args: Any) -> Any:
            calls.append(name)
            return fn(args)

        return run

    spied = {name: spy(name, fn) for name, fn in operator._BACKENDS.items()}
    monkeypatch.setattr(operator, "_BACKENDS", spied)
    return calls


def _sparse() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, N, (2, 3 * N), generator=g).unique(dim=1)


def _x(n: int = N) -> torch.Tensor:
    return torch.randn(n, D, generator=torch.Generator().manual_seed(1))


BATCH = torch.tensor([0] * 5 + [1] * 7)

# (id "Layer: what", make) where make() gives (layer, args, kwargs) of the forward call;
# backend_for gets the same arguments (GPSConv's takes x, batch and attn_graph only).
Make = Callable[[], tuple[torch.nn.Module, tuple, dict]]
CASES: list[tuple[str, Make]] = [
    ("SimplifiedAttention: complete", lambda: (SimplifiedAttention(), (_x(),), {})),
    ("SimplifiedAttention: causal", lambda: (SimplifiedAttention(causal=True), (_x(),), {})),
    ("SimplifiedAttention: sparse", lambda: (SimplifiedAttention(), (_x(), _sparse()), {})),
    (
        "SimplifiedAttention: batch, mp asked",
        lambda: (SimplifiedAttention(), (_x(),), {"batch": BATCH, "backend": "mp"}),
    ),
    (
        "SimplifiedAttention: dense window",
        lambda: (SimplifiedAttention(), (_x(), sliding_window_graph(N, window=3)), {}),
    ),
    (
        "SimplifiedAttention: thin window",
        lambda: (SimplifiedAttention(), (_x(), sliding_window_graph(N, window=1)), {}),
    ),
    (
        "SimplifiedAttention: long window, tiles",
        lambda: (SimplifiedAttention(), (_x(600), sliding_window_graph(600, window=32)), {}),
    ),
    ("SelfAttentionConv: complete", lambda: (SelfAttentionConv(D, H), (_x(),), {})),
    ("SelfAttentionConv: sparse", lambda: (SelfAttentionConv(D, H), (_x(), _sparse()), {})),
    (
        "SelfAttentionConv: edge features",
        lambda: (
            SelfAttentionConv(D, H, edge_dim=3, edge_value=True),
            (_x(), complete_graph(N), torch.randn(N * N, 3)),
            {},
        ),
    ),
    (
        "SelfAttentionConv: cross-attention",
        lambda: (SelfAttentionConv(D, H), ((_x(7), _x(4)),), {}),
    ),
    (
        "SelfAttentionConv: dropout, training",
        lambda: (SelfAttentionConv(D, H, dropout=0.5).train(), (_x(),), {"batch": BATCH}),
    ),
    (
        "SelfAttentionConv: layer's backend mp",
        lambda: (SelfAttentionConv(D, H, backend="mp"), (_x(),), {}),
    ),
    ("TransformerConv: sparse", lambda: (TransformerConv(D, 4, heads=H), (_x(), _sparse()), {})),
    (
        "TransformerConv: complete edge_index",
        lambda: (TransformerConv(D, 4, heads=H), (_x(), complete_graph(N)), {}),
    ),
    (
        "TransformerConv: edge features",
        lambda: (
            TransformerConv(D, 4, heads=H, edge_dim=3),
            (_x(), complete_graph(N), torch.randn(N * N, 3)),
            {},
        ),
    ),
    (
        "TransformerConv: bipartite",
        lambda: (TransformerConv((D, D), 4, heads=H), ((_x(7), _x(4)), _sparse() % 4), {}),
    ),
    (
        "TransformerConv: dropout, training, sdpa asked",
        lambda: (
            TransformerConv(D, 4, heads=H, dropout=0.3).train(),
            (_x(), AttentionGraph.causal(N)),
            {"backend": "sdpa"},
        ),
    ),
    (
        "TransformerConv: layer's backend mp",
        lambda: (TransformerConv(D, 4, heads=H, backend="mp"), (_x(), _sparse()), {}),
    ),
    (
        "GraphTransformerLayer: batch",
        lambda: (GraphTransformerLayer(D, H), (_x(),), {"batch": BATCH}),
    ),
    (
        "GraphTransformerLayer: sparse, edge features",
        lambda: (
            GraphTransformerLayer(D, H, edge_dim=3),
            (_x(), _sparse(), torch.randn(_sparse().shape[1], 3)),
            {},
        ),
    ),
    (
        "GraphTransformer: causal",
        lambda: (GraphTransformer(2, D, H, causal=True), (_x(),), {}),
    ),
    ("GraphTransformer: sparse", lambda: (GraphTransformer(3, D, H), (_x(), _sparse()), {})),
    ("GraphTransformer: blocks differ", lambda: (_mixed_stack(), (_x(),), {"batch": BATCH})),
    ("GPSConv: batch", lambda: (GPSConv(D, None, heads=H), (_x(), _sparse(), BATCH), {})),
    (
        "GPSConv: fused asked",
        lambda: (GPSConv(D, None, heads=H), (_x(), _sparse(), BATCH), {"backend": "fused"}),
    ),
    (
        "GPSConv: a sparse attn_graph",
        lambda: (
            GPSConv(D, None, heads=H),
            (_x(), _sparse()),
            {"attn_graph": AttentionGraph(_sparse(), N)},
        ),
    ),
]


def _mixed_stack() -> GraphTransformer:
    model = GraphTransformer(2, D, H)
    model.layers[1].self_attn.backend = "mp"
    return model


def _ask(layer: torch.nn.Module, args: tuple, kwargs: dict) -> BackendChoice | list:
    if isinstance(layer, GPSConv):
        batch = args[2] if len(args) > 2 else None
        return layer.backend_for(args[0], batch, **kwargs)
    return layer.backend_for(*args, **kwargs)


@pytest.mark.parametrize("case", [c[1] for c in CASES], ids=[c[0] for c in CASES])
def test_backend_for_names_the_backend_the_call_runs(case: Make, ran: list[str]) -> None:
    layer, args, kwargs = case()
    told = _ask(layer, args, kwargs)
    choices = told if isinstance(told, list) else [told]
    assert all(isinstance(c, BackendChoice) and c.reason for c in choices), told
    assert not ran  # asking runs nothing
    with torch.no_grad():
        layer(*args, **kwargs)
    assert [c.backend for c in choices] == ran


def test_the_cases_cover_every_backend_and_both_answers_of_auto(ran: list[str]) -> None:
    # The agreement above means something only if the cases reach each backend,
    # and "auto" reaches each by itself.
    seen: dict[str, set[str]] = {}
    for _, make in CASES:
        layer, args, kwargs = make()
        told = _ask(layer, args, kwargs)
        for c in told if isinstance(told, list) else [told]:
            seen.setdefault(c.backend, set()).add(c.reason)
    assert set(seen) == {"mp", "sdpa", "fused", "tiles"}
    assert any("asked for" not in r for r in seen["sdpa"])
    assert any("asked for" not in r for r in seen["fused"])
    assert any("asked for" not in r for r in seen["tiles"])


def test_backend_for_checks_the_inputs_as_the_call_does() -> None:
    with pytest.raises(ValueError, match="'backend'"):
        TransformerConv(D, 4).backend_for(_x(), _sparse(), backend="dense")
    with pytest.raises(ValueError, match="edge_attr"):
        TransformerConv(D, 4, edge_dim=3).backend_for(_x(), _sparse())
    with pytest.raises(ValueError, match="backend='sdpa'"):
        TransformerConv(D, 4).backend_for(_x(), _sparse(), backend="sdpa")
    with pytest.raises(ValueError, match="'x'"):
        SimplifiedAttention().backend_for(torch.randn(3))
    with pytest.raises(TypeError, match="'attn_graph'"):
        GPSConv(D, None).backend_for(_x(), attn_graph=_sparse())  # type: ignore[arg-type]


def test_the_reason_names_what_ruled_out_sdpa_on_a_structured_graph() -> None:
    """A causal graph whose call SDPA cannot take (edge features) goes to the fused
    kernel: the reason says so rather than calling the graph sparse."""
    from gnnattn.ops import backend_for

    q = torch.randn(8, 2, 4)
    choice = backend_for(q, AttentionGraph.causal(8), edge_attr=True)
    assert choice.backend == "fused"
    assert choice.reason.startswith("causal graph, but SDPA does not take edge features")
    assert backend_for(q, AttentionGraph.causal(8)).reason.startswith("causal graph: ")
    sparse = AttentionGraph(torch.tensor([[0, 1, 2], [1, 2, 0]]), 3)
    assert backend_for(q[:3], sparse, edge_attr=True).reason.startswith("sparse graph: ")


def test_backend_for_takes_a_graph_object_as_attention_does():
    # A plain edge_index gave an AttributeError ('is_bipartite') here.
    q, ei = torch.randn(3, 1, 2), torch.tensor([[0, 1], [1, 2]])
    want = "'graph' to be an AttentionGraph, got Tensor"
    with pytest.raises(TypeError, match=want):
        gnnattn.backend_for(q, ei)
    with pytest.raises(TypeError, match=want):
        gnnattn.attention(q, q, q, ei)
