"""Pure-torch references for every kernel in :mod:`gnnattn.kernels`.

Each compiled kernel (numba on the CPU, Triton on CUDA) implements one of the
functions below with the same signature and the same results; the tests compare
them on awkward sizes. They are also the fallback when no compiled kernel is
available for a device.

The common layout is a destination-sorted CSR graph:

* ``ptr``: int64 ``[N + 1]``, the incoming edges of target ``i`` are the edge
  positions ``ptr[i]:ptr[i + 1]``;
* ``col``: int64 or int32 ``[E]``, the source node of each edge in that order.

Rules shared by all implementations (they are the rules of
:func:`gnnattn.scatter_softmax`): the per-target maximum is subtracted before
``exp``; a ``-inf`` score gets weight 0; a target with no incoming edges, or
whose scores are all ``-inf``, gets all-zero weights (and a zero attention
output, ``lse = -inf``), never NaN, forward and backward; a NaN score or value
makes its target's output NaN (a segment sum that is NaN is divided by, never
replaced).

The attention functions also take the options every backend has (see
:mod:`gnnattn.kernels.common` for the dropout stream):

* ``bias``: ``[E, H]`` added to the scores (edge features as a score bias);
* ``dropout``: a :class:`~gnnattn.kernels.common.Dropout`; the weights that
  the stream drops are zeroed and the others scaled by ``1 / (1 - p)``
  *after* the softmax (``lse`` is that of the undropped scores);
* ``edge_attr``: raw edge features ``[E, F]``, shared by the heads, or
  ``[E, H, F]``, one row per head (a layer's ``W a_ij`` formed per edge,
  which a small graph takes); the forward then also returns
  ``edge_out_i = sum_j P_ij a_ij`` ``[N, H, F]`` (``P`` the weights after
  dropout, those that multiply ``v``), so that a layer can apply a linear map
  ``W_v`` to the aggregate instead of to every edge;
* ``edge_query``: ``[N, H, F]`` (needs ``edge_attr``), adds
  ``edge_query_i^h . a_ij`` to the score, unscaled for shared features (a
  layer's ``W_k^T q_i``, with the scale folded in), and times ``scale`` for
  per-head ones, scored as a key's term (``edge_query`` is then ``q``
  itself: ``scale q_i . (k_j + W a_ij)``, with no scaled copy of ``q``).

Every per-edge array is in destination-CSR order. ``plan(ptr, col, num_cols)``
validates a CSR once; the functions take the result as ``plan=`` (the
compiled kernels keep their work split in it; the reference only its checks).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ..graphs.csr import segment_ids
from .common import Dropout, check_index, check_ptr, dropout_keep

__all__ = [
    "BACKWARD_READS_OUTPUT",
    "Checked",
    "attention_bwd",
    "attention_fwd",
    "attention_scores",
    "attention_weights",
    "softmax_weights",
    "block_attention_bwd",
    "block_attention_fwd",
    "dropout",
    "dropout_factor",
    "plan",
    "relu_dropout",
    "relu_dropout_bwd",
    "segment_ids",
    "segment_logsumexp",
    "segment_max",
    "segment_ptr",
    "segment_softmax",
    "segment_softmax_bwd",
    "segment_softmax_fwd",
    "segment_sum",
]

#: Whether ``attention_bwd`` reads the forward's ``out`` (and ``edge_out``): no, it
#: recomputes ``D_i`` from the edges, so the operator does not keep them.
BACKWARD_READS_OUTPUT = False


def segment_max(src: Tensor, index: Tensor, n: int) -> Tensor:
    """Per-segment maximum of ``src`` ``[E, ...]`` (``-inf`` for empty segments)."""
    out = src.new_full((n, *src.shape[1:]), float("-inf"))
    idx = index.view(-1, *([1] * (src.dim() - 1))).expand_as(src)
    return out.scatter_reduce(0, idx, src, "amax", include_self=True)


def segment_sum(src: Tensor, index: Tensor, n: int) -> Tensor:
    """Per-segment sum of ``src`` ``[E, ...]`` (0 for empty segments)."""
    return src.new_zeros((n, *src.shape[1:])).index_add_(0, index, src)


def segment_ptr(index: Tensor, num_segments: int) -> Tensor | None:
    """CSR pointers ``[num_segments + 1]`` of a sorted segment ``index``, or ``None``
    when it is not sorted; ``ValueError`` on ids outside ``[0, num_segments)``."""
    check_index(index, num_segments, "index")
    if index.numel() > 1 and not bool((index[1:] >= index[:-1]).all()):
        return None
    ptr = torch.zeros(num_segments + 1, dtype=torch.int64, device=index.device)
    if index.numel():
        torch.cumsum(torch.bincount(index, minlength=num_segments), 0, out=ptr[1:])
    return ptr


def segment_softmax(src: Tensor, index: Tensor, n: int) -> Tensor:
    """Stable softmax of ``src`` ``[E, ...]`` within the segments of ``index`` (any order).

    The one torch segment softmax: :func:`segment_softmax_fwd` (CSR segments)
    and :func:`gnnattn.scatter_softmax` use it.
    """
    m = segment_max(src, index, n)
    # An empty or all -inf segment has max -inf; shifting by it would give
    # (-inf) - (-inf) = NaN, so shift by 0 instead: every exp is then 0.
    m = torch.where(torch.isinf(m) & (m < 0), torch.zeros_like(m), m)
    e = torch.exp(src - m[index])
    s = segment_sum(e, index, n)
    # Only a zero sum (all weights 0) is replaced: a NaN sum stays NaN.
    s = torch.where(s == 0, torch.ones_like(s), s)
    return e / s[index]


def segment_logsumexp(src: Tensor, index: Tensor, n: int) -> Tensor:
    """Per-segment ``log sum exp`` of ``src`` ``[E, ...]``, stable; ``-inf`` for empty or
    all ``-inf`` segments."""
    m = segment_max(src, index, n)
    m = torch.where(torch.isinf(m) & (m < 0), torch.zeros_like(m), m)
    s = segment_sum(torch.exp(src - m[index]), index, n)
    empty = s == 0
    # log of 1, not of 0, where the result is -inf: where's backward sends those
    # entries a zero gradient, and log's would make it 0 / 0 = NaN.
    s = torch.where(empty, torch.ones_like(s), s)
    return torch.where(empty, torch.full_like(s, float("-inf")), m + torch.log(s))


def segment_softmax_fwd(src: Tensor, ptr: Tensor) -> Tensor:
    """Stable softmax of ``src`` ``[E, H]`` within each CSR segment of ``ptr``."""
    return segment_softmax(src, segment_ids(ptr, src.shape[0]), ptr.numel() - 1)


def segment_softmax_bwd(y: Tensor, grad: Tensor, ptr: Tensor) -> Tensor:
    """Gradient of :func:`segment_softmax_fwd`: ``y * (g - sum_seg(g * y))``."""
    n = ptr.numel() - 1
    index = segment_ids(ptr, y.shape[0])
    dot = segment_sum(grad * y, index, n)
    return y * (grad - dot[index])


class Checked(NamedTuple):
    """The reference's plan: the sizes a CSR was checked against."""

    num_edges: int
    num_cols: int


def plan(ptr: Tensor, col: Tensor, num_cols: int, *, perm: Tensor | None = None) -> Checked:
    """Check a CSR once (``ptr`` well formed, ``col`` ids in ``[0, num_cols)``, and a
    transposed CSR's ``perm`` in ``[0, E)``)."""
    check_ptr(ptr, col.numel())
    check_index(col, num_cols)
    if perm is not None:
        check_index(perm, col.numel(), "perm")
    return Checked(col.numel(), num_cols)


def attention_scores(
    q: Tensor, k: Tensor, ptr: Tensor, col: Tensor, scale: float, bias: Tensor | None = None
) -> Tensor:
    """Per-edge scores ``q_i . k_j * scale (+ bias_ij)``, ``[E, H]``."""
    index = segment_ids(ptr, col.numel())
    s = (q[index] * k[col]).sum(-1) * scale  # (E, H)
    if bias is not None:
        s = s + bias
    return s


def dropout_factor(
    dropout: Dropout | None, num_edges: int, num_heads: int, like: Tensor
) -> Tensor | None:
    """``keep / (1 - p)`` per edge and head, ``[E, H]`` typed like ``like``, or ``None``."""
    if dropout is None:
        return None
    keep = dropout_keep(dropout, num_edges, num_heads, like.device)
    return keep.to(like.dtype) * dropout.scale


def dropout(x: Tensor, dropout: Dropout) -> Tensor:
    """Dropout of a dense tensor by the stream of :mod:`.common`: ``x`` times
    ``keep / (1 - p)``, where element ``n`` of ``x`` (row-major) is kept iff the
    stream keeps counter ``n``. Its own backward: the gradient is ``grad`` times
    the same factor.

    Example:
        >>> y = dropout(torch.ones(4, 1000), Dropout(0.25, seed=3, offset=0))
        >>> sorted(y.unique().tolist()), 0.7 < (y > 0).float().mean().item() < 0.8
        ([0.0, 1.3333333730697632], True)
    """
    return _dropped(x, dropout)


def _dropped(x: Tensor, dropout: Dropout) -> Tensor:
    keep = dropout_keep(dropout, x.numel(), 1, x.device).view(x.shape)
    return x * (keep.to(x.dtype) * dropout.scale)


def relu_dropout(x: Tensor, dropout: Dropout) -> Tensor:
    """``dropout(relu(x))`` (the feed-forward's activation and its dropout), by
    the stream of :mod:`.common`.

    Example:
        >>> y = relu_dropout(torch.tensor([-1.0, 2.0] * 500), Dropout(0.5, seed=1, offset=0))
        >>> bool((y[0::2] == 0).all()), sorted(y[1::2].unique().tolist())
        (True, [0.0, 4.0])
    """
    return _dropped(torch.relu(x), dropout)


def relu_dropout_bwd(y: Tensor, grad: Tensor, scale: float) -> Tensor:
    """The gradient of :func:`relu_dropout` from its output ``y``: ``grad * scale``
    where ``y > 0`` (the ReLU passed the element and the stream kept it), else 0.
    """
    return torch.where(y > 0, grad * scale, torch.zeros((), dtype=grad.dtype))


def _edge_score(
    s: Tensor, ptr: Tensor, edge_attr: Tensor | None, edge_query: Tensor | None, scale: float
) -> Tensor:
    """``s + edge_query_i . a_ij`` per edge and head (``s`` unchanged without a query;
    per-head features' term times ``scale``: :func:`_key_term`)."""
    if edge_query is None or edge_attr is None:
        return s
    index = segment_ids(ptr, s.shape[0])
    return s + _key_term((edge_query[index] * _per_head(edge_attr)).sum(-1), edge_attr, scale)


def _key_term(x: Tensor, edge_attr: Tensor, scale: float) -> Tensor:
    """``x`` (an edge query's score term, or its gradient's weight) times ``scale`` for
    per-head features ``[E, H, F]``, which are scored as a key's term; as it is for
    shared ones."""
    return x * scale if edge_attr.dim() == 3 else x


def _per_head(edge_attr: Tensor) -> Tensor:
    """``[E, H or 1, F]``: per-head features as they are, shared ones broadcast."""
    return edge_attr if edge_attr.dim() == 3 else edge_attr.unsqueeze(1)


def _on_edges(d: Tensor, edge_attr: Tensor) -> Tensor:
    """A per-head gradient ``[E, H, F]`` in ``edge_attr``'s shape (summed over heads
    for shared features)."""
    return d if edge_attr.dim() == 3 else d.sum(1)


def attention_fwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    ptr: Tensor,
    col: Tensor,
    scale: float,
    bias: Tensor | None = None,
    *,
    dropout: Dropout | None = None,
    plan: Checked | None = None,
    edge_attr: Tensor | None = None,
    edge_query: Tensor | None = None,
) -> tuple[Tensor, ...]:
    """Sparse attention over a destination-sorted CSR graph.

    Args:
        q: ``[N, H, C]`` queries of the targets.
        k: ``[M, H, C]`` keys of the sources.
        v: ``[M, H, Cv]`` values of the sources.
        ptr: ``[N + 1]`` CSR pointers (incoming edges per target).
        col: ``[E]`` source of each edge.
        scale: multiplies ``q . k``.
        bias: optional ``[E, H]`` additive score bias (edge features).
        dropout: optional attention dropout (see the module docstring).
        plan: from :func:`plan` (unused here: the reference gathers with
            torch, which bounds-checks).
        edge_attr: optional ``[E, F]`` edge features (CSR order), or ``[E, H, F]``
            per head.
        edge_query: optional ``[N, H, F]``: adds ``edge_query_i . a_ij`` to
            the scores (needs ``edge_attr``; times ``scale`` for per-head features).

    Returns:
        ``out`` ``[N, H, Cv]`` and the log-sum-exp ``lse`` ``[N, H]`` of each
        target's scores (``-inf`` where the target has no finite score); with
        ``edge_attr`` also ``edge_out`` ``[N, H, F]`` ``= sum_j P_ij a_ij``.
    """
    n, h = ptr.numel() - 1, q.shape[1]
    index = segment_ids(ptr, col.numel())
    s = attention_scores(q, k, ptr, col, scale, bias)
    s = _edge_score(s, ptr, edge_attr, edge_query, scale)
    m = segment_max(s, index, n)
    m_safe = torch.where(torch.isinf(m) & (m < 0), torch.zeros_like(m), m)
    e = torch.exp(s - m_safe[index])
    denom = segment_sum(e, index, n)
    # 1, not 0, where no edge counts: the weights there are 0 / 1, and log(1) keeps the
    # gradient finite (log(0)'s, 0 / 0, would be NaN through the branch where() drops).
    safe = torch.where(denom == 0, torch.ones_like(denom), denom)
    lse = torch.where(denom == 0, torch.full_like(denom, float("-inf")), m_safe + torch.log(safe))
    alpha = e / safe[index]
    f = dropout_factor(dropout, col.numel(), h, alpha)
    if f is not None:
        alpha = alpha * f
    out = segment_sum(alpha.unsqueeze(-1) * v[col], index, n)
    if edge_attr is None:
        return out, lse
    edge_out = segment_sum(alpha.unsqueeze(-1) * _per_head(edge_attr), index, n)  # (N, H, F)
    return out, lse, edge_out


def softmax_weights(
    q: Tensor,
    k: Tensor,
    ptr: Tensor,
    col: Tensor,
    scale: float,
    bias: Tensor | None = None,
    *,
    edge_attr: Tensor | None = None,
    edge_query: Tensor | None = None,
) -> Tensor:
    """The weights ``alpha`` ``[E, H]`` (before dropout) by a stable softmax of the
    recomputed scores: exact at any magnitude, where ``exp(s - lse)`` with another
    computation's ``lse`` is not once a score's rounding passes 1."""
    s = attention_scores(q, k, ptr, col, scale, bias)
    s = _edge_score(s, ptr, edge_attr, edge_query, scale)
    return segment_softmax(s, segment_ids(ptr, col.numel()), ptr.numel() - 1)


def attention_weights(
    q: Tensor,
    k: Tensor,
    ptr: Tensor,
    col: Tensor,
    scale: float,
    lse: Tensor,
    bias: Tensor | None = None,
    *,
    edge_attr: Tensor | None = None,
    edge_query: Tensor | None = None,
) -> Tensor:
    """Recompute the weights ``alpha`` ``[E, H]`` (before dropout) from the saved log-sum-exp."""
    index = segment_ids(ptr, col.numel())
    s = attention_scores(q, k, ptr, col, scale, bias)
    s = _edge_score(s, ptr, edge_attr, edge_query, scale)
    lse_e = lse[index]
    # A target with lse = -inf has no finite score: all its weights are 0.
    dead = torch.isinf(lse_e) & (lse_e < 0)
    return torch.where(dead, torch.zeros_like(s), torch.exp(s - lse_e))


def attention_bwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor | None,
    lse: Tensor,
    grad_out: Tensor,
    ptr: Tensor,
    col: Tensor,
    scale: float,
    bias: Tensor | None = None,
    *,
    dropout: Dropout | None = None,
    csc: tuple[Tensor, Tensor, Tensor] | None = None,
    plan: Checked | None = None,
    csc_plan: Checked | None = None,
    edge_attr: Tensor | None = None,
    edge_query: Tensor | None = None,
    grad_edge_out: Tensor | None = None,
    need_dedge_attr: bool = True,
    grad_lse: Tensor | None = None,
) -> tuple[Tensor | None, ...]:
    """Gradients of :func:`attention_fwd` w.r.t. ``q``, ``k``, ``v``, ``bias`` (and
    ``edge_attr``, ``edge_query``).

    ``grad_lse`` ``[N, H]`` is the gradient of the forward's ``lse`` (``None``:
    zero). ``d lse_i / d s_ij = alpha_ij``, so it enters as ``D_i - grad_lse_i``.

    FlashAttention's recomputation: ``alpha`` comes back from ``lse``, and the
    softmax backward uses ``D_i = sum_c dout_ic * out_ic`` (equal to
    ``sum_j alpha_ij dalpha_ij``, dropout included), so
    nothing of size ``E x C`` is saved. With ``out=None``, ``D_i`` is computed
    from the edges instead (the form the CPU kernel uses, so that the
    forward's output need not be kept). ``csc`` and the plans are accepted
    for the compiled kernels' signature and not used.

    With ``edge_attr``, ``grad_edge_out`` ``[N, H, F]`` is the gradient of
    the forward's ``edge_out`` (``None``: zero). It adds ``g_i . a_ij`` to
    ``dP_ij``; then ``d edge_query_i = sum_j dS_ij a_ij`` and ``d a_ij =
    sum_h dS_ij^h edge_query_i^h + P_ij^h g_i^h`` (per head, not summed, and with
    ``dS`` times ``scale`` in both, for per-head features). ``D_i`` is then computed
    from the edges (``dout_i . out_i`` would miss ``g_i . edge_out_i``).

    Returns:
        ``dq``, ``dk``, ``dv``, ``dbias`` (the score gradient ``dS``
        ``[E, H]``, ``None`` without ``bias``); with ``edge_attr`` also
        ``dedge_attr`` shaped like ``edge_attr`` (``None`` with ``need_dedge_attr=False``,
        for an ``edge_attr`` that needs no gradient) and ``dedge_query``
        ``[N, H, F]`` (``None`` without ``edge_query``).
    """
    n, m, h = q.shape[0], k.shape[0], q.shape[1]
    index = segment_ids(ptr, col.numel())
    alpha = attention_weights(
        q, k, ptr, col, scale, lse, bias, edge_attr=edge_attr, edge_query=edge_query
    )  # (E, H)
    f = dropout_factor(dropout, col.numel(), h, alpha)
    kept = alpha * f if f is not None else alpha  # (E, H), the weights the forward used
    g = grad_out[index]  # (E, H, Cv)
    dv = segment_sum(kept.unsqueeze(-1) * g, col, m)
    dkept = (g * v[col]).sum(-1)  # (E, H)
    ge = grad_edge_out[index] if edge_attr is not None and grad_edge_out is not None else None
    if ge is not None:
        assert edge_attr is not None
        dkept = dkept + (ge * _per_head(edge_attr)).sum(-1)  # + g_i . a_ij
    dalpha = dkept * f if f is not None else dkept
    if out is not None and edge_attr is None:
        d = (grad_out * out).sum(-1)  # (N, H)
    else:
        # sum_j alpha_ij dalpha_ij, normalized by sum_j alpha_ij (= 1 up to
        # the rounding of lse, which the division removes).
        total = segment_sum(alpha, index, n)
        d = segment_sum(alpha * dalpha, index, n) / torch.where(total == 0, 1.0, total)
    if grad_lse is not None:
        d = d - grad_lse
    ds = alpha * (dalpha - d[index])  # (E, H)
    dq = segment_sum(ds.unsqueeze(-1) * k[col], index, n) * scale
    dk = segment_sum(ds.unsqueeze(-1) * q[index], col, m) * scale
    if edge_attr is None:
        return dq, dk, dv, (ds if bias is not None else None)
    dea = torch.zeros_like(edge_attr)
    deq = None
    if edge_query is not None:
        dse = _key_term(ds, edge_attr, scale).unsqueeze(-1)  # (E, H, 1)
        deq = segment_sum(dse * _per_head(edge_attr), index, n)  # (N, H, F)
        dea = dea + _on_edges(dse * edge_query[index], edge_attr)
    if ge is not None:
        dea = dea + _on_edges(kept.unsqueeze(-1) * ge, edge_attr)
    dbias = ds if bias is not None else None
    return dq, dk, dv, dbias, (dea if need_dedge_attr else None), deq


def block_attention_fwd(
    q: Tensor, k: Tensor, v: Tensor, ptr: Tensor, scale: float
) -> tuple[Tensor, Tensor]:
    """``(out [N, H, C], lse [N, H])`` of attention within each complete block of ``ptr``
    (int64 ``[B + 1]``: the nodes ``ptr[b] .. ptr[b + 1]`` attend to each other), by
    dense attention per block."""
    outs, lses = [], []
    for a, b in zip(ptr[:-1].tolist(), ptr[1:].tolist(), strict=True):
        s = torch.einsum("nhc,mhc->hnm", q[a:b], k[a:b]) * scale  # (H, T, T)
        lse = torch.logsumexp(s, -1)  # (H, T)
        p = torch.exp(s - lse.unsqueeze(-1))
        outs.append(torch.einsum("hnm,mhc->nhc", p, v[a:b]))
        lses.append(lse.t())
    if not outs:
        return torch.empty_like(q), q.new_empty(q.shape[:2])
    return torch.cat(outs), torch.cat(lses)


def block_attention_bwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    grad: Tensor,
    ptr: Tensor,
    scale: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """``(dq, dk, dv)`` of :func:`block_attention_fwd`: with ``P = exp(S - lse)``,
    ``dS = P * (grad V^T - D)``, ``D_i = grad_i . out_i``."""
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    d = (grad * out).sum(-1)  # (N, H)
    for a, b in zip(ptr[:-1].tolist(), ptr[1:].tolist(), strict=True):
        s = torch.einsum("nhc,mhc->hnm", q[a:b], k[a:b]) * scale  # (H, T, T)
        p = torch.exp(s - lse[a:b].t().unsqueeze(-1))
        dp = torch.einsum("nhc,mhc->hnm", grad[a:b], v[a:b])
        ds = p * (dp - d[a:b].t().unsqueeze(-1))
        dq[a:b] = torch.einsum("hnm,mhc->nhc", ds, k[a:b]) * scale
        dk[a:b] = torch.einsum("hnm,nhc->mhc", ds, q[a:b]) * scale
        dv[a:b] = torch.einsum("hnm,nhc->mhc", p, grad[a:b])
    return dq, dk, dv
