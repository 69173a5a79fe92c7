r"""The attention operator: one function that every layer, the comparison and the bench call.

.. math::
    \alpha_{ij}^h = \operatorname{softmax}_{j \in \mathcal{N}(i)}
        \left(\text{scale}\,\langle q_i^h, k_j^h\rangle + b_{ij}^h\right),
    \qquad o_i^h = \sum_{j \in \mathcal{N}(i)} \alpha_{ij}^h\, m_{ij}^h
        \left(v_j^h + e_{ij}^h\right)

over the incoming edges :math:`j \to i` of each target of an
:class:`~gnnattn.AttentionGraph` (the shape of FlexAttention's
``flex_attention(q, k, v, score_mod, block_mask)``, with the graph object in
the block mask's place). :math:`b` is the optional score bias, :math:`e` the
edge features' value term (``edge_attr``), :math:`m` the dropout factor. The
backends are in :mod:`gnnattn.ops.mp` (the reference), :mod:`gnnattn.ops.sdpa`,
:mod:`gnnattn.ops.fused` and :mod:`gnnattn.ops.tiles`; :func:`gnnattn.backend_for`
chooses among them from their declarations.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import NamedTuple

import torch
from torch import Tensor

from .. import kernels
from ..checks import check_float, check_probability, check_tensor
from ..graphs import AttentionGraph, segment_ids
from ..kernels.common import acc_dtype
from ..kernels.library import draw_key
from .args import AttentionArgs
from .choice import backend_for, check_graph
from .fused import fused_attention
from .mp import mp_attention
from .sdpa import sdpa_attention
from .tiles import tiles_attention

__all__ = ["AttentionOutput", "attention"]


class AttentionOutput(NamedTuple):
    """What :func:`attention` returns when asked for more than the output.

    Attributes:
        out: ``[N, H, Cv]``.
        lse: ``[N, H]`` per-target log-sum-exp of the scores (before dropout;
            ``-inf`` for a target without edges), or ``None``; float32 for
            float32 and half inputs, float64 for float64, on every backend.
        weights: ``[|E|, H]`` in ``graph.edge_index`` order (before dropout),
            or ``None``.
        backend: the backend that ran.
    """

    out: Tensor
    lse: Tensor | None
    weights: Tensor | None
    backend: str


def _check(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    graph: AttentionGraph,
    score_bias: Tensor | None,
    edge_attr: Tensor | None = None,
    edge_key: Tensor | None = None,
    edge_value: Tensor | None = None,
) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(t, name)
        if t.dim() != 3:
            raise ValueError(f"Expected '{name}' of shape [N, H, C], got {list(t.shape)}")
        if not t.is_floating_point():
            raise TypeError(f"Expected '{name}' of a floating dtype, got {t.dtype}")
        if t.device != q.device or t.dtype != q.dtype:
            raise ValueError(
                f"Expected 'q', 'k', 'v' of one device and dtype, got {q.device}/{q.dtype} "
                f"and {t.device}/{t.dtype} for '{name}'"
            )
    if q.shape[1:] != k.shape[1:] or k.shape[:2] != v.shape[:2]:
        raise ValueError(
            f"Expected 'q' [N, H, C], 'k' [M, H, C] and 'v' [M, H, Cv], got "
            f"{list(q.shape)}, {list(k.shape)} and {list(v.shape)}"
        )
    check_graph(graph)
    graph.check_nodes(k.shape[0], q.shape[0], q.device)
    if score_bias is not None:
        shape = (graph.num_edges, q.shape[1])
        check_tensor(score_bias, "score_bias")
        if tuple(score_bias.shape) != shape:
            raise ValueError(
                f"Expected 'score_bias' of shape {list(shape)} (one row per edge of the graph), "
                f"got {list(score_bias.shape)}"
            )
        if not score_bias.is_floating_point() or score_bias.device != q.device:
            raise TypeError(
                f"Expected 'score_bias' floating and on {q.device}, got {score_bias.dtype} on "
                f"{score_bias.device}"
            )
    _check_edge(q, v, graph, edge_attr, edge_key, edge_value)


def _check_edge(
    q: Tensor,
    v: Tensor,
    graph: AttentionGraph,
    edge_attr: Tensor | None,
    edge_key: Tensor | None,
    edge_value: Tensor | None,
) -> None:
    if edge_attr is None:
        if edge_key is not None or edge_value is not None:
            raise ValueError(
                "Expected 'edge_attr' with 'edge_key' / 'edge_value' (they map its rows), got None"
            )
        return
    if edge_key is None and edge_value is None:
        raise ValueError(
            "Expected 'edge_key' and/or 'edge_value' with 'edge_attr' (the weights that map "
            "the edge features into the keys and values), got neither"
        )
    check_tensor(edge_attr, "edge_attr")
    if edge_attr.dim() != 2 or edge_attr.shape[0] != graph.num_edges:
        raise ValueError(
            f"Expected 'edge_attr' of shape [{graph.num_edges}, F] (one row per edge of the "
            f"graph), got {list(edge_attr.shape)}"
        )
    f, h = edge_attr.shape[1], q.shape[1]
    for name, w, width in (
        ("edge_key", edge_key, h * q.shape[2]),
        ("edge_value", edge_value, h * v.shape[2]),
    ):
        if w is None:
            continue
        check_tensor(w, name)
        if tuple(w.shape) != (width, f):
            raise ValueError(
                f"Expected '{name}' of shape [{width}, {f}] (the weight of a bias-free "
                f"Linear({f}, {width})), got {list(w.shape)}"
            )
    for name, t in (("edge_attr", edge_attr), ("edge_key", edge_key), ("edge_value", edge_value)):
        if t is not None and (not t.is_floating_point() or t.device != q.device):
            raise TypeError(
                f"Expected '{name}' floating and on {q.device}, got {t.dtype} on {t.device}"
            )


def _edge_lse(q: Tensor, k: Tensor, graph: AttentionGraph, scale: float) -> Tensor:
    """The per-target log-sum-exp of the scores, through the edges (``|E| x H``)."""
    csr, ref = graph.csr, kernels.reference
    acc = acc_dtype(q.dtype)
    s = ref.attention_scores(q.to(acc), k.to(acc), csr.ptr, csr.col, scale)
    return ref.segment_logsumexp(s, segment_ids(csr.ptr, csr.col.numel()), graph.num_dst)


def _sdpa(a: AttentionArgs) -> tuple[Tensor, Tensor | None, Tensor | None]:
    out, weights = sdpa_attention(
        a.q, a.k, a.v, a.graph, a.scale, dropout_p=a.dropout_p, need_weights=a.need_weights
    )
    lse = _edge_lse(a.q, a.k, a.graph, a.scale) if a.return_lse else None
    return out, lse, weights


#: Each backend's entry point: one validated call in, ``(out, lse, weights)`` out.
_BACKENDS: Mapping[str, Callable[[AttentionArgs], tuple[Tensor, Tensor | None, Tensor | None]]] = (
    MappingProxyType(
        {"mp": mp_attention, "sdpa": _sdpa, "fused": fused_attention, "tiles": tiles_attention}
    )
)


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    graph: AttentionGraph,
    *,
    scale: float | None = None,
    score_bias: Tensor | None = None,
    dropout_p: float = 0.0,
    backend: str = "auto",
    return_lse: bool = False,
    need_weights: bool = False,
    edge_attr: Tensor | None = None,
    edge_key: Tensor | None = None,
    edge_value: Tensor | None = None,
) -> Tensor | AttentionOutput:
    r"""Attention of ``q`` over ``k``, ``v`` along the edges of ``graph``.

    The one place a call is validated; the backends (and the kernels'
    operators under them) trust what reaches them.

    Args:
        q (Tensor): ``[N, H, C]`` queries of the targets.
        k (Tensor): ``[M, H, C]`` keys of the sources.
        v (Tensor): ``[M, H, Cv]`` values of the sources.
        graph (AttentionGraph): the edges :math:`j \to i`, built once.
        scale (float, optional): multiplies :math:`q \cdot k`; default
            :math:`1/\sqrt{C}`. (default: :obj:`None`)
        score_bias (Tensor, optional): ``[|E|, H]`` added to the scores, in
            ``graph.edge_index`` order. (default: :obj:`None`)
        dropout_p (float, optional): attention dropout in ``[0, 1]`` (a
            counter-based mask keyed from torch's generator; ``"sdpa"`` uses
            SDPA's own). At 1 every weight is dropped, as ``F.dropout(p=1)``:
            the output is zero, with zero gradients to ``q``, ``k`` and ``v``;
            the weights and the log-sum-exp are those before dropout.
            (default: ``0.0``)
        backend (str, optional): ``"auto"``, ``"mp"``, ``"sdpa"``,
            ``"fused"`` or ``"tiles"``; see :func:`gnnattn.backend_for`. An
            explicit ``"sdpa"`` refuses non-finite ``q``, ``k``, ``v`` (or scores
            that may overflow) with a ``ValueError``; ``"tiles"`` runs ``"fused"``
            on them, which keeps the non-finite rules, and the result's
            ``backend`` says so. (default: ``"auto"``)
        return_lse (bool, optional): also return the per-target log-sum-exp,
            differentiable on every backend. (default: :obj:`False`)
        need_weights (bool, optional): also return the weights.
            (default: :obj:`False`)
        edge_attr (Tensor, optional): ``[|E|, F]`` edge features (in
            ``graph.edge_index`` order) added to the keys and values as in
            PyG's ``TransformerConv``: score ``scale * q_i . (k_j + W_k
            a_ij)``, message ``v_j + W_v a_ij``; ``"fused"`` computes it by
            linearity, without ``|E| x (H*C)`` tensors. (default: :obj:`None`)
        edge_key (Tensor, optional): ``W_k`` ``[H*C, F]``. (default: :obj:`None`)
        edge_value (Tensor, optional): ``W_v`` ``[H*Cv, F]``. (default: :obj:`None`)

    Returns:
        ``out`` ``[N, H, Cv]``, or an :class:`AttentionOutput` when
        ``return_lse`` or ``need_weights``.

    Shapes:
        - **q, k, v:** ``[N, H, C]``, ``[M, H, C]``, ``[M, H, Cv]``
        - **output:** ``[N, H, Cv]``; lse ``[N, H]``; weights ``[|E|, H]``

    Example:
        >>> from gnnattn import AttentionGraph, attention
        >>> q = k = v = torch.randn(5, 2, 4)
        >>> res = attention(q, k, v, AttentionGraph.causal(5), backend="fused", return_lse=True)
        >>> res.out.shape, res.backend, res.lse.shape
        (torch.Size([5, 2, 4]), 'fused', torch.Size([5, 2]))
    """
    _check(q, k, v, graph, score_bias, edge_attr, edge_key, edge_value)
    p = check_probability(dropout_p, "dropout_p")
    # No backend's mask expresses p = 1 (its 1 / (1 - p) rescale is infinite):
    # the call runs without dropout and its output is zeroed below.
    drop_all = p == 1.0
    if drop_all:
        p = 0.0
    if scale is None:
        if q.shape[-1] == 0:
            raise ValueError(
                "Expected 'q' of head width C >= 1 for the default scale 1/sqrt(C), got C = 0 "
                "(pass scale=)"
            )
        scale = 1.0 / math.sqrt(q.shape[-1])
    else:
        # Not under compile, where a layer's scale may be a traced (symbolic) float.
        scale = check_float(scale, "scale", finite=not torch.compiler.is_compiling())
    choice = backend_for(
        q,
        graph,
        backend=backend,
        score_bias=score_bias is not None,
        dropout_p=p,
        edge_attr=edge_attr is not None,
    )
    name = choice.backend
    if backend == "auto" and name == "sdpa" and _compiled_blocks_refuse(q, v, graph):
        name = "fused"
    if name in ("sdpa", "tiles") and not _sdpa_safe(q, k, v, scale):
        # SDPA's CPU kernels turn a NaN query row into zeros, its dense product
        # spreads a NaN value to targets that have no edge from it, and its
        # matrix product's fused multiply-adds turn an overflowing score's
        # inf - inf into an infinity of either sign: each breaks the
        # non-finite contract, which the fused kernels keep. The tiles share a
        # column among the rows of a window, so a NaN value would spread as in
        # SDPA: such a call takes the fused kernel, asked for or not.
        if backend == "sdpa":
            raise ValueError(
                "backend='sdpa' takes finite q, k and v only, whose scores cannot overflow "
                "(SDPA's kernels would zero a NaN query row, spread a NaN value to targets "
                "without its edge, and give an overflowing score either sign); got a "
                "non-finite value or one so large that a score may overflow. Use 'auto' or "
                "'fused', which keep the non-finite rules."
            )
        name = "fused"
    key = draw_key() if p > 0 and name != "sdpa" else None
    args = AttentionArgs(
        q,
        k,
        v,
        graph,
        scale,
        score_bias,
        p,
        key,
        edge_attr,
        edge_key,
        edge_value,
        return_lse,
        need_weights,
    )
    out, lse, weights = _BACKENDS[name](args)
    if drop_all:
        # A product, not zeros: F.dropout(p=1) keeps a NaN of the output, and the
        # gradients to q, k and v are zeros through it.
        out = out * 0.0
    if not (return_lse or need_weights):
        return out
    return AttentionOutput(
        out, lse if return_lse else None, weights if need_weights else None, name
    )


def _compiled_blocks_refuse(q: Tensor, v: Tensor, graph: AttentionGraph) -> bool:
    """Whether a compiled call that ``"auto"`` sent to SDPA on blocks of different
    lengths (the block kernel, :func:`~gnnattn.ops.sdpa.compiled_blocks`) has what
    :func:`backend_for` cannot see and the block kernel does not take: values of
    another width than the queries (the buckets would read every length: a
    recompile per batch). The weights are no such thing: every backend
    recomputes them on the edges."""
    if not torch.compiler.is_compiling():
        return False
    s = graph.structure
    return s is not None and not s.uniform and v.shape[-1] != q.shape[-1]


def _sdpa_safe(q: Tensor, k: Tensor, v: Tensor, scale: float) -> bool:
    """Whether SDPA may take these inputs: all finite, and no score (nor partial sum
    of one) that can overflow the accumulation dtype. Not checked inside
    ``torch.compile`` (the flags are read on the host, a synchronisation on a
    GPU): a compiled call takes SDPA's own handling of such inputs.

    One ``aminmax`` per tensor (a NaN makes both NaN), read in one transfer.
    ``|q_i . k_j|`` and every partial sum of it are at most ``C * max|q| *
    max|k|`` (times ``scale`` where that is over 1), so under the dtype's
    largest number no order of summation overflows and SDPA's scores are
    the reference's to rounding. Past it (float32 inputs of about 1e18 and more)
    the call goes to the fused kernel, which meets the contract anyway.
    """
    if torch.compiler.is_compiling():
        return True
    if q.device.type == "cpu" and _cpu_safe(q, k, v, scale):
        return True
    ends = [torch.stack(torch.aminmax(t)) for t in (q, k, v) if t.numel()]
    if not ends:
        return True
    lo_hi = torch.cat([e.to(torch.float64) for e in ends]).tolist()
    if not all(math.isfinite(x) for x in lo_hi):
        return False
    if not (q.numel() and k.numel()):
        return True
    q_max, k_max = max(map(abs, lo_hi[0:2])), max(map(abs, lo_hi[2:4]))
    bound = q.shape[-1] * q_max * k_max * max(1.0, abs(scale))
    return bound < torch.finfo(acc_dtype(q.dtype)).max


def _cpu_safe(q: Tensor, k: Tensor, v: Tensor, scale: float) -> bool | None:
    """:func:`_sdpa_safe`'s answer when one compiled pass per tensor settles it, else
    ``None``. The 2-norms (:func:`gnnattn.kernels.cpu.host.norm_bound`) bound ``max
    |q|`` and ``max |k|`` from above, so a call under the bound with them is under it
    with the maxima: safe. Past it, or non-finite, the exact rule decides. On a batch
    of molecules the exact rule's ten ops were a twentieth of a GPSConv step."""
    from ..kernels.cpu.host import norm_bound

    nq, nk, nv = norm_bound(q), norm_bound(k), norm_bound(v)
    if not (math.isfinite(nq) and math.isfinite(nk) and math.isfinite(nv)):
        return None
    bound = q.shape[-1] * nq * nk * max(1.0, abs(scale))
    return True if bound < torch.finfo(acc_dtype(q.dtype)).max else None
