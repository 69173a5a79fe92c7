r"""The graph object: an edge set and what is derived from it, built once, held by the caller.

:class:`AttentionGraph` is to gnnattn what ``BlockMask`` is to FlexAttention
and ``EdgeIndex`` to PyG: the caller builds it once and passes it to every
layer and every call. It holds the edges (in the caller's order), the number
of sources and targets, the structure (complete / causal / window / batched,
known from the builder or detected once), and, built lazily on first use and
then kept, the destination CSR (forward, ``dq``) and the transposed CSR
(``dk``/``dv``). No module of gnnattn keeps data about a tensor or a
graph (its only module-level caches are keyed by kernel modules and source
files).

Safety. Derived tensors are made outside inference mode, so a graph first
used under ``torch.inference_mode()`` still trains; lazy builds take the
object's own lock; derived data (the kernels' plans among it) lives in the
object's :meth:`~AttentionGraph.derived` cache. A graph raises if the
caller's edges were changed in place after it was built (its CSR would be
stale).
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import threading
import weakref
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any, TypeVar

import torch
from torch import Tensor

from ..checks import check_bool, check_int
from ..kernels.common import outside_func_transforms, plain_index
from .builders import resolve_lengths, structured_edge_index
from .csr import CSC, CSR, _on_host, _to_csr, _transpose_csr, segment_ids
from .inputs import canonical_device, normalize
from .structure import Structure, detect_structure
from .validate import check_edge_index

__all__ = ["AttentionGraph"]

#: The key of :meth:`AttentionGraph.block_starts` in the graph's derived data.
BLOCK_STARTS = "block starts"

_T = TypeVar("_T")


def _unchanged(ref: weakref.ref[Tensor], version: int) -> bool:
    """Whether a tensor the graph was built from is gone or as it was then."""
    t = ref()
    return t is None or t._version == version


@contextlib.contextmanager
def _building(lock: threading.RLock | None) -> Iterator[None]:
    """Where derived index tensors are made: under the graph's lock, never as inference
    tensors, never as a ``torch.func`` transform's.

    Index tensors made under ``torch.inference_mode()`` cannot be saved for
    backward later; ``inference_mode(False)`` makes ordinary tensors even when
    the caller is in inference mode. Inside a ``torch.func`` transform
    (``grad``, ``vmap``) an op's results are the transform's wrapped tensors,
    which die with it and which the compiled kernels cannot read: the transforms
    are disabled here, so a graph first used inside one keeps plain tensors.
    Under ``torch.compile`` nothing is stored (see
    :meth:`AttentionGraph._derive`), so none of it is needed.
    """
    if torch.compiler.is_compiling():
        yield
        return
    with lock or contextlib.nullcontext(), torch.inference_mode(False), outside_func_transforms():
        yield


def _host_builder(t: Any, name: str) -> Callable[..., Any] | None:
    """The kernel module's ``name`` (``csr_plan_tensors`` / ``csc_plan_tensors``: a
    layout made with its plan in one pass) for indices ``t`` on the host, or ``None``
    where the layout and its plan are made apart (another device, under compile, a
    module without it)."""
    if not isinstance(t, Tensor) or not _on_host(t):
        return None
    from ..kernels import get

    return getattr(get(t.device), name, None)


def _host_csr(
    make: Callable[..., Any], edge_index: Tensor, num_dst: int, num_src: int
) -> tuple[CSR, Tensor]:
    """The CSR of unchecked edges on the host, and the CPU kernels' plan of it.

    One compiled pass checks the ids, sorts by target and splits the work:
    on a batch of molecules, where a layer gets a new ``edge_index`` every
    call, the separate check, sort and split cost as much as the attention.
    """
    with torch.inference_mode(False):
        made = make(edge_index, num_dst, num_src)
    if made is None:
        check_edge_index(edge_index, num_src, num_dst)  # raises, naming the id
        raise AssertionError("an id out of range that check_edge_index accepts")
    ptr, col, perm, plan = made
    return CSR(ptr, col, perm), plan


class AttentionGraph:
    r"""An edge set for attention, with its structure and compressed layouts.

    Messages flow along ``edge_index[0] -> edge_index[1]`` (source :math:`j`
    to target :math:`i`); attention normalizes over each target's incoming
    edges. Build one with a builder (:meth:`complete`, :meth:`causal`,
    :meth:`window`, :meth:`bipartite`, :meth:`from_batch`: the structure is
    known without detection and the edges are only made if a backend needs
    them) or from any edge set:

    * a ``[2, |E|]`` int64/int32 ``edge_index``;
    * a ``torch_geometric.EdgeIndex`` (its ``sparse_size`` is checked);
    * a ``torch.sparse`` adjacency in PyG's ``adj_t`` convention, shape
      ``[N_dst, N_src]``, row = target, column = source, COO, CSR or CSC
      (its values are not used: attention computes its own weights; pass
      edge features as ``edge_attr``).

    With ``causal=True`` the edges :math:`j > i` are dropped here, once
    (:attr:`input_edges` says which of the given edges were kept).

    Pass the object wherever a layer takes ``edge_index``; one object serves
    every layer, every call, forward and backward, on the device it was moved
    to with :meth:`to`.

    Args:
        edge_index (Tensor): the edges, as above.
        num_nodes (int, optional): number of targets :math:`N`; defaults to
            the adjacency's or ``EdgeIndex``'s size, else ``max id + 1``.
            (default: :obj:`None`)
        num_src (int, optional): number of sources :math:`M` of a bipartite
            graph (cross-attention); default: square, :math:`M = N`.
            (default: :obj:`None`)
        causal (bool, optional): keep only the edges :math:`j \le i`.
            (default: :obj:`False`)

    Shapes:
        - **edge_index:** ``[2, |E|]``; the object's :attr:`edge_index` is the
          kept edges, ``[2, |E'|]`` int64, in the order they were given.
        - :attr:`csr`: ``ptr [N + 1]``, ``col [|E'|]``, ``perm [|E'|]`` or
          ``None``; :attr:`csc`: ``ptr [M + 1]``, ``row [|E'|]``,
          ``perm [|E'|]``.

    Example:
        >>> g = AttentionGraph.causal(4)
        >>> g
        AttentionGraph(num_nodes=4, num_edges=10, structure=Structure('causal', lengths=[4]))
        >>> g.csr.ptr
        tensor([ 0,  1,  3,  6, 10])
        >>> from gnnattn.graphs import complete_graph
        >>> g2 = AttentionGraph(complete_graph(4), causal=True)  # pruned once, detected
        >>> g2.structure, g2.num_edges
        (Structure('causal', lengths=[4]), 10)
    """

    def __init__(
        self,
        edge_index: Tensor,
        num_nodes: int | None = None,
        *,
        num_src: int | None = None,
        causal: bool = False,
    ) -> None:
        check_int(num_nodes, "num_nodes", optional=True)
        check_int(num_src, "num_src", optional=True)
        check_bool(causal, "causal")
        edge_index = plain_index(edge_index, "edge_index")
        with outside_func_transforms():
            # Edges on the host are checked by the pass that makes their CSR.
            make = None if causal else _host_builder(edge_index, "csr_plan_tensors")
            ei, n_dst, n_src, csr = normalize(edge_index, num_nodes, num_src, check=make is None)
            if causal and n_src is not None:
                raise ValueError(
                    "Expected a square graph with causal=True (causal order relates tokens of one "
                    f"sequence), got a bipartite one ({n_src} sources, {n_dst} targets, from "
                    "num_src or the sizes of the EdgeIndex or adjacency): give a square one"
                )
            m = n_src if n_src is not None else n_dst
            plan = None
            if make is not None and csr is None and ei is not None:
                csr, plan = _host_csr(make, ei, n_dst, m)
            self._init(ei, n_dst, m, n_src is not None, csr=csr)
            if plan is not None:
                self._cache[self._plan_key("csr")] = plan
            if causal:
                self._prune_causal()
            if not torch.compiler.is_compiling() and edge_index is not self._edge_index:
                # What the caller gave, where the graph holds a copy or a pruned version
                # (int32 ids, causal=True, a sparse adjacency, an EdgeIndex), with its
                # version: a change in place is refused there too. Weak: the graph must
                # not keep alive what it copied. (An inference tensor has no version,
                # and cannot be changed outside inference mode.)
                if not edge_index.is_inference():
                    self._sources: tuple[tuple[weakref.ref[Tensor], int], ...] = (
                        (weakref.ref(edge_index), edge_index._version),
                    )

    # ------------------------------------------------------------ construction

    def _init(
        self,
        edge_index: Tensor | None,
        num_dst: int,
        num_src: int,
        bipartite: bool,
        structure: Structure | None = None,
        device: torch.device | None = None,
        csr: CSR | None = None,
    ) -> None:
        # A lock cannot be made inside torch.compile; a graph built there (from
        # lengths, in the compiled region) has none and builds without one.
        self._lock = None if torch.compiler.is_compiling() else threading.RLock()
        # With the version counter of the edges as given: a later in-place change
        # of the caller's tensor is detected instead of read through a stale CSR.
        self._set_edges(edge_index)
        self._sources = ()
        self._cache: dict[Hashable, Any] = {}
        self.num_dst = num_dst
        self.num_src = num_src
        self.is_bipartite = bipartite
        self._structure = structure
        self._detected = structure is not None or bipartite
        if edge_index is None and csr is not None:
            device = csr.ptr.device  # a CSR adjacency: edges made only when asked for
        self._device = canonical_device(edge_index.device if edge_index is not None else device)
        self._csr: CSR | None = csr
        self._csc: CSC | None = None
        self._input_edges: Tensor | None = None
        self._num_input_edges: int | None = None
        self._is_causal = structure is not None and structure.is_causal
        self._causal_view: AttentionGraph | None = None
        # A causal view made without its parent's edges: the parent, to find
        # which of its edges were kept when edge features come in its order.
        self._parent: AttentionGraph | None = None
        self._bipartite_complete = False

    @classmethod
    def _structured(
        cls,
        kind: str,
        lengths: tuple[int, ...],
        window: int = 0,
        device: torch.device | str | None = None,
    ) -> AttentionGraph:
        n = sum(lengths)
        return cls._assembled(n, n, structure=Structure(kind, lengths, window), device=device)

    @classmethod
    def _assembled(
        cls,
        num_dst: int,
        num_src: int,
        *,
        edge_index: Tensor | None = None,
        bipartite: bool = False,
        structure: Structure | None = None,
        device: torch.device | str | None = None,
        csr: CSR | None = None,
    ) -> AttentionGraph:
        """A graph from parts already checked (builders, views, a graph part's CSR):
        the one way around :meth:`__init__`'s validation."""
        g = cls.__new__(cls)
        dev = torch.device(device or "cpu")
        g._init(edge_index, num_dst, num_src, bipartite, structure, dev, csr=csr)
        return g

    @classmethod
    def complete(
        cls,
        num_nodes: int | None = None,
        *,
        batch: Tensor | None = None,
        lengths: Sequence[int] | None = None,
        device: torch.device | str | None = None,
    ) -> AttentionGraph:
        """The complete graph (self-loops included), one per sequence of ``batch``
        or of ``lengths`` (a list of ints: no batch vector, no device read).

        Example:
            >>> AttentionGraph.complete(batch=torch.tensor([0, 0, 1])).structure
            Structure('complete', lengths=[2, 1])
            >>> AttentionGraph.complete(lengths=[2, 1]).num_edges
            5
        """
        lengths, dev = resolve_lengths(num_nodes, batch, lengths)
        return cls._structured("complete", lengths, device=device or dev)

    @classmethod
    def causal(
        cls,
        num_nodes: int | None = None,
        *,
        batch: Tensor | None = None,
        lengths: Sequence[int] | None = None,
        device: torch.device | str | None = None,
    ) -> AttentionGraph:
        r"""The causal graph (:math:`j \le i`), one per sequence of ``batch`` or of
        ``lengths``.

        Example:
            >>> AttentionGraph.causal(lengths=[3, 2]).num_edges
            9
        """
        lengths, dev = resolve_lengths(num_nodes, batch, lengths)
        return cls._structured("causal", lengths, device=device or dev)

    @classmethod
    def window(
        cls,
        num_nodes: int | None = None,
        *,
        window: int,
        causal: bool = False,
        batch: Tensor | None = None,
        lengths: Sequence[int] | None = None,
        device: torch.device | str | None = None,
    ) -> AttentionGraph:
        r"""The sliding window :math:`|i - j| \le w` (causal: :math:`0 \le i - j \le w`).

        A window at least as wide as the sequence is the complete (causal)
        graph, and is marked as such.
        """
        check_int(window, "window")
        check_bool(causal, "causal")
        lengths, dev = resolve_lengths(num_nodes, batch, lengths)
        if lengths and window >= max(lengths) - 1:
            return cls._structured(
                "causal" if causal else "complete", lengths, device=device or dev
            )
        kind = "causal_window" if causal else "window"
        return cls._structured(kind, lengths, window, device=device or dev)

    @classmethod
    def from_batch(
        cls, batch: Tensor, *, causal: bool = False, num_nodes: int | None = None
    ) -> AttentionGraph:
        """One complete (or causal) graph per sequence of a PyG ``batch`` vector."""
        check_bool(causal, "causal")
        return (
            cls.causal(num_nodes, batch=batch) if causal else cls.complete(num_nodes, batch=batch)
        )

    @classmethod
    def bipartite(
        cls, num_src: int, num_dst: int, *, device: torch.device | str | None = None
    ) -> AttentionGraph:
        """Every target attends to every source (cross-attention)."""
        check_int(num_src, "num_src")
        check_int(num_dst, "num_dst")
        g = cls._assembled(num_dst, num_src, bipartite=True, device=device)
        g._bipartite_complete = True
        return g

    # ------------------------------------------------------------ derived data

    def derived(self, key: Hashable, build: Callable[[], _T]) -> _T:
        """What ``build()`` returns, made on the first call for ``key`` and kept.

        The graph's cache of derived data (the kernels' work plans, index
        layouts for a device): built once per key under this object's lock,
        outside inference mode, and gone with the object. Under
        ``torch.compile`` the value is built and returned, not stored.

        Example:
            >>> g = AttentionGraph.causal(3)
            >>> g.derived("degrees", lambda: g.csr.ptr.diff())
            tensor([1, 2, 3])
        """
        cache = self._cache
        if key in cache:
            return cache[key]
        if torch.compiler.is_compiling():
            return build()
        with _building(self._lock):
            if key not in cache:
                cache[key] = build()
        return cache[key]

    def peek(self, key: Hashable) -> Any:
        """What :meth:`derived` holds for ``key``, or ``None`` when it was not made."""
        return self._cache.get(key)

    def kernel_layout(self, layout: str) -> tuple[Tensor, ...]:
        """The index tensors of the fused kernels for ``layout``, in the width the device's
        kernels take: ``"csr"`` ``(ptr, col)``, ``"csc"`` ``(tptr, trow, tperm)``.

        On the CPU as held (int32 where narrow); int64 elsewhere (Triton's).
        """
        t = tuple(self.csr[:2]) if layout == "csr" else tuple(self.csc)
        if self._device.type == "cpu":
            return t
        return self.derived((layout, "int64"), lambda: tuple(x.long() for x in t))

    def kernel_plan(self, layout: str) -> Tensor:
        """The fused kernels' checked work plan of ``layout`` (``"csr"`` or ``"csc"``),
        as the operators take it (tensors); made once, on first use.

        Inside ``torch.compile`` a plan not yet made is not made (that reads the
        indices) and the tensor is empty: the operator then checks and plans
        inside its call, which is correct, only slower. One eager call or
        :meth:`prepare` makes the plans before compiling.
        """
        key = self._plan_key(layout)
        if torch.compiler.is_compiling():
            made = self.peek(key)
            return made if made is not None else torch.empty(0, dtype=torch.int64)
        from ..kernels.library import plan_tensors

        idx = self.kernel_layout(layout)
        # The graph made these layouts from checked edges: planned without a second check.
        if layout == "csr":
            return self.derived(
                key, lambda: plan_tensors(idx[0], idx[1], self.num_src, check=False)
            )
        return self.derived(
            key, lambda: plan_tensors(idx[0], idx[1], self.num_dst, perm=idx[2], check=False)
        )

    def _plan_key(self, layout: str) -> tuple[str, str, str]:
        return ("plan", self._device.type, layout)

    def prepare(self, backward: bool = True) -> AttentionGraph:
        """Make what a call reads (the structure, a batch's :meth:`block_starts`, the
        CSR, with ``backward`` the transposed CSR, the kernels' plans and, on the CPU
        where the tiles pay, the tile plan) now rather than on first use; returns
        the graph.

        Before ``torch.compile`` or ``torch.export``: the compiled call then
        finds them, instead of planning inside every call.

        Example:
            >>> g = AttentionGraph(torch.tensor([[0, 1, 2], [1, 2, 0]])).prepare()
            >>> g.kernel_plan("csr").dtype
            torch.int64
        """
        s = self.structure  # detected now: a compiled region cannot read the edges for it
        if s is not None and not s.uniform:
            self.block_starts()  # made from every length: a compiled call would guard on each
        self.kernel_plan("csr")
        if backward:
            self.kernel_plan("csc")
        from .blocks import TILES_MIN_EDGES, TILES_MIN_FILL, block_plan, fill_estimate, sdpa_first

        # What "auto" reads to take the tiles (on the CPU only): a compiled call must
        # find the plan, which it cannot make (it reads the edges). Not where "auto"
        # takes SDPA first (complete, causal or dense structure): a plan there is
        # memory (more than the CSR) that no call reads.
        tiles_may_run = self._device.type == "cpu" and not sdpa_first(self, s)
        if tiles_may_run and self.num_edges >= TILES_MIN_EDGES:
            if fill_estimate(self) >= TILES_MIN_FILL:
                block_plan(self)
        return self

    def block_starts(self) -> Tensor:
        """The first node of each block of a structured graph, then :math:`N`: int64
        ``[B + 1]`` on the graph's device, made once.

        Example:
            >>> AttentionGraph.complete(lengths=[2, 3]).block_starts()
            tensor([0, 2, 5])
        """
        s = self.structure
        if s is None:
            raise ValueError(
                "Expected a graph of blocks (complete, causal or window structure), got one "
                "without structure"
            )
        return self.derived(
            BLOCK_STARTS,
            lambda: torch.tensor(
                [0, *itertools.accumulate(s.lengths)], dtype=torch.int64, device=self._device
            ),
        )

    def _set_edges(self, edge_index: Tensor | None) -> None:
        self._edge_index = edge_index
        self._edge_version = edge_index._version if edge_index is not None else None

    def _check_unchanged(self) -> None:
        ei = self._edge_index
        if torch.compiler.is_compiling() or (
            (ei is None or ei._version == self._edge_version)
            and (not self._sources or all(_unchanged(r, v) for r, v in self._sources))
        ):
            return
        raise ValueError(
            "Expected the edges of an AttentionGraph unchanged since it was built, got an "
            "edge_index modified in place (its CSR and plans would be stale); build a new "
            "AttentionGraph from the changed edges (or pass edge_index.clone() when building)"
        )

    def __getstate__(self) -> dict[str, Any]:
        # A copy (pickle, deepcopy, to()) starts a fresh version count: edges
        # changed in place since building would pass unnoticed with the stale CSR.
        self._check_unchanged()
        # The lock cannot be pickled, and derived data is rebuilt on demand.
        state = dict(self.__dict__)
        state.pop("_lock")
        state["_cache"] = {}
        state["_sources"] = ()  # the copy's edges are its own
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._sources = ()  # (a pickle made before the graph kept them has none)
        self._lock = threading.RLock()
        self._set_edges(self._edge_index)  # a fresh tensor, with a fresh version counter

    def _derive(self, attr: str, build: Any) -> Any:
        """``self.<attr>``, built by ``build()`` on first use and kept.

        Under ``torch.compile`` the value is traced and returned, not stored:
        storing would mutate the object inside the compiled region (build the
        graph's layouts before compiling, or let the region break there).
        """
        value = getattr(self, attr)
        if value is not None:
            return value
        if torch.compiler.is_compiling():
            return build()
        with _building(self._lock):
            value = getattr(self, attr)
            if value is None:
                value = build()
                if attr == "_edge_index":
                    self._set_edges(value)
                else:
                    setattr(self, attr, value)
        return value

    def _build_edge_index(self) -> Tensor:
        csr = self._csr
        if csr is not None:
            # Given as a CSR adjacency (other graphs make their CSR from their
            # edges, so never get here with one): the edges in CSR order.
            return torch.stack([csr.col.long(), segment_ids(csr.ptr, csr.col.numel())])
        if self._bipartite_complete:
            from .builders import complete_bipartite_graph

            return complete_bipartite_graph(self.num_src, self.num_dst, device=self._device)
        s = self._structure
        assert s is not None, "a graph without edges must have a structure"
        return structured_edge_index(s.kind, s.lengths, s.window, device=self._device)

    @property
    def edge_index(self) -> Tensor:
        """The edges, ``[2, |E|]`` int64, in the caller's order (built on first use)."""
        self._check_unchanged()
        return self._derive("_edge_index", self._build_edge_index)

    @property
    def csr(self) -> CSR:
        """Destination-sorted CSR (``ptr``, ``col``, ``perm``), built once."""
        self._check_unchanged()
        return self._derive("_csr", lambda: _to_csr(self.edge_index, self.num_dst, self.num_src))

    @property
    def csc(self) -> CSC:
        """The transposed CSR (edges grouped by source), built once.

        On the CPU its ``row`` and ``perm`` are int32 when the ids fit (half
        the memory; the CPU kernels take either width).
        """

        def build() -> CSC:
            csr = self.csr
            narrow = self._device.type == "cpu" and max(self.num_dst, csr.col.numel()) < 2**31
            dtype = torch.int32 if narrow else torch.int64
            make = _host_builder(csr.col, "csc_plan_tensors")
            if make is not None and csr.ptr.dtype == torch.int64:
                # With the kernels' plan of it, made in the same pass.
                tptr, trow, tperm, plan = make(csr.ptr, csr.col, self.num_src, dtype)
                self._cache.setdefault(self._plan_key("csc"), plan)
                return CSC(tptr, trow, tperm)
            return _transpose_csr(csr.ptr, csr.col, self.num_src, dtype=dtype)

        return self._derive("_csc", build)

    @property
    def structure(self) -> Structure | None:
        """Complete / causal / window structure, or ``None``; detected once."""
        if not self._detected:
            if torch.compiler.is_compiling():
                return None  # detection reads tensor values
            with _building(self._lock):
                if not self._detected:
                    s = detect_structure(self.csr, self.num_dst, self.num_src)
                    self._structure = s
                    self._is_causal = self._is_causal or (s is not None and s.is_causal)
                    self._detected = True
        return self._structure

    @property
    def num_nodes(self) -> int:
        """The number of targets :math:`N` (rows of the attention matrix)."""
        return self.num_dst

    @property
    def num_edges(self) -> int:
        if self._edge_index is None:
            if self._csr is not None:
                return self._csr.col.numel()
            if self._bipartite_complete:
                return self.num_src * self.num_dst
            assert self._structure is not None
            return self._structure.num_edges
        # Not int(): a traced size (torch.export, dynamic torch.compile) stays symbolic.
        return self._edge_index.shape[1]

    @property
    def density(self) -> float:
        """``|E| / (N M)``: how much of the dense matrix the graph fills."""
        return self.num_edges / max(self.num_dst * self.num_src, 1)

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def is_causal(self) -> bool:
        r"""Whether every edge is :math:`j \to i` with :math:`j \le i` (known, not tested)."""
        return self._is_causal

    @property
    def input_edges(self) -> Tensor | None:
        """For a graph pruned with ``causal=True``: positions of the kept edges in the
        given ``edge_index`` (for the causal view of a structured graph, in its
        parent's edges, built for this); ``None`` when every given edge was kept."""
        parent = self._parent
        if self._input_edges is None and parent is not None:
            with _building(self._lock):
                if self._input_edges is None and parent.num_edges != self.num_edges:
                    pe = parent.edge_index
                    # The parent's edges are sorted as the view's: the kept ones, in order.
                    self._input_edges = (pe[0] <= pe[1]).nonzero().view(-1)
                    self._num_input_edges = parent.num_edges
        return self._input_edges

    @property
    def num_input_edges(self) -> int:
        """How many edges :attr:`input_edges` indexes: those given before causal pruning
        (a structured graph's causal view: its parent's), else :attr:`num_edges`."""
        if self._input_edges is not None and self._num_input_edges is not None:
            return self._num_input_edges
        if self._parent is not None:
            return self._parent.num_edges
        return self.num_edges

    # ------------------------------------------------------------ views

    def _prune_causal(self) -> None:
        """Drop the edges :math:`j > i`, once (at construction)."""
        ei = self.edge_index
        assert not self.is_bipartite
        if torch.compiler.is_compiling():
            raise ValueError(
                "Expected the causal graph to be built outside torch.compile (pruning gives a "
                "data-dependent number of edges): build AttentionGraph(edge_index, causal=True) "
                "before the compiled call and pass it in"
            )
        with _building(self._lock):
            keep = ei[0] <= ei[1]  # (E,)
            if not bool(keep.all()):
                idx = keep.nonzero().view(-1)  # (E',) kept positions, in order
                self._input_edges = idx
                self._num_input_edges = int(ei.shape[1])
                self._set_edges(ei[:, idx])
                self._csr = None
        self._is_causal = True

    def causal_view(self) -> AttentionGraph:
        r"""This graph without its edges :math:`j > i`: itself if it has none, else a
        pruned graph, made on first call and kept by this object.

        A structured graph's view keeps the structure (complete becomes causal,
        a window a causal window), whether or not its edges were built.
        """
        if self._is_causal:
            return self
        self._check_unchanged()
        if self.is_bipartite:
            raise ValueError(
                "Expected a square graph for causal attention (causal order relates tokens "
                "of one sequence), got a bipartite one"
            )
        if self._causal_view is not None:
            return self._causal_view
        s = self._structure
        with _building(self._lock):
            if self._causal_view is None:
                n = self.num_dst
                if s is not None and self._edge_index is None:
                    # Edges never built: the view needs none either.
                    view = AttentionGraph._assembled(n, n, device=self._device)
                    view._is_causal = True
                    view._parent = self
                else:
                    view = AttentionGraph._assembled(n, n, edge_index=self.edge_index)
                    view._prune_causal()
                    # The view refuses a change in place of the edges it was pruned
                    # from (and of what they came from), as this graph does.
                    assert self._edge_index is not None and self._edge_version is not None
                    view._sources = (
                        *self._sources,
                        (weakref.ref(self._edge_index), self._edge_version),
                    )
                if s is not None:
                    view._structure = s.causal()
                    view._detected = True
                self._causal_view = view
        return self._causal_view

    def select_edges(self, edge_attr: Tensor, name: str = "edge_attr") -> Tensor:
        """``edge_attr`` for this graph's edges: as given when it has one row per
        edge, or the kept rows when it follows the edges before causal pruning."""
        e = self.num_edges
        rows = edge_attr.shape[0] if edge_attr.dim() >= 1 else -1
        if rows == e:
            return edge_attr
        if self._input_edges is not None and rows == self._num_input_edges:
            return edge_attr[self._input_edges]
        parent = self._parent
        if parent is not None and rows == parent.num_edges:
            pe = parent.edge_index
            return edge_attr[(pe[0] <= pe[1]).nonzero().view(-1)]
        before = self._num_input_edges if parent is None else parent.num_edges
        rest = "".join(f", {d}" for d in edge_attr.shape[1:])
        alt = "" if before is None else f" (or [{before}{rest}], before causal pruning)"
        raise ValueError(
            f"Expected '{name}' of shape [{e}{rest}]{alt} (one row per edge of the graph), "
            f"got {list(edge_attr.shape)}"
        )

    def to(self, device: torch.device | str) -> AttentionGraph:
        """The same graph on ``device`` (what was built moves with it)."""
        device = canonical_device(device)
        self._check_unchanged()
        if device == self._device:
            return self
        g = copy.copy(self)  # a new lock and an empty cache: see __getstate__
        g._device = device
        g._parent = self._parent.to(device) if self._parent is not None else None

        def move(t: Any) -> Any:
            if t is None:
                return None
            if isinstance(t, tuple):
                return type(t)(*(move(x) for x in t))
            if t.dtype == torch.int32 and device.type != "cpu":
                # Kept narrow for the CPU kernels; the others take int64.
                return t.to(device, torch.int64)
            return t.to(device)

        with _building(self._lock):
            g._set_edges(move(self._edge_index))
            g._csr = move(self._csr)
            g._csc = move(self._csc)
            g._input_edges = move(self._input_edges)
            g._causal_view = None
        return g

    def cpu(self) -> AttentionGraph:
        return self.to("cpu")

    def cuda(self, device: int | None = None) -> AttentionGraph:
        return self.to(torch.device("cuda", device) if device is not None else "cuda")

    def to_pyg(self) -> Any:
        """The edges as a ``torch_geometric.EdgeIndex`` with its sizes (and sort order
        when the edges are sorted by target)."""
        from torch_geometric import EdgeIndex

        sort_order = "col" if self.csr.perm is None else None
        return EdgeIndex(
            self.edge_index, sparse_size=(self.num_src, self.num_dst), sort_order=sort_order
        )

    def check_nodes(self, num_src: int, num_dst: int, device: torch.device) -> None:
        """Raise unless ``x`` (``num_src`` / ``num_dst`` rows on ``device``) fits the graph,
        and its edges were not changed in place since it was built (every call checks: the
        structure and plans kept from them would be stale on every backend)."""
        self._check_unchanged()
        if device != self._device:
            raise ValueError(
                f"Expected the graph on the device of x ({device}), got {self._device}; "
                f"move it with graph.to({str(device)!r})"
            )
        if num_dst != self.num_dst or num_src != self.num_src:
            if self.is_bipartite or num_src != num_dst:
                raise ValueError(
                    f"Expected x with {self.num_src} source and {self.num_dst} target rows "
                    f"(the graph's sizes), got {num_src} and {num_dst}"
                )
            raise ValueError(
                f"Expected 'x' with {self.num_dst} rows (the graph's number of nodes), "
                f"got {num_dst}"
            )

    def __repr__(self) -> str:
        size = (
            f"num_src={self.num_src}, num_dst={self.num_dst}"
            if self.is_bipartite
            else f"num_nodes={self.num_dst}"
        )
        struct = f", structure={self._structure!r}" if self._structure is not None else ""
        causal = ", causal=True" if self._is_causal and self._structure is None else ""
        return f"AttentionGraph({size}, num_edges={self.num_edges}{struct}{causal})"
