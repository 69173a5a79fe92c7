"""gnnattn.viz: exact conversions, DAG drawings, non-empty images, clear errors."""

import io
import time
import warnings

import matplotlib
import matplotlib.pyplot as plt
import networkx as nx
import numpy as np
import pytest
import torch

from gnnattn import (
    SelfAttentionConv,
    causal_graph,
    complete_graph,
    scatter_softmax,
    sliding_window_graph,
    viz,
)
from gnnattn.viz import marks
from gnnattn.viz.draw import MAX_TICK_CHARS

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
    with pytest.raises(TypeError, match="wrap a single pair in a list"):
        viz.to_bertviz((ei, alpha))


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
    with pytest.raises(ValueError, match="'edge_index' to hold node ids >= 0"):
        viz.top_k_per_target(torch.tensor([[0, 1], [-1, 0]]), torch.ones(2), 1)
    for bad in (float("nan"), float("inf"), -0.5):
        with pytest.raises(ValueError, match="finite weights >= 0 in 'alpha'"):
            viz.draw_attention(ei, torch.cat([alpha[:1] * 0 + bad, alpha[1:]]))


def test_tokens_are_plain_text():
    # "$\foo$" once crashed savefig and "$x$" was drawn as math (issue 17).
    ei, alpha = complete_graph(3), torch.full((9,), 1 / 3)
    toks = ["$\\foo$", "$x$", "a_b^c"]
    for draw in (viz.draw_attention, viz.draw_heatmap):
        ax = draw(ei, alpha, tokens=toks, title="costs $\\foo$")
        ax.figure.savefig(io.BytesIO(), format="png")
        texts = [t for t in ax.texts if t.get_text() in toks]
        texts += [t for t in ax.get_xticklabels() if t.get_text() in toks]
        assert {t.get_text() for t in texts} >= {"$x$"}
        assert texts and not any(t.get_parse_math() or t.get_usetex() for t in texts)
        assert ax.title.get_text() == "costs $\\foo$" and not ax.title.get_parse_math()


def test_lone_surrogates_are_replaced():
    ei, alpha = complete_graph(2), torch.full((4,), 0.5)
    ax = viz.draw_attention(ei, alpha, tokens=["a\ud800", "b"], title="t\udc00")
    ax.figure.savefig(io.BytesIO(), format="png")
    assert "a\ufffd" in [t.get_text() for t in ax.texts] and ax.title.get_text() == "t\ufffd"


def test_labels_fit_inside_their_circles():
    ei, alpha = _weights(complete_graph(5))
    toks = ["river", "steep", "W" * 20, "of", "extraordinarily"]
    ax = viz.draw_attention(ei, alpha, tokens=toks)
    fig = ax.figure
    fig.canvas.draw()
    circles = [p for p in ax.patches if type(p).__name__ == "Circle" and p.get_fill()]
    texts = [t for t in ax.texts if t.get_position() in {c.center for c in circles}]
    assert len(circles) == len(texts) == 5
    r = circles[0].radius
    diameter = ax.transData.transform((2 * r, 0))[0] - ax.transData.transform((0, 0))[0]
    widths = [t.get_window_extent(fig.canvas.get_renderer()).width for t in texts]
    assert max(widths) <= diameter
    assert [t.get_text() for t in texts][:2] == ["river", "steep"]  # shrunk, not cut


def test_long_labels_are_cut_fast_between_characters():
    # One code point pair at a time, measuring the whole text at each step: a
    # 1000-character token took 11 s, and a ZWJ sequence was cut inside.
    t = time.perf_counter()
    ax = viz.draw_attention(complete_graph(2), torch.full((4,), 0.5), tokens=["w" * 1000, "b"])
    assert time.perf_counter() - t < 3.0
    assert any(x.get_text().startswith("www") and x.get_text().endswith("…") for x in ax.texts)
    family = "\U0001f469\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466"
    for unit in (family, "\U0001f1eb\U0001f1f7", "e\u0301", "W", "\u0915\u094d\u0937"):
        label = unit * 300
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # emoji glyphs missing from the font
            text, size = marks.fitted(label, 60.0)
        assert size == marks.MIN_FONT
        kept = text[:-1] if text.endswith("…") else text
        assert kept and len(kept) % len(unit) == 0 and label.startswith(kept), (unit, text)


def test_heatmap_tick_labels_are_cut():
    # Never shortened, a 20,000-character token made an image 210,070 px wide.
    ax = viz.draw_heatmap(complete_graph(2), torch.full((4,), 0.5), tokens=["w" * 20_000, "b"])
    ticks = [t.get_text() for t in ax.get_xticklabels()] + [
        t.get_text() for t in ax.get_yticklabels()
    ]
    assert max(len(t) for t in ticks) == MAX_TICK_CHARS + 1 and "b" in ticks
    buf = io.BytesIO()
    ax.figure.savefig(buf, format="png", dpi=60, bbox_inches="tight")
    buf.seek(0)
    assert plt.imread(buf).shape[1] < 2000


@pytest.mark.parametrize(
    ("kwargs", "err", "match"),
    [
        ({"title": 123}, TypeError, "Expected 'title' to be a str or None, got int"),
        ({"ax": "left"}, TypeError, "'ax'"),
        ({"color": "no-such-colour"}, ValueError, "'color'"),
        ({"min_weight": "0.1"}, TypeError, "'min_weight'"),
        ({"min_weight": -1.0}, ValueError, "'min_weight'"),
        ({"edge_labels": "yes"}, TypeError, "'edge_labels'"),
        ({"max_width": float("nan")}, ValueError, "'max_width'"),
        ({"max_edges": 0}, ValueError, "'max_edges'"),
        ({"tokens": [1, 2, 3]}, TypeError, "'tokens'.*int at index 0"),
        ({"around": 7}, ValueError, "'around'"),
        ({"around": 0, "hops": 0}, ValueError, "'hops'"),
        ({"hops": 0}, ValueError, "'hops'"),  # even without 'around'
        ({"hops": "x"}, TypeError, "'hops'"),
    ],
)
def test_drawing_argument_errors(kwargs, err, match):
    with pytest.raises(err, match=match):
        viz.draw_attention(complete_graph(3), torch.full((9,), 1 / 3), **kwargs)


def test_heatmap_argument_errors():
    ei, alpha = complete_graph(3), torch.full((9,), 1 / 3)
    with pytest.raises(ValueError, match="'alpha' to hold at least one head"):
        viz.draw_heatmap(ei, torch.zeros(9, 0))
    with pytest.raises(TypeError, match="'annotate'"):
        viz.draw_heatmap(ei, alpha, annotate="yes")
    with pytest.raises(TypeError, match="'title'"):
        viz.draw_heatmap(ei, alpha, title=["a"])


def _knn(n=1797, k=10):
    g = torch.Generator().manual_seed(0)
    dst = torch.arange(n).repeat_interleave(k)
    src = torch.randint(0, n, (n * k,), generator=g)
    alpha = scatter_softmax(torch.randn(n * k, 2, generator=g), dst, n)
    return torch.stack([src, dst]), alpha


def test_large_graphs_are_refused_at_once_with_a_way_out():
    ei, alpha = _knn()
    for draw in (viz.draw_attention, viz.draw_heatmap, viz.draw_side_by_side):
        t = time.perf_counter()
        with pytest.raises(
            ValueError, match="got 1,797: draw one node's neighbourhood with around="
        ):
            draw(ei, alpha)
        assert time.perf_counter() - t < 2.0  # was 12.7 s for draw_attention
    sub = viz.neighbourhood(ei, 5, hops=2)
    assert len(sub.nodes) > viz.limits.MAX_DRAWN_NODES  # a 2-hop view is too big as well
    viz.draw_heatmap(ei, alpha, around=5, hops=1)


def test_neighbourhood_keeps_ids_and_weights():
    ei, alpha = _knn()
    ax = viz.draw_attention(ei, alpha, around=5, hops=1, head=1)
    nb = viz.neighbourhood(ei, 5, hops=1)
    g = ax.graph
    ids = nb.nodes.tolist()
    assert [g.nodes[k]["label"] for k in g.nodes] == [str(v) for v in ids] and 5 in ids
    assert set(ids) == set(ei[0, ei[1] == 5].tolist()) | {5}
    for j, i, d in g.edges(data=True):
        orig = ((ei[0] == ids[j]) & (ei[1] == ids[i])).nonzero().view(-1)
        assert d["weight"] == pytest.approx(float(alpha[orig, 1].sum()))
    # Every incoming edge of the centre is kept: its row still sums to 1.
    assert sum(d["weight"] for _, _, d in g.in_edges(ids.index(5), data=True)) == pytest.approx(1)
    toks = [f"w{v}" for v in range(1797)]
    ax = viz.draw_attention(ei, alpha, tokens=toks, around=5, hops=1)
    assert ax.graph.nodes[ids.index(5)]["label"] == "w5"


def test_many_edges_are_cut_with_a_note():
    n = 40
    ei, alpha = complete_graph(n), torch.full((n * n,), 1 / n)
    ax = viz.draw_attention(ei, alpha)
    note = " ".join(ax.get_legend().get_title().get_text().split())
    assert "480 of 1600 edges shown" in note and "top 12 per target (max_edges=500)" in note
    full = viz.draw_attention(ei, alpha, max_edges=2000, edge_labels=False)
    assert "1600 of 1600" in full.get_legend().get_title().get_text()


def test_cross_attention_weights_as_a_rectangular_matrix():
    # Bipartite weights read as one set of nodes gave [H, 5, 5] with rows for
    # targets that do not exist.
    layer = SelfAttentionConv(8, num_heads=2)
    xs, xd = torch.randn(5, 8), torch.randn(2, 8)
    out, (ei, alpha) = layer((xs, xd), return_attention_weights=True)
    m = viz.attention_matrix(ei, alpha, num_src=5)
    assert m.shape == (2, 2, 5)
    torch.testing.assert_close(m.sum(-1), torch.ones(2, 2))
    torch.testing.assert_close(m[:, ei[1], ei[0]].t(), alpha.detach())  # [h, i, j] = alpha_ij
    with pytest.raises(ValueError, match="below the number of nodes 1"):
        viz.attention_matrix(ei, alpha, 1, num_src=5)
    with pytest.raises(ValueError, match="source ids"):
        viz.attention_matrix(ei, alpha, num_src=4)


def test_conversion_inputs_are_checked():
    ei = causal_graph(3)
    with pytest.raises(TypeError, match="'weights' of a floating dtype, got torch.bool"):
        viz.top_k_per_target(ei, torch.ones(6, dtype=torch.bool), 1)
    with pytest.raises(ValueError, match="at least one head"):
        viz.top_k_per_target(ei, torch.ones(6, 0), 1)
    with pytest.raises(TypeError, match=r"'edge_index' \(layer 0\) to be a Tensor, got list"):
        viz.to_bertviz([(ei.tolist(), torch.ones(6))])
    with pytest.raises(ValueError, match="node ids >= 0, got -1"):
        viz.neighbourhood(torch.tensor([[-1], [0]]), 0, num_nodes=3)
    with pytest.raises(ValueError, match="below the number of nodes 3"):
        viz.neighbourhood(torch.tensor([[4], [0]]), 0, num_nodes=3)
    with pytest.raises(TypeError, match="'num_nodes'"):
        viz.neighbourhood(ei, 0, num_nodes=3.0)
