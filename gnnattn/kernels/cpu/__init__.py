r"""CPU kernels, compiled with numba: segment softmax and fused sparse attention.

The public functions have the signatures and results of
:mod:`gnnattn.kernels.reference` (``tests/test_kernels_cpu.py`` compares them),
including its rules for ``-inf`` scores, empty and all ``-inf`` segments, NaN
and the dropout stream of :mod:`gnnattn.kernels.common`.

Why numba. The operator is a loop per target over its incoming edges. Torch
ops cannot express that without gathering ``q_i``, ``k_j`` and ``v_j`` for
every edge (``|E| x C`` tensors, which is what makes PyG's ``TransformerConv``
slow), and ``torch.compile`` lowers the per-segment reductions to the same
gathers and scatters. A torch C++ extension would need a compiler on the
user's machine (or a wheel per torch version). numba ships wheels for the
platforms torch supports, compiles these loops with LLVM for the host CPU
(AVX-512 where there is one), runs ``prange`` loops on a thread pool and
caches the machine code on disk (``cache=True``).

The yardstick. Attention's aggregation ``sum_j alpha_ij v_j`` touches memory
exactly as a CSR SpMM (``torch.sparse.mm``) of the adjacency with an
``[M, H*C]`` matrix does: one gathered row per edge. Once ``k`` and ``v`` no
longer fit in the caches every gathered row is a DRAM access, and a pass over
the edges costs about one SpMM per gathered row. The forward gathers 2 rows
per edge (:mod:`.forward`), the backward 4 in two passes
(:mod:`._bwd_kernels`). Measured figures (the yardstick, each pass, the
options) are in ``docs/performance.md``, from
``gnnattn bench --suite limit``.

Layout:

* :mod:`._cache`: one freshness stamp for the compiled-code cache;
* :mod:`._simd`: compile flags, the vectorizable ``exp``, prefetch, row loops;
* :mod:`._random`: the dropout stream, bit for bit that of :mod:`..common`;
* :mod:`._edge`: one edge's score, weight and message, and the options;
* :mod:`.plans`: :func:`plan` (a CSR checked once), the work split, checks;
* :mod:`.softmax`, :mod:`.forward`, :mod:`.backward` (kernels in
  :mod:`._bwd_kernels`): the public kernels;
* :mod:`.op`: the attention operator's entries, over a graph's plans, unchecked;
* :mod:`.blocks`: attention within complete blocks (a batch of small graphs);
* :mod:`.dropout`: dropout of a dense tensor by the same stream, alone or
  after a ReLU.

Arithmetic. Float64 inputs compute in float64, float32 inputs in float32
(accumulators included); float16/bfloat16 are upcast to float32 and the
results cast back (``lse`` stays float32, as in the Triton kernels):
:func:`gnnattn.kernels.common.acc_dtype`. Results are bitwise the same on
every run and every thread count (:mod:`.plans`).

Memory. The backward needs neither the forward's output nor any ``[E, H]``
array (without a score bias or edge features), so a layer's forward +
backward peaks at its ``[N, D]`` tensors plus the indices.

First call. Importing this package compiles nothing. The first call of each
kernel per dtype, index width and combination of options (dropout, edge
features: :mod:`._edge`) compiles it and writes the machine code to
``__pycache__`` (or ``NUMBA_CACHE_DIR``); later processes load it from there.
Any edit of the package's sources recompiles every kernel (:mod:`._cache`).
"""

from __future__ import annotations

from ._random import dropout_bits
from ._simd import exp32
from .backward import (
    attention_bwd,
    attention_bwd_dst,
    attention_bwd_src,
    csr_source_pass,
)
from .blocks import block_attention_bwd, block_attention_fwd
from .dropout import dropout, relu_dropout, relu_dropout_bwd
from .forward import attention_fwd, per_head_edges
from .op import attention_bwd_op, attention_fwd_op
from .plans import (
    CPUPlan,
    csc_plan_tensors,
    csr_plan_tensors,
    plan,
    plan_from_tensors,
    plan_tensors,
)
from .softmax import segment_ptr, segment_softmax_bwd, segment_softmax_fwd

__all__ = [
    "BACKWARD_READS_OUTPUT",
    "CPUPlan",
    "attention_bwd",
    "attention_bwd_op",
    "attention_bwd_dst",
    "attention_bwd_src",
    "attention_fwd",
    "attention_fwd_op",
    "block_attention_bwd",
    "block_attention_fwd",
    "csc_plan_tensors",
    "csr_plan_tensors",
    "dropout",
    "dropout_bits",
    "exp32",
    "per_head_edges",
    "plan",
    "plan_from_tensors",
    "plan_tensors",
    "relu_dropout",
    "relu_dropout_bwd",
    "segment_ptr",
    "segment_softmax_bwd",
    "segment_softmax_fwd",
    "csr_source_pass",
]

#: Whether ``attention_bwd`` reads the forward's ``out`` (and ``edge_out``): no, it
#: recomputes ``D_i`` from the edges, so the operator does not keep them.
BACKWARD_READS_OUTPUT = False
