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

It also says once per process, on the logger ``gnnattn.kernels``, when a
kernel is actually compiled (numba's ``"numba:compile"`` event fires on a
cache miss only, never when the machine code is loaded from the cache), so
that a first call of seconds is not a silent hang.
"""

from __future__ import annotations

import functools
import hashlib
import logging
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

_said = False  # once per process: one notice for the dozen kernels a first epoch compiles
compiles = 0  # the package's kernels compiled in this process (cache misses)


def cache_dir(dispatcher: Any = None) -> str:
    """Where numba keeps the kernels' machine code: ``NUMBA_CACHE_DIR`` when set, else
    ``__pycache__`` beside the kernels (or numba's per-user folder when that one cannot
    be written, which ``dispatcher``'s cache knows)."""
    path = getattr(getattr(dispatcher, "_cache", None), "_cache_path", None)
    if path:
        return str(path)
    from numba.core import config

    user = getattr(config, "CACHE_DIR", "")
    return user or os.path.join(_HERE, "__pycache__")


def _notice(dispatcher: Any) -> None:
    global _said, compiles
    code = getattr(getattr(dispatcher, "py_func", None), "__code__", None)
    if code is None or os.path.dirname(os.path.abspath(code.co_filename)) != _HERE:
        return  # another package's numba function
    compiles += 1
    if _said:
        return
    _said = True
    # A warning-level record of the "gnnattn.kernels" logger, so that it shows without
    # any logging set up (Python's last-resort handler prints it on stderr) and
    # logging.getLogger("gnnattn").setLevel(logging.ERROR) silences it. Not a
    # warnings.warn: under -W error (a user's pytest) it would become an exception
    # raised from inside numba's compiler.
    logging.getLogger("gnnattn.kernels").warning(
        "gnnattn: compiling the CPU kernels (numba) on their first use: seconds per kernel, "
        "once per environment (again after an upgrade of gnnattn or numba); the machine "
        "code is cached in %s. `gnnattn warmup` compiles them ahead.",
        cache_dir(dispatcher),
    )


def _register_notice() -> None:
    try:
        from numba.core import event
    except ImportError:  # pragma: no cover - another numba
        return

    class _FirstCompile(event.Listener):
        def on_start(self, ev: Any) -> None:
            data = ev.data if isinstance(ev.data, dict) else {}
            _notice(data.get("dispatcher"))

        def on_end(self, ev: Any) -> None:
            pass

    event.register("numba:compile", _FirstCompile())


_register_notice()
