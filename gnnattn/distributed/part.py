r"""What one rank holds of a partitioned graph, and its attention with the halo exchange.

A :class:`GraphPart` is rank :math:`r`'s share of a graph split by target:
its owned targets (local rows ``0 .. N_r - 1``), their incoming edges as a
local graph over ``[owned sources | halo]``, and the lists of the exchange.
A layer called on it (``layer(x_local, part)``) projects its own rows and
calls :meth:`GraphPart.attention`, which

1. starts sending the key and value rows other ranks read (one
   ``all_to_all_single`` with split sizes, asynchronous),
2. meanwhile attends over the *interior* targets (those whose sources are
   all owned: they need nothing from the exchange; they come first in the
   local order),
3. waits, and attends over the *boundary* targets, whose graph reads the
   owned rows they need (:attr:`GraphPart.boundary_sources`) then the halo
   rows.

Both attentions are the unchanged :func:`gnnattn.attention`, so every
backend but ``"sdpa"`` (the local graphs are bipartite) and every option runs
as in one process, and every target's numbers are those of the
single-process run. In the backward, the halo rows' gradients
go back to their owners in one ``all_to_all_single`` and are added there with
``index_add``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch
from torch import Tensor

from ..checks import check_tensor
from ..graphs import AttentionGraph
from ..graphs.csr import CSR, segment_ids
from ..kernels.common import check_index, check_ptr
from ..ops import AttentionOutput, attention
from .exchange import exchange_finish, exchange_start, group_rank

__all__ = ["GraphPart"]


@dataclass
class _Layout:
    """The index arrays of a part (what :meth:`GraphPart.save` writes)."""

    targets: Tensor  # (N_r,) global target ids, interior first
    sources: Tensor  # (M_r,) global ids of the owned sources
    halo: Tensor  # (H_r,) global ids of the halo sources, by owner then id
    # The local edges as a CSR over the targets (a [2, E_r] int64 edge index would
    # be 4x the bytes of this int32 col: the biggest array a rank holds).
    ptr: Tensor  # (N_r + 1,) int64
    col: Tensor  # (E_r,) local source in 0..M_r+H_r, int32 when it fits, by target
    edge_ids: Tensor  # (E_r,) each local edge's position in the given edges, int32 if it fits
    send_index: Tensor  # (S_r,) local source rows to send, by destination rank then id
    send_counts: list[int]
    recv_counts: list[int]
    num_interior: int  # targets 0 .. num_interior - 1 read owned sources only
    num_interior_edges: int


def _layout(
    graph: AttentionGraph, owner: Tensor, src_owner: Tensor, rank: int, world: int
) -> _Layout:
    """One rank's index arrays, in a few vectorised passes over the edges."""
    n, m = graph.num_dst, graph.num_src
    src, dst = graph.edge_index
    own_t = (owner == rank).nonzero().view(-1)
    eids = (owner[dst] == rank).nonzero().view(-1)  # this rank's edges, in given order
    s, d = src[eids], dst[eids]
    remote = src_owner[s] != rank
    boundary = torch.zeros(n, dtype=torch.bool)
    boundary[d[remote]] = True
    targets = torch.cat([own_t[~boundary[own_t]], own_t[boundary[own_t]]])
    tpos = torch.full((n,), -1, dtype=torch.int64)
    tpos[targets] = torch.arange(targets.numel())
    # Edges by local target, stably: each target reads its edges in the same
    # order as in one process (the same sums, bit for bit).
    order = torch.sort(tpos[d], stable=True).indices
    eids, s, ld, remote = eids[order], s[order], tpos[d][order], remote[order]
    sources = targets if not graph.is_bipartite else (src_owner == rank).nonzero().view(-1)
    spos = torch.full((m,), -1, dtype=torch.int64)
    spos[sources] = torch.arange(sources.numel())
    # The halo sorted by (owner, id): the order all_to_all_single delivers it in.
    key = torch.unique(src_owner[s[remote]] * m + s[remote])
    halo = key % m
    recv_counts = torch.bincount(key // m, minlength=world)
    hpos = torch.full((m,), -1, dtype=torch.int64)
    hpos[halo] = sources.numel() + torch.arange(halo.numel())
    ls = torch.where(remote, hpos[s], spos[s])
    # What this rank sends: its sources read by edges of other ranks' targets,
    # by (destination, id): each receiver's halo order restricted to this rank.
    out = (src_owner[src] == rank) & (owner[dst] != rank)
    skey = torch.unique(owner[dst[out]] * m + src[out])
    send_index = spos[skey % m]
    send_counts = torch.bincount(skey // m, minlength=world)
    num_interior = int((~boundary[own_t]).sum())
    if graph.input_edges is not None:
        eids = graph.input_edges[eids]  # positions among the edges as given
    ptr = torch.zeros(targets.numel() + 1, dtype=torch.int64)
    torch.cumsum(torch.bincount(ld, minlength=targets.numel()), 0, out=ptr[1:])
    return _Layout(
        targets=targets,
        sources=sources,
        halo=halo,
        ptr=ptr,
        col=_narrow(ls, sources.numel() + halo.numel()),
        edge_ids=_narrow(eids, int(eids.max()) + 1 if eids.numel() else 0),
        send_index=send_index,
        send_counts=send_counts.tolist(),
        recv_counts=recv_counts.tolist(),
        num_interior=num_interior,
        num_interior_edges=int((ld < num_interior).sum()),
    )


def _narrow(index: Tensor, bound: int) -> Tensor:
    """``index`` (ids below ``bound``) as int32 when they fit: the CPU kernels read
    either width, and half the bytes is half the memory of a rank's biggest array."""
    return index.to(torch.int32 if bound < 2**31 else torch.int64)


def _check(lay: _Layout) -> None:
    """A loaded layout's CSR against its own sizes (read once, when loaded)."""
    check_ptr(lay.ptr, lay.col.numel(), "ptr")
    check_index(lay.col, lay.sources.numel() + lay.halo.numel(), "col")
    if lay.ptr.numel() != lay.targets.numel() + 1 or lay.edge_ids.numel() != lay.col.numel():
        raise ValueError(
            f"Expected a part's arrays of matching sizes, got {lay.targets.numel()} targets "
            f"for {lay.ptr.numel()} pointers and {lay.edge_ids.numel()} edge ids for "
            f"{lay.col.numel()} edges"
        )


class GraphPart:
    r"""One rank's share of a graph split by target (made by
    :meth:`Partition.part <gnnattn.distributed.Partition.part>` or
    :meth:`load`).

    Pass it where a layer takes ``edge_index``, with this rank's rows:
    ``layer(part.shard(x), part)``; the layer's output rows are this rank's
    targets, in :attr:`targets` order.

    Attributes:
        rank (int), world_size (int): this rank, and P.
        targets (Tensor): ``[N_r]`` global ids of the owned targets, in local
            order (those whose sources are all owned first).
        sources (Tensor): ``[M_r]`` global ids of the owned sources (the
            targets themselves for a square graph).
        halo (Tensor): ``[H_r]`` global ids of the remote sources read here.
        edge_ids (Tensor): ``[|E_r|]`` each local edge's position in the
            edges as given to :func:`~gnnattn.distributed.partition`: the
            rows of the edge features this rank needs (:meth:`shard_edges`).
        graph (AttentionGraph): the local graph, ``N_r`` targets over
            ``M_r + H_r`` sources (``[owned | halo]``), made on first use.
        interior_graph (AttentionGraph), boundary_graph (AttentionGraph): what
            attention runs on: the first :attr:`num_interior` targets over the
            owned sources, and the others over ``[boundary_sources | halo]``.
        boundary_sources (Tensor): ``[B_r]`` the owned source rows (local ids)
            that boundary targets read.
        traffic (dict): bytes this rank handed to the exchange, counted per
            direction (``"forward"``, ``"backward"``) since made or reset.
        group: the ``torch.distributed`` process group (default: the world).

    Shapes:
        - **attention:** ``q [N_r, H, C]``, ``k [M_r, H, C]``, ``v [M_r, H, Cv]``
          -> ``[N_r, H, Cv]``; per-edge tensors ``[|E_r|, ...]`` in the local
          edge order (:meth:`shard_edges` of the global ones).
    """

    def __init__(
        self,
        layout: _Layout,
        *,
        rank: int,
        world_size: int,
        num_nodes: int,
        num_src: int,
        bipartite: bool,
        causal: bool,
        num_graph_edges: int | None = None,
        group: Any = None,
    ) -> None:
        self._layout = layout
        self.rank, self.world_size = rank, world_size
        self.num_nodes, self.num_src = num_nodes, num_src
        # The whole graph's edge count, which shard_edges checks (None: a file saved
        # before parts kept it).
        self.num_graph_edges = num_graph_edges
        self.is_bipartite, self.causal = bipartite, causal
        self.group = group
        self.traffic = {"forward": 0, "backward": 0}
        n_r, m_r = layout.targets.numel(), layout.sources.numel()
        ptr, col = layout.ptr, layout.col
        ni, ne = layout.num_interior, layout.num_interior_edges
        # Interior targets read owned sources only: the first rows of the CSR, views.
        self.interior_graph = AttentionGraph._assembled(
            ni, m_r, bipartite=True, device=ptr.device, csr=CSR(ptr[: ni + 1], col[:ne], None)
        )
        # The boundary targets read [the owned sources they need | halo]: only those
        # owned rows are copied next to the received ones (not every owned row, whose
        # copy autograd would keep until the backward).
        bcol = col[ne:].long()
        owned = bcol < m_r
        self.boundary_sources = torch.unique(bcol[owned])  # (B_r,) local owned rows
        b = self.boundary_sources.numel()
        where = torch.full((m_r,), -1, dtype=torch.int64, device=ptr.device)
        where[self.boundary_sources] = torch.arange(b, device=ptr.device)
        local = bcol - m_r + b  # halo rows follow the B_r owned ones
        local[owned] = where[bcol[owned]]
        bcsr = CSR(ptr[ni:] - ne, _narrow(local, b + layout.halo.numel()), None)
        self.boundary_graph = AttentionGraph._assembled(
            n_r - ni, b + layout.halo.numel(), bipartite=True, device=ptr.device, csr=bcsr
        )

    @classmethod
    def build(
        cls,
        graph: AttentionGraph,
        owner: Tensor,
        src_owner: Tensor,
        rank: int,
        world_size: int,
        group: Any = None,
    ) -> GraphPart:
        """Rank ``rank``'s part of ``graph`` given each node's owner."""
        lay = _layout(graph, owner, src_owner, rank, world_size)
        return cls(
            lay,
            rank=rank,
            world_size=world_size,
            num_nodes=graph.num_dst,
            num_src=graph.num_src,
            bipartite=graph.is_bipartite,
            causal=graph.is_causal,
            num_graph_edges=graph.num_input_edges,
            group=group,
        )

    # ----------------------------------------------------------- the arrays

    targets = property(lambda self: self._layout.targets)
    sources = property(lambda self: self._layout.sources)
    halo = property(lambda self: self._layout.halo)
    edge_ids = property(lambda self: self._layout.edge_ids)
    send_index = property(lambda self: self._layout.send_index)
    send_counts = property(lambda self: self._layout.send_counts)
    recv_counts = property(lambda self: self._layout.recv_counts)
    num_interior = property(lambda self: self._layout.num_interior)

    @property
    def num_targets(self) -> int:
        return self._layout.targets.numel()

    @property
    def num_edges(self) -> int:
        return self._layout.edge_ids.numel()

    @cached_property
    def graph(self) -> AttentionGraph:
        """The local graph, ``N_r`` targets over ``M_r + H_r`` sources (``[owned |
        halo]``), made on first use (attention runs on its interior and boundary
        halves, :attr:`interior_graph` and :attr:`boundary_graph`)."""
        lay = self._layout
        n_r, m = lay.targets.numel(), lay.sources.numel() + lay.halo.numel()
        csr = CSR(lay.ptr, lay.col, None)
        return AttentionGraph._assembled(n_r, m, bipartite=True, device=lay.ptr.device, csr=csr)

    @property
    def global_edge_index(self) -> Tensor:
        """``[2, |E_r|]`` the local edges in global node ids."""
        lay = self._layout
        ids = torch.cat([self.sources, self.halo])
        dst = segment_ids(lay.ptr, lay.col.numel())
        return torch.stack([ids[lay.col.long()], self.targets[dst]])

    def shard(self, x: Tensor) -> Tensor:
        """This rank's rows of a full ``[N, ...]`` target tensor (``x[targets]``)."""
        _check_rows(x, "x", self.num_nodes, "the whole graph's targets")
        return x[self.targets.to(x.device)]

    def shard_src(self, x_src: Tensor) -> Tensor:
        """This rank's rows of a full ``[M, ...]`` source tensor (``x_src[sources]``)."""
        _check_rows(x_src, "x_src", self.num_src, "the whole graph's sources")
        return x_src[self.sources.to(x_src.device)]

    def shard_edges(self, edge_attr: Tensor) -> Tensor:
        """This rank's rows of full per-edge features ``[|E|, ...]``, one row per edge as
        given to :func:`~gnnattn.distributed.partition` (before causal pruning), in the
        local edge order."""
        _check_rows(edge_attr, "edge_attr", self.num_graph_edges, "the edges as given")
        return edge_attr[self.edge_ids.to(edge_attr.device)]

    @property
    def edge_index(self) -> Tensor:
        """``[2, |E_r|]`` the local edges in global node ids (what layers return with
        attention weights)."""
        return self.global_edge_index

    def select_edges(self, edge_attr: Tensor, name: str = "edge_attr") -> Tensor:
        """``edge_attr`` checked to hold this rank's edges (as :meth:`shard_edges` gives);
        the layers' hook, as :meth:`AttentionGraph.select_edges`."""
        if edge_attr.dim() < 1 or edge_attr.shape[0] != self.num_edges:
            raise ValueError(
                f"Expected '{name}' with {self.num_edges} rows (rank {self.rank}'s edges: "
                f"part.shard_edges(edge_attr)), got {list(edge_attr.shape)}"
            )
        return edge_attr

    # ------------------------------------------------------------ attention

    def attention(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        scale: float | None = None,
        score_bias: Tensor | None = None,
        dropout_p: float = 0.0,
        backend: str = "auto",
        need_weights: bool = False,
        return_lse: bool = False,
        edge_attr: Tensor | None = None,
        edge_key: Tensor | None = None,
        edge_value: Tensor | None = None,
    ) -> Tensor | AttentionOutput:
        """:func:`gnnattn.attention` over this part, the halo exchanged on the way.

        ``q`` holds the owned targets' rows, ``k`` and ``v`` the owned
        sources'; per-edge tensors follow the local edge order. Dropout draws
        its own mask on each rank (the same distribution as in one process,
        not the same bits).
        """
        if backend == "sdpa":
            raise ValueError(
                "Expected backend in ('auto', 'mp', 'fused', 'tiles') on a GraphPart (its local "
                "graphs are bipartite, which 'sdpa' does not take), got 'sdpa'"
            )
        self._check(q, k, v)
        n_r, m_r, ni = self.num_targets, k.shape[0], self.num_interior
        h, c, cv = q.shape[1], q.shape[2], v.shape[2]
        # Only the rows to send are packed (one message per layer); the owned
        # rows are never copied before the boundary attention needs them.
        idx = self.send_index.to(k.device)
        send = torch.cat([k.reshape(m_r, h * c)[idx], v.reshape(m_r, h * cv)[idx]], 1)  # (S_r, F)
        recv, pending = exchange_start(send, self)
        ne = self._layout.num_interior_edges
        edge: dict[str, Any] = {
            "score_bias": score_bias,
            "edge_attr": edge_attr,
        }
        for name, t in edge.items():
            if t is not None and t.shape[0] != self.num_edges:
                raise ValueError(
                    f"Expected '{name}' with {self.num_edges} rows (this rank's edges, "
                    f"part.shard_edges(...)), got {list(t.shape)}"
                )
        opts: dict[str, Any] = dict(
            scale=scale,
            dropout_p=dropout_p,
            backend=backend,
            need_weights=need_weights,
            return_lse=return_lse,
            edge_key=edge_key,
            edge_value=edge_value,
        )
        # Split, not sliced: the backward of split joins the two gradients into one
        # tensor, where each slice's would be a zero-filled tensor of all N_r rows.
        q_int, q_bnd = q.split([ni, n_r - ni])
        e_int, e_bnd = _halves(edge, ne)
        first = attention(q_int, k, v, self.interior_graph, **opts, **e_int)
        first_out = first.out if isinstance(first, AttentionOutput) else first
        first_out, recv = exchange_finish(first_out, recv, pending)
        bsrc = self.boundary_sources.to(k.device)
        k_b = torch.cat([k[bsrc], recv[:, : h * c].view(-1, h, c)])  # (B_r + H_r, H, C)
        v_b = torch.cat([v[bsrc], recv[:, h * c :].view(-1, h, cv)])  # (B_r + H_r, H, Cv)
        rest = attention(q_bnd, k_b, v_b, self.boundary_graph, **opts, **e_bnd)
        rest_out = rest.out if isinstance(rest, AttentionOutput) else rest
        out = torch.cat([first_out, rest_out])  # (N_r, H, Cv)
        assert out.shape[0] == n_r
        if not isinstance(first, AttentionOutput) or not isinstance(rest, AttentionOutput):
            return out
        return AttentionOutput(
            out,
            _cat(first.lse, rest.lse),
            _cat(first.weights, rest.weights),
            rest.backend if self.num_targets > ni else first.backend,
        )

    def _check(self, q: Tensor, k: Tensor, v: Tensor) -> None:
        for name, t, rows, what in (
            ("q", q, self.num_targets, "owned targets"),
            ("k", k, self.sources.numel(), "owned sources"),
            ("v", v, self.sources.numel(), "owned sources"),
        ):
            if not isinstance(t, Tensor) or t.dim() != 3 or t.shape[0] != rows:
                got = list(t.shape) if isinstance(t, Tensor) else type(t).__name__
                raise ValueError(
                    f"Expected '{name}' of shape [{rows}, H, C] (rank {self.rank}'s {what}), "
                    f"got {got}"
                )
        rank, world = group_rank(self.group)
        if (rank, world) != (self.rank, self.world_size) and self.world_size > 1:
            raise ValueError(
                f"Expected this part on rank {self.rank} of {self.world_size} (of its process "
                f"group), got it on rank {rank} of {world} (init torch.distributed with "
                f"{self.world_size} processes and give each rank its own part)"
            )

    def to(self, device: torch.device | str) -> GraphPart:
        """This part with its index arrays and graphs on ``device`` (moved once, not per
        call; the exchange's counts stay on the host)."""
        moved: dict[str, Any] = {
            k: v.to(device) if isinstance(v, Tensor) else v for k, v in vars(self._layout).items()
        }
        return GraphPart(_Layout(**moved), group=self.group, **self._meta())

    def _meta(self) -> dict[str, Any]:
        return dict(
            rank=self.rank,
            world_size=self.world_size,
            num_nodes=self.num_nodes,
            num_src=self.num_src,
            bipartite=self.is_bipartite,
            causal=self.causal,
            num_graph_edges=self.num_graph_edges,
        )

    # ------------------------------------------------------------ files

    def save(self, path: str | os.PathLike) -> None:
        """Write this part to ``path`` (read back with :meth:`load`)."""
        layout = {k: v.cpu() if isinstance(v, Tensor) else v for k, v in vars(self._layout).items()}
        torch.save({"layout": layout, "meta": self._meta()}, path)

    @classmethod
    def load(cls, path: str | os.PathLike, *, group: Any = None) -> GraphPart:
        """A part written by :meth:`save` (or :meth:`Partition.save`); its CSR is
        checked against its sizes once, here."""
        data = torch.load(path, weights_only=True)
        fields = set(_Layout.__dataclass_fields__)
        if set(data.get("layout", {})) != fields:
            raise ValueError(
                f"Expected a file of GraphPart.save() with the arrays {sorted(fields)}, got "
                f"{sorted(data.get('layout', {}))} in {os.fspath(path)!r} (written by another "
                f"version? partition the graph again)"
            )
        lay = _Layout(**data["layout"])
        _check(lay)
        return cls(lay, group=group, **data["meta"])

    def __repr__(self) -> str:
        return (
            f"GraphPart(rank={self.rank}, world_size={self.world_size}, "
            f"num_targets={self.num_targets}, num_halo={self.halo.numel()}, "
            f"num_edges={self.num_edges})"
        )


def _check_rows(t: Tensor, name: str, rows: int | None, what: str) -> None:
    """Raise unless ``t`` is a tensor of ``rows`` rows (``None``: of any)."""
    check_tensor(t, name)
    if t.dim() == 0 or (rows is not None and t.shape[0] != rows):
        raise ValueError(
            f"Expected '{name}' of shape [{rows if rows is not None else 'E'}, ...] ({what}), "
            f"got {list(t.shape)}"
        )


def _halves(edge: dict[str, Any], ne: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The per-edge options' rows of the interior and the boundary attention (edges are
    by target, the interior's first), split as ``q`` is."""
    halves = {
        k: (None, None) if t is None else t.split([ne, t.shape[0] - ne]) for k, t in edge.items()
    }
    return {k: h[0] for k, h in halves.items()}, {k: h[1] for k, h in halves.items()}


def _cat(a: Tensor | None, b: Tensor | None) -> Tensor | None:
    return None if a is None or b is None else torch.cat([a, b])
