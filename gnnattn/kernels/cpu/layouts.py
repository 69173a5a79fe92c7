"""A graph's CSR, transposed CSR and work split on the CPU, each in one compiled pass.

The torch versions (:func:`gnnattn.graphs.to_csr`, :func:`~gnnattn.graphs.transpose_csr`)
sort: an ``argsort`` of ``E`` keys, a ``bincount``, a ``cumsum``, a
``repeat_interleave`` and a gather, each a separate pass over the edges with
its own allocation and dispatch. On a batch of small graphs (a few thousand
edges, where a training step lasts a millisecond or two) those fixed costs
were a sixth of the step. Here each layout is a counting sort: one pass to
count, one to place, ``O(N + E)`` and stable, so the results are exactly the
torch versions' (the same order, the same ties), which the tests check.

:func:`split` makes the work split of :mod:`.plans` (chunks and hub pieces), packed
as :func:`.plans.plan_tensors` gives it, in one compiled call instead of a dozen
numpy ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import numba
import numpy as np
import torch
from torch import Tensor

from . import _cache  # noqa: F401  (before any kernel: the cache's freshness stamp)

# Serial: one pass over the edges is memory-bound and short next to the kernels.
_JIT: Mapping[str, Any] = MappingProxyType(dict(cache=True, nogil=True))

__all__ = ["csc_planned", "csr_order", "csr_planned", "rows_are_ranges", "split", "transpose"]


@numba.njit(**_JIT)
def _first_outside(ids: np.ndarray, n: int) -> int:
    for i in range(ids.shape[0]):
        if ids[i] < 0 or ids[i] >= n:
            return i
    return -1


def _ids(t: Tensor, n: int, name: str) -> np.ndarray:
    """``t`` as a numpy array, every id checked in ``[0, n)``: the sorts below index
    arrays with them unchecked (compiled code does not bounds-check)."""
    a = t.contiguous().numpy()
    bad = _first_outside(a, n)
    if bad >= 0:
        raise ValueError(f"Expected every id of '{name}' in [0, {n}), got {int(a[bad])}")
    return a


@numba.njit(**_JIT)
def _well_formed(ptr: np.ndarray, num_edges: int) -> bool:
    if ptr.shape[0] == 0 or ptr[0] != 0 or ptr[-1] != num_edges:
        return False
    for i in range(1, ptr.shape[0]):
        if ptr[i] < ptr[i - 1]:
            return False
    return True


@numba.njit(**_JIT)
def _grouped(dst: np.ndarray) -> bool:
    for i in range(1, dst.shape[0]):
        if dst[i] < dst[i - 1]:
            return False
    return True


@numba.njit(**_JIT)
def _counting_sort(keys: np.ndarray, order: np.ndarray, num_keys: int) -> tuple:
    """``order`` stably sorted by ``keys[order]``, and the ``[num_keys + 1]`` pointers."""
    ptr = np.zeros(num_keys + 1, np.int64)
    for i in range(order.shape[0]):
        ptr[keys[order[i]] + 1] += 1
    for i in range(num_keys):
        ptr[i + 1] += ptr[i]
    fill = ptr[:-1].copy()
    out = np.empty_like(order)
    for i in range(order.shape[0]):
        e = order[i]
        k = keys[e]
        out[fill[k]] = e
        fill[k] += 1
    return out, ptr


@numba.njit(**_JIT)
def _csr(src: np.ndarray, dst: np.ndarray, num_dst: int, num_src: int) -> tuple:
    e = dst.shape[0]
    if _grouped(dst):
        ptr = np.zeros(num_dst + 1, np.int64)
        for i in range(e):
            ptr[dst[i] + 1] += 1
        for i in range(num_dst):
            ptr[i + 1] += ptr[i]
        return ptr, np.empty(0, np.int64), False
    # Least significant key first: by source, then stably by target, gives the
    # order (target, source, input position) of the torch version's stable argsort.
    by_src, _ = _counting_sort(src, np.arange(e), num_src)
    perm, ptr = _counting_sort(dst, by_src, num_dst)
    return ptr, perm, True


def csr_order(edge_index: Tensor, num_dst: int, num_src: int) -> tuple[Tensor, Tensor | None]:
    """``ptr`` ``[N + 1]`` and the permutation to target order (``None`` when the edges are
    grouped by target already), as :func:`gnnattn.graphs.to_csr` defines them."""
    src = _ids(edge_index[0], num_src, "edge_index[0]")
    dst = _ids(edge_index[1], num_dst, "edge_index[1]")
    ptr, perm, sorted_ = _csr(src, dst, num_dst, num_src)
    return torch.from_numpy(ptr), torch.from_numpy(perm) if sorted_ else None


@numba.njit(**_JIT)
def _transpose(ptr: np.ndarray, col: np.ndarray, num_src: int, trow: np.ndarray) -> tuple:
    tptr = np.zeros(num_src + 1, np.int64)
    for p in range(col.shape[0]):
        tptr[col[p] + 1] += 1
    for j in range(num_src):
        tptr[j + 1] += tptr[j]
    fill = tptr[:-1].copy()
    tperm = np.empty_like(trow)
    # CSR positions in increasing order: a stable sort by source.
    for i in range(ptr.shape[0] - 1):
        for p in range(ptr[i], ptr[i + 1]):
            slot = fill[col[p]]
            tperm[slot] = p
            trow[slot] = i
            fill[col[p]] += 1
    return tptr, tperm


def transpose(
    ptr: Tensor, col: Tensor, num_src: int, dtype: torch.dtype
) -> tuple[Tensor, Tensor, Tensor]:
    """``(tptr, trow, tperm)`` as :func:`gnnattn.graphs.transpose_csr` defines them."""
    if ptr.dtype != torch.int64:
        raise TypeError(f"Expected 'ptr' of dtype torch.int64, got {ptr.dtype}")
    p = ptr.contiguous().numpy()
    if not _well_formed(p, col.shape[0]):
        ends = f"[{int(p[0])}, ..., {int(p[-1])}]" if p.size else "[]"
        raise ValueError(
            f"Expected 'ptr' non-decreasing from 0 to |E| = {col.shape[0]}, got {ends}"
            + (" (not non-decreasing)" if p.size and p[0] == 0 and p[-1] == col.shape[0] else "")
        )
    np_dtype = np.int32 if dtype == torch.int32 else np.int64
    trow = np.empty(col.shape[0], np_dtype)
    tptr, tperm = _transpose(p, _ids(col, num_src, "col"), num_src, trow)
    return torch.from_numpy(tptr), torch.from_numpy(trow), torch.from_numpy(tperm)


@numba.njit(**_JIT)
def _split(ptr: np.ndarray, num_edges: int, k: int, limit: int) -> np.ndarray:
    n = ptr.shape[0] - 1
    deg = ptr[1:] - ptr[:-1]
    hubs = 0
    pieces = 0
    for i in range(n):
        if deg[i] > limit:
            hubs += 1
            pieces += (deg[i] + limit - 1) // limit
    if hubs:
        # Balance on the edges the chunks really run (plus one per node for its
        # own row), not on the hubs they skip.
        work = np.cumsum(np.minimum(deg, limit) + 1)
        total = work[-1] if n else 0
        cuts = np.searchsorted(work, np.linspace(0, total, k + 1), side="left")
    else:
        cuts = np.searchsorted(ptr, np.linspace(0, num_edges, k + 1), side="left")
    cuts[0], cuts[-1] = 0, n
    # Equal cuts (a big segment, or no edges) make empty chunks: dropped.
    bounds = np.unique(cuts)
    kb = bounds.shape[0]
    packed = np.empty(3 + kb + 3 * pieces + hubs + 1, np.int64)
    packed[0], packed[1], packed[2] = kb, pieces, hubs + 1
    packed[3 : 3 + kb] = bounds
    at = 3 + kb
    seg = 3 + kb + 3 * pieces
    packed[seg] = 0
    h = 0
    for i in range(n):
        if deg[i] <= limit:
            continue
        for s in range(ptr[i], ptr[i + 1], limit):
            packed[at], packed[at + 1], packed[at + 2] = i, s, min(s + limit, ptr[i + 1])
            at += 3
        h += 1
        packed[seg + h] = (at - 3 - kb) // 3
    return packed


def split(ptr: Tensor, num_edges: int, chunks: int, limit: int) -> Tensor:
    """The work split of a CSR with ``ptr`` into ``chunks`` chunks, segments longer than
    ``limit`` cut into pieces (see :mod:`.plans`), packed as
    ``[K + 1, P, S + 1, bounds..., pieces..., seg...]``."""
    return torch.from_numpy(_split(ptr.numpy(), num_edges, chunks, limit))


@numba.njit(**_JIT)
def _csr_planned(
    src: np.ndarray, dst: np.ndarray, num_dst: int, num_src: int, k: int, limit: int
) -> tuple:
    e = dst.shape[0]
    for i in range(e):
        if src[i] < 0 or src[i] >= num_src or dst[i] < 0 or dst[i] >= num_dst:
            none = np.empty(0, np.int64)
            return False, none, none, False, none
    ptr, perm, sorted_ = _csr(src, dst, num_dst, num_src)
    return True, ptr, perm, sorted_, _split(ptr, e, k, limit)


def csr_planned(
    edge_index: Tensor, num_dst: int, num_src: int, chunks: int, limit: int
) -> tuple[Tensor, Tensor, Tensor | None, Tensor] | None:
    """``(ptr, col, perm, packed)``: :func:`gnnattn.graphs.to_csr` of an int64 edge index
    and its work split (:func:`split`'s), in one compiled call that
    also checks every id; ``None`` when an id is out of range (nothing is made: the
    caller's check names it).

    On a batch of small graphs the separate passes (a check, the sort, the split),
    each a compiled call behind its own conversions, cost more than the sort.
    """
    src, dst = edge_index[0].contiguous().numpy(), edge_index[1].contiguous().numpy()
    ok, ptr, perm, sorted_, packed = _csr_planned(src, dst, num_dst, num_src, chunks, limit)
    if not ok:
        return None
    col = edge_index[0]
    if sorted_:
        p = torch.from_numpy(perm)
        return torch.from_numpy(ptr), col[p], p, torch.from_numpy(packed)
    return torch.from_numpy(ptr), col.contiguous(), None, torch.from_numpy(packed)


@numba.njit(**_JIT)
def _csc_planned(
    ptr: np.ndarray, col: np.ndarray, num_src: int, trow: np.ndarray, k: int, limit: int
) -> tuple:
    tptr, tperm = _transpose(ptr, col, num_src, trow)
    return tptr, tperm, _split(tptr, col.shape[0], k, limit)


def csc_planned(
    ptr: Tensor, col: Tensor, num_src: int, dtype: torch.dtype, chunks: int, limit: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(tptr, trow, tperm, packed)``: :func:`transpose` of a CSR the caller made from
    checked edges (nothing is checked again) and the split of ``tptr``, in one call."""
    trow = np.empty(col.shape[0], np.int32 if dtype == torch.int32 else np.int64)
    c = col.contiguous().numpy()
    tptr, tperm, packed = _csc_planned(ptr.numpy(), c, num_src, trow, chunks, limit)
    return tuple(torch.from_numpy(a) for a in (tptr, trow, tperm, packed))  # type: ignore[return-value]


@numba.njit(**_JIT)
def _ranges(ptr: np.ndarray, col: np.ndarray) -> bool:
    for i in range(ptr.shape[0] - 1):
        if ptr[i + 1] == ptr[i]:
            return False
        for p in range(ptr[i] + 1, ptr[i + 1]):
            if col[p] != col[p - 1] + 1:
                return False
    return True


def rows_are_ranges(ptr: Tensor, col: Tensor) -> bool:
    """Whether every row of the CSR has sources, and they step by exactly 1 (no gap,
    no duplicate): what :func:`gnnattn.graphs.structure.detect_structure` asks first,
    in one pass that stops at the first row that is not."""
    return bool(_ranges(ptr.numpy(), col.contiguous().numpy()))
