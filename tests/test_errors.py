"""SPEC section 4: every user mistake is a ValueError/TypeError naming the argument."""

import pytest
import torch

from gnnattn import (
    AttentionGraph,
    SelfAttentionConv,
    SimplifiedAttention,
    attention,
    causal_graph,
    complete_graph,
    edge_index_to_mask,
    scatter_softmax,
    sliding_window_graph,
)
from gnnattn.dense import dense_self_attention
from gnnattn.ops import dropout

X = torch.randn(5, 8)
EI = complete_graph(5)


@pytest.mark.parametrize(
    "args, kwargs, exc, match",
    [
        (
            (X, torch.zeros(3, 10, dtype=torch.long)),
            {},
            ValueError,
            r"Expected 'edge_index' of shape \[2, E\], got \[3, 10\]",
        ),
        ((X, EI.float()), {}, TypeError, r"'edge_index' of dtype torch.int64"),
        ((X, EI.tolist()), {}, TypeError, r"'edge_index' to be a Tensor"),
        ((X, torch.tensor([[0, 5], [1, 1]])), {}, ValueError, r"source ids .* below .* 5, got 5"),
        ((X, torch.tensor([[0, 1], [1, 7]])), {}, ValueError, r"target ids .* got 7"),
        (
            (X, torch.tensor([[0, -1], [1, 1]])),
            {},
            ValueError,
            r"'edge_index' to hold node ids >= 0",
        ),
        ((X[None],), {}, ValueError, r"'x' of shape \[N, 8\].*got \[1, 5, 8\]"),
        ((torch.randn(5, 7),), {}, ValueError, r"'x' of shape \[N, 8\], got \[5, 7\]"),
        ((X.long(),), {}, TypeError, r"'x' of a floating dtype"),
        (
            (X,),
            {"batch": torch.zeros(4, dtype=torch.long)},
            ValueError,
            r"'batch' of length 5 .*got 4",
        ),
        ((X,), {"batch": torch.tensor([0, 1, 0, 1, 1])}, ValueError, r"'batch' to be sorted"),
        ((X,), {"batch": torch.zeros(5)}, TypeError, r"'batch' of dtype"),
        ((X,), {"batch": [0, 0, 1, 1, 1]}, TypeError, r"'batch' to be a Tensor, got list"),
        (
            (X, EI),
            {"batch": torch.zeros(5, dtype=torch.long)},
            ValueError,
            r"either 'edge_index' or 'batch'",
        ),
        ((X, EI.to("meta")), {}, ValueError, r"'edge_index' on device cpu"),
    ],
)
def test_bad_layer_input_leaves_layer_unchanged(args, kwargs, exc, match):
    layer = SelfAttentionConv(8, num_heads=2)
    before = {k: v.clone() for k, v in layer.state_dict().items()}
    with pytest.raises(exc, match=match):
        layer(*args, **kwargs)
    after = layer.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not any(k.startswith("_alpha") for k in vars(layer))  # no state left on the layer
    # and it still works afterwards
    assert layer(X).shape == (5, 8)


def test_simplified_bad_input():
    attn = SimplifiedAttention()
    with pytest.raises(ValueError, match=r"'x' of shape"):
        attn(torch.randn(3))
    with pytest.raises(ValueError, match=r"'edge_index' of shape \[2, E\]"):
        attn(torch.randn(3, 2), torch.zeros(2, 2, 2, dtype=torch.long))
    with pytest.raises(TypeError, match="'scale'"):
        SimplifiedAttention(scale="1")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"embed_dim": 10, "num_heads": 3}, r"'embed_dim' divisible by 'num_heads'.*10.*3"),
        ({"embed_dim": 0}, r"'embed_dim' to be a positive int"),
        ({"embed_dim": 8, "num_heads": 0}, r"'num_heads' to be a positive int"),
        ({"embed_dim": 8, "dropout": 1.5}, r"'dropout' in \[0, 1\]"),
        ({"embed_dim": 8, "backend": "cuda"}, r"'backend' to be one of"),
    ],
)
def test_bad_constructor_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SelfAttentionConv(**kwargs)


def test_backend_that_cannot_run_this_graph():
    layer = SelfAttentionConv(8, backend="sdpa")
    with pytest.raises(ValueError, match="backend='sdpa' needs a graph of known structure"):
        layer(X, torch.tensor([[0, 1], [1, 2]]))
    # Attention dropout runs on the fused kernels now: asked for, it is taken.
    layer = SelfAttentionConv(8, dropout=0.1, backend="fused").train()
    assert layer.backend_for(X, EI) == ("fused", "asked for")


def test_from_torch_rejects_what_it_cannot_express():
    with pytest.raises(TypeError, match="'mha'"):
        SelfAttentionConv.from_torch(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="add_bias_kv"):
        SelfAttentionConv.from_torch(torch.nn.MultiheadAttention(8, 2, add_bias_kv=True))
    with pytest.raises(ValueError, match="kdim"):
        SelfAttentionConv.from_torch(torch.nn.MultiheadAttention(8, 2, kdim=4, vdim=4))


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda: complete_graph(), ValueError, "'num_nodes' or 'batch'"),
        (lambda: complete_graph(-1), ValueError, "'num_nodes' to be an int >= 0"),
        (lambda: complete_graph(2.0), TypeError, "'num_nodes' to be an int"),
        (
            lambda: causal_graph(3, batch=torch.zeros(2, dtype=torch.long)),
            ValueError,
            r"'batch' of length 3 \(one id per row of x\), got 2",
        ),
        (lambda: sliding_window_graph(3, window=-1), ValueError, "'window' to be an int >= 0"),
        (lambda: sliding_window_graph(3, window=1.5), TypeError, "'window' to be an int"),
        (lambda: edge_index_to_mask(torch.tensor([[0], [3]]), 3), ValueError, "target ids"),
        (
            lambda: dense_self_attention(
                SelfAttentionConv(8), X, torch.ones(4, 4, dtype=torch.bool)
            ),
            ValueError,
            r"'mask' of shape \[5, 5\]",
        ),
        (
            lambda: dense_self_attention(SelfAttentionConv(8), torch.randn(5, 3)),
            ValueError,
            r"'x' of shape \[N, 8\]",
        ),
        (
            lambda: attention(*(torch.randn(4, 2, c) for c in (0, 0, 3)), AttentionGraph.causal(4)),
            ValueError,
            r"'q' of head width C >= 1 for the default scale 1/sqrt\(C\), got C = 0",
        ),
        (
            lambda: scatter_softmax(torch.ones(3), torch.zeros(3, dtype=torch.uint8)),
            TypeError,
            r"'index' of dtype torch.int64 or torch.int32, got torch.uint8",
        ),
        (lambda: dropout(torch.ones(3), float("nan")), ValueError, r"'p' in \[0, 1\], got nan"),
    ],
)
def test_bad_builder_and_reference_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_dtype_and_device_mismatch():
    layer = SelfAttentionConv(8, num_heads=2)
    with pytest.raises(
        TypeError, match=r"'x' of the layer's dtype torch.float32, got torch.float64"
    ):
        layer(X.double())
    with pytest.raises(ValueError, match=r"'x' on the layer's device cpu, got meta"):
        layer(X.to("meta"))
    with pytest.raises(TypeError, match=r"'x\[0\]' and 'x\[1\]' of one dtype"):
        layer((X, X.double()))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert layer(X.bfloat16()).shape == (5, 8)


# ---------------------------------------------------------------- sizes and ids


def test_a_pyg_batch_with_empty_graphs_first_is_taken():
    from torch_geometric.data import Batch, Data

    b = Batch.from_data_list([Data(x=torch.zeros(0, 8))] * 3 + [Data(x=X[:2])])
    assert b.batch.tolist() == [3, 3]  # ids past the number of nodes
    layer = SelfAttentionConv(8, num_heads=2)
    assert torch.equal(
        layer(b.x, batch=b.batch), layer(b.x, batch=torch.zeros(2, dtype=torch.long))
    )


@pytest.mark.parametrize(
    "call",
    [
        lambda b: SelfAttentionConv(8, num_heads=2)(X, batch=b),
        lambda b: SelfAttentionConv(8, num_heads=2, causal=True)(X, batch=b),
        lambda b: complete_graph(batch=b),
        lambda b: causal_graph(batch=b),
        lambda b: sliding_window_graph(batch=b, window=1),
    ],
)
def test_a_huge_batch_id_costs_nothing(call, monkeypatch):
    # PyG's graph ids count empty graphs, so an id may pass the number of nodes;
    # sized by a bincount, 10**12 graphs would ask for terabytes. The graphs are
    # the runs of equal ids: the same as ids 0, 1, 2.
    monkeypatch.setattr(torch, "bincount", lambda *a, **k: pytest.fail("bincount of the ids"))
    torch.manual_seed(0)
    got = call(torch.tensor([0, 0, 1, 1, 10**12]))
    torch.manual_seed(0)
    assert torch.equal(got, call(torch.tensor([0, 0, 1, 1, 2])))


def test_batch_ids_may_skip_graphs_below_the_number_of_nodes():
    # Gaps (graphs without nodes) are fine as long as the ids stay below N.
    out = SelfAttentionConv(8, num_heads=2)(X, batch=torch.tensor([0, 0, 3, 3, 4]))
    assert out.shape == (5, 8) and torch.isfinite(out).all()


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: SelfAttentionConv(8, dropout=NAN), r"'dropout' in \[0, 1\], got nan"),
        (lambda: SelfAttentionConv(8, dropout=INF), r"'dropout' in \[0, 1\], got inf"),
        (lambda: SelfAttentionConv(8, dropout=-0.1), r"'dropout' in \[0, 1\], got -0.1"),
        (lambda: SimplifiedAttention(scale=NAN), r"'scale' in \[-inf, inf\), got nan"),
        (lambda: SimplifiedAttention(scale=INF), r"'scale' to be a finite float, got inf"),
        (lambda: SimplifiedAttention(scale=-INF), r"'scale' to be a finite float, got -inf"),
        (lambda: _transformer_layer(dropout=NAN), r"'dropout' in \[0, 1\], got nan"),
        (lambda: _transformer(dropout=NAN), r"'dropout' in \[0, 1\], got nan"),
        (lambda: _transformer_layer(layer_norm_eps=NAN), r"'layer_norm_eps' in \[0, inf\)"),
        (lambda: _transformer_layer(layer_norm_eps=-1e-5), r"'layer_norm_eps' in \[0, inf\)"),
        (lambda: _transformer_layer(layer_norm_eps=INF), r"'layer_norm_eps' to be a finite"),
        (lambda: _sinusoidal(base=NAN), r"'base' in \[-inf, inf\), got nan"),
        (lambda: _sinusoidal(base=0.0), r"'base' > 0, got 0.0"),
        (lambda: _sinusoidal(base=INF), r"'base' to be a finite float"),
    ],
)
def test_float_hyper_parameters_are_checked_for_range_and_nan(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_float_hyper_parameters_of_the_wrong_type_are_a_type_error():
    with pytest.raises(TypeError, match=r"'dropout' to be a float, got str"):
        SelfAttentionConv(8, dropout="0.1")
    with pytest.raises(TypeError, match=r"'layer_norm_eps' to be a float, got NoneType"):
        _transformer_layer(layer_norm_eps=None)


def _transformer_layer(**kwargs):
    from gnnattn.nn import GraphTransformerLayer

    return GraphTransformerLayer(8, 2, **kwargs)


def _transformer(**kwargs):
    from gnnattn.nn import GraphTransformer

    return GraphTransformer(2, 8, 2, **kwargs)


def _sinusoidal(**kwargs):
    from gnnattn.nn import SinusoidalPositionalEncoding

    return SinusoidalPositionalEncoding(4, **kwargs)


@pytest.mark.parametrize("make", [_transformer_layer, _transformer])
def test_transformer_blocks_refuse_a_pair_of_inputs(make):
    x = torch.randn(4, 8)
    with pytest.raises(TypeError, match="Expected 'x' to be a Tensor.*TransformerConv"):
        make()((x, x))
    with pytest.raises(TypeError, match="Expected 'x' to be a Tensor, got ndarray"):
        make()(x.numpy())


@pytest.mark.parametrize(
    "x, exc, match",
    [
        (torch.randn(5, 6), ValueError, r"'x' of shape \[N, 8\], got \[5, 6\]"),
        (torch.randn(8), ValueError, r"'x' of shape \[N, 8\]"),
        (torch.randn(5, 8, dtype=torch.float64), TypeError, r"'x' of the layer's dtype"),
        ((torch.randn(5, 7), torch.randn(5, 8)), ValueError, r"'x\[0\]' of shape \[N, 8\]"),
        (
            (torch.randn(5, 8), torch.randn(5, 8, dtype=torch.float64)),
            TypeError,
            r"'x\[1\]' of the layer's dtype",
        ),
    ],
)
def test_transformer_conv_names_a_bad_x(x, exc, match):
    """Where PyG's layer raises torch's matmul error (or, for a 1-D x, a node count)."""
    from gnnattn.nn import TransformerConv

    with pytest.raises(exc, match=match):
        TransformerConv(8, 4, heads=2)(x, EI)


def test_gps_conv_names_x_of_another_dtype():
    from gnnattn.nn import GPSConv

    with pytest.raises(TypeError, match=r"'x' of the layer's dtype torch.float32"):
        GPSConv(8, None, heads=2)(X.double(), EI)
    conv = GPSConv(8, None, heads=2, norm=None, attn_edge_dim=3)
    batch = torch.tensor([0, 0, 0, 1, 1])
    with pytest.raises(TypeError, match=r"'attn_edge_attr' of dtype torch.float32 \(the dtype"):
        conv(X, None, batch, attn_edge_attr=torch.randn(13, 3, dtype=torch.float64))


def test_positional_encodings_refuse_integer_x():
    from gnnattn.nn import LearnedPositionalEncoding, SinusoidalPositionalEncoding

    for enc in (SinusoidalPositionalEncoding(4), LearnedPositionalEncoding(4, 4)):
        with pytest.raises(TypeError, match="'x' of a floating dtype, got torch.int64"):
            enc(torch.zeros(2, 4, dtype=torch.long))


@pytest.mark.parametrize("norm_first", [True, False])
def test_graph_transformer_layer_names_x_of_another_width(norm_first):
    from gnnattn.nn import GraphTransformer, GraphTransformerLayer

    for layer in (GraphTransformerLayer(8, 2, norm_first=norm_first), GraphTransformer(1, 8, 2)):
        with pytest.raises(ValueError, match=r"'x' of shape \[N, 8\], got \[5, 4\]"):
            layer(torch.randn(5, 4), EI)


def test_graph_helpers_name_their_bad_arguments(monkeypatch):
    from gnnattn import AttentionGraph, edge_index_to_mask
    from gnnattn.graphs import global_graphs, reorder, with_virtual_nodes
    from gnnattn.graphs.blocks import fill_estimate

    ring = torch.tensor([[0, 1, 2], [1, 2, 0]])
    # The size is checked before 2**30 virtual nodes' edges are made (gigabytes).
    monkeypatch.setattr(global_graphs, "_virtual_edges", lambda *a: pytest.fail("edges made"))
    with pytest.raises(ValueError, match=r"at most \d+ nodes"):
        with_virtual_nodes(ring, 2**30, 3)
    monkeypatch.undo()
    graph = AttentionGraph(ring, 3)
    for block in (0, -8):
        with pytest.raises(ValueError, match=f"'block' to be a positive int, got {block}"):
            fill_estimate(graph, block)
    with pytest.raises(TypeError, match="'block' to be an int or None, got float"):
        fill_estimate(graph, 2.5)
    with pytest.raises(TypeError, match="'num_nodes' to be an int, got float"):
        edge_index_to_mask(ring, 3.0)
    with pytest.raises(ValueError, match=r"'num_nodes' equal to the graph's 3, got 10"):
        reorder(graph, num_nodes=10)
    adj = torch.sparse_csc_tensor(
        torch.tensor([0, 3, 2, 4]), torch.tensor([0, 1, 2, 0]), torch.ones(4), (3, 3)
    )
    with pytest.raises(ValueError, match=r"'edge_index.ccol_indices\(\)' non-decreasing"):
        AttentionGraph(adj)
