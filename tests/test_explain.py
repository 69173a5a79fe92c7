"""PyG's hooks and explainers on gnnattn's attention layers: they act on per-edge messages,
so a layer with any of them runs PyG's propagate, with the outputs of the fused path."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.explain import Explainer, GNNExplainer

from gnnattn import AttentionGraph, SelfAttentionConv, SimplifiedAttention, complete_graph
from gnnattn.distributed import partition
from gnnattn.nn import TransformerConv

TOL = 1e-10
# Edges 0 and 1 are the only ones into node 1.
EI = torch.tensor([[0, 3, 1, 2, 5, 4, 0], [1, 1, 0, 5, 2, 2, 2]])
LAYERS = {
    "TransformerConv": lambda: TransformerConv(8, 3, heads=2, edge_dim=2, beta=True),
    "SelfAttentionConv": lambda: SelfAttentionConv(8, 2, edge_dim=2, edge_value=True),
}
HOOKS = [
    "register_propagate_forward_pre_hook",
    "register_propagate_forward_hook",
    "register_message_forward_pre_hook",
    "register_message_forward_hook",
    "register_aggregate_forward_pre_hook",
    "register_aggregate_forward_hook",
]


def _layer(name: str, dtype: torch.dtype = torch.float64) -> torch.nn.Module:
    torch.manual_seed(0)
    return LAYERS[name]().to(dtype)


def _inputs(bipartite: bool, dtype: torch.dtype = torch.float64) -> tuple:
    gen = torch.Generator().manual_seed(1)
    x_src = torch.randn(6, 8, generator=gen, dtype=dtype)
    ea = torch.randn(EI.shape[1], 2, generator=gen, dtype=dtype)
    if not bipartite:
        return x_src, EI, ea
    x_dst = torch.randn(3, 8, generator=gen, dtype=dtype)
    return (x_src, x_dst), EI[:, EI[1] < 3], ea[EI[1] < 3]


def _call(layer: torch.nn.Module, x, ei: torch.Tensor, ea: torch.Tensor) -> tuple:
    """``(out, alpha)``; ``SelfAttentionConv`` with an ``attn_bias`` too."""
    kwargs: dict = {"return_attention_weights": True}
    if isinstance(layer, SelfAttentionConv):
        kwargs["attn_bias"] = torch.linspace(-1, 1, ei.shape[1] * 2, dtype=ea.dtype).view(-1, 2)
    out, (_, alpha) = layer(x, ei, ea, **kwargs)
    return out, alpha


class _Model(torch.nn.Module):
    """One layer and three node scores: what the explainer explains."""

    def __init__(self, conv: torch.nn.Module) -> None:
        super().__init__()
        self.conv = conv

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, edge_attr: torch.Tensor):
        return self.conv(x, edge_index, edge_attr)[:, :3]


def _explainer(model: torch.nn.Module) -> Explainer:
    return Explainer(
        model,
        GNNExplainer(epochs=3),
        explanation_type="model",
        node_mask_type="attributes",
        edge_mask_type="object",
        model_config=dict(mode="multiclass_classification", task_level="node", return_type="raw"),
    )


@pytest.mark.parametrize("bipartite", [False, True], ids=["square", "bipartite"])
@pytest.mark.parametrize("hook", HOOKS)
@pytest.mark.parametrize("name", list(LAYERS))
def test_a_hook_fires_and_the_outputs_stay_the_fused_paths(name, hook, bipartite):
    layer = _layer(name)
    x, ei, ea = _inputs(bipartite)
    want, want_alpha = _call(layer, x, ei, ea)
    seen = []
    handle = getattr(layer, hook)(lambda *args: seen.append(len(args)))
    assert layer.backend_for(x, ei, ea).backend == "propagate"
    out, alpha = _call(layer, x, ei, ea)
    assert seen, f"{hook} did not fire"
    assert (out - want).abs().max() < TOL
    assert (alpha - want_alpha).abs().max() < TOL
    # Nothing of the call stays parked on the layer.
    assert getattr(layer, "_alpha", None) is None
    handle.remove()
    assert layer.backend_for(x, ei, ea).backend != "propagate"


@pytest.mark.parametrize("name", list(LAYERS))
def test_a_message_hook_sees_and_changes_the_messages(name):
    layer = _layer(name)
    x, ei, ea = _inputs(False)
    shapes = []

    def zero(module, inputs, messages):
        shapes.append(tuple(messages.shape))
        return torch.zeros_like(messages)

    layer.register_message_forward_hook(zero)
    out, _ = _call(layer, x, ei, ea)
    head_dim = 3 if isinstance(layer, TransformerConv) else 4
    assert shapes == [(ei.shape[1], 2, head_dim)]  # one message per edge and head
    # Without messages what is left is the gated skip, or the output bias.
    if isinstance(layer, TransformerConv):
        x_r = layer.lin_skip(x)
        gate = layer.lin_beta(torch.cat([torch.zeros_like(x_r), x_r, -x_r], dim=-1)).sigmoid()
        assert (out - gate * x_r).abs().max() < TOL
    else:
        assert (out - layer.lin_out.bias).abs().max() < TOL


@pytest.mark.parametrize("name", list(LAYERS))
def test_gnn_explainer_gives_an_edge_mask(name):
    model = _Model(_layer(name, torch.float32))
    x, ei, ea = _inputs(False, torch.float32)
    want = model(x, ei, ea)
    explanation = _explainer(model)(x, ei, edge_attr=ea, index=1)
    mask = explanation.edge_mask
    assert mask.shape == (ei.shape[1],)
    # One layer: only the edges into node 1 matter to its scores.
    assert (mask[:2] > 0).all() and (mask[2:] == 0).all()
    # The explainer leaves the layer as it was: the fused path, the same outputs.
    assert not model.conv.explain
    assert torch.allclose(model(x, ei, ea), want)


def test_explaining_a_causal_layer_masks_the_edges_it_keeps():
    torch.manual_seed(0)
    conv = SelfAttentionConv(8, 2, edge_dim=2, causal=True)
    ei = complete_graph(5)  # the layer keeps 15 of its 25 edges
    gen = torch.Generator().manual_seed(2)
    x, ea = torch.randn(5, 8, generator=gen), torch.randn(ei.shape[1], 2, generator=gen)
    mask = _explainer(_Model(conv))(x, ei, edge_attr=ea, index=3).edge_mask
    assert mask.shape == (25,)
    into_3 = (ei[1] == 3) & (ei[0] <= 3)  # the kept edges into node 3
    assert (mask[into_3] > 0).all() and (mask[~into_3] == 0).all()


def test_hooks_on_a_layer_over_a_graph_part_are_refused():
    ei = torch.randint(0, 12, (2, 40), generator=torch.Generator().manual_seed(0))
    part = partition(AttentionGraph(ei, 12), 1).part(0)
    for layer in (TransformerConv(8, 4), SelfAttentionConv(8, 2)):
        layer.register_message_forward_hook(lambda *args: None)
        with pytest.raises(ValueError, match=r"Expected a whole graph as 'edge_index'.*GraphPart"):
            layer(torch.randn(12, 8), part)


def test_a_target_whose_scores_are_all_minus_inf_gets_zeros_on_the_hook_path():
    # A Graphormer-style bias of -inf (unreachable) on every edge into node 1: zero
    # weights and a zero message, finite gradients, on PyG's path as on the
    # operator's (PyG's own softmax gives NaN there).
    layer = _layer("SelfAttentionConv")
    x, ei, ea = _inputs(False)
    bias = torch.zeros(ei.shape[1], 2, dtype=torch.float64)
    bias[ei[1] == 1] = -torch.inf
    results = []
    for hooked in (False, True):
        handle = layer.register_message_forward_hook(lambda *args: None) if hooked else None
        xx = x.clone().requires_grad_()
        out, (_, alpha) = layer(xx, ei, ea, attn_bias=bias, return_attention_weights=True)
        assert layer.backend_for(x, ei, ea, attn_bias=bias).backend == (
            "propagate" if hooked else "fused"
        )
        out.sum().backward()
        results.append((out.detach(), alpha.detach(), xx.grad))
        if handle is not None:
            handle.remove()
    (out, alpha, grad), (hook_out, hook_alpha, hook_grad) = results
    assert torch.equal(hook_alpha[ei[1] == 1], torch.zeros(2, 2, dtype=torch.float64))
    assert hook_grad.isfinite().all()
    assert (hook_out - out).abs().max() < TOL
    assert (hook_alpha - alpha).abs().max() < TOL
    assert (hook_grad - grad).abs().max() < TOL


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("given", ["implicit", "edge_index"])
def test_simplified_attention_runs_hooks_on_pygs_path(causal, given):
    layer = SimplifiedAttention(0.5, causal=causal)
    x = torch.randn(6, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    ei = EI if given == "edge_index" else None
    want, (want_ei, want_alpha) = layer(x, ei, return_attention_weights=True)
    seen = []
    handle = layer.register_message_forward_hook(lambda m, inputs, out: seen.append(out.shape))
    assert layer.backend_for(x, ei).backend == "propagate"
    out, (got_ei, alpha) = layer(x, ei, return_attention_weights=True)
    assert seen == [(want_ei.shape[1], 3)]  # one [E, d] message per kept edge
    assert torch.equal(got_ei, want_ei)
    assert (out - want).abs().max() < TOL and (alpha - want_alpha).abs().max() < TOL
    assert getattr(layer, "_alpha", None) is None
    handle.remove()
    assert layer.backend_for(x, ei).backend != "propagate"


def test_explaining_a_causal_simplified_attention_masks_the_edges_it_keeps():
    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(8, 4)
            self.attn = SimplifiedAttention(causal=True)

        def forward(self, x, edge_index):
            return self.attn(self.lin(x), edge_index)[:, :3]

    torch.manual_seed(0)
    x, ei, _ = _inputs(False, torch.float32)
    explanation = _explainer(Model())(x, ei, index=2)
    # One mask row per edge given; the edges the causal graph dropped (j > i) get none.
    mask = explanation.edge_mask
    assert mask.shape == (ei.shape[1],)
    assert (mask[ei[0] > ei[1]] == 0).all() and (mask[ei[0] <= ei[1]] >= 0).all()
