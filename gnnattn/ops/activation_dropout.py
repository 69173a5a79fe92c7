"""Dropout of activations, by the counter-based stream of the attention kernels.

:func:`dropout` is ``torch.nn.functional.dropout`` with another random stream
on the CPU: the keep decision of each element is a keyed hash of its position
(:mod:`gnnattn.kernels.common`), computed by a compiled kernel in one pass, and
the backward regenerates it. On the CPU that is several times faster than
torch's dropout (a serial Mersenne Twister and three passes; ``gnnattn bench
--suite train`` measures the model it serves). Elsewhere (CUDA, float16,
bfloat16, or without numba) it is torch's own dropout, which is already fast
there. The kernels are operators (``torch.ops.gnnattn.dropout``,
``relu_dropout``), so a compiled model runs them too. Either way the same
``torch.manual_seed`` gives the same mask, and each element is kept with
probability ``1 - p`` and scaled by ``1 / (1 - p)``.

:func:`relu_dropout` is ``dropout(relu(x))`` in one pass, whose backward
reads only the output (no mask, no hash): the feed-forward of
:class:`gnnattn.nn.GraphTransformerLayer` calls it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import kernels
from ..checks import check_probability
from ..kernels.common import under_func_transform
from ..kernels.library import draw_key

__all__ = ["dropout", "relu_dropout"]


def _stream(x: Tensor) -> bool:
    """Whether the stream's compiled kernel serves ``x`` (else torch's dropout, which a
    ``torch.func`` transform can also run)."""
    return (
        x.device.type == "cpu"
        and "cpu" in kernels.COMPILED
        and x.dtype in (torch.float32, torch.float64)
        and not under_func_transform()
    )


def dropout(x: Tensor, p: float = 0.5, training: bool = True) -> Tensor:
    r"""Zero each element of ``x`` with probability ``p`` and scale the rest.

    .. math::
        y_n = \frac{m_n}{1 - p}\, x_n, \qquad m_n \sim \text{Bernoulli}(1 - p)

    Args:
        x (torch.Tensor): any shape.
        p (float, optional): the probability of zeroing an element, in
            ``[0, 1]`` (at 1 every element, as ``F.dropout``). (default: ``0.5``)
        training (bool, optional): ``False`` returns ``x``. (default: ``True``)

    Shapes:
        - **input:** ``x`` of any shape
        - **output:** the shape of ``x``

    Example:
        >>> _ = torch.manual_seed(0)
        >>> y = dropout(torch.ones(1000, 64), p=0.1)
        >>> 0.88 < (y > 0).float().mean().item() < 0.92
        True
    """
    check_probability(p, "p")
    if not training or p == 0.0:
        return x
    if p == 1.0 or not _stream(x):
        return F.dropout(x, p, training=True)
    return torch.ops.gnnattn.dropout(x, draw_key(), p)


def relu_dropout(x: Tensor, p: float = 0.5, training: bool = True) -> Tensor:
    r"""``dropout(relu(x), p, training)`` in one pass on the CPU.

    .. math::
        y_n = \frac{m_n}{1 - p} \max(x_n, 0), \qquad m_n \sim \text{Bernoulli}(1 - p)

    The mask is :func:`dropout`'s (the same ``torch.manual_seed`` gives the
    same ``y``, bit for bit); the backward is ``grad / (1 - p)`` where
    ``y > 0``, read from the output. Outside the compiled kernels (CUDA,
    half precision) it is ``F.dropout(F.relu(x), p)``.

    Args:
        x (torch.Tensor): any shape.
        p (float, optional): the probability of zeroing an element, in
            ``[0, 1]`` (at 1 every element, as ``F.dropout``). (default: ``0.5``)
        training (bool, optional): ``False`` is ``relu(x)``. (default: ``True``)

    Shapes:
        - **input:** ``x`` of any shape
        - **output:** the shape of ``x``

    Example:
        >>> _ = torch.manual_seed(0)
        >>> x = torch.randn(1000, 64)
        >>> _ = torch.manual_seed(1)
        >>> y = relu_dropout(x, p=0.1)
        >>> _ = torch.manual_seed(1)
        >>> torch.equal(y, dropout(torch.relu(x), p=0.1))
        True
    """
    check_probability(p, "p")
    if not training or p == 0.0:
        return F.relu(x)
    if p == 1.0 or not _stream(x):
        return F.dropout(F.relu(x), p, training=True)
    return torch.ops.gnnattn.relu_dropout(x, draw_key(), p)
