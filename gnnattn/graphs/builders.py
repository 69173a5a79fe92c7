r"""Edge sets for attention: complete, causal, sliding-window, bipartite and batched graphs.

PyG's convention throughout: ``edge_index[0]`` is the source :math:`j` (the
sender), ``edge_index[1]`` the target :math:`i` (the receiver); messages flow
:math:`j \to i`, and attention normalizes over the incoming edges of each
target. In the dense picture row :math:`i` of the attention matrix holds the
weights of target :math:`i`, so ``mask[i, j]`` is true iff the edge
:math:`j \to i` exists.

Every builder returns int64 edges sorted by target, then source, so CSR
pointers come for free. All index arithmetic is int64: a graph with close to
:math:`2^{31}` edges does not overflow. To keep what is known about a built
graph (its structure, its CSR), wrap it in :class:`gnnattn.AttentionGraph`
(``AttentionGraph.causal(T)`` and friends build the object directly).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ..checks import check_bool, check_int, check_tensor
from .validate import check_batch, check_edge_index

__all__ = [
    "resolve_lengths",
    "causal_graph",
    "complete_bipartite_graph",
    "complete_graph",
    "edge_index_to_mask",
    "mask_to_edge_index",
    "sequence_lengths",
    "sliding_window_graph",
    "structured_edge_index",
]


def _as_device(device: torch.device | str | None, fallback: Tensor | None) -> torch.device:
    if device is not None:
        return torch.device(device)
    if fallback is not None:
        return fallback.device
    return torch.device("cpu")


def _sequence_layout(
    num_nodes: int | None, batch: Tensor | None, device: torch.device | str | None
) -> tuple[Tensor, Tensor, torch.device]:
    """Per node: the first node of its sequence and the length of its sequence."""
    if batch is None:
        if num_nodes is None:
            raise ValueError("Expected 'num_nodes' or 'batch', got neither")
        check_int(num_nodes, "num_nodes")
        dev = _as_device(device, None)
        start = torch.zeros(num_nodes, dtype=torch.long, device=dev)
        length = torch.full((num_nodes,), num_nodes, dtype=torch.long, device=dev)
        return start, length, dev
    batch = check_batch(batch, num_nodes)
    dev = _as_device(device, batch)
    batch = batch.to(dev)
    if batch.numel() == 0:
        empty = batch.new_zeros(0)
        return empty, empty, dev
    # The graphs are runs of equal ids (sorted): gaps and huge ids cost nothing.
    _, graph, counts = torch.unique_consecutive(batch, return_inverse=True, return_counts=True)
    starts = torch.cumsum(counts, 0) - counts
    return starts[graph], counts[graph], dev


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
    check_bool(self_loops, "self_loops")
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
    check_int(window, "window")
    check_bool(causal, "causal")
    start, length, dev = _sequence_layout(num_nodes, batch, device)
    # N bounds every sequence's length: a larger window (sys.maxsize) would wrap pos + window.
    window = min(window, start.numel())
    pos = torch.arange(start.numel(), device=dev) - start
    lo = (pos - window).clamp_min(0)
    hi = pos if causal else torch.minimum(pos + window, length - 1)
    return _expand(hi - lo + 1, start + lo)


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
    check_int(num_nodes, "num_nodes")
    check_int(num_src, "num_src", optional=True)
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
    check_tensor(mask, "mask")
    if mask.dtype != torch.bool:
        # A float mask is ambiguous: PyTorch's additive masks mark "attend" with 0
        # (and "masked" with -inf), which a truth value would read inverted.
        raise TypeError(
            f"Expected 'mask' of dtype torch.bool (True = attend), got {mask.dtype}; "
            "for an additive float mask (0 = attend, -inf = masked) pass mask == 0"
        )
    if mask.dim() != 2:
        raise ValueError(f"Expected 'mask' of shape [N, N], got {list(mask.shape)}")
    # nonzero() walks row-major, that is by target i, then source j.
    i, j = mask.nonzero(as_tuple=True)
    return torch.stack([j, i])


def complete_bipartite_graph(
    num_src: int, num_dst: int, *, device: torch.device | str | None = None
) -> Tensor:
    r"""Every target attends to every source: the edges of cross-attention.

    .. math::
        \mathcal{E} = \{(j, i) : 0 \le j < M,\ 0 \le i < N\}

    Args:
        num_src (int): number of sources :math:`M` (keys / values).
        num_dst (int): number of targets :math:`N` (queries).
        device (torch.device, optional): where to build the edges.
            (default: :obj:`None`, the CPU)

    Shapes:
        - **output:** ``[2, M * N]`` int64, sorted by target then source.

    Example:
        >>> complete_bipartite_graph(3, 2)
        tensor([[0, 1, 2, 0, 1, 2],
                [0, 0, 0, 1, 1, 1]])
    """
    check_int(num_src, "num_src")
    check_int(num_dst, "num_dst")
    # Sizes are functions of the arguments alone, so torch.compile traces this.
    src = torch.arange(num_src, device=device).repeat(num_dst)  # (N * M,)
    dst = torch.arange(num_dst, device=device).repeat_interleave(num_src)  # (N * M,)
    return torch.stack([src, dst])


def sequence_lengths(batch: Tensor) -> list[int]:
    """The lengths of the sequences of a validated, sorted ``batch``, in order.

    Graph ids that no node carries (gaps in a PyG batch vector) give no
    sequence.

    Example:
        >>> sequence_lengths(torch.tensor([0, 0, 0, 2, 2]))
        [3, 2]
    """
    if batch.numel() == 0:
        return []
    return torch.unique_consecutive(batch, return_counts=True)[1].tolist()


def structured_edge_index(
    kind: str, lengths: list[int] | tuple[int, ...], window: int = 0, *, device: torch.device
) -> Tensor:
    """The edges of one structured graph per sequence of ``lengths``, sorted by target.

    ``kind`` is ``"complete"``, ``"causal"``, ``"window"`` or
    ``"causal_window"`` (half-width ``window``). Every size here is a function
    of the Python ints ``lengths`` alone, never of tensor values, so
    ``torch.compile`` traces it without a graph break for complete and causal
    graphs (the batched builders above size their output from ``batch``'s
    values). Same edges, same order
    as :func:`complete_graph`, :func:`causal_graph` and
    :func:`sliding_window_graph`.
    """
    blocks = []
    start = 0
    for t in lengths:
        if kind == "complete":
            ei = complete_bipartite_graph(t, t, device=device)
        elif kind == "causal":
            dst, src = torch.tril_indices(t, t, device=device)  # row-major: by target
            ei = torch.stack([src, dst])
        elif kind in ("window", "causal_window"):
            # Sized from a tensor sum: a graph break under torch.compile, but
            # O(T w) memory rather than a T x T triangle.
            ei = sliding_window_graph(
                t, window=window, causal=kind == "causal_window", device=device
            )
        else:
            raise AssertionError(f"unknown structure {kind!r}")
        blocks.append(ei + start)
        start += t
    if not blocks:
        return torch.zeros(2, 0, dtype=torch.long, device=device)
    return blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=1)


def resolve_lengths(
    num_nodes: int | None, batch: Tensor | None, lengths: Sequence[int] | None = None
) -> tuple[tuple[int, ...], Any]:
    """The sequence lengths from exactly one of ``num_nodes``, ``batch``, ``lengths``."""
    if lengths is not None:
        if batch is not None:
            raise ValueError("Expected 'lengths' or 'batch', got both")
        if isinstance(lengths, Tensor) or not isinstance(lengths, (list, tuple)):
            raise TypeError(
                f"Expected 'lengths' to be a list or tuple of ints, got "
                f"{type(lengths).__name__} (pass tensor.tolist() to make the host copy "
                f"explicit)"
            )
        for t in lengths:
            check_int(t, "lengths[i]", min=1)
        total = sum(lengths)
        if num_nodes is not None and num_nodes != total:
            raise ValueError(
                f"Expected 'num_nodes' equal to sum(lengths) = {total}, got {num_nodes}"
            )
        return tuple(int(t) for t in lengths), None
    if batch is None:
        if num_nodes is None:
            raise ValueError("Expected 'num_nodes' or 'batch', got neither")
        check_int(num_nodes, "num_nodes")
        return ((num_nodes,) if num_nodes else ()), None
    b = check_batch(batch, num_nodes)
    return tuple(sequence_lengths(b)), b.device
