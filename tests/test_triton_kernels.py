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

from gnnattn import kernels  # noqa: E402
from gnnattn.graphs import transpose_csr  # noqa: E402
from gnnattn.kernels import reference as ref  # noqa: E402
from gnnattn.kernels import triton_attention as ta  # noqa: E402
from gnnattn.kernels import triton_ops  # noqa: E402
from gnnattn.kernels import triton_softmax as ts  # noqa: E402
from gnnattn.kernels.chunks import chunk_plan  # noqa: E402

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
    names = ["segment_softmax_fwd", "segment_softmax_bwd", "attention_fwd", "attention_bwd"]
    assert sorted(triton_ops.__all__) == sorted(names)
    for name in names:
        mine = list(inspect.signature(getattr(triton_ops, name)).parameters.values())
        theirs = list(inspect.signature(getattr(ref, name)).parameters.values())
        # Same positional parameters and defaults; extras are keyword-only.
        assert [(p.name, p.default) for p in mine[: len(theirs)]] == [
            (p.name, p.default) for p in theirs
        ]
        assert all(p.kind is p.KEYWORD_ONLY for p in mine[len(theirs) :])


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


def _check_attention(lens, num_src, h, c, cv, dtype, bias, block_e=None) -> None:
    q, k, v, ptr, col, b = _attention_inputs(lens, num_src, h, c, cv, dtype, bias)
    scale = c**-0.5
    out, lse = ta.attention_fwd(q, k, v, ptr, col, scale, b, block_e=block_e)
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
    grads = ta.attention_bwd(q, k, v, out, lse, go, ptr, col, scale, b, block_e=block_e)
    expected = ref.attention_bwd(
        q.float(), k.float(), v.float(), ro, rl, go.float(), ptr, col, scale, _f32(b)
    )
    for name, got, want in zip(("dq", "dk", "dv", "dbias"), grads, expected, strict=True):
        if want is None:
            assert got is None, name
            continue
        assert got.dtype == dtype, name
        # Half-type gradients are sums of many rounded terms: scale the bound.
        scale_tol = 1.0 if dtype == torch.float32 else max(1.0, want.abs().max().item())
        tol = {key: val * scale_tol for key, val in TOL[dtype].items()}
        assert not torch.isnan(got).any(), name
        torch.testing.assert_close(got.float(), want, **tol, msg=name)


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
    # 64-edge blocks (the online softmax rescales 17 times).
    _check_attention([0, 1030, 2, 7], 50, 3, 16, 40, torch.float32, True, block_e=64)


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
    for got, leaf in zip(grads, leaves, strict=True):
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
    for name, x, y in zip(("dq", "dk", "dv", "dbias"), got, want, strict=True):
        torch.testing.assert_close(x, y, **TOL[torch.float64], msg=name)
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


# --------------------------------------------------------------------------- compiled for a GPU

_COMPILE = textwrap.dedent(
    r"""
    import os, re
    os.environ.pop("TRITON_INTERPRET", None)
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from gnnattn.kernels import triton_attention as ta, triton_softmax as ts

    I64 = ("ptr_ptr", "col_ptr", "tptr_ptr", "trow_ptr", "tperm_ptr", "chunk_ptr_ptr",
           "chunk_seg_ptr", "rank_ptr", "split_ptr")
    ACC = ("lse_ptr", "delta_ptr", "scale_ptr") + tuple(
        n for n in ("part_m_ptr", "part_s_ptr", "part_d_ptr", "part_l_ptr", "part_acc_ptr",
                    "part_ptr", "part_k_ptr", "part_v_ptr", "part_a_ptr", "part_b_ptr"))

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
        jobs = [
            (ts._softmax_fwd_chunk, dict(soft, SLOTS=2)), (ts._softmax_fwd_split, soft),
            (ts._softmax_bwd_chunk, dict(soft, SLOTS=1)), (ts._softmax_bwd_split, soft),
            (ts._softmax_combine, dict(ACC=acc, BLOCK_H=8, IS_MAX=True)),
            (ta._attn_fwd, dict(att, HAS_BIAS=True)), (ta._attn_fwd, dict(att, HAS_BIAS=False)),
            (ta._attn_fwd_combine, dict(ACC=acc, BLOCK_H=8, BLOCK_CV=64, H=8, CV=64)),
            (ta._attn_bwd_dq, dict(att, HAS_BIAS=True)),
            (ta._attn_bwd_dkdv, dict(att, HAS_BIAS=True)),
            (ta._sum_split_rows, dict(ACC=acc, W=192, SCALED=True, BLOCK_W=256)),
        ]
        for fn, consts in jobs:
            src = ASTSource(fn=fn, signature=signature(fn, dt, acc_name, consts),
                            constexprs=consts)
            compiled = triton.compile(src, target=target)
            assert "cubin" in compiled.asm, fn
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
    assert "compiled 33" in res.stdout


# --------------------------------------------------------------------------- on a GPU


@requires_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", HALF)
def test_triton_cuda_segment_softmax_large(dtype: torch.dtype) -> None:
    torch.manual_seed(1)
    lens = torch.randint(0, 64, (20_000,)).tolist() + [0, 1, 100_000, 17]
    x, ptr = _scores(lens, 8, dtype)
    y = ts.segment_softmax_fwd(x, ptr)
    _close(y, ref.segment_softmax_fwd(x.float(), ptr), dtype)
    g = torch.randn(x.shape, device=DEV).to(dtype)
    dx = ts.segment_softmax_bwd(y, g, ptr)
    _close(dx, ref.segment_softmax_bwd(y.float(), g.float(), ptr), dtype)


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
