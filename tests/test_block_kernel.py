"""The block kernel: attention within complete blocks (a batch of small graphs).

The CPU kernel (:mod:`gnnattn.kernels.cpu.blocks`) against its torch reference
on awkward blocks (one node, empty blocks, lengths that are no multiple of the
kernel's padding, logits scaled by 1e3), forward and gradients, float64 at
1e-10 and float32 against float64; the op's registration (opcheck); and the
``"sdpa"`` backend's choice of it.
"""

from __future__ import annotations

import numba
import pytest
import torch

from gnnattn import AttentionGraph, attention
from gnnattn.graphs.graph import BLOCK_STARTS
from gnnattn.kernels import COMPILED, reference
from gnnattn.ops.sdpa import BLOCK_KERNEL_MAX

pytestmark = pytest.mark.skipif("cpu" not in COMPILED, reason="numba missing")

LENGTHS = {
    "one_node": [1],
    "ones": [1, 1, 1],
    "empty_blocks": [3, 0, 5, 0],
    "awkward": [15, 1, 9, 17, 2, 33, 8],
    "longest": [BLOCK_KERNEL_MAX, 3, BLOCK_KERNEL_MAX - 1],
    "no_nodes": [],
}


def _ptr(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths, dtype=torch.int64).cumsum(0).tolist()])


def _qkv(n: int, dtype: torch.dtype, scale: float = 1.0, h: int = 3, c: int = 5):
    g = torch.Generator().manual_seed(n)
    return [scale * torch.randn(n, h, c, generator=g, dtype=dtype) for _ in range(3)]


def _cpu():
    from gnnattn.kernels import cpu

    return cpu


@pytest.mark.parametrize("name", list(LENGTHS))
@pytest.mark.parametrize("logit_scale", [1.0, 1e3])
def test_kernel_equals_reference_float64(name: str, logit_scale: float) -> None:
    ptr = _ptr(LENGTHS[name])
    q, k, v = _qkv(int(ptr[-1]), torch.float64, logit_scale)
    out, lse = _cpu().block_attention_fwd(q, k, v, ptr, 0.7)
    want, want_lse = reference.block_attention_fwd(q, k, v, ptr, 0.7)
    torch.testing.assert_close(out, want, atol=1e-10, rtol=0)
    # lse is about 1e3 * |scores| with the scaled logits: a relative tolerance.
    torch.testing.assert_close(lse, want_lse, atol=1e-10, rtol=1e-12)
    grad = torch.randn_like(out)
    got = _cpu().block_attention_bwd(q, k, v, out, lse, grad, ptr, 0.7)
    wants = reference.block_attention_bwd(q, k, v, want, want_lse, grad, ptr, 0.7)
    for a, b in zip(got, wants, strict=True):
        torch.testing.assert_close(a, b, atol=1e-10 * logit_scale, rtol=1e-10)


@pytest.mark.parametrize("name", ["awkward", "longest"])
def test_reference_gradients_are_autograds(name: str) -> None:
    """The reference's backward is the gradient of its forward (so the kernel's is too)."""
    ptr = _ptr(LENGTHS[name])
    q, k, v = (t.requires_grad_() for t in _qkv(int(ptr[-1]), torch.float64))
    out, lse = reference.block_attention_fwd(q, k, v, ptr, 0.3)
    grad = torch.randn_like(out)
    wants = torch.autograd.grad(out, (q, k, v), grad)
    got = reference.block_attention_bwd(q, k, v, out, lse, grad, ptr, 0.3)
    for a, b in zip(got, wants, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


def test_float32_matches_float64() -> None:
    # float32 accumulates in float32 over at most 64 keys of C = 16: a few ulps
    # of the outputs (about 1e-7 relative) per term; 1e-5 leaves room for that.
    ptr = _ptr([40, 7, 64, 1, 23])
    q, k, v = _qkv(int(ptr[-1]), torch.float64, h=4, c=16)
    want = reference.block_attention_fwd(q, k, v, ptr, 0.25)
    grad = torch.randn_like(want[0])
    wants = reference.block_attention_bwd(q, k, v, *want, grad, ptr, 0.25)
    f = [t.float() for t in (q, k, v)]
    out, lse = _cpu().block_attention_fwd(*f, ptr, 0.25)
    got = _cpu().block_attention_bwd(*f, out, lse, grad.float(), ptr, 0.25)
    torch.testing.assert_close(out.double(), want[0], atol=1e-5, rtol=1e-5)
    for a, b in zip(got, wants, strict=True):
        torch.testing.assert_close(a.double(), b, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="numba has one thread")
def test_same_result_on_every_thread_count() -> None:
    ptr = _ptr([31, 2, 50, 9, 9, 17])
    q, k, v = _qkv(int(ptr[-1]), torch.float32, h=4, c=16)
    before = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2, numba.config.NUMBA_NUM_THREADS):
            torch.set_num_threads(threads)
            out, lse = _cpu().block_attention_fwd(q, k, v, ptr, 0.25)
            results.append((out, lse, *_cpu().block_attention_bwd(q, k, v, out, lse, q, ptr, 0.25)))
    finally:
        torch.set_num_threads(before)
    # The forward bitwise; the backward's float32 sums may move in the last bits
    # between calls (see the kernel module's docstring), whatever the thread count.
    for other in results[1:]:
        for a, b in zip(results[0][:2], other[:2], strict=True):
            assert torch.equal(a, b)
        for a, b in zip(results[0][2:], other[2:], strict=True):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", ["one_node", "empty_blocks", "awkward", "no_nodes"])
def test_opcheck(name: str) -> None:
    ptr = _ptr(LENGTHS[name])
    q, k, v = (t.requires_grad_() for t in _qkv(int(ptr[-1]), torch.float64))
    torch.library.opcheck(torch.ops.gnnattn.block_attention_fwd, (q, k, v, ptr, 0.4))
    out, lse = torch.ops.gnnattn.block_attention_fwd(q, k, v, ptr, 0.4)
    saved = (t.detach() for t in (q, k, v, out, lse))
    args = (*saved, torch.randn_like(q), ptr, 0.4)
    torch.library.opcheck(torch.ops.gnnattn.block_attention_bwd, args)


@pytest.mark.parametrize(
    "lengths,kind,blocks",
    [
        ([5, 1, 40], "complete", True),
        ([5, 1, BLOCK_KERNEL_MAX + 1], "complete", False),  # too long: the buckets
        ([5, 1, 40], "causal", False),  # not complete
        ([6, 6], "complete", False),  # equal lengths: one SDPA call, no buckets
    ],
)
def test_sdpa_backend_takes_the_block_kernel(lengths, kind, blocks) -> None:
    """Blocks of different lengths up to ``BLOCK_KERNEL_MAX`` take the kernel, and the
    backend's outputs and gradients are dense attention per block either way."""
    make = AttentionGraph.complete if kind == "complete" else AttentionGraph.causal
    graph = make(lengths=lengths)
    q, k, v = (t.requires_grad_() for t in _qkv(sum(lengths), torch.float64))
    out = attention(q, k, v, graph, scale=0.5, backend="sdpa")
    assert (graph.peek(BLOCK_STARTS) is not None) == blocks
    want = attention(q, k, v, graph, scale=0.5, backend="mp")
    torch.testing.assert_close(out, want, atol=1e-10, rtol=0)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    wants = torch.autograd.grad(want, (q, k, v), grad)
    for a, b in zip(got, wants, strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


@pytest.mark.parametrize(
    "dtype,dropout_p,cv",
    [(torch.bfloat16, 0.0, 5), (torch.float64, 0.3, 5), (torch.float64, 0.0, 4)],
)
def test_what_the_block_kernel_refuses(dtype, dropout_p, cv) -> None:
    """Half precision (numba has none), dropout (SDPA's own stream) and values of
    another width than the keys go to the buckets."""
    graph = AttentionGraph.complete(lengths=[5, 1, 40])
    q, k = _qkv(46, torch.float64)[:2]
    v = torch.randn(46, 3, cv, dtype=torch.float64)
    q, k, v = (t.to(dtype) for t in (q, k, v))
    attention(q, k, v, graph, scale=0.5, backend="sdpa", dropout_p=dropout_p)
    assert graph.peek(BLOCK_STARTS) is None
    assert graph.peek(("sdpa_plan", "cpu")) is not None


def test_weights_and_lse_on_the_block_path() -> None:
    graph = AttentionGraph.complete(lengths=[5, 1, 40])
    q, k, v = _qkv(46, torch.float64)
    got = attention(q, k, v, graph, backend="sdpa", need_weights=True, return_lse=True)
    want = attention(q, k, v, graph, backend="mp", need_weights=True, return_lse=True)
    assert graph.peek(BLOCK_STARTS) is not None
    assert got.backend == "sdpa"
    for a, b in zip(got[:3], want[:3], strict=True):  # out, lse, weights
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)
