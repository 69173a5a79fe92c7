"""The Triton kernels against their torch references.

Without a GPU these run through Triton's interpreter (``TRITON_INTERPRET=1``,
set by the root ``conftest.py`` before any kernel module is imported) on CPU
tensors, at small sizes and with small blocks: the interpreter pays per
program and per op. Every test name contains ``triton`` (``pytest -k triton``).
The ``cuda`` tests run the same kernels compiled, at larger sizes, and skip
cleanly without a device.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap

import pytest
import torch

pytest.importorskip("triton")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from gnnattn import kernels  # noqa: E402
from gnnattn.graphs import transpose_csr  # noqa: E402
from gnnattn.kernels import reference as ref  # noqa: E402
from gnnattn.kernels import triton_attention as ta  # noqa: E402
from gnnattn.kernels import triton_ops  # noqa: E402
from gnnattn.kernels import triton_softmax as ts  # noqa: E402
from gnnattn.kernels.chunks import chunk_plan  # noqa: E402
from gnnattn.kernels.common import Dropout, dropout_bits, dropout_keep  # noqa: E402
from gnnattn.kernels.triton_attention import _launch as ta_launch  # noqa: E402
from gnnattn.kernels.triton_attention import _random as ta_random  # noqa: E402
from gnnattn.kernels.triton_attention import _tiles as ta_tiles  # noqa: E402
from gnnattn.kernels.triton_attention import backward as ta_bwd  # noqa: E402
from gnnattn.kernels.triton_attention import forward as ta_fwd  # noqa: E402

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
DEV = "cuda" if torch.cuda.is_available() else "cpu"

# float32 results agree to rounding; half types to one rounding of the output.
TOL = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
    torch.float64: dict(atol=1e-10, rtol=1e-10),
}
HALF = [torch.float32, torch.float16, torch.bfloat16]


def _ptr(lens: list[int], device: str = DEV) -> torch.Tensor:
    return torch.tensor([0, *lens], device=device).cumsum(0)


def _graph(lens: list[int], num_src: int, device: str = DEV):
    """CSR pointers and sorted random sources for the given in-degrees."""
    ptr = _ptr(lens, device)
    cols = [torch.sort(torch.randint(0, num_src, (n,))).values for n in lens]
    col = torch.cat(cols) if cols else torch.zeros(0, dtype=torch.long)
    return ptr, col.to(device)


def _f32(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.float()


def _close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    assert not torch.isnan(actual).any()
    torch.testing.assert_close(actual.float(), expected.float(), **TOL[dtype])


# --------------------------------------------------------------------------- API


def test_triton_ops_has_the_reference_api() -> None:
    names = ["segment_softmax_fwd", "segment_softmax_bwd", "attention_fwd", "attention_bwd", "plan"]
    extras = ["BACKWARD_READS_OUTPUT", "TritonPlan", "plan_from_tensors", "plan_tensors"]
    assert sorted(triton_ops.__all__) == sorted([*names, *extras])
    for name in names:
        mine = list(inspect.signature(getattr(triton_ops, name)).parameters.values())
        theirs = list(inspect.signature(getattr(ref, name)).parameters.values())
        # Same parameters, kinds and defaults; extras are keyword-only.
        assert [(p.name, p.kind, p.default) for p in mine[: len(theirs)]] == [
            (p.name, p.kind, p.default) for p in theirs
        ]
        assert all(p.kind is p.KEYWORD_ONLY for p in mine[len(theirs) :])
    assert triton_ops.plan is ta.plan


def test_triton_ops_is_what_kernels_get_returns_for_cuda() -> None:
    assert kernels.get(torch.device("cuda")) is triton_ops


# --------------------------------------------------------------------------- segment softmax

# Lengths 0, 1, 17 and 1000+ (split across programs at the interpreter's
# default CHUNK of 256 rows), then a few more, an empty one last.
LENS = [0, 1, 17, 1030, 3, 2, 40, 0]


def _scores(lens: list[int], h: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    ptr = _ptr(lens)
    e = int(ptr[-1])
    x = (torch.randn(e, h, device=DEV) * 4).to(dtype)
    # With LENS: one -inf entry in the long segment, the segment of length 17
    # all -inf in head 1, and the segment of length 1 all -inf.
    if len(lens) > 3 and lens[3] > 5:
        x[ptr[3] + 5, 0] = float("-inf")
    if h > 1 and len(lens) > 2:
        x[ptr[2] : ptr[3], 1] = float("-inf")
    x[0, :] = float("-inf")
    return x, ptr


@pytest.mark.parametrize("dtype", HALF)
def test_triton_segment_softmax_matches_reference(dtype: torch.dtype) -> None:
    x, ptr = _scores(LENS, 3, dtype)
    e = x.shape[0]
    # Blocks pinned (a GPU picks bigger ones by default): 16 x 8 = 128-row
    # chunks, so the 1030-row segment is split into 9 and the combine runs.
    blocks = dict(block_e=16, split_blocks=8)
    plan = chunk_plan(ptr, e, 16 * 8)
    assert plan.chunk_ptr.diff().max() == 9

    y = ts.segment_softmax_fwd(x, ptr, **blocks)
    assert y.dtype == dtype and y.shape == x.shape
    y_ref = ref.segment_softmax_fwd(x.float(), ptr)
    _close(y, y_ref, dtype)
    # -inf entries and all -inf segments: weight exactly 0.
    assert y[ptr[3] + 5, 0] == 0 and (y[ptr[2] : ptr[3], 1] == 0).all() and (y[0] == 0).all()
    # Every non-empty segment with a finite score sums to 1.
    sums = ref.segment_sum(y.float(), ref.segment_ids(ptr, e), len(LENS))
    finite = ref.segment_max(x.float(), ref.segment_ids(ptr, e), len(LENS)) > float("-inf")
    torch.testing.assert_close(sums[finite], torch.ones_like(sums[finite]), **TOL[dtype])

    g = torch.randn(x.shape, device=DEV).to(dtype)
    dx = ts.segment_softmax_bwd(y, g, ptr, **blocks)
    assert dx.dtype == dtype
    _close(dx, ref.segment_softmax_bwd(y.float(), g.float(), ptr), dtype)
    assert (dx[0] == 0).all() and (dx[ptr[2] : ptr[3], 1] == 0).all()
    # The defaults (whatever this machine picks) give the same numbers.
    _close(ts.segment_softmax_fwd(x, ptr), y_ref, dtype)


def test_triton_segment_softmax_grad_equals_autograd_of_reference() -> None:
    x, ptr = _scores([5, 0, 300, 9], 2, torch.float64)
    xr = x.clone().requires_grad_()
    g = torch.randn_like(x)
    (ref.segment_softmax_fwd(xr, ptr) * g).sum().backward()
    y = ts.segment_softmax_fwd(x, ptr, block_e=16, split_blocks=4)  # 300 rows: 5 chunks
    dx = ts.segment_softmax_bwd(y, g, ptr, block_e=16, split_blocks=4)
    torch.testing.assert_close(dx, xr.grad, **TOL[torch.float64])


def test_triton_segment_softmax_wider_than_a_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Over 65535 blocks of 16 columns (CUDA's grid y) no kernel launches: the torch
    reference takes them, forward and backward, with the kernel's results."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a launch with grid y over 65535")

    wide = 65535 * 16 + 1
    x = torch.randn(3, wide, device=DEV)
    ptr = _ptr([2, 1])
    g = torch.randn(3, wide, device=DEV)
    for name in ("_softmax_fwd_chunk", "_softmax_bwd_chunk"):
        monkeypatch.setattr(ts, name, refuse)
    y = ts.segment_softmax_fwd(x, ptr)
    _close(y, ref.segment_softmax_fwd(x, ptr), torch.float32)
    _close(ts.segment_softmax_bwd(y, g, ptr), ref.segment_softmax_bwd(y, g, ptr), torch.float32)
    assert not ts._too_wide(wide - 1)  # the widest a launch takes runs the kernels


def test_triton_segment_softmax_one_segment_holding_everything() -> None:
    # 700 rows in 16-row chunks of 2 blocks: 22 chunks, so the partials are
    # combined in two blocks of BLOCK_P = 16.
    x = torch.randn(700, 5, device=DEV)
    ptr = _ptr([700])
    y = ts.segment_softmax_fwd(x, ptr, block_e=16, split_blocks=2)
    _close(y, torch.softmax(x, 0), torch.float32)
    g = torch.randn_like(x)
    dx = ts.segment_softmax_bwd(y, g, ptr, block_e=16, split_blocks=2)
    _close(dx, ref.segment_softmax_bwd(y, g, ptr), torch.float32)


def test_triton_segment_softmax_split_equals_unsplit() -> None:
    x, ptr = _scores([120, 1, 77], 4, torch.float32)
    whole = ts.segment_softmax_fwd(x, ptr, block_e=128, split_blocks=1)
    split = ts.segment_softmax_fwd(x, ptr, block_e=16, split_blocks=1)  # 8 chunks
    _close(split, whole, torch.float32)


def test_triton_segment_softmax_more_heads_than_one_head_block() -> None:
    # H = 20 > BLOCK_H = 16: two head blocks, the second one padded.
    x, ptr = _scores([4, 0, 33], 20, torch.float32)
    y = ts.segment_softmax_fwd(x, ptr, block_e=16, split_blocks=1)
    _close(y, ref.segment_softmax_fwd(x, ptr), torch.float32)
    g = torch.randn_like(x)
    dx = ts.segment_softmax_bwd(y, g, ptr, block_e=16, split_blocks=1)
    _close(dx, ref.segment_softmax_bwd(y, g, ptr), torch.float32)


def test_triton_segment_softmax_1d_and_empty_inputs() -> None:
    ptr = _ptr([3, 0, 20])
    x = torch.randn(23, device=DEV)
    y = ts.segment_softmax_fwd(x, ptr)
    assert y.shape == (23,)
    _close(y, ref.segment_softmax_fwd(x, ptr), torch.float32)
    g = torch.randn_like(x)
    _close(ts.segment_softmax_bwd(y, g, ptr), ref.segment_softmax_bwd(y, g, ptr), torch.float32)
    # No edges at all, and no segments at all.
    empty = torch.zeros(0, 2, device=DEV)
    assert ts.segment_softmax_fwd(empty, _ptr([0, 0])).shape == (0, 2)
    assert ts.segment_softmax_fwd(empty, torch.zeros(1, dtype=torch.long, device=DEV)).numel() == 0


def test_triton_segment_softmax_rejects_bad_input() -> None:
    with pytest.raises(TypeError, match="ptr"):
        ts.segment_softmax_fwd(torch.randn(4, 2), torch.tensor([0, 4], dtype=torch.int32))
    with pytest.raises(ValueError, match="block_e"):
        ts.segment_softmax_fwd(torch.randn(4, 2), torch.tensor([0, 4]), block_e=24)


# --------------------------------------------------------------------------- attention


def _attention_inputs(lens, num_src, h, c, cv, dtype, bias: bool):
    ptr, col = _graph(lens, num_src)
    n, e = len(lens), col.numel()
    q = torch.randn(n, h, c, device=DEV).to(dtype)
    k = torch.randn(num_src, h, c, device=DEV).to(dtype)
    v = torch.randn(num_src, h, cv, device=DEV).to(dtype)
    b = None
    if bias:
        b = torch.randn(e, h, device=DEV).to(dtype)
        b[ptr[2] : ptr[3], 0] = float("-inf")  # destination 2 fully masked in head 0
        if len(lens) > 4 and lens[4] > 1:
            b[ptr[4] + 1, h - 1] = float("-inf")  # one masked edge
    return q, k, v, ptr, col, b


def _check_attention(lens, num_src, h, c, cv, dtype, bias, block_e=None, split_blocks=None):
    q, k, v, ptr, col, b = _attention_inputs(lens, num_src, h, c, cv, dtype, bias)
    scale = c**-0.5
    blocks = dict(block_e=block_e, split_blocks=split_blocks)
    out, lse = ta.attention_fwd(q, k, v, ptr, col, scale, b, **blocks)
    assert out.dtype == dtype and out.shape == (len(lens), h, cv)
    assert lse.dtype == torch.float32 and lse.shape == (len(lens), h)
    ro, rl = ref.attention_fwd(q.float(), k.float(), v.float(), ptr, col, scale, _f32(b))
    _close(out, ro, dtype)
    assert torch.equal(torch.isfinite(lse), torch.isfinite(rl))
    fin = torch.isfinite(rl)
    torch.testing.assert_close(lse[fin], rl[fin], atol=1e-4, rtol=1e-4)
    assert (out[0] == 0).all()  # destination 0 has no edges
    assert lse[0].eq(float("-inf")).all()

    go = torch.randn(out.shape, device=DEV).to(dtype)
    grads = ta.attention_bwd(q, k, v, out, lse, go, ptr, col, scale, b, **blocks)
    expected = ref.attention_bwd(
        q.float(), k.float(), v.float(), ro, rl, go.float(), ptr, col, scale, _f32(b)
    )
    _close_grads(grads, expected, dtype)


GRADS = ("dq", "dk", "dv", "dbias")


def _close_grads(grads, expected, dtype: torch.dtype, **tol_override) -> None:
    """All four gradients: ``None`` where the reference's are, else close to them."""
    assert len(grads) == len(expected) == 4
    for name, got, want in zip(GRADS, grads, expected, strict=True):
        if want is None:
            assert got is None, name
            continue
        assert got.dtype == dtype and got.shape == want.shape, name
        # Half-type gradients are sums of many rounded terms: scale the bound.
        scale_tol = (
            1.0 if dtype in (torch.float32, torch.float64) else max(1.0, want.abs().max().item())
        )
        tol = {key: val * scale_tol for key, val in {**TOL[dtype], **tol_override}.items()}
        assert not torch.isnan(got).any(), name
        torch.testing.assert_close(got.to(want.dtype), want, **tol, msg=name)


# Destination 0 empty, 1 with one edge, 2 with 17 (fully masked by the bias),
# 3 with 40, 4 with 5; 11 sources (M != N).
ALENS = [0, 1, 17, 40, 5, 3]


@pytest.mark.parametrize("c", [16, 24, 64, 128])
@pytest.mark.parametrize("bias", [False, True])
def test_triton_attention_matches_reference_float32(c: int, bias: bool) -> None:
    _check_attention(ALENS, 11, 2, c, c, torch.float32, bias)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_triton_attention_matches_reference_half(dtype: torch.dtype) -> None:
    _check_attention(ALENS, 11, 2, 24, 24, dtype, True)


def test_triton_attention_value_dim_differs_and_long_segment() -> None:
    # Cv != C, three heads, and one destination with 1000+ neighbours walked in
    # 64-edge blocks by one program (the online softmax rescales 17 times).
    _check_attention(
        [0, 1030, 2, 7], 50, 3, 16, 40, torch.float32, True, block_e=64, split_blocks=32
    )


def test_triton_attention_single_destination_holding_everything() -> None:
    q, k, v, ptr, col, _ = _attention_inputs([200], 9, 1, 16, 16, torch.float32, False)
    out, _ = ta.attention_fwd(q, k, v, ptr, col, 0.25)
    # A complete bipartite view of the same computation: dense softmax over
    # the 200 gathered keys (with repeats).
    s = (k[col, 0] @ q[0, 0]) * 0.25
    _close(out[0, 0], torch.softmax(s, 0) @ v[col, 0], torch.float32)


def test_triton_attention_grad_equals_autograd_of_reference() -> None:
    q, k, v, ptr, col, b = _attention_inputs(ALENS, 7, 2, 24, 24, torch.float64, True)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, b)]
    ro, rl = ref.attention_fwd(*leaves[:3], ptr, col, 0.3, leaves[3])
    go = torch.randn_like(ro)
    (ro * go).sum().backward()
    out, lse = ta.attention_fwd(q, k, v, ptr, col, 0.3, b)
    grads = ta.attention_bwd(q, k, v, out, lse, go, ptr, col, 0.3, b)
    assert len(grads) == 4
    for got, leaf in zip(grads, leaves, strict=True):
        torch.testing.assert_close(got, leaf.grad, **TOL[torch.float64])


def test_triton_attention_lse_grad_equals_autograd_of_reference() -> None:
    """A loss of out and lse: the lse gradient enters D_i on the host (D_i - grad_lse_i)."""
    q, k, v, ptr, col, _ = _attention_inputs(ALENS, 7, 2, 24, 24, torch.float64, False)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    ro, rl = ref.attention_fwd(*leaves, ptr, col, 0.3)
    go, gl = torch.randn_like(ro), torch.randn_like(rl)
    ((ro * go).sum() + (rl.nan_to_num(neginf=0.0) * gl).sum()).backward()
    out, lse = ta.attention_fwd(q, k, v, ptr, col, 0.3)
    grads = ta.attention_bwd(q, k, v, out, lse, go, ptr, col, 0.3, grad_lse=gl)
    for got, leaf in zip(grads[:3], leaves, strict=True):
        torch.testing.assert_close(got, leaf.grad, **TOL[torch.float64])


def test_triton_attention_backward_is_deterministic() -> None:
    q, k, v, ptr, col, b = _attention_inputs([3, 30, 1, 12], 4, 2, 16, 16, torch.float32, True)
    out, lse = ta.attention_fwd(q, k, v, ptr, col, 0.25, b)
    go = torch.randn_like(out)
    first = ta.attention_bwd(q, k, v, out, lse, go, ptr, col, 0.25, b)
    csc = transpose_csr(ptr, col, k.shape[0])
    second = ta.attention_bwd(q, k, v, out, lse, go, ptr, col, 0.25, b, csc=csc)
    for a, c in zip(first, second, strict=True):
        assert torch.equal(a, c)


def test_triton_attention_without_edges() -> None:
    q = torch.randn(3, 2, 16, device=DEV)
    k = v = torch.randn(4, 2, 16, device=DEV)
    ptr = torch.zeros(4, dtype=torch.long, device=DEV)
    col = torch.zeros(0, dtype=torch.long, device=DEV)
    out, lse = ta.attention_fwd(q, k, v, ptr, col, 0.25)
    assert (out == 0).all() and (lse == float("-inf")).all()
    dq, dk, dv, db = ta.attention_bwd(q, k, v, out, lse, torch.ones_like(out), ptr, col, 0.25)
    assert (dq == 0).all() and (dk == 0).all() and (dv == 0).all() and db is None


def test_triton_attention_split_hubs_in_both_passes() -> None:
    """A target with 150 in-edges and a source with most out-edges, in 8-edge chunks.

    float64 so that the merge of partials (max, sum, accumulator; dq, dk, dv
    sums) is checked to rounding of the reference.
    """
    torch.manual_seed(5)
    lens = [0, 150, 3, 0, 9, 1, 40]
    ptr = _ptr(lens)
    e = int(ptr[-1])
    # Source 0 is a hub: most edges come from it (out-degree ~ 150).
    col = torch.where(torch.rand(e) < 0.7, 0, torch.randint(0, 6, (e,))).to(DEV)
    n, m, h, c = len(lens), 6, 3, 24
    q, k, v = (torch.randn(x, h, c, dtype=torch.float64, device=DEV) for x in (n, m, m))
    b = torch.randn(e, h, dtype=torch.float64, device=DEV)
    b[ptr[1] : ptr[1] + 64, 0] = float("-inf")  # whole first chunks of the hub all -inf
    blocks = dict(block_e=4, split_blocks=2)  # 8-edge chunks: 19 for the hub target
    assert chunk_plan(ptr, e, 8).chunk_ptr.diff().max() == 19
    csc = transpose_csr(ptr, col, m)
    assert chunk_plan(csc.ptr, e, 8).chunk_ptr.diff().max() > 10
    out, lse = ta.attention_fwd(q, k, v, ptr, col, 0.3, b, **blocks)
    ro, rl = ref.attention_fwd(q, k, v, ptr, col, 0.3, b)
    torch.testing.assert_close(out, ro, **TOL[torch.float64])
    torch.testing.assert_close(lse, rl, **TOL[torch.float64])
    go = torch.randn_like(out)
    got = ta.attention_bwd(q, k, v, out, lse, go, ptr, col, 0.3, b, csc=tuple(csc), **blocks)
    want = ref.attention_bwd(q, k, v, ro, rl, go, ptr, col, 0.3, b)
    _close_grads(got, want, torch.float64)
    # Split or not, the same result.
    whole = ta.attention_fwd(q, k, v, ptr, col, 0.3, b, block_e=4, split_blocks=64)
    torch.testing.assert_close(whole[0], out, **TOL[torch.float64])


def test_triton_attention_rejects_bad_input() -> None:
    q, k, v, ptr, col, _ = _attention_inputs([2, 3], 4, 1, 16, 16, torch.float32, False)
    with pytest.raises(ValueError, match="non-decreasing from 0 to the number of edges 5"):
        ta.attention_fwd(q, k, v, torch.tensor([0, 2, 4], device=DEV), col, 0.5)
    with pytest.raises(ValueError, match=r"'col' ids in \[0, 4\), got \[0, 4\]"):
        ta.attention_fwd(q, k, v, ptr, torch.tensor([0, 1, 2, 3, 4], device=DEV), 0.5)
    with pytest.raises(ValueError, match="'col' ids"):
        ta.attention_fwd(q, k, v, ptr, torch.tensor([0, -1, 2, 3, 1], device=DEV), 0.5)
    with pytest.raises(ValueError, match="on the device of 'q'"):
        ta.attention_fwd(q, k.to("meta"), v, ptr, col, 0.5)
    out, lse = ta.attention_fwd(q, k, v, ptr, col, 0.5)
    with pytest.raises(ValueError, match="'csc'"):
        ta.attention_bwd(q, k, v, out, lse, out, ptr, col, 0.5, csc=(ptr, col, col))
    with pytest.raises(ValueError, match="non-decreasing"):
        ts.segment_softmax_fwd(torch.randn(5, 2, device=DEV), torch.tensor([0, 3, 6], device=DEV))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_triton_segment_softmax_awkward_segments(dtype: torch.dtype) -> None:
    """Segments of exactly a block, a block + 1, all -inf across a split, a first
    chunk all -inf, empty targets between long ones, fp16 logits near 6e4."""
    lens = [16, 17, 0, 70, 0, 0, 50, 33, 1]
    ptr = _ptr(lens)
    x = (torch.randn(int(ptr[-1]), 2, device=DEV) * 3).to(dtype)
    x[ptr[3] : ptr[4], 0] = float("-inf")  # 70 rows, 3 chunks, all -inf in head 0
    x[ptr[6] : ptr[6] + 32, 1] = float("-inf")  # the first 32-row chunk of 50 all -inf
    x[ptr[7] : ptr[8], 1] = 6e4 - torch.arange(33, device=DEV).to(dtype) * 16  # near fp16 max
    blocks = dict(block_e=16, split_blocks=2)  # 32-row chunks
    y = ts.segment_softmax_fwd(x, ptr, **blocks)
    _close(y, ref.segment_softmax_fwd(x.float(), ptr), dtype)
    assert (y[ptr[3] : ptr[4], 0] == 0).all() and (y[ptr[6] : ptr[6] + 32, 1] == 0).all()
    g = torch.randn(x.shape, device=DEV).to(dtype)
    dx = ts.segment_softmax_bwd(y, g, ptr, **blocks)
    _close(dx, ref.segment_softmax_bwd(y.float(), g.float(), ptr), dtype)


# --------------------------------------------------------------------------- dropout stream


# As the attention kernels do: compiled, an int argument equal to 1 is made a
# constant (and ``seed_lo.to`` then fails on a Python int).
@triton.jit(do_not_specialize=["n", "seed_lo", "seed_hi", "offset"])
def _bits_kernel(counter_ptr, out_ptr, n, seed_lo, seed_hi, offset, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    counter = tl.load(counter_ptr + offs, mask=mask, other=0)
    bits = ta.dropout_bits(counter + offset, seed_lo, seed_hi)
    tl.store(out_ptr + offs, bits.to(tl.int64), mask=mask)


@pytest.mark.parametrize(
    "seed",
    [0, 1, 0xFFFF_FFFF, (1 << 31) + 5, (1 << 62) + 0x9E37_79B9, (1 << 63) - 1],
    ids=["zero", "one", "lo-all-ones", "lo-high-bit", "both-halves", "max"],
)
def test_triton_dropout_bits_equal_common_bitwise(seed: int) -> None:
    """The kernels' uint32 hash is the torch stream bit for bit, counters past 2**32 included."""
    torch.manual_seed(seed % 1000)
    edge = torch.tensor([0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**32 + 1, 2**33 + 7, 2**40])
    counter = torch.cat([edge, torch.randint(0, 2**45, (200,))]).to(DEV)
    for offset in (0, 2**31 - 1):
        drop = Dropout(0.3, seed, offset)
        lo, hi, off, _ = ta_random._dropout_args(drop)
        assert all(-(2**31) <= x < 2**31 for x in (lo, hi, off))  # always an i32 argument
        out = torch.empty_like(counter)
        _bits_kernel[(triton.cdiv(counter.numel(), 64),)](
            counter, out, counter.numel(), lo, hi, off, BLOCK=64
        )
        assert torch.equal(out, dropout_bits(drop, counter)), (seed, offset)


# --------------------------------------------------------------------------- options

# Targets 0 and 4 isolated, 1 with one edge, 2 a hub of 70 in-edges (5 chunks
# of 16), 5 fully masked in head 0; source 0 a hub of most edges (split in the
# dk/dv pass); 7 sources, 3 heads, C = 12, Cv = 5: no power of two anywhere.
OLENS = [0, 1, 70, 3, 0, 9, 2]
OBLOCKS = dict(block_e=8, split_blocks=2)  # 16-edge chunks
DROP = Dropout(0.4, seed=(1 << 62) + 0x9E37_79B9, offset=12_345)


def _option_inputs(dtype, lens=OLENS, m=7, h=3, c=12, cv=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    ptr = _ptr(lens)
    e = int(ptr[-1])
    hub = torch.rand(e, generator=gen) < 0.6
    col = torch.where(hub, 0, torch.randint(0, m, (e,), generator=gen)).to(DEV)
    n = len(lens)
    q, k, v = (torch.randn(s, h, d, generator=gen) for s, d in ((n, c), (m, c), (m, cv)))
    b = torch.randn(e, h, generator=gen)
    if len(lens) > 5:
        b[ptr[5] : ptr[6], 0] = float("-inf")
    q, k, v, b = (t.to(DEV, dtype) for t in (q, k, v, b))
    return q, k, v, ptr, col, b


def _run_options(q, k, v, ptr, col, scale, kw, blocks, ref_dtype):
    """Triton forward and backward, and the reference's at ``ref_dtype``.

    The reference's backward takes the kernel's ``out``: ``D_i = dout_i . out_i``
    is then the same on both sides (for half inputs ``out`` is rounded to the
    input dtype, as FlashAttention's is, and that rounding, times the size of
    ``dout``, would otherwise dominate every gradient's error).
    """
    drop = kw["dropout"]
    out, lse = ta.attention_fwd(q, k, v, ptr, col, scale, kw["bias"], dropout=drop, **blocks)
    go = torch.randn(out.shape, device=DEV).to(q.dtype)
    grads = ta.attention_bwd(
        q, k, v, out, lse, go, ptr, col, scale, kw["bias"], dropout=drop, **blocks
    )
    b2 = kw["bias"].to(ref_dtype) if kw["bias"] is not None else None
    q2, k2, v2, go2 = (t.to(ref_dtype) for t in (q, k, v, go))
    ro, rl = ref.attention_fwd(q2, k2, v2, ptr, col, scale, b2, dropout=drop)
    o2 = out.to(ref_dtype)
    want = ref.attention_bwd(q2, k2, v2, o2, rl, go2, ptr, col, scale, b2, dropout=drop)
    return (out, lse, grads), (ro, rl, want)


@pytest.mark.parametrize(
    "dropout, logit",
    [(False, 1.0), (True, 1.0), (True, 1e3)],
    ids=["bias", "dropout", "dropout-logits-x1e3"],
)
def test_triton_attention_options_match_reference_float64(dropout: bool, logit: float) -> None:
    q, k, v, ptr, col, b = _option_inputs(torch.float64)
    kw = dict(bias=b, dropout=DROP if dropout else None)
    scale = logit * 12**-0.5
    (out, lse, grads), (ro, rl, want) = _run_options(q, k, v, ptr, col, scale, kw, OBLOCKS, q.dtype)
    torch.testing.assert_close(out, ro, **TOL[torch.float64])
    torch.testing.assert_close(lse, rl, **TOL[torch.float64])
    assert (out[0] == 0).all() and (out[4] == 0).all() and lse[4].eq(float("-inf")).all()
    _close_grads(grads, want, torch.float64, atol=1e-10 * logit)
    if kw["dropout"] is not None:
        # Some weights were dropped (else the test would not test dropout).
        keep = dropout_keep(DROP, col.numel(), 3, torch.device(DEV))
        assert 0.3 < keep.float().mean() < 0.9


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_triton_attention_options_half_match_float32_reference(dtype: torch.dtype) -> None:
    """Half inputs against the float32 reference on the same (rounded) inputs: the
    outputs to TOL[dtype] (one rounding), gradients to TOL[dtype] times their size."""
    q, k, v, ptr, col, b = _option_inputs(dtype)
    kw = dict(bias=b, dropout=DROP)
    (out, lse, grads), (ro, rl, want) = _run_options(
        q, k, v, ptr, col, 12**-0.5, kw, OBLOCKS, torch.float32
    )
    assert out.dtype == dtype and lse.dtype == torch.float32
    _close(out, ro, dtype)
    fin = torch.isfinite(rl)
    assert torch.equal(torch.isfinite(lse), fin)
    torch.testing.assert_close(lse[fin], rl[fin], atol=1e-4, rtol=1e-4)
    _close_grads(grads, want, dtype)


def test_triton_attention_options_on_tiny_and_empty_graphs() -> None:
    # One node attending to itself.
    q, k, v, ptr, col, b = _option_inputs(torch.float64, lens=[1], m=1, h=1, c=3, cv=2)
    kw = dict(bias=b, dropout=Dropout(0.5, 3, 0))
    (out, lse, grads), (ro, rl, want) = _run_options(q, k, v, ptr, col, 0.5, kw, {}, q.dtype)
    torch.testing.assert_close(out, ro, **TOL[torch.float64])
    _close_grads(grads, want, torch.float64)
    # No edges: zero outputs and gradients of the right shapes, lse = -inf.
    q, k, v, ptr, col, b = _option_inputs(torch.float64, lens=[0, 0, 0], m=2, h=2, c=4, cv=3)
    out, lse = ta.attention_fwd(q, k, v, ptr, col, 0.5, b, dropout=DROP)
    assert (out == 0).all() and (lse == float("-inf")).all()
    grads = ta.attention_bwd(q, k, v, out, lse, out + 1, ptr, col, 0.5, b, dropout=DROP)
    assert [tuple(g.shape) for g in grads] == [(3, 2, 4), (2, 2, 4), (2, 2, 3), (0, 2)]
    assert all((g == 0).all() for g in grads)
    # No targets at all.
    q0 = q[:0]
    out, lse = ta.attention_fwd(q0, k, v, ptr[:1], col, 0.5)
    assert out.shape == (0, 2, 3) and lse.shape == (0, 2)


def test_triton_attention_zero_head_dims() -> None:
    """C = 0 (every score 0 plus the bias) and Cv = 0 (an empty output) run the kernels."""
    q, k, v, ptr, col, b = _option_inputs(torch.float64, lens=[0, 3, 5], m=4, h=2, c=0, cv=3)
    kw = dict(bias=b, dropout=None)
    (out, lse, grads), (ro, rl, want) = _run_options(q, k, v, ptr, col, 1.0, kw, {}, q.dtype)
    torch.testing.assert_close(out, ro, **TOL[torch.float64])
    _close_grads(grads, want, torch.float64)
    q, k, v, ptr, col, b = _option_inputs(torch.float64, lens=[0, 3, 5], m=4, h=2, c=4, cv=0)
    kw = dict(bias=b, dropout=DROP)
    (out, lse, grads), (ro, rl, want) = _run_options(q, k, v, ptr, col, 1.0, kw, {}, q.dtype)
    torch.testing.assert_close(lse, rl, **TOL[torch.float64])
    _close_grads(grads, want, torch.float64)


def test_triton_attention_backward_without_out_recomputes_it() -> None:
    q, k, v, ptr, col, b = _option_inputs(torch.float64, lens=[2, 0, 20, 5])
    opts = dict(dropout=DROP, **OBLOCKS)
    out, lse = ta.attention_fwd(q, k, v, ptr, col, 0.3, b, **opts)
    go = torch.randn_like(out)
    with_out = ta.attention_bwd(q, k, v, out, lse, go, ptr, col, 0.3, b, **opts)
    without = ta.attention_bwd(q, k, v, None, lse, go, ptr, col, 0.3, b, **opts)
    for x, y in zip(with_out, without, strict=True):
        torch.testing.assert_close(x, y, **TOL[torch.float64])


# --------------------------------------------------------------------------- plans


def test_triton_plans_give_the_results_of_unplanned_calls() -> None:
    """A plan of the same chunk gives the same numbers, bit for bit; int32 ids too."""
    q, k, v, ptr, col, b = _option_inputs(torch.float32)
    n, m = q.shape[0], k.shape[0]
    opts = dict(dropout=DROP)
    plan = ta.plan(ptr, col, m, chunk=16)
    assert isinstance(plan, triton_ops.TritonPlan) and plan.chunk == 16
    assert plan.chunks.chunk_ptr.diff().max() == 5  # the hub target is split
    out, lse = ta.attention_fwd(q, k, v, ptr, col, 0.3, b, **opts, **OBLOCKS)
    got = ta.attention_fwd(q, k, v, ptr, col, 0.3, b, **opts, plan=plan, block_e=8)
    assert torch.equal(got[0], out) and torch.equal(got[1], lse)
    go = torch.randn_like(out)
    want = ta.attention_bwd(q, k, v, out, lse, go, ptr, col, 0.3, b, **opts, **OBLOCKS)
    # The graph object's int32 transposed CSR, with its plan.
    csc32 = transpose_csr(ptr, col, m, dtype=torch.int32)
    plan32 = ta.plan(csc32.ptr, csc32.row, n, chunk=16)
    grads = ta.attention_bwd(
        q, k, v, out, lse, go, ptr, col, 0.3, b, **opts, csc=tuple(csc32), plan=plan,
        csc_plan=plan32, block_e=8,
    )  # fmt: skip
    for name, x, y in zip(GRADS, grads, want, strict=True):
        assert torch.equal(x, y), name
    # Default plans are the default no-plan calls, int32 sources included.
    p32 = ta.plan(ptr, col.int(), m)
    a = ta.attention_fwd(q, k, v, ptr, col.int(), 0.3, b, **opts, plan=p32)
    assert torch.equal(a[0], ta.attention_fwd(q, k, v, ptr, col, 0.3, b, **opts)[0])
    # The softmax takes the same plan.
    x = torch.randn(col.numel(), 3, device=DEV)
    y = ts.segment_softmax_fwd(x, ptr, plan=plan)
    _close(y, ref.segment_softmax_fwd(x, ptr), torch.float32)
    g = torch.randn_like(x)
    dx = ts.segment_softmax_bwd(y, g, ptr, plan=plan)
    _close(dx, ref.segment_softmax_bwd(y, g, ptr), torch.float32)


def test_triton_plans_are_checked_once_and_must_fit() -> None:
    q, k, v, ptr, col, b = _option_inputs(torch.float32, lens=[2, 3])
    m = k.shape[0]
    with pytest.raises(ValueError, match=r"'col' ids in \[0, 7\)"):
        ta.plan(ptr, col + 7, m)
    with pytest.raises(ValueError, match="non-decreasing"):
        ta.plan(torch.tensor([0, 3, 2], device=DEV), col, m)
    with pytest.raises(ValueError, match="'chunk'"):
        ta.plan(ptr, col, m, chunk=0)
    plan = ta.plan(ptr, col, m)
    with pytest.raises(ValueError, match="'plan' of a CSR with 2 rows, 5 edges and ids below 7"):
        ta.attention_fwd(q, k, v, ptr, col, 0.5, plan=ta.plan(ptr, col, m + 1))
    with pytest.raises(ValueError, match="'split_blocks' or 'plan'"):
        ta.attention_fwd(q, k, v, ptr, col, 0.5, plan=plan, split_blocks=2)
    with pytest.raises(TypeError, match="'plan'"):
        ta.attention_fwd(q, k, v, ptr, col, 0.5, plan=ref.plan(ptr, col, m))
    out, lse = ta.attention_fwd(q, k, v, ptr, col, 0.5, plan=plan)
    csc = transpose_csr(ptr, col, m)
    csc_plan = ta.plan(csc.ptr, csc.row, q.shape[0])
    with pytest.raises(ValueError, match="'csc' with 'csc_plan'"):
        ta.attention_bwd(q, k, v, out, lse, out, ptr, col, 0.5, plan=plan, csc_plan=csc_plan)
    with pytest.raises(ValueError, match="'csc_plan' of a CSR with 7 rows"):
        ta.attention_bwd(q, k, v, out, lse, out, ptr, col, 0.5, csc=tuple(csc), csc_plan=plan)
    with pytest.raises(ValueError, match="'bias' of shape"):
        ta.attention_fwd(q, k, v, ptr, col, 0.5, b[:, :1], plan=plan)
    with pytest.raises(ValueError, match="'dropout'"):
        ta.attention_fwd(q, k, v, ptr, col, 0.5, dropout=Dropout(1.0, 0, 0), plan=plan)
    with pytest.raises(ValueError, match="'plan' of a CSR with 1 segments"):
        ts.segment_softmax_fwd(torch.randn(3, 2, device=DEV), ptr[:2] * 0 + 3, plan=plan)


# Everything a call given its plans runs between the checks and the kernels.
_NO_SYNC = (
    (ta_fwd, "_fwd"), (ta_bwd, "_bwd"), (ta_bwd, "_sum_split"), (ta_tiles, "_blocks"),
    (ta_tiles, "_block_e"), (ta_tiles, "_tile"), (ta_launch, "_scales"),
    (ta_launch, "_check_plan"), (ta_launch, "_check_inputs"), (ta_launch, "_check_csc"),
    (ta_random, "_dropout_args"), (ta_random, "_int32_bits"),
)  # fmt: skip


def test_triton_planned_path_reads_nothing_on_the_host() -> None:
    """The CPU half of the no-sync check (the CUDA test runs it for real): no
    function a planned call runs converts a tensor to a Python value."""
    import ast

    banned_methods = {"item", "tolist", "cpu", "numpy", "nonzero", "any", "all", "unique"}
    banned_calls = {"int", "bool", "float", "check_ptr", "check_index", "plan", "_plan_now"}
    for mod, name in _NO_SYNC:
        tree = ast.parse(textwrap.dedent(inspect.getsource(getattr(mod, name))))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            if isinstance(f, ast.Attribute):
                assert f.attr not in banned_methods, (name, ast.unparse(node))
            elif isinstance(f, ast.Name) and f.id in banned_calls:
                # float("-inf") is a constant, not a read.
                constant = all(isinstance(a, ast.Constant) for a in node.args)
                assert f.id == "float" and constant, (name, ast.unparse(node))
    # The entry points reach those checks only without plans.
    for fn in (ta.attention_fwd, ta.attention_bwd):
        src = inspect.getsource(fn)
        assert src.count("_plan_now(") == src.count("if plan is None") + src.count(
            "csc_plan is None"
        )


# --------------------------------------------------------------------------- NaN


def test_triton_segment_softmax_nan_propagates_like_the_reference() -> None:
    x = torch.tensor([[float("nan")], [1.0], [2.0], [0.5], [1.5]], device=DEV)
    ptr = _ptr([3, 2])
    y = ts.segment_softmax_fwd(x, ptr)
    assert torch.isnan(y[:3]).all() and not torch.isnan(y[3:]).any()
    torch.testing.assert_close(y, ref.segment_softmax_fwd(x, ptr), equal_nan=True)
    # Across a split: 40 rows in chunks of 16, one NaN in the last chunk, head 1 only.
    x = torch.randn(43, 2, device=DEV)
    x[38, 1] = float("nan")
    ptr = _ptr([40, 3])
    y = ts.segment_softmax_fwd(x, ptr, block_e=16, split_blocks=1)
    torch.testing.assert_close(y, ref.segment_softmax_fwd(x, ptr), equal_nan=True)
    assert torch.isnan(y[:40, 1]).all() and not torch.isnan(y[:, 0]).any()
    g = torch.randn_like(x)
    dx = ts.segment_softmax_bwd(y, g, ptr, block_e=16, split_blocks=1)
    torch.testing.assert_close(dx, ref.segment_softmax_bwd(y, g, ptr), equal_nan=True)


def test_triton_attention_nan_propagates_like_the_reference() -> None:
    """A NaN score (in a split hub too) or value makes the target's output NaN, never finite."""
    q, k, v, ptr, col, b = _option_inputs(torch.float64)
    b[ptr[2] + 40, 1] = float("nan")  # the hub target, head 1, in its third chunk
    b[ptr[3], 2] = float("nan")  # target 3, head 2
    v[6, 0, 1] = float("nan")  # a value, head 0
    kw = dict(bias=b, dropout=DROP)
    (out, lse, grads), (ro, rl, want) = _run_options(q, k, v, ptr, col, 0.4, kw, OBLOCKS, q.dtype)
    assert torch.isnan(out[2, 1]).all() and torch.isnan(lse[2, 1]) and torch.isnan(out[3, 2]).all()
    torch.testing.assert_close(out, ro, **TOL[torch.float64], equal_nan=True)
    torch.testing.assert_close(lse, rl, **TOL[torch.float64], equal_nan=True)
    for name, x, y in zip(GRADS, grads, want, strict=True):
        torch.testing.assert_close(x, y, **TOL[torch.float64], equal_nan=True, msg=name)


# --------------------------------------------------------------------------- compiled for a GPU

_COMPILE = textwrap.dedent(
    r"""
    import os, re
    os.environ.pop("TRITON_INTERPRET", None)
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from gnnattn.kernels import triton_softmax as ts
    from gnnattn.kernels.common import MIX_MUL1, MIX_MUL2
    from gnnattn.kernels.triton_attention import backward as tab, forward as taf

    # An integer constant of the TTIR, scalar or splat: its value and type.
    CONSTANT = re.compile(r"arith\.constant (?:dense<)?(-?\d+)>? : (?:tensor<[\dx]+)?(i\d+)")

    I64 = ("ptr_ptr", "col_ptr", "tptr_ptr", "trow_ptr", "tperm_ptr", "chunk_ptr_ptr",
           "chunk_seg_ptr", "rank_ptr", "split_ptr")
    ACC = ("lse_ptr", "delta_ptr", "scale_ptr") + tuple(
        n for n in ("part_m_ptr", "part_s_ptr", "part_d_ptr", "part_l_ptr", "part_acc_ptr",
                    "part_ptr", "part_k_ptr", "part_v_ptr", "part_a_ptr", "part_b_ptr",
                    "part_eo_ptr", "part_eq_ptr"))

    def signature(fn, dt, acc, consts):
        sig = {}
        for name in fn.arg_names:
            if name in consts:
                sig[name] = "constexpr"
            elif name in I64:
                sig[name] = "*i64"
            elif name in ACC:
                sig[name] = "*" + acc
            elif name.endswith("_ptr"):
                sig[name] = "*" + dt
            else:
                sig[name] = "i32"
        return sig

    target = GPUTarget("cuda", 90, 32)
    count = 0
    for dt, acc_name, acc in (("fp32", "fp32", tl.float32), ("bf16", "fp32", tl.float32),
                              ("fp64", "fp64", tl.float64)):
        soft = dict(ACC=acc, BLOCK_E=256, BLOCK_H=8, CHUNK=2048)
        att = dict(ACC=acc, BLOCK_E=8, BLOCK_H=8, BLOCK_C=32, BLOCK_CV=64, CHUNK=256,
                   H=8, C=24, CV=64)
        # "every" with the edge features too (F = 5 in an 8-wide tile).
        edge = dict(F=5, BLOCK_F=8, HAS_EA=True, HAS_EQ=True)
        every = dict(att, HAS_BIAS=True, HAS_DROPOUT=True, **edge)
        none = dict(att, HAS_BIAS=False, HAS_DROPOUT=False, F=0, BLOCK_F=1, HAS_EA=False,
                    HAS_EQ=False)
        bwd_every, bwd_none = dict(every, HAS_GE=True), dict(none, HAS_GE=False)
        jobs = [
            (ts._softmax_fwd_chunk, dict(soft, SLOTS=2)), (ts._softmax_fwd_split, soft),
            (ts._softmax_bwd_chunk, dict(soft, SLOTS=1)), (ts._softmax_bwd_split, soft),
            (ts._softmax_combine, dict(ACC=acc, BLOCK_H=8, IS_MAX=True)),
            (taf._attn_fwd, every), (taf._attn_fwd, none),
            (taf._attn_fwd_combine, dict(ACC=acc, BLOCK_H=8, BLOCK_CV=64, H=8, CV=64, F=5,
                                          BLOCK_F=8, HAS_EA=True)),
            (tab._attn_bwd_dq, bwd_every), (tab._attn_bwd_dkdv, bwd_every),
            (tab._attn_bwd_dkdv, bwd_none),
            (tab._sum_split_rows, dict(ACC=acc, W=192, SCALED=True, BLOCK_W=256)),
        ]
        for fn, consts in jobs:
            src = ASTSource(fn=fn, signature=signature(fn, dt, acc_name, consts),
                            constexprs=consts)
            compiled = triton.compile(src, target=target)
            assert "cubin" in compiled.asm, fn
            if consts.get("HAS_DROPOUT"):
                # The hash multiplies by uint32 constants built from int32 bit
                # patterns: never an int64 constant (the product would be int64).
                # Read from the constants' types, not their text, which differs
                # between Triton releases (3.6 keeps a scalar "-2073254261 : i32",
                # 3.9 splats it to "dense<-2073254261> : tensor<8x8xi32>").
                types = {}
                for value, ty in CONSTANT.findall(compiled.asm["ttir"]):
                    types.setdefault(int(value) % (1 << 32), set()).add(ty)
                for mul in (MIX_MUL1, MIX_MUL2):
                    assert types.get(mul) == {"i32"}, (fn, hex(mul), types.get(mul))
            if dt == "fp64":
                # No fp32 scalar may reach a float64 kernel (it would round).
                head = re.search(r"tt\.func public @\w+\(([^)]*)\)", compiled.asm["ttir"])
                assert head is not None and "f32" not in head.group(1), (fn, head)
            count += 1
    print("compiled", count)
    """
)


def test_triton_kernels_compile_for_sm90() -> None:
    """Lower every kernel to a cubin for sm_90 (H100/H200) without a GPU.

    The interpreter runs the kernels as NumPy and accepts things the compiler
    rejects (loop-carried type changes, int64 loop bounds); this catches those.
    It says nothing about speed or about results on the device.
    """
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run(
        [sys.executable, "-c", _COMPILE], env=env, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "compiled 36" in res.stdout


# --------------------------------------------------------------------------- on a GPU


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", HALF)
def test_triton_cuda_segment_softmax_large(dtype: torch.dtype) -> None:
    torch.manual_seed(1)
    lens = torch.randint(0, 64, (20_000,)).tolist() + [0, 1, 100_000, 17]
    x, ptr = _scores(lens, 8, dtype)
    y = ts.segment_softmax_fwd(x, ptr)
    # Against float64: a float32 reference summing a 100,000-entry segment in
    # one order is itself off by ~1e-4 relative (seen on an H200).
    _close(y, ref.segment_softmax_fwd(x.double(), ptr), dtype)
    g = torch.randn(x.shape, device=DEV).to(dtype)
    dx = ts.segment_softmax_bwd(y, g, ptr)
    _close(dx, ref.segment_softmax_bwd(y.double(), g.double(), ptr), dtype)


@requires_cuda
@pytest.mark.gpu
def test_triton_cuda_segment_softmax_int64_offsets() -> None:
    # E * H = 2**31 + 2**24 elements: offsets past int32 must stay right.
    e, h = (1 << 28) + (1 << 21), 8
    x = torch.randn(e, h, device="cuda", dtype=torch.float16)
    ptr = torch.arange(4097, device="cuda") * e // 4096
    y = ts.segment_softmax_fwd(x, ptr)
    tail = slice(int(ptr[-2]), e)  # the last segment lies past 2**31 elements
    torch.testing.assert_close(
        y[tail].float(), torch.softmax(x[tail].float(), 0), **TOL[torch.float16]
    )


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("c", [16, 24, 64, 128])
def test_triton_cuda_attention_large(dtype: torch.dtype, c: int) -> None:
    torch.manual_seed(2)
    lens = [0, 1, 17, 3000, *torch.randint(0, 48, (4000,)).tolist()]
    _check_attention(lens, 3000, 4, c, c, dtype, True)


@requires_cuda
@pytest.mark.gpu
def test_triton_cuda_planned_calls_never_sync() -> None:
    """Given plans, forward, backward and softmax run under sync debug mode "error";
    a new dropout seed compiles nothing."""
    torch.manual_seed(3)
    lens = [0, 1, 700, *torch.randint(0, 40, (3000,)).tolist()]
    q, k, v, ptr, col, b = _option_inputs(torch.bfloat16, lens=lens, m=2000, h=4, c=64, cv=64)
    n, m = q.shape[0], k.shape[0]
    csc = transpose_csr(ptr, col, m)
    plan, csc_plan = ta.plan(ptr, col, m), ta.plan(csc.ptr, csc.row, n)
    x = torch.randn(col.numel(), 4, device=DEV)

    def step(seed: int) -> None:
        drop = Dropout(0.1, seed, 0)
        opts = dict(dropout=drop, plan=plan)
        out, lse = ta.attention_fwd(q, k, v, ptr, col, 0.125, b, **opts)
        ta.attention_bwd(
            q, k, v, out, lse, torch.ones_like(out), ptr, col, 0.125, b, **opts,
            csc=tuple(csc), csc_plan=csc_plan,
        )  # fmt: skip
        y = ts.segment_softmax_fwd(x, ptr, plan=plan)
        ts.segment_softmax_bwd(y, x, ptr, plan=plan)

    step(1)  # compiles
    torch.cuda.synchronize()
    kernels = (ta_fwd._attn_fwd, ta_bwd._attn_bwd_dq, ta_bwd._attn_bwd_dkdv)
    compiled = [sum(len(c[0]) for c in fn.device_caches.values()) for fn in kernels]
    torch.cuda.set_sync_debug_mode("error")
    try:
        step((1 << 62) + 0x9E37_79B9)  # another seed: both halves, high bits set
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert [sum(len(c[0]) for c in fn.device_caches.values()) for fn in kernels] == compiled


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_cuda_attention_options_large(dtype: torch.dtype) -> None:
    torch.manual_seed(4)
    lens = [0, 1, 17, 3000, *torch.randint(0, 48, (4000,)).tolist()]
    q, k, v, ptr, col, b = _option_inputs(dtype, lens=lens, m=3000, h=4, c=64, cv=64)
    kw = dict(bias=b, dropout=DROP)
    (out, lse, grads), (ro, rl, want) = _run_options(
        q, k, v, ptr, col, 0.125, kw, {}, torch.float32
    )
    _close(out, ro, dtype)
    # float32 gradients: sums over a 3000-edge hub, a few ulps of their size each.
    _close_grads(
        grads, want, dtype, **(dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else {})
    )


def test_plan_tables_are_16_byte_aligned_whatever_the_graph_size() -> None:
    """The packed plan's views start at multiples of 16 bytes for every parity of N and
    E // CHUNK: Triton keys a compiled kernel on its pointers' 16-byte alignment, so
    otherwise each graph size could compile the kernels anew."""
    from gnnattn.kernels.chunks import DEFAULT_CHUNK, plan_from_tensors, plan_tensors

    for n in (5, 6):
        for e in (3 * DEFAULT_CHUNK, 4 * DEFAULT_CHUNK + 1):
            ptr = torch.linspace(0, e, n + 1).long()
            col = torch.zeros(e, dtype=torch.long)
            got = plan_from_tensors(ptr, col, 1, plan_tensors(ptr, col, 1)).chunks
            want = chunk_plan(ptr, e, DEFAULT_CHUNK, 1)
            for name in ("chunk_ptr", "chunk_seg", "split", "rank"):
                t = getattr(got, name)
                assert t.data_ptr() % 16 == 0, (n, e, name)
                assert torch.equal(t, getattr(want, name)), (n, e, name)
