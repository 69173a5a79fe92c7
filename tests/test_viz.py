"""gnnattn.viz: exact conversions, DAG drawings, non-empty images, clear errors."""

import matplotlib
import matplotlib.pyplot as plt
import networkx as nx
import numpy as np
import pytest
import torch

from gnnattn import SelfAttentionConv, causal_graph, complete_graph, sliding_window_graph, viz

# Files, not windows: the tests run headless.
matplotlib.use("Agg")

TOKENS = "The bank of the river".split()


def _weights(edge_index, n=5, heads=2):
    layer = SelfAttentionConv(8, num_heads=heads).eval()
    with torch.no_grad():
        _, (ei, alpha) = layer(torch.randn(n, 8), edge_index, return_attention_weights=True)
    return ei, alpha


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def _nonempty(fig) -> bool:
    fig.canvas.draw()
    img = np.asarray(fig.canvas.buffer_rgba())
    return img.size > 0 and (img[..., :3] < 250).any()


def test_round_trips_exact():
    ei, alpha = _weights(causal_graph(5))
    mat = viz.attention_matrix(ei, alpha, 5)
    assert mat.shape == (2, 5, 5)
    ei2, alpha2 = viz.matrix_to_attention(mat, ei)
    assert torch.equal(ei2, ei) and torch.equal(alpha2, alpha)
    ei3, alpha3 = viz.matrix_to_attention(mat)  # edges found from the non-zeros
    assert torch.equal(ei3, ei) and torch.equal(alpha3, alpha)
    g = viz.attention_graph(ei, alpha, tokens=TOKENS)
    back = torch.tensor([g.edges[j, i]["weights"] for j, i in ei.t().tolist()])
    assert torch.equal(back, alpha)
    assert g.nodes[1]["label"] == "bank"
    assert g.edges[0, 1]["weight"] == pytest.approx(alpha[1].mean().item(), abs=0)


def test_rows_sum_to_one():
    ei, alpha = _weights(complete_graph(5))
    mat = viz.attention_matrix(ei, alpha)
    torch.testing.assert_close(mat.sum(-1), torch.ones(2, 5))
    g = viz.attention_graph(ei, alpha, head=1)
    for i in g.nodes:
        assert sum(d["weight"] for _, _, d in g.in_edges(i, data=True)) == pytest.approx(1.0)


def test_bertviz_format():
    ei, alpha = _weights(complete_graph(5))
    out = viz.to_bertviz([(ei, alpha), (ei, alpha)])
    assert len(out) == 2 and out[0].shape == (1, 2, 5, 5)


def test_causal_drawing_is_a_dag():
    ei, alpha = _weights(causal_graph(5))
    ax = viz.draw_attention(ei, alpha, tokens=TOKENS)
    assert ax.layout_name == "layered"
    g = nx.DiGraph(ax.graph)
    loops = list(nx.selfloop_edges(g))
    assert len(loops) == 5
    g.remove_edges_from(loops)
    assert nx.is_directed_acyclic_graph(g)


@pytest.mark.parametrize("kind", ["complete", "causal", "sparse", "multi-head", "single-node"])
def test_drawings_nonempty(kind):
    if kind == "single-node":
        ei, alpha, toks = complete_graph(1), torch.ones(1, 1), ["only"]
    elif kind == "sparse":
        ei, alpha = _weights(sliding_window_graph(5, window=1))
        toks = TOKENS
    else:
        ei, alpha = _weights(causal_graph(5) if kind == "causal" else complete_graph(5))
        toks = TOKENS
    if kind == "multi-head":
        fig = viz.draw_attention_heads(ei, alpha, tokens=toks, top_k=2)
        assert len(fig.axes) == 2
    else:
        fig = viz.draw_attention(ei, alpha, tokens=toks).figure
    assert _nonempty(fig)
    assert _nonempty(viz.draw_heatmap(ei, alpha, tokens=toks).figure)
    assert _nonempty(viz.draw_side_by_side(ei, alpha, tokens=toks))
    if kind == "complete":
        assert viz.draw_attention(ei, alpha).layout_name == "circular"


def test_filters_are_named_in_the_legend():
    ei, alpha = _weights(complete_graph(5))
    ax = viz.draw_attention(ei, alpha, min_weight=0.15, top_k=2)
    legend = ax.get_legend()
    texts = [legend.get_title().get_text()] + [t.get_text() for t in legend.get_texts()]
    text = " ".join(" ".join(texts).split())  # the note is wrapped over lines
    assert "hidden" in text and "top 2" in text and "weight < 0.15" in text
    full = viz.draw_attention(ei, alpha).get_legend().get_title().get_text()
    assert "25 of 25 edges shown" in full and "hidden" not in full


def test_softmax_steps_lesson_numbers():
    # The lesson's max trick: logits [100, 102, 105].
    q = torch.tensor([[1.0]])
    k = torch.tensor([[100.0], [102.0], [105.0]])
    st = viz.softmax_steps(q, k, 0)
    assert st.max == 105.0
    assert [round(w, 5) for w in st.weights] == [0.00638, 0.04712, 0.9465]
    assert all(0 < e <= 1 for e in st.shifted)
    assert "max" in st.table()


def test_bad_input():
    ei, alpha = _weights(complete_graph(5))
    with pytest.raises(ValueError, match="'alpha'"):
        viz.attention_graph(ei, alpha[:-1])
    with pytest.raises(ValueError, match="'head'"):
        viz.attention_graph(ei, alpha, head=2)
    with pytest.raises(ValueError, match="'tokens'"):
        viz.draw_attention(ei, alpha, tokens=["a", "b"])
    with pytest.raises(TypeError, match="'tokens'"):
        viz.attention_graph(ei, alpha, tokens="The bank of the river")
    with pytest.raises(ValueError, match="'layout'"):
        viz.draw_attention(ei, alpha, layout="grid")
    with pytest.raises(ValueError, match="'top_k'"):
        viz.draw_attention(ei, alpha, top_k=0)
    with pytest.raises(ValueError, match="'edge_index'"):
        viz.attention_matrix(ei[:1], alpha)
