r"""Graphs for global attention in :math:`O(|V| + |E|)`: expanders, virtual nodes, Exphormer.

Full attention relates every pair of nodes of a graph; `Exphormer
<https://arxiv.org/abs/2303.06147>`_ (Shirzad et al., ICML 2023) keeps its
reach with three sparse parts, each an edge set gnnattn attends over exactly:

* the input edges, both directions;
* an **expander**: a random sparse graph in which every node is a few hops
  from every other (:func:`expander_graph`);
* **virtual nodes**: extra nodes joined both ways to every node of their
  graph (:func:`with_virtual_nodes`), so any two nodes are two hops apart.

:func:`exphormer_graph` is their union. Each builder returns a
:class:`ComposedGraph`: an :class:`~gnnattn.AttentionGraph` that also knows
its :class:`GraphComposition` (how many nodes are real and how many virtual,
which part each edge comes from). Every builder is deterministic given its
``seed`` (a :class:`torch.Generator` on the CPU, so the same graph on every
device), and its index arithmetic is int64 whatever the input's width, so a
graph of millions of nodes (:math:`N^2 > 2^{31}`) is built exactly from
int32 or int64 edges.

Node ids. The real nodes keep their ids :math:`0 \dots N-1`; the
virtual nodes come after them, graph by graph: with ``k`` virtual nodes per
graph, virtual node :math:`t` of graph :math:`g` (the :math:`g`-th graph of
``batch`` that has nodes) is :math:`N + g k + t`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..checks import check_bool, check_int, check_tensor
from .csr import CSR
from .graph import AttentionGraph
from .inputs import plain
from .validate import check_batch, check_edge_index

__all__ = [
    "EDGE_KINDS",
    "ComposedGraph",
    "GraphComposition",
    "expander_graph",
    "exphormer_graph",
    "with_virtual_nodes",
]

#: The part each edge of a :class:`ComposedGraph` comes from, by code
#: (``composition.edge_kind[e]`` indexes this tuple). An edge that two parts
#: give is kept once, with the smaller code.
EDGE_KINDS = ("input", "expander", "to_virtual", "from_virtual", "self_loop")
_INPUT, _EXPANDER, _TO_VIRTUAL, _FROM_VIRTUAL, _SELF = range(len(EDGE_KINDS))

# Edges are deduplicated through one int64 key, (target * n + source) * 8 + kind:
# exact while 8 n^2 < 2^63.
_MAX_NODES = 2**30

# One part of a composed graph: its edges' sources and targets ([E] int64 each, on
# the CPU) and their kind.
_Part = tuple[Tensor, Tensor, int]

# Rounds of the expander's repair (see _repair); a round costs O(N). Large
# graphs need two or three; only graphs of a few nodes ever get near the cap.
_REPAIR_ROUNDS = 64
# Draws of a whole graph's layers when a layer could not be completed (graphs of a
# few nodes, close to complete).
_RESTARTS = 16


@dataclass(frozen=True, eq=False)
class GraphComposition:
    """What a :class:`ComposedGraph` is made of.

    Attributes:
        num_real: the real nodes :math:`N` (ids ``0 .. N-1``).
        num_virtual: the virtual nodes, ``virtual_per_graph * num_graphs``
            (ids ``N .. N + num_virtual - 1``, graph by graph).
        virtual_per_graph: :math:`k`, the virtual nodes of each graph.
        num_graphs: the graphs (of ``batch``, those with nodes; 1 without
            ``batch``, 0 without nodes).
        expander_degree: the degree the expander was asked for (0: none).
        seed: the seed of the expander, or ``None`` without one.
        edge_kind: ``[|E|]`` uint8, the part of each edge of the graph's
            ``edge_index``, a code into :data:`EDGE_KINDS`.

    Example:
        >>> g = with_virtual_nodes(torch.tensor([[0, 1], [1, 2]]), 1, 3)
        >>> g.composition.num_real, g.composition.num_virtual
        (3, 1)
        >>> g.composition.kind_counts()
        {'input': 2, 'expander': 0, 'to_virtual': 3, 'from_virtual': 3, 'self_loop': 0}
    """

    num_real: int
    num_virtual: int
    virtual_per_graph: int
    num_graphs: int
    expander_degree: int
    seed: int | None
    edge_kind: Tensor

    @property
    def num_nodes(self) -> int:
        """All nodes, real and virtual."""
        return self.num_real + self.num_virtual

    def virtual_index(self) -> Tensor:
        """``[num_virtual]`` int64: which of a graph's ``k`` virtual nodes each one is
        (the row of a layer's ``[k, D]`` embedding table it reads)."""
        k = max(self.virtual_per_graph, 1)
        return torch.arange(self.num_virtual, device=self.edge_kind.device) % k

    def virtual_batch(self) -> Tensor:
        """``[num_virtual]`` int64: the graph (``0 .. num_graphs - 1``) of each virtual node."""
        k = max(self.virtual_per_graph, 1)
        return torch.arange(self.num_virtual, device=self.edge_kind.device) // k

    def kind_counts(self) -> dict[str, int]:
        """The number of edges of each kind of :data:`EDGE_KINDS`."""
        counts = torch.bincount(self.edge_kind.long(), minlength=len(EDGE_KINDS)).tolist()
        return dict(zip(EDGE_KINDS, counts, strict=True))

    def to(self, device: torch.device | str) -> GraphComposition:
        """The same composition with ``edge_kind`` on ``device``."""
        return GraphComposition(
            self.num_real,
            self.num_virtual,
            self.virtual_per_graph,
            self.num_graphs,
            self.expander_degree,
            self.seed,
            self.edge_kind.to(device),
        )


class ComposedGraph(AttentionGraph):
    """An :class:`~gnnattn.AttentionGraph` made of parts: input edges, an expander,
    virtual nodes, self-loops; :attr:`composition` says which.

    Made by :func:`expander_graph`, :func:`with_virtual_nodes` and
    :func:`exphormer_graph`; passed wherever an ``AttentionGraph`` goes. Its
    edges are sorted by target, then source, each edge once. A builder's graph
    holds its CSR (on the CPU with int32 sources) and makes ``edge_index``
    only when it is read.

    Args:
        edge_index (Tensor): ``[2, |E|]`` edges over the real and virtual nodes.
        composition (GraphComposition): the parts, with one ``edge_kind`` per edge.

    Example:
        >>> g = expander_graph(6, 2, seed=0)
        >>> g
        ComposedGraph(num_nodes=6, num_edges=12, real=6, virtual=0, expander_degree=2)
    """

    composition: GraphComposition

    def __init__(self, edge_index: Tensor, composition: GraphComposition) -> None:
        if not isinstance(composition, GraphComposition):
            raise TypeError(
                f"Expected 'composition' to be a GraphComposition, got {type(composition).__name__}"
            )
        super().__init__(edge_index, composition.num_nodes)
        kind = composition.edge_kind
        if kind.shape != (self.num_edges,):
            raise ValueError(
                f"Expected 'composition.edge_kind' of shape [{self.num_edges}] (one kind per "
                f"edge), got {list(kind.shape)}"
            )
        if kind.dtype.is_floating_point or kind.dtype.is_complex or kind.dtype == torch.bool:
            raise TypeError(
                f"Expected 'composition.edge_kind' of an integer dtype, got {kind.dtype}"
            )
        if kind.numel() and not bool(((kind >= 0) & (kind < len(EDGE_KINDS))).all()):
            raise ValueError(
                f"Expected 'composition.edge_kind' codes in [0, {len(EDGE_KINDS)}) (indices of "
                f"EDGE_KINDS), got values from {int(kind.min())} to {int(kind.max())}"
            )
        self.composition = composition

    @classmethod
    def _built(cls, csr: CSR, composition: GraphComposition) -> ComposedGraph:
        """A graph from the CSR of a builder's checked, sorted, deduplicated edges (its
        ``edge_index`` made from it when asked for)."""
        n = composition.num_nodes
        g = cls._assembled(n, n, csr=csr, device=csr.ptr.device)
        assert isinstance(g, ComposedGraph)  # _assembled makes an object of cls
        g.composition = composition
        return g

    def to(self, device: torch.device | str) -> ComposedGraph:
        """The same graph on ``device``, its composition with it."""
        g = super().to(device)
        if g is self:
            return self
        # AttentionGraph.to copies the object: a ComposedGraph, whose composition
        # moves here.
        assert isinstance(g, ComposedGraph)
        g.composition = self.composition.to(g.device)
        return g

    def __repr__(self) -> str:
        c = self.composition
        return (
            f"{type(self).__name__}(num_nodes={self.num_nodes}, num_edges={self.num_edges}, "
            f"real={c.num_real}, virtual={c.num_virtual}, expander_degree={c.expander_degree})"
        )


# --------------------------------------------------------------------------- helpers


def _graphs(num_nodes: int | None, batch: Tensor | None) -> tuple[int, Tensor, Tensor, Tensor]:
    """``(N, graph [N], starts [G], lengths [G])`` on the CPU, int64: the graphs of
    ``batch`` that have nodes (one graph of all nodes without ``batch``)."""
    if batch is None:
        if num_nodes is None:
            raise ValueError("Expected 'num_nodes' or 'batch', got neither")
        check_int(num_nodes, "num_nodes")
        n = num_nodes
        lengths = torch.tensor([n] if n else [], dtype=torch.long)
        return n, torch.zeros(n, dtype=torch.long), torch.zeros_like(lengths), lengths
    b = check_batch(batch, num_nodes).cpu()
    n = b.numel()
    if n == 0:
        empty = torch.zeros(0, dtype=torch.long)
        return 0, empty, empty, empty
    # The runs of equal ids: ids no node carries are no graph, so the graph
    # index counts only those with nodes (and a huge id costs nothing).
    lengths = torch.unique_consecutive(b, return_counts=True)[1]
    starts = torch.cumsum(lengths, 0) - lengths
    graph = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)
    return n, graph, starts, lengths


def _check_size(n: int) -> None:
    if n > _MAX_NODES:
        raise ValueError(
            f"Expected at most {_MAX_NODES} nodes (real and virtual) in a composed graph, got {n}"
        )


def _generator(seed: Any) -> torch.Generator:
    check_int(seed, "seed")
    return torch.Generator().manual_seed(seed)


def _pair_key(u: Tensor, v: Tensor, n: int) -> Tensor:
    """One int64 key per undirected pair ``{u, v}``."""
    return torch.minimum(u, v) * n + torch.maximum(u, v)


def _sort_in_place(keys: Tensor) -> Tensor:
    """``keys`` (int64, on the CPU, a tensor the caller owns) sorted ascending in place.

    numpy's in-place sort: ``torch.sort`` returns an int64 index tensor as large
    as the keys beside a sorted copy, which at a million nodes would be the
    build's peak; numpy's int64 sort is also the faster one here (22M keys: 0.12 s,
    ``torch.sort`` 0.8 s on two threads; 5,000 keys: 11 us against 90 us). The
    values, unlike an index, do not depend on the algorithm.
    """
    keys.numpy().sort()
    return keys


def _in_sorted(keys: Tensor, sorted_keys: Tensor) -> Tensor:
    """Whether each key is in ``sorted_keys`` (ascending)."""
    if sorted_keys.numel() == 0:
        return torch.zeros_like(keys, dtype=torch.bool)
    pos = torch.searchsorted(sorted_keys, keys).clamp_max(sorted_keys.numel() - 1)
    return sorted_keys[pos] == keys


def _np_in_sorted(values: np.ndarray, sorted_values: np.ndarray) -> np.ndarray:
    """:func:`_in_sorted` of numpy arrays (``np.isin`` sorts both sides each time)."""
    if sorted_values.size == 0:
        return np.zeros(values.shape, dtype=bool)
    pos = np.minimum(np.searchsorted(sorted_values, values), sorted_values.size - 1)
    return sorted_values[pos] == values


def _repair(
    sigma: Tensor,
    a: Tensor,
    b: Tensor,
    start: Tensor,
    length: Tensor,
    pos_graph: Tensor,
    taken: Tensor,
    n: int,
    gen: torch.Generator,
) -> tuple[Tensor, Tensor]:
    """The pairs ``{sigma[a], sigma[b]}`` of one layer of the expander, after swapping
    ``sigma`` until none is a pair of ``taken`` (the earlier layers' keys, sorted).

    A clashing pair's ``b`` end swaps its node with a uniform random position
    of the same graph; of the swaps that would touch one position twice, the
    first goes ahead and the others wait for the next round. Only the pairs a
    swap touched are checked again, so a round costs what it swaps, not the
    graph's size. Returns ``(u, v)`` of the
    pairs that do not clash (after :data:`_REPAIR_ROUNDS` rounds the rest,
    possible only in graphs of a few nodes, are dropped). ``pos_graph`` is
    each position's graph (a row of ``start`` and ``length``).
    """
    if taken.numel() == 0:
        # The first layer: nothing to clash with, no swap to draw.
        return sigma[a], sigma[b]
    # In numpy, on views of the tensors (sigma is swapped in place): a round is
    # some thirty operations on the few clashing pairs, and for a batch of small
    # graphs torch's overhead per operation would be most of the build's time. The
    # random draws are torch's, from gen, in the order of the pairs.
    sig, pa_of, pb_of = sigma.numpy(), a.numpy(), b.numpy()
    first_pos, size, graph_of, keys = (t.numpy() for t in (start, length, pos_graph, taken))
    m, p = sig.size, pa_of.size
    # The pairs each position is an end of (-1: none).
    pair_a = np.full(m, -1, dtype=np.int64)
    pair_b = np.full(m, -1, dtype=np.int64)
    pair_a[pa_of] = np.arange(p)
    pair_b[pb_of] = np.arange(p)

    def clashing(pairs: np.ndarray) -> np.ndarray:
        u, v = sig[pa_of[pairs]], sig[pb_of[pairs]]
        return pairs[_np_in_sorted(np.minimum(u, v) * n + np.maximum(u, v), keys)]

    bad = clashing(np.arange(p))
    for _ in range(_REPAIR_ROUNDS):
        if bad.size == 0:
            break
        pa = pb_of[bad]
        g = graph_of[pa]
        r = torch.rand(pa.size, generator=gen, dtype=torch.float64).numpy()
        pr = first_pos[g] + np.minimum((r * size[g]).astype(np.int64), size[g] - 1)
        # A swap goes ahead when both its positions appear in no earlier swap of the
        # round (the first always does, unless it drew its own position).
        ends = np.stack([pa, pr], 1).reshape(-1)  # pa0, pr0, pa1, pr1, ...
        is_first = np.zeros(ends.size, dtype=bool)
        is_first[np.unique(ends, return_index=True)[1]] = True
        ok = is_first.reshape(-1, 2).all(1) & (pa != pr)
        pa, pr = pa[ok], pr[ok]
        sig[pa], sig[pr] = sig[pr], sig[pa]
        moved = np.concatenate([pa, pr])
        dirty = np.concatenate([pair_a[moved], pair_b[moved]])
        dirty = np.unique(dirty[dirty >= 0])
        bad = np.concatenate([bad[~_np_in_sorted(bad, dirty)], clashing(dirty)])
    keep = torch.ones(p, dtype=torch.bool)
    keep[torch.from_numpy(bad)] = False
    return sigma[a[keep]], sigma[b[keep]]


def _layered_pairs(
    nodes: Tensor, start: Tensor, length: Tensor, degree: int, n: int, gen: torch.Generator
) -> Tensor:
    """``[2, P]`` undirected pairs, each once: ``degree // 2`` random Hamiltonian
    cycles and, for odd ``degree``, a random (near-)perfect matching, edge-disjoint,
    within each graph of ``nodes`` (global ids, graph by graph; positions
    ``start[g] .. start[g] + length[g] - 1`` of ``nodes`` are graph ``g``'s)."""
    m = nodes.numel()
    if m == 0 or degree == 0:
        return torch.zeros(2, 0, dtype=torch.long)
    pos = torch.arange(m)
    graph = torch.repeat_interleave(torch.arange(length.numel()), length)
    first, end = start[graph], start[graph] + length[graph]  # (M,) each position's graph
    layers = ["cycle"] * (degree // 2) + ["matching"] * (degree % 2)
    taken = torch.zeros(0, dtype=torch.long)
    out = []
    for kind in layers:
        # A uniform random order of each graph's nodes: sort by a random key, then
        # (stably) by graph.
        order = torch.argsort(torch.rand(m, generator=gen))
        if length.numel() > 1:
            order = order[torch.argsort(graph[order], stable=True)]
        sigma = nodes[order]
        if kind == "cycle":
            a = pos
            b = torch.where(pos + 1 < end, pos + 1, first)
        else:
            a = pos[((pos - first) % 2 == 0) & (pos + 1 < end)]
            b = a + 1
        u, v = _repair(sigma, a, b, start, length, graph, taken, n, gen)
        out.append(torch.stack([u, v]))
        taken = _sort_in_place(torch.cat([taken, _pair_key(u, v, n)]))
    return torch.cat(out, 1)


def _regular_pairs(
    nodes: Tensor,
    length: Tensor,
    degree: int,
    n: int,
    node_graph: Tensor,
    gen: torch.Generator,
) -> Tensor:
    """:func:`_layered_pairs` of the graphs of ``nodes`` (``length`` nodes each), with
    the graphs whose layers could not all be completed drawn again (up to
    :data:`_RESTARTS` times; ``node_graph`` maps a global id to its graph's row of
    ``length``)."""
    start = torch.cumsum(length, 0) - length
    pairs = _layered_pairs(nodes, start, length, degree, n, gen)
    want = length * (degree // 2) + (length // 2) * (degree % 2)
    for _ in range(_RESTARTS):
        have = torch.bincount(node_graph[pairs[0]], minlength=length.numel())
        short = have < want
        if not bool(short.any()):
            break
        redo = short[node_graph[nodes]]
        sub_len = length[short]
        again = _layered_pairs(
            nodes[redo], torch.cumsum(sub_len, 0) - sub_len, sub_len, degree, n, gen
        )
        better = torch.zeros_like(short)
        better[short] = (
            torch.bincount(node_graph[again[0]], minlength=length.numel())[short] > have[short]
        )
        pairs = torch.cat(
            [pairs[:, ~better[node_graph[pairs[0]]]], again[:, better[node_graph[again[0]]]]], 1
        )
    return pairs


def _complete_pairs(nodes: Tensor, length: Tensor) -> Tensor:
    """``[2, P]``: every pair ``u < v`` of each graph of ``nodes``."""
    start = torch.cumsum(length, 0) - length
    graph = torch.repeat_interleave(torch.arange(length.numel()), length)
    local = torch.arange(nodes.numel()) - start[graph]  # (M,) position within the graph
    # Position i pairs with the later positions i+1 .. L-1 of its graph.
    count = length[graph] - 1 - local
    first = torch.repeat_interleave(torch.arange(nodes.numel()), count)
    rowptr = torch.cumsum(count, 0) - count
    second = first + 1 + torch.arange(first.numel()) - rowptr[first]
    return torch.stack([nodes[first], nodes[second]])


def _expander_pairs(
    graph: Tensor, starts: Tensor, lengths: Tensor, degree: int, n: int, gen: torch.Generator
) -> Tensor:
    """``[2, P]`` undirected pairs of the expander of every graph, each once (its edges
    are these both ways: :func:`_both_ways`).

    A graph of at most ``degree + 1`` nodes gets the complete graph without
    self-loops. A dense one (``degree > (L - 1) / 2``) gets the complement of a
    sparse one of degree ``L - 1 - degree``, which the layers complete far more
    easily (for odd ``L`` and odd ``degree`` the complement gives the sparse
    side's short node ``degree + 1`` edges: one of them is dropped, so that one
    node of the graph has ``degree - 1``, as in the sparse case).
    """
    if degree == 0 or lengths.numel() == 0:
        return torch.zeros(2, 0, dtype=torch.long)
    node_graph = graph
    parts = []
    small = lengths <= degree + 1
    sparse = ~small & (2 * degree <= lengths - 1)
    dense = ~small & ~sparse
    if bool(small.any()):
        ids = small[graph].nonzero().view(-1)
        parts.append(_complete_pairs(ids, lengths[small]))
    if bool(sparse.any()):
        ids = sparse[graph].nonzero().view(-1)  # graph by graph, as graph is sorted
        parts.append(_regular_pairs(ids, lengths[sparse], degree, n, _rows(sparse, graph), gen))
    if bool(dense.any()):
        for c in torch.unique(lengths[dense] - 1 - degree).tolist():
            group = dense & (lengths - 1 - degree == c)
            ids = group[graph].nonzero().view(-1)
            length = lengths[group]
            other = _regular_pairs(ids, length, c, n, _rows(group, graph), gen)
            every = _complete_pairs(ids, length)
            keys = _sort_in_place(_pair_key(other[0], other[1], n))
            pairs = every[:, ~_in_sorted(_pair_key(every[0], every[1], n), keys)]
            if degree % 2 and c % 2:
                # Odd graphs: the sparse side's short node has degree + 1 here; drop
                # the first of its edges in each graph.
                deg = torch.bincount(pairs.view(-1), minlength=n)
                over = deg[pairs[0]] > degree
                over |= deg[pairs[1]] > degree
                idx = over.nonzero().view(-1)
                g = node_graph[pairs[0, idx]]
                is_first = torch.ones_like(idx, dtype=torch.bool)
                is_first[1:] = g[1:] != g[:-1]
                keep = torch.ones(pairs.shape[1], dtype=torch.bool)
                keep[idx[is_first]] = False
                pairs = pairs[:, keep]
            parts.append(pairs)
    return torch.cat(parts, 1)


def _both_ways(pairs: Tensor, kind: int) -> list[_Part]:
    """The edges ``u -> v`` and ``v -> u`` of ``pairs`` ``[2, P]`` as two parts (views,
    not a flipped copy)."""
    return [(pairs[0], pairs[1], kind), (pairs[1], pairs[0], kind)]


def _rows(selected: Tensor, graph: Tensor) -> Tensor:
    """``[N]``: each node's graph's row among the ``selected`` graphs (-1 elsewhere)."""
    row = torch.cumsum(selected.long(), 0) - 1
    return torch.where(selected, row, -1)[graph]


def _virtual_edges(graph: Tensor, n: int, k: int) -> list[_Part]:
    """Every node to and from the ``k`` virtual nodes of its graph (ids
    ``n + graph * k + t``): the parts ``"to_virtual"`` and ``"from_virtual"``."""
    node = torch.arange(graph.numel()).repeat_interleave(k)
    virtual = n + graph.repeat_interleave(k) * k + torch.arange(k).repeat(graph.numel())
    return [(node, virtual, _TO_VIRTUAL), (virtual, node, _FROM_VIRTUAL)]


def _assemble(
    parts: list[_Part],
    num_nodes: int,
    composition: dict[str, Any],
    device: torch.device,
) -> ComposedGraph:
    """The union of ``parts`` (``(src [E], dst [E], kind)``, int64 on the CPU), sorted
    by target then source, each edge once with its smallest kind, as a
    :class:`ComposedGraph` on ``device``.

    The graph is held as its CSR, ``col`` int32 (the CPU kernels' width; moved to
    another device it is int64): its ``[2, |E|]`` int64 ``edge_index``, four times
    ``col``'s memory, is made only when asked for. The keys are written into one
    buffer and sorted and decoded in place, in numpy: at a million nodes a key per
    edge is 176 MB (keys made part by part, concatenated and sorted by
    ``torch.sort`` would be four of them at once, with its index), and for a
    batch of small graphs torch's overhead per operation would be most of the
    time.
    """
    _check_size(num_nodes)
    n = num_nodes
    key = np.empty(sum(src.numel() for src, _, _ in parts), dtype=np.int64)
    at = 0
    for src, dst, code in parts:
        piece = key[at : at + src.numel()]
        np.multiply(dst.numpy(), n, out=piece)
        piece += src.numpy()
        piece *= 8
        piece += code
        at += src.numel()
    key.sort()  # in place, see _sort_in_place
    kinds = (key & 7).astype(np.uint8)
    edge = np.right_shift(key, 3, out=key)  # target * n + source, in place of the keys
    first = np.ones(edge.size, dtype=bool)
    np.not_equal(edge[1:], edge[:-1], out=first[1:])
    kinds, edge = kinds[first], edge[first]
    del key, first
    target = edge // n
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(target, minlength=n), out=ptr[1:])
    target *= n
    col = np.subtract(edge, target, out=edge).astype(np.int32)  # the sources
    del edge, target
    # Normal tensors even under inference_mode: a graph built there may be
    # trained on (autograd refuses to save inference tensors).
    with torch.inference_mode(False):
        csr = CSR(torch.from_numpy(ptr), torch.from_numpy(col), None)
        comp = GraphComposition(edge_kind=torch.from_numpy(kinds), **composition)
        return ComposedGraph._built(csr, comp).to(device)


def _input_edges(edge_index: Any, num_nodes: int, name: str = "edge_index") -> Tensor:
    """``edge_index`` checked against ``num_nodes`` nodes, as int64 on the CPU."""
    check_tensor(edge_index, name)
    ei = check_edge_index(plain(edge_index), num_nodes, name=name)
    return ei.long().cpu()


def _device(device: torch.device | str | None, *tensors: Tensor | None) -> torch.device:
    if device is not None:
        return torch.device(device)
    for t in tensors:
        if t is not None:
            return t.device
    return torch.device("cpu")


# --------------------------------------------------------------------------- builders


def expander_graph(
    num_nodes: int | None = None,
    degree: int = 3,
    *,
    seed: int,
    batch: Tensor | None = None,
    device: torch.device | str | None = None,
) -> ComposedGraph:
    r"""A random ``degree``-regular expander: every node a few hops from every other.

    The construction: ``degree // 2`` random Hamiltonian cycles (each a uniform
    random order of the nodes, closed into a ring) and, for an odd
    ``degree``, a random perfect matching, made edge-disjoint by swapping
    nodes of a layer until none of its pairs is in an earlier layer. Every
    edge is given in both directions, with no self-loop and no duplicate;
    ``degree >= 2`` makes it connected (the first cycle visits every node).
    Such unions are contiguous to uniform random regular graphs (Robinson &
    Wormald for a cycle and a matching, Kim & Wormald for cycles), whose
    second adjacency eigenvalue is close to :math:`2\sqrt{d-1}` (Friedman):
    what holds with high probability for one holds for the other, expansion
    included. Exphormer builds its expander from random permutations
    (``exp_deg`` of them, each made symmetric: degree ``2 * exp_deg``, with
    occasional self-loops and duplicates); ``degree`` here is the degree
    itself, so Exphormer's ``exp_deg=3`` is ``degree=6``.

    .. math::
        \deg(i) = \min(d, |V_g| - 1)

    for every node :math:`i` of a graph :math:`g` of ``batch``, except that
    for odd :math:`d` and odd :math:`|V_g| > d + 1` one node of the graph has
    degree :math:`d - 1` (no :math:`d`-regular graph exists there). A graph of
    at most :math:`d + 1` nodes gets the complete graph without self-loops.

    Args:
        num_nodes (int, optional): :math:`N` (may be omitted with ``batch``).
            (default: :obj:`None`)
        degree (int, optional): :math:`d`, each node's number of neighbours.
            (default: ``3``)
        seed (int): the seed of the random layers: the same seed, the same graph.
        batch (Tensor, optional): sorted graph id of every node, ``[N]``: one
            expander per graph, no edge between graphs. (default: :obj:`None`)
        device (torch.device, optional): where the graph lives; it is built
            on the CPU. (default: ``batch``'s device, else the CPU)

    Shapes:
        - **output:** a :class:`ComposedGraph` of :math:`N` nodes and
          :math:`\sum_i \deg(i)` edges, all of kind ``"expander"``.

    Example:
        >>> g = expander_graph(10, 4, seed=0)
        >>> g.num_edges, g.csr.ptr.diff().tolist()
        (40, [4, 4, 4, 4, 4, 4, 4, 4, 4, 4])
    """
    check_int(degree, "degree")
    gen = _generator(seed)
    n, graph, starts, lengths = _graphs(num_nodes, batch)
    pairs = _expander_pairs(graph, starts, lengths, degree, max(n, 1), gen)
    composition = {
        "num_real": n,
        "num_virtual": 0,
        "virtual_per_graph": 0,
        "num_graphs": lengths.numel(),
        "expander_degree": degree,
        "seed": seed,
    }
    return _assemble(_both_ways(pairs, _EXPANDER), n, composition, _device(device, batch))


def with_virtual_nodes(
    graph: AttentionGraph | Tensor,
    k: int,
    num_nodes: int | None = None,
    *,
    batch: Tensor | None = None,
) -> ComposedGraph:
    r"""``graph`` with ``k`` virtual nodes per graph, joined both ways to every node of it.

    The virtual nodes get the ids after the real ones (:math:`N + g k + t` for
    virtual node :math:`t` of graph :math:`g`); each has an edge from and to
    every real node of its graph, and none to another virtual node. The input
    edges are kept as given (duplicates merged). In attention a virtual node
    is a hub: :math:`|V_g|` incoming and outgoing edges, which the fused
    kernels split over threads (``tests/test_global_graphs.py`` holds its time
    per edge to a graph without hubs).

    .. math::
        \mathcal{E}' = \mathcal{E} \cup \{(i, v), (v, i) : i \in V_g,\
        v \text{ a virtual node of } g\}

    Args:
        graph (AttentionGraph or Tensor): the real graph: a square
            :class:`~gnnattn.AttentionGraph` or an ``edge_index`` ``[2, |E|]``
            (int64 or int32).
        k (int): virtual nodes per graph.
        num_nodes (int, optional): :math:`N`, the real nodes; defaults to the
            graph's, else ``batch``'s length, else ``max id + 1``.
            (default: :obj:`None`)
        batch (Tensor, optional): sorted graph id of every node, ``[N]``:
            ``k`` virtual nodes for each graph that has nodes. (default: :obj:`None`)

    Shapes:
        - **output:** a :class:`ComposedGraph` of :math:`N + kG` nodes and
          :math:`|\mathcal{E}| + 2kN` edges (fewer if ``edge_index`` repeats edges).

    Example:
        >>> ei = torch.tensor([[0, 1, 2], [1, 2, 3]])
        >>> g = with_virtual_nodes(ei, 1, batch=torch.tensor([0, 0, 1, 1]))
        >>> g.num_nodes, g.csr.ptr.diff().tolist()  # nodes 4, 5: the virtual ones
        (6, [1, 2, 2, 2, 2, 2])
    """
    check_int(k, "k")
    if isinstance(graph, AttentionGraph):
        if graph.is_bipartite:
            raise ValueError(
                "Expected a square graph for virtual nodes, got a bipartite one "
                f"({graph.num_src} sources, {graph.num_dst} targets)"
            )
        if num_nodes is not None and num_nodes != graph.num_nodes:
            raise ValueError(
                f"Expected 'num_nodes' equal to the graph's {graph.num_nodes}, got {num_nodes}"
            )
        num_nodes = graph.num_nodes
        ei = graph.edge_index.cpu()
        dev = graph.device
    else:
        check_tensor(graph, "graph")
        g_plain = plain(graph)
        if num_nodes is None and batch is not None:
            num_nodes = batch.numel() if isinstance(batch, Tensor) else None
        if num_nodes is None:
            num_nodes = int(g_plain.max()) + 1 if g_plain.numel() else 0
        ei = _input_edges(g_plain, num_nodes, "graph")
        dev = g_plain.device
    n, graph_of, _, lengths = _graphs(num_nodes, batch)
    _check_size(n + k * lengths.numel())  # before the virtual edges: O(N k) of them
    parts = [(ei[0], ei[1], _INPUT), *_virtual_edges(graph_of, n, k)]
    composition = {
        "num_real": n,
        "num_virtual": k * lengths.numel(),
        "virtual_per_graph": k,
        "num_graphs": lengths.numel(),
        "expander_degree": 0,
        "seed": None,
    }
    return _assemble(parts, n + k * lengths.numel(), composition, dev)


def exphormer_graph(
    edge_index: Tensor,
    num_nodes: int | None = None,
    *,
    expander_degree: int = 3,
    virtual_nodes: int = 1,
    seed: int,
    batch: Tensor | None = None,
    self_loops: bool = True,
) -> ComposedGraph:
    r"""Exphormer's attention graph: the input edges both ways, an expander, virtual
    nodes and self-loops, each edge once.

    .. math::
        \mathcal{E}' = \mathcal{E} \cup \mathcal{E}^{\top}
        \cup \mathcal{E}_{\text{expander}} \cup \mathcal{E}_{\text{virtual}}
        \cup \{(i, i)\}

    The expander is :func:`expander_graph` of every graph of ``batch``
    (degree ``expander_degree``; no edge between graphs), the virtual nodes
    those of :func:`with_virtual_nodes` (``virtual_nodes`` per graph, ids
    after the real nodes). With ``self_loops`` every node, virtual ones
    included, also attends to itself, as in full attention (a node keeps its
    own value among its neighbours'). An edge that several parts give is kept
    once; ``composition.edge_kind`` names the first part in
    :data:`EDGE_KINDS` that gives it (an input edge that is also an expander
    edge is ``"input"``). The cost of attending over it is
    :math:`O(|V| + |E|)`: at most :math:`2|\mathcal{E}| + (d + 4k + 1)N`
    edges.

    As a GraphGPS user expects for a batch of graphs, everything is per graph:
    the expander and the virtual nodes never join two graphs of ``batch``. The
    graph is a function of ``seed`` and of the batch as given; a graph in
    another batch, or at another position, gets another expander (Exphormer
    draws one per graph once, as a dataset transform: build the graph of a
    fixed batch once and pass it, as :class:`~gnnattn.nn.GPSConv`'s
    ``attn_graph``).

    Args:
        edge_index (Tensor): ``[2, |E|]`` input edges (int64 or int32; a
            ``torch_geometric.EdgeIndex`` too).
        num_nodes (int, optional): :math:`N`, the real nodes; defaults to
            ``batch``'s length, else ``max id + 1``. (default: :obj:`None`)
        expander_degree (int, optional): :math:`d` of the expander, ``0`` for
            none. (default: ``3``)
        virtual_nodes (int, optional): :math:`k` per graph, ``0`` for none.
            (default: ``1``)
        seed (int): the expander's seed: the same seed and inputs, the same graph.
        batch (Tensor, optional): sorted graph id of every node, ``[N]``.
            (default: :obj:`None`, one graph)
        self_loops (bool, optional): add :math:`i \to i` for every node.
            (default: :obj:`True`)

    Shapes:
        - **output:** a :class:`ComposedGraph` of :math:`N + kG` nodes
          (:math:`G` graphs), on ``edge_index``'s device.

    Example:
        >>> ring = torch.tensor([[0, 1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 0]])
        >>> g = exphormer_graph(ring, 6, expander_degree=2, virtual_nodes=1, seed=0)
        >>> g  # 6 + 1 nodes: the ring's 6 nodes and one virtual node
        ComposedGraph(num_nodes=7, num_edges=35, real=6, virtual=1, expander_degree=2)
        >>> g.composition.kind_counts()  # the ring both ways, 2 expander edges not in it
        {'input': 12, 'expander': 4, 'to_virtual': 6, 'from_virtual': 6, 'self_loop': 7}
    """
    check_int(expander_degree, "expander_degree")
    check_int(virtual_nodes, "virtual_nodes")
    check_bool(self_loops, "self_loops")
    gen = _generator(seed)
    check_tensor(edge_index, "edge_index")
    ei_plain = plain(edge_index)
    if num_nodes is None:
        if isinstance(batch, Tensor):
            num_nodes = batch.numel()
        elif ei_plain.numel():
            num_nodes = int(ei_plain.max()) + 1
        else:
            num_nodes = 0
    ei = _input_edges(ei_plain, num_nodes)
    n, graph, starts, lengths = _graphs(num_nodes, batch)
    k = virtual_nodes
    total = n + k * lengths.numel()
    _check_size(total)
    parts = _both_ways(ei, _INPUT)
    expander = _expander_pairs(graph, starts, lengths, expander_degree, max(n, 1), gen)
    parts += _both_ways(expander, _EXPANDER)
    if k:
        parts += _virtual_edges(graph, n, k)
    if self_loops:
        loop = torch.arange(total)
        parts.append((loop, loop, _SELF))
    composition = {
        "num_real": n,
        "num_virtual": k * lengths.numel(),
        "virtual_per_graph": k,
        "num_graphs": lengths.numel(),
        "expander_degree": expander_degree,
        "seed": seed,
    }
    return _assemble(parts, total, composition, _device(None, ei_plain))
