"""``torch.nn.Dropout`` on the counter-based stream of :func:`gnnattn.ops.dropout`."""

from __future__ import annotations

import torch
from torch import Tensor

from ..checks import check_bool, check_probability
from ..ops.activation_dropout import dropout

__all__ = ["Dropout"]


class Dropout(torch.nn.Dropout):
    r"""A drop-in ``torch.nn.Dropout`` whose CPU mask comes from a compiled,
    counter-based stream (:func:`gnnattn.ops.dropout`): one pass instead of
    torch's three, the same distribution, the same ``torch.manual_seed``
    reproducibility; on CUDA, and for ``p = 1`` (nothing kept, no mask to
    draw), it is torch's dropout.

    .. math::
        y_n = \frac{m_n}{1 - p}\, x_n, \qquad m_n \sim \text{Bernoulli}(1 - p)

    Args:
        p (float, optional): the probability of zeroing an element, in
            ``[0, 1]``. (default: ``0.5``)
        inplace (bool, optional): write the result into the input, as
            ``torch.nn.Dropout`` does. (default: ``False``)

    Shapes:
        - **input:** any shape
        - **output:** the shape of the input

    Example:
        >>> Dropout(0.1)
        Dropout(p=0.1, inplace=False)
    """

    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        check_probability(p, "p")
        check_bool(inplace, "inplace")
        super().__init__(p, inplace)

    def forward(self, input: Tensor) -> Tensor:
        if self.p == 1.0:
            return torch.nn.functional.dropout(input, 1.0, self.training, self.inplace)
        out = dropout(input, self.p, self.training)
        if self.inplace and out is not input:
            return input.copy_(out)
        return out
