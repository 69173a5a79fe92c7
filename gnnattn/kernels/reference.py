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
output, ``lse = -inf``), never NaN, forward and backward.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..graphs.csr import segment_ids

__all__ = [
    "attention_bwd",
    "attention_fwd",
    "attention_scores",
    "attention_weights",
    "segment_ids",
    "segment_max",
    "segment_ptr",
    "segment_softmax_bwd",
    "segment_softmax_fwd",
    "segment_sum",
]


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
    if index.numel() and (int(index.min()) < 0 or int(index.max()) >= num_segments):
        raise ValueError(f"Expected 'index' ids in [0, {num_segments}), got one outside")
    if index.numel() > 1 and not bool((index[1:] >= index[:-1]).all()):
        return None
    ptr = torch.zeros(num_segments + 1, dtype=torch.int64, device=index.device)
    if index.numel():
        torch.cumsum(torch.bincount(index, minlength=num_segments), 0, out=ptr[1:])
    return ptr


def segment_softmax_fwd(src: Tensor, ptr: Tensor) -> Tensor:
    """Stable softmax of ``src`` ``[E, H]`` within each CSR segment of ``ptr``."""
    n = ptr.numel() - 1
    index = segment_ids(ptr, src.shape[0])
    m = segment_max(src, index, n)
    # An empty or all -inf segment has max -inf; shifting by it would give
    # (-inf) - (-inf) = NaN, so shift by 0 instead: every exp is then 0.
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(src - m[index])
    s = segment_sum(e, index, n)
    s = torch.where(s > 0, s, torch.ones_like(s))
    return e / s[index]


def segment_softmax_bwd(y: Tensor, grad: Tensor, ptr: Tensor) -> Tensor:
    """Gradient of :func:`segment_softmax_fwd`: ``y * (g - sum_seg(g * y))``."""
    n = ptr.numel() - 1
    index = segment_ids(ptr, y.shape[0])
    dot = segment_sum(grad * y, index, n)
    return y * (grad - dot[index])


def attention_scores(
    q: Tensor, k: Tensor, ptr: Tensor, col: Tensor, scale: float, bias: Tensor | None = None
) -> Tensor:
    """Per-edge scores ``q_i . k_j * scale (+ bias_ij)``, ``[E, H]``."""
    index = segment_ids(ptr, col.numel())
    s = (q[index] * k[col]).sum(-1) * scale  # (E, H)
    if bias is not None:
        s = s + bias
    return s


def attention_fwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    ptr: Tensor,
    col: Tensor,
    scale: float,
    bias: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Sparse attention over a destination-sorted CSR graph.

    Args:
        q: ``[N, H, C]`` queries of the targets.
        k: ``[M, H, C]`` keys of the sources.
        v: ``[M, H, Cv]`` values of the sources.
        ptr: ``[N + 1]`` CSR pointers (incoming edges per target).
        col: ``[E]`` source of each edge.
        scale: multiplies ``q . k``.
        bias: optional ``[E, H]`` additive score bias (edge features).

    Returns:
        ``out`` ``[N, H, Cv]`` and the log-sum-exp ``lse`` ``[N, H]`` of each
        target's scores (``-inf`` where the target has no finite score).
    """
    n = ptr.numel() - 1
    index = segment_ids(ptr, col.numel())
    s = attention_scores(q, k, ptr, col, scale, bias)
    m = segment_max(s, index, n)
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m_safe[index])
    denom = segment_sum(e, index, n)
    lse = torch.where(denom > 0, m_safe + torch.log(denom), torch.full_like(denom, float("-inf")))
    alpha = e / torch.where(denom > 0, denom, torch.ones_like(denom))[index]
    out = segment_sum(alpha.unsqueeze(-1) * v[col], index, n)
    return out, lse


def attention_weights(
    q: Tensor,
    k: Tensor,
    ptr: Tensor,
    col: Tensor,
    scale: float,
    lse: Tensor,
    bias: Tensor | None = None,
) -> Tensor:
    """Recompute the weights ``alpha`` ``[E, H]`` from the saved log-sum-exp."""
    index = segment_ids(ptr, col.numel())
    s = attention_scores(q, k, ptr, col, scale, bias)
    lse_e = lse[index]
    # A target with lse = -inf has no finite score: all its weights are 0.
    return torch.where(torch.isfinite(lse_e), torch.exp(s - lse_e), torch.zeros_like(s))


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
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """Gradients of :func:`attention_fwd` w.r.t. ``q``, ``k``, ``v`` and ``bias``.

    FlashAttention's recomputation: ``alpha`` comes back from ``lse``, and the
    softmax backward uses ``D_i = sum_c dout_ic * out_ic`` (equal to
    ``sum_j alpha_ij dalpha_ij``), so nothing of size ``E x C`` is saved.
    With ``out=None``, ``D_i`` is computed from the edges instead (the form
    the CPU kernel uses, so that the forward's output need not be kept).
    """
    n, m = q.shape[0], k.shape[0]
    index = segment_ids(ptr, col.numel())
    alpha = attention_weights(q, k, ptr, col, scale, lse, bias)  # (E, H)
    g = grad_out[index]  # (E, H, Cv)
    dv = segment_sum(alpha.unsqueeze(-1) * g, col, m)
    dalpha = (g * v[col]).sum(-1)  # (E, H)
    if out is not None:
        d = (grad_out * out).sum(-1)  # (N, H)
    else:
        # sum_j alpha_ij dalpha_ij, normalized by sum_j alpha_ij (= 1 up to
        # the rounding of lse, which the division removes).
        total = segment_sum(alpha, index, n)
        d = segment_sum(alpha * dalpha, index, n) / torch.where(total > 0, total, 1.0)
    ds = alpha * (dalpha - d[index])  # (E, H)
    dq = segment_sum(ds.unsqueeze(-1) * k[col], index, n) * scale
    dk = segment_sum(ds.unsqueeze(-1) * q[index], col, m) * scale
    return dq, dk, dv, (ds if bias is not None else None)
