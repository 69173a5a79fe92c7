"""Argument checks shared by every module: one helper per kind of argument.

Each raises a ``TypeError`` (wrong type) or ``ValueError`` (wrong value) that
names the argument, what was expected and what came, as the developers' guide
asks; nothing is silently converted. Graph arguments (``edge_index``,
``batch``) are checked in :mod:`gnnattn.graphs.validate`, next to the graph
object that owns them.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "check_bool",
    "check_choice",
    "check_edge_input",
    "check_float",
    "check_int",
    "check_like",
    "check_probability",
    "check_tensor",
    "check_x",
    "same_device",
]


def check_bool(value: Any, name: str) -> None:
    """Raise unless ``value`` is a ``bool`` (a flag given as ``"no"`` or ``0`` would be
    read by its truth, silently).

    Example:
        >>> check_bool("no", "causal")
        Traceback (most recent call last):
        ...
        TypeError: Expected 'causal' to be a bool, got str
    """
    if not isinstance(value, bool):
        raise TypeError(f"Expected '{name}' to be a bool, got {type(value).__name__}")


def check_int(value: Any, name: str, *, min: int = 0, optional: bool = False) -> None:
    """Raise unless ``value`` is an ``int`` (not a ``bool``) of at least ``min``.

    Example:
        >>> check_int(4, "num_heads", min=1)
        >>> check_int(0, "num_heads", min=1)
        Traceback (most recent call last):
        ...
        ValueError: Expected 'num_heads' to be a positive int, got 0
    """
    if optional and value is None:
        return
    # A SymInt is a size traced by torch.export or a dynamic torch.compile.
    if isinstance(value, bool) or not isinstance(value, (int, torch.SymInt)):
        kind = "an int or None" if optional else "an int"
        raise TypeError(f"Expected '{name}' to be {kind}, got {type(value).__name__}")
    if value < min:
        what = "a positive int" if min == 1 else f"an int >= {min}"
        raise ValueError(f"Expected '{name}' to be {what}, got {value}")


def check_float(
    value: Any,
    name: str,
    *,
    lo: float | None = None,
    hi: float | None = None,
    finite: bool = False,
) -> float:
    """``value`` as a ``float``, after checking it is a real number (not NaN) in ``[lo, hi)``
    (and, with ``finite``, neither ``inf`` nor ``-inf``).

    Example:
        >>> check_float(float("nan"), "dropout", lo=0.0, hi=1.0)
        Traceback (most recent call last):
        ...
        ValueError: Expected 'dropout' in [0, 1), got nan
        >>> check_float(float("inf"), "scale", finite=True)
        Traceback (most recent call last):
        ...
        ValueError: Expected 'scale' to be a finite float, got inf
    """
    _check_real(value, name)
    if value != value or (lo is not None and value < lo) or (hi is not None and value >= hi):
        raise ValueError(
            f"Expected '{name}' in [{'-inf' if lo is None else f'{lo:g}'}, "
            f"{'inf' if hi is None else f'{hi:g}'}), got {value}"
        )
    if finite and not math.isfinite(value):
        raise ValueError(f"Expected '{name}' to be a finite float, got {value}")
    return float(value)


def check_probability(value: Any, name: str) -> float:
    """``value`` as a ``float``, after checking it is a probability in ``[0, 1]``:
    ``F.dropout``'s range, which PyG's layers take (at 1 every element is dropped).

    Example:
        >>> check_probability(1.0, "dropout")
        1.0
        >>> check_probability(float("nan"), "dropout")
        Traceback (most recent call last):
        ...
        ValueError: Expected 'dropout' in [0, 1], got nan
    """
    _check_real(value, name)
    # Closed at 1, unlike check_float's half-open bounds; a NaN fails the test too.
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"Expected '{name}' in [0, 1], got {value}")
    return float(value)


def _check_real(value: Any, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"Expected '{name}' to be a float, got {type(value).__name__}")


def check_choice(value: Any, name: str, choices: Collection[Any], hint: str = "") -> None:
    """Raise unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"Expected '{name}' to be one of {tuple(choices)}, got {value!r}{hint}")


def check_tensor(value: Any, name: str) -> Tensor:
    """Raise unless ``value`` is a ``torch.Tensor``; returns it typed as one."""
    if not isinstance(value, Tensor):
        raise TypeError(f"Expected '{name}' to be a Tensor, got {type(value).__name__}")
    return value


def check_x(x: Any, width: int | None = None, name: str = "x") -> Tensor:
    """Raise unless ``x`` is a floating ``[N, width]`` tensor of node features."""
    check_tensor(x, name)
    if x.dim() != 2:
        raise ValueError(
            f"Expected '{name}' of shape [N, {width if width is not None else 'F'}] "
            f"(one row per node), got {list(x.shape)}"
        )
    if width is not None and x.shape[1] != width:
        raise ValueError(f"Expected '{name}' of shape [N, {width}], got {list(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"Expected '{name}' of a floating dtype, got {x.dtype}")
    return x


def check_like(x: Tensor, weight: Tensor, name: str = "x") -> None:
    """Raise unless ``x`` is on the device and of the dtype of a layer's ``weight``
    (any dtype under autocast, where the projections cast ``x`` themselves)."""
    if x.device != weight.device:
        raise ValueError(
            f"Expected '{name}' on the layer's device {weight.device}, got {x.device} "
            f"(move one with .to())"
        )
    if x.dtype != weight.dtype and not torch.is_autocast_enabled(x.device.type):
        raise TypeError(
            f"Expected '{name}' of the layer's dtype {weight.dtype}, got {x.dtype} "
            f"(convert with layer.to({x.dtype}) or x.to({weight.dtype}), or use torch.autocast)"
        )


def same_device(a: Tensor, b_device: torch.device, name: str, what: str) -> None:
    """Raise unless ``a`` lives on ``b_device`` (``what`` says whose device that is)."""
    if a.device != b_device:
        raise ValueError(f"Expected '{name}' on device {b_device} ({what}), got {a.device}")


def check_edge_input(t: Tensor, x: Tensor, name: str) -> None:
    """Raise unless the edge input ``t`` (``edge_attr``, ``attn_bias``) is floating, on
    ``x``'s device and, outside autocast (where the projections cast their inputs), of
    ``x``'s dtype.

    Example:
        >>> x = torch.randn(3, 4)
        >>> check_edge_input(torch.randn(2, 5), x, "edge_attr")
        >>> check_edge_input(torch.randn(2, 5, dtype=torch.float64), x, "edge_attr")
        Traceback (most recent call last):
        ...
        TypeError: Expected 'edge_attr' of dtype torch.float32 (the dtype of x), got torch.float64 (convert it with .to(torch.float32), or use torch.autocast)
    """  # noqa: E501
    if not t.is_floating_point():
        raise TypeError(f"Expected '{name}' of a floating dtype, got {t.dtype}")
    if t.device != x.device:
        raise ValueError(
            f"Expected '{name}' on device {x.device} (the device of x), got {t.device}"
        )
    if t.dtype != x.dtype and not torch.is_autocast_enabled(x.device.type):
        raise TypeError(
            f"Expected '{name}' of dtype {x.dtype} (the dtype of x), got {t.dtype} "
            f"(convert it with .to({x.dtype}), or use torch.autocast)"
        )
