r"""Attention within complete blocks: a batch of small complete graphs, one task per block.

The nodes of block :math:`b` are the rows ``ptr[b] .. ptr[b + 1]``, and each
attends to every node of its block (GPSConv's global attention on a PyG
batch of molecules). Per block and head, with :math:`Q, K, V` the block's
``[T, C]`` rows,

.. math::
    S = Q K^\top \cdot \text{scale}, \qquad
    O = \operatorname{softmax}_{\text{row}}(S)\, V, \qquad
    \text{lse} = \log \textstyle\sum_j e^{S_{:j}}

and the backward :math:`dS = P \odot (dP - D)` with :math:`dP = dO\,
V^\top` and :math:`D_i = dO_i \cdot O_i`, :math:`dQ = dS\,K \cdot
\text{scale}`, :math:`dK = dS^\top Q \cdot \text{scale}`, :math:`dV = P^\top
dO`.

Why a kernel of its own. On blocks of tens of nodes the CPU's fused SDPA
kernel spends most of a call on its setup, and blocks of different lengths
take one call per bucket of similar lengths plus the gathers into and out of
the buckets (:mod:`gnnattn.ops.sdpa`): on a batch of 32 molecules, about a
fifth of a GPSConv training step. Here one parallel region does every block,
unpadded and ungathered.

Layout. A task is one (block, head): the block's keys and values are copied
once into ``[C, T]`` buffers (transposed), so that every loop over the
block's keys runs over contiguous memory and vectorizes: a score row is ``C``
passes ``s += q_c k_c``, an output element one dot product ``p . v_c``. The
key dimension is padded to a multiple of :data:`_PAD` with zero keys and
values whose scores are set to ``-inf`` (weight 0): a loop of, say, 15 keys
would otherwise run in the vector loop's scalar remainder (measured 3x
slower backward at 15 keys than at 16). The blocks' tasks go to
``2 x threads`` runs of about equal work (``T^2``, longest first onto the
least loaded run), so one thread's share is not one large block late.

Arithmetic. Each task is computed by one thread in a fixed order, so the
thread count does not change the results beyond rounding. Not bitwise: the
backward's float32 gradients were seen to move by up to 4e-7 between two
calls on the same inputs under numba's OpenMP layer (not under its workqueue
layer; the cause is not identified); the forward's did not. Float32
accumulates in
float32 (as SDPA's CPU kernel), float64 in float64. No masks: every node of
a block is a key of every other, so every row has a finite maximum for finite
inputs; a NaN or ``inf`` in a query makes its row NaN, in a key or value every
row of its block (that head's).
"""

from __future__ import annotations

import math

import numba
import numpy as np
import torch
from torch import Tensor

from ._simd import _INLINE, _JIT, _SERIAL, _exp
from .plans import _threads

__all__ = ["block_attention_bwd", "block_attention_fwd"]

#: Key columns are padded to a multiple of this (one AVX2 float32 vector).
_PAD = 8


@numba.njit(**_SERIAL)
def _runs(ptr, heads, runs):  # pragma: no cover - compiled
    """The tasks (``block * heads + head``) in ``runs`` runs of about equal work,
    longest block first onto the least loaded run; ``(tasks, starts)``."""
    nb = ptr.shape[0] - 1
    lens = ptr[1:] - ptr[:-1]
    order = np.argsort(-lens, kind="mergesort")
    load = np.zeros(runs, np.int64)
    run_of = np.empty(nb * heads, np.int64)
    counts = np.zeros(runs + 1, np.int64)
    for i in range(nb):
        t = lens[order[i]]
        for h in range(heads):
            r = np.argmin(load)
            load[r] += t * t + 1
            run_of[i * heads + h] = r
            counts[r + 1] += 1
    starts = np.cumsum(counts)
    fill = starts[:-1].copy()
    tasks = np.empty(nb * heads, np.int64)
    for i in range(nb):
        for h in range(heads):
            r = run_of[i * heads + h]
            tasks[fill[r]] = order[i] * heads + h
            fill[r] += 1
    return tasks, starts


@numba.njit(**_SERIAL)
def _padded_max(ptr):  # pragma: no cover - compiled
    """The longest block's length, rounded up to :data:`_PAD`."""
    t = 0
    for b in range(ptr.shape[0] - 1):
        t = max(t, ptr[b + 1] - ptr[b])
    return (t + _PAD - 1) // _PAD * _PAD


@numba.njit(**_INLINE)
def _load_task(k, v, ptr, task, kT, vT):  # pragma: no cover - compiled
    """Task ``block * H + head``'s keys and values into ``[C, tp]`` (zero past the
    block's ``t`` rows); ``(head, first row, t, tp)``, ``tp`` = ``t`` rounded up to
    :data:`_PAD`."""
    heads, c_dim = k.shape[1], k.shape[2]
    b, h = task // heads, task % heads
    s0 = ptr[b]
    t = ptr[b + 1] - s0
    tp = (t + _PAD - 1) // _PAD * _PAD
    for j in range(t):
        for c in range(c_dim):
            kT[c, j] = k[s0 + j, h, c]
            vT[c, j] = v[s0 + j, h, c]
    for j in range(t, tp):
        for c in range(c_dim):
            kT[c, j] = 0
            vT[c, j] = 0
    return h, s0, t, tp


@numba.njit(**_INLINE)
def _scores(qs, kT, tp, s):  # pragma: no cover - compiled
    """``s[:tp] = qs . kT`` (``qs`` already scaled): ``C`` vectorized passes."""
    for j in range(tp):
        s[j] = 0
    for c in range(qs.shape[0]):
        qc = qs[c]
        kc = kT[c]
        for j in range(tp):
            s[j] += qc * kc[j]


@numba.njit(**_JIT)
def _fwd(q, k, v, ptr, scale, runs, out, lse):  # pragma: no cover - compiled
    heads, c_dim = q.shape[1], q.shape[2]
    tasks, starts = _runs(ptr, heads, runs)
    tmax = _padded_max(ptr)
    for r in numba.prange(runs):
        kT = np.empty((c_dim, tmax), q.dtype)
        vT = np.empty((c_dim, tmax), q.dtype)
        s = np.empty(tmax, q.dtype)
        qs = np.empty(c_dim, q.dtype)
        for x in range(starts[r], starts[r + 1]):
            h, s0, t, tp = _load_task(k, v, ptr, tasks[x], kT, vT)
            for i in range(s0, s0 + t):
                for c in range(c_dim):
                    qs[c] = q[i, h, c] * scale
                _scores(qs, kT, tp, s)
                m = s[0]
                for j in range(t):
                    m = s[j] if s[j] > m else m
                for j in range(t, tp):
                    s[j] = -np.inf  # padding: weight exp(-inf) = 0
                tot = q.dtype.type(0)
                for j in range(tp):
                    e = _exp(s[j] - m)
                    s[j] = e
                    tot += e
                inv = q.dtype.type(1) / tot
                for c in range(c_dim):
                    vc = vT[c]
                    acc = q.dtype.type(0)
                    for j in range(tp):
                        acc += s[j] * vc[j]
                    out[i, h, c] = acc * inv
                lse[i, h] = m + math.log(tot)


@numba.njit(**_JIT)
def _bwd(q, k, v, out, lse, dout, ptr, scale, runs, dq, dk, dv):  # pragma: no cover - compiled
    heads, c_dim = q.shape[1], q.shape[2]
    tasks, starts = _runs(ptr, heads, runs)
    tmax = _padded_max(ptr)
    for r in numba.prange(runs):
        kT = np.empty((c_dim, tmax), q.dtype)
        vT = np.empty((c_dim, tmax), q.dtype)
        dkT = np.empty((c_dim, tmax), q.dtype)
        dvT = np.empty((c_dim, tmax), q.dtype)
        p = np.empty(tmax, q.dtype)
        ds = np.empty(tmax, q.dtype)
        qs = np.empty(c_dim, q.dtype)
        dos = np.empty(c_dim, q.dtype)
        for x in range(starts[r], starts[r + 1]):
            h, s0, t, tp = _load_task(k, v, ptr, tasks[x], kT, vT)
            dkT[:, :tp] = 0
            dvT[:, :tp] = 0
            for i in range(s0, s0 + t):
                d = q.dtype.type(0)
                for c in range(c_dim):
                    qs[c] = q[i, h, c] * scale
                    dos[c] = dout[i, h, c]
                    d += dos[c] * out[i, h, c]
                _scores(qs, kT, tp, p)
                _scores(dos, vT, tp, ds)  # dP = dO . V
                for j in range(t, tp):
                    p[j] = -np.inf
                li = lse[i, h]
                for j in range(tp):
                    w = _exp(p[j] - li)
                    p[j] = w
                    ds[j] = w * (ds[j] - d)
                for c in range(c_dim):
                    kc = kT[c]
                    acc = q.dtype.type(0)
                    for j in range(tp):
                        acc += ds[j] * kc[j]
                    dq[i, h, c] = acc * scale
                for c in range(c_dim):
                    qc = qs[c]
                    dc = dos[c]
                    dkc = dkT[c]
                    dvc = dvT[c]
                    for j in range(tp):
                        dkc[j] += qc * ds[j]
                        dvc[j] += dc * p[j]
            for j in range(t):
                for c in range(c_dim):
                    dk[s0 + j, h, c] = dkT[c, j]
                    dv[s0 + j, h, c] = dvT[c, j]


def _scalar(scale: float, t: Tensor) -> float:
    # In the tensors' dtype: a float64 scale would make numba compute float32
    # scores in float64 (another specialisation, and slower).
    return np.float32(scale) if t.dtype == torch.float32 else float(scale)  # type: ignore[return-value]


def block_attention_fwd(
    q: Tensor, k: Tensor, v: Tensor, ptr: Tensor, scale: float
) -> tuple[Tensor, Tensor]:
    """Attention within each complete block of ``ptr`` (the module's docstring).

    Args:
        q, k, v (Tensor): contiguous ``[N, H, C]``, float32 or float64, on the CPU
            (the caller checked them).
        ptr (Tensor): int64 ``[B + 1]``, the blocks' starts, then ``N``.
        scale (float): the scores' factor.

    Returns:
        ``(out [N, H, C], lse [N, H])``, new tensors.
    """
    out = torch.empty_like(q)
    lse = q.new_empty(q.shape[:2])
    runs = 2 * _threads()
    # detach: .numpy() refuses a tensor that requires grad (no copy is made).
    arrays = (t.detach().numpy() for t in (q, k, v, ptr))
    _fwd(*arrays, _scalar(scale, q), runs, out.numpy(), lse.numpy())
    return out, lse


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
    """The gradients of :func:`block_attention_fwd`, from its saved ``lse``.

    Args:
        q, k, v, ptr, scale: the forward's (contiguous).
        out, lse (Tensor): the forward's results.
        grad (Tensor): the gradient of ``out``, contiguous ``[N, H, C]``.

    Returns:
        ``(dq, dk, dv)``, new tensors.
    """
    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
    runs = 2 * _threads()
    arrays = (t.detach().numpy() for t in (q, k, v, out, lse, grad, ptr))
    _bwd(*arrays, _scalar(scale, q), runs, dq.numpy(), dk.numpy(), dv.numpy())
    return dq, dk, dv
