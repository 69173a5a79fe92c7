r"""Rules every kernel shares: the accumulation dtype, index checks, the dropout stream.

Each rule is written once, here, and used by the pure-torch reference, the
numba kernels and the Triton kernels' host code.

**Accumulation dtype.** Reductions (maxima, sums, dot products) run in
float32 for float32, float16 and bfloat16 inputs and in float64 for float64
ones: :func:`acc_dtype`.

**Index checks.** The compiled kernels do not bounds-check their gathers, so
``ptr`` and ``col`` are checked before any kernel reads them, once per graph
(by the kernels' ``plan`` functions, which the graph object keeps):
:func:`check_ptr`, :func:`check_index`.

**Attention dropout.** A counter-based random stream, as Philox is
(Salmon et al., SC'11) and as FlashAttention and Triton's ``tl.rand`` use:
the random number of an edge and head is a keyed hash of its position, so
the mask is a function of ``(seed, offset, position)`` and nothing else. The
backward regenerates it instead of storing ``|E| x H`` bits, every
implementation (torch, numba, Triton) draws the same mask, and the result does
not depend on the thread count or the order the work is done in. The stream,
for the edge at destination-CSR position ``e`` and head ``h`` of ``H``:

.. math::
    c = \text{offset} + e H + h, \qquad
    x = \text{mix}(\text{mix}(c_{lo} \oplus s_{lo}) \oplus c_{hi} \oplus s_{hi}),
    \qquad \text{keep} \iff \lfloor x / 2^8 \rfloor \ge \text{threshold}

with :math:`c_{lo}, c_{hi}` (:math:`s_{lo}, s_{hi}`) the low and high 32
bits of the counter (the seed), ``mix`` the 32-bit finaliser "lowbias32"
(two multiply-xorshift rounds; C. Wellons, 2018, chosen for its measured
avalanche bias of 0.17%), and ``threshold = round(p * 2^24)``: an integer
comparison, so no implementation rounds differently. Kept weights are scaled
by :math:`1 / (1 - p)`.
"""

from __future__ import annotations

import contextlib
from typing import Any, NamedTuple, TypeVar, cast

import torch
from torch import Tensor

__all__ = [
    "MIX_MUL1",
    "MIX_MUL2",
    "Dropout",
    "acc_dtype",
    "check_index",
    "check_ptr",
    "dropout_bits",
    "dropout_keep",
    "outside_func_transforms",
    "plain_index",
    "under_func_transform",
]

#: The two multipliers of the ``lowbias32`` finaliser.
MIX_MUL1 = 0x7FEB352D
MIX_MUL2 = 0x846CA68B
_M32 = 0xFFFF_FFFF


def under_func_transform() -> bool:
    """Whether a ``torch.func`` transform (``grad``, ``vmap``, ``jvp``, ``jacrev``, ...) is
    active. The compiled kernels do not compose with one: numba reads a storage that
    a transform's wrapped tensors do not have, and the autograd torch generates for a
    custom operator has no ``setup_context``, which the transforms require. Their
    callers take torch-op paths there."""
    return bool(torch._C._are_functorch_transforms_active())


def outside_func_transforms() -> contextlib.AbstractContextManager[Any]:
    """Where graphs are built and read on the host (their layouts, lengths, plans):
    ordinary tensors even inside a ``torch.func`` transform, whose wrapped tensors die
    with it and refuse ``.numpy()``; nothing to do under ``torch.compile``, which does
    not trace the transforms' switch."""
    if torch.compiler.is_compiling():
        return contextlib.nullcontext()
    return torch._C._DisableFuncTorch()


# Whatever a caller passes as ids: a tensor comes back unwrapped, anything else as it is.
_T = TypeVar("_T")


def plain_index(t: _T, name: str) -> _T:
    """Ids (``edge_index``, ``batch``, a segment ``index``) as an ordinary tensor where a
    ``torch.func`` transform wrapped them (an op on them inside ``grad`` returns the
    transform's tensor): ids carry no gradient, so their values are what counts. Ids
    batched by ``vmap`` are refused: one graph serves every call of a ``vmap``."""
    if not isinstance(t, Tensor) or torch.compiler.is_compiling():
        return t  # not ids (the caller's check names it); Dynamo traces the transforms
    from torch._C import _functorch

    ids: Tensor = t
    while _functorch.is_functorch_wrapped_tensor(ids):
        if _functorch.is_batchedtensor(ids):
            raise ValueError(
                f"Expected '{name}' shared by the calls of torch.func.vmap, got one batched "
                "by it (vmap maps over features, not graphs: make one call per graph)"
            )
        ids = _functorch.get_unwrapped(ids)
    return cast(_T, ids)


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype reductions run in: float64 for float64, float32 otherwise."""
    return torch.float64 if dtype == torch.float64 else torch.float32


class Dropout(NamedTuple):
    """Attention dropout of one call: probability and the stream's key.

    Attributes:
        p: the probability of dropping a weight, in ``[0, 1)``.
        seed: the key, ``[0, 2^63)``.
        offset: added to every counter, ``[0, 2^31)``.
    """

    p: float
    seed: int
    offset: int

    @property
    def threshold(self) -> int:
        """Keep iff the stream's 24-bit number is at least this."""
        return int(round(self.p * (1 << 24)))

    @property
    def scale(self) -> float:
        """What a kept weight is multiplied by: ``1 / (1 - p)``."""
        return 1.0 / (1.0 - self.p)

    @property
    def seed_lo(self) -> int:
        return self.seed & _M32

    @property
    def seed_hi(self) -> int:
        return (self.seed >> 32) & _M32


def _mul32(x: Tensor, c: int) -> Tensor:
    """``x * c mod 2^32`` for ``x`` in ``[0, 2^32)`` held in int64, without int64 overflow
    (the product is split at 16 bits of ``c``: each part stays below ``2^48``)."""
    lo = x * (c & 0xFFFF)
    hi = ((x * (c >> 16)) & 0xFFFF) << 16
    return (lo + hi) & _M32


def _mix32(x: Tensor) -> Tensor:
    x = x ^ (x >> 16)
    x = _mul32(x, MIX_MUL1)
    x = x ^ (x >> 15)
    x = _mul32(x, MIX_MUL2)
    return x ^ (x >> 16)


def dropout_bits(dropout: Dropout, counter: Tensor) -> Tensor:
    """The stream's 24-bit numbers (int64 in ``[0, 2^24)``) at ``counter`` (int64, any shape)."""
    c = counter.to(torch.int64) + dropout.offset
    x = _mix32((c & _M32) ^ dropout.seed_lo)
    x = _mix32(x ^ ((c >> 32) & _M32) ^ dropout.seed_hi)
    return x >> 8


def dropout_keep(dropout: Dropout, num_edges: int, num_heads: int, device: torch.device) -> Tensor:
    """The kept ``[E, H]`` (bool) of the edges in destination-CSR order.

    Example:
        >>> keep = dropout_keep(Dropout(0.5, seed=1, offset=0), 1000, 4, torch.device("cpu"))
        >>> keep.shape, 0.45 < keep.float().mean().item() < 0.55
        (torch.Size([1000, 4]), True)
    """
    counter = torch.arange(num_edges * num_heads, dtype=torch.int64, device=device)
    bits = dropout_bits(dropout, counter).view(num_edges, num_heads)
    return bits >= dropout.threshold


def check_ptr(ptr: Tensor, num_edges: int, name: str = "ptr", num_rows: int | None = None) -> None:
    """Raise unless ``ptr`` is int64 ``[N + 1]`` (``N = num_rows`` when given),
    non-decreasing from 0 to ``num_edges``.

    Reads every pointer (one host synchronisation on a GPU): called when a
    graph's plan is made, not per call.
    """
    if not isinstance(ptr, Tensor):
        raise TypeError(f"Expected '{name}' to be a Tensor, got {type(ptr).__name__}")
    if ptr.dtype != torch.int64:
        raise TypeError(f"Expected '{name}' int64, got {ptr.dtype}")
    if ptr.dim() != 1 or ptr.numel() < 1:
        raise ValueError(f"Expected '{name}' of shape [N + 1], got {list(ptr.shape)}")
    if num_rows is not None and ptr.numel() != num_rows + 1:
        # A pointer array of another length than the rows would have the kernels
        # read past its end (or skip rows).
        raise ValueError(
            f"Expected '{name}' of shape [{num_rows + 1}] ({num_rows} segments and the "
            f"end), got {list(ptr.shape)}"
        )
    first, last = int(ptr[0]), int(ptr[-1])
    ok = first == 0 and last == num_edges
    if ok and ptr.numel() > 1:
        ok = bool((ptr.diff() >= 0).all())
    if not ok:
        raise ValueError(
            f"Expected '{name}' non-decreasing from 0 to the number of edges {num_edges}, "
            f"got {first} ... {last}"
        )


def check_index(col: Tensor, num: int, name: str = "col") -> None:
    """Raise unless ``col`` is int32/int64 ``[E]`` with every id in ``[0, num)``."""
    if not isinstance(col, Tensor):
        raise TypeError(f"Expected '{name}' to be a Tensor, got {type(col).__name__}")
    if col.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"Expected '{name}' int64 or int32, got {col.dtype}")
    if col.dim() != 1:
        raise ValueError(f"Expected '{name}' of shape [E], got {list(col.shape)}")
    if col.numel():
        lo, hi = int(col.min()), int(col.max())
        if lo < 0 or hi >= num:
            raise ValueError(f"Expected '{name}' ids in [0, {num}), got [{lo}, {hi}]")
