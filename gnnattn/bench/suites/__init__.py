"""The suites of ``gnnattn bench``, one module each, and the table that lists them.

``gnnattn bench --suite NAME`` takes its choices from :data:`REGISTRY`; a
suite with a ``flag`` runs only when that flag is given (``scale``: minutes
and about 6 GB), never in ``--quick``; a suite with ``flag="suite"``
(``distributed``: processes of its own, and at full size tens of minutes and
about 10 GB) runs only when named with ``--suite``, quick or not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..harness import BenchConfig, Case
from .compiled import compile_rows
from .dense import causal_cases, complete_cases, edge_index_cases
from .distributed import distributed_rows
from .limit import limit_cases
from .models import model_cases
from .pyg import pyg_cases
from .reorder import reorder_cases
from .scale import scale_rows
from .softmax import softmax_cases
from .sparse import sparse_cases
from .tiles import tiles_cases
from .train import train_rows

__all__ = ["REGISTRY", "SUITES", "Suite", "default_suites"]


@dataclass(frozen=True)
class Suite:
    """One suite: its name, what it measures, and how it makes its cases or rows.

    ``cases`` builds :class:`~gnnattn.bench.harness.Case` objects for the
    interleaved harness; ``rows`` returns finished result rows instead (for
    suites that need their own process, like ``scale``, or that add to the
    harness's rows, like ``train``). ``cpu_only``: the suite measures processes of its
    own on the CPU whatever ``--device`` says, so a CUDA run refuses it rather than print
    CPU figures under a CUDA header.
    """

    name: str
    help: str
    cases: Callable[[BenchConfig, torch.device], list[Case]] | None = None
    rows: Callable[[BenchConfig, Callable[[str], None] | None], list[dict[str, Any]]] | None = None
    flag: str | None = None
    cpu_only: bool = False


REGISTRY: tuple[Suite, ...] = (
    Suite(
        "complete",
        "layer(x) on the complete graph vs MultiheadAttention, SDPA, Flex, PyG",
        complete_cases,
    ),
    Suite("causal", "layer(x) with causal=True vs the same peers", causal_cases),
    Suite(
        "edge_index",
        "the complete graph as a plain edge_index (structure detected)",
        edge_index_cases,
    ),
    Suite("sparse", "a random sparse graph vs PyG TransformerConv", sparse_cases),
    Suite("softmax", "scatter_softmax vs PyG utils.softmax", softmax_cases),
    Suite("models", "GraphTransformer vs nn.TransformerEncoder; causal pruning", model_cases),
    Suite("limit", "each pass of the fused CPU operator vs CSR SpMM, GB/s", limit_cases),
    Suite("reorder", "shuffled vs RCM-reordered ids on a kNN graph and a grid", reorder_cases),
    Suite(
        "pyg",
        "gnnattn's drop-in PyG layers vs PyG's, same weights: GPSConv on skewed graph sizes",
        pyg_cases,
    ),
    Suite(
        "tiles",
        "graphs with locality (windows, dilated, BigBird, batched, a reordered kNN graph) vs "
        "compiled FlexAttention and the CSR kernel; a random graph where auto keeps CSR",
        tiles_cases,
    ),
    Suite(
        "train",
        "a GraphTransformer training step (dropout, edge features): auto vs mp",
        rows=train_rows,
    ),
    Suite(
        "compile",
        "eager vs torch.compile (train step, sparse layer, compile time); "
        "small molecule batches vs PyG, eager and compiled (only with --suite compile)",
        rows=compile_rows,
        flag="suite",
    ),
    Suite(
        "scale",
        "N = 1M forward + backward: time and peak RSS (--scale only)",
        rows=scale_rows,
        flag="scale",
        cpu_only=True,
    ),
    Suite(
        "distributed",
        "one graph over P = 4 gloo ranks: halo fraction by partitioner; "
        "peak RSS, exchange wait and bytes per rank vs one process; weak scaling "
        "(only with --suite distributed)",
        rows=distributed_rows,
        flag="suite",
        cpu_only=True,
    ),
)

#: Every suite name, in the order they run.
SUITES: tuple[str, ...] = tuple(s.name for s in REGISTRY)


def default_suites(*, scale: bool = False) -> tuple[str, ...]:
    """The suites a run without ``--suite`` makes: all but the flagged ones (``scale`` with
    ``scale=True``)."""
    return tuple(s.name for s in REGISTRY if s.flag is None or (s.flag == "scale" and scale))
