r"""The attention operator and its backends.

One operator, several implementations, all computing

.. math::
    \alpha_{ij}^h = \operatorname{softmax}_{j \in \mathcal{N}(i)}
        \left(\langle q_i^h, k_j^h\rangle \cdot \text{scale}\right),
    \qquad o_i^h = \sum_{j \in \mathcal{N}(i)} \alpha_{ij}^h v_j^h

over the incoming edges :math:`j \to i` of each target :math:`i`:

* ``"mp"``: PyG message passing with :func:`gnnattn.scatter_softmax`, the
  reference; it lives in the layers (``propagate``), not here.
* ``"dense"``: for graphs whose structure is known (complete, causal, batched
  complete/causal, sliding window), :func:`torch.nn.functional.scaled_dot_product_attention`
  on ``[B, H, T, C]`` tensors (the layout for which the CPU picks its fused
  kernel), with ``is_causal`` or a boolean mask.
* ``"fused"``: a sparse kernel over the destination-sorted CSR graph that never
  materializes ``|E| x C`` messages (numba on the CPU, Triton on CUDA; see
  :mod:`gnnattn.kernels`).

:func:`analyze` finds the structure of a graph, either from how the layer built
it or, for an explicit ``edge_index``, from its CSR (degrees and column
ranges), so an explicitly given complete graph still runs densely.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from . import kernels
from .graphs import (
    CSR,
    causal_graph,
    complete_graph,
    to_csr,
)

__all__ = [
    "BACKENDS",
    "Graph",
    "analyze",
    "dense_attention",
    "fused_attention",
    "make_graph",
    "resolve_backend",
    "structured_graph",
]

BACKENDS = ("auto", "mp", "dense", "fused")


class Graph:
    """An edge set together with what is known about its structure.

    For graphs the layers build themselves (complete / causal, optionally
    batched), ``edge_index`` is only materialized when a backend needs it: the
    dense backend never does, so ``layer(x)`` costs no ``|E|``-sized work.

    Args:
        edge_index: ``[2, |E|]`` as the user gave it, or ``None`` with ``build``.
        num_nodes: number of targets ``N``.
        kind: ``"complete"``, ``"causal"``, ``"window"``, ``"causal_window"``
            or ``None`` (arbitrary graph).
        lengths: sequence lengths of the blocks, in order (``None`` if
            unstructured); one entry for a single sequence.
        window: the half-width of a window graph.
        num_src: number of sources of a bipartite graph (``None``: square).
        build: makes ``edge_index`` on first use when it is not given.
    """

    def __init__(
        self,
        edge_index: Tensor | None,
        num_nodes: int,
        kind: str | None = None,
        lengths: list[int] | None = None,
        window: int = 0,
        num_src: int | None = None,
        build: Callable[[], Tensor] | None = None,
    ) -> None:
        assert edge_index is not None or build is not None
        self._edge_index = edge_index
        self._build = build
        self.num_nodes = num_nodes
        self.kind = kind
        self.lengths = lengths
        self.window = window
        self.num_src = num_src
        self._csr: CSR | None = None

    @property
    def edge_index(self) -> Tensor:
        if self._edge_index is None:
            assert self._build is not None
            self._edge_index = self._build()
        return self._edge_index

    @property
    def num_edges(self) -> int:
        if self._edge_index is None and self.lengths is not None:
            if self.kind == "complete":
                return sum(t * t for t in self.lengths)
            if self.kind == "causal":
                return sum(t * (t + 1) // 2 for t in self.lengths)
        return self.edge_index.shape[1]

    @property
    def csr(self) -> CSR:
        """Destination-sorted CSR, built once per graph."""
        if self._csr is None:
            self._csr = to_csr(self.edge_index, self.num_nodes, self.num_src)
        return self._csr

    @property
    def density(self) -> float:
        """``|E| / (N M)``: how much of the dense matrix the graph fills."""
        return self.num_edges / max(self.num_nodes * (self.num_src or self.num_nodes), 1)

    def __repr__(self) -> str:
        return f"Graph(num_nodes={self.num_nodes}, kind={self.kind!r}, lengths={self.lengths})"


_BUILDERS = {"complete": complete_graph, "causal": causal_graph}
# Structured graphs up to this many edges (about 100 MB of edges and CSR) are
# cached between calls.
_CACHE_MAX_EDGES = 1 << 22


def structured_graph(
    kind: str, num_nodes: int, batch: Tensor | None, device: torch.device
) -> Graph:
    """A complete or causal graph (one per sequence of ``batch``), built lazily.

    Without ``batch`` the result is cached per ``(kind, N, device)``, with
    ``batch`` per batch tensor, so repeated calls reuse the same edges and CSR.
    """
    key = (kind, num_nodes, str(device))
    if batch is None:
        hit = _structured.get(key)
        if hit is not None:
            return hit
    elif not torch.compiler.is_compiling():
        hit = _cache.get(batch, num_nodes, kind)
        if hit is not None:
            return hit
    if batch is None or batch.numel() == 0:
        lengths = [num_nodes] if num_nodes else []
    else:
        lengths = [int(c) for c in torch.bincount(batch).tolist() if c > 0]
    builder = _BUILDERS[kind]
    g = Graph(
        None,
        num_nodes,
        kind,
        lengths,
        build=lambda: builder(num_nodes, batch=batch, device=device),
    )
    if g.num_edges > _CACHE_MAX_EDGES:
        # Once a backend builds its edges, a cached graph would keep them
        # (16 bytes an edge, plus the CSR) for the life of the process.
        return g
    if batch is None:
        if len(_structured) >= 16:
            _structured.pop(next(iter(_structured)))
        _structured[key] = g
    elif not torch.compiler.is_compiling():
        _cache.put(batch, num_nodes, g, kind)
    return g


def _detect_window(lo: Tensor, hi: Tensor, i: Tensor) -> tuple[str, int] | None:
    """``("window", w)`` or ``("causal_window", w)`` if the row ranges are a band."""
    n = i.numel()
    w = int((i - lo).max())
    if w == 0 or w >= n - 1:
        return None  # no band: self-loops only, or complete/causal
    if not bool((lo == (i - w).clamp_min(0)).all()):
        return None
    if bool((hi == i).all()):
        return "causal_window", w
    if bool((hi == (i + w).clamp_max(n - 1)).all()):
        return "window", w
    return None


def _detect(
    edge_index: Tensor, num_nodes: int, csr: CSR
) -> tuple[str | None, list[int] | None, int]:
    """Detect complete / causal (possibly batched) structure from the CSR, in O(|E|).

    The graph is structured when every target's sources form one contiguous
    range ``[lo_i, hi_i]`` without duplicates; then blocks start where
    ``lo_i == i`` and the ranges decide complete vs causal.
    """
    n, ptr, col = num_nodes, csr.ptr, csr.col
    e = col.numel()
    if n == 0 or e == 0:
        return None, None, 0
    deg = ptr.diff()
    if bool((deg == 0).any()):
        return None, None, 0
    # Within a row, sorted sources must step by exactly 1 (no gaps, no duplicates).
    step = col[1:] - col[:-1]
    row_start = torch.zeros(e, dtype=torch.bool, device=col.device)
    row_start[ptr[:-1]] = True
    if not bool(((step == 1) | row_start[1:]).all()):
        return None, None, 0
    lo = col[ptr[:-1]]
    hi = col[ptr[1:] - 1]
    i = torch.arange(n, device=col.device)
    starts = lo == i
    if not bool(starts[0]) or bool((lo > i).any()):
        return None, None, 0
    if not bool(starts[1:].any()):
        window = _detect_window(lo, hi, i)
        if window is not None:
            return window[0], [n], window[1]
    block = torch.cumsum(starts.long(), 0) - 1  # (N,) block id of each node
    first = i[starts]  # (B,) first node of each block
    sizes = torch.diff(torch.cat([first, first.new_tensor([n])]))  # (B,)
    last = first + sizes - 1
    if not bool((lo == first[block]).all()):
        return None, None, 0
    lengths = [int(s) for s in sizes.tolist()]
    if bool((hi == last[block]).all()):
        return "complete", lengths, 0
    if bool((hi == i).all()):
        # Causal blocks cannot be told apart from one longer causal sequence
        # except by where lo resets, which `starts` already used.
        return "causal", lengths, 0
    return None, None, 0


class _Cache:
    """Graph analyses keyed on the identity (and version) of an ``edge_index``.

    A weak reference makes sure a new tensor that happens to reuse a freed
    tensor's id is not mistaken for it; ``_version`` catches in-place edits.
    """

    def __init__(self, size: int = 16) -> None:
        self.size = size
        self.entries: dict[tuple[int, str], tuple[weakref.ref, int, int, Graph]] = {}

    def get(self, edge_index: Tensor, num_nodes: int, tag: str = "") -> Graph | None:
        hit = self.entries.get((id(edge_index), tag))
        if hit is None:
            return None
        ref, version, n, graph = hit
        if ref() is edge_index and version == edge_index._version and n == num_nodes:
            return graph
        return None

    def put(self, edge_index: Tensor, num_nodes: int, graph: Graph, tag: str = "") -> None:
        if len(self.entries) >= self.size:
            self.entries.pop(next(iter(self.entries)))
        self.entries[(id(edge_index), tag)] = (
            weakref.ref(edge_index),
            edge_index._version,
            num_nodes,
            graph,
        )


_cache = _Cache()
_structured: dict[tuple[str, int, str], Graph] = {}


def analyze(edge_index: Tensor, num_nodes: int, *, detect: bool = True) -> Graph:
    """Wrap a validated ``edge_index`` into a :class:`Graph`, detecting its structure.

    The result (with its CSR) is cached per ``edge_index`` tensor, so calling a
    layer repeatedly on the same graph pays the analysis once.
    """
    if torch.compiler.is_compiling():
        return Graph(edge_index, num_nodes)
    hit = _cache.get(edge_index, num_nodes)
    if hit is not None:
        return hit
    graph = Graph(edge_index, num_nodes)
    if detect and edge_index.shape[1] > 0:
        graph.kind, graph.lengths, graph.window = _detect(edge_index, num_nodes, graph.csr)
    _cache.put(edge_index, num_nodes, graph)
    return graph


def _has_compiled_kernels(device: torch.device) -> bool:
    return kernels.get(device) is not kernels.reference


def resolve_backend(
    backend: str,
    graph: Graph,
    device: torch.device,
    *,
    dropout_active: bool = False,
    has_bias: bool = False,
) -> str:
    """Pick the implementation for one call.

    ``"auto"``: dense for complete/causal(-batched) graphs and for window graphs
    that fill more than a quarter of the matrix (dense tiles then waste less
    than sparse gathers cost), fused for other graphs when a compiled kernel
    exists for the device, message passing otherwise (and under
    ``torch.compile``, where the numba kernel cannot be traced, and with
    attention dropout on sparse graphs, which the fused kernel does not do).
    """
    if backend == "dense" and graph.kind is None:
        raise ValueError(
            "backend='dense' needs a graph of known structure (complete, causal, their "
            "batched versions or a sliding window); this edge_index has none. Use "
            "backend='fused' or 'mp'."
        )
    if backend == "dense" and has_bias:
        raise ValueError("backend='dense' does not take per-edge score biases; use 'fused' or 'mp'")
    if backend == "fused" and dropout_active:
        raise ValueError(
            "backend='fused' has no attention dropout; use backend='mp' (or 'auto') while "
            "training with dropout > 0"
        )
    if backend != "auto":
        return backend
    if graph.kind in ("complete", "causal") and not has_bias:
        return "dense"
    if graph.kind in ("window", "causal_window") and graph.density > 0.25 and not has_bias:
        return "dense"
    if dropout_active or torch.compiler.is_compiling() or not _has_compiled_kernels(device):
        return "mp"
    return "fused"


# --------------------------------------------------------------------------- dense


def _dense_mask(graph: Graph, t: int, device: torch.device) -> Tensor | None:
    """Boolean ``[T, T]`` mask (``True`` = attend) for window graphs, else ``None``."""
    if graph.kind not in ("window", "causal_window"):
        return None
    i = torch.arange(t, device=device).view(-1, 1)
    j = torch.arange(t, device=device).view(1, -1)
    d = i - j
    if graph.kind == "causal_window":
        return (d >= 0) & (d <= graph.window)
    return d.abs() <= graph.window


def _gather_weights(
    q: Tensor, k: Tensor, graph: Graph, scale: float, mask: Tensor | None
) -> Tensor:
    """Attention weights ``[|E|, H]`` in ``graph.edge_index`` order, through the matrix."""
    n, h = q.shape[0], q.shape[1]
    out = q.new_zeros(graph.edge_index.shape[1], h)
    src, dst = graph.edge_index[0], graph.edge_index[1]
    # Reduce in float32 (float64 stays float64), as every other path does.
    ct = torch.float64 if q.dtype == torch.float64 else torch.float32
    start = 0
    assert graph.lengths is not None
    for t in graph.lengths:
        qb = q[start : start + t].transpose(0, 1).to(ct)  # (H, T, C)
        kb = k[start : start + t].transpose(0, 1).to(ct)  # (H, T, C)
        s = torch.matmul(qb, kb.transpose(1, 2)) * scale  # (H, T, T)
        if graph.kind == "causal":
            tri = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
            s = s.masked_fill(~tri, float("-inf"))
        elif mask is not None:
            s = s.masked_fill(~mask[:t, :t], float("-inf"))
        p = torch.softmax(s, dim=-1).to(q.dtype)  # (H, T, T)
        sel = (dst >= start) & (dst < start + t)
        out[sel] = p[:, dst[sel] - start, src[sel] - start].T
        start += t
    assert start == n
    return out


def dense_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    graph: Graph,
    scale: float,
    *,
    dropout_p: float = 0.0,
    need_weights: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """The ``"dense"`` backend: SDPA per block of a structured graph.

    Equal-length blocks go through one ``[B, H, T, C]`` call (``is_causal`` for
    causal graphs, no mask for complete ones: SDPA's fused CPU/GPU kernels).
    Blocks of different lengths are padded to the longest with a mask.
    With ``need_weights`` the weights are computed once more through the
    matrix and gathered on the edges (the slower, documented path).

    Shapes:
        - **q, k:** ``[N, H, C]``; **v:** ``[N, H, Cv]``
        - **output:** ``[N, H, Cv]`` and optionally weights ``[|E|, H]``
    """
    assert graph.kind is not None and graph.lengths is not None
    n, h, c = q.shape
    cv = v.shape[-1]
    lengths = graph.lengths
    if n == 0:
        return v.new_zeros(0, h, cv), (q.new_zeros(0, h) if need_weights else None)
    tmax = max(lengths)
    mask = _dense_mask(graph, tmax, q.device)
    is_causal = graph.kind == "causal"
    if all(t == tmax for t in lengths):
        b = len(lengths)
        qb = q.view(b, tmax, h, c).transpose(1, 2)  # (B, H, T, C)
        kb = k.view(b, tmax, h, c).transpose(1, 2)  # (B, H, T, C)
        vb = v.view(b, tmax, h, cv).transpose(1, 2)  # (B, H, T, Cv)
        ob = F.scaled_dot_product_attention(
            qb, kb, vb, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale
        )
        out = ob.transpose(1, 2).reshape(n, h, cv)  # (N, H, Cv)
    else:
        b = len(lengths)
        lens = torch.tensor(lengths, device=q.device)
        starts = torch.cumsum(lens, 0) - lens
        pos = torch.arange(tmax, device=q.device)
        valid = pos.view(1, -1) < lens.view(-1, 1)  # (B, T)
        rows = (starts.view(-1, 1) + pos.view(1, -1)).clamp_max(n - 1)  # (B, T)
        qb = q[rows].permute(0, 2, 1, 3)  # (B, H, T, C)
        kb = k[rows].permute(0, 2, 1, 3)
        vb = v[rows].permute(0, 2, 1, 3)
        key_ok = valid.view(b, 1, 1, tmax)
        m = key_ok.expand(b, 1, tmax, tmax)
        if is_causal:
            m = m & torch.ones(tmax, tmax, dtype=torch.bool, device=q.device).tril()
        elif mask is not None:
            m = m & mask
        # Padded query rows attend to everything so that no row is fully
        # masked (SDPA would give NaN there, and NaN * 0 in the backward).
        m = m | ~valid.view(b, 1, tmax, 1)
        ob = F.scaled_dot_product_attention(
            qb, kb, vb, attn_mask=m, dropout_p=dropout_p, scale=scale
        )
        out = ob.permute(0, 2, 1, 3)[valid]  # (N, H, Cv)
    weights = _gather_weights(q, k, graph, scale, mask) if need_weights else None
    return out, weights


# --------------------------------------------------------------------------- fused


class _FusedAttention(torch.autograd.Function):
    """Autograd around the kernels' ``attention_fwd`` / ``attention_bwd``."""

    @staticmethod
    def forward(ctx, q, k, v, bias, ptr, col, scale):  # type: ignore[override]
        kern = kernels.get(q.device)
        out, lse = kern.attention_fwd(q, k, v, ptr, col, scale, bias)
        ctx.save_for_backward(q, k, v, bias, out, lse, ptr, col)
        ctx.scale = scale
        ctx.has_bias = bias is not None
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):  # type: ignore[override]
        q, k, v, bias, out, lse, ptr, col = ctx.saved_tensors
        kern = kernels.get(q.device)
        dq, dk, dv, dbias = kern.attention_bwd(
            q, k, v, out, lse, grad_out.contiguous(), ptr, col, ctx.scale, bias
        )
        return dq, dk, dv, (dbias if ctx.has_bias else None), None, None, None


def _kernel_dtype(t: Tensor) -> torch.dtype:
    # The CPU kernels compute in float32/float64; the Triton kernels take the
    # half types natively (with float32 accumulation).
    if t.device.type == "cpu" and t.dtype not in (torch.float32, torch.float64):
        return torch.float32
    return t.dtype


def fused_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    graph: Graph,
    scale: float,
    *,
    bias: Tensor | None = None,
    need_weights: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """The ``"fused"`` backend: sparse attention over the graph's CSR.

    ``bias`` (``[|E|, H]``, in ``graph.edge_index`` order) is added to the
    scores. The weights, when asked for, are recomputed from the saved
    log-sum-exp (``|E| x H`` numbers, no ``|E| x C`` tensor).

    Shapes:
        - **q:** ``[N, H, C]``; **k:** ``[M, H, C]``; **v:** ``[M, H, Cv]``
        - **output:** ``[N, H, Cv]`` and optionally weights ``[|E|, H]``
    """
    csr = graph.csr
    dtype = _kernel_dtype(q)
    qc, kc, vc = (t.to(dtype).contiguous() for t in (q, k, v))
    bc = None
    if bias is not None:
        bc = (bias if csr.perm is None else bias[csr.perm]).to(dtype).contiguous()
    out, lse = _FusedAttention.apply(qc, kc, vc, bc, csr.ptr, csr.col, scale)
    weights = None
    if need_weights:
        with torch.no_grad():
            w = kernels.reference.attention_weights(qc, kc, csr.ptr, csr.col, scale, lse, bc)
            # The scores recomputed here and the kernel's log-sum-exp differ by
            # rounding; renormalizing makes every row sum to 1 and keeps each
            # weight <= 1 exactly, as on the other backends.
            index = kernels.reference.segment_ids(csr.ptr, csr.col.numel())
            total = kernels.reference._segment_sum(w, index, graph.num_nodes)
            w = w / torch.where(total > 0, total, torch.ones_like(total))[index]
        if csr.perm is not None:
            w = torch.empty_like(w).index_copy_(0, csr.perm, w)
        weights = w.to(q.dtype)
    return out.to(q.dtype), weights


def make_graph(
    num_nodes: int,
    edge_index: Tensor | None,
    batch: Tensor | None,
    *,
    causal: bool,
    device: torch.device,
) -> Graph:
    """The graph a layer attends over, from its call arguments.

    ``edge_index=None`` means the complete graph (causal when ``causal``), one
    per sequence of ``batch``. An explicit ``edge_index`` is validated and, when
    ``causal``, pruned to its edges :math:`j \\le i`.
    """
    from .graphs import _check_batch, check_edge_index

    if edge_index is not None and batch is not None:
        raise ValueError(
            "Expected either 'edge_index' or 'batch', got both: 'batch' builds one complete "
            "(or causal) graph per sequence, 'edge_index' gives the graph itself"
        )
    if edge_index is None:
        if batch is not None:
            batch = _check_batch(batch)
            if batch.numel() != num_nodes:
                raise ValueError(
                    f"Expected 'batch' of length {num_nodes} (the number of rows of x), "
                    f"got {batch.numel()}"
                )
            if batch.device != device:
                raise ValueError(f"Expected 'batch' on device {device}, got {batch.device}")
        return structured_graph("causal" if causal else "complete", num_nodes, batch, device)
    check_edge_index(edge_index, num_nodes, device=device)
    if causal:
        edge_index = edge_index[:, edge_index[0] <= edge_index[1]]
    return analyze(edge_index.long() if edge_index.dtype != torch.long else edge_index, num_nodes)
