"""The Triton kernels behind :func:`gnnattn.kernels.get` for CUDA devices.

The functions of :mod:`gnnattn.kernels.reference`, with the same signatures
and return conventions, implemented by :mod:`gnnattn.kernels.triton_softmax`
(segment softmax) and :mod:`gnnattn.kernels.triton_attention` (fused sparse
attention, with score bias, dropout and raw edge features
``edge_attr`` / ``edge_query``), and :func:`plan`
(:func:`gnnattn.kernels.chunks.plan`): the checked, chunked CSR that a graph
keeps and passes as ``plan=`` / ``csc_plan=``, so that a call makes no host
synchronisation. A plan depends on the CSR alone (not on head counts, head
dims or dtypes). Two differences the reference leaves open:
``attention_fwd`` returns ``lse`` in float32 (float64 for float64 inputs)
whatever the input dtype, and the softmax reduces half-precision inputs in
float32, so float16/bfloat16 results are the float32 ones rounded once.

They also run on CPU tensors when ``TRITON_INTERPRET=1`` is set before this
module is imported (that is how the tests run them without a GPU). Tested
under ``TRITON_INTERPRET=1`` on CPU and compiled on an NVIDIA H200
(``.ci/gpu``; figures in ``docs/gpu.md``).
"""

from __future__ import annotations

from .chunks import TritonPlan, plan, plan_from_tensors, plan_tensors
from .triton_attention import attention_bwd, attention_fwd
from .triton_softmax import segment_softmax_bwd, segment_softmax_fwd

__all__ = [
    "BACKWARD_READS_OUTPUT",
    "TritonPlan",
    "attention_bwd",
    "attention_fwd",
    "plan",
    "plan_from_tensors",
    "plan_tensors",
    "segment_softmax_bwd",
    "segment_softmax_fwd",
]

#: Whether ``attention_bwd`` reads the forward's ``out`` (and ``edge_out``): yes, it
#: takes ``D_i`` from them, so the operator keeps them for it.
BACKWARD_READS_OUTPUT = True
