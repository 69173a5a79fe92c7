"""Compressed layouts of an edge set: the destination CSR and the transposed CSR.

Attention reads a graph two ways. The forward and the ``dq`` pass walk the
incoming edges of each target: the destination-sorted CSR (``ptr``, ``col``).
The ``dk``/``dv`` pass walks the outgoing edges of each source: the
transposed CSR (``tptr``, ``trow``, ``tperm``), built from the CSR by one
stable sort. :class:`gnnattn.AttentionGraph` builds each once and keeps it.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .validate import check_edge_index

__all__ = [
    "CSC",
    "CSR",
    "is_sorted_by_target",
    "segment_ids",
    "sort_by_target",
    "to_csr",
    "transpose_csr",
]


def is_sorted_by_target(edge_index: Tensor) -> bool:
    """Whether edges are sorted by target, then source (the builders' order)."""
    if edge_index.shape[1] < 2:
        return True
    src, dst = edge_index[0], edge_index[1]
    d_dst = dst[1:] - dst[:-1]
    ok = (d_dst > 0) | ((d_dst == 0) & (src[1:] >= src[:-1]))
    return bool(ok.all())


def _on_host(t: Tensor) -> bool:
    """Whether the CPU's counting sorts (:mod:`gnnattn.kernels.cpu.layouts`) build the
    layout: a CPU tensor outside ``torch.compile`` and ``torch.jit.trace`` (which trace
    the torch version), with numba installed (without it, the torch version)."""
    if t.device.type != "cpu" or torch.compiler.is_compiling() or torch.jit.is_tracing():
        return False
    from ..kernels import COMPILED

    return "cpu" in COMPILED


def _counts(ids: Tensor, n: int) -> Tensor:
    """How often each id in ``[0, n)`` occurs, ``[n]`` int64.

    ``bincount``'s result has a data-dependent length (it grows past ``n``
    with a larger id), which ``torch.compile`` cannot trace; there the same
    counts come from a scatter of ones into ``n`` slots.
    """
    if not torch.compiler.is_compiling():
        return torch.bincount(ids, minlength=n)
    ones = torch.ones_like(ids, dtype=torch.int64)
    return torch.zeros(n, dtype=torch.int64, device=ids.device).index_add_(0, ids.long(), ones)


def _target_order(edge_index: Tensor, num_src: int | None) -> Tensor:
    """The stable permutation that sorts edges by target, then source."""
    src, dst = edge_index[0].long(), edge_index[1].long()
    n_src = int(src.max()) + 1 if num_src is None else num_src
    # One int64 key, target-major: exact as long as N_dst * N_src < 2^63.
    return torch.argsort(dst * n_src + src, stable=True)


def sort_by_target(edge_index: Tensor, num_src: int | None = None) -> tuple[Tensor, Tensor]:
    """Sort edges by target, then source; returns ``(sorted_edge_index, perm)``.

    ``perm`` maps sorted positions to the input's: ``sorted = edge_index[:, perm]``.
    The sort is stable, so duplicate edges keep their relative order.
    """
    if edge_index.shape[1] == 0:
        return edge_index, torch.zeros(0, dtype=torch.long, device=edge_index.device)
    if num_src is not None and not torch.compiler.is_compiling():
        # A larger source id would make keys of the next target's: unsorted edges.
        check_edge_index(edge_index, num_src, int(edge_index[1].max()) + 1)
    perm = _target_order(edge_index, num_src)
    return edge_index[:, perm], perm


class CSR(NamedTuple):
    """A destination-grouped compressed sparse row view of a graph.

    Attributes:
        ptr: ``[N_dst + 1]`` int64; the incoming edges of target ``i`` are the
            positions ``ptr[i]:ptr[i+1]``.
        col: ``[|E|]`` source of each edge in that order: int64 (int32 when the
            graph was given as an int32 CSR adjacency on the CPU).
        perm: ``[|E|]`` int64, CSR position -> position in the input
            ``edge_index`` (``None`` when the input was already grouped by
            target: then the CSR keeps the input's order).
    """

    ptr: Tensor
    col: Tensor
    perm: Tensor | None


def to_csr(edge_index: Tensor, num_nodes: int, num_src: int | None = None) -> CSR:
    """Destination CSR pointers of ``edge_index``.

    Edges already grouped by target (targets non-decreasing, as the builders
    and PyG's ``sort_edge_index(..., sort_by_row=False)`` give them) are used
    in their own order: ``col`` is a view of ``edge_index[0]``, nothing is
    copied. Other edge sets are sorted by target, then source (stably), and
    only the sorted sources and the permutation are kept.

    Args:
        edge_index (Tensor): ``[2, |E|]``, in any order.
        num_nodes (int): number of targets.
        num_src (int, optional): number of sources (defaults to ``num_nodes``).

    Example:
        >>> from gnnattn.graphs import causal_graph
        >>> to_csr(causal_graph(3), 3).ptr
        tensor([0, 1, 3, 6])
    """
    num_src = num_nodes if num_src is None else num_src
    if not _on_host(edge_index) and not torch.compiler.is_compiling():
        # The host's pass checks the ids as it counts; torch's ops would not.
        check_edge_index(edge_index, num_src, num_nodes)
    return _to_csr(edge_index, num_nodes, num_src)


def _to_csr(edge_index: Tensor, num_nodes: int, num_src: int) -> CSR:
    """:func:`to_csr` of checked edges (an :class:`~gnnattn.AttentionGraph`'s)."""
    if _on_host(edge_index):
        from ..kernels.cpu.layouts import csr_order

        ptr, perm = csr_order(edge_index, num_nodes, num_src)
        col = edge_index[0].long()
        # index_select: a third of advanced indexing's time on a batch of molecules.
        return CSR(ptr, (col if perm is None else col.index_select(0, perm)).contiguous(), perm)
    return _to_csr_torch(edge_index, num_nodes, num_src)


def _to_csr_torch(edge_index: Tensor, num_nodes: int, num_src: int) -> CSR:
    """:func:`to_csr` in torch ops: on any device, and traceable."""
    e = edge_index.shape[1]
    col = edge_index[0].long()
    dst = edge_index[1].long()
    perm: Tensor | None = None
    # Inside torch.compile the order is not read (a data-dependent branch): the
    # edges are sorted, which keeps any order correct.
    if e > 1 and (torch.compiler.is_compiling() or not bool((dst[1:] >= dst[:-1]).all())):
        perm = _target_order(edge_index, num_src)
        col = col[perm]  # the sources only, not a [2, E] copy
    counts = _counts(dst, num_nodes)
    ptr = torch.zeros(num_nodes + 1, dtype=torch.long, device=edge_index.device)
    torch.cumsum(counts, 0, out=ptr[1:])
    return CSR(ptr, col.contiguous(), perm)


class CSC(NamedTuple):
    """The transposed CSR: the edges grouped by source.

    Attributes:
        ptr: ``[N_src + 1]`` int64; the outgoing edges of source ``j`` are
            ``ptr[j]:ptr[j+1]`` in this order.
        row: ``[|E|]`` target of each of them.
        perm: ``[|E|]`` position of each of them in CSR order.

    ``row`` and ``perm`` are int64 from :func:`transpose_csr` by default;
    :class:`~gnnattn.AttentionGraph` keeps them in int32 on the CPU when the
    ids fit.
    """

    ptr: Tensor
    row: Tensor
    perm: Tensor


def segment_ids(ptr: Tensor, num_edges: int | None = None) -> Tensor:
    """The segment (target) of each CSR position, ``[E]`` int64.

    Example:
        >>> segment_ids(torch.tensor([0, 2, 2, 3]))
        tensor([0, 0, 2])
    """
    n = ptr.numel() - 1
    return torch.repeat_interleave(
        torch.arange(n, device=ptr.device), ptr.diff(), output_size=num_edges
    )


def transpose_csr(
    ptr: Tensor, col: Tensor, num_src: int, *, dtype: torch.dtype = torch.int64
) -> CSC:
    """The edges of a destination CSR grouped by source.

    ``perm`` is a stable sort of ``col``, so within a source the edges keep
    their target order and sums over them (the backward's ``dk``, ``dv``) have
    a fixed order on every run.

    Args:
        ptr (Tensor): ``[N + 1]`` CSR pointers.
        col (Tensor): ``[E]`` source of each edge (int64 or int32).
        num_src (int): number of sources ``M``.
        dtype (torch.dtype, optional): of ``row`` and ``perm``: ``torch.int32``
            halves them (``tptr`` stays int64). (default: ``torch.int64``)

    Example:
        >>> tptr, trow, tperm = transpose_csr(torch.tensor([0, 2, 3]), torch.tensor([1, 0, 1]), 2)
        >>> tptr.tolist(), trow.tolist(), tperm.tolist()
        ([0, 1, 3], [0, 0, 1], [1, 0, 2])
    """
    if not _on_host(col) and not torch.compiler.is_compiling() and col.numel():
        # The host's pass checks the ids as it counts; torch's ops would not.
        lo, hi = (int(t) for t in torch.aminmax(col))
        if lo < 0 or hi >= num_src:
            raise ValueError(
                f"Expected 'col' to hold source ids in [0, {num_src}), got {lo if lo < 0 else hi}"
            )
    return _transpose_csr(ptr, col, num_src, dtype)


def _transpose_csr(ptr: Tensor, col: Tensor, num_src: int, dtype: torch.dtype = torch.int64) -> CSC:
    """:func:`transpose_csr` of a checked CSR (an :class:`~gnnattn.AttentionGraph`'s)."""
    if _on_host(col):
        from ..kernels.cpu.layouts import transpose

        return CSC(*transpose(ptr, col, num_src, dtype))
    return _transpose_csr_torch(ptr, col, num_src, dtype)


def _transpose_csr_torch(ptr: Tensor, col: Tensor, num_src: int, dtype: torch.dtype) -> CSC:
    """:func:`transpose_csr` in torch ops: on any device, and traceable."""
    e = col.numel()
    n = ptr.numel() - 1
    tptr = torch.zeros(num_src + 1, dtype=torch.int64, device=col.device)
    if not e and not torch.compiler.is_compiling():
        empty = torch.zeros(0, dtype=dtype, device=col.device)
        return CSC(tptr, empty, empty)
    torch.cumsum(_counts(col, num_src), 0, out=tptr[1:])
    tperm = torch.sort(col, stable=True).indices
    # The target of each CSR position, made in the narrow dtype directly
    # (at 32M edges an int64 copy is 256 MB more at the build's peak).
    rows = torch.repeat_interleave(
        torch.arange(n, dtype=dtype, device=col.device), ptr.diff(), output_size=e
    )
    trow = rows[tperm]
    del rows
    return CSC(tptr, trow, tperm.to(dtype))
