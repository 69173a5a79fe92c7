"""Raw edge features by linearity: the kernels' ``edge_attr`` / ``edge_query`` options
against the reference, the operator's fused path against the direct ``"mp"`` one, and
``SelfAttentionConv(edge_value=True)`` against its previous formulation.

Each combination of options is one more compiled specialisation of every kernel
(seconds of compile time each on a cold cache), so the combinations below are
the ones the operator makes (edge query and ``edge_out`` gradient; ``edge_out``
gradient alone, as ``SelfAttentionConv``; edge query alone), each with and
without dropout, and the awkward sizes run on the richest of them.
"""

import pytest
import torch
from test_kernels_cpu import CASES, DROP, TOL64, assert_close, edge_inputs

import gnnattn
from gnnattn import AttentionGraph, SelfAttentionConv
from gnnattn.kernels import cpu
from gnnattn.kernels import reference as ref
from gnnattn.kernels.cpu import plans
from gnnattn.ops import backend_for

F64, F32 = torch.float64, torch.float32
NF = 5  # edge features: not a power of two, not the head dim

# float32 kernels against the float64 reference on the same inputs: as in
# test_kernels_cpu (TOL32 there), sums of a few hundred terms and short dot
# products are good to ~1e-6 relative; the edge term adds F = 5 products per
# score, well inside the same 2e-6 bound per unit of score.
TOL32 = 2e-6

# The cases without hubs (no piece kernels: fewer specialisations to compile).
SMALL = ["ragged", "one node", "no edges", "empty graph", "duplicates"]


def edge_case(case, dtype, with_bias=False, query=True, grad=True, seed=5, per_head=False):
    q, k, v, ptr, col, bias = edge_inputs(case, dtype, with_bias, seed=seed)
    g = torch.Generator().manual_seed(seed + 2)
    n, h = q.shape[:2]
    shape = (col.numel(), h, NF) if per_head else (col.numel(), NF)
    ea = torch.randn(shape, generator=g, dtype=dtype)
    eq = torch.randn(n, h, NF, generator=g, dtype=dtype) if query else None
    ge = torch.randn(n, h, NF, generator=g, dtype=dtype) if grad else None
    return q, k, v, ptr, col, bias, ea, eq, ge


def check_kernel(case, *, with_bias=False, dropout=None, query=True, grad=True, logits=1.0,
                 dtype=F64, tol=TOL64, per_head=False):  # fmt: skip
    q, k, v, ptr, col, bias, ea, eq, ge = edge_case(
        case, dtype, with_bias, query, grad, per_head=per_head
    )
    q = q * logits
    kw = dict(dropout=dropout, edge_attr=ea, edge_query=eq)
    got = cpu.attention_fwd(q, k, v, ptr, col, 0.3, bias, **kw)
    d64 = [None if t is None else t.double() for t in (q, k, v, bias, ea, eq, ge)]
    q6, k6, v6, b6, ea6, eq6, ge6 = d64
    kw6 = dict(dropout=dropout, edge_attr=ea6, edge_query=eq6)
    want = ref.attention_fwd(q6, k6, v6, ptr, col, 0.3, b6, **kw6)
    assert len(got) == 3 and got[2].shape == (q.shape[0], q.shape[1], NF)
    assert torch.equal(torch.isneginf(got[1]), torch.isneginf(want[1]))
    fin = torch.isfinite(want[1])
    assert_close(got[0], want[0], tol)
    assert_close(got[1][fin], want[1][fin], tol)
    assert_close(got[2], want[2], tol)
    g = torch.randn(got[0].shape, generator=torch.Generator().manual_seed(9), dtype=dtype)
    bwd = cpu.attention_bwd(q, k, v, None, got[1], g, ptr, col, 0.3, bias, **kw, grad_edge_out=ge)
    ref_bwd = ref.attention_bwd(
        q6, k6, v6, None, want[1], g.double(), ptr, col, 0.3, b6, **kw6, grad_edge_out=ge6
    )
    assert len(bwd) == 6
    for a, b in zip(bwd, ref_bwd, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            assert a.dtype == dtype
            assert_close(a, b, tol)


# ------------------------------------------------------------------ kernels


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("logits", [1.0, 1e3])
def test_edge_query_and_edge_out_match_reference(case, with_bias, logits):
    # Every awkward size (hubs: the piece kernels of both passes), a target whose
    # scores are all -inf (with_bias), logits scaled by 1e3.
    check_kernel(case, with_bias=with_bias, logits=logits)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dropout", [None, DROP])
def test_per_head_edge_features_match_reference(case, dropout):
    """Edge features ``[E, H, F]``, a row per head (what the operator makes of a small
    graph's ``W a_ij``), with a bias and 1e3 logits: forward, and every gradient
    (``dedge_attr`` per head) against the reference."""
    check_kernel(case, with_bias=True, dropout=dropout, logits=1e3, per_head=True)


@pytest.mark.parametrize(("query", "grad"), [(False, True), (True, False), (False, False)])
@pytest.mark.parametrize("dropout", [None, DROP])
def test_per_head_edge_gradient_with_a_term_absent(query, grad, dropout):
    """``dedge_attr`` per head is stored whole (``dse eq_i + a f gg_i``, no zeroing): with
    the edge query's term or ``edge_out``'s gradient absent, the other alone (or 0)."""
    check_kernel("ragged", dropout=dropout, query=query, grad=grad, per_head=True)


@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("case", ["ragged", "source hub"])
def test_source_pass_from_ds_alone_with_edge_features(case, per_head):
    """The source pass given ``dS`` alone (no stored weights) recomputes the scores with
    their edge term, per head or shared, and gives the reference's ``dk``, ``dv``."""
    from gnnattn.graphs.csr import transpose_csr
    from gnnattn.kernels.cpu import backward

    q, k, v, ptr, col, bias, ea, eq, ge = edge_case(case, F64, True, per_head=per_head)
    kw = dict(dropout=DROP, edge_attr=ea, edge_query=eq)
    out, lse, _ = cpu.attention_fwd(q, k, v, ptr, col, 0.3, bias, **kw)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(4), dtype=F64)
    dst = backward._bwd_dst(q, k, v, lse, g, ptr, col, 0.3, bias, **kw, grad_edge_out=ge)
    csc = transpose_csr(ptr, col, k.shape[0])
    dk, dv = cpu.attention_bwd_src(q, k, v, dst[1], g, csc, 0.3, bias, **kw, ds=dst[2])
    want = ref.attention_bwd(q, k, v, None, lse, g, ptr, col, 0.3, bias, **kw, grad_edge_out=ge)
    assert_close(dk, want[1], TOL64)
    assert_close(dv, want[2], TOL64)


@pytest.mark.parametrize("case", ["ragged", "hub"])
def test_per_head_edge_features_are_a_key_term(case):
    # With q as the edge query, per-head features join the keys and (through
    # edge_out) the values as PyG's layer adds them: attention over per-edge keys
    # k_j + e_ij and values v_j + e_ij (each edge its own source), in the reference
    # and the kernels, forward and backward; a missing or doubled scale fails here.
    q, k, v, ptr, col, _ = edge_inputs(case, F64, False)
    g = torch.Generator().manual_seed(7)
    e = torch.randn(col.numel(), *q.shape[1:], generator=g, dtype=F64)  # (E, H, C)
    v = torch.randn(k.shape, generator=g, dtype=F64)  # values as wide as the edge term
    dout = torch.randn(q.shape, generator=g, dtype=F64)
    ins = [t.clone().requires_grad_() for t in (q, k, v, e)]
    ids = torch.arange(col.numel())
    keys, values = ins[1][col] + ins[3], ins[2][col] + ins[3]  # (E, H, C) each
    want, want_lse = ref.attention_fwd(ins[0], keys, values, ptr, ids, 0.3)
    dq, dk, dv, de = torch.autograd.grad((want * dout).sum(), ins)
    fin = torch.isfinite(want_lse)  # -inf for a target without an edge
    for kern in (ref, cpu):
        out, lse, eo = kern.attention_fwd(q, k, v, ptr, col, 0.3, edge_attr=e, edge_query=q)
        assert_close(out + eo, want.detach(), TOL64)
        assert torch.equal(fin, torch.isfinite(lse))
        assert_close(lse[fin], want_lse[fin].detach(), TOL64)
        opts = dict(edge_attr=e, edge_query=q, grad_edge_out=dout)
        got = kern.attention_bwd(q, k, v, None, lse, dout, ptr, col, 0.3, **opts)
        # q reaches the scores twice, as the query and as the edge query.
        assert_close(got[0] + got[5], dq, TOL64)
        for a, b in zip(got[1:3] + got[4:5], (dk, dv, de), strict=True):
            assert_close(a, b, TOL64)


@pytest.mark.parametrize("case", ["ragged", "hub"])
def test_per_head_edge_features_in_float32(case):
    check_kernel(case, dtype=F32, tol=TOL32, per_head=True)


@pytest.mark.parametrize("case", [*SMALL, "hub", "source hub"])
def test_edge_features_with_dropout_match_reference(case):
    check_kernel(case, with_bias=True, dropout=DROP)


@pytest.mark.parametrize("case", SMALL)
@pytest.mark.parametrize("dropout", [None, DROP])
def test_edge_out_alone_matches_reference(case, dropout):
    # What SelfAttentionConv(edge_value=True) runs: no edge query.
    check_kernel(case, with_bias=True, dropout=dropout, query=False)


@pytest.mark.parametrize("dropout", [None, DROP])
def test_edge_query_without_edge_out_gradient_matches_reference(dropout):
    # An operator with edge_key only: edge_out is unused, its gradient None.
    check_kernel("ragged", with_bias=True, dropout=dropout, grad=False)


def test_edge_features_on_hub_pieces_of_every_segment(monkeypatch):
    # Pieces of 3 edges: edge_out's and d edge_query's accumulators are merged.
    monkeypatch.setattr(plans, "_PIECE_MIN", 3)
    monkeypatch.setattr(plans, "_PIECES", 10**9)
    check_kernel("ragged", with_bias=True)
    check_kernel("source hub")


@pytest.mark.parametrize("case", ["ragged", "hub"])
def test_edge_features_in_float32(case):
    check_kernel(case, with_bias=True, dropout=DROP, dtype=F32, tol=TOL32)


@pytest.mark.parametrize("per_head", [False, True])
def test_reference_edge_backward_is_autograd_of_its_forward(per_head):
    q, k, v, ptr, col, bias, ea, eq, ge = edge_case("ragged", F64, True, per_head=per_head)
    ins = [t.clone().requires_grad_() for t in (q, k, v, bias, ea, eq)]
    out, lse, eo = ref.attention_fwd(
        *ins[:3], ptr, col, 0.3, ins[3], dropout=DROP, edge_attr=ins[4], edge_query=ins[5]
    )
    g = torch.randn_like(out)
    auto = torch.autograd.grad((out * g).sum() + (eo * ge).sum(), ins)
    mine = ref.attention_bwd(
        q, k, v, None, lse.detach(), g, ptr, col, 0.3, bias, dropout=DROP, edge_attr=ea,
        edge_query=eq, grad_edge_out=ge,
    )  # fmt: skip
    for a, b in zip(mine, auto, strict=True):
        assert_close(a, b, TOL64)


@pytest.mark.parametrize("case", ["ragged", "hub"])
@pytest.mark.parametrize("query", [False, True])
def test_without_dedge_attr_the_other_gradients_are_bitwise_the_same(case, query):
    # need_dedge_attr=False (edge_attr needs no gradient) compiles the passes
    # without d edge_attr's sum and store: nothing else may change.
    q, k, v, ptr, col, bias, ea, eq, ge = edge_case(case, F64, True, query=query)
    kw = dict(dropout=DROP, edge_attr=ea, edge_query=eq)
    _, lse, _ = cpu.attention_fwd(q, k, v, ptr, col, 0.3, bias, **kw)
    shape = (q.shape[0], q.shape[1], v.shape[2])
    g = torch.randn(shape, generator=torch.Generator().manual_seed(9), dtype=F64)
    args = (q, k, v, None, lse, g, ptr, col, 0.3, bias)
    for mod in (cpu, ref):
        full = mod.attention_bwd(*args, **kw, grad_edge_out=ge)
        lean = mod.attention_bwd(*args, **kw, grad_edge_out=ge, need_dedge_attr=False)
        assert full[4] is not None and lean[4] is None
        for i in (0, 1, 2, 3, 5):
            assert (full[i] is None) == (lean[i] is None)
            if full[i] is not None:
                assert torch.equal(full[i], lean[i]), (mod.__name__, i)


def test_operator_asks_for_dedge_attr_only_when_edge_attr_needs_it(monkeypatch):
    q, k, v, graph, ea, _, wv = op_inputs()
    asked = []
    real = cpu.attention_bwd_op

    def spy(*args):
        asked.append(args[12])  # need_dedge_attr (then grad_lse)
        return real(*args)

    monkeypatch.setattr(cpu, "attention_bwd_op", spy)
    grads = {}
    for needs in (False, True):
        xs = [t.clone().requires_grad_() for t in (q, k, v, wv)]
        e = ea.clone().requires_grad_(needs)
        out = gnnattn.attention(xs[0], xs[1], xs[2], graph, edge_attr=e, edge_value=xs[3],
                                backend="fused")  # fmt: skip
        out.sum().backward()
        grads[needs] = [t.grad for t in xs]
        assert (e.grad is not None) == needs
    assert asked == [False, True]
    for a, b in zip(grads[False], grads[True], strict=True):
        assert torch.equal(a, b)


def test_without_edge_attr_the_results_are_unchanged():
    q, k, v, ptr, col, bias, ea, eq, _ = edge_case("ragged", F64, True)
    assert len(cpu.attention_fwd(q, k, v, ptr, col, 0.3, bias)) == 2
    assert len(ref.attention_fwd(q, k, v, ptr, col, 0.3, bias)) == 2
    with pytest.raises(ValueError, match="'edge_attr'"):
        cpu.attention_fwd(q, k, v, ptr, col, 0.3, edge_query=eq)
    with pytest.raises(ValueError, match="'edge_attr'"):
        cpu.attention_fwd(q, k, v, ptr, col, 0.3, edge_attr=ea[1:])
    with pytest.raises(ValueError, match="'edge_query'"):
        cpu.attention_fwd(q, k, v, ptr, col, 0.3, edge_attr=ea, edge_query=eq[:, :, 1:])


# ------------------------------------------------------------------ operator


def op_inputs(dtype=F64, n=9, m=9, h=3, c=5, cv=4, seed=0):
    """A graph with isolated targets, a duplicate edge and unsorted edges (a CSR perm)."""
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, min(n, m), (2, 31), generator=g)
    ei[1][ei[1] == 2] = 3  # target 2 isolated
    ei = torch.cat([ei, ei[:, :1]], 1)  # a duplicate edge
    q = torch.randn(n, h, c, generator=g, dtype=dtype)
    k = torch.randn(m, h, c, generator=g, dtype=dtype)
    v = torch.randn(m, h, cv, generator=g, dtype=dtype)
    ea = torch.randn(ei.shape[1], NF, generator=g, dtype=dtype)
    wk = torch.randn(h * c, NF, generator=g, dtype=dtype) * 0.5
    wv = torch.randn(h * cv, NF, generator=g, dtype=dtype) * 0.5
    return q, k, v, AttentionGraph(ei, n, num_src=m), ea, wk, wv


@pytest.mark.parametrize("which", ["both", "key", "value"])
@pytest.mark.parametrize("p", [0.0, 0.3])
def test_fused_equals_mp_with_edge_features(which, p):
    q, k, v, graph, ea, wk, wv = op_inputs()
    wk = wk if which in ("both", "key") else None
    wv = wv if which in ("both", "value") else None
    ins = [t for t in (q, k, v, ea, wk, wv) if t is not None]
    res = {}
    for backend in ("fused", "mp"):
        xs = [t.clone().requires_grad_() for t in ins]
        it = iter(xs)
        qq, kk, vv, eaa = next(it), next(it), next(it), next(it)
        ekk = next(it) if wk is not None else None
        evv = next(it) if wv is not None else None
        torch.manual_seed(3)  # the same dropout key on both
        r = gnnattn.attention(
            qq, kk, vv, graph, edge_attr=eaa, edge_key=ekk, edge_value=evv, dropout_p=p,
            backend=backend, return_lse=True, need_weights=True,
        )  # fmt: skip
        assert r.backend == backend
        g = torch.randn(r.out.shape, generator=torch.Generator().manual_seed(1), dtype=F64)
        res[backend] = (r.out, r.lse, r.weights, *torch.autograd.grad((r.out * g).sum(), xs))
    for a, b in zip(res["fused"], res["mp"], strict=True):
        a, b = a.detach(), b.detach()
        assert torch.equal(torch.isneginf(a), torch.isneginf(b))  # lse of the isolated target
        fin = torch.isfinite(b)
        assert_close(a[fin], b[fin], TOL64)


@pytest.mark.parametrize("p,m", [(0.0, 9), (0.3, 9), (0.3, 6)])
@pytest.mark.parametrize("per_head", [True, False])
def test_one_edge_map_for_keys_and_values(p, m, per_head, monkeypatch):
    """``TransformerConv``'s case, one map ``W`` for keys and values: a small graph's
    edge term goes to the kernels per edge and head (``a_ij W^T``, ``[E, H, C]``),
    a larger one's by the algebra; both equal ``"mp"``: outputs, ``lse``, weights
    and every gradient, ``W``'s included, with dropout and with cross-attention."""
    monkeypatch.setattr(cpu.forward, "PER_HEAD_EDGES_MAX", 1 << 30 if per_head else 0)
    monkeypatch.setattr(cpu.forward, "PER_HEAD_EDGES_DEGREE", 100)
    seen = []
    real = cpu.attention_fwd_op

    def spy(q, k, v, ptr, col, plan, bias, edge_attr, *rest):
        seen.append(edge_attr.dim())
        return real(q, k, v, ptr, col, plan, bias, edge_attr, *rest)

    monkeypatch.setattr(cpu, "attention_fwd_op", spy)
    q, k, v, graph, ea, w, _ = op_inputs(m=m, c=4, cv=4)  # m = 6: cross-attention
    res = {}
    for backend in ("fused", "mp"):
        xs = [t.clone().requires_grad_() for t in (q, k, v, ea, w)]
        torch.manual_seed(3)  # the same dropout key on both
        r = gnnattn.attention(
            *xs[:3], graph, edge_attr=xs[3], edge_key=xs[4], edge_value=xs[4], dropout_p=p,
            backend=backend, return_lse=True, need_weights=True,
        )  # fmt: skip
        g = torch.randn(r.out.shape, generator=torch.Generator().manual_seed(1), dtype=F64)
        res[backend] = (r.out, r.lse, r.weights, *torch.autograd.grad((r.out * g).sum(), xs))
    assert seen == [3 if per_head else 2]
    for a, b in zip(res["fused"], res["mp"], strict=True):
        a, b = a.detach(), b.detach()
        assert torch.equal(torch.isneginf(a), torch.isneginf(b))  # lse of the isolated target
        fin = torch.isfinite(b)
        assert_close(a[fin], b[fin], TOL64)


def test_per_head_edge_term_only_on_small_sparse_graphs():
    """A batch of molecules (about 2 edges per target) takes the per-edge term; a
    graph of 16 edges per target, or one past the size limit, the algebra."""
    assert cpu.per_head_edges(1988, 896, 4, 16)
    assert not cpu.per_head_edges(16 * 2000, 2000, 4, 16)
    assert not cpu.per_head_edges(2 * 10**6, 10**6, 4, 16)


def test_fused_edge_features_pass_gradcheck():
    q, k, v, graph, ea, wk, wv = op_inputs(n=4, m=3, h=2, c=3, cv=2)
    ei = torch.tensor([[0, 1, 2, 0, 2], [0, 0, 1, 3, 3]])
    graph = AttentionGraph(ei, 4, num_src=3)  # target 2 isolated
    ea = ea[:5]
    ins = [t.clone().requires_grad_() for t in (q, k, v, ea, wk, wv)]

    def f(q, k, v, ea, wk, wv):
        return gnnattn.attention(
            q, k, v, graph, edge_attr=ea, edge_key=wk, edge_value=wv, backend="fused"
        )

    assert torch.autograd.gradcheck(f, ins)


def test_edge_features_route_away_from_sdpa_and_kernels_without_them(monkeypatch):
    q, k, v, _, ea, wk, wv = op_inputs(n=4, m=4)
    graph = AttentionGraph.complete(4)
    ea = ea[:16]
    choice = backend_for(q, graph, edge_attr=True)
    assert choice.backend == "fused"
    with pytest.raises(ValueError, match="sdpa"):
        backend_for(q, graph, backend="sdpa", edge_attr=True)
    r = gnnattn.attention(q, k, v, graph, edge_attr=ea, edge_value=wv, need_weights=True)
    assert r.backend == "fused"
    # A fused backend declared without the option: "auto" takes "mp" and says why,
    # and asking for "fused" by name is refused.
    import types

    import gnnattn.ops.choice as choice_mod

    decl = dict(choice_mod.DECLARATIONS)
    decl["fused"] = decl["fused"]._replace(options=decl["fused"].options - {"edge_attr"})
    monkeypatch.setattr(choice_mod, "DECLARATIONS", types.MappingProxyType(decl))
    sparse = AttentionGraph(torch.tensor([[0], [1]]), 4)
    c = backend_for(q, sparse, edge_attr=True)
    assert c.backend == "mp" and "edge features" in c.reason
    with pytest.raises(ValueError, match="backend='fused' does not take edge features"):
        backend_for(q, sparse, backend="fused", edge_attr=True)


def test_edge_arguments_are_checked():
    q, k, v, graph, ea, wk, wv = op_inputs()
    with pytest.raises(ValueError, match="'edge_attr'"):
        gnnattn.attention(q, k, v, graph, edge_value=wv)
    with pytest.raises(ValueError, match="'edge_key' and/or 'edge_value'"):
        gnnattn.attention(q, k, v, graph, edge_attr=ea)
    with pytest.raises(ValueError, match="'edge_attr'"):
        gnnattn.attention(q, k, v, graph, edge_attr=ea[1:], edge_value=wv)
    with pytest.raises(ValueError, match="'edge_key'"):
        gnnattn.attention(q, k, v, graph, edge_attr=ea, edge_key=wv)


# ------------------------------------------------------------------ layer


def old_formulation(layer, x, ei, edge_attr):
    """SelfAttentionConv(edge_value=True) as it was: the value bias lin_edge_value(e) [E, D]
    added to every message, written out in torch (no backend takes a value bias now)."""
    n, h, c = x.shape[0], layer.num_heads, layer.head_dim
    q = layer.lin_query(x).view(n, h, c)
    k = layer.lin_key(x).view(n, h, c)
    v = layer.lin_value(x).view(n, h, c)
    src, dst = ei
    s = (q[dst] * k[src]).sum(-1) * layer.scale + layer.lin_edge(edge_attr)  # (E, H)
    alpha = gnnattn.scatter_softmax(s, dst, n)  # (E, H)
    msg = v[src] + layer.lin_edge_value(edge_attr).view(-1, h, c)  # (E, H, C)
    o = torch.zeros(n, h, c, dtype=x.dtype).index_add(0, dst, alpha.unsqueeze(-1) * msg)
    return layer.lin_out(o.reshape(n, -1))


@pytest.mark.parametrize("backend", ["fused", "mp"])
def test_self_attention_conv_edge_value_equals_its_previous_formulation(backend):
    torch.manual_seed(0)
    layer = SelfAttentionConv(12, 3, edge_dim=NF, edge_value=True, backend=backend).double()
    n = 8
    ei = torch.randint(0, n, (2, 30))
    ei[1][ei[1] == 5] = 6  # an isolated target
    x = torch.randn(n, 12, dtype=F64, requires_grad=True)
    ea = torch.randn(30, NF, dtype=F64, requires_grad=True)
    params = list(layer.parameters())
    g = torch.randn(n, 12, dtype=F64)
    new = layer(x, ei, ea)
    old = old_formulation(layer, x, ei, ea)
    assert_close(new.detach(), old.detach(), TOL64)
    for a, b in zip(
        torch.autograd.grad((new * g).sum(), [x, ea, *params]),
        torch.autograd.grad((old * g).sum(), [x, ea, *params]),
        strict=True,
    ):
        assert_close(a, b, TOL64)
    assert layer.backend_for(x, ei, ea).backend == backend


def test_self_attention_conv_edge_value_with_dropout_fused_equals_mp():
    torch.manual_seed(0)
    layer = SelfAttentionConv(12, 3, dropout=0.3, edge_dim=NF, edge_value=True).double().train()
    ei = torch.randint(0, 8, (2, 30))
    x = torch.randn(8, 12, dtype=F64)
    ea = torch.randn(30, NF, dtype=F64)
    outs = []
    for backend in ("fused", "mp"):
        torch.manual_seed(4)
        outs.append(layer(x, ei, ea, backend=backend))
    assert_close(outs[0].detach(), outs[1].detach(), TOL64)
