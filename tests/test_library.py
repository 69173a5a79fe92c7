"""The kernels as operators (``torch.ops.gnnattn.*``): registration, fakes, autograd.

``torch.library.opcheck`` runs each op for real, through its fake kernel, through
autograd and through AOTAutograd with dynamic shapes, and compares. The CPU ops run
the numba kernels; on a CUDA machine the same checks run the Triton ones.
"""

from __future__ import annotations

import os

import pytest
import torch

from gnnattn import AttentionGraph
from gnnattn.kernels import COMPILED, library
from gnnattn.kernels.library import attention, draw_key, plan_tensors

DEV = "cuda" if torch.cuda.is_available() else "cpu"

pytestmark = pytest.mark.skipif(
    DEV not in COMPILED, reason=f"no compiled kernels for {DEV} (numba / triton missing)"
)


def _graphs() -> dict[str, tuple[torch.Tensor, int, int]]:
    """``(edge_index, num_dst, num_src)`` of awkward graphs."""
    g = torch.Generator().manual_seed(0)
    hub_dst = torch.zeros(2100, dtype=torch.long)  # past the CPU kernels' 2048-edge pieces
    hub = torch.stack([torch.randint(0, 7, (2100,), generator=g), hub_dst])
    isolated = torch.tensor([[0, 1, 4, 4], [1, 1, 0, 3]])  # targets 2 and 4 have no edge
    return {
        "one_node": (torch.tensor([[0], [0]]), 1, 1),
        "empty": (torch.zeros(2, 0, dtype=torch.long), 5, 5),
        "isolated": (isolated, 5, 5),
        "hub": (torch.cat([hub, torch.tensor([[3, 5], [2, 6]])], 1), 7, 7),
        "bipartite": (torch.randint(0, 3, (2, 11), generator=g) * torch.tensor([[1], [2]]), 5, 3),
    }


def _layout(ei: torch.Tensor, n: int, m: int, planned: bool) -> dict[str, torch.Tensor]:
    graph = AttentionGraph(ei.to(DEV), n, num_src=m if m != n else None)
    ptr, col = graph.kernel_layout("csr")
    tptr, trow, tperm = graph.kernel_layout("csc")
    empty = torch.empty(0, dtype=torch.int64, device=DEV)
    plan = plan_tensors(ptr, col, m) if planned else empty
    csc_plan = plan_tensors(tptr, trow, n, perm=tperm) if planned else empty
    return dict(ptr=ptr, col=col, plan=plan, tptr=tptr, trow=trow, tperm=tperm, csc_plan=csc_plan)


def _attention_args(name: str, options: str, planned: bool, dtype: torch.dtype) -> tuple:
    ei, n, m = _graphs()[name]
    lay = _layout(ei, n, m, planned)
    e = lay["col"].numel()
    h, c, cv, f = 3, 5, 7, 3  # no power of two
    g = torch.Generator().manual_seed(1)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=dtype).to(DEV).requires_grad_()

    q, k, v = rand(n, h, c), rand(m, h, c), rand(m, h, cv)
    bias = rand(e, h) if "bias" in options else None
    ea = rand(e, f) if "edge" in options else None
    eq = rand(n, h, f) if "edge" in options else None
    key = draw_key() if "dropout" in options else None
    p = 0.3 if "dropout" in options else 0.0
    return (
        q, k, v, lay["ptr"], lay["col"], lay["plan"], lay["tptr"], lay["trow"], lay["tperm"],
        lay["csc_plan"], bias, ea, eq, key, 0.4, p,
    )  # fmt: skip


@pytest.mark.parametrize("name", list(_graphs()))
@pytest.mark.parametrize(
    "options,planned", [("", True), ("bias+dropout", False), ("edge+dropout+bias", True)]
)
def test_opcheck_attention(name: str, options: str, planned: bool) -> None:
    """Forward and backward (through the registered autograd) on awkward graphs."""
    dtype = torch.float64 if DEV == "cpu" else torch.float32
    args = _attention_args(name, options, planned, dtype)
    torch.library.opcheck(torch.ops.gnnattn.attention_fwd.default, args)


@pytest.mark.parametrize("name", ["hub", "isolated", "empty"])
def test_eager_path_equals_the_op(name: str) -> None:
    """``library.attention`` runs the op's implementation under its own autograd
    function in eager mode (no dispatcher): outputs and gradients bitwise the op's."""
    args = _attention_args(name, "edge+dropout+bias", True, torch.float64)
    results = []
    for call in (attention, torch.ops.gnnattn.attention_fwd):
        inputs = [
            a.detach().requires_grad_()
            if isinstance(a, torch.Tensor) and a.is_floating_point()
            else a
            for a in args
        ]
        out, lse, eo = call(*inputs)
        (out.sum() + (eo * 2).sum()).backward()
        grads = [t.grad for t in inputs if isinstance(t, torch.Tensor) and t.is_floating_point()]
        results.append([out, lse, eo, *grads])
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)
    with torch.no_grad():  # no autograd function at all
        assert torch.equal(attention(*args)[0], results[1][0])


def test_parameters_take_the_eager_path(monkeypatch) -> None:
    """A Parameter input (a learned score bias) runs the op's implementation directly,
    as a plain tensor does, with the op's results; a tensor subclass goes through the
    dispatcher, which honours its overrides."""
    args = _attention_args("isolated", "bias", True, torch.float64)
    args = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
    applied = []
    real = library._Attention.apply
    monkeypatch.setattr(library._Attention, "apply", lambda *a: applied.append(1) or real(*a))
    bias = torch.nn.Parameter(args[10].clone())
    out = attention(*args[:10], bias, *args[11:])[0]
    out.sum().backward()
    assert applied == [1] and bias.grad is not None
    expected = torch.ops.gnnattn.attention_fwd(*args)[0]
    assert torch.equal(out.detach(), expected)

    class Sub(torch.Tensor):
        pass

    assert not library._eager((args[0].as_subclass(Sub),))


@pytest.mark.skipif(DEV != "cpu", reason="the serial source pass is the CPU kernels'")
@pytest.mark.parametrize("name", list(_graphs()))
@pytest.mark.parametrize("options", ["", "bias+dropout", "edge+dropout+bias"])
def test_backward_without_the_transposed_csr(name: str, options: str, monkeypatch) -> None:
    """Given no transposed CSR, the op's backward does a small graph's source pass
    serially over the CSR, and makes the transposed CSR of a larger one: the gradients
    are those over the graph's transposed CSR: bitwise where both passes read the
    stored ``dS`` and ``P`` (a bias or edge features: each source's terms come in the
    same order), up to rounding where the pass over the transposed CSR recomputes
    them or sums a hub's terms in pieces."""
    import gnnattn.kernels.cpu as cpu

    args = _attention_args(name, options, True, torch.float64)
    no_csc = (*args[:6], None, None, None, args[5].new_empty(0), *args[10:])
    results = []
    cases = [(None, args), (cpu.backward.CSR_SOURCE_PASS_MAX, no_csc), (0, no_csc)]
    for limit, inputs in cases:
        if limit is not None:
            monkeypatch.setattr(cpu.backward, "CSR_SOURCE_PASS_MAX", limit)
        leaves = [
            a.detach().requires_grad_()
            if isinstance(a, torch.Tensor) and a.is_floating_point()
            else a
            for a in inputs
        ]
        out, _, eo = torch.ops.gnnattn.attention_fwd(*leaves)
        g = torch.Generator().manual_seed(3)
        (out * torch.randn(out.shape, generator=g, dtype=out.dtype)).sum().add(eo.sum()).backward()
        results.append([t.grad for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad])
    for got in results[1:]:
        for a, b in zip(results[0], got, strict=True):
            if name == "hub" or not options:
                torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
            else:
                assert torch.equal(a, b)


def test_traced_and_vmapped_calls_take_the_op() -> None:
    """Under torch.jit.trace and vmap the op runs (the eager shortcut would be traced
    as constants, and has no batching rule)."""
    args = _attention_args("isolated", "bias", True, torch.float64)
    args = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)

    def f(q: torch.Tensor) -> torch.Tensor:
        return attention(q, *args[1:])[0]

    q = args[0]
    traced = torch.jit.trace(f, (q,), check_trace=False)
    q2 = torch.randn_like(q)
    assert torch.equal(traced(q2), f(q2)) and not torch.equal(f(q2), f(q))
    batched = torch.vmap(f)(torch.stack([q, q2]))
    assert torch.equal(batched[0], f(q)) and torch.equal(batched[1], f(q2))


def test_opcheck_attention_backward_directly() -> None:
    args = _attention_args("hub", "edge+dropout+bias", True, torch.float64)
    q, k, v, ptr, col, plan, tptr, trow, tperm, csc_plan, bias, ea, eq, key, scale, p = args
    out, lse, eo = torch.ops.gnnattn.attention_fwd(*args)
    detached = [t.detach() if isinstance(t, torch.Tensor) else t for t in args]
    q, k, v = detached[:3]
    bias, ea, eq = detached[10:13]
    go, geo = torch.randn_like(out), torch.randn_like(eo)
    none = None if DEV == "cpu" else out.detach()
    bwd_args = (
        q, k, v, none, lse.detach(), go, ptr, col, plan, tptr, trow, tperm, csc_plan, bias, ea, eq,
        None if DEV == "cpu" else eo.detach(), geo, key, scale, p, True,
    )  # fmt: skip
    torch.library.opcheck(torch.ops.gnnattn.attention_bwd.default, bwd_args)


@pytest.mark.parametrize("segments", [[0], [3], [1, 0, 4, 2100, 0, 7]])
def test_opcheck_segment_softmax(segments: list[int]) -> None:
    counts = torch.tensor(segments)
    ptr = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)]).to(DEV)
    src = torch.randn(int(counts.sum()), 3, dtype=torch.float64, device=DEV) * 1e3
    torch.library.opcheck(
        torch.ops.gnnattn.segment_softmax_fwd.default, (src.requires_grad_(), ptr)
    )
    y = torch.ops.gnnattn.segment_softmax_fwd(src.detach(), ptr)
    torch.library.opcheck(
        torch.ops.gnnattn.segment_softmax_bwd.default, (y, torch.randn_like(y), ptr)
    )


@pytest.mark.parametrize("shape", [(0,), (1,), (7, 13), (3, 5, 17)])
def test_opcheck_activation_dropout(shape: tuple[int, ...]) -> None:
    x = torch.randn(*shape, dtype=torch.float64, device=DEV, requires_grad=True)
    key = draw_key()
    torch.library.opcheck(torch.ops.gnnattn.dropout.default, (x, key, 0.3))
    torch.library.opcheck(torch.ops.gnnattn.relu_dropout.default, (x, key, 0.3))
    y = torch.ops.gnnattn.relu_dropout(x.detach(), key, 0.3)
    torch.library.opcheck(torch.ops.gnnattn.relu_dropout_bwd.default, (y, torch.randn_like(y), 0.3))
    counter = torch.arange(int(torch.tensor(shape).prod()), device=DEV)
    torch.library.opcheck(torch.ops.gnnattn.dropout_bits.default, (counter, key))


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_opcheck_activation_dropout_on_a_strided_input(dtype: torch.dtype) -> None:
    """A transposed input (bfloat16 takes the reference, float64 the kernels): the results
    are contiguous on every path, as the fake kernels say."""
    x = torch.randn(4, 6, dtype=dtype, device=DEV).t()
    key = draw_key()
    for op in (torch.ops.gnnattn.dropout, torch.ops.gnnattn.relu_dropout):
        torch.library.opcheck(op.default, (x, key, 0.3))
    y = torch.ops.gnnattn.relu_dropout(x, key, 0.3).t()  # (4, 6), strided
    grad = torch.randn(6, 4, dtype=dtype, device=DEV).t()
    torch.library.opcheck(torch.ops.gnnattn.relu_dropout_bwd.default, (y, grad, 0.3))


@pytest.mark.parametrize("op", ["segment_softmax", "relu_dropout"])
def test_second_derivatives_of_the_softmax_and_activation_ops(op: str) -> None:
    """A gradient penalty (``create_graph=True``) through the op: its gradients, and the
    penalty's, are those of the same function in torch ops (float64; with one segment
    of 2100, past the kernels' pieces)."""
    from gnnattn.kernels import reference

    g = torch.Generator().manual_seed(4)
    x0 = torch.randn(2110, 3, generator=g, dtype=torch.float64).to(DEV)
    ptr = torch.tensor([0, 3, 3, 2103, 2110], device=DEV)
    key = draw_key()
    if op == "segment_softmax":
        calls = (
            lambda x: torch.ops.gnnattn.segment_softmax_fwd(x, ptr),
            lambda x: reference.segment_softmax_fwd(x, ptr),
        )
    else:
        calls = (
            lambda x: torch.ops.gnnattn.relu_dropout(x, key, 0.3),
            lambda x: torch.ops.gnnattn.dropout(torch.relu(x), key, 0.3),
        )
    weight = torch.randn(x0.shape, generator=g, dtype=torch.float64).to(DEV)
    results = []
    for call in calls:
        x = x0.clone().requires_grad_()
        (gx,) = torch.autograd.grad((call(x) * weight).square().sum(), x, create_graph=True)
        results.append((gx, *torch.autograd.grad(gx.square().sum(), x)))
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_dropout_ops_mask_like_the_reference_stream() -> None:
    """The ops draw the stream of :mod:`gnnattn.kernels.common` (a test that can fail:
    another hash, offset or threshold changes the kept set)."""
    from gnnattn.kernels import reference
    from gnnattn.kernels.common import Dropout

    key = torch.tensor([2**40 + 3, 11])
    x = torch.randn(50, 9, dtype=torch.float64)
    want = reference.dropout(x, Dropout(0.3, 2**40 + 3, 11))
    torch.testing.assert_close(torch.ops.gnnattn.dropout(x, key, 0.3), want, atol=0, rtol=0)
    keep = torch.ops.gnnattn.dropout_bits(torch.arange(450), key).view(50, 9) >= round(0.3 * 2**24)
    torch.testing.assert_close(want != 0, keep & (x != 0))


def test_triton_plan_tensors_round_trip() -> None:
    """The chunk tables packed into one tensor come back as the plan they were made from
    (their lengths follow from N, E and the chunk, so no host read is needed)."""
    pytest.importorskip("triton")
    from gnnattn.kernels import chunks

    for name, (ei, n, m) in _graphs().items():
        graph = AttentionGraph(ei, n, num_src=m if m != n else None)
        ptr, col = graph.csr.ptr, graph.csr.col.long()
        want = chunks.plan(ptr, col, m)
        got = chunks.plan_from_tensors(ptr, col, m, chunks.plan_tensors(ptr, col, m))
        assert (got.num_rows, got.num_edges, got.num_cols, got.chunk) == (
            want.num_rows, want.num_edges, want.num_cols, want.chunk
        ), name  # fmt: skip
        for a, b in zip(got.chunks, want.chunks, strict=True):
            assert a == b if isinstance(a, int) else torch.equal(a, b), name


@pytest.mark.parametrize("name", ["isolated", "bipartite"])
def test_opcheck_attention_on_the_triton_kernels(name: str, monkeypatch) -> None:
    """The same registration serving the Triton kernels (as on CUDA), here on CPU tensors
    under Triton's interpreter: forward and backward through opcheck, plans included."""
    if DEV != "cpu" or os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("on a GPU the CUDA tests above run the Triton kernels compiled")
    pytest.importorskip("triton")
    import gnnattn.kernels as kernels
    from gnnattn.kernels import chunks, triton_ops

    monkeypatch.setattr(kernels, "get", lambda device: triton_ops)
    args = _attention_args(name, "edge+dropout+bias", True, torch.float64)
    n, e = args[3].numel() - 1, args[4].numel()
    # Triton's plan (chunk tables, each padded to an even length), not the CPU
    # kernels' (chunks and hub pieces).
    grid, split = n + e // chunks.DEFAULT_CHUNK, 2 * (e // chunks.DEFAULT_CHUNK) + 1
    assert args[5].numel() == sum(x + x % 2 for x in (n + 1, grid, split, grid))
    torch.library.opcheck(torch.ops.gnnattn.attention_fwd.default, args)
