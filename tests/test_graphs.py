import networkx as nx
import pytest
import torch

from gnnattn import (
    AttentionGraph,
    bigbird_graph,
    causal_graph,
    complete_graph,
    dilated_window_graph,
    edge_index_to_mask,
    mask_to_edge_index,
    sliding_window_graph,
    to_csr,
)
from gnnattn.graphs import is_sorted_by_target, sort_by_target


def dense_block_mask(lengths, kind, window=0):
    n = sum(lengths)
    m = torch.zeros(n, n, dtype=torch.bool)
    start = 0
    for t in lengths:
        i = torch.arange(t).view(-1, 1)
        j = torch.arange(t).view(1, -1)
        if kind == "complete":
            b = torch.ones(t, t, dtype=torch.bool)
        elif kind == "causal":
            b = j <= i
        elif kind == "window":
            b = (i - j).abs() <= window
        else:
            b = ((i - j) >= 0) & ((i - j) <= window)
        m[start : start + t, start : start + t] = b
        start += t
    return m


def batch_of(lengths):
    return torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))


@pytest.mark.parametrize("lengths", [[1], [4], [7], [3, 1, 5], [2, 2, 2]])
def test_builders_match_dense_masks(lengths):
    batch = batch_of(lengths) if len(lengths) > 1 else None
    n = sum(lengths)
    cases = [
        (complete_graph(n, batch=batch), dense_block_mask(lengths, "complete")),
        (causal_graph(n, batch=batch), dense_block_mask(lengths, "causal")),
        (sliding_window_graph(n, window=2, batch=batch), dense_block_mask(lengths, "window", 2)),
        (
            sliding_window_graph(n, window=1, batch=batch, causal=True),
            dense_block_mask(lengths, "cwindow", 1),
        ),
    ]
    for ei, mask in cases:
        assert ei.dtype == torch.int64
        assert is_sorted_by_target(ei)
        assert torch.equal(edge_index_to_mask(ei, n), mask)
        # Sorted by target then source is exactly the row-major order of the mask.
        assert torch.equal(mask_to_edge_index(mask), ei)


def test_lesson_edge_counts():
    assert complete_graph(4).shape == (2, 16)
    ei = causal_graph(4)
    assert ei.shape == (2, 10)
    g = nx.DiGraph(ei.T.tolist())
    g.remove_edges_from(nx.selfloop_edges(g))
    assert nx.is_directed_acyclic_graph(g)
    assert not nx.is_directed_acyclic_graph(
        nx.DiGraph(complete_graph(4, self_loops=False).T.tolist())
    )


def test_no_self_loops_and_empty():
    ei = complete_graph(3, self_loops=False)
    assert ei.shape == (2, 6) and bool((ei[0] != ei[1]).all())
    assert complete_graph(0).shape == (2, 0)
    assert causal_graph(batch=torch.zeros(0, dtype=torch.long)).shape == (2, 0)
    assert sliding_window_graph(5, window=0).tolist() == [list(range(5))] * 2


def test_batch_without_num_nodes_and_device():
    b = torch.tensor([0, 0, 1])
    assert complete_graph(batch=b).shape == (2, 5)
    assert complete_graph(3, device="cpu").device.type == "cpu"


def test_csr_pointers_and_unsorted_input():
    ei = causal_graph(4)
    csr = to_csr(ei, 4)
    assert csr.ptr.tolist() == [0, 1, 3, 6, 10]
    assert csr.perm is None
    perm = torch.randperm(ei.shape[1])
    shuffled = ei[:, perm]
    csr2 = to_csr(shuffled, 4)
    assert torch.equal(csr2.ptr, csr.ptr)
    assert torch.equal(csr2.col, csr.col)
    assert torch.equal(shuffled[:, csr2.perm], ei)
    s, p = sort_by_target(shuffled)
    assert torch.equal(s, ei) and torch.equal(shuffled[:, p], ei)


@pytest.mark.parametrize("host", [True, False])
def test_csr_layouts_refuse_ids_out_of_range_on_every_path(host, monkeypatch):
    # The torch path (other devices, no numba) made a corrupt CSR of them.
    import gnnattn.graphs.csr as csr_module
    from gnnattn.graphs import transpose_csr

    if not host:
        monkeypatch.setattr(csr_module, "_on_host", lambda t: False)
    with pytest.raises(ValueError, match=r"edge_index.*3.*got 9"):
        to_csr(torch.tensor([[0, 1, 2], [1, 9, 0]]), 3)
    with pytest.raises(ValueError, match=r"edge_index.*3.*got 7"):
        to_csr(torch.tensor([[0, 1, 7], [0, 1, 2]]), 3)
    with pytest.raises(ValueError, match=r"3.*got 9"):
        transpose_csr(torch.tensor([0, 1, 2, 3]), torch.tensor([0, 1, 9]), 3)
    with pytest.raises(ValueError, match="source ids .* below the number of nodes 2, got 5"):
        sort_by_target(torch.tensor([[5, 0], [0, 1]]), num_src=2)
    csr = to_csr(torch.tensor([[2, 0, 1], [1, 0, 1]]), 3)
    assert csr.ptr.tolist() == [0, 1, 3, 3] and csr.col.tolist() == [0, 1, 2]


def test_isolated_nodes_in_csr():
    ei = torch.tensor([[0, 2], [2, 2]])
    assert to_csr(ei, 4).ptr.tolist() == [0, 0, 0, 2, 2]


def test_int64_arithmetic_near_2_pow_31():
    # A complete graph of 46341 tokens has more than 2^31 edges; building one
    # takes 32 GiB, so check the arithmetic that would overflow in int32: edge
    # positions past 2^31 and source ids past 2^31.
    from gnnattn.graphs.builders import _expand

    deg = torch.tensor([2**31 - 1, 3], dtype=torch.long)
    rowptr = torch.cumsum(deg, 0) - deg
    assert rowptr.tolist() == [0, 2**31 - 1]
    small = _expand(torch.tensor([2, 1]), torch.tensor([2**31 + 5, 7]))
    assert small.tolist() == [[2**31 + 5, 2**31 + 6, 7], [0, 0, 1]]


def test_mask_to_edge_index_takes_bool_masks_only():
    # An additive float mask marks "attend" with 0: read by truth value it gave
    # the strictly upper triangle for nn.Transformer's causal mask.
    additive = torch.nn.Transformer.generate_square_subsequent_mask(3)
    with pytest.raises(TypeError, match="'mask' of dtype torch.bool .* got torch.float32"):
        mask_to_edge_index(additive)
    assert torch.equal(mask_to_edge_index(additive == 0), causal_graph(3))


@pytest.mark.parametrize(
    "build",
    [
        lambda flag: AttentionGraph(causal_graph(3), causal=flag),
        lambda flag: AttentionGraph.window(4, window=1, causal=flag),
        lambda flag: AttentionGraph.from_batch(torch.zeros(3), causal=flag),
        lambda flag: sliding_window_graph(4, window=1, causal=flag),
        lambda flag: dilated_window_graph(4, window=1, dilation=2, causal=flag),
        lambda flag: bigbird_graph(8, block_size=2, causal=flag),
        lambda flag: complete_graph(3, self_loops=flag),
    ],
)
def test_graph_flags_must_be_bools(build):
    # "no" was read by its truth: a causal graph where the caller meant none.
    with pytest.raises(TypeError, match="to be a bool, got str"):
        build("no")
