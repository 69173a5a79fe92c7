"""The edge sets a graph object is built from: a ``[2, E]`` tensor, an ``EdgeIndex``,
a ``torch.sparse`` ``adj_t``; each checked and brought to one form (its device too)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..checks import check_tensor
from ..kernels.common import check_index, check_ptr
from .csr import CSR, segment_ids
from .validate import assert_edge_index, check_edge_index, check_edge_index_static

__all__ = ["canonical_device", "from_sparse", "normalize", "own_sizes", "plain"]


def plain(edge_index: Tensor) -> Tensor:
    """A ``torch_geometric.EdgeIndex`` (a Tensor subclass) as a plain tensor."""
    as_tensor = getattr(edge_index, "as_tensor", None)
    if type(edge_index) is not Tensor and callable(as_tensor):
        return as_tensor()
    return edge_index


def normalize(
    edge_index: Any, num_nodes: int | None, num_src: int | None, *, check: bool = True
) -> tuple[Tensor | None, int, int | None, CSR | None]:
    """``(edge_index [2, E] int64, num_dst, num_src, csr)`` from any accepted input
    (``edge_index`` is ``None`` for a CSR adjacency: the CSR is the graph).

    ``check=False`` leaves the ids of a ``[2, E]`` tensor unchecked, for a caller that
    checks them in its own pass over the edges."""
    check_tensor(edge_index, "edge_index")
    csr: CSR | None = None
    if edge_index.layout in (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc):
        return from_sparse(edge_index, num_nodes, num_src)
    sizes = getattr(edge_index, "sparse_size", None)
    edge_index = plain(edge_index)
    if callable(sizes):  # torch_geometric.EdgeIndex: (num_rows, num_cols) = (M, N)
        m, n = sizes()
        for name, given, known in (("num_src", num_src, m), ("num_nodes", num_nodes, n)):
            if given is not None and known is not None and given != known:
                raise ValueError(
                    f"Expected '{name}' equal to the EdgeIndex's sparse_size ({known}), got {given}"
                )
        if num_nodes is None and n is not None:
            num_nodes = n
        if num_src is None and m is not None:
            if num_nodes is None:
                # Only the sources' count known: a square graph of that size (ids
                # past it are refused below), not a bipartite one.
                num_nodes = m
            elif m != num_nodes:
                num_src = m  # a rectangular EdgeIndex is a bipartite graph
    ei = check_edge_index_static(edge_index)
    if torch.compiler.is_compiling():
        if num_nodes is None:
            raise ValueError("Expected 'num_nodes' when building a graph under torch.compile")
        if check:
            assert_edge_index(ei, num_src if num_src is not None else num_nodes, num_nodes)
    else:
        if num_nodes is None:
            # Targets are row 1; for a bipartite graph row 0 counts sources.
            rows = ei[1] if num_src is not None else ei
            num_nodes = int(rows.max()) + 1 if ei.numel() else 0
        if check:
            check_edge_index(ei, num_src if num_src is not None else num_nodes, num_nodes)
        if ei.is_inference() or ei.dtype != torch.long:
            # Made outside inference mode, so that autograd can save it
            # later (PyG's gathers do): a copy of an inference tensor, or
            # the int64 version of an int32 one. Once, here.
            with torch.inference_mode(False):
                ei = ei.to(torch.long, copy=ei.is_inference())
            return ei, num_nodes, num_src, csr
    return ei.long(), num_nodes, num_src, csr


def from_sparse(
    adj_t: Tensor, num_nodes: int | None, num_src: int | None
) -> tuple[Tensor | None, int, int | None, CSR | None]:
    if adj_t.dim() != 2:
        raise ValueError(
            f"Expected a sparse 'edge_index' adjacency of shape [N_dst, N_src] (PyG's "
            f"adj_t: row = target, column = source), got {list(adj_t.shape)}"
        )
    n, m = int(adj_t.shape[0]), int(adj_t.shape[1])
    for name, given, known in (("num_nodes", num_nodes, n), ("num_src", num_src, m)):
        if given is not None and given != known:
            raise ValueError(
                f"Expected '{name}' equal to the adjacency's size {known} "
                f"(adj_t is [N_dst, N_src]), got {given}"
            )
    if num_src is None and m != n:
        raise ValueError(
            f"Expected a square adjacency, got [{n}, {m}]; for cross-attention call the "
            f"layer on a pair (x_src, x_dst), or pass num_src={m} to AttentionGraph"
        )
    coo_idx = None
    if adj_t.layout == torch.sparse_coo:
        # Sorted by row (target), then column, duplicates merged. An
        # inference tensor can only be coalesced in inference mode; the
        # stack below copies its indices out as an ordinary tensor.
        with torch.inference_mode(adj_t.is_inference()):
            coo_idx = adj_t.coalesce().indices()
    with torch.inference_mode(False):
        csr: CSR | None = None
        if coo_idx is not None:
            ei = torch.stack([coo_idx[1], coo_idx[0]])
        elif adj_t.layout == torch.sparse_csr:
            # Kept as given (int32 stays int32 on the CPU, whose kernels
            # take it): no [2, E] int64 copy unless someone asks for
            # graph.edge_index (at 32M edges that copy is 512 MB).
            # Copied when the adjacency was made in inference mode (as the
            # [2, E] path does): the graph's tensors are saved for backward,
            # which an inference tensor cannot be.
            copy = adj_t.is_inference()
            col = adj_t.col_indices()
            if col.device.type != "cpu" or col.dtype != torch.int32:
                col = col.to(torch.long, copy=copy)
            elif copy:
                col = col.clone()
            csr = CSR(adj_t.crow_indices().to(torch.long, copy=copy), col, None)
            ei = None
            # torch.sparse does not check its indices by default; the kernels
            # gather by them unchecked, so they are checked here, once.
            check_ptr(csr.ptr, col.numel(), "edge_index.crow_indices()", num_rows=n)
            check_index(col, m, "edge_index.col_indices()")
        else:  # sparse_csc: grouped by column (source)
            cptr, row = adj_t.ccol_indices().long(), adj_t.row_indices().long()
            # Before expanding it.
            check_ptr(cptr, row.numel(), "edge_index.ccol_indices()", num_rows=m)
            ei = torch.stack([segment_ids(cptr, row.numel()), row])
    if ei is not None:
        check_edge_index(ei, m, n)
    return ei, n, (m if num_src is not None else None), csr


def own_sizes(edge_index: Tensor) -> tuple[int, int] | None:
    """``(num_src, num_dst)`` a sparse adjacency or ``EdgeIndex`` carries, if known."""
    if edge_index.layout in (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc):
        if edge_index.dim() == 2:
            return int(edge_index.shape[1]), int(edge_index.shape[0])
        return None
    sizes = getattr(edge_index, "sparse_size", None)
    if callable(sizes):
        m, n = sizes()
        if m is not None and n is not None:
            return int(m), int(n)
    return None


def canonical_device(device: torch.device | str | None) -> torch.device:
    """``device`` with its index, as tensors report theirs (``cuda`` -> ``cuda:0``)."""
    dev = torch.device(device if device is not None else "cpu")
    if dev.type == "cuda" and dev.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    if dev.type == "cpu":
        return torch.device("cpu")
    return dev
