"""Which backend a call of :func:`gnnattn.attention` takes, and why: one function, one table.

=========================================  ==========================================
the call                                    ``backend="auto"`` takes
=========================================  ==========================================
complete / causal graph (or batched), or a  ``"sdpa"``: the dense fused kernel of
window filling > 1/4 of the matrix; no      :func:`torch.nn.functional.scaled_dot_product_attention`
edge score or value bias
inside ``torch.compile``                    ``"mp"``: the compiled kernels are not traced
no compiled kernel for the device           ``"mp"`` (numba / triton not installed)
raw edge features (``edge_attr``) and a     ``"mp"``, saying so (the numba and Triton
kernel module without that option           kernels both take them)
anything else (dropout and edge             ``"fused"``: the sparse kernel over the CSR
features included)                          (numba on the CPU, Triton on CUDA)
=========================================  ==========================================

An explicit backend is taken as asked, or refused with a ``ValueError`` that
says why (``"sdpa"`` needs a structured square graph and no edge biases).
"""

from __future__ import annotations

import inspect
import warnings
from functools import cache
from types import ModuleType
from typing import NamedTuple

import torch

from .. import kernels
from ..checks import check_choice
from ..graphs import AttentionGraph

__all__ = ["BACKENDS", "BackendChoice", "backend_for", "check_backend"]

BACKENDS = ("auto", "mp", "sdpa", "fused")

# Above this many edges the message-passing path's |E| x C tensors cost
# gigabytes and seconds: "auto" says so when it has to take it.
_WARN_EDGES = 1_000_000


class BackendChoice(NamedTuple):
    """The backend of one call and the reason it was taken.

    Example:
        >>> from gnnattn import AttentionGraph, backend_for
        >>> backend_for(torch.zeros(4, 1, 8), AttentionGraph.causal(4))
        BackendChoice(backend='sdpa', reason='causal graph: the dense SDPA kernel')
    """

    backend: str
    reason: str


def check_backend(backend: str) -> str:
    """``backend`` after checking it is one of :data:`BACKENDS`."""
    hint = (
        " (the SDPA backend is called 'sdpa'; the dense *reference* functions live in "
        "gnnattn.dense)"
        if backend == "dense"
        else ""
    )
    check_choice(backend, "backend", BACKENDS, hint)
    return backend


def _sdpa_refusal(graph: AttentionGraph, has_bias: bool) -> str | None:
    """Why SDPA cannot run this call, or ``None`` when it can."""
    if graph.is_bipartite:
        return "does not do cross-attention (a pair (x_src, x_dst) or a bipartite graph)"
    if has_bias:
        return "does not take per-edge score biases or value biases (edge features)"
    if graph.structure is None:
        return (
            "needs a graph of known structure (complete, causal, their batched versions "
            "or a sliding window); this edge set has none"
        )
    return None


@cache
def _takes_edge_attr(kern: ModuleType) -> bool:
    """Whether a kernel module's ``attention_fwd`` takes raw edge features."""
    return "edge_attr" in inspect.signature(kern.attention_fwd).parameters


def backend_for(
    q: torch.Tensor,
    graph: AttentionGraph,
    *,
    backend: str = "auto",
    score_bias: bool = False,
    value_bias: bool = False,
    dropout_p: float = 0.0,
    edge_attr: bool = False,
) -> BackendChoice:
    """The backend :func:`gnnattn.attention` takes for these arguments, and why.

    Args:
        q (Tensor): the queries (only their device matters).
        graph (AttentionGraph): the graph of the call.
        backend (str, optional): as passed to the call. (default: ``"auto"``)
        score_bias (bool, optional): the call has a score bias. (default: :obj:`False`)
        value_bias (bool, optional): the call has a value bias. (default: :obj:`False`)
        dropout_p (float, optional): attention dropout of the call; every
            backend has it. (default: ``0.0``)
        edge_attr (bool, optional): the call has raw edge features
            (``edge_attr`` with ``edge_key`` / ``edge_value``); SDPA does not
            take them; the fused kernels (numba on the CPU, Triton on CUDA)
            do. A kernel module without the option (none ships) sends the
            call to ``"mp"``, asked for ``"fused"`` or not, with the reason.
            (default: :obj:`False`)

    Raises:
        ValueError: ``backend="sdpa"`` where SDPA cannot compute the call.
    """
    check_backend(backend)
    has_bias = score_bias or value_bias or edge_attr
    if edge_attr and backend in ("auto", "fused") and not torch.compiler.is_compiling():
        kern = kernels.get(q.device)
        if not _takes_edge_attr(kern):
            return BackendChoice(
                "mp",
                f"the fused {q.device.type} kernel does not take raw edge features "
                f"(edge_attr): the message-passing path",
            )
    if backend == "sdpa":
        why = _sdpa_refusal(graph, has_bias)
        if why is not None:
            raise ValueError(f"backend='sdpa' {why}. Use 'fused' or 'mp' (or 'auto').")
        return BackendChoice("sdpa", "asked for")
    if backend != "auto":
        return BackendChoice(backend, "asked for")
    s = graph.structure if not (has_bias or graph.is_bipartite) else None
    if s is not None and (s.kind in ("complete", "causal") or graph.density > 0.25):
        return BackendChoice("sdpa", f"{s.kind.replace('_', ' ')} graph: the dense SDPA kernel")
    if torch.compiler.is_compiling():
        choice = BackendChoice("mp", "inside torch.compile, which cannot trace the fused kernels")
    elif kernels.get(q.device) is kernels.reference:
        choice = BackendChoice(
            "mp", f"no compiled kernel for {q.device.type} (numba or triton is not installed)"
        )
    else:
        return BackendChoice("fused", f"sparse graph: the fused {q.device.type} kernel")
    if graph.num_edges > _WARN_EDGES and not torch.compiler.is_compiling():
        _warn_once(graph, choice)
    return choice


def _warn_once(graph: AttentionGraph, choice: BackendChoice) -> None:
    """Warn that a large graph takes the message-passing path, once per graph.

    The mark lives in the graph's own cache (not in a module-level registry,
    and not left to the warnings filter, which repeats under ``-W always``),
    so a training loop over one graph hears it once and a new graph again.
    """

    def warn() -> bool:
        # Frames above: derived, _warn_once, backend_for, attention: the caller's line.
        warnings.warn(
            f"gnnattn.attention: backend='auto' takes the message-passing path for a graph of "
            f"more than {_WARN_EDGES:,} edges ({choice.reason}); it materialises |E| x C "
            f"tensors. See gnnattn.backend_for.",
            stacklevel=6,
        )
        return True

    graph.derived(("warned", "auto takes mp"), warn)
