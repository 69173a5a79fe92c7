"""The numba CPU kernels against their pure-torch references, on awkward sizes."""

import inspect

import numpy as np
import pytest
import torch

from gnnattn.graphs import transpose_csr
from gnnattn.kernels import common, cpu
from gnnattn.kernels import reference as ref
from gnnattn.kernels.cpu import backward, plans

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
    # Targets past the destination pass's chunk of weights (512 edges: several chunks, the
    # second sweep recomputing; target 3 all -inf with a bias) and sources past the
    # source pass's (64), all below the hub limit (2048: no pieces).
    "wide": ([700, 3, 0, 600, 1], 12, None),
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
    p = csr_of([1] * 1000 + [5000])
    plan = plans._Plan.make(p, int(p[-1]), threads=2)
    assert plan.limit == plans._piece_limit(6000) == 2048
    assert plan.bounds[0] == 0 and plan.bounds[-1] == 1001 and (np.diff(plan.bounds) > 0).all()
    assert plan.pieces[:, 0].tolist() == [1000] * 3 and plan.seg.tolist() == [0, 3]
    assert plan.pieces[:, 1].tolist() == [1000, 3048, 5096]
    assert plan.pieces[:, 2].tolist() == [3048, 5096, 6000]
    # No hub: chunks of whole segments with about equal edge counts.
    p = csr_of([3] * 999 + [30])
    plan = plans._Plan.make(p, int(p[-1]), threads=2)
    p = p.numpy()
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
    with pytest.raises(AssertionError):  # the operator validates q, k, v; kernels assert
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


# ------------------------------------------------------------------ options
#
# The dropout, forward and backward, against the float64 reference. float64
# only, except the thread-count test: each combination of options is one more
# compiled specialisation of every kernel (seconds of compile time each on a
# cold cache).

DROP = common.Dropout(0.3, seed=(0xDEAD_BEEF << 30) | 12345, offset=1_000_003)


def edge_inputs(case, dtype, with_bias, seed=5):
    q, k, v, ptr, col = make(case, dtype, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    e, h = col.numel(), q.shape[1]
    bias = torch.randn(e, h, generator=g, dtype=dtype) if with_bias else None
    if bias is not None:
        bias[::4, 0] = float("-inf")
        if ptr.numel() > 4:
            bias[ptr[3] : ptr[4], 1] = float("-inf")  # a target whose scores are all -inf
    return q, k, v, ptr, col, bias


def check_options(case, with_bias, dropout, logits=1.0, tol=TOL64):
    q, k, v, ptr, col, bias = edge_inputs(case, F64, with_bias)
    q = q * logits
    kw = dict(dropout=dropout)
    out, lse = cpu.attention_fwd(q, k, v, ptr, col, 0.3, bias, **kw)
    out_r, lse_r = ref.attention_fwd(q, k, v, ptr, col, 0.3, bias, **kw)
    assert_close(out, out_r, tol)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(lse_r))
    fin = torch.isfinite(lse_r)
    assert_close(lse[fin], lse_r[fin], tol)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(9), dtype=F64)
    got = cpu.attention_bwd(q, k, v, None, lse, g, ptr, col, 0.3, bias, **kw)
    want = ref.attention_bwd(q, k, v, out_r, lse_r, g, ptr, col, 0.3, bias, **kw)
    assert len(got) == 4
    for a, b in zip(got, want, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            assert a.dtype == F64
            assert_close(a, b, tol)
    return got


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("logits", [1.0, 1e3])
def test_dropout_matches_reference(case, with_bias, logits):
    # "hub" and "source hub" take the hub-piece kernels of both passes.
    check_options(case, with_bias, dropout=DROP, logits=logits)


def test_options_on_hub_pieces_of_every_segment(monkeypatch):
    # Pieces of 3 edges: every segment longer than that is reduced in pieces
    # and merged, in both passes (empty and one-edge pieces at the ends).
    monkeypatch.setattr(plans, "_PIECE_MIN", 3)
    monkeypatch.setattr(plans, "_PIECES", 10**9)
    check_options("ragged", True, dropout=DROP)
    check_options("source hub", False, dropout=DROP)


@pytest.mark.parametrize("pieces", [False, True])
@pytest.mark.parametrize("dropout", [None, DROP])
def test_lse_gradient_is_autograd_of_the_reference(monkeypatch, pieces, dropout):
    """A loss of out and lse: ``grad_lse`` enters as ``D_i - grad_lse_i`` (d lse_i / d s_ij =
    alpha_ij, the weights before dropout), on the reference and the kernels, whole
    segments and hub pieces; an isolated target and a masked edge included."""
    if pieces:
        monkeypatch.setattr(plans, "_PIECE_MIN", 3)
        monkeypatch.setattr(plans, "_PIECES", 10**9)
    ptr = csr_of([3, 0, 7, 2])
    col = torch.tensor([0, 0, 4, 1, 2, 3, 4, 0, 1, 2, 3, 4])
    g = torch.Generator().manual_seed(4)
    leaves = [
        torch.randn(*shape, generator=g, dtype=F64, requires_grad=True)
        for shape in ((4, 2, 3), (5, 2, 3), (5, 2, 2), (12, 2))
    ]
    mask = torch.zeros(12, 2, dtype=F64)
    mask[2, 0] = float("-inf")
    out, lse = ref.attention_fwd(*leaves[:3], ptr, col, 0.7, leaves[3] + mask, dropout=dropout)
    go = torch.randn(out.shape, generator=g, dtype=F64)
    gl = torch.randn(lse.shape, generator=g, dtype=F64)
    auto = torch.autograd.grad((out * go).sum() + (lse.nan_to_num(neginf=0.0) * gl).sum(), leaves)
    q, k, v, b = (t.detach() for t in leaves)
    for kern in (ref, cpu):
        got = kern.attention_bwd(
            q, k, v, None, lse.detach(), go, ptr, col, 0.7, b + mask, dropout=dropout, grad_lse=gl
        )
        for a, want in zip(got, auto, strict=True):
            assert_close(a, want, TOL64)


def test_source_pass_alone_recomputes_the_weights():
    # With a bias, attention_bwd hands the source pass the stored dS and P;
    # called alone it recomputes them from the scores, the bias's rows and
    # the dropout mask: the same gradients. (No hub here: one kernel less to
    # compile for this specialisation.)
    q, k, v, ptr, col, bias = edge_inputs("ragged", F64, True)
    out, lse = cpu.attention_fwd(q, k, v, ptr, col, 0.3, bias, dropout=DROP)
    g = torch.randn_like(out)
    full = cpu.attention_bwd(q, k, v, None, lse, g, ptr, col, 0.3, bias, dropout=DROP)
    _, ld, _ = cpu.attention_bwd_dst(q, k, v, lse, g, ptr, col, 0.3, bias, dropout=DROP)
    csc = transpose_csr(ptr, col, k.shape[0])
    dk, dv = cpu.attention_bwd_src(q, k, v, ld, g, csc, 0.3, bias, dropout=DROP)
    assert_close(dk, full[1], TOL64)
    assert_close(dv, full[2], TOL64)


def test_source_pass_from_stored_weights_matches_recomputation():
    # attention_bwd has the destination pass store P = alpha * f beside dS ([E, 2H])
    # and the source pass read both; given dS alone it recomputes the weights
    # (and the dropout mask): the same dk, dv, and P is the dropped weight.
    q, k, v, ptr, col, bias = edge_inputs("ragged", F64, True)
    out, lse = cpu.attention_fwd(q, k, v, ptr, col, 0.3, bias, dropout=DROP)
    g = torch.randn_like(out)
    kw = dict(dropout=DROP)
    dst = backward._bwd_dst(q, k, v, lse, g, ptr, col, 0.3, bias, **kw, weights=True)
    ld, ds, dsp = dst[1], dst[2], dst[5]
    nh = q.shape[1]
    assert dsp is not None and dsp.shape == (col.numel(), 2 * nh)
    assert torch.equal(ds, dsp[:, :nh])
    alpha = ref.attention_weights(q, k, ptr, col, 0.3, lse, bias)
    keep = common.dropout_keep(DROP, col.numel(), nh, q.device)
    assert_close(dsp[:, nh:], alpha * keep / (1 - DROP.p), TOL64)
    csc = transpose_csr(ptr, col, k.shape[0])
    a = cpu.attention_bwd_src(q, k, v, ld, g, csc, 0.3, bias, **kw, ds=ds.contiguous())
    b = cpu.attention_bwd_src(q, k, v, ld, g, csc, 0.3, bias, **kw, ds=dsp)
    assert_close(a[0], b[0], TOL64)
    assert_close(a[1], b[1], TOL64)
    # Without a stored dS (no bias or edge features) nothing is kept.
    assert backward._bwd_dst(q, k, v, lse, g, ptr, col, 0.3, weights=True)[5] is None


def test_dropout_zero_is_no_dropout():
    q, k, v, ptr, col, bias = edge_inputs("ragged", F64, True)
    none = cpu.attention_fwd(q, k, v, ptr, col, 0.3, bias)
    zero = cpu.attention_fwd(q, k, v, ptr, col, 0.3, bias, dropout=common.Dropout(0.0, 7, 0))
    assert all(torch.equal(a, b) for a, b in zip(none, zero, strict=True))
    with pytest.raises(ValueError, match="'dropout'"):
        cpu.attention_fwd(q, k, v, ptr, col, 0.3, dropout=common.Dropout(1.0, 7, 0))
    with pytest.raises(TypeError, match="'dropout'"):
        cpu.attention_fwd(q, k, v, ptr, col, 0.3, dropout=0.5)  # type: ignore[arg-type]


def test_dropout_stream_is_bitwise_that_of_common():
    gen = torch.Generator().manual_seed(6)
    counters = torch.cat(
        [
            torch.arange(100_000),
            torch.randint(0, 2**62, (100_000,), generator=gen),  # high words set
            torch.arange(2**32 - 5_000, 2**32 + 5_000),  # across the 32-bit boundary
            torch.tensor([0, 2**31 - 1, 2**32 - 1, 2**32, 2**62 - 1]),
        ]
    )
    keys = [
        common.Dropout(0.1, 0, 0),
        common.Dropout(0.5, 2**63 - 1, 2**31 - 1),  # every seed bit set, largest offset
        common.Dropout(0.5, (0x8000_0001 << 31) | 0xFFFF_FFFF, 12_345),
    ]
    for d in keys:
        assert torch.equal(cpu.dropout_bits(d, counters), common.dropout_bits(d, counters))
    # The kernels use the same stream: with one edge per target (weight 1)
    # and v = 1, out is the dropout factor of each edge and head.
    got = kept_factor(keys[1], num_edges=3_000, heads=4)
    want = common.dropout_keep(keys[1], 3_000, 4, torch.device("cpu")).double() / (1 - 0.5)
    assert torch.equal(got, want)


def kept_factor(dropout, num_edges, heads):
    """The forward's output with one edge per target, q = 0 and v = 1: ``keep / (1 - p)``."""
    ptr = torch.arange(num_edges + 1)
    col = torch.arange(num_edges) % 7
    q = torch.zeros(num_edges, heads, 2, dtype=F64)
    k = torch.ones(7, heads, 2, dtype=F64)
    v = torch.ones(7, heads, 1, dtype=F64)
    out, _ = cpu.attention_fwd(q, k, v, ptr, col, 1.0, dropout=dropout)
    return out[..., 0]


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_kept_fraction_is_binomial(p):
    n_edges, heads = 50_000, 4
    f = kept_factor(common.Dropout(p, seed=11, offset=3), n_edges, heads)
    kept = f != 0
    assert torch.equal(f[kept], torch.full_like(f[kept], 1 / (1 - p)))
    n = kept.numel()
    sigma = (p * (1 - p) / n) ** 0.5
    assert abs(kept.double().mean().item() - (1 - p)) < 6 * sigma
    # Heads and neighbouring edges are not correlated: each head alone too.
    for h in range(heads):
        assert abs(kept[:, h].double().mean().item() - (1 - p)) < 6 * sigma * heads**0.5


@pytest.mark.parametrize("case", ["hub", "source hub", "ragged"])
def test_options_do_not_depend_on_the_thread_count(case):
    # Bias + dropout, on the hubs of both passes: bitwise the same on 1 and
    # 2 threads (float64: the specialisation the reference tests compile
    # already).
    q, k, v, ptr, col, bias = edge_inputs(case, F64, True)
    g = torch.randn(q.shape[0], q.shape[1], v.shape[2], dtype=F64)
    before = torch.get_num_threads()
    results = []
    try:
        for t in (1, 2):
            torch.set_num_threads(t)
            kw = dict(dropout=DROP)
            out, lse = cpu.attention_fwd(q, k, v, ptr, col, 0.3, bias, **kw)
            grads = cpu.attention_bwd(q, k, v, None, lse, g, ptr, col, 0.3, bias, **kw)
            results.append((out, lse, *grads))
    finally:
        torch.set_num_threads(before)
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)


def test_options_in_float32_with_int32_ids():
    # The other dtype and index width, on one case (each is one more
    # specialisation to compile): against the float64 reference.
    q, k, v, ptr, col, bias = edge_inputs("ragged", F32, True)
    kw = dict(dropout=DROP)
    out, lse = cpu.attention_fwd(q, k, v, ptr, col.int(), 0.3, bias, **kw)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
    grads = cpu.attention_bwd(q, k, v, None, lse, g, ptr, col.int(), 0.3, bias, **kw)
    q64, k64, v64, b64 = f64(q, k, v, bias)
    s = ref.attention_scores(q64, k64, ptr, col, 0.3)
    tol = TOL32 * (1.0 + float(s.abs().max()))
    out_r, lse_r = ref.attention_fwd(q64, k64, v64, ptr, col, 0.3, b64, **kw)
    assert out.dtype == F32 and lse.dtype == F32
    assert_close(out, out_r, tol)
    want = ref.attention_bwd(q64, k64, v64, out_r, lse_r, g.double(), ptr, col, 0.3, b64, **kw)
    for a, b in zip(grads, want, strict=True):
        assert a.dtype == F32
        assert_close(a, b, tol)


# ------------------------------------------------------------------ plans


def test_csr_source_pass_same_bits_on_any_thread_count():
    """The source pass over the CSR gives each thread a range of sources; each source's
    terms still come in CSR order, so ``dk`` and ``dv`` are bitwise those of one thread
    (and the scatter of the reference), with isolated and heavily used sources."""
    import numba

    gen = torch.Generator().manual_seed(3)
    n, m, h, c, cv = 29, 37, 3, 5, 7
    # Source 0 takes a third of the edges; sources 30.. none.
    col = torch.cat(
        [torch.zeros(40, dtype=torch.int64), torch.randint(0, 30, (80,), generator=gen)]
    )
    dst = torch.randint(0, n, (120,), generator=gen)
    order = torch.argsort(dst, stable=True)
    col, dst = col[order], dst[order]
    ptr = torch.zeros(n + 1, dtype=torch.int64)
    ptr[1:] = torch.bincount(dst, minlength=n).cumsum(0)
    q = torch.randn(n, h, c, dtype=torch.float64, generator=gen)
    go = torch.randn(n, h, cv, dtype=torch.float64, generator=gen)
    dsp = torch.randn(120, 2 * h, dtype=torch.float64, generator=gen)
    plan = plans._make_plan(ptr, col, m, None)
    dk_ref = torch.zeros(m, h, c, dtype=torch.float64).index_add_(
        0, col, 0.5 * dsp[:, :h, None] * q[dst]
    )
    dv_ref = torch.zeros(m, h, cv, dtype=torch.float64).index_add_(
        0, col, dsp[:, h:, None] * go[dst]
    )
    threads = numba.get_num_threads()
    try:
        results = []
        for t in range(1, numba.config.NUMBA_NUM_THREADS + 1):
            numba.set_num_threads(t)
            results.append(backward.src_csr(q, go, dsp, plan, 0.5, m))
    finally:
        numba.set_num_threads(threads)
    for dk, dv in results:
        torch.testing.assert_close(dk, dk_ref, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(dv, dv_ref, rtol=1e-12, atol=1e-12)
        assert torch.equal(dk, results[0][0]) and torch.equal(dv, results[0][1])
    assert not results[0][0][30:].any() and not results[0][1][30:].any()


def test_every_compiled_kernel_can_be_cached():
    """numba caches a kernel only without dynamic globals (``numba.get_num_threads()``
    inside a parallel kernel makes one): such a kernel would compile again, for seconds
    and with a NumbaWarning, in every process. Checked on every kernel compiled in this
    process, after a forward and backward of each small-graph path."""
    import importlib
    import pkgutil

    from numba.core.registry import CPUDispatcher

    from gnnattn.nn import TransformerConv

    torch.manual_seed(0)
    layer = TransformerConv(8, 4, heads=2, edge_dim=3)
    x = torch.randn(6, 8, requires_grad=True)
    ei = torch.tensor([[0, 1, 2, 3, 4, 5, 1], [1, 2, 3, 4, 5, 0, 0]])
    layer(x, ei, torch.randn(7, 3)).sum().backward()
    checked = []
    for info in pkgutil.iter_modules(cpu.__path__):
        mod = importlib.import_module(f"{cpu.__name__}.{info.name}")
        for name, obj in vars(mod).items():
            if isinstance(obj, CPUDispatcher) and obj.__module__ == mod.__name__:
                for cres in obj.overloads.values():
                    assert not cres.library.has_dynamic_globals, f"{info.name}.{name}"
                    checked.append(name)
    assert "_bwd_src_scatter_kernel" in checked and "_fwd_kernel" in checked


def test_cpu_has_the_reference_api():
    names = ["segment_softmax_fwd", "segment_softmax_bwd", "segment_ptr"]
    names += ["attention_fwd", "attention_bwd", "plan"]
    names += ["block_attention_fwd", "block_attention_bwd"]
    for name in names:
        mine = list(inspect.signature(getattr(cpu, name)).parameters.values())
        theirs = list(inspect.signature(getattr(ref, name)).parameters.values())
        # Same parameters, kinds and defaults; extras are keyword-only.
        assert [(p.name, p.kind, p.default) for p in mine[: len(theirs)]] == [
            (p.name, p.kind, p.default) for p in theirs
        ], name
        assert all(p.kind is p.KEYWORD_ONLY for p in mine[len(theirs) :]), name
    assert sorted(cpu.__all__) == sorted(
        [
            *names,
            "BACKWARD_READS_OUTPUT",
            "CPUPlan",
            "attention_bwd_dst",
            "attention_bwd_op",
            "attention_bwd_src",
            "attention_fwd_op",
            "csc_plan_tensors",
            "csr_plan_tensors",
            "dropout",
            "dropout_bits",
            "exp32",
            "per_head_edges",
            "plan_from_tensors",
            "plan_tensors",
            "relu_dropout",
            "relu_dropout_bwd",
            "csr_source_pass",
        ]
    )


def test_plans_give_the_same_results():
    q, k, v, ptr, col, bias = edge_inputs("source hub", F64, True)
    m, n = k.shape[0], q.shape[0]
    csc = transpose_csr(ptr, col, m)
    pl = cpu.plan(ptr, col, m)
    cpl = cpu.plan(csc.ptr, csc.row, n, perm=csc.perm)
    assert isinstance(pl, cpu.CPUPlan) and pl.threads >= 1 and pl.perm is None
    assert (pl.num_rows, pl.num_edges, pl.num_cols) == (n, col.numel(), m)
    for kw in ({}, dict(dropout=DROP)):
        a = cpu.attention_fwd(q, k, v, ptr, col, 0.3, bias, **kw)
        b = cpu.attention_fwd(q, k, v, ptr, col, 0.3, bias, **kw, plan=pl)
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
        g = torch.randn_like(a[0])
        a = cpu.attention_bwd(q, k, v, None, a[1], g, ptr, col, 0.3, bias, **kw, csc=csc)
        b = cpu.attention_bwd(
            q, k, v, None, b[1], g, ptr, col, 0.3, bias, **kw, plan=pl, csc_plan=cpl
        )
        for x, y in zip(a, b, strict=True):
            assert (x is None and y is None) or torch.equal(x, y)


def test_calls_with_plans_neither_check_nor_split(monkeypatch):
    q, k, v, ptr, col, bias = edge_inputs("hub", F64, True)
    m, n = k.shape[0], q.shape[0]
    csc = transpose_csr(ptr, col, m)
    pl = cpu.plan(ptr, col, m)
    cpl = cpu.plan(csc.ptr, csc.row, n, perm=csc.perm)

    def boom(*args, **kwargs):
        raise AssertionError("called with plans")

    for name in ("check_ptr", "check_index", "_Plan"):
        monkeypatch.setattr(plans, name, boom)
    monkeypatch.setattr(backward, "transpose_csr", boom)
    kw = dict(dropout=DROP)
    out, lse = cpu.attention_fwd(q, k, v, ptr, col, 0.3, bias, **kw, plan=pl)
    g = torch.ones_like(out)
    cpu.attention_bwd(q, k, v, None, lse, g, ptr, col, 0.3, bias, **kw, plan=pl, csc_plan=cpl)
    with pytest.raises(AssertionError, match="with plans"):  # without: checked and split
        cpu.attention_fwd(q, k, v, ptr, col, 0.3, bias, **kw)


def test_plans_are_checked():
    q, k, v, ptr, col, bias = edge_inputs("ragged", F64, True)
    m, n = k.shape[0], q.shape[0]
    with pytest.raises(ValueError, match="'col'"):
        cpu.plan(ptr, col, m - 1)
    with pytest.raises(ValueError, match="'ptr'"):
        cpu.plan(ptr.flip(0), col, m)
    csc = transpose_csr(ptr, col, m)
    with pytest.raises(ValueError, match="'perm'"):
        cpu.plan(csc.ptr, csc.row, n, perm=csc.perm + 1)  # ids up to E
    other = cpu.plan(*make("bipartite", F64)[3:], 101)
    with pytest.raises(ValueError, match="'plan'"):
        cpu.attention_fwd(q, k, v, ptr, col, 0.3, plan=other)
    with pytest.raises(TypeError, match="'plan'"):
        cpu.attention_fwd(q, k, v, ptr, col, 0.3, plan=ref.plan(ptr, col, m))  # type: ignore[arg-type]
    # A transposed-CSR plan without perm (the reference's and Triton's form)
    # takes the CSR positions from csc, trusted unchecked; without csc it
    # serves calls without per-edge options only.
    no_perm = cpu.plan(csc.ptr, csc.row, n)
    out, lse = cpu.attention_fwd(q, k, v, ptr, col, 0.3, bias)
    g = torch.ones_like(out)
    cpu.attention_bwd(q, k, v, None, lse, g, ptr, col, 0.3, csc_plan=no_perm)
    with pytest.raises(ValueError, match="perm="):
        cpu.attention_bwd(q, k, v, None, lse, g, ptr, col, 0.3, bias, csc_plan=no_perm)
    a = cpu.attention_bwd(q, k, v, None, lse, g, ptr, col, 0.3, bias, csc=csc, csc_plan=no_perm)
    b = cpu.attention_bwd(q, k, v, None, lse, g, ptr, col, 0.3, bias)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


# ------------------------------------------------------------------ NaN


@pytest.mark.parametrize("case", ["ragged", "hub"])
@pytest.mark.parametrize("where", ["k", "v"])
def test_nan_reaches_exactly_the_targets_that_read_it(case, where):
    q, k, v, ptr, col = make(case, F64)
    src = int(col[2])  # a source of target 0 (in the hub case: the hub)
    (k if where == "k" else v)[src] = float("nan")
    out, lse = cpu.attention_fwd(q, k, v, ptr, col, 0.3)
    out_r, lse_r = ref.attention_fwd(q, k, v, ptr, col, 0.3)
    reads = torch.zeros(q.shape[0], dtype=torch.bool)
    reads[ref.segment_ids(ptr)[col == src]] = True
    assert torch.isnan(out[reads]).all() and torch.isfinite(out[~reads]).all()
    assert torch.equal(torch.isnan(out), torch.isnan(out_r))
    assert torch.equal(torch.isnan(lse), torch.isnan(lse_r))
    assert torch.isnan(lse[reads]).all() == (where == "k")


def test_softmax_nan_makes_its_segment_nan():
    y = cpu.segment_softmax_fwd(torch.tensor([float("nan"), 1.0, 2.0]), torch.tensor([0, 3]))
    assert torch.isnan(y).all()
    ptr = csr_of([3, 0, 20, 2])
    for pos in (0, 5, 22):  # first, middle and last of a segment, before and after the max
        src = torch.randn(25, 2, dtype=F64)
        src[pos, 1] = float("nan")
        y = cpu.segment_softmax_fwd(src, ptr)
        want = ref.segment_softmax_fwd(src, ptr)
        assert torch.equal(torch.isnan(y), torch.isnan(want))
        seg = int(torch.searchsorted(ptr, torch.tensor(pos), right=True)) - 1
        assert torch.isnan(y[ptr[seg] : ptr[seg + 1], 1]).all()
        assert (
            torch.isfinite(y[:, 0]).all() and int(torch.isnan(y).sum()) == ptr[seg + 1] - ptr[seg]
        )
