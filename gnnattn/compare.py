r"""Graph attention vs dense attention on the same weights: the parity harness.

:func:`compare` runs one :class:`~gnnattn.SelfAttentionConv` through its graph
backends (``"mp"``, ``"sdpa"``, ``"fused"``, ``"tiles"``, chosen per call with
``layer(x, graph, backend=...)``) and the same weights through the peers of
:mod:`gnnattn.peers`: :class:`torch.nn.MultiheadAttention`,
:func:`torch.nn.functional.scaled_dot_product_attention` (``"F.sdpa"``, called
directly), FlexAttention with a block mask (where it runs) and PyG's
``TransformerConv``, in float32 / float16 / bfloat16, with and without causal
masking. Each is measured against one float64 reference computed
here from the layer's projection weights with the textbook formula

.. math::
    O = W_O \Big\Vert_h \operatorname{softmax}\!\left(\frac{Q^h {K^h}^\top}{\sqrt{C}}
        + \log M\right) V^h

(never through the layer's own code, so a bug in the layer cannot hide in its
reference). Errors are the max absolute error and the relative error
:math:`\max|a - b| / \max|b|` of the outputs, the ``[H, N, N]`` weights and the
gradient with respect to ``x``; a row is ``ok`` when all three relative errors
are within the dtype's tolerance.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch
from torch import Tensor

from . import peers
from .checks import check_int
from .graphs import AttentionGraph, causal_graph, complete_graph
from .nn import SelfAttentionConv
from .ops import BACKENDS

__all__ = ["ParityResult", "ParityRow", "TOLERANCES", "compare"]

#: Relative tolerance per dtype: a few units of each format's rounding error,
#: grown by the reductions of an attention layer.
TOLERANCES: Mapping[str, float] = MappingProxyType(
    {"float32": 1e-4, "float16": 1e-2, "bfloat16": 6e-2}
)

_DTYPES = MappingProxyType(
    {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
)
CANDIDATES = (
    "mp",
    "sdpa",
    "fused",
    "tiles",
    "nn.MultiheadAttention",
    "F.sdpa",
    "flex_attention",
    "PyG TransformerConv",
)


@dataclass
class ParityRow:
    """One candidate in one dtype, causal or not, against the float64 reference.

    Errors are ``nan`` when the candidate does not give that quantity (SDPA
    returns no weights) and every field but ``note`` is ``nan`` when the
    candidate did not run (``note`` says why): ``ok`` is then ``None`` for a
    peer that this installation cannot run, and ``False`` for one of
    gnnattn's own backends, which must run.
    """

    candidate: str
    dtype: str
    causal: bool
    out_abs: float = math.nan
    out_rel: float = math.nan
    weight_abs: float = math.nan
    weight_rel: float = math.nan
    grad_abs: float = math.nan
    grad_rel: float = math.nan
    ms_per_call: float = math.nan
    ok: bool | None = None
    note: str = ""


@dataclass
class ParityResult:
    """What :func:`compare` found: one :class:`ParityRow` per run, plus the setting."""

    tokens: int
    embed_dim: int
    num_heads: int
    rows: list[ParityRow] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every candidate that ran is within tolerance."""
        return all(r.ok is not False for r in self.rows)

    def row(self, candidate: str, dtype: str = "float32", causal: bool = False) -> ParityRow:
        """The row of one run; ``KeyError`` when it was not part of the comparison."""
        for r in self.rows:
            if (r.candidate, r.dtype, r.causal) == (candidate, dtype, causal):
                return r
        raise KeyError(f"no row for candidate={candidate!r}, dtype={dtype!r}, causal={causal}")

    def failures(self) -> list[ParityRow]:
        """The rows outside tolerance."""
        return [r for r in self.rows if r.ok is False]

    def table(self) -> str:
        """A plain-text table, one line per run."""

        def cell(v: float) -> str:
            return f"{'-':>8}" if math.isnan(v) else f"{v:8.1e}"

        head = (
            f"{'candidate':<22} {'dtype':<8} {'causal':<6} {'out abs':>8} {'out rel':>8} "
            f"{'w abs':>8} {'w rel':>8} {'grad abs':>8} {'grad rel':>8} {'ms/call':>8}  verdict"
        )
        lines = [
            f"graph vs dense attention, T={self.tokens}, embed {self.embed_dim}, "
            f"{self.num_heads} heads; errors vs a float64 reference",
            head,
            "-" * len(head),
        ]
        for r in self.rows:
            verdict = {True: "ok", False: "NOT EQUAL", None: "n/a"}[r.ok]
            if r.note:
                verdict += f" ({r.note})"
            ms = f"{'-':>8}" if math.isnan(r.ms_per_call) else f"{r.ms_per_call:8.3f}"
            lines.append(
                f"{r.candidate:<22} {r.dtype:<8} {str(r.causal):<6} {cell(r.out_abs)} "
                f"{cell(r.out_rel)} {cell(r.weight_abs)} {cell(r.weight_rel)} "
                f"{cell(r.grad_abs)} {cell(r.grad_rel)} {ms}  {verdict}"
            )
        tol = ", ".join(f"{k} {v:g}" for k, v in TOLERANCES.items())
        lines.append(f"relative tolerance: {tol}. agreement: {'OK' if self.ok else 'FAILED'}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


# --------------------------------------------------------------------- helpers


def _reference(layer: SelfAttentionConv, x: Tensor, causal: bool) -> tuple[Tensor, Tensor]:
    """Output and ``[H, N, N]`` weights from the formula, with 1/sqrt(C) fixed here."""
    n = x.shape[0]
    q, k, v = (t.transpose(0, 1) for t in peers.split_heads(layer, x))  # (H, N, C)
    s = q @ k.transpose(-1, -2) / math.sqrt(layer.head_dim)  # (H, N, N)
    mask = peers.dense_mask(n, causal=causal, device=x.device)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s, dim=-1)  # row-wise: over the sources of each target
    return peers.merge_heads(layer, (p @ v).transpose(0, 1)), p


def _dense_weights(edge_index: Tensor, alpha: Tensor, n: int) -> Tensor:
    h = alpha.shape[1]
    w = alpha.new_zeros(h, n, n)
    heads = torch.arange(h, device=alpha.device).view(h, 1).expand(h, alpha.shape[0])
    w.index_put_((heads, edge_index[1].expand(h, -1), edge_index[0].expand(h, -1)), alpha.t())
    return w


@dataclass
class _Runner:
    """One candidate made ready for one layer and masking (graphs and peers built once).

    ``check(x)`` gives the output and the ``[H, N, N]`` weights (``None`` when
    the candidate has none); ``call(x)``, the output alone, is what is timed.
    """

    check: Callable[[Tensor], tuple[Tensor, Tensor | None]]
    call: Callable[[Tensor], Tensor]


def _graph_runner(backend: str) -> Callable[[SelfAttentionConv, int, bool], _Runner]:
    def make(layer: SelfAttentionConv, n: int, causal: bool) -> _Runner:
        device = layer.lin_query.weight.device
        graph = (AttentionGraph.causal if causal else AttentionGraph.complete)(n, device=device)

        def check(x: Tensor) -> tuple[Tensor, Tensor | None]:
            out, (ei, alpha) = layer(x, graph, return_attention_weights=True, backend=backend)
            return out, _dense_weights(ei, alpha.detach(), n)

        return _Runner(check, lambda x: layer(x, graph, backend=backend))

    return make


def _mha(layer: SelfAttentionConv, n: int, causal: bool) -> _Runner:
    _, with_weights = peers.mha(layer, n, causal=causal, need_weights=True)
    _, plain = peers.mha(layer, n, causal=causal)
    return _Runner(with_weights, lambda x: plain(x)[0])


def _output_only(
    make: Callable[[SelfAttentionConv, int, bool], Callable[[Tensor], Tensor]],
) -> Callable[[SelfAttentionConv, int, bool], _Runner]:
    def runner(layer: SelfAttentionConv, n: int, causal: bool) -> _Runner:
        fn = make(layer, n, causal)
        return _Runner(lambda x: (fn(x), None), fn)

    return runner


def _conv(layer: SelfAttentionConv, n: int, causal: bool) -> Callable[[Tensor], Tensor]:
    device = layer.lin_query.weight.device
    ei = (causal_graph if causal else complete_graph)(n, device=device)
    return peers.transformer_conv(layer, ei)[1]


_GRAPH_BACKENDS = tuple(b for b in BACKENDS if b != "auto")
_RUNNERS: Mapping[str, Callable[[SelfAttentionConv, int, bool], _Runner]] = MappingProxyType(
    {
        **{b: _graph_runner(b) for b in _GRAPH_BACKENDS},
        "nn.MultiheadAttention": _mha,
        "F.sdpa": _output_only(lambda layer, n, causal: peers.sdpa(layer, n, causal=causal)),
        "flex_attention": _output_only(
            lambda layer, n, causal: peers.flex(layer, n, causal=causal)
        ),
        "PyG TransformerConv": _output_only(_conv),
    }
)


def _err(a: Tensor, ref: Tensor) -> tuple[float, float]:
    d = (a.double() - ref).abs().max().item() if a.numel() else 0.0
    scale = ref.abs().max().item() if ref.numel() else 0.0
    return d, d / scale if scale > 0 else d


# ------------------------------------------------------------------------- API


def compare(
    layer: SelfAttentionConv | None = None,
    x: Tensor | None = None,
    *,
    tokens: int = 12,
    embed_dim: int = 16,
    num_heads: int = 4,
    dtypes: str | Sequence[str] = ("float32", "float16", "bfloat16"),
    causal: bool | Sequence[bool] = (False, True),
    candidates: str | Sequence[str] | None = None,
    reps: int = 3,
    seed: int = 0,
    device: torch.device | str = "cpu",
    verbose: bool = False,
) -> ParityResult:
    r"""Run every candidate on the same weights and inputs and measure it against float64.

    Args:
        layer (SelfAttentionConv, optional): the layer to check (its weights are
            copied, it is not changed). (default: :obj:`None`, a seeded
            ``SelfAttentionConv(embed_dim, num_heads)``)
        x (Tensor, optional): ``[T, D]`` input. (default: :obj:`None`, seeded
            ``randn(tokens, embed_dim)``)
        tokens (int, optional): :math:`T` when ``x`` is not given. (default: ``12``)
        embed_dim (int, optional): :math:`D` when ``layer`` is not given. (default: ``16``)
        num_heads (int, optional): :math:`H` when ``layer`` is not given. (default: ``4``)
        dtypes (str or sequence of str, optional): among ``"float32"``,
            ``"float16"``, ``"bfloat16"``. (default: all three)
        causal (bool or sequence of bool, optional): which maskings.
            (default: ``(False, True)``)
        candidates (str or sequence of str, optional): among :data:`CANDIDATES`.
            (default: :obj:`None`, all)
        reps (int, optional): forward calls timed per run. (default: ``3``)
        seed (int, optional): seed of the default layer, input and output
            gradient. (default: ``0``)
        device (torch.device or str, optional): where to run. (default: ``"cpu"``)
        verbose (bool, optional): print the table. (default: :obj:`False`)

    Returns:
        ParityResult: ``.ok``, ``.rows``, ``.row(candidate, dtype, causal)``,
        ``.table()``.

    Shapes:
        - **x:** ``[T, D]``

    Example:
        >>> res = compare(tokens=4, embed_dim=8, num_heads=2, dtypes=["float32"],
        ...               candidates=["mp", "F.sdpa"])
        >>> res.ok, res.row("mp", "float32", causal=True).out_rel < 1e-4
        (True, True)
    """
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        # torch's own error here is an AssertionError deep in its lazy CUDA init.
        raise ValueError(f"Expected a CUDA device for device={str(device)!r}, but torch sees none")
    if x is None:
        check_int(tokens, "tokens", min=1)
    gen = torch.Generator().manual_seed(seed)
    layer = _checked_layer(layer, embed_dim, num_heads, seed)
    d = layer.embed_dim
    if x is None:
        x = torch.randn(tokens, d, generator=gen, dtype=torch.float64)
    dtypes, causal = _one_or_many(dtypes, str, "dtypes"), _one_or_many(causal, bool, "causal")
    if candidates is not None:
        candidates = _one_or_many(candidates, str, "candidates")
    for flag in causal:
        if not isinstance(flag, bool):
            raise TypeError(f"Expected 'causal' to hold bools, got {type(flag).__name__}")
    names = _checked_args(x, d, dtypes, candidates, reps)

    x64 = x.detach().to(device=device, dtype=torch.float64)
    grad_out = torch.randn(x64.shape, generator=gen, dtype=torch.float64).to(device)
    ref_layer = _copy(layer, torch.float64, device)
    result = ParityResult(tokens=x64.shape[0], embed_dim=d, num_heads=layer.num_heads)
    for is_causal in causal:
        ref = _reference_run(ref_layer, x64, grad_out, bool(is_causal))
        for dname in dtypes:
            lay = _copy(layer, _DTYPES[dname], device)
            for cand in names:
                row = ParityRow(cand, dname, bool(is_causal))
                result.rows.append(row)
                _measure(row, lay, x64, grad_out, ref, reps)
    if verbose:
        print(result.table())
    return result


def _checked_layer(
    layer: SelfAttentionConv | None, embed_dim: int, num_heads: int, seed: int
) -> SelfAttentionConv:
    """The layer to compare: the one given, checked, or a seeded default."""
    if layer is None:
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            layer = SelfAttentionConv(embed_dim, num_heads)
    if not isinstance(layer, SelfAttentionConv):
        raise TypeError(f"Expected 'layer' to be a SelfAttentionConv, got {type(layer).__name__}")
    if layer.edge_dim is not None:
        raise ValueError(
            f"Expected a layer without edge features (the dense peers have no edge inputs), got "
            f"edge_dim={layer.edge_dim}"
        )
    return layer


def _one_or_many(value: Any, kind: type, name: str) -> tuple[Any, ...]:
    # A lone str is a sequence of its letters, and a bool no sequence at all:
    # either one is taken as the one choice it names.
    if isinstance(value, kind):
        return (value,)
    if not isinstance(value, Iterable):
        raise TypeError(
            f"Expected {name!r} to be a {kind.__name__} or a sequence of them, got "
            f"{type(value).__name__}"
        )
    return tuple(value)


def _checked_args(
    x: Tensor, d: int, dtypes: Sequence[str], candidates: Sequence[str] | None, reps: int
) -> list[str]:
    """Raise on arguments :func:`compare` cannot take; the candidates to run."""
    if not isinstance(x, Tensor) or x.dim() != 2 or x.shape[1] != d:
        raise ValueError(f"Expected 'x' of shape [T, {d}], got {list(getattr(x, 'shape', []))}")
    for name in dtypes:
        if name not in _DTYPES:
            raise ValueError(f"Expected 'dtypes' among {tuple(_DTYPES)}, got {name!r}")
    names = list(CANDIDATES if candidates is None else candidates)
    for name in names:
        if name not in _RUNNERS:
            raise ValueError(f"Expected 'candidates' among {CANDIDATES}, got {name!r}")
    check_int(reps, "reps", min=1)
    return names


def _reference_run(
    ref_layer: SelfAttentionConv, x64: Tensor, grad_out: Tensor, causal: bool
) -> tuple[Tensor, Tensor, Tensor]:
    """The float64 reference's ``(output, weights, grad of x)``."""
    xr = x64.clone().requires_grad_(True)
    ref_out, ref_w = _reference(ref_layer, xr, causal)
    ref_out.backward(grad_out)
    assert xr.grad is not None
    return ref_out.detach(), ref_w.detach(), xr.grad


def _measure(
    row: ParityRow,
    layer: SelfAttentionConv,
    x64: Tensor,
    grad_out: Tensor,
    ref: tuple[Tensor, Tensor, Tensor],
    reps: int,
) -> None:
    """Run ``row``'s candidate on ``layer`` and fill the row's errors, time and verdict."""
    dt = _DTYPES[row.dtype]
    try:
        runner = _RUNNERS[row.candidate](layer, x64.shape[0], row.causal)
        out, w, g, row.ms_per_call = _run(runner, x64.to(dt), grad_out.to(dt), reps)
    except Exception as err:  # reported in the row, not fatal
        row.note = f"{type(err).__name__}: {str(err).splitlines()[0][:60]}"
        # A peer that cannot run here is n/a; gnnattn's own backends must run.
        row.ok = False if row.candidate in _GRAPH_BACKENDS else None
        return
    ref_out, ref_w, ref_g = ref
    row.out_abs, row.out_rel = _err(out, ref_out)
    if w is not None:
        row.weight_abs, row.weight_rel = _err(w, ref_w)
    if g is not None:
        row.grad_abs, row.grad_rel = _err(g, ref_g)
    else:
        row.note = "no backward here"
    # What the candidate gives is measured, and a NaN there (an output the reference
    # has finite) fails the row: NaN <= tol is False.
    rels = [row.out_rel]
    rels += [row.weight_rel] if w is not None else []
    rels += [row.grad_rel] if g is not None else []
    row.ok = all(r <= TOLERANCES[row.dtype] for r in rels)


def _copy(layer: SelfAttentionConv, dtype: torch.dtype, device: torch.device) -> SelfAttentionConv:
    out = copy.deepcopy(layer).to(device=device, dtype=dtype)
    # The harness chooses the masking of each run (complete, then causal): a causal
    # layer's own pruning would mask the complete run, which the reference does not.
    out.causal = False
    return out.eval()  # dropout off: the operator, not one random sample of it


def _run(
    runner: _Runner, x: Tensor, g: Tensor, reps: int
) -> tuple[Tensor, Tensor | None, Tensor | None, float]:
    """``(output, weights, grad of x, ms per forward call)`` of one candidate."""
    from .bench.harness import timed

    xg = x.clone().requires_grad_(True)
    try:
        out, w = runner.check(xg)
        out.backward(g)
    except NotImplementedError:
        # FlexAttention has no CPU backward: report its forward alone.
        with torch.no_grad():
            out, w = runner.check(x)
        xg.grad = None
    with torch.no_grad():
        runner.call(x)  # warm-up
        seconds = sum(timed(lambda: runner.call(x), x.device)[0] for _ in range(reps))
    return out.detach(), w, xg.grad, seconds / reps * 1e3
