"""gnnattn.viz.explore: the page's content, size, cuts and errors (no browser needed).

What the page does in a browser is tested in test_explorer_browser.py.
"""

import base64
import hashlib
import json
import re

import numpy as np
import pytest
import torch

from gnnattn import SelfAttentionConv, causal_graph, complete_graph, scatter_softmax
from gnnattn.viz import AttentionExplorer, attention_matrix, explore, top_k_per_target
from gnnattn.viz.explorer import D3_VERSION


def random_attention(n: int, deg: int, heads: int = 2, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    dst = torch.arange(n).repeat_interleave(deg)
    src = torch.randint(0, n, (n * deg,), generator=g)
    scores = torch.randn(n * deg, heads, generator=g)
    return torch.stack([src, dst]), scatter_softmax(scores, dst, n), scores


def payload(page: AttentionExplorer) -> dict:
    m = re.search(r'<script type="application/json" id="gnnattn-data">(.*?)</script>', page.html)
    assert m is not None
    return json.loads(m.group(1))


def decode(s: str, dtype: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(s), dtype=dtype)


def test_self_contained_with_the_d3_licence():
    page = explore((complete_graph(4), torch.full((16, 2), 0.25)), tokens=list("abcd"))
    h = page.html
    assert "<script src" not in h and "<link" not in h and "@import" not in h
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", h)
    assert f"d3 v{D3_VERSION}" in h and "Permission to use, copy, modify" in h
    assert h.count("</script>") == 3  # data, d3, the page's own code
    assert page.layout == "circular" and page.num_edges == [16] and page.num_nodes == 4


def test_d3_asset_is_the_stated_version():
    from gnnattn.viz.explorer import _asset

    d3 = _asset("d3.min.js")
    assert d3.startswith(f"// https://d3js.org v{D3_VERSION} ")
    assert "Permission to use, copy, modify" in _asset("d3.LICENSE")
    stated = _asset("d3.VERSION")
    assert stated.startswith(f"d3 {D3_VERSION} ")
    assert hashlib.sha256(d3.encode("utf-8")).hexdigest() in stated


def test_payload_holds_the_exact_weights_sorted_by_target():
    torch.manual_seed(0)
    layer = SelfAttentionConv(8, num_heads=2).eval()
    x = torch.randn(5, 8)
    perm = torch.randperm(15)  # edges in any order: the page sorts them
    ei = causal_graph(5)[:, perm]
    with torch.no_grad():
        _, (ei, alpha) = layer(x, ei, return_attention_weights=True)
    d = payload(explore((ei, alpha)))
    lay = d["layers"][0]
    src = decode(lay["src"], "<u2")
    rowptr = decode(lay["rowptr"], "<i4")
    a = decode(lay["alpha"], "<f4").reshape(2, -1)
    dst = np.repeat(np.arange(5), np.diff(rowptr))
    key = dst * 5 + src
    assert (np.diff(key) > 0).all()
    for e in range(ei.shape[1]):
        k = int(np.nonzero(key == int(ei[1, e]) * 5 + int(ei[0, e]))[0][0])
        assert a[0, k] == np.float32(alpha[e, 0]) and a[1, k] == np.float32(alpha[e, 1])
    assert d["layout"] == "layered" and lay["scores"] is None


def test_layouts():
    ei, alpha, _ = random_attention(30, 3)
    assert explore((ei, alpha)).layout == "spring"
    assert explore((causal_graph(6), torch.rand(21))).layout == "layered"
    pos = torch.randn(30, 2)
    page = explore((ei, alpha), pos=pos)
    d = payload(page)
    assert page.layout == "given"
    assert np.allclose(decode(d["x"], "<f4"), pos[:, 0].numpy())
    assert np.allclose(decode(d["y"], "<f4"), -pos[:, 1].numpy())  # the page's y points down
    assert explore((ei, alpha), pos={v: (v, 0) for v in range(30)}).layout == "given"


def test_size_grows_linearly():
    sizes = []
    for deg in (10, 20, 40):
        ei, alpha, _ = random_attention(500, deg)
        sizes.append(len(explore((ei, alpha), layout="circular").html))
    d1, d2 = sizes[1] - sizes[0], sizes[2] - sizes[1]
    assert abs(d2 / d1 - 2.0) < 0.05
    # uint16 source (2 B) + float32 per head (2 x 4 B), base64 (x 4/3): ~13.3 B per edge.
    assert 12 < d1 / 5000 < 15


def test_cut_to_top_k_per_target_with_a_note():
    ei, alpha, scores = random_attention(100, 50)
    page = explore((ei, alpha), scores=scores, max_edges=1000, layout="circular")
    assert page.num_edges == [1000]  # 10 per target fits exactly
    assert len(page.notes) == 1 and "5,000 edges cut to the 10 heaviest" in page.notes[0]
    d = payload(page)
    assert d["layers"][0]["note"] == page.notes[0] and d["layers"][0]["edgesIn"] == 5000
    # The row statistics are those of the full rows, before the cut.
    amax = decode(d["layers"][0]["amax"], "<f4").reshape(2, 100)
    full = torch.zeros(100, 2).scatter_reduce(0, ei[1].view(-1, 1).expand(-1, 2), alpha, "amax")
    assert np.allclose(amax, full.t().numpy())


def test_top_k_per_target_matches_sorting():
    ei, alpha, _ = random_attention(20, 7, heads=3)
    for k in (1, 3, 7, 9):
        keep = top_k_per_target(ei, alpha, k)
        w = alpha.amax(dim=1)
        for i in range(20):
            idx = (ei[1] == i).nonzero().view(-1)
            best = idx[torch.argsort(-w[idx], stable=True)[:k]]
            assert set(idx[keep[idx]].tolist()) == set(best.tolist())


def test_layers_and_repr_html():
    ei, alpha, _ = random_attention(12, 4)
    page = explore([(ei, alpha), (complete_graph(12), torch.full((144, 2), 1 / 12))])
    d = payload(page)
    assert [lay["name"] for lay in d["layers"]] == ["layer 0", "layer 1"]
    assert page.num_edges == [48, 144]
    html = page._repr_html_()
    assert html.startswith("<iframe srcdoc=") and "&lt;canvas" in html
    assert "AttentionExplorer(nodes=12" in repr(page)


def test_empty_graph_writes_a_page_that_says_so(tmp_path):
    page = explore((torch.zeros(2, 0, dtype=torch.long), torch.zeros(0, 2)), num_nodes=3)
    assert "has no edges" in payload(page)["empty"]
    assert page.save(tmp_path / "empty.html").read_text(encoding="utf-8") == page.html
    none = explore((torch.zeros(2, 0, dtype=torch.long), torch.zeros(0)))
    assert "no nodes" in payload(none)["empty"]


def test_labels_cannot_close_the_script():
    page = explore((complete_graph(2), torch.full((4,), 0.5)), tokens=["</script>", "<b>"])
    assert payload(page)["labels"] == ["</script>", "<b>"]
    assert page.html.count("</script>") == 3


def test_bad_input():
    ei, alpha = complete_graph(3), torch.full((9, 2), 1 / 3)
    with pytest.raises(ValueError, match=r"'alpha' \(layer 0\) of shape"):
        explore((ei, alpha[:-1]))
    with pytest.raises(ValueError, match="'tokens' to hold one label per node"):
        explore((ei, alpha), tokens=["a", "b"])
    with pytest.raises(TypeError, match="'tokens' to be a list"):
        explore((ei, alpha), tokens="a b c")
    nan = alpha.clone()
    nan[4, 1] = float("nan")
    with pytest.raises(ValueError, match=r"'alpha' \(layer 0\), got \[.*nan\] at edge 4"):
        explore((ei, nan))
    with pytest.raises(ValueError, match="weights >= 0"):
        explore((ei, -alpha))
    with pytest.raises(ValueError, match="'scores' of layer 0 shaped like"):
        explore((ei, alpha), scores=torch.zeros(9, 3))
    with pytest.raises(ValueError, match="'scores' to hold one tensor"):
        explore((ei, alpha), scores=[None, None])
    with pytest.raises(ValueError, match=r"'pos' of shape \[3, 2\]"):
        explore((ei, alpha), pos=torch.zeros(3, 3))
    with pytest.raises(ValueError, match="'pos' to place every node"):
        explore((ei, alpha), pos={0: (0, 0)})
    with pytest.raises(ValueError, match="'layer_names'"):
        explore((ei, alpha), layer_names=["a", "b"])
    with pytest.raises(ValueError, match="'layout'"):
        explore((ei, alpha), layout="grid")
    with pytest.raises(ValueError, match="'max_edges'"):
        explore((ei, alpha), max_edges=0)
    with pytest.raises(ValueError, match="at least one"):
        explore([])
    with pytest.raises(TypeError, match="'attentions'"):
        explore(alpha)
    with pytest.raises(ValueError, match="'edge_index'"):
        explore((ei[:, :4] + 5, alpha[:4]), num_nodes=3)


@pytest.mark.parametrize(
    ("kwargs", "err", "match"),
    [
        # Checked before their length is read: an int or a generator has none.
        ({"tokens": 5}, TypeError, "Expected 'tokens' to be a list of strings, got int"),
        ({"tokens": (t for t in "abc")}, TypeError, "'tokens' to be a list.*got generator"),
        ({"pos": 5}, TypeError, r"Expected 'pos' to be a mapping \{node: \(x, y\)\}.*got int"),
        ({"pos": "abc"}, TypeError, "Expected 'pos' to be a mapping.*got str"),
        ({"pos": [[0, 0], [1, 1], [2, "a"]]}, TypeError, "'pos' to hold real numbers"),
        ({"pos": [[0, 0], [1], [2, 2]]}, ValueError, "'pos' to be .* pairs, got rows of diff"),
        ({"pos": {0: (0, 0), 1: (1,), 2: (2, 2)}}, ValueError, r"'pos' of node 1 to be two num"),
        ({"pos": {0: "ab", 1: (1, 1), 2: (2, 2)}}, TypeError, "'pos' of node 0 to be numbers"),
        ({"scores": 5}, TypeError, "Expected 'scores' to be a Tensor or a list.*got int"),
        ({"scores": np.zeros(9)}, TypeError, "'scores' to be a Tensor.*got ndarray"),
        ({"hops": "x"}, TypeError, "'hops'"),
        ({"hops": 0}, ValueError, "'hops'"),
    ],
)
def test_argument_errors_name_the_argument(kwargs, err, match):
    with pytest.raises(err, match=match):
        explore((complete_graph(3), torch.full((9,), 1 / 3)), **kwargs)


def test_layer_errors_name_the_layer_and_the_item():
    ei, alpha = complete_graph(3), torch.full((9,), 1 / 3)
    with pytest.raises(TypeError, match=r"Expected 'alpha' \(layer 0\) to be a Tensor, got list"):
        explore((ei, [0.1] * 9))
    with pytest.raises(TypeError, match=r"Expected 'edge_index' \(layer 0\) to be a Tensor, got"):
        explore(([[0, 1], [1, 0]], torch.ones(2)))
    with pytest.raises(ValueError, match=r"'alpha' \(layer 1\) of shape .* got \[8, 1\]"):
        explore([(ei, alpha), (ei, torch.ones(8))])
    with pytest.raises(ValueError, match=r"ids in 'edge_index' \(layer 1\)\[0\] below"):
        explore([(ei, alpha), (ei + 1, alpha)], num_nodes=3)


def test_alpha_without_heads_is_refused():
    # [E, 0] passed every check, and the page threw before its first paint.
    ei, none = complete_graph(3), torch.zeros(9, 0)
    with pytest.raises(
        ValueError, match=r"'alpha' \(layer 0\) to hold at least one head.*\[9, 0\]"
    ):
        explore((ei, none))
    with pytest.raises(ValueError, match="'alpha' to hold at least one head"):
        attention_matrix(ei, none)


def test_a_border_row_keeps_its_full_row_statistics():
    # 0 <- 1 <- {1, 2, 3}: around 0 with one hop keeps nodes 0 and 1, and of
    # node 1's three incoming edges only its self-loop.
    ei = torch.tensor([[1, 0, 1, 2, 3], [0, 0, 1, 1, 1]])
    scores = torch.tensor([[0.0], [0.0], [0.0], [3.0], [1.0]])
    alpha = scatter_softmax(scores, ei[1], 4)
    lay = payload(explore((ei, alpha), scores=scores, around=0, hops=1))["layers"][0]
    assert decode(lay["degree"], "<i4").tolist() == [2, 3]
    assert decode(lay["amax"], "<f4")[1] == pytest.approx(float(alpha[3]))
    assert decode(lay["asum"], "<f4")[1] == pytest.approx(1.0)
    assert decode(lay["smax"], "<f4")[1] == 3.0
    assert decode(lay["ssum"], "<f4")[1] == pytest.approx(float(torch.exp(scores[2:] - 3).sum()))
    assert lay["cutRows"] is None  # cut by the neighbourhood, not by max_edges


def test_rows_cut_by_max_edges_are_marked():
    # Targets 0..3 have 6 incoming edges, targets 4 and 5 one each: k = 2 fits 10.
    ei = torch.cat([complete_graph(6)[:, :24], torch.tensor([[0, 0], [4, 5]])], dim=1)
    alpha = scatter_softmax(torch.randn(ei.shape[1], 1), ei[1], 6)
    lay = payload(explore((ei, alpha), max_edges=10))["layers"][0]
    assert decode(lay["cutRows"], "u1").tolist() == [1, 1, 1, 1, 0, 0]
    assert decode(lay["degree"], "<i4").tolist() == [6, 6, 6, 6, 1, 1]
    assert payload(explore((ei, alpha)))["layers"][0]["cutRows"] is None


def test_counts_in_the_title_and_notes_agree_in_number():
    one = explore((torch.zeros(2, 0, dtype=torch.long), torch.zeros(0)), num_nodes=1)
    assert "1 node, 0 edges in 1 layer, 1 head" in one.html
    assert "This graph has no edges (1 node)" in payload(one)["empty"]
    two = explore((complete_graph(2), torch.full((4, 2), 0.5)))
    assert "2 nodes, 4 edges in 1 layer, 2 heads" in two.html


def test_option_types_are_checked():
    ei, alpha = complete_graph(3), torch.full((9, 2), 1 / 3)
    with pytest.raises(TypeError, match="Expected 'title' to be a str or None, got int"):
        explore((ei, alpha), title=123)
    with pytest.raises(TypeError, match="'layer_names'.*int at index 0"):
        explore((ei, alpha), layer_names=[1])
    with pytest.raises(TypeError, match="Expected 'layout' to be a str, got int"):
        explore((ei, alpha), layout=5)
    with pytest.raises(TypeError, match="'tokens'.*int at index 1"):
        explore((ei, alpha), tokens=["a", 2, "c"])


def test_lone_surrogates_save(tmp_path):
    ei, alpha = complete_graph(2), torch.full((4,), 0.5)
    page = explore((ei, alpha), tokens=["a\ud800", "b"], title="t\udc00", layer_names=["\ud83d"])
    text = page.save(tmp_path / "p.html").read_text(encoding="utf-8")
    assert "<title>t\ufffd</title>" in text
    d = payload(page)
    assert d["labels"] == ["a\ufffd", "b"] and d["layers"][0]["name"] == "\ufffd"


def test_node_colours():
    ei, alpha = complete_graph(4), torch.full((16,), 0.25)
    d = payload(explore((ei, alpha), node_color=torch.tensor([2, 0, 2, 10])))
    assert d["groups"] == {"names": ["0", "2", "10"], "of": [1, 0, 1, 2]}
    d = payload(explore((ei, alpha), node_color=["dog", "cat", "dog", "<b>"]))
    assert d["groups"] == {"names": ["<b>", "cat", "dog"], "of": [2, 1, 2, 0]}
    assert payload(explore((ei, alpha)))["groups"] is None
    with pytest.raises(TypeError, match="'node_color'.*integer tensor"):
        explore((ei, alpha), node_color=torch.rand(4))
    with pytest.raises(ValueError, match="one class per node \\(4\\), got 3"):
        explore((ei, alpha), node_color=[0, 1, 2])
    with pytest.raises(TypeError, match="only ints or only strings"):
        explore((ei, alpha), node_color=[0, "a", 1, 2])
    with pytest.raises(TypeError, match="'node_color'"):
        explore((ei, alpha), node_color="red")


def test_neighbourhood_view_keeps_ids_and_remaps_weights():
    ei, alpha, scores = random_attention(500, 6)
    classes = torch.arange(500) % 4
    page = explore((ei, alpha), scores=scores, around=42, hops=2, node_color=classes)
    d = payload(page)
    ids = d["ids"]
    assert 42 in ids and page.num_nodes == len(ids) == len(d["labels"]) < 500
    assert d["labels"] == [str(v) for v in ids]  # the original ids, not 0..M-1
    assert d["groups"]["of"] == [d["groups"]["names"].index(str(v % 4)) for v in ids]
    lay = d["layers"][0]
    src = decode(lay["src"], "<u2")
    dst = np.repeat(np.arange(len(ids)), np.diff(decode(lay["rowptr"], "<i4")))
    a = decode(lay["alpha"], "<f4").reshape(2, -1)
    s = decode(lay["scores"], "<f4").reshape(2, -1)
    kept = set(ids)
    inside = [e for e in range(ei.shape[1]) if int(ei[0, e]) in kept and int(ei[1, e]) in kept]
    assert len(src) == len(inside)
    for k in range(len(src)):
        j, i = ids[src[k]], ids[dst[k]]
        e = [e for e in inside if (int(ei[0, e]), int(ei[1, e])) == (j, i)]
        assert np.float32(alpha[e[0], 1]) in a[1, k : k + len(e)]
        assert np.float32(scores[e[0], 0]) in s[0, k : k + len(e)]
    # The centre keeps every incoming edge: its row sums to 1.
    centre = ids.index(42)
    assert a[0][dst == centre].sum() == pytest.approx(1.0, abs=1e-5)
    tokens = [f"t{v}" for v in range(500)]
    assert payload(explore((ei, alpha), tokens=tokens, around=42))["labels"][centre] == "t42"
    with pytest.raises(ValueError, match="'around'"):
        explore((ei, alpha), around=500)


def test_matrix_note_above_200_nodes():
    for n, shown in ((200, True), (201, False)):
        ei, alpha, _ = random_attention(n, 2)
        note = payload(explore((ei, alpha), layout="circular"))["matrixNote"]
        assert (note is None) == shown
    assert "not drawn above 200 nodes (201 here)" in note and "around=" in note


# ------------------------------------------------------------- hostile labels

FAMILY = "\U0001f469\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466"  # one emoji, 7 code points
FLAG = "\U0001f1eb\U0001f1f7"  # two regional indicators


def test_shorten_cuts_between_characters():
    from gnnattn.viz.text import MAX_LABEL_CHARS, shorten

    assert MAX_LABEL_CHARS == 200
    assert shorten("x" * 200) == "x" * 200
    assert shorten("x" * 201) == "x" * 200 + "…"
    # An emoji ZWJ sequence, a letter and its accents, a flag, a skin tone: never split.
    for unit in (FAMILY, "e\u0301\u0302", FLAG, "\U0001f44d\U0001f3fd", "\u0915\u094d\u0937"):
        for limit in range(len(unit), 3 * len(unit) + 1):
            cut = shorten(unit * 5, limit)
            assert cut.endswith("…")
            kept = cut[:-1]
            assert len(kept) <= limit and len(kept) % len(unit) == 0, (unit, limit, kept)
    # Flags after an odd run of indicators: the pairs are counted from the run's start.
    assert shorten("a" + FLAG * 3, 4) == "a" + FLAG + "…"
    # One character longer than the limit (a letter under 1000 marks) is cut inside.
    zalgo = shorten("a" + "\u0301" * 1000, 10)
    assert zalgo == "a" + "\u0301" * 9 + "…"
    # RTL text and a script payload are cut like any other text.
    assert shorten("\u05e9\u05dc\u05d5\u05dd" * 60, 5) == "\u05e9\u05dc\u05d5\u05dd\u05e9…"


def test_long_labels_are_cut_and_the_page_says_so():
    tokens = ["x" * 100_000, "ok", FAMILY * 100, "a" + "\u0301" * 1000, "\u0645" * 300]
    n = len(tokens)
    page = explore((complete_graph(n), torch.full((n * n,), 1 / n)), tokens=tokens)
    d = payload(page)
    labels = d["labels"]
    assert labels[0] == "x" * 200 + "…" and labels[1] == "ok"
    assert labels[2][:-1] == FAMILY * (200 // len(FAMILY)) and labels[2][-1] == "…"
    assert labels[3] == "a" + "\u0301" * 199 + "…" and labels[4] == "\u0645" * 200 + "…"
    assert d["maxLabel"] == 200
    note = "4 labels longer than 200 characters cut to their first 200 and '…'"
    assert d["notes"] == [note] and page.notes == [note]
    assert len(page.html) < 400_000  # not 100k characters more
    # Class and layer names are labels too.
    page = explore(
        (complete_graph(2), torch.full((4,), 0.5)),
        node_color=["y" * 300, "b"],
        layer_names=["z" * 250],
    )
    d = payload(page)
    assert d["groups"]["names"] == ["b", "y" * 200 + "…"]
    assert d["layers"][0]["name"] == "z" * 200 + "…"
    assert "2 labels longer" in page.notes[0]
    assert payload(explore((complete_graph(2), torch.full((4,), 0.5))))["notes"] == []


def test_hostile_labels_stay_data():
    tokens = [
        "</script><script>window.pwned = 1</script>",
        "<!--<script>",
        "</SCRIPT >",
        "\u05e9\u05dc\u05d5\u05dd",
        "\u202eevil\u202c",
        "e\u0301",
        FAMILY,
    ]
    n = len(tokens)
    page = explore((complete_graph(n), torch.full((n * n,), 1 / n)), tokens=tokens, title="</h1>")
    assert page.html.count("</script>") == 3  # data, d3, the page's own code
    block = re.search(
        r'<script type="application/json" id="gnnattn-data">(.*?)</script>', page.html, re.S
    )
    assert block is not None and "<" not in block.group(1)
    assert payload(page)["labels"] == tokens
    assert "<title>&lt;/h1&gt;</title>" in page.html


# ------------------------------------------------------------------ structure

BENZENE = [(k, (k + 1) % 6) for k in range(6)] + [(k, k + 6) for k in range(6)]


def bonds(pairs: list[tuple[int, int]]) -> torch.Tensor:
    # As PyG stores a molecule: both directions of every bond.
    return torch.tensor(pairs + [(b, a) for a, b in pairs]).t()


def structure_pairs(d: dict) -> set[tuple[int, int]]:
    s = d["structure"]
    dtype = "<u2" if d["idx"] == "u16" else "<i4"
    a, b = decode(s["a"], dtype), decode(s["b"], dtype)
    assert len(a) == len(b) == s["count"]
    return {(int(x), int(y)) for x, y in zip(a, b, strict=True)}


def test_structure_is_written_as_undirected_pairs():
    n = 12
    ei, alpha = complete_graph(n), torch.full((n * n,), 1 / n)
    # Both directions, a self-loop and a duplicate: one pair per bond.
    s = torch.cat([bonds(BENZENE), torch.tensor([[3, 0], [3, 1]])], dim=1)
    page = explore((ei, alpha), structure=s)
    d = payload(page)
    assert structure_pairs(d) == {(min(a, b), max(a, b)) for a, b in BENZENE}
    assert page.num_structure_edges == 12 == d["structure"]["count"]
    # The molecule's shape, not the complete graph's circle; a layout asked for wins.
    assert page.layout == "spring"
    assert explore((ei, alpha), structure=s, layout="circular").layout == "circular"
    assert explore((ei, alpha), structure=s, pos=torch.randn(n, 2)).layout == "given"
    # int32 works, and so does an empty structure (drawn as nothing).
    assert explore((ei, alpha), structure=s.int()).num_structure_edges == 12
    empty = explore((ei, alpha), structure=torch.zeros(2, 0, dtype=torch.long))
    assert empty.num_structure_edges == 0 and empty.layout == "circular"
    none = explore((ei, alpha))
    assert none.num_structure_edges is None and payload(none)["structure"] is None


def test_structure_positions_follow_the_bonds():
    # A bonded pair is closer than the average pair: the drawing shows the molecule.
    n = 12
    d = payload(explore((complete_graph(n), torch.full((n * n,), 1 / n)), structure=bonds(BENZENE)))
    xy = np.stack([decode(d["x"], "<f4"), decode(d["y"], "<f4")], axis=1)
    dist = np.linalg.norm(xy[:, None] - xy[None], axis=-1)
    bonded = np.mean([dist[a, b] for a, b in BENZENE])
    assert bonded < 0.6 * dist[np.triu_indices(n, 1)].mean()


def test_structure_in_a_neighbourhood_is_renumbered():
    ei, alpha, _ = random_attention(300, 4)
    s = torch.stack([torch.arange(299), torch.arange(1, 300)])  # a path over every node
    page = explore((ei, alpha), around=42, hops=1, structure=s)
    d = payload(page)
    ids = d["ids"]
    expected = {(ids.index(v), ids.index(v + 1)) for v in range(299) if v in ids and v + 1 in ids}
    assert structure_pairs(d) == expected and page.num_structure_edges == len(expected)


def test_structure_bad_input():
    ei, alpha = complete_graph(3), torch.full((9,), 1 / 3)
    with pytest.raises(TypeError, match="Expected 'structure' to be a Tensor, got list"):
        explore((ei, alpha), structure=[[0, 1], [1, 2]])
    with pytest.raises(TypeError, match="Expected 'structure' of dtype torch.int64.*float32"):
        explore((ei, alpha), structure=torch.zeros(2, 2))
    with pytest.raises(ValueError, match=r"Expected 'structure' of shape \[2, E\], got \[3, 2\]"):
        explore((ei, alpha), structure=torch.zeros(3, 2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"'structure'\[1\] below the number of nodes 3, got 5"):
        explore((ei, alpha), structure=torch.tensor([[0], [5]]))
    with pytest.raises(ValueError, match="'structure' to hold node ids >= 0, got -1"):
        explore((ei, alpha), structure=torch.tensor([[0], [-1]]))
