r"""Edge sets for attention: complete, causal, sliding-window and batched graphs.

PyG's convention throughout: ``edge_index[0]`` is the source :math:`j` (the
sender), ``edge_index[1]`` the target :math:`i` (the receiver); messages flow
:math:`j \to i`, and attention normalizes over the incoming edges of each
target. In the dense picture row :math:`i` of the attention matrix holds the
weights of target :math:`i`, so ``mask[i, j]`` is true iff the edge
:math:`j \to i` exists.

Every builder returns int64 edges sorted by target, then source, so CSR
pointers (:func:`to_csr`) come for free. All index arithmetic is int64: a graph
with close to :math:`2^{31}` edges does not overflow.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

__all__ = [
    "CSR",
    "causal_graph",
    "check_edge_index",
    "complete_graph",
    "edge_index_to_mask",
    "is_sorted_by_target",
    "mask_to_edge_index",
    "sliding_window_graph",
    "sort_by_target",
    "to_csr",
]


def _as_device(device: torch.device | str | None, fallback: Tensor | None) -> torch.device:
    if device is not None:
        return torch.device(device)
    if fallback is not None:
        return fallback.device
    return torch.device("cpu")


def _check_batch(batch: Tensor) -> Tensor:
    if not isinstance(batch, Tensor):
        raise TypeError(f"Expected 'batch' to be a Tensor, got {type(batch).__name__}")
    if batch.dim() != 1:
        raise ValueError(f"Expected 'batch' of shape [N], got {list(batch.shape)}")
    if batch.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"Expected 'batch' of dtype torch.int64, got {batch.dtype}")
    batch = batch.long()
    if batch.numel() > 0:
        if int(batch.min()) < 0:
            raise ValueError("Expected 'batch' to hold graph ids >= 0, got a negative id")
        if bool((batch[1:] < batch[:-1]).any()):
            raise ValueError(
                "Expected 'batch' to be sorted (nodes of one graph contiguous, as in a "
                "PyG Batch), got an unsorted vector"
            )
    return batch


def _sequence_layout(
    num_nodes: int | None, batch: Tensor | None, device: torch.device | str | None
) -> tuple[Tensor, Tensor, torch.device]:
    """Per node: the first node of its sequence and the length of its sequence."""
    if batch is None:
        if num_nodes is None:
            raise ValueError("Expected 'num_nodes' or 'batch', got neither")
        if isinstance(num_nodes, bool) or not isinstance(num_nodes, int):
            raise TypeError(f"Expected 'num_nodes' to be an int, got {type(num_nodes).__name__}")
        if num_nodes < 0:
            raise ValueError(f"Expected 'num_nodes' >= 0, got {num_nodes}")
        dev = _as_device(device, None)
        start = torch.zeros(num_nodes, dtype=torch.long, device=dev)
        length = torch.full((num_nodes,), num_nodes, dtype=torch.long, device=dev)
        return start, length, dev
    batch = _check_batch(batch)
    if num_nodes is not None and num_nodes != batch.numel():
        raise ValueError(f"Expected 'batch' of length num_nodes={num_nodes}, got {batch.numel()}")
    dev = _as_device(device, batch)
    batch = batch.to(dev)
    if batch.numel() == 0:
        empty = batch.new_zeros(0)
        return empty, empty, dev
    counts = torch.bincount(batch)
    starts = torch.cumsum(counts, 0) - counts
    return starts[batch], counts[batch], dev


def _expand(deg: Tensor, first_src: Tensor) -> Tensor:
    """Edges for targets ``i`` with sources ``first_src[i] + 0 .. deg[i]-1``."""
    n = deg.numel()
    total = int(deg.sum()) if n else 0
    dst = torch.repeat_interleave(torch.arange(n, device=deg.device), deg, output_size=total)
    rowptr = torch.cumsum(deg, 0) - deg  # (N,) first edge position of each target
    offset = torch.arange(total, device=deg.device) - rowptr[dst]
    src = first_src[dst] + offset
    return torch.stack([src, dst])


def complete_graph(
    num_nodes: int | None = None,
    *,
    batch: Tensor | None = None,
    self_loops: bool = True,
    device: torch.device | str | None = None,
) -> Tensor:
    r"""The complete directed graph: every token attends to every token.

    With ``batch`` (a PyG batch vector), one complete graph per sequence, so the
    result is block-diagonal in the dense picture.

    .. math::
        \mathcal{E} = \{(j, i) : \text{batch}_j = \text{batch}_i\}

    Args:
        num_nodes (int, optional): number of tokens :math:`T` (may be omitted
            when ``batch`` is given). (default: :obj:`None`)
        batch (Tensor, optional): sorted graph id of every node, ``[N]``.
            (default: :obj:`None`)
        self_loops (bool, optional): keep the edges :math:`i \to i`.
            (default: :obj:`True`)
        device (torch.device, optional): where to build the edges; defaults to
            ``batch``'s device, else the CPU. (default: :obj:`None`)

    Shapes:
        - **output:** ``[2, |E|]`` int64, sorted by target then source;
          :math:`|E| = \sum_b T_b^2` (minus :math:`N` without self-loops).

    Example:
        >>> complete_graph(2)
        tensor([[0, 1, 0, 1],
                [0, 0, 1, 1]])
        >>> complete_graph(4).shape
        torch.Size([2, 16])
    """
    start, length, _ = _sequence_layout(num_nodes, batch, device)
    edge_index = _expand(length, start)
    if not self_loops:
        edge_index = edge_index[:, edge_index[0] != edge_index[1]]
    return edge_index


def causal_graph(
    num_nodes: int | None = None,
    *,
    batch: Tensor | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    r"""The causal graph: token :math:`i` attends to tokens :math:`j \le i`.

    A lower-triangular DAG once the self-loops are set aside; with ``batch``,
    one per sequence (positions counted from each sequence's first node).

    .. math::
        \mathcal{E} = \{(j, i) : j \le i,\ \text{batch}_j = \text{batch}_i\}

    Args:
        num_nodes (int, optional): number of tokens :math:`T`.
            (default: :obj:`None`)
        batch (Tensor, optional): sorted graph id of every node, ``[N]``.
            (default: :obj:`None`)
        device (torch.device, optional): where to build the edges.
            (default: :obj:`None`)

    Shapes:
        - **output:** ``[2, |E|]`` int64 with :math:`|E| = \sum_b T_b (T_b+1)/2`.

    Example:
        >>> causal_graph(3)
        tensor([[0, 0, 1, 0, 1, 2],
                [0, 1, 1, 2, 2, 2]])
    """
    start, _, dev = _sequence_layout(num_nodes, batch, device)
    pos = torch.arange(start.numel(), device=dev) - start  # position within the sequence
    return _expand(pos + 1, start)


def sliding_window_graph(
    num_nodes: int | None = None,
    *,
    window: int,
    batch: Tensor | None = None,
    causal: bool = False,
    device: torch.device | str | None = None,
) -> Tensor:
    r"""Local attention: token :math:`i` attends to tokens within ``window`` of it.

    .. math::
        \mathcal{E} = \{(j, i) : |i - j| \le w\}
        \quad\text{or, causal,}\quad \{(j, i) : 0 \le i - j \le w\}

    within each sequence of ``batch``.

    Args:
        num_nodes (int, optional): number of tokens :math:`T`.
            (default: :obj:`None`)
        window (int): the half-width :math:`w \ge 0` (``0`` keeps only
            self-loops).
        batch (Tensor, optional): sorted graph id of every node, ``[N]``.
            (default: :obj:`None`)
        causal (bool, optional): only look back. (default: :obj:`False`)
        device (torch.device, optional): where to build the edges.
            (default: :obj:`None`)

    Shapes:
        - **output:** ``[2, |E|]`` int64, :math:`|E| \le T (2w + 1)`.

    Example:
        >>> sliding_window_graph(3, window=1)
        tensor([[0, 1, 0, 1, 2, 1, 2],
                [0, 0, 1, 1, 1, 2, 2]])
    """
    if isinstance(window, bool) or not isinstance(window, int):
        raise TypeError(f"Expected 'window' to be an int, got {type(window).__name__}")
    if window < 0:
        raise ValueError(f"Expected 'window' >= 0, got {window}")
    start, length, dev = _sequence_layout(num_nodes, batch, device)
    pos = torch.arange(start.numel(), device=dev) - start
    lo = (pos - window).clamp_min(0)
    hi = pos if causal else torch.minimum(pos + window, length - 1)
    return _expand(hi - lo + 1, start + lo)


def check_edge_index(
    edge_index: Tensor,
    num_src: int,
    num_dst: int | None = None,
    *,
    name: str = "edge_index",
    device: torch.device | None = None,
) -> None:
    """Raise ``TypeError``/``ValueError`` if ``edge_index`` is not a valid edge list.

    Args:
        edge_index (Tensor): ``[2, E]`` integer tensor.
        num_src (int): number of source nodes (ids in row 0 must be below it).
        num_dst (int, optional): number of target nodes; defaults to ``num_src``.
        name (str, optional): the argument name used in messages.
        device (torch.device, optional): the device ``edge_index`` must be on.
    """
    num_dst = num_src if num_dst is None else num_dst
    if not isinstance(edge_index, Tensor):
        raise TypeError(f"Expected '{name}' to be a Tensor, got {type(edge_index).__name__}")
    if edge_index.dim() != 2 or edge_index.shape[0] != 2:
        raise ValueError(f"Expected '{name}' of shape [2, E], got {list(edge_index.shape)}")
    if edge_index.dtype not in (torch.int64, torch.int32):
        raise TypeError(
            f"Expected '{name}' of dtype torch.int64 (or int32), got {edge_index.dtype}"
        )
    if device is not None and edge_index.device != device:
        raise ValueError(
            f"Expected '{name}' on device {device} (the device of x), got {edge_index.device}"
        )
    if edge_index.numel() == 0:
        return
    lo = int(edge_index.min())
    if lo < 0:
        raise ValueError(f"Expected '{name}' to hold node ids >= 0, got {lo}")
    src_max, dst_max = int(edge_index[0].max()), int(edge_index[1].max())
    if src_max >= num_src:
        raise ValueError(
            f"Expected source ids in '{name}'[0] below the number of nodes {num_src}, got {src_max}"
        )
    if dst_max >= num_dst:
        raise ValueError(
            f"Expected target ids in '{name}'[1] below the number of nodes {num_dst}, got {dst_max}"
        )


def edge_index_to_mask(edge_index: Tensor, num_nodes: int, num_src: int | None = None) -> Tensor:
    r"""The dense boolean mask of a graph: ``mask[i, j]`` is true iff edge :math:`j \to i`.

    Args:
        edge_index (Tensor): ``[2, |E|]``.
        num_nodes (int): number of targets (rows).
        num_src (int, optional): number of sources (columns); defaults to
            ``num_nodes``.

    Shapes:
        - **output:** ``[N_dst, N_src]`` bool.

    Example:
        >>> edge_index_to_mask(causal_graph(3), 3)
        tensor([[ True, False, False],
                [ True,  True, False],
                [ True,  True,  True]])
    """
    num_src = num_nodes if num_src is None else num_src
    check_edge_index(edge_index, num_src, num_nodes)
    mask = torch.zeros(num_nodes, num_src, dtype=torch.bool, device=edge_index.device)
    mask[edge_index[1], edge_index[0]] = True
    return mask


def mask_to_edge_index(mask: Tensor) -> Tensor:
    r"""The edges of a dense mask (``mask[i, j]`` true iff :math:`j \to i`), sorted by target.

    Shapes:
        - **input:** ``[N_dst, N_src]`` bool.
        - **output:** ``[2, |E|]`` int64.

    Example:
        >>> mask_to_edge_index(torch.tensor([[True, False], [True, True]]))
        tensor([[0, 0, 1],
                [0, 1, 1]])
    """
    if not isinstance(mask, Tensor):
        raise TypeError(f"Expected 'mask' to be a Tensor, got {type(mask).__name__}")
    if mask.dim() != 2:
        raise ValueError(f"Expected 'mask' of shape [N, N], got {list(mask.shape)}")
    # nonzero() walks row-major, that is by target i, then source j.
    i, j = mask.bool().nonzero(as_tuple=True)
    return torch.stack([j, i])


def is_sorted_by_target(edge_index: Tensor) -> bool:
    """Whether edges are sorted by target, then source (the builders' order)."""
    if edge_index.shape[1] < 2:
        return True
    src, dst = edge_index[0], edge_index[1]
    d_dst = dst[1:] - dst[:-1]
    ok = (d_dst > 0) | ((d_dst == 0) & (src[1:] >= src[:-1]))
    return bool(ok.all())


def sort_by_target(edge_index: Tensor, num_src: int | None = None) -> tuple[Tensor, Tensor]:
    """Sort edges by target, then source; returns ``(sorted_edge_index, perm)``.

    ``perm`` maps sorted positions to the input's: ``sorted = edge_index[:, perm]``.
    The sort is stable, so duplicate edges keep their relative order.
    """
    if edge_index.shape[1] == 0:
        return edge_index, torch.zeros(0, dtype=torch.long, device=edge_index.device)
    src, dst = edge_index[0].long(), edge_index[1].long()
    n_src = int(src.max()) + 1 if num_src is None else num_src
    # One int64 key, target-major: exact as long as N_dst * N_src < 2^63.
    perm = torch.argsort(dst * n_src + src, stable=True)
    return edge_index[:, perm], perm


class CSR(NamedTuple):
    """A destination-sorted compressed sparse row view of a graph.

    Attributes:
        ptr: ``[N_dst + 1]`` int64; the incoming edges of target ``i`` are the
            sorted positions ``ptr[i]:ptr[i+1]``.
        col: ``[|E|]`` int64 source of each sorted edge.
        perm: ``[|E|]`` int64, sorted position -> position in the input
            ``edge_index`` (``None`` when the input was already sorted).
    """

    ptr: Tensor
    col: Tensor
    perm: Tensor | None


def to_csr(edge_index: Tensor, num_nodes: int, num_src: int | None = None) -> CSR:
    """Destination-sorted CSR pointers of ``edge_index``.

    Args:
        edge_index (Tensor): ``[2, |E|]``, in any order.
        num_nodes (int): number of targets.
        num_src (int, optional): number of sources (defaults to ``num_nodes``).

    Example:
        >>> to_csr(causal_graph(3), 3).ptr
        tensor([0, 1, 3, 6])
    """
    num_src = num_nodes if num_src is None else num_src
    perm: Tensor | None = None
    if not is_sorted_by_target(edge_index):
        edge_index, perm = sort_by_target(edge_index, num_src)
    dst = edge_index[1].long()
    counts = torch.bincount(dst, minlength=num_nodes) if dst.numel() else dst.new_zeros(num_nodes)
    ptr = torch.zeros(num_nodes + 1, dtype=torch.long, device=edge_index.device)
    torch.cumsum(counts, 0, out=ptr[1:])
    return CSR(ptr, edge_index[0].long().contiguous(), perm)
