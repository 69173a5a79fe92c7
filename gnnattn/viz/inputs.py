"""The explorer's inputs, checked: layers, scores, positions, options.

What :func:`gnnattn.viz.explore` is given is checked here, each argument with
a ``TypeError`` or ``ValueError`` naming it, what was expected and what came,
before anything is computed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..checks import check_int
from .convert import check_attention, check_weights
from .layout import LAYOUTS
from .text import check_labels, check_str

__all__: list[str] = []


def as_layers(attentions: Any) -> list[tuple[Any, Any]]:
    # A 2-tuple holding a tensor is one (edge_index, alpha), whatever the other
    # item is: check_attention then names the item that is wrong.
    one = (
        isinstance(attentions, tuple)
        and len(attentions) == 2
        and any(isinstance(t, Tensor) for t in attentions)
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
    if not isinstance(scores, (list, tuple)):
        raise TypeError(
            "Expected 'scores' to be a Tensor or a list with one tensor (or None) per layer, "
            f"got {type(scores).__name__}"
        )
    if len(scores) != count:
        raise ValueError(
            f"Expected 'scores' to hold one tensor (or None) per layer ({count}), got {len(scores)}"
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


def _numbers(value: Any, what: str) -> np.ndarray:
    """``value`` as a float64 array, after checking that it holds real numbers only."""
    if isinstance(value, Tensor):
        value = value.detach().cpu().numpy()
    elif isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, np.ndarray)):
        raise TypeError(f"Expected {what} to be numbers (x, y), got {type(value).__name__}")
    try:
        arr = np.asarray(value)
    except ValueError as err:  # rows of different lengths
        raise ValueError(
            f"Expected {what} to be (x, y) pairs, got rows of different lengths"
        ) from err
    if arr.dtype.kind not in "iuf":
        raise TypeError(f"Expected {what} to hold real numbers, got dtype {arr.dtype}")
    return arr.astype(np.float64)


def _pos_array(pos: Any) -> np.ndarray:
    """``pos`` given as coordinates (not a mapping), as a float64 array of any shape."""
    if not isinstance(pos, (Tensor, np.ndarray, Sequence)) or isinstance(pos, (str, bytes)):
        raise TypeError(
            "Expected 'pos' to be a mapping {node: (x, y)} or [N, 2] coordinates (a tensor, "
            f"array or list), got {type(pos).__name__}"
        )
    return _numbers(pos, "'pos'")


def positions_given(pos: Any, n: int) -> np.ndarray:
    if isinstance(pos, Mapping):
        missing = [v for v in range(n) if v not in pos]
        if missing:
            raise ValueError(
                f"Expected 'pos' to place every node 0..{n - 1}, got none for {missing[:5]}"
            )
        rows = [_numbers(pos[v], f"'pos' of node {v}") for v in range(n)]
        bad = next((v for v in range(n) if rows[v].shape != (2,)), None)
        if bad is not None:
            raise ValueError(
                f"Expected 'pos' of node {bad} to be two numbers (x, y), got shape "
                f"{list(rows[bad].shape)}"
            )
        arr = np.stack(rows) if rows else np.zeros((0, 2))
    else:
        arr = _pos_array(pos)
    if arr.shape != (n, 2):
        raise ValueError(
            f"Expected 'pos' of shape [{n}, 2] (one (x, y) per node), got {list(arr.shape)}"
        )
    if not np.isfinite(arr).all():
        raise ValueError("Expected finite coordinates in 'pos', got NaN or inf")
    return arr


def count_nodes(pairs: list[Any], num_nodes: int | None, tokens: Any, pos: Any) -> int:
    """``num_nodes``, or the most that the edges, ``tokens`` and ``pos`` imply."""
    # Checked before their lengths are read: a generator or an int has none.
    if tokens is not None:
        check_labels(tokens, "tokens")
    given = None if pos is None or isinstance(pos, Mapping) else _pos_array(pos)
    if num_nodes is not None:
        check_int(num_nodes, "num_nodes")
        return num_nodes
    n = max(
        (int(ei.max()) + 1 for ei, _ in pairs if isinstance(ei, Tensor) and ei.numel()),
        default=0,
    )
    n = max(n, len(tokens) if tokens is not None else 0)
    if given is not None and given.ndim:
        n = max(n, given.shape[0])
    return n


def checked_layers(pairs: list[Any], score_list: list[Any], n: int, tokens: Any) -> list[Any]:
    """Every layer's ``(edge_index, alpha, scores)`` checked, scores as ``[E, H]`` or ``None``."""
    checked = []
    for k, ((ei, a), s) in enumerate(zip(pairs, score_list, strict=True)):
        ei, a, _ = check_attention(ei, a, n, tokens, where=f" (layer {k})")
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
    count: int, layout: Any, max_edges: Any, layer_names: Any, title: Any, hops: Any
) -> list[str]:
    """The checks of the page's options; returns the layer names."""
    check_int(max_edges, "max_edges", min=1)
    # Even without 'around': a wrong value is a mistake whether or not it is used.
    check_int(hops, "hops", min=1)
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
