r"""What kind of graph an edge set is: complete, causal, a sliding window, batched.

Structured graphs run on dense kernels (SDPA), which are much faster than any
sparse kernel on the same edges, so a graph given as a plain ``edge_index``
is worth recognizing. :func:`detect_structure` does it from the destination
CSR in :math:`O(|E|)`; the builders of :class:`gnnattn.AttentionGraph` know
the structure without detection.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .csr import CSR, _on_host

__all__ = ["KINDS", "Structure", "detect_structure"]

#: The structures a graph can have (``None`` when it has none).
KINDS = ("complete", "causal", "window", "causal_window")


@dataclass(frozen=True)
class Structure:
    r"""A graph made of one structured block per sequence.

    Attributes:
        kind: ``"complete"`` (:math:`j, i` in one sequence), ``"causal"``
            (:math:`j \le i`), ``"window"`` (:math:`|i - j| \le w`) or
            ``"causal_window"`` (:math:`0 \le i - j \le w`).
        lengths: the sequence lengths, in node order (one entry for a single
            sequence; empty for a graph without nodes).
        window: the half-width :math:`w` of a window graph, else 0.
        uniform: whether every block has the same length (one dense call
            covers them all), kept so that a compiled caller reads one flag
            instead of (and guarding on) every length.
        longest: the longest block's length (0 without blocks), kept for the
            same reason.
    """

    kind: str
    lengths: tuple[int, ...]
    window: int = 0
    uniform: bool = field(init=False, repr=False, compare=False)
    longest: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "uniform", len(set(self.lengths)) <= 1)
        # Not max(..., default=0): torch.compile cannot trace it on symbolic lengths.
        object.__setattr__(self, "longest", max(self.lengths) if self.lengths else 0)

    @property
    def num_nodes(self) -> int:
        return sum(self.lengths)

    @property
    def num_edges(self) -> int:
        """Edges of the structure, counted without building them."""
        if self.kind == "complete":
            return sum(t * t for t in self.lengths)
        if self.kind == "causal":
            return sum(t * (t + 1) // 2 for t in self.lengths)
        w = self.window
        total = 0
        for t in self.lengths:
            ww = min(w, max(t - 1, 0))
            # Each of the t rows looks back up to ww, minus the triangle cut
            # at the start of the sequence.
            back = t * ww - ww * (ww + 1) // 2
            total += t + back if self.kind == "causal_window" else t + 2 * back
        return total

    @property
    def is_causal(self) -> bool:
        """Whether every edge :math:`j \\to i` has :math:`j \\le i`."""
        return self.kind in ("causal", "causal_window")

    def causal(self) -> Structure:
        """The structure left once the edges :math:`j > i` are dropped."""
        if self.is_causal:
            return self
        kind = "causal" if self.kind == "complete" else "causal_window"
        return Structure(kind, self.lengths, self.window)

    def __repr__(self) -> str:
        lengths = list(self.lengths) if len(self.lengths) <= 8 else f"{len(self.lengths)} blocks"
        window = f", window={self.window}" if self.kind in ("window", "causal_window") else ""
        return f"Structure({self.kind!r}, lengths={lengths}{window})"


def _detect_window(lo: torch.Tensor, hi: torch.Tensor, i: torch.Tensor) -> Structure | None:
    """A (causal) window graph if the per-target source ranges form a band."""
    n = i.numel()
    w = int((i - lo).max())
    if w == 0 or w >= n - 1:
        return None  # no band: self-loops only, or complete/causal
    if not bool((lo == (i - w).clamp_min(0)).all()):
        return None
    if bool((hi == i).all()):
        return Structure("causal_window", (n,), w)
    if bool((hi == (i + w).clamp_max(n - 1)).all()):
        return Structure("window", (n,), w)
    return None


def _rows_are_ranges(ptr: torch.Tensor, col: torch.Tensor) -> bool:
    """Whether every row has sources that step by exactly 1 (no gaps, no duplicates)."""
    if _on_host(col):
        # One compiled pass that stops at the first row that is not a range (most
        # graphs' first row): six torch ops over every edge cost more on small graphs.
        from ..kernels.cpu.layouts import rows_are_ranges

        return rows_are_ranges(ptr, col)
    if bool((ptr.diff() == 0).any()):
        return False
    step = col[1:] - col[:-1]
    row_start = torch.zeros(col.numel(), dtype=torch.bool, device=col.device)
    row_start[ptr[:-1]] = True
    return bool(((step == 1) | row_start[1:]).all())


def detect_structure(csr: CSR, num_nodes: int, num_src: int | None = None) -> Structure | None:
    """Detect complete / causal / window structure (possibly batched) from the CSR.

    The graph is structured when every target's sources form one contiguous
    range ``[lo_i, hi_i]`` without duplicates; blocks start where
    ``lo_i == i``, and the ranges decide complete vs causal. Bipartite graphs
    (``num_src != num_nodes``) have no structure here.

    Example:
        >>> from gnnattn.graphs import causal_graph, to_csr
        >>> detect_structure(to_csr(causal_graph(4), 4), 4)
        Structure('causal', lengths=[4])
    """
    n, ptr, col = num_nodes, csr.ptr, csr.col
    e = col.numel()
    if n == 0 or e == 0 or (num_src is not None and num_src != n):
        return None
    if not _rows_are_ranges(ptr, col):
        return None
    lo = col[ptr[:-1]]
    hi = col[ptr[1:] - 1]
    i = torch.arange(n, device=col.device)
    starts = lo == i
    if not bool(starts[0]) or bool((lo > i).any()):
        return None
    if not bool(starts[1:].any()):
        window = _detect_window(lo, hi, i)
        if window is not None:
            return window
    block = torch.cumsum(starts.long(), 0) - 1  # (N,) block id of each node
    first = i[starts]  # (B,) first node of each block
    sizes = torch.diff(torch.cat([first, first.new_tensor([n])]))  # (B,)
    last = first + sizes - 1
    if not bool((lo == first[block]).all()):
        return None
    lengths = tuple(int(s) for s in sizes.tolist())
    if bool((hi == last[block]).all()):
        return Structure("complete", lengths)
    if bool((hi == i).all()):
        # Causal blocks cannot be told apart from one longer causal sequence
        # except by where lo resets, which `starts` already used.
        return Structure("causal", lengths)
    return None
