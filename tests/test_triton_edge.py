"""The Triton kernels' raw edge features (``edge_attr`` / ``edge_query`` /
``grad_edge_out``) against the torch reference, and the operator's fused path
on them.

Without a GPU these run through Triton's interpreter (``TRITON_INTERPRET=1``,
set by the root ``conftest.py``) on CPU tensors, at small sizes with 8-edge
blocks and 16-edge chunks, so that the hub target (40 in-edges) and the hub
source are split in every pass and the combine / split-sum kernels run. Every
test name contains ``triton``.

Tolerances: float32 kernels against the float64 reference on the same
(float32-representable) inputs. An output or gradient is a sum of at most
~40 terms, each a product of a weight, computed from a float32 score, with
short (C = 12, F <= 16) float32 dot products: ~1e-6 relative per term, so
``2e-5`` relative to the largest reference entry bounds it with a margin
(the same bound as test_triton_kernels' float32 ``TOL``, scaled by the
entry size). With scores scaled by 1e3 a score of size ~1e3 is rounded to
~6e-5 absolute in float32, which is a relative error of that size in every
weight, and the gradients w.r.t. ``q``, ``k`` and ``edge_query`` carry the
1e3 factor: ``2e-3`` relative to the largest entry there. The float64 runs
(the algebra exactly, not the rounding) use ``1e-10``.
"""

from __future__ import annotations

import functools

import pytest
import torch

pytest.importorskip("triton")

import gnnattn  # noqa: E402
from gnnattn import AttentionGraph, kernels  # noqa: E402
from gnnattn.kernels import reference as ref  # noqa: E402
from gnnattn.kernels import triton_attention as ta  # noqa: E402
from gnnattn.kernels import triton_ops  # noqa: E402
from gnnattn.kernels.common import Dropout  # noqa: E402
from gnnattn.ops import backend_for  # noqa: E402

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
DEV = "cuda" if torch.cuda.is_available() else "cpu"  # on a GPU, the same tests compiled
F32, F64 = torch.float32, torch.float64
# Targets 0 and 4 isolated, 1 with one edge, 2 a hub of 40 in-edges (3 chunks
# of 16), 5 fully masked by the score bias in head 0; source 0 a hub (split
# in the dk/dv pass); 7 sources, C = 12, Cv = 5: no power of two.
LENS = [0, 1, 40, 3, 0, 9, 2]
BLOCKS = dict(block_e=8, split_blocks=2)
DROP = Dropout(0.4, seed=(1 << 62) + 0x9E37_79B9, offset=12_345)
NAMES = ("dq", "dk", "dv", "dbias", "dedge_attr", "dedge_query")


def _inputs(lens, h, nf, *, m=7, c=12, cv=5, dtype=F32, seed=0):
    """q, k, v, ptr, col, bias, edge_attr, edge_query, grad_edge_out."""
    gen = torch.Generator().manual_seed(seed)
    ptr = torch.tensor([0, *lens]).cumsum(0)
    e, n = int(ptr[-1]), len(lens)
    hub = torch.rand(e, generator=gen) < 0.6
    col = torch.where(hub, 0, torch.randint(0, m, (e,), generator=gen))
    q, k, v = (torch.randn(s, h, d, generator=gen) for s, d in ((n, c), (m, c), (m, cv)))
    b = torch.randn(e, h, generator=gen)
    if n > 5:
        b[ptr[5] : ptr[6], 0] = float("-inf")
    ea = torch.randn(e, nf, generator=gen)
    eq = torch.randn(n, h, nf, generator=gen)
    ge = torch.randn(n, h, nf, generator=gen)
    out = (q, k, v, ptr, col, b, ea, eq, ge)
    return [t.to(DEV, dtype) if t.is_floating_point() else t.to(DEV) for t in out]


def _close(got, want, tol):
    """``got`` (any float dtype) against the float64 ``want``, to ``tol`` relative
    to ``want``'s largest entry (to ``tol`` absolute where that is below 1)."""
    assert got.shape == want.shape
    assert torch.equal(torch.isneginf(got), torch.isneginf(want))
    fin = torch.isfinite(want)
    assert torch.isfinite(got[fin]).all()
    size = max(float(want[fin].abs().max()) if fin.any() else 0.0, 1.0)
    torch.testing.assert_close(got[fin].double(), want[fin], atol=tol * size, rtol=tol)


def _check(lens, h, nf, *, bias=False, dropout=None, query=True, grad=True, logits=1.0,
           dtype=F32, tol=2e-5, blocks=BLOCKS, **shape):  # fmt: skip
    q, k, v, ptr, col, b, ea, eq, ge = _inputs(lens, h, nf, dtype=dtype, **shape)
    q = q * logits
    eq = eq * logits if query else None
    ge = ge if grad else None
    b = b if bias else None
    kw = dict(dropout=dropout, edge_attr=ea, edge_query=eq)
    scale = q.shape[2] ** -0.5
    got = ta.attention_fwd(q, k, v, ptr, col, scale, b, **kw, **blocks)
    d64 = [None if t is None else t.double() for t in (q, k, v, b, ea, eq, ge)]
    q6, k6, v6, b6, ea6, eq6, ge6 = d64
    kw6 = dict(dropout=dropout, edge_attr=ea6, edge_query=eq6)
    want = ref.attention_fwd(q6, k6, v6, ptr, col, scale, b6, **kw6)
    assert len(got) == 3 and got[2].dtype == dtype and got[2].shape == (len(lens), h, nf)
    for x, y in zip(got, want, strict=True):
        _close(x, y, tol)
    go = torch.randn(got[0].shape, generator=torch.Generator().manual_seed(9)).to(DEV, dtype)
    grads = ta.attention_bwd(
        q, k, v, got[0], got[1], go, ptr, col, scale, b, **kw, grad_edge_out=ge, **blocks
    )
    wants = ref.attention_bwd(
        q6, k6, v6, want[0], want[1], go.double(), ptr, col, scale, b6, **kw6, grad_edge_out=ge6
    )
    assert len(grads) == len(wants) == 6
    for name, x, y in zip(NAMES, grads, wants, strict=True):
        assert (x is None) == (y is None), name
        if x is not None:
            assert x.dtype == dtype, name
            _close(x, y, tol)
    return got, grads


@pytest.mark.parametrize(
    "nf, h, opts",
    [
        (1, 1, dict()),
        (3, 3, dict(bias=True, dropout=DROP)),
        (16, 3, dict(bias=True, grad=False)),
        (3, 1, dict(dropout=DROP, query=False)),
    ],
    ids=["F1-H1", "F3-H3-all", "F16-H3-bias-no-grad", "F3-H1-dropout-no-query"],
)
def test_triton_edge_features_float32_match_float64_reference(nf, h, opts) -> None:
    _check(LENS, h, nf, **opts)


def test_triton_edge_features_logits_x1e3() -> None:
    _check(LENS, 3, 3, bias=True, dropout=DROP, logits=1e3, tol=2e-3)


def test_triton_edge_features_float64_equal_reference() -> None:
    """The algebra exactly: every option at once, scores scaled by 1e3, split chunks."""
    _check(LENS, 3, 3, bias=True, dropout=DROP, logits=1e3, dtype=F64, tol=1e-10)


def test_triton_edge_features_on_tiny_and_empty_graphs() -> None:
    # One node attending to itself, with every option.
    q, k, v, ptr, col, b, ea, eq, ge = _inputs([1], 1, 3, m=1, c=3, cv=2, dtype=F64)
    col = torch.zeros(1, dtype=torch.long, device=DEV)
    kw = dict(dropout=Dropout(0.5, 3, 0), edge_attr=ea, edge_query=eq)
    got = ta.attention_fwd(q, k, v, ptr, col, 0.5, b, **kw)
    want = ref.attention_fwd(q, k, v, ptr, col, 0.5, b, **kw)
    for x, y in zip(got, want, strict=True):
        _close(x, y, 1e-10)
    go = torch.ones_like(got[0])
    grads = ta.attention_bwd(q, k, v, got[0], got[1], go, ptr, col, 0.5, b, **kw, grad_edge_out=ge)
    wants = ref.attention_bwd(q, k, v, want[0], want[1], go, ptr, col, 0.5, b, **kw,
                              grad_edge_out=ge)  # fmt: skip
    for x, y in zip(grads, wants, strict=True):
        _close(x, y, 1e-10)
    # No edges: zero outputs and gradients of the right shapes, lse = -inf.
    q, k, v, ptr, col, b, ea, eq, ge = _inputs([0, 0, 0], 2, 3, m=2, c=4, cv=3, dtype=F64)
    kw = dict(dropout=DROP, edge_attr=ea, edge_query=eq)
    out, lse, eo = ta.attention_fwd(q, k, v, ptr, col, 0.5, b, **kw)
    assert (out == 0).all() and (lse == float("-inf")).all() and eo.shape == (3, 2, 3)
    assert (eo == 0).all()
    grads = ta.attention_bwd(q, k, v, out, lse, out + 1, ptr, col, 0.5, b, **kw, grad_edge_out=ge)
    shapes = [(3, 2, 4), (2, 2, 4), (2, 2, 3), (0, 2), (0, 3), (3, 2, 3)]
    assert [tuple(g.shape) for g in grads] == shapes
    assert all((g == 0).all() for g in grads)
    # No targets at all.
    out, lse, eo = ta.attention_fwd(q[:0], k, v, ptr[:1], col, 0.5, edge_attr=ea)
    assert out.shape == (0, 2, 3) and eo.shape == (0, 2, 3)


def test_triton_edge_backward_recomputes_what_it_is_not_given() -> None:
    """Without ``out`` or ``edge_out`` the backward runs one more forward: same numbers."""
    q, k, v, ptr, col, b, ea, eq, ge = _inputs([2, 0, 9, 5], 2, 3, dtype=F64)
    kw = dict(dropout=DROP, edge_attr=ea, edge_query=eq, **BLOCKS)
    out, lse, eo = ta.attention_fwd(q, k, v, ptr, col, 0.3, b, **kw)
    go = torch.randn_like(out)
    given = ta.attention_bwd(
        q, k, v, out, lse, go, ptr, col, 0.3, b, **kw, grad_edge_out=ge, edge_out=eo
    )
    for o in (out, None):
        got = ta.attention_bwd(q, k, v, o, lse, go, ptr, col, 0.3, b, **kw, grad_edge_out=ge)
        for x, y in zip(given, got, strict=True):
            torch.testing.assert_close(x, y, atol=1e-12, rtol=1e-12)


def test_triton_edge_options_are_checked() -> None:
    q, k, v, ptr, col, b, ea, eq, ge = _inputs([2, 1], 2, 3, dtype=F64)
    with pytest.raises(ValueError, match="'edge_attr' with 'edge_query'"):
        ta.attention_fwd(q, k, v, ptr, col, 0.3, edge_query=eq)
    with pytest.raises(ValueError, match=r"'edge_attr' of shape \[3, F\]"):
        ta.attention_fwd(q, k, v, ptr, col, 0.3, edge_attr=ea[1:])
    with pytest.raises(TypeError, match="'edge_attr' a floating-point"):
        ta.attention_fwd(q, k, v, ptr, col, 0.3, edge_attr=ea.long())
    with pytest.raises(ValueError, match=r"'edge_query' of shape \[2, 2, 3\], got \[2, 2, 4\]"):
        ta.attention_fwd(q, k, v, ptr, col, 0.3, edge_attr=ea, edge_query=eq[..., [0, 1, 2, 0]])
    out, lse, _ = ta.attention_fwd(q, k, v, ptr, col, 0.3, edge_attr=ea)
    with pytest.raises(ValueError, match="'grad_edge_out' of shape"):
        ta.attention_bwd(q, k, v, out, lse, out, ptr, col, 0.3, edge_attr=ea, grad_edge_out=ge[:1])
    with pytest.raises(ValueError, match="'edge_attr' with 'grad_edge_out'"):
        ta.attention_bwd(q, k, v, out, lse, out, ptr, col, 0.3, grad_edge_out=ge)


# ------------------------------------------------------------------ the operator


def test_triton_edge_operator_fused_path_equals_mp(monkeypatch) -> None:
    """``gnnattn.attention`` with key- and value-side edge features, routed as on CUDA
    (the Triton kernels, here on CPU tensors under the interpreter), against "mp":
    outputs and the gradients of q, k, v, edge_attr and both weight maps."""
    calls = []

    def counted(fn):
        @functools.wraps(fn)
        def call(*args, **kw):
            calls.append((fn.__name__, sorted(k for k in kw if k.startswith("edge"))))
            return fn(*args, **kw)

        return call

    monkeypatch.setattr(kernels, "get", lambda device: triton_ops)
    for name in ("attention_fwd", "attention_bwd"):
        monkeypatch.setattr(triton_ops, name, counted(getattr(triton_ops, name)))
    gen = torch.Generator().manual_seed(3)
    n, h, c, nf = 6, 2, 3, 3
    ei = torch.randint(0, n, (2, 16), generator=gen)
    ei[1][ei[1] == 4] = 5  # target 4 isolated
    graph = AttentionGraph(ei.to(DEV), n)
    q, k, v = (torch.randn(n, h, c, generator=gen, dtype=F64).to(DEV) for _ in range(3))
    ea = torch.randn(16, nf, generator=gen, dtype=F64).to(DEV)
    wk, wv = (torch.randn(h * c, nf, generator=gen, dtype=F64).to(DEV) for _ in range(2))
    ins = [t.requires_grad_() for t in (q, k, v, ea, wk, wv)]
    choice = backend_for(q, graph, edge_attr=True)
    assert choice.backend == "fused" and "fused" in choice.reason
    res = {}
    for backend in ("fused", "mp"):
        r = gnnattn.attention(*ins[:3], graph, edge_attr=ea, edge_key=wk, edge_value=wv,
                              backend=backend, return_lse=True)  # fmt: skip
        assert r.backend == backend
        g = torch.randn(r.out.shape, generator=torch.Generator().manual_seed(1), dtype=F64)
        g = g.to(DEV)
        res[backend] = (r.out, *torch.autograd.grad((r.out * g).sum(), ins))
    for x, y in zip(res["fused"], res["mp"], strict=True):
        torch.testing.assert_close(x, y, atol=1e-10, rtol=1e-10)
    # The Triton kernels ran, given the edge options (and edge_out for D_i).
    assert calls == [
        ("attention_fwd", ["edge_attr", "edge_query"]),
        ("attention_bwd", ["edge_attr", "edge_out", "edge_query"]),
    ]


# ------------------------------------------------------------------ on a GPU


@requires_cuda
@pytest.mark.gpu
def test_triton_cuda_edge_features_large() -> None:
    """At scale, compiled: a 3000-edge hub target and hub source, F = 16, H = 4, C = 64,
    every option, default blocks; float32 against float64. Sums of ~3000 terms: 1e-4
    relative to the largest entry."""
    torch.manual_seed(4)
    lens = [0, 1, 17, 3000, *torch.randint(0, 48, (4000,)).tolist()]
    _check(lens, 4, 16, bias=True, dropout=DROP, tol=1e-4, blocks={}, m=3000, c=64, cv=64)


@pytest.mark.parametrize("query", [False, True])
def test_triton_without_dedge_attr_the_other_gradients_are_the_same(query: bool) -> None:
    # need_dedge_attr=False compiles the dq pass without d edge_attr's sum and
    # store (HAS_DEA): every other gradient must be the same, bit for bit.
    q, k, v, ptr, col, b, ea, eq, ge = _inputs(LENS, 3, 3, dtype=F64)
    kw = dict(dropout=DROP, edge_attr=ea, edge_query=eq if query else None, **BLOCKS)
    out, lse, eo = ta.attention_fwd(q, k, v, ptr, col, 0.3, b, **kw)
    go = torch.randn_like(out)
    args = (q, k, v, out, lse, go, ptr, col, 0.3, b)
    full = ta.attention_bwd(*args, **kw, grad_edge_out=ge, edge_out=eo)
    lean = ta.attention_bwd(*args, **kw, grad_edge_out=ge, edge_out=eo, need_dedge_attr=False)
    assert full[4] is not None and lean[4] is None
    for name, x, y in zip(NAMES, full, lean, strict=True):
        if name != "dedge_attr":
            assert (x is None) == (y is None), name
            assert x is None or torch.equal(x, y), name
    # No edges: still no dedge_attr.
    q, k, v, ptr, col, b, ea, eq, ge = _inputs([0, 0], 2, 3, m=2, c=4, cv=3, dtype=F64)
    out, lse, _ = ta.attention_fwd(q, k, v, ptr, col, 0.5, b, edge_attr=ea)
    grads = ta.attention_bwd(q, k, v, out, lse, out + 1, ptr, col, 0.5, b, edge_attr=ea,
                             need_dedge_attr=False)  # fmt: skip
    assert grads[4] is None and (grads[0] == 0).all()
