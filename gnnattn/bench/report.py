"""What ``gnnattn bench`` prints: the machine it ran on and one table per case.

The tables show each median and its ratio to the case's baseline median.
:func:`machine_info` is what a figure is quoted with (date, CPU, threads,
load, library versions); ``--json`` stores it beside the rows, and
``docs/make_performance.py`` writes ``docs/performance.md``'s tables from it.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.metadata
import os
import platform
import subprocess
from typing import Any

import torch

__all__ = ["QUICK_NOTE", "format_table", "header", "machine_info"]

#: Printed above and below the tables of a ``--quick`` run.
QUICK_NOTE = (
    "--quick: smoke-test sizes, to check that every candidate runs; these timings and "
    "ratios are NOT meaningful (small inputs, 2-3 repetitions); quote only a run without "
    "--quick"
)


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _memory_gb() -> float | None:
    """The machine's memory in GB (``MemTotal`` of ``/proc/meminfo``), where there is one."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) * 1024 / 1e9, 1)
    return None


def _version(dist: str) -> str | None:
    """The installed version of the distribution ``dist`` (not imported), or ``None``."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git(*args: str) -> str | None:
    """The output of ``git ARGS`` in this package's checkout, or ``None`` (no git, no
    checkout, or gnnattn installed inside another project's checkout, whose commit
    the figures are not)."""
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))  # the folder that holds gnnattn/

    def run(*a: str) -> str | None:
        with contextlib.suppress(Exception):
            res = subprocess.run(["git", "-C", here, *a], capture_output=True, text=True, timeout=5)
            if res.returncode == 0:
                return res.stdout.strip()
        return None

    top = run("rev-parse", "--show-toplevel")
    if top is None or os.path.realpath(top) != os.path.realpath(root):
        return None
    return run(*args)


def _git_commit() -> str | None:
    return _git("rev-parse", "--short", "HEAD")


def _git_dirty() -> bool | None:
    """Whether tracked files differ from the commit (the figures are then not that commit's)."""
    out = _git("status", "--porcelain", "--untracked-files=no")
    return None if out is None else bool(out)


def machine_info(device: str) -> dict[str, Any]:
    """Where and when the figures come from: date, CPU, memory, threads, load, device and
    the versions of Python, torch, PyG, numba and triton."""
    import torch_geometric

    from .. import __version__, kernels

    info: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "memory_gb": _memory_gb(),
        "threads": torch.get_num_threads(),
        "device": device,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_geometric": torch_geometric.__version__,
        "gnnattn": __version__,
        "gnnattn_commit": _git_commit(),
        "gnnattn_dirty": _git_dirty(),
        "kernels": kernels.get(torch.device(device)).__name__,
    }
    with contextlib.suppress(OSError):
        # Other processes on a 2-core machine stall OpenMP barriers: quote
        # figures only from runs on a quiet machine.
        info["loadavg"] = list(os.getloadavg())
    with contextlib.suppress(ImportError):
        import numba

        info["numba"] = numba.__version__
        info["numba_threads"] = numba.get_num_threads()
    # Installed, whether or not this device runs it (the CPU kernels are numba's).
    info["triton"] = _version("triton")
    if device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return info


def header(result: dict[str, Any]) -> str:
    """The lines above the tables: machine, versions, load, how to read the columns."""
    m = result["machine"]
    lines = [
        f"gnnattn bench on {m['cpu']} ({m['threads']} threads), device {m['device']}"
        + (f" ({m['gpu']})" if "gpu" in m else "")
        + f", torch {m['torch']}, torch_geometric {m['torch_geometric']}, kernels {m['kernels']}"
    ]
    if result["config"].get("quick"):
        lines.append(QUICK_NOTE)
    if "loadavg" in m:
        lines.append(
            f"load average (1/5/15 min) before: {' '.join(f'{v:.2f}' for v in m['loadavg'])}, "
            f"after: {' '.join(f'{v:.2f}' for v in m.get('loadavg_end', []))}"
        )
    lines.append(
        "median of interleaved repetitions; 'x base' = median / baseline median; peak MiB = "
        "torch tensor bytes allocated during one call; max|diff| vs the baseline's output "
        "(forward), input gradient (forward+backward), first step's loss and gradients "
        "(train) or a step's output (compile)"
    )
    return "\n".join(lines)


def _fmt_ms(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def _fmt_ratio(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.2f}x" if v < 100 else f"{v:.0f}x"


def _fmt_mib(v: int | None) -> str:
    return "-" if v is None else f"{v / 2**20:.1f}"


def _fmt_diff(v: float | None) -> str:
    return "-" if v is None else f"{v:.1e}"


def _fmt_gb(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def format_table(rows: list[dict[str, Any]]) -> str:
    """The results as plain-text tables, one block per case and mode.

    A block whose rows know their memory traffic gets ``GB moved`` and
    ``GB/s`` columns; one whose rows measured the resident set (the
    ``scale`` suite) gets a ``peak RSS GB`` column.
    """
    lines: list[str] = []
    width = max((len(r["candidate"]) for r in rows), default=20) + 1
    blocks: list[list[dict[str, Any]]] = []
    for r in rows:
        key = (r["suite"], r["case"], r["mode"])
        if (
            not blocks
            or (blocks[-1][0]["suite"], blocks[-1][0]["case"], blocks[-1][0]["mode"]) != key
        ):
            blocks.append([])
        blocks[-1].append(r)
    for block in blocks:
        first = block[0]
        traffic = any(r.get("bytes") for r in block)
        rss = any(r.get("peak_rss") is not None for r in block)
        head = f"{'candidate':<{width}} {'median ms':>10} {'x base':>8} "
        if rss:
            head += f"{'peak RSS GB':>11} "
        else:
            head += f"{'peak MiB':>9} {'x base':>7} "
        if traffic:
            head += f"{'GB moved':>8} {'GB/s':>6} "
        head += f"{'max|diff|':>9} {'reps':>4}  note"
        lines += [
            "",
            f"[{first['suite']}] {first['case']} -- {first.get('mode_label', first['mode'])} "
            f"(baseline: {first['baseline']})",
            head,
        ]
        for r in block:
            if r["status"] != "ok":
                lines.append(f"{r['candidate']:<{width}} {r['status']}")
                continue
            line = f"{r['candidate']:<{width}} {_fmt_ms(r['median_ms']):>10} "
            line += f"{_fmt_ratio(r['ratio']):>8} "
            if rss:
                v = r.get("peak_rss")
                line += f"{'-' if v is None else f'{v / 1e9:.2f}':>11} "
            else:
                line += f"{_fmt_mib(r['peak_bytes']):>9} {_fmt_ratio(r['mem_ratio']):>7} "
            if traffic:
                moved = r.get("bytes")
                line += f"{'-' if not moved else f'{moved / 1e9:.2f}':>8} "
                line += f"{_fmt_gb(r.get('gbps')):>6} "
            line += f"{_fmt_diff(r['max_abs_diff']):>9} {r['reps']:>4}  {r['note']}"
            lines.append(line)
    return "\n".join(lines)
