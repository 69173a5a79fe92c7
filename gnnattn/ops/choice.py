"""Which backend a call of :func:`gnnattn.attention` takes, and why: declarations, one function.

Each backend declares what it takes, as data (:class:`Declaration`, in
:data:`DECLARATIONS`); :func:`backend_for` reads the declarations and the
call, never the backends' code. ``"auto"`` takes, in order:

=========================================  ==========================================
the call                                    ``backend="auto"`` takes
=========================================  ==========================================
complete / causal graph (or batched), or a  ``"sdpa"``: the dense fused kernel of
window filling > 1/4 of the matrix; no      :func:`torch.nn.functional.scaled_dot_product_attention`
edge score bias or edge features
on the CPU, a graph of at least             ``"tiles"``: batched matrix products on the
:data:`TILES_MIN_EDGES` edges whose block   tiles of the graph's block plan
plan fills at least :data:`TILES_MIN_FILL`  (:mod:`gnnattn.ops.tiles`)
of its tiles (estimated once per graph)
a device with compiled kernels (numba on    ``"fused"``: the sparse kernel over the CSR
the CPU, Triton on CUDA)                    (dropout and edge features included)
anything else                               ``"mp"`` (message passing, the reference)
=========================================  ==========================================

Inside a ``torch.func`` transform (``grad``, ``vmap``, ``jvp``, ``jacrev``)
``"auto"`` takes ``"mp"``, whose torch ops the transforms run; an explicit
other backend is refused there (its kernels are custom operators, or read
tensor values on the host).

The same inside ``torch.compile`` and ``torch.export`` (the kernels are
operators, :mod:`gnnattn.kernels.library`), except for a batch of blocks of
different lengths: SDPA runs such a batch in buckets, one call each, a Python
structure that would recompile per batch, so there it takes ``"sdpa"`` only
where the block kernel takes the whole batch in one call
(:func:`~gnnattn.ops.sdpa.compiled_blocks`), and ``"fused"`` otherwise; and
the tiles are taken only where their plan was made before
(:meth:`~gnnattn.AttentionGraph.prepare`, or an eager call on the tiles).
An explicit backend is taken as asked, or refused with a ``ValueError`` that
says why; the one exception is ``"tiles"`` on non-finite ``q``, ``k`` or ``v``,
which runs ``"fused"`` (see :func:`gnnattn.attention`).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple

import torch

from ..checks import check_choice
from ..graphs import AttentionGraph
from ..graphs.blocks import (
    TILES_MIN_EDGES,
    TILES_MIN_FILL,
    default_block,
    fill_estimate,
    sdpa_first,
)
from ..kernels import COMPILED
from ..kernels.common import under_func_transform
from .sdpa import compiled_blocks

__all__ = [
    "BACKENDS",
    "DECLARATIONS",
    "TILES_MIN_EDGES",
    "TILES_MIN_FILL",
    "BackendChoice",
    "Declaration",
    "backend_for",
    "check_backend",
    "check_graph",
]

BACKENDS = ("auto", "mp", "sdpa", "fused", "tiles")

# Above this many edges the message-passing path's |E| x C tensors cost
# gigabytes and seconds: "auto" says so when it has to take it.
_WARN_EDGES = 1_000_000

_FLOATS = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})


class Declaration(NamedTuple):
    """What a backend takes, declared.

    Attributes:
        options: the call options it computes: ``"score_bias"``,
            ``"edge_attr"``, ``"bipartite"`` (cross-attention), ``"dropout"``.
        graphs: ``"any"`` edge set, or ``"structured"`` (a graph of known
            structure: complete, causal, batched, window).
        devices: the device types it runs compiled code on (``None``: any,
            through torch ops); ``"auto"`` takes it only on those.
        dtypes: the floating dtypes it takes.
    """

    options: frozenset[str]
    graphs: str
    devices: frozenset[str] | None
    dtypes: frozenset[torch.dtype] = _FLOATS


_ALL_OPTIONS = frozenset({"score_bias", "edge_attr", "bipartite", "dropout"})

#: The backends' declarations (``"fused"`` runs the torch reference of its
#: kernels where none is compiled, when asked for by name).
DECLARATIONS: Mapping[str, Declaration] = MappingProxyType(
    {
        "mp": Declaration(_ALL_OPTIONS, "any", None),
        "sdpa": Declaration(frozenset({"dropout"}), "structured", None),
        "fused": Declaration(_ALL_OPTIONS, "any", COMPILED),
        "tiles": Declaration(_ALL_OPTIONS, "any", None),
    }
)


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


def check_graph(graph: object) -> None:
    """Raise unless ``graph`` is an :class:`~gnnattn.AttentionGraph` (what the operator
    and :func:`backend_for` take; the layers wrap a plain ``edge_index`` themselves)."""
    if not isinstance(graph, AttentionGraph):
        raise TypeError(
            f"Expected 'graph' to be an AttentionGraph, got {type(graph).__name__} "
            f"(build one once: AttentionGraph(edge_index))"
        )


def _refusal(
    name: str, graph: AttentionGraph, options: frozenset[str], dtype: torch.dtype
) -> str | None:
    """Why the declared backend ``name`` cannot run this call, or ``None`` when it can."""
    decl = DECLARATIONS[name]
    if dtype not in decl.dtypes:
        return f"does not take {dtype}"
    missing = options - decl.options
    if "bipartite" in missing:
        return "does not do cross-attention (a pair (x_src, x_dst) or a bipartite graph)"
    what = {
        "score_bias": "per-edge score biases",
        "edge_attr": "edge features (edge_attr)",
        "dropout": "attention dropout",
    }
    if missing:
        return "does not take " + " or ".join(what[m] for m in what if m in missing)
    if decl.graphs == "structured" and graph.structure is None:
        return (
            "needs a graph of known structure (complete, causal, their batched versions "
            "or a sliding window); this edge set has none"
        )
    return None


def backend_for(
    q: torch.Tensor,
    graph: AttentionGraph,
    *,
    backend: str = "auto",
    score_bias: bool = False,
    dropout_p: float = 0.0,
    edge_attr: bool = False,
) -> BackendChoice:
    """The backend :func:`gnnattn.attention` takes for these arguments, and why.

    Reads the declarations of :data:`DECLARATIONS`, the graph's structure (and,
    on the CPU, its tile fill: both made from the edges once per graph, and only
    read inside ``torch.compile``) and the device of ``q``. It reads no value of
    ``q``, ``k`` or ``v``: where it says ``"sdpa"`` or ``"tiles"``, a call whose
    ``q``, ``k`` or ``v`` is not finite (or whose scores may overflow) runs
    ``"fused"``, which keeps the non-finite rules (an explicit ``"sdpa"``
    raises instead); the result's ``backend`` says what ran.

    Args:
        q (Tensor): the queries (only their device matters).
        graph (AttentionGraph): the graph of the call.
        backend (str, optional): as passed to the call. (default: ``"auto"``)
        score_bias (bool, optional): the call has a score bias. (default: :obj:`False`)
        dropout_p (float, optional): attention dropout of the call; every
            backend has it (at 1 the call runs without it and zeroes its
            output, so it takes the backend of no dropout). (default: ``0.0``)
        edge_attr (bool, optional): the call has raw edge features
            (``edge_attr`` with ``edge_key`` / ``edge_value``).
            (default: :obj:`False`)

    Raises:
        ValueError: an explicit backend that cannot compute the call (inside a
            ``torch.func`` transform, any but ``"mp"``).
    """
    check_backend(backend)
    check_graph(graph)
    if dropout_p >= 1.0:
        dropout_p = 0.0  # as attention() runs it: without dropout, its output zeroed
    options = frozenset(
        name
        for name, on in (
            ("score_bias", score_bias),
            ("edge_attr", edge_attr),
            ("bipartite", graph.is_bipartite),
            ("dropout", dropout_p > 0),
        )
        if on
    )
    if under_func_transform():
        return _in_func_transform(backend)
    if backend != "auto":
        why = _refusal(backend, graph, options, q.dtype)
        if why is not None:
            raise ValueError(f"backend={backend!r} {why}. Use 'fused' or 'mp' (or 'auto').")
        return BackendChoice(backend, "asked for")
    sdpa_why = _refusal("sdpa", graph, options, q.dtype)
    s = graph.structure if sdpa_why is None else None
    # Inside torch.compile a batch of blocks of different lengths goes to SDPA only
    # where the block kernel takes it in one call (compiled_blocks).
    if s is not None and not s.uniform and torch.compiler.is_compiling():
        s = s if compiled_blocks(q, graph, dropout_p) else None
    if s is not None and sdpa_first(graph, s):
        return BackendChoice("sdpa", f"{s.kind.replace('_', ' ')} graph: the dense SDPA kernel")
    tiles = _tiles_pay(q, graph)
    if tiles is not None:
        return tiles
    devices = DECLARATIONS["fused"].devices
    why = _refusal("fused", graph, options, q.dtype)
    if devices is not None and q.device.type not in devices:
        kind = q.device.type
        why = f"no compiled kernel for {kind}" + (
            " (numba or triton is not installed)" if kind in ("cpu", "cuda") else ""
        )
    elif why is not None:
        why = f"the fused kernel {why}"
    if why is None:
        what = "sparse graph"
        if graph.structure is not None and sdpa_why is not None:
            # A structure SDPA would take but for the call's options: say which.
            what = f"{graph.structure.kind.replace('_', ' ')} graph, but SDPA {sdpa_why}"
        return BackendChoice("fused", f"{what}: the fused {q.device.type} kernel")
    choice = BackendChoice("mp", why)
    if graph.num_edges > _WARN_EDGES and not torch.compiler.is_compiling():
        _warn_once(graph, choice)
    return choice


def _in_func_transform(backend: str) -> BackendChoice:
    """The backend inside a ``torch.func`` transform: the message-passing reference, the
    one whose torch ops compose with ``grad``, ``vmap``, ``jvp`` and ``jacrev``."""
    if backend not in ("auto", "mp"):
        raise ValueError(
            f"backend={backend!r} does not run inside a torch.func transform (grad, vmap, "
            "jvp, jacrev, ...): its kernels are custom operators (numba, Triton) or read "
            "tensor values on the host, which the transforms cannot run. Use 'mp' (or "
            "'auto', which takes it there)."
        )
    reason = "a torch.func transform: the message-passing reference, whose torch ops it runs"
    return BackendChoice("mp", "asked for" if backend == "mp" else reason)


def _tiles_pay(q: torch.Tensor, graph: AttentionGraph) -> BackendChoice | None:
    """The tiles, with the reason, where their fill pays; else ``None``.

    On the CPU only: the tile kernels' speed against the CSR kernel was measured
    there (on CUDA the Triton CSR kernel stays until a tile kernel is measured
    against it). The fill is :func:`~gnnattn.graphs.blocks.fill_estimate`'s
    (one pass over the edges, once per graph, kept by it); inside
    ``torch.compile`` only a tile plan made before is read
    (:meth:`~gnnattn.AttentionGraph.prepare`, or an eager call).
    """
    if q.device.type != "cpu":
        return None
    block = default_block(q.device)
    if torch.compiler.is_compiling():
        # Only a plan made outside (reading the edges, or comparing their number,
        # would guard a traced size: torch.export's dynamic edges; an estimate
        # alone would have the plan made here, from the edges' values).
        plan = graph.peek(("tiles", block))
        e = graph.num_edges
        if plan is None or (isinstance(e, int) and e < TILES_MIN_EDGES):
            return None
        if plan.fill < TILES_MIN_FILL:
            return None
        # Not the fill's value: it may be symbolic (the plan's sizes, traced).
        return BackendChoice("tiles", f"tiles: the graph's tile plan over {block}-row windows")
    if graph.num_edges < TILES_MIN_EDGES:
        return None
    fill = fill_estimate(graph, block)
    if fill < TILES_MIN_FILL:
        return None
    return BackendChoice("tiles", f"tiles: fill {fill:.2f} over {block}-row windows")


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
