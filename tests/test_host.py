"""The compiled host-side scans (``gnnattn.kernels.cpu.host``) against torch and Python."""

from __future__ import annotations

import math

import pytest
import torch

from gnnattn.kernels.cpu.host import batch_lengths, buckets, norm_bound
from gnnattn.ops.sdpa import MAX_PADDING


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_batch_lengths(dtype):
    b = torch.tensor([0, 0, 2, 2, 2, 3], dtype=dtype)  # graph 1 has no node: no run
    assert batch_lengths(b) == torch.unique_consecutive(b, return_counts=True)[1].tolist()
    assert batch_lengths(b) == [2, 3, 1]
    assert batch_lengths(torch.tensor([5, 10**12], dtype=torch.int64)) == [1, 1]
    assert batch_lengths(torch.zeros(0, dtype=dtype)) == []
    assert batch_lengths(torch.tensor([0, 1, 0], dtype=dtype)) == "unsorted"
    assert batch_lengths(torch.tensor([-1, 0, 1], dtype=dtype)) == "negative"
    assert batch_lengths(torch.tensor([1, 0, -1], dtype=dtype)) == "unsorted"  # order first
    assert batch_lengths(torch.tensor([-2, -1, 0], dtype=dtype)) == "negative"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_norm_bound_is_the_2_norm(dtype):
    g = torch.Generator().manual_seed(0)
    packed = torch.randn(37, 3 * 15, generator=g).to(dtype)
    views = [
        packed,
        packed[:, 15:30].view(37, 3, 5),  # a view of a packed projection (rows at a pitch)
        packed.t(),  # not unit-stride rows: copied
        packed[::2],
        packed[:1, :1].expand(5, 7),  # pitch 0
        packed[0],
    ]
    for t in views:
        want = torch.linalg.vector_norm(t.double()).item()
        assert math.isclose(norm_bound(t), want, rel_tol=1e-12), t.shape
        assert norm_bound(t) >= t.abs().max().item()
    assert norm_bound(packed[:0]) == 0.0
    for bad in (float("inf"), float("-inf"), float("nan")):
        t = packed.clone()
        t[20, 7] = bad
        assert not math.isfinite(norm_bound(t[:, 5:20]))
        assert math.isfinite(norm_bound(t[:, 8:20]))  # outside the view: not read


def _runs(lengths):
    """The grouping in Python: sorted longest first (stable), greedy runs."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    runs, i = [], 0
    while i < len(order):
        top, real, j = lengths[order[i]], 0, i
        while j < len(order):
            t = lengths[order[j]]
            if real + t * t < (1.0 - MAX_PADDING) * (j - i + 1) * top * top:
                break
            real, j = real + t * t, j + 1
        runs.append((top, j - i))
        i = j
    return order, runs


@pytest.mark.parametrize(
    "lengths", [(), (1,), (3, 1, 10, 9), (5, 5, 5), tuple(range(1, 60)), (40, 15, 15, 39, 2)]
)
def test_buckets(lengths):
    tops, counts, rows, take, valid = buckets(lengths, MAX_PADDING)
    order, runs = _runs(lengths)
    assert list(zip(tops.tolist(), counts.tolist(), strict=True)) == runs
    starts = [sum(lengths[:b]) for b in range(len(lengths))]
    want_rows, want_valid = [], []
    blocks = iter(order)
    for top, count in runs:
        for _ in range(count):
            b = next(blocks)
            for pos in range(top):
                want_rows.append(starts[b] + min(pos, lengths[b] - 1))
                want_valid.append(pos < lengths[b])
    assert rows.tolist() == want_rows and valid.tolist() == want_valid
    assert [rows[p] for p in take.tolist()] == list(range(sum(lengths)))
