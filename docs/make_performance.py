"""Write docs/performance.md's measured tables from ``gnnattn bench --json`` files.

    python docs/make_performance.py RUN.json [RUN.json ...] [--page docs/performance.md]

Each suite of each run becomes one block: the date, machine, threads, load
and versions of the run, then one Markdown table per case and mode. A block
replaces, whole, what stands between the lines ``<!-- bench:KEY -->`` and
the next ``<!-- /bench -->`` of the page, where ``KEY`` is the suite's name
for a CPU run and ``cuda/NAME`` for a CUDA one; a suite with no marker on the
page is added at its end under a heading of its own. Everything outside the markers
(the prose) is left as it is. When two runs hold the same suite, the later
file on the command line wins.

A ``--quick`` run (smoke-test sizes, timings that mean nothing) is refused
unless ``--allow-quick`` is given, and its blocks then say, first, that
they are not figures.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

PAGE = Path(__file__).resolve().parent / "performance.md"
MARKER = re.compile(r"^<!-- bench:(?P<key>[\w/.-]+) -->\n.*?^<!-- /bench -->$", re.S | re.M)
QUICK = (
    "> **Smoke-test data, not figures.** These rows come from `gnnattn bench --quick`: "
    "tiny inputs and 2-3 repetitions, to check that every candidate runs. Their timings "
    "and ratios mean nothing; regenerate this block from a run without `--quick`."
)


def _cell(text: Any) -> str:
    """``text`` safe inside a Markdown table cell."""
    s = " ".join(str(text).split())
    return s.replace("\\", "\\\\").replace("|", "\\|").replace("<", "&lt;").replace("*", "\\*")


def _prose(text: Any) -> str:
    """``text`` safe in a Markdown paragraph."""
    s = " ".join(str(text).split())
    return s.replace("<", "&lt;").replace("*", "\\*")


def _ms(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def _ratio(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.0f}x" if v >= 100 else f"{v:.2f}x" if v >= 0.1 else f"{v:.2g}x"


def _mib(v: int | None) -> str:
    if v is None:
        return "-"
    mib = v / 2**20
    return f"{mib:.0f}" if mib >= 100 else f"{mib:.1f}"


def _gbps(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}" if v >= 1 else f"{v:.2g}"


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def key_of(run: dict[str, Any], suite: str) -> str:
    """The marker key of ``suite`` in ``run``: ``NAME`` on the CPU, ``cuda/NAME`` on CUDA."""
    device = str(run["machine"].get("device", "cpu")).split(":")[0]
    return suite if device == "cpu" else f"{device}/{suite}"


def _command(run: dict[str, Any], suite: str) -> str:
    """The command that reruns ``suite`` as this run ran it."""
    cfg = run["config"]
    cmd = ["gnnattn", "bench", "--suite", suite]
    if suite == "scale":
        cmd.append("--scale")
    if cfg.get("device", "cpu") != "cpu":
        cmd += ["--device", str(cfg["device"])]
    if cfg.get("quick"):
        cmd.append("--quick")
    if cfg.get("threads", 2) != 2:
        cmd += ["--threads", str(cfg["threads"])]
    if cfg.get("reps") is not None:
        cmd += ["--reps", str(cfg["reps"])]
    if not cfg.get("memory", True):
        cmd.append("--no-memory")
    return " ".join(cmd)


def _load(values: Sequence[float] | None) -> str:
    return "unknown" if not values else f"{values[0]:.2f}"


def context(run: dict[str, Any], suite: str) -> str:
    """One paragraph: when, where, with what the block's rows were measured."""
    m = run["machine"]
    date = str(m.get("date") or "unknown date").replace("T", " ").replace("+00:00", " UTC")
    cores = f", {m['cpu_count']} cores" if m.get("cpu_count") else ""
    memory = f", {m['memory_gb']:g} GB" if m.get("memory_gb") else ""
    gpu = f", {m['gpu']}" if m.get("gpu") else ""
    threads = f"{m.get('threads', '?')} threads"
    if m.get("numba_threads") is not None:
        threads += f" (numba {m['numba_threads']})"
    versions = ", ".join(
        f"{name} {m.get(key) or 'not installed'}"
        for name, key in (
            ("Python", "python"),
            ("torch", "torch"),
            ("torch_geometric", "torch_geometric"),
            ("numba", "numba"),
            ("triton", "triton"),
        )
    )
    commit = m.get("gnnattn_commit") or "unknown"
    if m.get("gnnattn_dirty"):
        commit += " with uncommitted changes"
    return (
        f"Measured {date} by `{_command(run, suite)}` on {_prose(m.get('cpu', '?'))}"
        f"{cores}{memory}{gpu}; {threads}; load average (1 min) {_load(m.get('loadavg'))} "
        f"when the run started and {_load(m.get('loadavg_end'))} when it ended "
        f"({run.get('seconds', 0):.0f} s in all, suites: {', '.join(run.get('suites', []))}); "
        f"{versions}; kernels `{m.get('kernels', '?')}`; gnnattn {m.get('gnnattn', '?')} at "
        f"commit {commit}. Medians of interleaved repetitions; ratios are to the case's "
        f"baseline; peak memory is the torch tensor bytes allocated during one call "
        f"(peak RSS: the whole process)."
    )


def _blocks(rows: Iterable[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Rows grouped by (case, mode), in the order they ran."""
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault((r["case"], r["mode"]), []).append(r)
    return list(out.values())


def table(block: list[dict[str, Any]]) -> list[str]:
    """One case and mode: a heading line and a Markdown table with the columns it has data for."""
    first = block[0]
    ok = [r for r in block if r.get("status") == "ok"]
    rss = any(r.get("peak_rss") is not None for r in ok)
    mem = any(r.get("peak_bytes") is not None for r in ok)
    traffic = any(r.get("gbps") is not None for r in ok)
    diff = any(r.get("max_abs_diff") is not None for r in ok)
    cols: list[tuple[str, Any]] = [
        ("candidate", lambda r: _cell(r["candidate"])),
        ("median ms", lambda r: _ms(r.get("median_ms"))),
        ("x baseline", lambda r: _ratio(r.get("ratio"))),
    ]
    if rss:
        cols.append(("peak RSS GB", lambda r: _num(_gb(r.get("peak_rss")), ".2f")))
    if mem:
        cols += [
            ("peak MiB", lambda r: _mib(r.get("peak_bytes"))),
            ("memory x baseline", lambda r: _ratio(r.get("mem_ratio"))),
        ]
    if traffic:
        cols.append(("GB/s", lambda r: _gbps(r.get("gbps"))))
    if diff:
        cols.append(("max abs diff", lambda r: _num(r.get("max_abs_diff"), ".1e")))
    cols += [("reps", lambda r: str(r.get("reps", ""))), ("note", _note)]
    label = first.get("mode_label") or first["mode"]
    lines = [
        f"**{_prose(first['case'])}**: {_prose(label)}; baseline: {_prose(first['baseline'])}",
        "",
        "| " + " | ".join(name for name, _ in cols) + " |",
        "| "
        + " | ".join("---" if name in ("candidate", "note") else "---:" for name, _ in cols)
        + " |",
    ]
    for r in block:
        if r.get("status") != "ok":
            cells = [_cell(r["candidate"])] + ["-"] * (len(cols) - 2) + [_note(r)]
        else:
            cells = [fn(r) for _, fn in cols]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _gb(v: int | None) -> float | None:
    return None if v is None else v / 1e9


def _note(r: dict[str, Any]) -> str:
    parts = [] if r.get("status") == "ok" else [str(r.get("status"))]
    if r.get("note"):
        parts.append(str(r["note"]))
    return _cell("; ".join(parts))


def render(run: dict[str, Any], suite: str) -> str:
    """The block of ``suite`` (without its markers)."""
    rows = [r for r in run["rows"] if r["suite"] == suite]
    lines: list[str] = []
    if run["config"].get("quick"):
        lines += [QUICK, ""]
    lines += [context(run, suite), ""]
    if not rows:
        lines += ["(The run made no rows for this suite.)", ""]
    for block in _blocks(rows):
        lines += table(block) + [""]
    return "\n".join(lines)


def update(page: str, blocks: dict[str, str]) -> str:
    """``page`` with each ``blocks[key]`` between its markers (added at the end if absent)."""
    done: set[str] = set()

    def swap(m: re.Match[str]) -> str:
        key = m.group("key")
        if key not in blocks:
            return m.group(0)
        done.add(key)
        return f"<!-- bench:{key} -->\n{blocks[key].rstrip()}\n<!-- /bench -->"

    page = MARKER.sub(swap, page)
    for key, text in blocks.items():
        if key not in done:
            page = page.rstrip("\n") + (
                f"\n\n### `{key}`\n\n<!-- bench:{key} -->\n{text.rstrip()}\n<!-- /bench -->\n"
            )
    return page if page.endswith("\n") else page + "\n"


def load_runs(paths: Sequence[Path], allow_quick: bool) -> dict[str, str]:
    """The blocks of every suite of every run, keyed by marker; later files win."""
    blocks: dict[str, str] = {}
    for path in paths:
        run = json.loads(Path(path).read_text(encoding="utf-8"))
        if not all(k in run for k in ("machine", "config", "rows")):
            raise ValueError(f"{path}: not a `gnnattn bench --json` file")
        if run["config"].get("quick") and not allow_quick:
            raise ValueError(
                f"{path} is a --quick run (smoke-test sizes: its timings are not figures); "
                "give --allow-quick to write it anyway, marked as such"
            )
        suites = run.get("suites") or sorted({r["suite"] for r in run["rows"]})
        for suite in suites:
            key = key_of(run, suite)
            if key in blocks:
                print(f"{key}: {path} replaces an earlier file's block", file=sys.stderr)
            blocks[key] = render(run, suite)
    return blocks


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="gnnattn bench --json files")
    parser.add_argument("--page", type=Path, default=PAGE, help="the page (default: %(default)s)")
    parser.add_argument(
        "--allow-quick", action="store_true", help="accept --quick runs (marked as not figures)"
    )
    args = parser.parse_args(argv)
    try:
        blocks = load_runs(args.runs, args.allow_quick)
    except (OSError, ValueError) as err:
        print(f"make_performance: {err}", file=sys.stderr)
        return 2
    page = args.page.read_text(encoding="utf-8") if args.page.exists() else ""
    args.page.write_text(update(page, blocks), encoding="utf-8")
    print(f"{args.page}: wrote {', '.join(blocks)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
