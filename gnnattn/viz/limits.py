"""How large a picture can be and still be read, and the message when a graph is larger.

The limits, shared by the drawings and the explorer page:

- :data:`MAX_DRAWN_NODES` (100): a static graph drawing refuses more nodes,
  at once, before any layout is computed (1,797 nodes took 12.7 s and showed
  a blot). Node circles need about 0.3 inch each to hold a label; 100 of them
  already fill a 16-inch figure.
- :data:`MAX_DRAWN_EDGES` (500): a static drawing with more edges to show is
  cut to the ``k`` heaviest incoming edges of every target, the largest
  ``k`` that fits, and its legend says so (each arrow costs matplotlib about
  3 ms, and 500 overlapping arrows are already hard to follow).
- :data:`MAX_MATRIX_NODES` (200): above it a matrix cell is under 2.3 px in
  the explorer's 460-px panel (and under 0.06 inch in a 12-inch figure), so
  the explorer shows a note instead of the matrix and
  :func:`~gnnattn.viz.draw_heatmap` refuses.

The way to look at a larger graph is one node's neighbourhood: ``around=node,
hops=2`` in :func:`~gnnattn.viz.explore` and in every drawing (see
:mod:`gnnattn.viz.neighbourhood`); the explorer also draws the whole graph.
"""

from __future__ import annotations

__all__ = ["MAX_DRAWN_EDGES", "MAX_DRAWN_NODES", "MAX_MATRIX_NODES", "check_readable"]

MAX_DRAWN_NODES = 100
MAX_DRAWN_EDGES = 500
MAX_MATRIX_NODES = 200


def check_readable(n: int, limit: int, what: str) -> None:
    """Raise a ``ValueError`` saying how to look at ``n`` nodes when ``n > limit``.

    Example:
        >>> check_readable(1797, 100, "draw_attention")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: Expected at most 100 nodes for draw_attention to be readable, got 1,797: ...
    """
    if n > limit:
        raise ValueError(
            f"Expected at most {limit} nodes for {what} to be readable, got {n:,}: draw one "
            "node's neighbourhood with around=node, hops=2 (or a subgraph, e.g. from "
            "torch_geometric.utils.k_hop_subgraph), or explore the whole graph with "
            "gnnattn.viz.explore"
        )
