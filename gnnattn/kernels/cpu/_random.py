"""The attention-dropout stream of :mod:`gnnattn.kernels.common`, compiled with numba.

The stream is defined once, in :func:`gnnattn.kernels.common.dropout_bits`
(a keyed hash of the counter ``offset + e * H + h``); this is the same hash,
bit for bit, for the kernels to call per edge and head.

numba's integer typing decides how it is written. The ``lowbias32`` rounds
multiply 32-bit words; a signed int64 product of two of them can exceed
``2^63``, and numba marks signed arithmetic ``nsw`` (overflow is undefined
behaviour to LLVM), so the words are held in **uint64**, where a product
wraps mod ``2^64`` and masking with ``2^32 - 1`` leaves it mod ``2^32``. Every
constant is a ``np.uint64`` too: numba types a mix of uint64 and int64 as
float64, and shifts of an unsigned word are logical.
"""

from __future__ import annotations

import numba
import numpy as np
import torch
from numba import prange

from ..common import MIX_MUL1, MIX_MUL2, Dropout
from ._simd import _INLINE, _JIT, _NN

_U = np.uint64
_M32 = _U(0xFFFF_FFFF)
_MUL1, _MUL2 = _U(MIX_MUL1), _U(MIX_MUL2)
_S8, _S15, _S16, _S32 = _U(8), _U(15), _U(16), _U(32)


def stream(dropout: Dropout) -> np.ndarray:
    """The key of ``dropout`` as the kernels take it: uint64
    ``[threshold, seed_lo, seed_hi, offset]``."""
    return np.array(
        [dropout.threshold, dropout.seed_lo, dropout.seed_hi, dropout.offset], dtype=np.uint64
    )


@numba.njit(**_INLINE)
def _mix32(x):  # pragma: no cover - compiled
    """``lowbias32`` of the uint64 ``x < 2^32`` (two multiply-xorshift rounds)."""
    x ^= x >> _S16
    x = (x * _MUL1) & _M32
    x ^= x >> _S15
    x = (x * _MUL2) & _M32
    return x ^ (x >> _S16)


@numba.njit(**_INLINE)
def _bits(c, seed_lo, seed_hi):  # pragma: no cover - compiled
    """The stream's 24-bit number of the uint64 counter ``c`` (offset included)."""
    x = _mix32((c & _M32) ^ seed_lo)
    x = _mix32(x ^ (c >> _S32) ^ seed_hi)
    return x >> _S8


@numba.njit(**_INLINE)
def _keep(threshold, seed_lo, seed_hi, offset, scale, e, h, nh, one):  # pragma: no cover
    """What the weight of edge ``e`` (CSR position), head ``h`` of ``nh`` is multiplied
    by: ``scale`` when the stream keeps it, else 0 (all integers uint64 but ``e``,
    ``h``, ``nh``)."""
    c = offset + _U(e) * _U(nh) + _U(h)
    if _bits(c, seed_lo, seed_hi) >= threshold:
        return scale
    return one - one


@numba.njit(**_JIT)
def _bits_kernel(counter, offset, seed_lo, seed_hi, out):  # pragma: no cover - compiled
    for x in prange(counter.shape[0]):
        out[x & _NN] = np.int64(_bits(_U(counter[x]) + offset, seed_lo, seed_hi))


def dropout_bits(dropout: Dropout, counter: torch.Tensor) -> torch.Tensor:
    """:func:`gnnattn.kernels.common.dropout_bits` computed by the compiled stream.

    For tests and tools: the kernels call the same hash inline, per edge and head.
    """
    c = counter.to(torch.int64).contiguous().view(-1)
    out = torch.empty_like(c)
    if c.numel():
        st = stream(dropout)
        _bits_kernel(c.numpy(), st[3], st[1], st[2], out.numpy())
    return out.view(counter.shape)
