"""gnnattn.compare: the parity harness agrees on a good layer and catches planted bugs."""

import math

import pytest
import torch

import gnnattn.ops.mp
from gnnattn import SelfAttentionConv
from gnnattn.compare import CANDIDATES, compare

FAST = {"tokens": 6, "embed_dim": 8, "num_heads": 2, "reps": 1}


def test_good_layer_is_equal():
    res = compare(**FAST, candidates=["mp", "sdpa", "fused", "nn.MultiheadAttention", "F.sdpa"])
    assert res.ok, res.table()
    assert len(res.rows) == 5 * 3 * 2
    r = res.row("mp", "float32", causal=True)
    assert r.out_rel < 1e-5 and r.weight_rel < 1e-5 and r.grad_rel < 1e-5
    assert r.ms_per_call > 0
    assert math.isnan(res.row("F.sdpa").weight_abs)  # SDPA returns no weights
    assert "agreement: OK" in res.table()


def test_a_nan_output_fails_its_row():
    """Inputs at which float16 MultiheadAttention overflows to NaN: its row fails."""
    torch.manual_seed(0)
    layer = SelfAttentionConv(8, 2)
    res = compare(layer, torch.randn(4, 8) * 3000, dtypes=["float16"], causal=[False],
                  candidates=["nn.MultiheadAttention"], reps=1)  # fmt: skip
    row = res.row("nn.MultiheadAttention", "float16")
    assert math.isnan(row.out_rel) and row.ok is False and not res.ok


def test_a_causal_layer_is_compared_as_the_harness_masks_it():
    torch.manual_seed(0)
    res = compare(SelfAttentionConv(8, 2, causal=True), **FAST, candidates=["mp", "F.sdpa"])
    assert res.ok, res.table()


class WrongScale(SelfAttentionConv):
    """Forgets the 1/sqrt(C) of scaled dot-product attention."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.scale = 1.0


def global_softmax(src, index, num_segments=None, **kwargs):
    """Normalizes the weights over all edges instead of per target."""
    return torch.softmax(src, dim=0)


@pytest.mark.parametrize("bug", ["wrong scale", "global softmax"])
def test_planted_bug_is_not_equal(bug, monkeypatch):
    torch.manual_seed(0)
    layer = SelfAttentionConv(8, num_heads=2)
    if bug == "wrong scale":
        layer = WrongScale(8, num_heads=2)
    else:  # planted in the message-passing backend itself
        monkeypatch.setattr(gnnattn.ops.mp, "segment_softmax", global_softmax)
    res = compare(layer, tokens=6, reps=1, dtypes=["float32"], candidates=["mp", "F.sdpa"])
    assert not res.ok
    assert res.row("mp").ok is False and res.row("mp").out_rel > 1e-2
    # The dense peers built from the same weights still agree: the bug is the layer's.
    assert res.row("F.sdpa").ok is True
    assert "NOT EQUAL" in res.table()


def test_every_peer_agrees_in_float32():
    res = compare(**FAST, dtypes=["float32"])
    assert [r.candidate for r in res.rows[: len(CANDIDATES)]] == list(CANDIDATES)
    for r in res.rows:
        # FlexAttention may be absent from a torch build: then it says why.
        assert r.ok is True or (r.candidate == "flex_attention" and r.note), r
    conv = res.row("PyG TransformerConv", causal=True)
    assert conv.out_rel < 1e-5 and conv.grad_rel < 1e-5


def test_bad_arguments():
    with pytest.raises(ValueError, match="'dtypes'"):
        compare(**FAST, dtypes=["float8"])
    with pytest.raises(ValueError, match="'candidates'"):
        compare(**FAST, candidates=["xformers"])
    with pytest.raises(ValueError, match="'x'"):
        compare(SelfAttentionConv(8), torch.randn(3, 4))
    with pytest.raises(TypeError, match="'layer'"):
        compare(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="'causal' to hold bools, got str"):
        compare(**FAST, causal="yes")
    with pytest.raises(TypeError, match="'causal' to be a bool or a sequence"):
        compare(**FAST, causal=1)


def test_a_lone_choice_is_one_choice():
    # Not the letters of "float32", nor an error that a bool is not iterable.
    res = compare(**FAST, dtypes="float32", causal=True, candidates="mp")
    assert [(r.candidate, r.dtype, r.causal) for r in res.rows] == [("mp", "float32", True)]


@pytest.mark.parametrize("causal", [False, True])
def test_peers_with_a_window_mask_equal_the_layer_on_the_window_graph(causal):
    from gnnattn import AttentionGraph, peers

    torch.manual_seed(0)
    t, w = 9, 2
    layer = SelfAttentionConv(8, num_heads=2).double().eval()
    x = torch.randn(t, 8, dtype=torch.float64)
    graph = AttentionGraph.window(t, window=w, causal=causal)
    expected = layer(x, graph, backend="mp")
    outs = {
        "mha": peers.mha(layer, t, causal=causal, window=w)[1](x)[0],
        "sdpa": peers.sdpa(layer, t, causal=causal, window=w)(x),
        "conv": peers.transformer_conv(layer, graph.edge_index)[1](x),
    }
    try:
        with torch.no_grad():  # eager FlexAttention has no backward on the CPU
            outs["flex"] = peers.flex(layer, t, causal=causal, window=w)(x)
    except peers.PeerUnavailable:
        pass
    for name, out in outs.items():
        torch.testing.assert_close(out, expected, atol=1e-10, rtol=1e-10, msg=name)
