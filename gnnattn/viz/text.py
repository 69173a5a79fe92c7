"""Text a user gives (tokens, titles, names): checked, made safe to write, drawn as written.

A token is data, not markup: ``"$x$"`` is drawn as the three characters, not
as matplotlib math, and ``"$\\foo$"`` cannot break a figure. Every matplotlib
text that may hold a user's string is made with :data:`PLAIN` (no mathtext,
no LaTeX, whatever the user's ``rcParams``). Strings also pass through
:func:`clean` before they reach a page or a figure: a lone UTF-16 surrogate
(``"\\ud800"``, which Python strings may hold but UTF-8 cannot encode) becomes
U+FFFD, so that saving never raises ``UnicodeEncodeError``.

A label too long to be read is cut by :func:`shorten` (the explorer page cuts
at :data:`MAX_LABEL_CHARS`): at a code point that starts a character as the
reader sees it (never before a combining mark, a variation selector, a skin
tone, or inside an emoji ZWJ sequence, an Indic conjunct or a flag), then an
ellipsis.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from types import MappingProxyType
from typing import Any

from torch import Tensor

__all__ = [
    "MAX_LABEL_CHARS",
    "PLAIN",
    "check_labels",
    "check_str",
    "clean",
    "shorten",
    "starts",
]

# Keyword arguments of matplotlib's Text: the string is drawn as it is.
PLAIN = MappingProxyType({"parse_math": False, "usetex": False})

# The longest label (in code points) the explorer writes: a node circle shows
# a dozen characters and a tooltip a few lines, while a 100k-character label
# would only make the page slow to load and to draw.
MAX_LABEL_CHARS = 200

_ZWJ = "\u200d"


def _extends(c: str) -> bool:
    """``c`` belongs to the character before it: a mark, a selector, a modifier, a tag."""
    o = ord(c)
    return (
        unicodedata.category(c) in ("Mn", "Mc", "Me")
        or o == 0x200D  # zero width joiner
        or 0xFE00 <= o <= 0xFE0F  # variation selectors
        or 0xE0100 <= o <= 0xE01EF
        or 0x1F3FB <= o <= 0x1F3FF  # skin tones
        or 0xE0020 <= o <= 0xE007F  # tags (subdivision flags)
    )


def _regional(c: str) -> bool:
    return 0x1F1E6 <= ord(c) <= 0x1F1FF


def _joins(s: str, k: int) -> bool:
    """``s[k]`` continues the character before it (``0 < k < len(s)``; flags aside)."""
    # After a ZWJ or a virama (combining class 9: Indic conjuncts) the next
    # code point joins the same character.
    return _extends(s[k]) or s[k - 1] == _ZWJ or unicodedata.combining(s[k - 1]) == 9


def starts(s: str) -> list[int]:
    """Where each character as the reader sees it starts in ``s``, then ``len(s)``.

    The same rules as :func:`shorten`: combining marks, selectors, skin tones,
    ZWJ sequences and Indic conjuncts stay with their character, and regional
    indicators pair into flags. A prefix ``s[:starts(s)[k]]`` is the first
    ``k`` characters, never a part of one. Linear in ``len(s)``.

    Example:
        >>> starts("ab\u0301c")  # the accent is part of the b
        [0, 1, 3, 4]
    """
    out = [0] if s else []
    run = 0  # regional indicators just before k: an odd run pairs with s[k]
    for k in range(1, len(s)):
        run = run + 1 if _regional(s[k - 1]) else 0
        if not (_joins(s, k) or (_regional(s[k]) and run % 2 == 1)):
            out.append(k)
    out.append(len(s))
    return out


def shorten(s: str, limit: int = MAX_LABEL_CHARS) -> str:
    """``s`` itself if it has at most ``limit`` code points, else a prefix and ``"\u2026"``.

    The cut never splits what reads as one character: it moves back over
    combining marks, variation selectors, skin tones, ZWJ sequences and
    Indic conjuncts (a virama and the next letter), and
    keeps a flag's two regional indicators together (one cluster longer than
    ``limit``, such as a letter under thousands of marks, is cut inside).
    Python strings hold code points, so a UTF-16 surrogate pair is never split.

    Example:
        >>> shorten("abcdef", 3), shorten("abc", 3)
        ('abc…', 'abc')
        >>> shorten("ab\u0301c", 2)  # the accent stays on its b: both go
        'a…'
    """
    if len(s) <= limit:
        return s
    # Whether limit starts a character depends only on what comes before it and s[limit].
    cut = [k for k in starts(s[: limit + 1]) if k <= limit][-1]
    if cut == 0:
        cut = limit
    return s[:cut] + "\u2026"


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
