"""``torch.nn.Dropout`` on the counter-based stream of :func:`gnnattn.ops.dropout`."""

from __future__ import annotations

import torch
from torch import Tensor

from ..checks import check_float
from ..ops.activation_dropout import dropout

__all__ = ["Dropout"]


class Dropout(torch.nn.Dropout):
    r"""A drop-in ``torch.nn.Dropout`` whose CPU mask comes from a compiled,
    counter-based stream (:func:`gnnattn.ops.dropout`): one pass instead of
    torch's three, the same distribution, the same ``torch.manual_seed``
    reproducibility; on CUDA it is torch's dropout.

    .. math::
        y_n = \frac{m_n}{1 - p}\, x_n, \qquad m_n \sim \text{Bernoulli}(1 - p)

    Args:
        p (float, optional): the probability of zeroing an element, in
            ``[0, 1)``. (default: ``0.5``)

    Shapes:
        - **input:** any shape
        - **output:** the shape of the input

    Example:
        >>> Dropout(0.1)
        Dropout(p=0.1, inplace=False)
    """

    def __init__(self, p: float = 0.5) -> None:
        check_float(p, "p", lo=0.0, hi=1.0)
        super().__init__(p)

    def forward(self, input: Tensor) -> Tensor:
        return dropout(input, self.p, self.training)
