"""The numba CPU kernels against their pure-torch references, on awkward sizes."""

import numpy as np
import pytest
import torch

from gnnattn.graphs import transpose_csr
from gnnattn.kernels import cpu
from gnnattn.kernels import reference as ref

F64, F32 = torch.float64, torch.float32

# float64: the kernels and the reference add the same terms in other orders,
# so only rounding differs, far below 1e-10 for these sizes.
# float32: the kernels are compared with the float64 reference on the same
# (float32-representable) inputs, so the tolerance is the float32 error
# itself. Sums of up to 5000 terms and length-C dot products give relative
# errors ~1e-6; a score s is only known to ~|s| * C * 2^-24, and exp turns
# that absolute error into a relative error of the weights, so the bound
# grows with the largest |score| (hundreds to thousands with 1e3 logits).
# 2e-6 per unit of score is ~10x the largest error these cases show.
TOL64 = 1e-10
TOL32 = 2e-6


def csr_of(deg):
    deg = torch.as_tensor(deg, dtype=torch.long)
    ptr = torch.zeros(deg.numel() + 1, dtype=torch.long)
    torch.cumsum(deg, 0, out=ptr[1:])
    return ptr


# name: (in-degree of each target, number of sources M, source of most edges or None)
CASES = {
    "ragged": ([3, 0, 1, 17, 5, 0, 2, 9, 11], 13, None),  # isolated targets, N != M
    "one node": ([1], 1, None),
    "no edges": ([0, 0, 0], 4, None),  # E = 0
    "empty graph": ([], 3, None),  # N = 0, E = 0
    "hub": ([5000, 1, 2, 3, 0, 7], 40, None),  # one target with 5000 in-edges
    "source hub": ([40] * 130, 60, 7),  # source 7 has ~5000 out-edges
    "duplicates": ([6, 2, 5], 4, 3),  # targets whose edges all come from one source
    "bipartite": ([4, 4, 4], 101, None),  # many more sources than targets
}


def make(case, dtype, heads=3, c=13, cv=7, logits=1.0, seed=0):
    """q, k, v, ptr, col for ``case``, with a duplicated edge where there are enough."""
    deg, m, hub = CASES[case]
    g = torch.Generator().manual_seed(seed)
    ptr = csr_of(deg)
    n, e = len(deg), int(ptr[-1])
    col = torch.randint(0, m, (e,), generator=g)
    if hub is not None:
        col[torch.rand(e, generator=g) < 0.97] = hub
    if e > 4:
        col[1] = col[0]  # a duplicate edge (both targets are target 0 in every case)
    q = torch.randn(n, heads, c, generator=g, dtype=dtype) * logits
    k = torch.randn(m, heads, c, generator=g, dtype=dtype)
    v = torch.randn(m, heads, cv, generator=g, dtype=dtype)
    return q, k, v, ptr, col


def assert_close(got, want, tol):
    """``|got - want| <= tol * max(1, max |want|)``, elementwise, same shape."""
    assert got.shape == want.shape
    assert torch.isfinite(got).all()
    scale = max(1.0, float(want.abs().max())) if want.numel() else 1.0
    err = float((got.double() - want.double()).abs().max()) if want.numel() else 0.0
    assert err <= tol * scale, (err, tol * scale)


def f64(*ts):
    return [None if t is None else t.double() for t in ts]


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("logits", [1.0, 1e3])
def test_attention_matches_reference(dtype, case, with_bias, logits):
    q, k, v, ptr, col = make(case, dtype, logits=logits)
    scale = 0.3
    bias = None
    if with_bias:
        bias = torch.randn(col.numel(), q.shape[1], dtype=dtype)
        bias[::4, 0] = float("-inf")  # masked edges
        if ptr.numel() > 4:
            bias[ptr[3] : ptr[4], 1] = float("-inf")  # a target whose scores are all -inf
    out, lse = cpu.attention_fwd(q, k, v, ptr, col, scale, bias)
    q64, k64, v64, b64 = f64(q, k, v, bias)
    out_r, lse_r = ref.attention_fwd(q64, k64, v64, ptr, col, scale, b64)
    s = ref.attention_scores(q64, k64, ptr, col, scale)
    tol = TOL64 if dtype == F64 else TOL32 * (1.0 + (float(s.abs().max()) if s.numel() else 0))

    assert out.dtype == dtype and lse.dtype == dtype
    assert_close(out, out_r, tol)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(lse_r))
    empty = torch.isneginf(lse_r)
    assert (out[empty.unsqueeze(-1).expand_as(out)] == 0).all()
    assert_close(lse[~empty], lse_r[~empty], tol)
    if with_bias and ptr.numel() > 4 and ptr[4] > ptr[3]:
        assert torch.isneginf(lse[3, 1])  # the all -inf target

    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=dtype)
    got = cpu.attention_bwd(q, k, v, out, lse, g, ptr, col, scale, bias)
    want = ref.attention_bwd(q64, k64, v64, out_r, lse_r, g.double(), ptr, col, scale, b64)
    for a, b in zip(got, want, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            assert a.dtype == dtype
            assert_close(a, b, tol)


@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("logits", [1.0, 1e3])
def test_segment_softmax_matches_reference(dtype, case, logits):
    _, _, _, ptr, col = make(case, dtype)
    g = torch.Generator().manual_seed(2)
    src = torch.randn(col.numel(), 5, generator=g, dtype=dtype) * logits
    src[::3, 1] = float("-inf")  # -inf entries
    if col.numel():
        src[ptr[0] : ptr[1], 2] = float("-inf")  # a whole segment at -inf
    y = cpu.segment_softmax_fwd(src, ptr)
    want = ref.segment_softmax_fwd(src.double(), ptr)
    # Shifted scores are exact in float32 only up to ~|logit| * 2^-24.
    tol = TOL64 if dtype == F64 else TOL32 * (1.0 + logits)
    assert y.dtype == dtype
    assert_close(y, want, tol)
    if col.numel():
        assert (y[ptr[0] : ptr[1], 2] == 0).all()
        assert (y[::3, 1] == 0).all()
    gr = torch.randn(y.shape, generator=g, dtype=dtype)
    dx = cpu.segment_softmax_bwd(y, gr, ptr)
    assert dx.dtype == dtype
    assert_close(dx, ref.segment_softmax_bwd(y.double(), gr.double(), ptr), tol)


def test_segment_softmax_keeps_trailing_dims():
    ptr = csr_of([2, 0, 3])
    src = torch.randn(5, 2, 3, dtype=F64)
    y = cpu.segment_softmax_fwd(src, ptr)
    assert y.shape == src.shape
    assert_close(y, ref.segment_softmax_fwd(src, ptr), TOL64)


def test_half_inputs_come_back_in_their_dtype():
    q, k, v, ptr, col = make("ragged", F32)
    qb, kb, vb = q.bfloat16(), k.bfloat16(), v.bfloat16()
    bias = torch.randn(col.numel(), q.shape[1]).half()
    out, lse = cpu.attention_fwd(qb, kb, vb, ptr, col, 0.5, bias)
    assert out.dtype == torch.bfloat16 and lse.dtype == F32
    out_r, _ = ref.attention_fwd(qb.float(), kb.float(), vb.float(), ptr, col, 0.5, bias.float())
    assert_close(out.float(), out_r, 1e-2)  # bfloat16 rounding of the output
    grads = cpu.attention_bwd(qb, kb, vb, out, lse, torch.ones_like(out), ptr, col, 0.5, bias)
    assert [t.dtype for t in grads] == [torch.bfloat16] * 3 + [torch.float16]
    src = torch.randn(col.numel(), 2).half()
    y = cpu.segment_softmax_fwd(src, ptr)
    assert y.dtype == torch.float16
    assert cpu.segment_softmax_bwd(y, torch.ones_like(y), ptr).dtype == torch.float16


@pytest.mark.parametrize("case", ["hub", "source hub", "ragged"])
def test_results_do_not_depend_on_the_thread_count(case):
    # Fixed summation orders, hubs cut by the graph alone: bitwise the same
    # results on 1 and 2 threads.
    q, k, v, ptr, col = make(case, F32, heads=4, c=32, cv=32)
    bias = torch.randn(col.numel(), 4)
    before = torch.get_num_threads()
    results = []
    try:
        for t in (1, 2):
            torch.set_num_threads(t)
            out, lse = cpu.attention_fwd(q, k, v, ptr, col, 0.3, bias)
            grads = cpu.attention_bwd(q, k, v, None, lse, out, ptr, col, 0.3, bias)
            y = cpu.segment_softmax_fwd(bias, ptr)
            results.append((out, lse, *grads, y, cpu.segment_softmax_bwd(y, bias, ptr)))
    finally:
        torch.set_num_threads(before)
    for a, b in zip(*results, strict=True):
        assert (a is None and b is None) or torch.equal(a, b)


def test_hubs_are_cut_into_pieces_by_the_graph_alone():
    # 1000 targets of degree 1, then one of degree 5000: the hub is cut into
    # pieces of _piece_limit(E) edges; the chunks skip it and balance the rest.
    p = csr_of([1] * 1000 + [5000]).numpy()
    plan = cpu._Plan(p, int(p[-1]))
    assert plan.limit == cpu._piece_limit(6000) == 2048
    assert plan.bounds[0] == 0 and plan.bounds[-1] == 1001 and (np.diff(plan.bounds) > 0).all()
    assert plan.pieces[:, 0].tolist() == [1000] * 3 and plan.seg.tolist() == [0, 3]
    assert plan.pieces[:, 1].tolist() == [1000, 3048, 5096]
    assert plan.pieces[:, 2].tolist() == [3048, 5096, 6000]
    # No hub: chunks of whole segments with about equal edge counts.
    p = csr_of([3] * 999 + [30]).numpy()
    plan = cpu._Plan(p, int(p[-1]))
    edges = p[plan.bounds[1:]] - p[plan.bounds[:-1]]
    assert plan.pieces.shape == (0, 3) and edges.sum() == 3027 and len(edges) > 1


@pytest.mark.parametrize("heads,c,cv", [(4, 32, 32), (2, 40, 24), (1, 1, 1)])
def test_attention_head_shapes(heads, c, cv):
    # Widths that are and are not multiples of the vector width, one head.
    for case in ("ragged", "source hub"):
        q, k, v, ptr, col = make(case, F64, heads=heads, c=c, cv=cv)
        out, lse = cpu.attention_fwd(q, k, v, ptr, col, 0.2)
        out_r, lse_r = ref.attention_fwd(q, k, v, ptr, col, 0.2)
        assert_close(out, out_r, TOL64)
        g = torch.randn_like(out)
        got = cpu.attention_bwd(q, k, v, None, lse, g, ptr, col, 0.2)
        want = ref.attention_bwd(q, k, v, out_r, lse_r, g, ptr, col, 0.2)
        for a, b in zip(got[:3], want[:3], strict=True):
            assert_close(a, b, TOL64)


def test_int32_indices_and_no_output_give_the_same_gradients():
    q, k, v, ptr, col = make("source hub", F32, heads=4, c=32, cv=32)
    out, lse = cpu.attention_fwd(q, k, v, ptr, col, 0.3)
    out32, lse32 = cpu.attention_fwd(q, k, v, ptr, col.int(), 0.3)
    assert torch.equal(out, out32) and torch.equal(lse, lse32)
    g = torch.randn_like(out)
    csc = transpose_csr(ptr, col, k.shape[0])
    csc32 = transpose_csr(ptr, col.int(), k.shape[0], dtype=torch.int32)
    assert csc32.row.dtype == csc32.perm.dtype == torch.int32
    a = cpu.attention_bwd(q, k, v, out, lse, g, ptr, col, 0.3, csc=csc)
    b = cpu.attention_bwd(q, k, v, None, lse, g, ptr, col.int(), 0.3, csc=csc32)
    for x, y in zip(a[:3], b[:3], strict=True):
        assert torch.equal(x, y)
    # The reference computes D from the edges too when it has no output.
    q64, k64, v64 = f64(q, k, v)
    o64, l64 = ref.attention_fwd(q64, k64, v64, ptr, col, 0.3)
    with_out = ref.attention_bwd(q64, k64, v64, o64, l64, g.double(), ptr, col, 0.3)
    without = ref.attention_bwd(q64, k64, v64, None, l64, g.double(), ptr, col, 0.3)
    for x, y in zip(with_out[:3], without[:3], strict=True):
        assert_close(x, y, TOL64)


def test_exp32_is_accurate_and_keeps_the_special_values():
    x = torch.linspace(-87.3, 88.72, 20_001, dtype=F32)[::7]
    got = torch.tensor([cpu.exp32(np.float32(v)) for v in x.tolist()], dtype=F64)
    want = torch.exp(x.double())
    assert float(((got - want) / want).abs().max()) < 3e-7  # within 2 ulp of float32
    assert cpu.exp32(np.float32(0.0)) == 1.0
    assert cpu.exp32(np.float32(-88.0)) == 0.0  # below the smallest normal: 0
    assert cpu.exp32(np.float32(-np.inf)) == 0.0 and cpu.exp32(np.float32(89.0)) == np.inf
    assert np.isnan(cpu.exp32(np.float32(np.nan)))


@pytest.mark.parametrize("width", [1, 3, 4, 16, 17])
def test_segment_softmax_any_width(width):
    # Heads per edge that do and do not divide the kernel's 16 lanes.
    ptr = csr_of([0, 1, 7, 33, 2, 0, 64])
    src = torch.randn(int(ptr[-1]), width, dtype=F64) * 5
    y = cpu.segment_softmax_fwd(src, ptr)
    assert_close(y, ref.segment_softmax_fwd(src, ptr), TOL64)
    g = torch.randn_like(y)
    assert_close(cpu.segment_softmax_bwd(y, g, ptr), ref.segment_softmax_bwd(y, g, ptr), TOL64)


def test_reference_backward_is_autograd_of_reference_forward():
    # The contract the kernels are held to: ref.attention_bwd is the gradient
    # of ref.attention_fwd, on a graph with an isolated target, a duplicate
    # edge, a masked edge and a fully masked target.
    ptr = csr_of([3, 0, 2, 2])
    col = torch.tensor([0, 0, 4, 1, 2, 3, 4])
    g = torch.Generator().manual_seed(3)
    q = torch.randn(4, 2, 3, generator=g, dtype=F64, requires_grad=True)
    k = torch.randn(5, 2, 3, generator=g, dtype=F64, requires_grad=True)
    v = torch.randn(5, 2, 2, generator=g, dtype=F64, requires_grad=True)
    mask = torch.zeros(7, 2, dtype=F64)
    mask[2, 0] = float("-inf")
    mask[5:7, 1] = float("-inf")  # target 3, head 1: all -inf
    b = torch.randn(7, 2, generator=g, dtype=F64, requires_grad=True)

    def f(q, k, v, b):
        return ref.attention_fwd(q, k, v, ptr, col, 0.7, b + mask)[0]

    assert torch.autograd.gradcheck(f, (q, k, v, b))
    out, lse = ref.attention_fwd(q, k, v, ptr, col, 0.7, b + mask)
    go = torch.randn(out.shape, generator=g, dtype=F64)
    auto = torch.autograd.grad(out, (q, k, v, b), go)
    mine = ref.attention_bwd(
        q.detach(), k.detach(), v.detach(), out.detach(), lse.detach(), go, ptr, col, 0.7,
        (b + mask).detach(),
    )  # fmt: skip
    for a, m in zip(auto, mine, strict=True):
        assert torch.allclose(a, m, atol=1e-12)
    assert (mine[3][5:7, 1] == 0).all()


def test_reference_softmax_backward_is_autograd_of_its_forward():
    ptr = csr_of([3, 0, 4])
    src = torch.randn(7, 2, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda s: ref.segment_softmax_fwd(s, ptr), (src,))
    y = ref.segment_softmax_fwd(src, ptr)
    g = torch.randn_like(y)
    (auto,) = torch.autograd.grad(y, src, g)
    assert torch.allclose(auto, ref.segment_softmax_bwd(y.detach(), g, ptr), atol=1e-12)


def test_transposed_csr_passed_by_the_caller():
    q, k, v, ptr, col = make("bipartite", F64)
    out, lse = cpu.attention_fwd(q, k, v, ptr, col, 0.3)
    g = torch.randn_like(out)
    csc = transpose_csr(ptr, col, k.shape[0])
    tptr, trow, tperm = csc
    assert torch.equal(col[tperm], torch.sort(col, stable=True).values)
    assert torch.equal(trow, ref.segment_ids(ptr)[tperm])
    got = cpu.attention_bwd(q, k, v, out, lse, g, ptr, col, 0.3, csc=csc)
    want = cpu.attention_bwd(q, k, v, out, lse, g, ptr, col, 0.3)
    for a, b in zip(got[:3], want[:3], strict=True):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="'csc'"):
        cpu.attention_bwd(q, k, v, out, lse, g, ptr, col, 0.3, csc=(tptr[:-1], trow, tperm))


def test_bad_input_names_the_argument():
    q, k, v, ptr, col = make("ragged", F64)
    with pytest.raises(TypeError, match="'col'"):
        cpu.attention_fwd(q, k, v, ptr, col.short(), 0.3)
    with pytest.raises(ValueError, match="'col'"):
        cpu.attention_fwd(q, k, v, ptr, col + k.shape[0], 0.3)
    with pytest.raises(ValueError, match="'ptr'"):
        cpu.attention_fwd(q, k, v, ptr[:-1], col, 0.3)
    with pytest.raises(ValueError, match="'bias'"):
        cpu.attention_fwd(q, k, v, ptr, col, 0.3, torch.zeros(col.numel(), 1, dtype=F64))
    with pytest.raises(TypeError, match="'q', 'k', 'v'"):
        cpu.attention_fwd(q, k.float(), v, ptr, col, 0.3)
    with pytest.raises(ValueError, match="'ptr'"):
        cpu.segment_softmax_fwd(torch.randn(5, 2), torch.tensor([0, 3, 2, 5]))
    with pytest.raises(TypeError, match="'src'"):
        cpu.segment_softmax_fwd(torch.ones(5, 2, dtype=torch.long), torch.tensor([0, 5]))


def test_segment_ptr_finds_segments_and_unsorted_indices():
    gen = torch.Generator().manual_seed(4)
    index = torch.randint(0, 700, (5000,), generator=gen).sort().values  # empty segments too
    for ix in (index, index.int()):
        assert torch.equal(cpu.segment_ptr(ix, 800), ref.segment_ptr(ix.long(), 800))
    assert (
        cpu.segment_ptr(index.flip(0), 800) is None and ref.segment_ptr(index.flip(0), 800) is None
    )
    empty = torch.zeros(0, dtype=torch.long)
    assert cpu.segment_ptr(empty, 3).tolist() == ref.segment_ptr(empty, 3).tolist() == [0] * 4
    for impl in (cpu.segment_ptr, ref.segment_ptr):
        with pytest.raises(ValueError, match="'index'"):
            impl(index, 600)  # ids up to 699
