"""One freshness stamp for the compiled-code cache of the whole package.

numba's on-disk cache (``cache=True``) decides whether a kernel's machine
code is still valid from the source of the kernel's own file only, but the
kernels here inline helpers from their sibling files (and constants from
:mod:`gnnattn.kernels.common`): after an edit of ``_simd.py`` alone, the
kernels of ``forward.py`` would load stale machine code. The locators below,
put in front of numba's own for this package's files, stamp every cached
function with a digest of all those sources instead, so that any edit
recompiles everything (as it did when the kernels were one file). If numba's
locator classes move, nothing is registered and numba's per-file stamp applies.
"""

from __future__ import annotations

import functools
import hashlib
import os
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))
_COMMON = os.path.join(os.path.dirname(_HERE), "common.py")


def _sources() -> list[str]:
    files = sorted(f for f in os.listdir(_HERE) if f.endswith(".py"))
    return [os.path.join(_HERE, f) for f in files] + [_COMMON]


@functools.lru_cache(maxsize=8)
def _digest(stats: tuple[tuple[str, int, int], ...]) -> str:
    h = hashlib.sha256()
    for path, _, _ in stats:
        with open(path, "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def package_stamp() -> str:
    """A digest of the package's sources (recomputed when a file's size or mtime changes)."""
    stats = []
    for path in _sources():
        st = os.stat(path)
        stats.append((path, st.st_mtime_ns, st.st_size))
    return _digest(tuple(stats))


def _register() -> None:
    try:
        from numba.core import caching

        bases = [caching.UserProvidedCacheLocator, caching.InTreeCacheLocator]
        # CacheImpl since numba 0.59 or so, _CacheImpl before.
        impl: Any = getattr(caching, "CacheImpl", None) or caching._CacheImpl  # type: ignore[attr-defined]
    except (ImportError, AttributeError):  # pragma: no cover - another numba
        return
    ours = []
    for base in bases:

        class _Locator(base):  # type: ignore[valid-type, misc]
            @classmethod
            def from_function(cls, py_func: Any, py_file: str) -> Any:
                if os.path.dirname(os.path.abspath(py_file)) != _HERE:
                    return None
                return super().from_function(py_func, py_file)

            def get_source_stamp(self) -> str:
                return package_stamp()

        _Locator.__name__ = _Locator.__qualname__ = f"GnnattnCpu{base.__name__}"
        ours.append(_Locator)
    if not any(getattr(c, "__module__", "") == __name__ for c in impl._locator_classes):
        impl._locator_classes = ours + list(impl._locator_classes)


_register()
