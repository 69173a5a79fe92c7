"""Run the notebooks top to bottom and save their outputs in place.

    python notebooks/execute.py            # every notebook
    python notebooks/execute.py 03 06      # the ones whose names start so

The kernel is this interpreter (``sys.executable``), not whatever ``python3``
kernelspec Jupyter finds first, so the outputs come from the gnnattn and torch
installed here. Notebook 06 plots ``gnnattn bench`` results when
``GNNATTN_BENCH_JSON`` (default ``../bench.json``, next to the README) names an
existing file, and times a small inline comparison otherwise.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import nbformat
from ipykernel.kernelspec import write_kernel_spec
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent


def kernel_manager(kernels_dir: Path) -> AsyncKernelManager:
    """A kernel manager whose only kernel runs on this interpreter."""
    if not (kernels_dir / "gnnattn" / "kernel.json").is_file():
        write_kernel_spec(path=str(kernels_dir / "gnnattn"))
    ksm = KernelSpecManager(kernel_dirs=[str(kernels_dir)], ensure_native_kernel=False)
    return AsyncKernelManager(kernel_name="gnnattn", kernel_spec_manager=ksm)


def execute(path: Path, kernels_dir: Path, timeout: int = 120) -> nbformat.NotebookNode:
    """Execute one notebook in its own folder; returns it with outputs."""
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        km=kernel_manager(kernels_dir),
        timeout=timeout,
        # No timestamps: re-running a notebook should not change the file
        # where its outputs did not change.
        record_timing=False,
        resources={"metadata": {"path": str(path.parent)}},
    )
    # The client shuts down only kernels it created itself; this one too.
    client.execute(cleanup_kc=True)
    # Readers see a plain "Python 3" kernel, whatever ran it here.
    nb.metadata["kernelspec"] = {
        "display_name": "Python 3",
        "language": "python",
        "name": "python3",
    }
    return nb


def main(argv: list[str]) -> int:
    paths = sorted(HERE.glob("*.ipynb"))
    if argv:
        paths = [p for p in paths if any(p.name.startswith(a) for a in argv)]
    with tempfile.TemporaryDirectory() as tmp:
        for path in paths:
            start = time.perf_counter()
            nb = execute(path, Path(tmp))
            nbformat.write(nb, path)
            print(f"{path.name}: {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
