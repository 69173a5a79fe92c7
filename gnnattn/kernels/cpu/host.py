"""Host-side scans of a call's small inputs, compiled: a batch vector's graph sizes, a
tensor's 2-norm, the buckets of blocks of different lengths.

Each replaces a dozen torch or numpy ops, each a separate pass with its own
dispatch and allocation. On a batch of molecules (a GPSConv step of a few
milliseconds) those fixed costs were a tenth of the step; here each is one
compiled call.
"""

from __future__ import annotations

import math

import numba
import numpy as np
import torch
from torch import Tensor

from . import _cache  # noqa: F401  (before any kernel: the cache's freshness stamp)
from ._simd import _FAST, _NN

__all__ = ["batch_lengths", "buckets", "norm_bound"]


@numba.njit(cache=True, nogil=True)
def _batch_lengths(b: np.ndarray) -> tuple:  # pragma: no cover - compiled
    """``(sorted, negative, counts)`` of a batch vector: the order is checked first (an
    unsorted vector is that, whatever its ids), then the sign of the first id; the
    counts are those of the runs of equal ids (so a huge id costs nothing)."""
    n = b.shape[0]
    for i in range(1, n):
        if b[i] < b[i - 1]:
            return False, False, np.zeros(0, np.int64)
    if n and b[0] < 0:
        return True, True, np.zeros(0, np.int64)
    counts = np.zeros(n, np.int64)
    g = -1
    for i in range(n):
        if i == 0 or b[i] != b[i - 1]:
            g += 1
        counts[g] += 1
    return True, False, counts[: g + 1]


def batch_lengths(batch: Tensor) -> list[int] | str:
    """The node count of each graph of a sorted PyG ``batch`` vector (on the CPU), or why
    it is not one: ``"unsorted"`` or ``"negative"`` (in that order, as the device check
    of :class:`~gnnattn.nn.GPSConv` finds them). Ids no node carries are no graph."""
    ordered, negative, counts = _batch_lengths(batch.contiguous().numpy())
    if not ordered:
        return "unsorted"
    return "negative" if negative else counts.tolist()


@numba.njit(cache=True, nogil=True, fastmath=set(_FAST))
def _square_sum(a: np.ndarray, rows: int, cols: int, stride: int) -> float:  # pragma: no cover
    # Rows of unit stride at a fixed pitch in one contiguous span: each row's loop
    # vectorizes (a strided 2-D array's would not: its inner stride is unknown).
    # In float64: no float32 input's squares overflow it; an inf or NaN makes the sum one.
    s = 0.0
    for i in range(rows):
        base = (i * stride) & _NN  # provably >= 0: no wraparound select per element
        for j in range(cols):
            x = np.float64(a[base + j])
            s += x * x
    return s


def norm_bound(t: Tensor) -> float:
    """``||t||_2`` (an upper bound of ``max |t|``), ``inf`` or NaN when ``t`` holds an inf
    or a NaN (or squares past float64's range); one compiled pass over a CPU tensor,
    read where it lies when its rows are (a view of a packed projection)."""
    if not t.numel():
        return 0.0
    a = t.detach()
    a = a.reshape(a.shape[0], -1) if a.dim() > 1 else a.reshape(1, -1)
    if a.dtype not in (torch.float32, torch.float64):
        a = a.float()
    if a.stride(1) != 1 or a.stride(0) < 0:
        a = a.contiguous()
    rows, cols = a.shape
    pitch = a.stride(0)
    span = a.as_strided(((rows - 1) * pitch + cols,), (1,))
    return math.sqrt(_square_sum(span.numpy(), rows, cols, pitch))


@numba.njit(cache=True, nogil=True)
def _buckets(lens: np.ndarray, max_padding: float) -> tuple:  # pragma: no cover - compiled
    """Blocks sorted by length (longest first, stable) and grouped greedily into runs
    whose padded pairs are at most ``max_padding`` of theirs; each run's length and
    size, and the gather ``rows``, scatter-back ``take`` and ``valid`` flags of
    every padded position."""
    nb = lens.shape[0]
    order = np.argsort(-lens, kind="mergesort")
    tops = np.empty(nb, np.int64)
    counts = np.empty(nb, np.int64)
    runs = 0
    total = 0
    i = 0
    while i < nb:
        top = lens[order[i]]
        real = 0
        j = i
        # A shorter block only adds padding: the run stops at the first one that
        # would take it past the bound.
        while j < nb:
            t = lens[order[j]]
            if real + t * t < (1.0 - max_padding) * (j - i + 1) * top * top:
                break
            real += t * t
            j += 1
        tops[runs] = top
        counts[runs] = j - i
        total += top * (j - i)
        runs += 1
        i = j
    starts = np.empty(nb, np.int64)
    acc = 0
    for b in range(nb):
        starts[b] = acc
        acc += lens[b]
    rows = np.empty(total, np.int64)
    valid = np.empty(total, np.bool_)
    take = np.empty(acc if total else 0, np.int64)
    p = 0
    x = 0
    for r in range(runs):
        for _ in range(counts[r]):
            blk = order[x]
            x += 1
            for pos in range(tops[r]):
                real_row = pos < lens[blk]
                # A padded position repeats its block's last row: real and finite.
                row = starts[blk] + (pos if real_row else lens[blk] - 1)
                rows[p] = row
                valid[p] = real_row
                if real_row:
                    take[row] = p
                p += 1
    return tops[:runs], counts[:runs], rows, take, valid


def buckets(lengths: tuple[int, ...], max_padding: float) -> tuple[np.ndarray, ...]:
    """:func:`_buckets` of a tuple of block lengths: ``(tops, counts, rows, take, valid)``."""
    return _buckets(np.asarray(lengths, np.int64), float(max_padding))
