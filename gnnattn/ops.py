r"""The attention operator and its backends.

One operator, several implementations, all computing

.. math::
    \alpha_{ij}^h = \operatorname{softmax}_{j \in \mathcal{N}(i)}
        \left(\langle q_i^h, k_j^h\rangle \cdot \text{scale}\right),
    \qquad o_i^h = \sum_{j \in \mathcal{N}(i)} \alpha_{ij}^h v_j^h

over the incoming edges :math:`j \to i` of each target :math:`i` of an
:class:`~gnnattn.AttentionGraph`:

* ``"mp"``: PyG message passing with :func:`gnnattn.scatter_softmax`, the
  reference; it lives in the layers (``propagate``), not here.
* ``"sdpa"``: for graphs of known structure (complete, causal, their batched
  versions, sliding windows),
  :func:`torch.nn.functional.scaled_dot_product_attention` on ``[B, H, T, C]``
  tensors (the layout for which the CPU picks its fused kernel), with
  ``is_causal`` or a boolean mask.
* ``"fused"``: a sparse kernel over the graph's destination CSR that never
  materializes ``|E| x C`` messages (numba on the CPU, Triton on CUDA; see
  :mod:`gnnattn.kernels`); its backward walks the graph's transposed CSR.

Everything about the graph (its structure, its CSR and transposed CSR) comes
from the graph object, built once by its owner; nothing here caches.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from . import kernels
from .checks import check_choice
from .graphs import AttentionGraph, segment_ids

__all__ = [
    "BACKENDS",
    "check_backend",
    "fused_attention",
    "resolve_backend",
    "sdpa_attention",
]

BACKENDS = ("auto", "mp", "sdpa", "fused")


def check_backend(backend: str) -> str:
    """``backend`` after checking it is one of :data:`BACKENDS`."""
    hint = (
        " (the SDPA backend is called 'sdpa'; the dense *reference* functions live in "
        "gnnattn.dense)"
        if backend == "dense"
        else ""
    )
    check_choice(backend, "backend", BACKENDS, hint)
    return backend


def _has_compiled_kernels(device: torch.device) -> bool:
    return kernels.get(device) is not kernels.reference


def resolve_backend(
    backend: str,
    graph: AttentionGraph,
    device: torch.device,
    *,
    dropout_active: bool = False,
    has_bias: bool = False,
) -> str:
    """Pick the implementation for one call.

    ``"auto"``: SDPA for complete/causal(-batched) graphs and for window graphs
    that fill more than a quarter of the matrix (dense tiles then waste less
    than sparse gathers cost), fused for other graphs when a compiled kernel
    exists for the device, message passing otherwise (and under
    ``torch.compile``, where the numba kernel cannot be traced, and with
    attention dropout on sparse graphs, which the fused kernel does not do).
    """
    check_backend(backend)
    if backend == "sdpa":
        if graph.is_bipartite:
            raise ValueError(
                "backend='sdpa' does not do cross-attention (a pair (x_src, x_dst) or a "
                "bipartite graph); use backend='fused', 'mp' or 'auto'"
            )
        if graph.structure is None:
            raise ValueError(
                "backend='sdpa' needs a graph of known structure (complete, causal, their "
                "batched versions or a sliding window); this edge_index has none. Use "
                "backend='fused' or 'mp'."
            )
        if has_bias:
            raise ValueError(
                "backend='sdpa' does not take per-edge score biases; use 'fused' or 'mp'"
            )
    if backend == "fused" and dropout_active:
        raise ValueError(
            "backend='fused' has no attention dropout; use backend='mp' (or 'auto') while "
            "training with dropout > 0"
        )
    if backend != "auto":
        return backend
    s = graph.structure if not has_bias else None
    if s is not None and (s.kind in ("complete", "causal") or graph.density > 0.25):
        return "sdpa"
    if dropout_active or torch.compiler.is_compiling() or not _has_compiled_kernels(device):
        return "mp"
    return "fused"


# --------------------------------------------------------------------------- sdpa


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
    # Reduce in float32 (float64 stays float64), as every other path does.
    ct = torch.float64 if q.dtype == torch.float64 else torch.float32
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


# --------------------------------------------------------------------------- fused


class _FusedAttention(torch.autograd.Function):
    """Autograd around the kernels' ``attention_fwd`` / ``attention_bwd``.

    The graph rides on ``ctx`` rather than through ``save_for_backward``: its
    index tensors carry no gradient and never change, and the backward takes
    the transposed CSR from it (built once per graph, not per call).
    """

    @staticmethod
    def forward(ctx, q, k, v, bias, graph, scale):  # type: ignore[override]
        ptr, col = _csr_for(graph, q.device)
        kern = kernels.get(q.device)
        out, lse = kern.attention_fwd(q, k, v, ptr, col, scale, bias)
        # The CPU kernel's backward recomputes D_i = dout_i . out_i from the
        # edges, so the output is not kept: at N = 1M, embed 128 that is
        # 0.5 GB less at the backward's peak (the next layer's backward has
        # already freed its own reference to it).
        keep_out = out if q.device.type != "cpu" else None
        ctx.save_for_backward(q, k, v, bias, keep_out, lse)
        ctx.graph = graph
        ctx.scale = scale
        ctx.has_bias = bias is not None
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):  # type: ignore[override]
        q, k, v, bias, out, lse = ctx.saved_tensors
        graph = ctx.graph
        ptr, col = _csr_for(graph, q.device)
        csc = _widened(tuple(graph.csc), q.device)
        kern = kernels.get(q.device)
        dq, dk, dv, dbias = kern.attention_bwd(
            q, k, v, out, lse, grad_out.contiguous(), ptr, col, ctx.scale, bias, csc=csc
        )
        return dq, dk, dv, (dbias if ctx.has_bias else None), None, None


def _csr_for(graph: AttentionGraph, device: torch.device) -> tuple[Tensor, Tensor]:
    """The graph's CSR ``(ptr, col)`` as the device's kernel takes it.

    The CPU kernels take int32 or int64 ``col`` as the graph holds it; the
    Triton kernels take int64 (a no-op unless the graph was built from an
    int32 adjacency).
    """
    ptr, col = _widened((graph.csr.ptr, graph.csr.col), device)
    return ptr, col


def _widened(indices: tuple[Tensor, ...], device: torch.device) -> tuple[Tensor, ...]:
    """Index tensors as the device's kernel takes them: as held on the CPU
    (int32 or int64), int64 for Triton (a no-op for int64)."""
    if device.type == "cpu":
        return indices
    return tuple(t.long() for t in indices)


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
    graph: AttentionGraph,
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
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (qc, kc, vc, bc)):
        # The backward walks the transposed CSR: build it (once per graph) now,
        # before the forward's activations exist, not in the backward, where
        # its sort would add to the peak memory.
        _ = graph.csc
    out, lse = _FusedAttention.apply(qc, kc, vc, bc, graph, scale)
    weights = None
    if need_weights:
        with torch.no_grad():
            ref = kernels.reference
            w = ref.attention_weights(qc, kc, csr.ptr, csr.col, scale, lse, bc)
            # The scores recomputed here and the kernel's log-sum-exp differ by
            # rounding; renormalizing makes every row sum to 1 and keeps each
            # weight <= 1 exactly, as on the other backends.
            index = segment_ids(csr.ptr, csr.col.numel())
            total = ref.segment_sum(w, index, graph.num_dst)
            w = w / torch.where(total > 0, total, torch.ones_like(total))[index]
        if csr.perm is not None:
            w = torch.empty_like(w).index_copy_(0, csr.perm, w)
        weights = w.to(q.dtype)
    return out.to(q.dtype), weights
