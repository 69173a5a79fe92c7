"""Text a user gives (tokens, titles, names): checked, made safe to write, drawn as written.

A token is data, not markup: ``"$x$"`` is drawn as the three characters, not
as matplotlib math, and ``"$\\foo$"`` cannot break a figure. Every matplotlib
text that may hold a user's string is made with :data:`PLAIN` (no mathtext,
no LaTeX, whatever the user's ``rcParams``). Strings also pass through
:func:`clean` before they reach a page or a figure: a lone UTF-16 surrogate
(``"\\ud800"``, which Python strings may hold but UTF-8 cannot encode) becomes
U+FFFD, so that saving never raises ``UnicodeEncodeError``.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import MappingProxyType
from typing import Any

from torch import Tensor

__all__ = ["PLAIN", "check_labels", "check_str", "clean"]

# Keyword arguments of matplotlib's Text: the string is drawn as it is.
PLAIN = MappingProxyType({"parse_math": False, "usetex": False})


def clean(s: str) -> str:
    """``s`` with every lone surrogate replaced by U+FFFD (valid pairs are joined).

    Example:
        >>> clean("a\\ud800b"), clean("\\ud83d\\ude00") == "\\U0001f600"
        ('a\ufffdb', True)
    """
    # Through UTF-16 with surrogatepass: a pair becomes its character, a lone
    # half cannot be decoded and is replaced.
    return s.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def check_str(value: Any, name: str, *, optional: bool = False) -> None:
    """Raise ``TypeError`` unless ``value`` is a ``str`` (or ``None`` when ``optional``).

    Example:
        >>> check_str(123, "title", optional=True)
        Traceback (most recent call last):
        ...
        TypeError: Expected 'title' to be a str or None, got int
    """
    if optional and value is None:
        return
    if not isinstance(value, str):
        kind = "a str or None" if optional else "a str"
        raise TypeError(f"Expected '{name}' to be {kind}, got {type(value).__name__}")


def check_labels(value: Any, name: str) -> list[str]:
    """``value`` as a list of cleaned strings, after checking it is a sequence of ``str``.

    Example:
        >>> check_labels(("a", "b"), "tokens")
        ['a', 'b']
    """
    if isinstance(value, str):
        raise TypeError(f"Expected '{name}' to be a list of strings, got one str (use .split())")
    if isinstance(value, Tensor) or not isinstance(value, Sequence):
        raise TypeError(f"Expected '{name}' to be a list of strings, got {type(value).__name__}")
    for k, v in enumerate(value):
        if not isinstance(v, str):
            raise TypeError(
                f"Expected '{name}' to be a list of strings, got {type(v).__name__} at index {k}"
            )
    return [clean(v) for v in value]
