r"""Attention as edges: conversions, drawings and an interactive explorer page.

Every function here takes what :class:`gnnattn.SelfAttentionConv` returns with
``return_attention_weights=True``: ``edge_index`` ``[2, E]`` (``edge_index[0]``
the source :math:`j`, ``edge_index[1]`` the target :math:`i`) and ``alpha``
``[E, H]`` (or ``[E]`` for one head), where

.. math::
    \alpha_{ij}^h = \frac{\exp(s_{ij}^h)}{\sum_{k \in \mathcal{N}(i)} \exp(s_{ik}^h)}.

Values are kept exactly as given: nothing is min-max normalized and nothing is
dropped unless a filter (``min_weight`` / ``top_k``) asks for it, and then the
picture says what was hidden. In the dense picture row :math:`i` is target
:math:`i`, so every row of :func:`attention_matrix` sums to 1 over the edges
that exist.

- :mod:`gnnattn.viz.convert`: edge weights <-> ``[H, N, N]`` matrices, a
  networkx graph, bertviz's format, top-k per target.
- :mod:`gnnattn.viz.draw`: static matplotlib drawings (graph, matrix, both);
  matplotlib is the ``viz`` extra, imported only when a drawing is made.
- :mod:`gnnattn.viz.explorer`: :func:`explore`, one self-contained HTML page
  with the graph and the matrix linked (its inputs are checked in
  :mod:`gnnattn.viz.inputs`, its node colours in :mod:`gnnattn.viz.groups`).
- :mod:`gnnattn.viz.neighbourhood`: one node's neighbourhood of a graph too
  large to read (``around=node, hops=2`` everywhere); :mod:`gnnattn.viz.limits`
  says what is too large.
- :mod:`gnnattn.viz.marks` draws the nodes, arrows and legend of a graph;
  :mod:`gnnattn.viz.text` keeps a user's strings plain text, safe to write.
- :func:`softmax_steps` (the "subtract the max" table of one target) is a
  computation and lives in :mod:`gnnattn.softmax`; it is re-exported here.
"""

from ..softmax import SoftmaxSteps, softmax_steps
from .convert import (
    attention_graph,
    attention_matrix,
    matrix_to_attention,
    to_bertviz,
    top_k_per_target,
)
from .draw import draw_attention, draw_attention_heads, draw_heatmap, draw_side_by_side
from .explorer import AttentionExplorer, explore
from .neighbourhood import Neighbourhood, neighbourhood

__all__ = [
    "AttentionExplorer",
    "SoftmaxSteps",
    "attention_graph",
    "attention_matrix",
    "draw_attention",
    "draw_attention_heads",
    "draw_heatmap",
    "draw_side_by_side",
    "explore",
    "matrix_to_attention",
    "Neighbourhood",
    "neighbourhood",
    "softmax_steps",
    "to_bertviz",
    "top_k_per_target",
]
