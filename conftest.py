"""Pytest setup shared by the tests and the docstring examples.

The Triton kernels are exercised on the CPU through Triton's interpreter when
there is no GPU. ``TRITON_INTERPRET`` has to be set before any ``@triton.jit``
function is defined, that is before ``gnnattn.kernels.triton_*`` is imported
(by a test or by doctest collection), so it is set here, first of all.
"""

import os
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

import gnnattn  # noqa: E402

# ---------------------------------------------------------------- parallel runs
#
# pyproject's addopts run the suite on one pytest-xdist worker per core
# ("-n auto"). Tests go one at a time to whichever worker is free, except that
# the tests of a group below all go to one worker, to run one after another:
#
# * notebooks, browser, checkpoints: the module's fixtures do costly work once
#   for all its tests (every notebook executed, one Chromium started, a
#   reference training run); split between workers, each worker would redo it;
# * ranks: the tests that launch several processes at once (torchrun, gloo
#   ranks), so that two launches never compete for the cores with each other;
# * cpu-kernels, edge-kernels: tests that call the numba kernels with many
#   combinations of dtype and options, each compiled on its first call (seconds
#   each on a cold cache). Workers do not share what they compile until it is
#   on disk, and tests handed out one by one in file order would have both
#   workers compile the same specialisation at the same time; as one unit each
#   file compiles each of its specialisations once, the two files in parallel.
#
# (xdist's own "--dist loadgroup" with xdist_group marks does this by renaming
# the tests, which pytest 9 no longer lets it do: the marks are ignored.)
GROUPS = {
    "test_notebooks.py": "notebooks",
    "test_explorer_browser.py": "browser",
    "test_checkpoints.py": "checkpoints",
    "test_ddp.py": "ranks",
    "test_ring.py": "ranks",
    "test_distributed*.py": "ranks",
    # The examples' runs: not beside a launch of many ranks (one ran 10x slower there).
    "test_examples.py": "ranks",
    "test_kernels_cpu.py": "cpu-kernels",
    "test_edge_algebra.py": "edge-kernels",
}


def group_of(nodeid: str) -> str | None:
    """The group of the test ``nodeid`` (``GROUPS``), None for a test of its own."""
    name = Path(nodeid.split("::", 1)[0]).name
    return next((g for pattern, g in GROUPS.items() if Path(name).match(pattern)), None)


@pytest.hookimpl(optionalhook=True)  # xdist's hooks: none without it
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    # No workers of its own for a pytest started by a test (the GPU probe's dry
    # run), nor on a CUDA machine, whose tests share one device: one process as
    # before. Elsewhere xdist's default, one worker per core.
    if os.environ.get("PYTEST_XDIST_WORKER") or torch.cuda.is_available():
        return 0
    return None


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    if config.getvalue("dist") != "load":  # another --dist asked for: xdist's own
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        """A work unit per group of ``GROUPS``, and one per test outside them; the
        largest units are handed out first."""

        def _split_scope(self, nodeid: str) -> str:
            group = group_of(nodeid)
            return nodeid if group is None else f"group:{group}"

    return GroupScheduling(config, log)  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def _doctest_names(doctest_namespace: dict) -> None:
    # The docstring examples use torch and gnnattn's public names bare.
    doctest_namespace["torch"] = torch
    for name in gnnattn.__all__:
        doctest_namespace[name] = getattr(gnnattn, name)
