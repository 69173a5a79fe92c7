"""The ``"sdpa"`` backend: :func:`torch.nn.functional.scaled_dot_product_attention` per block.

For graphs of known structure (complete, causal, their batched versions,
sliding windows) attention is dense attention on ``[B, H, T, C]`` tensors
(the layout for which the CPU picks its fused kernel), with ``is_causal`` or a
boolean mask. Its dropout is SDPA's own (torch's generator of the device), not
the counter-based stream of the sparse backends.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..graphs import AttentionGraph
from ..kernels.common import acc_dtype

__all__ = ["sdpa_attention"]


def _window_mask(graph: AttentionGraph, t: int, device: torch.device) -> Tensor | None:
    """Boolean ``[T, T]`` mask (``True`` = attend) for window graphs, else ``None``."""
    s = graph.structure
    assert s is not None
    if s.kind not in ("window", "causal_window"):
        return None
    i = torch.arange(t, device=device).view(-1, 1)
    j = torch.arange(t, device=device).view(1, -1)
    d = i - j
    if s.kind == "causal_window":
        return (d >= 0) & (d <= s.window)
    return d.abs() <= s.window


def _gather_weights(
    q: Tensor, k: Tensor, graph: AttentionGraph, scale: float, mask: Tensor | None
) -> Tensor:
    """Attention weights ``[|E|, H]`` in ``graph.edge_index`` order, through the matrix."""
    s = graph.structure
    assert s is not None
    n, h = q.shape[0], q.shape[1]
    edge_index = graph.edge_index
    out = q.new_zeros(edge_index.shape[1], h)
    src, dst = edge_index[0], edge_index[1]
    ct = acc_dtype(q.dtype)
    start = 0
    for t in s.lengths:
        qb = q[start : start + t].transpose(0, 1).to(ct)  # (H, T, C)
        kb = k[start : start + t].transpose(0, 1).to(ct)  # (H, T, C)
        sc = torch.matmul(qb, kb.transpose(1, 2)) * scale  # (H, T, T)
        if s.kind == "causal":
            tri = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
            sc = sc.masked_fill(~tri, float("-inf"))
        elif mask is not None:
            sc = sc.masked_fill(~mask[:t, :t], float("-inf"))
        p = torch.softmax(sc, dim=-1).to(q.dtype)  # (H, T, T)
        sel = (dst >= start) & (dst < start + t)
        out[sel] = p[:, dst[sel] - start, src[sel] - start].T
        start += t
    assert start == n
    return out


def sdpa_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    graph: AttentionGraph,
    scale: float,
    *,
    dropout_p: float = 0.0,
    need_weights: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """The ``"sdpa"`` backend: SDPA per block of a structured graph.

    Equal-length blocks go through one ``[B, H, T, C]`` call (``is_causal`` for
    causal graphs, no mask for complete ones: SDPA's fused CPU/GPU kernels).
    Blocks of different lengths are padded to the longest with a mask.
    With ``need_weights`` the weights are computed once more through the
    matrix and gathered on the edges (the slower, documented path).

    Shapes:
        - **q, k:** ``[N, H, C]``; **v:** ``[N, H, Cv]``
        - **output:** ``[N, H, Cv]`` and optionally weights ``[|E|, H]``
    """
    s = graph.structure
    assert s is not None
    n, h, c = q.shape
    cv = v.shape[-1]
    lengths = s.lengths
    if n == 0:
        return v.new_zeros(0, h, cv), (q.new_zeros(0, h) if need_weights else None)
    tmax = max(lengths)
    mask = _window_mask(graph, tmax, q.device)
    is_causal = s.kind == "causal"
    b = len(lengths)
    if all(t == tmax for t in lengths):
        qb = q.view(b, tmax, h, c).transpose(1, 2)  # (B, H, T, C)
        kb = k.view(b, tmax, h, c).transpose(1, 2)  # (B, H, T, C)
        vb = v.view(b, tmax, h, cv).transpose(1, 2)  # (B, H, T, Cv)
        ob = F.scaled_dot_product_attention(
            qb, kb, vb, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale
        )
        out = ob.transpose(1, 2).reshape(n, h, cv)  # (N, H, Cv)
    else:
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
