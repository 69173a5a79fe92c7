"""Dropout of a dense tensor by the stream of :mod:`gnnattn.kernels.common`, compiled.

torch's CPU dropout draws a Bernoulli number per element from a Mersenne
Twister and then multiplies by the mask and the scale: three passes over the
tensor and a serial generator, which made the residual and feed-forward
dropout of a graph transformer cost as much as its attention on the CPU. Here
the keep decision of element ``n`` is the counter-based hash of ``n`` (the
same stream as attention dropout), so one pass reads ``x`` and writes the
result, split over threads in blocks, and the backward applies the same
factor to the gradient without any stored mask. Results are the same on every
thread count, bit for bit those of :func:`gnnattn.kernels.reference.dropout`.

:func:`relu_dropout` is the feed-forward's ``dropout(relu(x))`` in the same
pass. Its backward needs no hash at all: an element of the output is
positive exactly where the ReLU passed it and the stream kept it, so
:func:`relu_dropout_bwd` reads the output and the gradient and writes one
tensor. Unfused, the ReLU, the dropout and their two backwards were four
passes over the ``[N, 4D]`` activation, two of them hashing every element.

Why a 32-bit hash here and not :mod:`._random`'s. The attention kernels hash
one counter per edge and head inside a loop that is bound by gathers, so
their uint64 words cost nothing. Here the hash *is* the work: written in
uint32 (every product truncated back to 32 bits) the loop vectorizes to
``vpmulld`` on AVX2, where the uint64 form has no vector multiply and
stays scalar. Within a block the counter's high word is constant
unless the low word wraps, which the block checks for (then it takes the
scalar form).
"""

from __future__ import annotations

import numba
import numpy as np
import torch
from numba import prange

from ..common import MIX_MUL1, MIX_MUL2, Dropout
from ._random import stream
from ._simd import _INLINE, _JIT, _NN

_W = np.uint32
_U = np.uint64
_MUL1, _MUL2 = _W(MIX_MUL1), _W(MIX_MUL2)
_S8, _S15, _S16 = _W(8), _W(15), _W(16)
_LO32, _S32 = _U(0xFFFF_FFFF), _U(32)
# Elements per task: large enough that scheduling costs nothing, small enough
# that a few threads share a [50k, 256] activation evenly.
_BLOCK = 16384


@numba.njit(**_INLINE)
def _mix32(x):  # pragma: no cover - compiled
    """``lowbias32`` of the uint32 ``x``, every step truncated to 32 bits."""
    x = _W(x ^ (x >> _S16))
    x = _W(x * _MUL1)
    x = _W(x ^ (x >> _S15))
    x = _W(x * _MUL2)
    return _W(x ^ (x >> _S16))


@numba.njit(**_INLINE)
def _keep(c_lo, c_hi, seed_lo, seed_hi, threshold):  # pragma: no cover - compiled
    """The stream keeps the counter whose 32-bit words are ``c_lo``, ``c_hi``."""
    x = _mix32(_W(c_lo ^ seed_lo))
    x = _mix32(_W(x ^ c_hi ^ seed_hi))
    return _W(x >> _S8) >= threshold


@numba.njit(**_INLINE)
def _act(v, zero, relu):  # pragma: no cover - compiled
    """``max(v, 0)`` if ``relu`` (torch's NaN rule: ``v <= 0`` is false for a
    NaN, which passes), else ``v``."""
    return zero if relu and v <= zero else v


@numba.njit(**_INLINE)
def _dropout_blocks(x, threshold, seed_lo, seed_hi, offset, scale, out, relu):  # pragma: no cover
    """``dropout(relu(x) if relu else x)`` into ``out``; ``relu`` is a constant
    of each caller, so the inlined copies carry no branch on it."""
    n = x.shape[0]
    # A dropped element is multiplied by 0, not replaced by it: a NaN or inf
    # stays NaN, as in torch's dropout (and the reference).
    zero = scale - scale  # 0 typed like x (scale is)
    for b in prange((n + _BLOCK - 1) // _BLOCK):
        lo = (b * _BLOCK) & _NN
        m = min(lo + _BLOCK, n) - lo
        c0 = offset + _U(lo)
        base, top = _W(c0 & _LO32), _W(c0 >> _S32)
        if _U(base) + _U(m) <= _LO32:  # the low word does not wrap in this block
            for t in range(m):
                keep = _keep(_W(base + _W(t)), top, seed_lo, seed_hi, threshold)
                out[lo + t] = _act(x[lo + t], zero, relu) * (scale if keep else zero)
        else:
            for t in range(m):
                c = c0 + _U(t)
                keep = _keep(_W(c & _LO32), _W(c >> _S32), seed_lo, seed_hi, threshold)
                out[lo + t] = _act(x[lo + t], zero, relu) * (scale if keep else zero)


@numba.njit(**_JIT)
def _dropout_kernel(x, threshold, seed_lo, seed_hi, offset, scale, out):  # pragma: no cover
    _dropout_blocks(x, threshold, seed_lo, seed_hi, offset, scale, out, False)


@numba.njit(**_JIT)
def _relu_dropout_kernel(x, threshold, seed_lo, seed_hi, offset, scale, out):  # pragma: no cover
    _dropout_blocks(x, threshold, seed_lo, seed_hi, offset, scale, out, True)


@numba.njit(**_JIT)
def _relu_dropout_bwd_kernel(y, grad, scale, out):  # pragma: no cover - compiled
    n = y.shape[0]
    zero = scale - scale
    for b in prange((n + _BLOCK - 1) // _BLOCK):
        lo = (b * _BLOCK) & _NN
        for i in range(lo, min(lo + _BLOCK, n)):
            # y > 0 exactly where the ReLU passed x and the stream kept it.
            out[i] = grad[i] * (scale if y[i] > zero else zero)


def _real(x: torch.Tensor) -> type:
    if x.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"Expected 'x' float32 or float64, got {x.dtype}")
    return np.float64 if x.dtype == torch.float64 else np.float32


def dropout(x: torch.Tensor, dropout: Dropout) -> torch.Tensor:
    """:func:`gnnattn.kernels.reference.dropout` on a float32/float64 CPU tensor."""
    return _run(_dropout_kernel, x, dropout)


def relu_dropout(x: torch.Tensor, dropout: Dropout) -> torch.Tensor:
    """:func:`gnnattn.kernels.reference.relu_dropout` on a float32/float64 CPU tensor."""
    return _run(_relu_dropout_kernel, x, dropout)


def relu_dropout_bwd(y: torch.Tensor, grad: torch.Tensor, scale: float) -> torch.Tensor:
    """:func:`gnnattn.kernels.reference.relu_dropout_bwd` on float32/float64 CPU tensors."""
    real = _real(y)
    flat_y = y.detach().contiguous().view(-1)
    flat_g = grad.detach().to(y.dtype).contiguous().view(-1)
    out = torch.empty_like(flat_y)
    if flat_y.numel():
        _relu_dropout_bwd_kernel(flat_y.numpy(), flat_g.numpy(), real(scale), out.numpy())
    return out.view(y.shape)


def _run(kernel: object, x: torch.Tensor, dropout: Dropout) -> torch.Tensor:
    real = _real(x)
    flat = x.detach().contiguous().view(-1)
    out = torch.empty_like(flat)
    if flat.numel():
        threshold, seed_lo, seed_hi, offset = (int(v) for v in stream(dropout))
        kernel(  # type: ignore[operator]
            flat.numpy(),
            _W(threshold),
            _W(seed_lo),
            _W(seed_hi),
            _U(offset),
            real(dropout.scale),
            out.numpy(),
        )
    return out.view(x.shape)
