"""Node groups for colouring: one class label per node (an int or a str), as the explorer takes it.

``node_color=labels`` colours every node by its class, with a legend: a
per-node tensor of integer classes (``data.y``), or a list of ints or of
strings. The groups are the distinct values, sorted; the page gives group
``k`` the ``k``-th colour of d3's Tableau10 scheme (more than 10 groups are
spread over a rainbow).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from .text import clean

__all__ = ["Groups", "node_groups"]


@dataclass(frozen=True)
class Groups:
    """``names[of[v]]`` is node ``v``'s class, as the legend writes it."""

    names: list[str]
    of: list[int]


def _values(node_color: Any) -> list[Any]:
    if isinstance(node_color, Tensor):
        if node_color.dim() != 1 or node_color.is_floating_point() or node_color.is_complex():
            raise TypeError(
                "Expected 'node_color' to be a 1-D integer tensor (one class per node), got "
                f"{node_color.dtype} of shape {list(node_color.shape)}"
            )
        return [int(v) for v in node_color.tolist()]
    if isinstance(node_color, str) or not isinstance(node_color, Sequence):
        raise TypeError(
            "Expected 'node_color' to be a tensor or a list of ints or strings (one class per "
            f"node), got {type(node_color).__name__}"
        )
    values = list(node_color)
    kinds = {str if isinstance(v, str) else int for v in values}
    bad = [v for v in values if isinstance(v, bool) or not isinstance(v, (int, str))]
    if bad or len(kinds) > 1:
        got = type(bad[0]).__name__ if bad else "ints and strings mixed"
        raise TypeError(f"Expected 'node_color' to hold only ints or only strings, got {got}")
    return values


def node_groups(node_color: Any, n: int) -> Groups:
    """The groups of ``node_color`` (one class per node, ``n`` nodes).

    Example:
        >>> g = node_groups(["cat", "dog", "cat"], 3)
        >>> g.names, g.of
        (['cat', 'dog'], [0, 1, 0])
    """
    values = _values(node_color)
    if len(values) != n:
        raise ValueError(
            f"Expected 'node_color' to hold one class per node ({n}), got {len(values)}"
        )
    distinct = sorted(set(values))
    index = {v: k for k, v in enumerate(distinct)}
    return Groups(names=[clean(str(v)) for v in distinct], of=[index[v] for v in values])
