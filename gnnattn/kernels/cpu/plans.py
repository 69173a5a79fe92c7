"""Plans (a CSR checked once, and how a pass over it is split), and the checks of a call.

**Work split.** The ``prange`` iterations of a pass are chunks of
consecutive targets (for the source pass, of consecutive sources), about
``4 x threads`` of them, cut so that each holds about the same number of
edges. A segment with more than ``max(2048, E / 64)`` edges (a hub) is cut
into pieces of that many edges, each reduced on its own and combined
afterwards in piece order (the online softmax's ``(max, sum, acc)`` merge
forward, plain sums backward); the cut depends only on the graph, never on
the thread count, so neither do the results: every sum over a segment or a
piece is made by one thread in one compiled loop, in a fixed order.

**Plans.** :func:`plan` checks a CSR (``ptr`` well formed, every id in
range: the compiled gathers do not bounds-check) and makes the split, once
per graph: the graph object keeps the result and passes it to every call
as ``plan=`` (and the transposed CSR's as ``csc_plan=``), and a call given
plans reads neither index array nor splits anything; it only checks the
O(1) things (shapes, dtypes). A call without plans checks and plans on its
own, every time. A plan is made for the thread count of its time
(:attr:`CPUPlan.threads`: about four chunks per thread); used under another
count it gives the same results, only balanced for the other.

**Index width.** ``ptr`` is int64; ``col`` (and the transposed CSR's ``row``
and ``perm``) may be int32 or int64: numba compiles a version for each.
:class:`gnnattn.AttentionGraph` keeps its transposed CSR in int32 on the CPU
and an int32 CSR adjacency as given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numba
import numpy as np
import torch
from torch import Tensor

from ..common import Dropout, check_index, check_ptr
from ._random import stream
from .layouts import csc_planned, csr_planned, split

_CHUNKS_PER_THREAD = 4
# Hubs: a segment longer than max(_PIECE_MIN, E // _PIECES) edges is cut.
_PIECE_MIN = 2048
_PIECES = 64


def _threads() -> int:
    """torch's thread count (what users set), given to numba's own pool too."""
    limit = numba.config.NUMBA_NUM_THREADS  # type: ignore[attr-defined]
    n = max(1, min(torch.get_num_threads(), limit))
    numba.set_num_threads(n)
    return n


def _piece_limit(num_edges: int) -> int:
    """Longest segment reduced in one piece; depends only on the graph."""
    return max(_PIECE_MIN, num_edges // _PIECES)


class _Plan:
    """How one pass over a CSR is split: chunks of whole segments, and hub pieces.

    Attributes:
        bounds: ``[K + 1]`` segment boundaries of the chunks (about equal
            edge counts, hubs counted as ``limit``).
        limit: segments with more edges are skipped by the chunks and cut
            into pieces.
        pieces: ``[P, 3]`` (segment, start, end) of every hub piece, hub
            after hub; ``[0, 3]`` when there is no hub.
        seg: ``[S + 1]``: the pieces of hub ``s`` are ``seg[s]:seg[s+1]``.
    """

    bounds: np.ndarray
    limit: int
    pieces: np.ndarray
    seg: np.ndarray

    @classmethod
    def make(cls, ptr: Tensor, num_edges: int, threads: int) -> _Plan:
        """The split of a CSR with ``ptr`` for ``threads``."""
        return cls.unpack(_packed(ptr, num_edges, threads).numpy(), num_edges)

    @classmethod
    def unpack(cls, flat: np.ndarray, num_edges: int) -> _Plan:
        """The plan packed by :func:`_packed` (views of ``flat``, nothing copied)."""
        k, p, s = flat[:3].tolist()
        work = cls()
        work.bounds = flat[3 : 3 + k]
        work.pieces = flat[3 + k : 3 + k + 3 * p].reshape(p, 3)
        work.seg = flat[3 + k + 3 * p : 3 + k + 3 * p + s]
        work.limit = _piece_limit(num_edges)
        return work


def _chunks(num_rows: int, threads: int) -> int:
    return max(1, min(num_rows, _CHUNKS_PER_THREAD * threads))


def _packed(ptr: Tensor, num_edges: int, threads: int) -> Tensor:
    """The split of a CSR with ``ptr`` for ``threads``, packed in one int64 tensor:
    ``[K + 1, P, S + 1, bounds..., pieces..., seg...]`` (:func:`.layouts.split`)."""
    # Plain ints: under torch.jit.trace numel() is traced, which numba cannot type.
    e, k = int(num_edges), _chunks(int(ptr.numel()) - 1, threads)
    return split(ptr, e, k, _piece_limit(e))


@dataclass(frozen=True, eq=False)
class CPUPlan:
    """A checked CSR and its work split, from :func:`plan`.

    Attributes:
        ptr: int64 ``[N + 1]`` pointers (a numpy view of the checked tensor).
        col: int32/int64 ``[E]`` column ids, each in ``[0, num_cols)``.
        perm: int32/int64 ``[E]`` ids in ``[0, E)`` (the transposed CSR's
            ``perm``), or ``None`` when not given.
        num_cols: what ``col`` was checked against.
        threads: the thread count the split was made for.
        work: the split (chunks and hub pieces).
    """

    ptr: np.ndarray
    col: np.ndarray
    perm: np.ndarray | None
    num_cols: int
    threads: int
    work: _Plan

    @property
    def num_rows(self) -> int:
        return int(self.ptr.shape[0]) - 1

    @property
    def num_edges(self) -> int:
        return int(self.col.shape[0])


def plan(ptr: Tensor, col: Tensor, num_cols: int, *, perm: Tensor | None = None) -> CPUPlan:
    """Check a CSR once and split the passes over it, for the current thread count.

    For the transposed CSR ``(tptr, trow, tperm)`` of a graph with ``N``
    targets, ``plan(tptr, trow, N, perm=tperm)``: the source pass reads the
    bias and the dropout stream at ``tperm[t]``, so ``perm`` is checked too
    and kept. A plan made without it (the reference's and the Triton kernels'
    signature) serves calls with those options only with ``csc=`` given
    alongside, whose ``tperm`` is then trusted unchecked.

    Args:
        ptr: int64 ``[N + 1]`` CSR pointers.
        col: int32/int64 ``[E]`` column of each entry.
        num_cols: ids of ``col`` must be in ``[0, num_cols)``.
        perm: optional int32/int64 ``[E]``, ids in ``[0, E)``.

    Returns:
        A :class:`CPUPlan`, for the kernels' ``plan=`` / ``csc_plan=``.

    Raises:
        TypeError, ValueError: naming the argument that is not as expected.
    """
    return _make_plan(ptr, col, num_cols, perm)


def plan_tensors(
    ptr: Tensor, col: Tensor, num_cols: int, *, perm: Tensor | None = None, check: bool = True
) -> Tensor:
    """:func:`plan` as the operators take it: the split in one int64 tensor.

    ``[K + 1, P, S + 1, bounds..., pieces..., seg...]``: the three lengths,
    then :class:`_Plan`'s arrays. The graph object keeps it and passes it to
    every call; the limit on a segment's length is a function of the edge
    count, so it is not stored. ``check=False`` for indices known to be valid (a
    graph's own layouts, made from checked edges).
    """
    if check:
        _check_csr(ptr, col, num_cols, perm, ("ptr", "col", "perm"))
    return _packed(ptr, col.numel(), _threads())


def csr_plan_tensors(
    edge_index: Tensor, num_dst: int, num_src: int
) -> tuple[Tensor, Tensor, Tensor | None, Tensor] | None:
    """``(ptr, col, perm, plan)``: the CSR of an int64 ``edge_index`` (as
    :func:`gnnattn.graphs.to_csr` makes it) and :func:`plan_tensors` of it, from one
    compiled pass that checks every id too; ``None`` when an id is out of range."""
    e = edge_index.shape[1]
    return csr_planned(edge_index, num_dst, num_src, _chunks(num_dst, _threads()), _piece_limit(e))


def csc_plan_tensors(
    ptr: Tensor, col: Tensor, num_src: int, dtype: torch.dtype
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(tptr, trow, tperm, plan)``: :func:`gnnattn.graphs.transpose_csr` of a CSR made
    from checked edges, and :func:`plan_tensors` of it, from one compiled pass."""
    e = col.shape[0]
    return csc_planned(ptr, col, num_src, dtype, _chunks(num_src, _threads()), _piece_limit(e))


def plan_from_tensors(
    ptr: Tensor, col: Tensor, num_cols: int, packed: Tensor, *, perm: Tensor | None = None
) -> CPUPlan:
    """The :class:`CPUPlan` of :func:`plan_tensors`' result (nothing is checked or scanned:
    the indices were checked when it was made)."""
    work = _Plan.unpack(packed.numpy(), col.numel())
    pm = perm.contiguous().numpy() if perm is not None else None
    c, q = ptr.contiguous().numpy(), col.contiguous().numpy()
    return CPUPlan(c, q, pm, int(num_cols), _threads(), work)


def _make_plan(
    ptr: Tensor,
    col: Tensor,
    num_cols: int,
    perm: Tensor | None,
    names: tuple[str, str, str] = ("ptr", "col", "perm"),
    check: bool = True,
) -> CPUPlan:
    """:func:`plan`; ``check=False`` for indices made here (a transposed CSR of checked ones)."""
    if check:
        _check_csr(ptr, col, num_cols, perm, names)
    p = ptr.contiguous().numpy()
    c = col.contiguous().numpy()
    pm = perm.contiguous().numpy() if perm is not None else None
    threads = _threads()
    work = _Plan.make(ptr, c.shape[0], threads)
    return CPUPlan(p, c, pm, int(num_cols), threads, work)


def _check_csr(
    ptr: Tensor, col: Tensor, num_cols: int, perm: Tensor | None, names: tuple[str, str, str]
) -> None:
    """``ptr`` well formed and every id of ``col`` (and ``perm``) in range, or raise."""
    _on_cpu(names[1], col)
    check_index(col, num_cols, names[1])
    _on_cpu(names[0], ptr)
    check_ptr(ptr, col.numel(), names[0])
    if perm is not None:
        _on_cpu(names[2], perm)
        check_index(perm, col.numel(), names[2])
        if perm.numel() != col.numel():
            raise ValueError(
                f"Expected '{names[2]}' of shape [{col.numel()}], got {list(perm.shape)}"
            )


def _check_plan(
    pl: object, name: str, num_rows: int, num_edges: int | None, num_cols: int
) -> CPUPlan:
    """``pl`` as a :class:`CPUPlan` of a CSR of these sizes (O(1): nothing is scanned;
    ``num_edges=None``: any)."""
    if not isinstance(pl, CPUPlan):
        raise TypeError(
            f"Expected '{name}' from gnnattn.kernels.cpu.plan(), got {type(pl).__name__}"
        )
    e = pl.num_edges if num_edges is None else num_edges
    if (pl.num_rows, pl.num_edges, pl.num_cols) != (num_rows, e, num_cols):
        raise ValueError(
            f"Expected '{name}' of a CSR with {num_rows} rows, {e} edges and ids in "
            f"[0, {num_cols}), got one with {pl.num_rows}, {pl.num_edges} and [0, {pl.num_cols})"
        )
    return pl


# ------------------------------------------------------------------ checks


def _on_cpu(name: str, t: Tensor) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"Expected '{name}' to be a Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"Expected '{name}' on the CPU, got {t.device}")


def _floating(name: str, t: Tensor) -> None:
    _on_cpu(name, t)
    if not t.is_floating_point():
        raise TypeError(f"Expected '{name}' of a floating dtype, got {t.dtype}")


def _check_tensors(q: Tensor, k: Tensor, v: Tensor) -> None:
    """``q`` ``[N, H, C]``, ``k`` ``[M, H, C]``, ``v`` ``[M, H, Cv]``, of one floating dtype
    on the CPU: asserted, not raised (:func:`gnnattn.attention` validates a call, once)."""
    for t in (q, k, v):
        assert t.device.type == "cpu" and t.is_floating_point() and t.dim() == 3
    assert k.dtype == q.dtype and v.dtype == q.dtype, (q.dtype, k.dtype, v.dtype)
    assert q.shape[1:] == k.shape[1:] and k.shape[:2] == v.shape[:2], (q.shape, k.shape, v.shape)


def _check_qkv(
    q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, ptr: Tensor, col: Tensor
) -> int:
    """The O(1) checks of ``q``, ``k``, ``v``, the sizes of ``ptr`` and ``col`` (their
    values are checked by :func:`plan`) and ``bias``; returns the number of edges."""
    _check_tensors(q, k, v)
    for name, t in (("ptr", ptr), ("col", col)):
        if not isinstance(t, Tensor):
            raise TypeError(f"Expected '{name}' to be a Tensor, got {type(t).__name__}")
    n = q.shape[0]
    if ptr.dim() != 1 or ptr.numel() != n + 1:
        raise ValueError(
            f"Expected 'ptr' of shape [N + 1] = [{n + 1}] for 'q' of {n} rows, "
            f"got {list(ptr.shape)}"
        )
    e = col.numel()
    if bias is not None:
        _check_rows("bias", bias, (e, q.shape[1]))
    return e


def _check_rows(name: str, t: Tensor, shape: tuple[int, ...]) -> None:
    _floating(name, t)
    if tuple(t.shape) != shape:
        raise ValueError(f"Expected '{name}' of shape {list(shape)}, got {list(t.shape)}")


def _check_options(dropout: Dropout | None) -> Dropout | None:
    """Check the dropout; the one to apply (``None`` for ``p = 0``: nothing is dropped)."""
    if dropout is None:
        return None
    if not isinstance(dropout, Dropout):
        raise TypeError(
            f"Expected 'dropout' a gnnattn.kernels.common.Dropout, got {type(dropout).__name__}"
        )
    if not 0.0 <= dropout.p < 1.0:
        raise ValueError(f"Expected 'dropout' with p in [0, 1), got p = {dropout.p}")
    return dropout if dropout.threshold > 0 else None


def _check_edge(
    edge_attr: Tensor | None, edge_query: Tensor | None, q: Tensor, num_edges: int
) -> int:
    """Check the edge features; their width ``F`` (0 without them)."""
    if edge_attr is None:
        if edge_query is not None:
            raise ValueError("Expected 'edge_attr' with 'edge_query' (it scores them), got None")
        return 0
    _floating("edge_attr", edge_attr)
    per_head = edge_attr.dim() == 3 and edge_attr.shape[1] == q.shape[1]
    if not (edge_attr.dim() == 2 or per_head) or edge_attr.shape[0] != num_edges:
        raise ValueError(
            f"Expected 'edge_attr' of shape [{num_edges}, F] or [{num_edges}, {q.shape[1]}, F] "
            f"(per head), got {list(edge_attr.shape)}"
        )
    nf = int(edge_attr.shape[-1])
    if edge_query is not None:
        _check_rows("edge_query", edge_query, (q.shape[0], q.shape[1], nf))
    return nf


# ------------------------------------------------------------------ conversions


def _flat(t: Tensor, dtype: torch.dtype) -> Tensor:
    """``t`` ``[E, ...]`` as a contiguous ``[E, F]`` tensor of ``dtype``."""
    # .detach(): .numpy() refuses tensors that require grad; no copy when
    # the dtype and layout already fit.
    t = t.detach().to(dtype)
    return t.reshape(t.shape[0], math.prod(t.shape[1:])).contiguous()  # (E, F)


def _rows(t: Tensor, dtype: torch.dtype) -> np.ndarray:
    """``[N, H, C]`` as a contiguous ``[N, H*C]`` numpy array (no copy when it fits)."""
    if t.dtype == dtype and t.is_contiguous():
        # What a call usually gets: one view, no torch op (each is microseconds,
        # and a backward converts a dozen tensors).
        a = t.detach().numpy()
        return a if a.ndim == 2 else a.reshape(a.shape[0], math.prod(a.shape[1:]))
    return _flat(t, dtype).numpy()


def _opt_rows(t: Tensor | None, dtype: torch.dtype) -> np.ndarray | None:
    """:func:`_rows` of an optional tensor (``None``: the kernels' specialisation without it)."""
    return _rows(t, dtype) if t is not None else None


def _edge_rows(t: Tensor | None, dtype: torch.dtype) -> np.ndarray | None:
    """Edge features as the kernels take them: ``[E, F]`` rows, or ``[E, H, F]`` per head
    (another specialisation: see :func:`._edge._ea`); ``None`` stays ``None``."""
    if t is None or t.dim() != 3:
        return _opt_rows(t, dtype)
    return t.detach().to(dtype).contiguous().numpy()


def _np_dtype(dt: torch.dtype) -> type:
    return np.float64 if dt == torch.float64 else np.float32


def _scalar(x: float, dtype: torch.dtype) -> np.floating:
    # A float64 scale would promote every float32 product to float64.
    return np.float64(x) if dtype == torch.float64 else np.float32(x)


def _bias(bias: Tensor | None, dt: torch.dtype, nh: int) -> np.ndarray:
    if bias is None:
        return np.empty((0, nh), _np_dtype(dt))
    return bias.detach().to(dt).contiguous().numpy()


def _option_args(dropout: Dropout | None, dt: torch.dtype) -> tuple[np.ndarray | None, np.floating]:
    """The kernels' dropout ``key`` and ``dscale``; ``key`` is ``None`` without dropout
    (the specialisation without it)."""
    key = stream(dropout) if dropout is not None else None
    return key, _scalar(dropout.scale if dropout is not None else 1.0, dt)
