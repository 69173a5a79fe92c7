"""The ``"sdpa"`` backend: :func:`torch.nn.functional.scaled_dot_product_attention` per block.

For graphs of known structure (complete, causal, their batched versions,
sliding windows) attention is dense attention on ``[B, H, T, C]`` tensors
(the layout for which the CPU picks its fused kernel), with ``is_causal`` or a
boolean mask. Its dropout is SDPA's own (torch's generator of the device), not
the counter-based stream of the sparse backends.

Blocks of different lengths (a PyG batch of graphs of many sizes) are
*bucketed*: sorted by length and grouped greedily, longest first, into
buckets whose padded pairs exceed the real ones by at most
:data:`MAX_PADDING` (15%); each bucket is one SDPA call on its blocks
gathered into ``[B_bucket, H, T_bucket, C]`` with a key-padding mask, and the
outputs are gathered back. Padding every block to the longest one (as
``to_dense_batch`` does) costs ``B * T_max^2`` pairs, six times the real
ones on a skewed batch; the buckets cost at most 1.15 times them, plus one
SDPA call per bucket (about ``log(T_max) / log(1 / 0.92)`` of them, as
lengths within 8% of each other share one). The plan (the gather indices
and masks) is built once per graph and device and kept on the graph
(:meth:`~gnnattn.AttentionGraph.derived`).

On the CPU, complete blocks of different lengths up to
:data:`BLOCK_KERNEL_MAX` (128) nodes (a batch of molecules) skip the buckets: one
call of the block kernel (``torch.ops.gnnattn.block_attention_fwd``,
:mod:`gnnattn.kernels.cpu.blocks`) attends within every block, unpadded,
forward and backward; SDPA's per-call setup dominates at such sizes.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..graphs import AttentionGraph
from ..graphs.graph import BLOCK_STARTS
from ..kernels import COMPILED
from ..kernels.common import acc_dtype
from ..kernels.library import block_attention
from .fused import edge_weights

__all__ = [
    "BLOCK_KERNEL_MAX",
    "MAX_PADDING",
    "SDPABucket",
    "SDPAPlan",
    "compiled_blocks",
    "sdpa_attention",
    "sdpa_plan",
]

#: The most padded pairs a bucket of blocks may hold, as a fraction of all its
#: pairs (padded and real): a bucket of longest block ``T`` takes blocks down
#: to about ``0.92 T`` (``0.92^2 = 0.85``).
MAX_PADDING = 0.15

#: The longest block that the block kernel takes on the CPU. Measured against
#: the buckets (forward+backward, float32, H = 4, C = 16, 2 threads, blocks of
#: T/2..T nodes): 0.56-0.68x their time up to T = 96, 0.82x at 128, 0.93x at
#: 192-256, 1.05x at 384 and 1.17x at 512 (aten's flash kernel has the better
#: inner loops for long blocks).
BLOCK_KERNEL_MAX = 128


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


class SDPABucket(NamedTuple):
    """Blocks of similar lengths, padded to the longest of them for one SDPA call.

    Attributes:
        blocks: the number of blocks in the bucket.
        length: their padded length ``T`` (the longest block's).
        valid: ``[blocks, T]`` which padded positions are real rows, or
            ``None`` when every block of the bucket has length ``T``.
    """

    blocks: int
    length: int
    valid: Tensor | None


class SDPAPlan(NamedTuple):
    """How :func:`sdpa_attention` runs blocks of different lengths (see :func:`sdpa_plan`).

    Attributes:
        buckets: the buckets, in the order of ``rows``.
        rows: ``[P]`` the row of ``q``/``k``/``v`` at each padded position of
            the buckets, one after another (``P = sum(blocks * T)``); a padded
            position repeats its block's last row (masked as a key, dropped as
            a query).
        take: ``[N]`` the padded position of every row, to gather the
            output back.
    """

    buckets: tuple[SDPABucket, ...]
    rows: Tensor
    take: Tensor


def sdpa_plan(lengths: tuple[int, ...], device: torch.device) -> SDPAPlan:
    """The buckets of blocks of ``lengths`` and their gather indices on ``device``.

    Blocks sorted by length (longest first, ties in block order) and grouped
    greedily: a bucket takes the next block unless that takes its padded pairs
    past :data:`MAX_PADDING` of its pairs. Made in one compiled pass on the
    host (:func:`gnnattn.kernels.cpu.host.buckets`): a batch of molecules makes
    a new plan per step, where a dozen numpy ops cost a twentieth of it.

    Example:
        >>> plan = sdpa_plan((3, 1, 10, 9), torch.device("cpu"))
        >>> [(b.blocks, b.length) for b in plan.buckets]
        [(2, 10), (1, 3), (1, 1)]
    """
    from ..kernels.cpu.host import buckets as make

    tops, counts, rows, take, valid = make(lengths, MAX_PADDING)
    buckets = []
    at = 0
    for t, b in zip(tops.tolist(), counts.tolist(), strict=True):
        ok = valid[at : at + b * t]
        at += b * t
        # Full when the bucket's shortest (last) block has its length.
        mask = None if not ok.size or ok[-1] else torch.from_numpy(ok.reshape(b, t)).to(device)
        buckets.append(SDPABucket(b, t, mask))
    return SDPAPlan(
        tuple(buckets), torch.from_numpy(rows).to(device), torch.from_numpy(take).to(device)
    )


def _bucket_mask(
    graph: AttentionGraph, bucket: SDPABucket, device: torch.device
) -> tuple[Tensor | None, bool]:
    """``(attn_mask, is_causal)`` of one bucket's SDPA call (``True`` = attend)."""
    s = graph.structure
    assert s is not None
    valid, t = bucket.valid, bucket.length
    if s.kind == "causal":
        # Padding is at the end of a block: a real query sees only earlier,
        # real keys; a padded query row (a copy of the block's last row, dropped)
        # sees the last row's scores and copies of them, no others.
        return None, True
    band = _window_mask(graph, t, device)
    if valid is None:
        return band, False
    keys = valid.view(bucket.blocks, 1, 1, t)
    if band is None:
        return keys, False  # broadcast over queries: every block has a real key
    # A padded query row (a copy of its block's last row) takes the last row's
    # band: it sees a real key, and no score the real rows do not see (an
    # overflow there would reach the keys' gradients as NaN * 0).
    last = valid.sum(1, keepdim=True) - 1  # (blocks, 1)
    qrow = torch.minimum(torch.arange(t, device=device).view(1, -1), last)  # (blocks, T)
    return band[qrow].unsqueeze(1) & keys, False  # (blocks, 1, T, T)


def _bucketed(
    q: Tensor, k: Tensor, v: Tensor, graph: AttentionGraph, scale: float, dropout_p: float
) -> Tensor:
    """SDPA per bucket of similar-length blocks (see the module's docstring)."""
    s = graph.structure
    assert s is not None
    dev = q.device
    plan = graph.derived(("sdpa_plan", str(dev)), lambda: sdpa_plan(s.lengths, dev))
    h, c, cv = q.shape[1], q.shape[2], v.shape[2]
    sizes = [b.blocks * b.length for b in plan.buckets]
    # index_select, not t[rows]: its backward is an index_add, where advanced
    # indexing's is an accumulating index_put (a sort on the CPU, the most
    # costly op of a GPSConv step on a batch of molecules). split, not
    # slices: its backward concatenates the buckets' gradients (a slice's
    # backward would add a zero-filled [P, H, C] per bucket).
    qs, ks, vs = (t.index_select(0, plan.rows).split(sizes) for t in (q, k, v))
    outs = []
    for bucket, qp, kp, vp in zip(plan.buckets, qs, ks, vs, strict=True):
        b, t = bucket.blocks, bucket.length
        qb = qp.view(b, t, h, c).transpose(1, 2)  # (b, H, T, C)
        kb = kp.view(b, t, h, c).transpose(1, 2)
        vb = vp.view(b, t, h, cv).transpose(1, 2)
        mask, is_causal = _bucket_mask(graph, bucket, dev)
        ob = F.scaled_dot_product_attention(
            qb, kb, vb, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale
        )
        outs.append(ob.transpose(1, 2).reshape(b * t, h, cv))
    return torch.cat(outs).index_select(0, plan.take)  # (N, H, Cv)


def _block_kernel(q: Tensor, v: Tensor, graph: AttentionGraph, dropout_p: float) -> bool:
    """Whether the blocks go to the block kernel (:mod:`gnnattn.kernels.cpu.blocks`):
    complete blocks of at most :data:`BLOCK_KERNEL_MAX` nodes on the CPU, float32 or
    float64, ``C = Cv``, without dropout (SDPA's dropout is torch's generator's), where
    numba is installed (the reference, a loop over the blocks, is slower than buckets).
    Reads the structure's flags, not its lengths (no guard on each under compile)."""
    s = graph.structure
    assert s is not None
    return (
        q.device.type == "cpu"
        and "cpu" in COMPILED
        and s.kind == "complete"
        and s.longest <= BLOCK_KERNEL_MAX
        and dropout_p == 0.0
        and q.dtype in (torch.float32, torch.float64)
        and q.shape[-1] == v.shape[-1]
    )


def compiled_blocks(q: Tensor, graph: AttentionGraph, dropout_p: float) -> bool:
    """Whether a compiled call may send a batch of blocks of different lengths to
    SDPA: where the block kernel takes them (values as wide as the queries) and the
    graph holds its :meth:`~AttentionGraph.block_starts` (:meth:`~AttentionGraph.prepare`,
    or an eager call), so that nothing is read per length. Buckets are Python
    structure (a call per bucket): every new batch would be a new compiled graph."""
    return _block_kernel(q, q, graph, dropout_p) and graph.peek(BLOCK_STARTS) is not None


def _gather_weights(q: Tensor, k: Tensor, graph: AttentionGraph, scale: float) -> Tensor:
    """Attention weights ``[|E|, H]`` in ``graph.edge_index`` order, on the edges (a
    structure's edges are exactly the graph's: no mask), in the accumulation dtype."""
    ct = acc_dtype(q.dtype)
    return edge_weights(q.to(ct), k.to(ct), graph, scale).to(q.dtype)


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
    Blocks of different lengths run bucketed by length (the module's
    docstring), each bucket with a key-padding mask; on the CPU, complete
    ones of at most :data:`BLOCK_KERNEL_MAX` nodes (float32/float64, no
    dropout) in one call of the block kernel instead.
    With ``need_weights`` the weights are the softmax of the scores
    recomputed on the edges (:func:`~gnnattn.ops.fused.edge_weights`).

    Shapes:
        - **q, k:** ``[N, H, C]``; **v:** ``[N, H, Cv]``
        - **output:** ``[N, H, Cv]`` and optionally weights ``[|E|, H]``
    """
    s = graph.structure
    assert s is not None
    n, h, c = q.shape
    cv = v.shape[-1]
    if n == 0:
        # Empty, but in the autograd graph of q, k and v (zero gradients), as the other
        # backends' outputs are: a backward through it must not find no grad_fn.
        out = v[:0] + (q.sum() + k.sum()).to(v.dtype) * 0  # (0, H, Cv)
        return out, (q.new_zeros(0, h) if need_weights else None)
    if s.kind == "causal" and scale <= 0:
        # torch's SDPA with is_causal gives NaN rows for a scale <= 0 (its causal
        # mask is applied to the scaled scores, torch 2.13 on the CPU); scaled in q
        # instead, the kernel's own scale is 1.
        q, scale = q * scale, 1.0
    if not s.uniform and _block_kernel(q, v, graph, dropout_p):
        out = block_attention(q, k, v, graph.block_starts(), scale)
        weights = _gather_weights(q, k, graph, scale) if need_weights else None
        return out, weights
    # The structure's flags and longest block, and the block count from q's size, not
    # from the lengths: compiled, each length read would be a guard (a batch with
    # another number of equal blocks would compile again).
    tmax = s.longest
    mask = _window_mask(graph, tmax, q.device)
    is_causal = s.kind == "causal"
    if s.uniform:
        b = n // tmax
        qb = q.view(b, tmax, h, c).transpose(1, 2)  # (B, H, T, C)
        kb = k.view(b, tmax, h, c).transpose(1, 2)  # (B, H, T, C)
        vb = v.view(b, tmax, h, cv).transpose(1, 2)  # (B, H, T, Cv)
        ob = F.scaled_dot_product_attention(
            qb, kb, vb, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale
        )
        out = ob.transpose(1, 2).reshape(n, h, cv)  # (N, H, Cv)
    else:
        out = _bucketed(q, k, v, graph, scale, dropout_p)
    weights = _gather_weights(q, k, graph, scale) if need_weights else None
    return out, weights
