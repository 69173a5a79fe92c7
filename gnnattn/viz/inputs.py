"""The explorer's inputs, checked: layers, scores, positions, options.

What :func:`gnnattn.viz.explore` is given is checked here, each argument with
a ``TypeError`` or ``ValueError`` naming it, what was expected and what came,
before anything is computed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..checks import check_int
from .convert import check_attention, check_weights
from .layout import LAYOUTS
from .text import check_labels, check_str

__all__: list[str] = []


def as_layers(attentions: Any) -> list[tuple[Tensor, Tensor]]:
    one = (
        isinstance(attentions, tuple)
        and len(attentions) == 2
        and all(isinstance(t, Tensor) for t in attentions)
    )
    if one:
        return [attentions]
    if not isinstance(attentions, (list, tuple)) or not all(
        isinstance(a, (list, tuple)) and len(a) == 2 for a in attentions
    ):
        raise TypeError(
            "Expected 'attentions' to be (edge_index, alpha) or a list of them (one per "
            f"layer), got {type(attentions).__name__}"
        )
    if not attentions:
        raise ValueError("Expected 'attentions' to hold at least one (edge_index, alpha), got []")
    return [(a[0], a[1]) for a in attentions]


def as_scores(scores: Any, count: int) -> list[Tensor | None]:
    if scores is None:
        return [None] * count
    if isinstance(scores, Tensor):
        scores = [scores]
    if not isinstance(scores, (list, tuple)) or len(scores) != count:
        got = len(scores) if isinstance(scores, (list, tuple)) else type(scores).__name__
        raise ValueError(
            f"Expected 'scores' to hold one tensor (or None) per layer ({count}), got {got}"
        )
    return list(scores)


def check_values(alpha: Tensor, scores: Tensor | None, layer: int) -> None:
    check_weights(alpha, f" (layer {layer})")
    if scores is not None:
        if scores.shape != alpha.shape:
            raise ValueError(
                f"Expected 'scores' of layer {layer} shaped like its alpha {list(alpha.shape)}, "
                f"got {list(scores.shape)}"
            )
        # -inf is a masked edge (weight 0); NaN and +inf are mistakes.
        if bool((torch.isnan(scores) | (scores == math.inf)).any()):
            raise ValueError(f"Expected 'scores' of layer {layer} without NaN or +inf")


def positions_given(pos: Any, n: int) -> np.ndarray:
    if isinstance(pos, Mapping):
        missing = [v for v in range(n) if v not in pos]
        if missing:
            raise ValueError(
                f"Expected 'pos' to place every node 0..{n - 1}, got none for {missing[:5]}"
            )
        arr = np.array([pos[v] for v in range(n)], dtype=np.float64).reshape(n, -1)
    else:
        arr = (pos.detach().cpu().numpy() if isinstance(pos, Tensor) else np.asarray(pos)).astype(
            np.float64
        )
    if arr.shape != (n, 2):
        raise ValueError(
            f"Expected 'pos' of shape [{n}, 2] (one (x, y) per node), got {list(arr.shape)}"
        )
    if not np.isfinite(arr).all():
        raise ValueError("Expected finite coordinates in 'pos', got NaN or inf")
    return arr


def count_nodes(pairs: list[Any], num_nodes: int | None, tokens: Any, pos: Any) -> int:
    """``num_nodes``, or the most that the edges, ``tokens`` and ``pos`` imply."""
    if num_nodes is not None:
        check_int(num_nodes, "num_nodes")
        return num_nodes
    n = max(
        (int(ei.max()) + 1 for ei, _ in pairs if isinstance(ei, Tensor) and ei.numel()),
        default=0,
    )
    n = max(n, len(tokens) if tokens is not None else 0)
    if pos is not None and not isinstance(pos, Mapping):
        n = max(n, len(pos))
    return n


def checked_layers(pairs: list[Any], score_list: list[Any], n: int, tokens: Any) -> list[Any]:
    """Every layer's ``(edge_index, alpha, scores)`` checked, scores as ``[E, H]`` or ``None``."""
    checked = []
    for k, ((ei, a), s) in enumerate(zip(pairs, score_list, strict=True)):
        ei, a, _ = check_attention(ei, a, n, tokens)
        if s is not None and not isinstance(s, Tensor):
            raise TypeError(
                f"Expected 'scores' of layer {k} to be a Tensor, got {type(s).__name__}"
            )
        if s is not None:
            s = s.detach().unsqueeze(-1) if s.dim() == 1 else s.detach()
        check_values(a, s, k)
        checked.append((ei, a, s))
    return checked


def check_options(
    count: int, layout: Any, max_edges: Any, layer_names: Any, title: Any
) -> list[str]:
    """The checks of the page's options; returns the layer names."""
    check_int(max_edges, "max_edges", min=1)
    check_str(layout, "layout")
    if layout not in LAYOUTS:
        raise ValueError(
            f"Expected 'layout' to be 'auto', 'circular', 'layered' or 'spring', got {layout!r}"
        )
    check_str(title, "title", optional=True)
    if layer_names is None:
        return [f"layer {k}" for k in range(count)]
    names = check_labels(layer_names, "layer_names")
    if len(names) != count:
        raise ValueError(
            f"Expected 'layer_names' to hold one name per layer ({count}), got {len(names)}"
        )
    return names
