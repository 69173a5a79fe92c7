"""gnnattn.compare: the parity harness agrees on a good layer and catches planted bugs."""

import math

import pytest
import torch

from gnnattn import SelfAttentionConv
from gnnattn.compare import compare
from gnnattn.softmax import segment_softmax

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


class WrongScale(SelfAttentionConv):
    """Forgets the 1/sqrt(C) of scaled dot-product attention."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.scale = 1.0


class GlobalSoftmax(SelfAttentionConv):
    """Normalizes the weights over all edges instead of per target."""

    def edge_update(self, query_i, key_j, score_bias, index, ptr, size_i):
        score = (query_i * key_j).sum(dim=-1) * self.scale  # (E, H)
        return segment_softmax(score, torch.zeros_like(index), 1)


@pytest.mark.parametrize("bug", [WrongScale, GlobalSoftmax])
def test_planted_bug_is_not_equal(bug):
    torch.manual_seed(0)
    layer = bug(8, num_heads=2)
    res = compare(layer, tokens=6, reps=1, dtypes=["float32"], candidates=["mp", "F.sdpa"])
    assert not res.ok
    assert res.row("mp").ok is False and res.row("mp").out_rel > 1e-2
    # The dense peers built from the same weights still agree: the bug is the layer's.
    assert res.row("F.sdpa").ok is True
    assert "NOT EQUAL" in res.table()


def test_bad_arguments():
    with pytest.raises(ValueError, match="'dtypes'"):
        compare(**FAST, dtypes=["float8"])
    with pytest.raises(ValueError, match="'candidates'"):
        compare(**FAST, candidates=["xformers"])
    with pytest.raises(ValueError, match="'x'"):
        compare(SelfAttentionConv(8), torch.randn(3, 4))
    with pytest.raises(TypeError, match="'layer'"):
        compare(torch.nn.Linear(2, 2))
