"""Validation of the graph arguments: ``edge_index`` and ``batch``.

The one place where these are checked; the builders, the graph object and
the layers all call it. Messages name the argument, what was expected and
what came.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..checks import check_tensor

__all__ = ["check_batch", "check_edge_index", "check_edge_index_static"]


def check_edge_index_static(
    edge_index: object, *, name: str = "edge_index", device: torch.device | None = None
) -> Tensor:
    """The checks of :func:`check_edge_index` that read no tensor values.

    Shape, dtype and device are known while ``torch.compile`` traces; reading
    ``edge_index.max()`` is not (it would break the graph).
    """
    ei = check_tensor(edge_index, name)
    if ei.layout != torch.strided:
        raise TypeError(
            f"Expected '{name}' as a dense [2, E] tensor here, got layout {ei.layout}; "
            "AttentionGraph also takes a sparse adjacency in COO, CSR or CSC layout"
        )
    if ei.dim() != 2 or ei.shape[0] != 2:
        raise ValueError(f"Expected '{name}' of shape [2, E], got {list(ei.shape)}")
    if ei.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"Expected '{name}' of dtype torch.int64 (or int32), got {ei.dtype}")
    if device is not None and ei.device != device:
        raise ValueError(f"Expected '{name}' on device {device} (the device of x), got {ei.device}")
    return ei


def check_edge_index(
    edge_index: object,
    num_src: int,
    num_dst: int | None = None,
    *,
    name: str = "edge_index",
    device: torch.device | None = None,
) -> Tensor:
    """Raise ``TypeError``/``ValueError`` unless ``edge_index`` is a valid edge list.

    Args:
        edge_index (Tensor): ``[2, E]`` integer tensor.
        num_src (int): number of source nodes (ids in row 0 must be below it).
        num_dst (int, optional): number of target nodes; defaults to ``num_src``.
        name (str, optional): the argument name used in messages.
        device (torch.device, optional): the device ``edge_index`` must be on.

    Returns:
        ``edge_index``, typed as a tensor.

    Example:
        >>> check_edge_index(torch.tensor([[0, 3], [1, 1]]), 3)
        Traceback (most recent call last):
        ...
        ValueError: Expected source ids in 'edge_index'[0] below the number of nodes 3, got 3
    """
    num_dst = num_src if num_dst is None else num_dst
    ei = check_edge_index_static(edge_index, name=name, device=device)
    if ei.numel() == 0:
        return ei
    # One pass over the edges for all four bounds.
    lo, hi = torch.aminmax(ei, dim=1)
    lo_s, lo_d = lo.tolist()
    hi_s, hi_d = hi.tolist()
    if min(lo_s, lo_d) < 0:
        raise ValueError(f"Expected '{name}' to hold node ids >= 0, got {min(lo_s, lo_d)}")
    if hi_s >= num_src:
        raise ValueError(
            f"Expected source ids in '{name}'[0] below the number of nodes {num_src}, got {hi_s}"
        )
    if hi_d >= num_dst:
        raise ValueError(
            f"Expected target ids in '{name}'[1] below the number of nodes {num_dst}, got {hi_d}"
        )
    return ei


def assert_edge_index(edge_index: Tensor, num_src: int, num_dst: int) -> None:
    """:func:`check_edge_index`'s bounds inside ``torch.compile`` or ``torch.export``,
    where the ids cannot be read: an assertion in the traced program, which raises a
    ``RuntimeError`` when it runs (on CUDA on the device, with no host synchronisation).
    Unchecked, an id out of range would be read as another node's (a negative target
    wraps around in compiled code)."""
    src, dst = edge_index[0], edge_index[1]
    ok = ((src >= 0) & (src < num_src)).all() & ((dst >= 0) & (dst < num_dst)).all()
    torch._assert_async(
        ok,
        "Expected every id of 'edge_index' in range: sources (row 0) in [0, num_src), "
        "targets (row 1) in [0, num_nodes)",
    )


def check_batch(
    batch: object, num_nodes: int | None = None, *, device: torch.device | None = None
) -> Tensor:
    """``batch`` as int64 after checking it is a sorted ``[N]`` vector of graph ids.

    Args:
        batch (Tensor): graph id of every node, as in a PyG ``Batch``.
        num_nodes (int, optional): the length it must have (the rows of ``x``).
        device (torch.device, optional): the device it must be on.

    Example:
        >>> check_batch(torch.tensor([0, 0, 1]))
        tensor([0, 0, 1])
        >>> check_batch(torch.tensor([[0, 1]]))
        Traceback (most recent call last):
        ...
        ValueError: Expected 'batch' of shape [N], got [1, 2]
    """
    b = check_tensor(batch, "batch")
    if b.dim() != 1:
        raise ValueError(f"Expected 'batch' of shape [N], got {list(b.shape)}")
    if b.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"Expected 'batch' of dtype torch.int64 or torch.int32, got {b.dtype}")
    if num_nodes is not None and b.numel() != num_nodes:
        raise ValueError(
            f"Expected 'batch' of length {num_nodes} (one id per row of x), got {b.numel()}"
        )
    if device is not None and b.device != device:
        raise ValueError(f"Expected 'batch' on device {device} (the device of x), got {b.device}")
    b = b.long()
    if b.numel() > 0:
        if bool((b[1:] < b[:-1]).any()):
            raise ValueError(
                "Expected 'batch' to be sorted (nodes of one graph contiguous, as in a "
                "PyG Batch), got an unsorted vector"
            )
        if int(b[0]) < 0:  # sorted: the first id is the smallest
            raise ValueError(f"Expected 'batch' to hold graph ids >= 0, got {int(b[0])}")
        # No bound on the ids: PyG's graph ids count empty graphs too (a Batch
        # of [empty, empty, g] gives g's nodes id 2), and the graphs are read as
        # runs of equal ids, so an id of 10**12 costs nothing.
    return b
