r"""Stable scatter-softmax: softmax over the incoming edges of each target.

.. math::
    \alpha_e = \frac{\exp(s_e - m_{i(e)})}{\sum_{e' : i(e') = i(e)} \exp(s_{e'} - m_{i(e)})},
    \qquad m_i = \max_{e : i(e) = i} s_e

Subtracting the per-segment maximum :math:`m_i` changes nothing mathematically
(the factor :math:`e^{-m_i}` cancels) but keeps every ``exp`` at most 1, so
float16 (whose ``exp`` overflows past about 11.09) and float32 (past about
88.72) never produce ``inf``/``NaN``. :func:`naive_scatter_softmax` leaves the
shift out, for teaching.

Reductions always run in float32 (float64 stays float64); the result has the
input's dtype. The backward is a custom autograd function that saves only the
output :math:`y`: :math:`\partial L/\partial s = y \odot (g - \sum_{seg} g \odot y)`.

On the CPU, large float32/float64 inputs with target-sorted ``index`` run
through the numba kernel of :mod:`gnnattn.kernels.cpu`, on CUDA through the
Triton kernel; everything else through the pure-torch path below. All paths
follow the same rules and are tested equal.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .checks import check_int
from .graphs import check_edge_index
from .kernels import COMPILED, reference
from .kernels import get as get_kernels
from .kernels.common import acc_dtype, plain_index, under_func_transform

__all__ = [
    "SoftmaxSteps",
    "naive_scatter_softmax",
    "scatter_softmax",
    "segment_softmax",
    "softmax_steps",
]

# Below this many elements the compiled kernels' call overhead (CSR pointers,
# numpy views) costs more than the torch ops they replace.
_KERNEL_MIN_NUMEL = 1 << 15


def _check(src: Tensor, index: Tensor, num_segments: int | None, dim: int) -> tuple[int, int]:
    if not isinstance(src, Tensor):
        raise TypeError(f"Expected 'src' to be a Tensor, got {type(src).__name__}")
    if not src.is_floating_point():
        raise TypeError(f"Expected 'src' of a floating dtype, got {src.dtype}")
    if not isinstance(index, Tensor):
        raise TypeError(f"Expected 'index' to be a Tensor, got {type(index).__name__}")
    if index.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"Expected 'index' of dtype torch.int64 or torch.int32, got {index.dtype}")
    if src.dim() == 0:
        raise ValueError("Expected 'src' with at least one dimension, got a scalar")
    if not -src.dim() <= dim < src.dim():
        raise ValueError(f"Expected 'dim' in [{-src.dim()}, {src.dim() - 1}], got {dim}")
    dim = dim % src.dim()
    if index.dim() != 1 or index.numel() != src.shape[dim]:
        raise ValueError(
            f"Expected 'index' of shape [{src.shape[dim]}] (src.shape[dim]), "
            f"got {list(index.shape)}"
        )
    if index.device != src.device:
        raise ValueError(
            f"Expected 'index' on the device of 'src' ({src.device}), got {index.device}"
        )
    lo, hi = 0, 0
    if index.numel():
        # One pass over the index for both bounds (it is as long as src).
        lo_t, hi_t = torch.aminmax(index)
        lo, hi = int(lo_t), int(hi_t) + 1
    if lo < 0:
        raise ValueError("Expected 'index' to hold segment ids >= 0, got a negative id")
    if num_segments is None:
        num_segments = hi
    else:
        check_int(num_segments, "num_segments")
    if num_segments < hi:
        raise ValueError(
            f"Expected 'num_segments' > every index (at least {hi}), got {num_segments}"
        )
    return num_segments, dim


def _segment_ptr(index: Tensor, n: int) -> Tensor | None:
    """CSR pointers of a sorted ``index``, or ``None`` when it is not sorted.

    The CPU kernel does the sortedness check and the pointers in one pass
    over the index; elsewhere the reference's torch ops do.
    """
    kern = get_kernels(index.device)
    find = getattr(kern, "segment_ptr", reference.segment_ptr)
    return find(index, n)


class _ScatterSoftmax(torch.autograd.Function):
    """Autograd function of the torch ops on ``src`` ``[E, F]``: saves only its weights.

    Returns ``(out, y)``: ``out`` in ``src``'s dtype, ``y`` the same weights in the
    accumulation dtype, which the backward reads (a half ``out`` would round them)
    and, being an output, differentiates again under ``create_graph=True``.
    Written in ``setup_context`` form with a generated vmap rule, so that ``torch.func``
    transforms (``grad``, ``vmap``, ``jacrev``) compose with it; forward mode is
    :class:`_ScatterSoftmaxJvp`'s.
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(src: Tensor, index: Tensor, n: int) -> tuple[Tensor, Tensor]:  # type: ignore[override]
        y = reference.segment_softmax(src.to(acc_dtype(src.dtype)), index, n)
        return y.to(src.dtype), y

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor]) -> None:
        _, index, n = inputs
        out, y = output
        ctx.save_for_backward(y, index)
        ctx.save_for_forward(y, index)
        ctx.n, ctx.dtype = n, out.dtype
        # y's gradient is None unless a caller used y: not a zero tensor to add.
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx: Any, grad: Tensor | None, grad_y: Tensor | None) -> Any:  # type: ignore[override]
        y, index = ctx.saved_tensors
        if grad is None and grad_y is None:
            return None, None, None
        # Where out is y (float32, float64) its gradient arrives as y's alone.
        grads = [t.to(y.dtype) for t in (grad, grad_y) if t is not None]
        g = grads[0] if len(grads) == 1 else grads[0] + grads[1]
        dot = reference.segment_sum(g * y, index, ctx.n)
        return (y * (g - dot[index])).to(ctx.dtype), None, None


class _ScatterSoftmaxJvp(_ScatterSoftmax):
    """:class:`_ScatterSoftmax` with forward mode (``torch.func.jvp``, ``jacfwd``), inside
    ``torch.func`` transforms only: Dynamo cannot trace a Function with a custom
    ``jvp`` (a compiled ``grad`` takes the parent), and autograd's own forward mode
    would set the tangent of ``out`` twice where ``out`` is ``y`` (float32, float64)."""

    @staticmethod
    def jvp(ctx: Any, dsrc: Tensor, *_: Any) -> tuple[Tensor, Tensor]:  # type: ignore[override]
        # dy = y * (dx - sum_seg(y dx)): the Jacobian's other side.
        y, index = ctx.saved_tensors
        dx = dsrc.to(y.dtype)
        dy = y * (dx - reference.segment_sum(y * dx, index, ctx.n)[index])
        return dy.to(ctx.dtype), dy


def _kernel_ok(flat: Tensor) -> bool:
    # Not inside a torch.func transform: the kernel is a custom operator, which they
    # cannot run; the torch ops of _ScatterSoftmax compose with them.
    return (
        flat.numel() >= _KERNEL_MIN_NUMEL
        and flat.device.type in COMPILED
        and not under_func_transform()
    )


def segment_softmax(src: Tensor, index: Tensor, n: int, *, ptr: Tensor | None = None) -> Tensor:
    """:func:`scatter_softmax` along dim 0 of ``src`` ``[E, ...]``, without the checks.

    For callers that already know their input is valid (the operator's
    message-passing backend): ``index`` int64 ``[E]`` with ids below ``n``;
    ``ptr`` ``[n + 1]``, when given, the CSR pointers of a sorted ``index``
    (a graph's, made once), with which the compiled kernels run (the operator
    ``torch.ops.gnnattn.segment_softmax_fwd``).
    """
    flat = src.reshape(src.shape[0], math.prod(src.shape[1:]))  # (E, F)
    if ptr is not None and _kernel_ok(flat):
        x = flat.to(acc_dtype(src.dtype)).contiguous()
        out = torch.ops.gnnattn.segment_softmax_fwd(x, ptr).to(src.dtype)
    else:
        jvp = under_func_transform() and not torch.compiler.is_compiling()
        fn = _ScatterSoftmaxJvp if jvp else _ScatterSoftmax
        out = fn.apply(flat, index.long(), n)[0]
    return out.view(src.shape)


def scatter_softmax(
    src: Tensor, index: Tensor, num_segments: int | None = None, dim: int = 0
) -> Tensor:
    r"""Numerically stable softmax of ``src`` within the groups given by ``index``.

    .. math::
        \text{out}_e = \frac{\exp(s_e - m_{\text{index}_e})}
        {\sum_{e' : \text{index}_{e'} = \text{index}_e} \exp(s_{e'} - m_{\text{index}_e})}

    where :math:`m_i` is the maximum of segment :math:`i`. ``-inf`` entries get
    weight 0; a segment whose entries are all ``-inf`` gets zeros (never NaN),
    forward and backward. float16/bfloat16 reduce in float32 and come back in
    their own dtype; float64 stays float64.

    Args:
        src (Tensor): the scores, for example ``[E]`` or ``[E, H]``.
        index (Tensor): int64 segment (target) id of each entry along ``dim``.
        num_segments (int, optional): number of segments; defaults to
            ``index.max() + 1``. (default: :obj:`None`)
        dim (int, optional): the dimension ``index`` runs along. (default: ``0``)

    Shapes:
        - **src:** ``[|E|]`` or ``[|E|, H]``
        - **index:** ``[|E|]``
        - **output:** same as ``src``

    Example:
        >>> s = torch.tensor([100.0, 102.0, 105.0])
        >>> scatter_softmax(s, torch.zeros(3, dtype=torch.long))
        tensor([0.0064, 0.0471, 0.9465])
    """
    index = plain_index(index, "index")  # inside torch.func: shared, not batched
    n, dim = _check(src, index, num_segments, dim)
    x = src.movedim(dim, 0)
    flat = x.reshape(x.shape[0], math.prod(x.shape[1:]))  # (E, F)
    # Large inputs: one pass over the index tells whether it is sorted and, if
    # so, where the segments start (the kernels' CSR pointers).
    ptr = _segment_ptr(index, n) if _kernel_ok(flat) else None
    out = segment_softmax(flat, index, n, ptr=ptr)
    return out.view(x.shape).movedim(0, dim)


def naive_scatter_softmax(
    src: Tensor, index: Tensor, num_segments: int | None = None, dim: int = 0
) -> Tensor:
    r"""The textbook softmax *without* the max shift, in ``src``'s own dtype.

    .. math::
        \text{out}_e = \frac{\exp(s_e)}{\sum_{e' : \text{index}_{e'} = \text{index}_e} \exp(s_{e'})}

    Kept for teaching: in float16 ``exp(12)`` is already ``inf``, so logits such
    as ``[100, 102, 105]`` give ``inf / inf = NaN`` here, while
    :func:`scatter_softmax` gives ``[0.00638, 0.04712, 0.94650]``. Do not use it
    in models.

    Args:
        src (Tensor): the scores.
        index (Tensor): segment id of each entry along ``dim``.
        num_segments (int, optional): number of segments. (default: :obj:`None`)
        dim (int, optional): the dimension ``index`` runs along. (default: ``0``)

    Example:
        >>> s = torch.tensor([100.0, 102.0, 105.0], dtype=torch.float16)
        >>> naive_scatter_softmax(s, torch.zeros(3, dtype=torch.long))
        tensor([nan, nan, nan], dtype=torch.float16)
    """
    n, dim = _check(src, index, num_segments, dim)
    x = src.movedim(dim, 0)
    e = torch.exp(x)
    s = reference.segment_sum(e, index.long(), n)
    return (e / s[index.long()]).movedim(0, dim)


# ----------------------------------------------------------------- step by step
# One target's softmax with every intermediate kept: the lesson's table (printed
# by `gnnattn demo` and the notebooks). A computation, so it lives here; the
# drawing modules only show it (gnnattn.viz re-exports it).


@dataclass
class SoftmaxSteps:
    r"""The softmax of one target, step by step (see :func:`softmax_steps`).

    Attributes:
        target (int): the target :math:`i`.
        sources (list of int): its sources :math:`j`, in edge order.
        labels (list of str): their labels.
        scores (list of float): :math:`s_{ij} = \text{scale}\, q_i \cdot k_j`.
        max (float): :math:`m_i = \max_j s_{ij}`.
        shifted (list of float): :math:`e^{s_{ij} - m_i}`, each in (0, 1].
        total (float): :math:`\sum_j e^{s_{ij} - m_i}`.
        weights (list of float): :math:`\alpha_{ij}`, summing to 1.
    """

    target: int
    sources: list[int]
    labels: list[str]
    scores: list[float]
    max: float
    shifted: list[float]
    total: float
    weights: list[float]

    def table(self) -> str:
        """A plain-text table, one row per incoming edge."""
        rows = [
            f"softmax for target {self.target}: subtract the max, exponentiate, divide by the sum"
        ]
        rows.append(
            f"{'source j':<14} {'s = q.k':>10} {'s - max':>10} {'exp(s-max)':>11} {'alpha':>8}"
        )
        for lab, s, e, w in zip(self.labels, self.scores, self.shifted, self.weights, strict=True):
            rows.append(f"{lab:<14} {s:>10.4f} {s - self.max:>10.4f} {e:>11.5f} {w:>8.5f}")
        rows.append(f"{'max':<14} {self.max:>10.4f}")
        rows.append(f"{'sum':<14} {'':>10} {'':>10} {self.total:>11.5f} {sum(self.weights):>8.5f}")
        return "\n".join(rows)

    def __str__(self) -> str:
        return self.table()


def softmax_steps(
    query: Tensor,
    key: Tensor,
    target: int,
    *,
    edge_index: Tensor | None = None,
    scale: float = 1.0,
    tokens: list[str] | None = None,
) -> SoftmaxSteps:
    r"""The stable softmax of one target's incoming edges, every intermediate kept.

    .. math::
        s_{ij} = \text{scale}\; q_i \cdot k_j,\quad m_i = \max_j s_{ij},\quad
        \alpha_{ij} = \frac{e^{s_{ij} - m_i}}{\sum_k e^{s_{ik} - m_i}}

    Subtracting :math:`m_i` changes nothing mathematically (the factor
    :math:`e^{-m_i}` cancels) but keeps every exponential in (0, 1].

    Args:
        query (Tensor): ``[N, C]`` queries (for simplified attention, ``x``).
        key (Tensor): ``[M, C]`` keys (for simplified attention, ``x`` again).
        target (int): the target :math:`i`.
        edge_index (Tensor, optional): ``[2, E]``; the sources of ``target``.
            (default: :obj:`None`, every key)
        scale (float, optional): multiplies the dot products, e.g.
            :math:`1/\sqrt{C}`. (default: ``1.0``)
        tokens (list of str, optional): labels of the keys. (default: :obj:`None`)

    Shapes:
        - **query:** ``[N, C]``; **key:** ``[M, C]``; **edge_index:** ``[2, E]``
        - **output:** a :class:`SoftmaxSteps` with one entry per incoming edge
          of ``target`` (every key without ``edge_index``).

    Example:
        >>> x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
        >>> st = softmax_steps(x, x, 2)
        >>> st.scores, st.max, [round(w, 4) for w in st.weights]
        ([1.0, 1.0, 2.0], 2.0, [0.2119, 0.2119, 0.5761])
    """
    for name, t in (("query", query), ("key", key)):
        if not isinstance(t, Tensor) or t.dim() != 2:
            raise ValueError(
                f"Expected '{name}' of shape [N, C], got {list(getattr(t, 'shape', []))}"
            )
    if query.shape[1] != key.shape[1]:
        raise ValueError(
            f"Expected 'query' and 'key' of one width, got {query.shape[1]} and {key.shape[1]}"
        )
    n, m = query.shape[0], key.shape[0]
    check_int(target, "target")
    if target >= n:
        raise ValueError(f"Expected 'target' an int in [0, {n}), got {target!r}")
    if tokens is not None and len(tokens) != m:
        raise ValueError(f"Expected 'tokens' to hold one label per key ({m}), got {len(tokens)}")
    if edge_index is None:
        src = torch.arange(m)
    else:
        check_edge_index(edge_index, m, n)
        src = edge_index[0][edge_index[1] == target].long().cpu()
    q = query.detach().double()[target]
    s = (key.detach().double()[src] @ q) * scale  # (deg,)
    if src.numel() == 0:
        mx, shifted, total, weights = float("-inf"), s, 0.0, s
    else:
        mx_t = s.max()
        shifted = torch.exp(s - mx_t)
        total_t = shifted.sum()
        weights = shifted / total_t
        mx, total = float(mx_t), float(total_t)
    labels = [str(t) for t in tokens] if tokens is not None else [str(j) for j in range(m)]
    return SoftmaxSteps(
        target=target,
        sources=src.tolist(),
        labels=[labels[j] for j in src.tolist()],
        scores=s.tolist(),
        max=mx,
        shifted=shifted.tolist(),
        total=total,
        weights=weights.tolist(),
    )
