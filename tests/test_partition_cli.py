"""``gnnattn partition``: one file per rank that ``GraphPart.load`` reads back as
``partition(...).part(rank)``; bad inputs are one line and status 2."""

import pytest
import torch

from gnnattn.cli import PARTITION_METHODS, main
from gnnattn.distributed import METHODS, GraphPart, partition


def _graph(n: int = 60, e: int = 240) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    return torch.stack(
        [torch.randint(0, n, (e,), generator=g), torch.randint(0, n, (e,), generator=g)]
    )


def _same(a: GraphPart, b: GraphPart) -> None:
    assert repr(a) == repr(b)
    for name in ("targets", "sources", "halo", "edge_ids", "send_index", "global_edge_index"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert (a.send_counts, a.recv_counts, a.num_interior) == (b.send_counts, b.recv_counts,
                                                               b.num_interior)  # fmt: skip
    assert torch.equal(a.graph.edge_index, b.graph.edge_index)


def test_the_methods_are_the_library_s():
    assert PARTITION_METHODS == METHODS


@pytest.mark.parametrize(
    "method,as_dict,causal",
    [("metis", False, False), ("contiguous", True, True), ("random", True, False)],
)
def test_partition_writes_the_parts_of_partition(tmp_path, capsys, method, as_dict, causal):
    ei = _graph()
    n = 64  # four nodes without edges: only a dict can say so
    path = tmp_path / "g.pt"
    torch.save({"edge_index": ei, "num_nodes": n} if as_dict else ei.int(), path)
    argv = ["partition", str(path), "--parts", "3", "--method", method, "--seed", "1",
            "--out", str(tmp_path / "parts")]  # fmt: skip
    assert main(argv + (["--causal"] if causal else [])) == 0
    out = capsys.readouterr().out
    ref = partition(ei, 3, method=method, num_nodes=n if as_dict else None, causal=causal, seed=1)
    for r in range(3):
        loaded = GraphPart.load(tmp_path / "parts" / f"part-{r}-of-3.pt")
        want = ref.part(r)
        _same(loaded, want)
        line = (f"rank {r}: {want.num_targets:,} targets, {want.halo.numel():,} halo rows, "
                f"{want.num_edges:,} edges")  # fmt: skip
        assert line in out
    assert f"halo rows / owned rows: {100 * ref.halo_fraction():.1f}%" in out


def _error(capsys, argv, *needles):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("gnnattn partition: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, (needle, err)


def test_bad_inputs_are_one_line_and_status_2(tmp_path, capsys):
    out = ["--out", str(tmp_path / "o")]
    good = tmp_path / "good.pt"
    torch.save(_graph(), good)
    _error(capsys, ["partition", str(tmp_path / "missing.pt"), "--parts", "2", *out], "not there")
    _error(capsys, ["partition", str(tmp_path), "--parts", "2", *out], "a folder")
    _error(capsys, ["partition", str(good), "--parts", "0", *out], "--parts", "got 0")
    _error(capsys, ["partition", str(good), "--parts", "2", "--method", "spectral", *out],
           "--method")  # fmt: skip
    _error(capsys, ["partition", str(good), "--parts", "2", "--out", str(good)], "--out")
    text = tmp_path / "text.pt"
    text.write_text("not a tensor")
    _error(capsys, ["partition", str(text), "--parts", "2", *out], "torch.save file")
    cases = {
        "float": (torch.rand(2, 5), "integer edge_index of shape [2, E]"),
        "shape": (torch.zeros(3, 5, dtype=torch.long), "shape [2, E]"),
        "list": ([1, 2], "got list"),
        "nokey": ({"edges": _graph()}, "'edge_index'"),
        "badn": ({"edge_index": _graph(), "num_nodes": 2.5}, "'num_nodes'"),
        "smalln": ({"edge_index": _graph(), "num_nodes": 3}, "number of nodes 3"),
        "negative": (torch.tensor([[0, -1], [1, 0]]), ""),
    }
    for name, (data, needle) in cases.items():
        path = tmp_path / f"{name}.pt"
        torch.save(data, path)
        _error(capsys, ["partition", str(path), "--parts", "2", *out], needle)
