"""Triton fused sparse attention over a destination-sorted CSR graph.

Implements :func:`gnnattn.kernels.reference.attention_fwd` and
:func:`~gnnattn.kernels.reference.attention_bwd` with the same signatures and
results: ``out_i = sum_{j in N(i)} alpha_ij v_j`` with
``alpha_ij = softmax_j(q_i . k_j * scale + bias_ij)`` per head, then dropped
and rescaled by the counter-based stream of :mod:`gnnattn.kernels.common`,
for ``q`` ``[N, H, C]``, ``k`` ``[M, H, C]``, ``v`` ``[M, H, Cv]`` (``M`` may
differ from ``N``), ``ptr`` int64 ``[N + 1]``, ``col`` int32/int64 ``[E]``, an
optional score ``bias`` ``[E, H]`` (in CSR order), and optional raw edge
features ``edge_attr`` ``[E, F]`` with edge queries ``edge_query``
``[N, H, F]`` (the forward then also returns ``edge_out = sum_j P_ij a_ij``,
the backward takes ``grad_edge_out``).
Inputs may be float16, bfloat16, float32 (float64 too); products and sums run
in :func:`~gnnattn.kernels.common.acc_dtype`, outputs have the input dtype,
``lse`` is float32 (float64).

Layout
------
* :mod:`._random`: the dropout stream in the kernels and its key on the host;
* :mod:`._tiles`: the ``[BLOCK_E, H, W]`` row tiles and the block sizes;
* :mod:`._launch`: what both passes check and prepare before a launch;
* :mod:`.forward`: the forward kernels, their launcher, :func:`attention_fwd`;
* :mod:`.backward`: the ``dq`` and ``dk``/``dv`` kernels, their launcher,
  :func:`attention_bwd`.

Plans and host synchronisation
------------------------------
:func:`plan` (:func:`gnnattn.kernels.chunks.plan`) checks a CSR (``ptr``
well formed, ids in range: the compiled kernels do not bounds-check their
gathers) and cuts it into chunks, once per graph; it is the only place that
reads index values on the host. Given ``plan=`` (and, for the backward,
``csc_plan=`` of the transposed CSR), :func:`attention_fwd` and
:func:`attention_bwd` check shapes, dtypes and devices only (tensor metadata)
and then launch kernels (the launchers ``forward._fwd`` and
``backward._bwd``): no ``.item()``, no copy to the host, no size that depends
on data, so a call never waits for the GPU. The chunk size is the plan's and
does not depend on the head count, the head dims or the dtype, so a caller
keys plans on the CSR alone. Without plans, both functions make them on the
spot (checks included) each call.

Every kernel runs one program per chunk of one target (or, in the ``dk``/``dv``
pass, one source) for **all heads at once**; a segment with more edges than
the plan's chunk is cut into chunks whose partials are merged once per
segment, as FlashDecoding's split-K does (DF-GNN's super-node scheduling is
the same idea for graphs). Every kernel starts with the same prologue,
:func:`~gnnattn.kernels.chunks.chunk_range`.

Options: ``dropout`` is regenerated from its key by every pass, never stored
(:mod:`._random`); ``edge_attr`` is one ``[BLOCK_E, F]`` row per edge (shared
by the heads: ``F`` is padded to ``BLOCK_F`` and masked), read in CSR order
in the forward and the ``dq`` pass and by ``tperm`` in the ``dk``/``dv``
pass, which also gathers ``edge_query_i`` and ``grad_edge_out_i``
(``H * F`` each) per edge. Nothing of size ``E x H x C``
or ``E x H x F`` is made: ``edge_out`` and its gradients are ``[N, H, F]``
and ``[E, F]``.

Head counts and dims are compile-time constants (one compile per layer
shape), so the compiler knows that a row offset ``(j * H + h) * C`` is a
multiple of ``C``'s power-of-two part and can vectorise the gathers of
``C = 24`` or ``40`` rows too; tiles are padded to powers of two and masked.
``scale`` (and the dropout's ``1 / (1 - p)``) is passed in a two-element
tensor of the accumulation dtype: a Python float would reach the kernel as
fp32 and round a float64 scale.

Masks
-----
* ``edges < end``: the tail of the last neighbour block. ``col`` reads 0 there
  (a valid row, so the gathers stay in bounds), the ``k`` / ``v`` loads are
  masked too, and the score is set to ``-inf`` so that ``p = 0``.
* ``cs < C`` / ``cvs < Cv``: the head-dim padding to ``BLOCK_C`` /
  ``BLOCK_CV = next_pow2`` (``C = 24`` runs in a 32-wide tile); padded lanes
  load 0 and add nothing to the dot products (``C = 0`` or ``Cv = 0`` too).
* A destination with no edges, or whose scores are all ``-inf`` (a bias of
  ``-inf`` masks an edge), keeps ``m = -inf``; the kernels then shift by 0,
  as the reference does, so ``p = 0``, ``l = 0``, ``out = 0`` and
  ``lse = -inf``; the backward turns ``lse = -inf`` into ``alpha = 0``.
* NaN: only ``l == 0`` is replaced (by 1, with ``lse = -inf``); a NaN sum
  fails that test and is divided by, so a NaN score or value makes its
  target's ``out`` and ``lse`` NaN, as in the reference.

All offsets are int64: node ids are widened on load and the program id is
widened before use.

Memory traffic per edge
-----------------------
Forward: ``col_j`` (once for all heads), ``k_j`` and ``v_j``
(``H * (C + Cv) * itemsize``, two contiguous rows) and ``bias_j`` (``H``
numbers) if given; per destination ``q_i``, ``out_i`` and ``lse_i``. dq: the
same gathers plus ``dbias`` written. dk/dv: ``q_i`` and ``dout_i`` gathered
(``H * (C + Cv) * itemsize``), ``lse_i``, ``D_i``, the edge's row and its CSR
position. Split chunks add ``O(H * Cv)`` partial numbers each.

Loops are ``while`` loops, as in :mod:`gnnattn.kernels.triton_softmax` (Triton
3.6's interpreter cannot take a loaded value as a ``range`` bound under
NumPy 2).

Tested under ``TRITON_INTERPRET=1`` on CPU against the reference, compiled
for sm_90 offline, and run compiled on an NVIDIA H200 by ``.ci/gpu`` (its
tests, correctness at scale and timings; ``docs/gpu.md``), before the overflow
handling of commit c241f35, which has run under the interpreter only.
"""

from __future__ import annotations

from ..chunks import TritonPlan, plan
from ._random import dropout_bits
from .backward import attention_bwd
from .forward import attention_fwd

__all__ = ["TritonPlan", "attention_bwd", "attention_fwd", "dropout_bits", "plan"]
