"""Progress bars of the long commands (``gnnattn partition``, ``bench``, ``warmup``).

A bar is tqdm's, on stderr, and shown only when stderr is a terminal (tqdm's
``disable=None``): piped or captured output, and every ``--json`` file, stay
what they were without it. Lines printed while a bar is up go through
:func:`write`, which takes the bar off the terminal, prints, and redraws it.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from collections.abc import Iterator
from typing import TextIO

from tqdm import tqdm

__all__ = ["bar", "ticking", "write"]


class _Write(logging.Handler):
    """Log records as lines written around the bars (what the last-resort handler would
    print, without tearing a bar in two)."""

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):
            write(self.format(record), file=sys.stderr)


@contextlib.contextmanager
def bar(
    total: int | None,
    desc: str,
    *,
    unit: str = "step",
    leave: bool = True,
    eta: bool = True,
) -> Iterator[tqdm]:
    """A tqdm bar on stderr, shown when stderr is a terminal, closed on the way out.

    While a bar is shown, the ``gnnattn`` loggers' records (the first kernel
    compile's notice) are written around it when nothing else handles them.

    Args:
        total (int, optional): the steps, or :obj:`None` when unknown.
        desc (str): the text before the bar.
        unit (str, optional): what a step is called. (default: ``"step"``)
        leave (bool, optional): keep the finished bar on the terminal.
            (default: :obj:`True`)
        eta (bool, optional): show the time left, from the mean time of a
            step; off for steps of very different lengths (the phases of a
            partition), where it would mislead. (default: :obj:`True`)
    """
    fmt = None if eta else "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}]"
    progress = tqdm(
        total=total,
        desc=desc,
        unit=unit,
        file=sys.stderr,
        disable=None,
        leave=leave,
        dynamic_ncols=True,
        bar_format=fmt,
    )
    log = logging.getLogger("gnnattn")
    handler = None
    # Only where Python's last-resort handler would print the record (no logging
    # configured): a user's own handlers are left alone.
    if not progress.disable and not logging.getLogger().handlers and not log.handlers:
        handler = _Write()
        log.addHandler(handler)
    try:
        yield progress
    finally:
        if handler is not None:
            log.removeHandler(handler)
        progress.close()


def write(text: str, file: TextIO | None = None) -> None:
    """Print ``text`` (a line) to ``file`` (default stdout) around the bars that are up."""
    tqdm.write(text, file=sys.stdout if file is None else file)


@contextlib.contextmanager
def ticking(progress: tqdm, every_s: float = 1.0) -> Iterator[None]:
    """Redraw ``progress`` every ``every_s`` seconds while the block runs, so that its
    clock moves during one long step (METIS: minutes, one call)."""
    if progress.disable:
        yield
        return
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(every_s):
            progress.refresh()

    thread = threading.Thread(target=tick, name="gnnattn-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
