r"""Split a graph by target over P ranks: METIS, contiguous blocks or random.

Every rank owns a set of targets and **all** their incoming edges, so each
softmax stays on one rank and the only thing ranks exchange is the key and
value rows of the sources a rank's edges read but another rank owns (its
*halo*). :func:`partition` decides the owners once; :meth:`Partition.part`
builds one rank's :class:`~gnnattn.distributed.GraphPart` (its local graph
and its send/receive lists), and :meth:`Partition.save` writes one file per
rank for graphs too large to partition on every rank.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..checks import check_int, check_tensor
from ..graphs import AttentionGraph
from .part import GraphPart

__all__ = ["METHODS", "Partition", "partition"]

#: The partitioning methods :func:`partition` takes.
METHODS = ("metis", "contiguous", "random")


def _weights(graph: AttentionGraph) -> Tensor:
    """Per-target work: in-degree + 1 (the edges a target's softmax reads, and itself)."""
    return graph.csr.ptr.diff() + 1


def _contiguous(graph: AttentionGraph, num_parts: int) -> Tensor:
    """Blocks of consecutive targets with equal work (cuts on the cumulative in-degree + 1)."""
    work = _weights(graph).cumsum(0)
    if work.numel() == 0:
        return torch.zeros(0, dtype=torch.int64)
    total = int(work[-1])
    # A target goes to the block its work's midpoint falls in: balanced, and
    # blocks stay in id order (causal graphs keep their local order).
    mid = work - _weights(graph).div(2, rounding_mode="floor")
    return (mid * num_parts // (total + 1)).clamp_(max=num_parts - 1)


def _random(num_nodes: int, num_parts: int, seed: int) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(num_nodes, generator=g) % num_parts


def _metis(graph: AttentionGraph, num_parts: int, seed: int) -> Tensor:
    try:
        import pymetis
    except ImportError as e:  # pragma: no cover - pymetis is in the dev extra
        raise ImportError(
            "method='metis' needs the 'pymetis' package: pip install 'gnnattn[distributed]'"
        ) from e
    src, dst = graph.edge_index
    weights = _weights(graph)
    n = graph.num_dst
    if graph.is_bipartite:
        # Sources are vertices of their own (after the targets), of weight 1:
        # METIS then keeps a source with the targets that read it.
        src = src + graph.num_dst
        n += graph.num_src
        weights = torch.cat([weights, torch.ones(graph.num_src, dtype=weights.dtype)])
    keep = src != dst  # METIS takes no self-loops
    a = torch.cat([src[keep], dst[keep]]).numpy()
    b = torch.cat([dst[keep], src[keep]]).numpy()
    # Symmetrised, duplicates merged: METIS balances vertex weights and cuts
    # edges, and an edge cut in either direction puts a row in some halo.
    key = np.unique(a.astype(np.int64) * n + b)
    a, b = key // n, key % n
    xadj = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(a, minlength=n), out=xadj[1:])
    opts = pymetis.Options(seed=seed)
    _, membership = pymetis.part_graph(
        num_parts,
        pymetis.CSRAdjacency(adj_starts=xadj, adjacent=b),
        vweights=weights.numpy(),
        options=opts,
    )
    owner = np.asarray(membership, dtype=np.int64)[: graph.num_dst]
    return torch.as_tensor(owner)


def _source_owners(graph: AttentionGraph, owner_dst: Tensor, num_parts: int) -> Tensor:
    """A bipartite graph's sources go to the rank that owns most of their targets
    (fewest halo rows); a source without edges goes to a contiguous block."""
    m = graph.num_src
    src, dst = graph.edge_index
    votes = torch.bincount(src * num_parts + owner_dst[dst], minlength=m * num_parts)
    votes = votes.view(m, num_parts)  # (M, P)
    owner = votes.argmax(1)
    lonely = votes.sum(1) == 0
    owner[lonely] = (torch.arange(m) * num_parts // max(m, 1))[lonely]
    return owner


class Partition:
    """Which rank owns each target (and each source) of a graph.

    Made by :func:`partition`. :meth:`part` builds one rank's
    :class:`~gnnattn.distributed.GraphPart`; :meth:`save` writes every
    rank's part to a file of its own.

    Attributes:
        graph (AttentionGraph): the whole graph (causal edges pruned).
        num_parts (int): P.
        owner (Tensor): ``[N]`` the rank owning each target.
        src_owner (Tensor): ``[M]`` the rank owning each source (``owner``
            itself for a square graph).
        method (str): how ``owner`` was decided.
    """

    def __init__(
        self, graph: AttentionGraph, owner: Tensor, num_parts: int, method: str = "given"
    ) -> None:
        check_int(num_parts, "num_parts", min=1)
        check_tensor(owner, "owner")
        if owner.is_floating_point() or owner.is_complex() or owner.dtype == torch.bool:
            raise TypeError(f"Expected 'owner' of an integer dtype (ranks), got {owner.dtype}")
        if owner.shape != (graph.num_dst,):
            raise ValueError(
                f"Expected 'owner' of shape [{graph.num_dst}] (one rank per target), "
                f"got {list(owner.shape)}"
            )
        if owner.numel() and (int(owner.min()) < 0 or int(owner.max()) >= num_parts):
            raise ValueError(f"Expected 'owner' in [0, {num_parts}), got values outside")
        self.graph = graph
        self.num_parts = num_parts
        self.method = method
        self.owner = owner.to(torch.int64)
        if graph.is_bipartite:
            self.src_owner = _source_owners(graph, self.owner, num_parts)
        else:
            self.src_owner = self.owner

    def part(self, rank: int, group: Any = None) -> GraphPart:
        """Rank ``rank``'s part: its targets, its local graph, its halo and send lists.

        ``group`` is the process group of the exchange (default: the world; a
        group of its own under DDP, see :mod:`gnnattn.distributed.exchange`).
        """
        check_int(rank, "rank")
        if not 0 <= rank < self.num_parts:
            raise ValueError(f"Expected 'rank' in [0, {self.num_parts}), got {rank}")
        return GraphPart.build(
            self.graph, self.owner, self.src_owner, rank, self.num_parts, group=group
        )

    def halo_fraction(self) -> float:
        """Halo rows over owned rows, summed over the ranks (the exchange's volume)."""
        src, dst = self.graph.edge_index
        remote = self.src_owner[src] != self.owner[dst]
        key = torch.unique(self.owner[dst[remote]] * self.graph.num_src + src[remote])
        return key.numel() / max(self.graph.num_src, 1)

    def save(self, folder: str | os.PathLike) -> list[Path]:
        """One file per rank, ``part-{rank}-of-{P}.pt``, for :meth:`GraphPart.load`."""
        return [self.save_part(folder, r) for r in range(self.num_parts)]

    def save_part(self, folder: str | os.PathLike, rank: int) -> Path:
        """Rank ``rank``'s file of :meth:`save` alone (``folder`` made if missing): a
        caller can show progress, or write the parts from several processes.

        Example:
            >>> import tempfile
            >>> from gnnattn.distributed import GraphPart, partition
            >>> p = partition(AttentionGraph.causal(6), 2, method="contiguous")
            >>> with tempfile.TemporaryDirectory() as d:
            ...     GraphPart.load(p.save_part(d, 1))
            GraphPart(rank=1, world_size=2, num_targets=2, num_halo=4, num_edges=11)
        """
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"part-{rank}-of-{self.num_parts}.pt"
        self.part(rank).save(path)
        return path

    def __repr__(self) -> str:
        return (
            f"Partition(num_parts={self.num_parts}, method={self.method!r}, "
            f"num_nodes={self.graph.num_dst}, num_edges={self.graph.num_edges})"
        )


def partition(
    graph: AttentionGraph | Tensor,
    num_parts: int,
    *,
    method: str = "metis",
    num_nodes: int | None = None,
    causal: bool = False,
    seed: int = 0,
) -> Partition:
    r"""Split ``graph`` by target over ``num_parts`` ranks.

    Each rank owns a set of targets with all their incoming edges, so the
    softmax of every target is computed on one rank; the rank needs, besides
    its own rows, the key/value rows of the remote sources of its edges (its
    halo), which the layer exchanges.

    Args:
        graph (AttentionGraph or Tensor): the whole graph (or its
            ``[2, |E|]`` edge index).
        num_parts (int): P, the number of ranks.
        method (str, optional): ``"metis"`` (METIS through ``pymetis`` on the
            symmetrised graph, vertex weights in-degree + 1 so the edge work
            balances), ``"contiguous"`` (blocks of consecutive ids of equal
            work: causal graphs, or graphs already in a local order, e.g.
            after :func:`gnnattn.reorder`) or ``"random"`` (the baseline).
            (default: ``"metis"``)
        num_nodes (int, optional): N, for an edge index. (default: :obj:`None`)
        causal (bool, optional): keep only the edges :math:`j \le i` (pruned
            here, once, on the whole graph). (default: :obj:`False`)
        seed (int, optional): seeds METIS and the random split. (default: ``0``)

    Returns:
        Partition: the owners; ``.part(rank)`` is one rank's
        :class:`~gnnattn.distributed.GraphPart`.

    Example:
        >>> from gnnattn.distributed import partition
        >>> p = partition(AttentionGraph.causal(6), 2, method="contiguous")
        >>> p.owner
        tensor([0, 0, 0, 0, 1, 1])
        >>> p.part(1)
        GraphPart(rank=1, world_size=2, num_targets=2, num_halo=4, num_edges=11)
    """
    check_int(num_parts, "num_parts", min=1)
    # A 64-bit int, negative ones too (METIS and torch's generator both take them).
    check_int(seed, "seed", min=-(2**63))
    if seed >= 2**63:
        raise ValueError(f"Expected 'seed' below 2**63 (a 64-bit int), got {seed}")
    if method not in METHODS:
        raise ValueError(f"Expected 'method' to be one of {METHODS}, got {method!r}")
    if not isinstance(graph, AttentionGraph):
        graph = AttentionGraph(graph, num_nodes, causal=causal)
    elif num_nodes not in (None, graph.num_dst):
        raise ValueError(
            f"Expected 'num_nodes' None or {graph.num_dst} with an AttentionGraph (it knows "
            f"its size), got {num_nodes}"
        )
    elif causal and not graph.is_causal:
        graph = graph.causal_view()
    graph = graph.cpu()
    if method == "contiguous":
        owner = _contiguous(graph, num_parts)
    elif method == "random":
        owner = _random(graph.num_dst, num_parts, seed)
    elif num_parts == 1 or graph.num_dst <= num_parts:
        owner = _contiguous(graph, num_parts)  # METIS has nothing to cut
    else:
        owner = _metis(graph, num_parts, seed)
    return Partition(graph, owner, num_parts, method)
