"""The one argument structure every backend of :func:`gnnattn.attention` takes.

The operator validates a call once and packs it here; :func:`gnnattn.backend_for`
chooses a backend from :data:`gnnattn.ops.choice.DECLARATIONS`; the backend
(:mod:`.mp`, :mod:`.sdpa`, :mod:`.fused`) reads what it declared it takes.
"""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor

from ..graphs import AttentionGraph

__all__ = ["AttentionArgs"]


class AttentionArgs(NamedTuple):
    """One validated call of :func:`gnnattn.attention`.

    Attributes:
        q: ``[N, H, C]`` queries.
        k: ``[M, H, C]`` keys.
        v: ``[M, H, Cv]`` values.
        graph: the edges.
        scale: multiplies ``q . k``.
        score_bias: ``[|E|, H]`` in ``graph.edge_index`` order, or ``None``.
        dropout_p: attention dropout probability.
        dropout_key: the stream's key ``[seed, offset]`` (int64, CPU) when
            ``dropout_p > 0`` and the backend draws by the stream; else ``None``.
        edge_attr: ``[|E|, F]`` raw edge features, or ``None``.
        edge_key: ``W_k`` ``[H*C, F]``, or ``None``.
        edge_value: ``W_v`` ``[H*Cv, F]``, or ``None``.
        return_lse: the per-target log-sum-exp is asked for.
        need_weights: the weights are asked for.
    """

    q: Tensor
    k: Tensor
    v: Tensor
    graph: AttentionGraph
    scale: float
    score_bias: Tensor | None = None
    dropout_p: float = 0.0
    dropout_key: Tensor | None = None
    edge_attr: Tensor | None = None
    edge_key: Tensor | None = None
    edge_value: Tensor | None = None
    return_lse: bool = False
    need_weights: bool = False
