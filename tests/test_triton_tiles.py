"""The Triton tile kernels against the torch tile reference, and compiled for sm_90.

Without a GPU they run through Triton's interpreter (``TRITON_INTERPRET=1``,
set by the root ``conftest.py``) on CPU tensors, at small sizes with
``block_k=16`` so that a window's columns take several steps. Every test name
contains ``triton``.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap

import pytest
import torch

pytest.importorskip("triton")

from gnnattn import AttentionGraph  # noqa: E402
from gnnattn.graphs import causal_graph, complete_graph, sliding_window_graph  # noqa: E402
from gnnattn.graphs.blocks import block_plan  # noqa: E402
from gnnattn.kernels.tiles import tile_attention  # noqa: E402
from gnnattn.kernels.triton_tiles import tile_attention_triton  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
# float64: the same sums in other orders (online softmax against two passes).
# float32: rounding of 8-16 products per score and of the exponentials.
TOL = {
    torch.float64: dict(atol=1e-10, rtol=1e-10),
    torch.float32: dict(atol=2e-5, rtol=2e-5),
}


def _batch_graph() -> AttentionGraph:
    # Complete blocks of awkward lengths (one of a single node) and an isolated node.
    ei = complete_graph(batch=torch.tensor([0] * 11 + [1] + [2] * 19 + [3] * 5))
    return AttentionGraph(ei, num_nodes=37)


def _random_graph() -> AttentionGraph:
    g = torch.Generator().manual_seed(3)
    src = torch.randint(0, 30, (90,), generator=g)
    dst = torch.randint(0, 27, (90,), generator=g)  # targets 27-29 without edges
    return AttentionGraph(torch.stack([src, dst]), num_nodes=30)


GRAPHS = {
    "window": lambda: AttentionGraph(sliding_window_graph(45, window=6)),
    "causal": lambda: AttentionGraph(causal_graph(23)),
    "batch": _batch_graph,
    "random": _random_graph,
    "one node": lambda: AttentionGraph(torch.tensor([[0], [0]]), num_nodes=1),
    "no edge": lambda: AttentionGraph(torch.zeros(2, 0, dtype=torch.long), num_nodes=4),
    "bipartite": lambda: AttentionGraph(
        torch.tensor([[0, 3, 5, 5, 1, 2], [0, 0, 1, 2, 3, 3]]), num_nodes=5, num_src=7
    ),
}


def _inputs(graph: AttentionGraph, dtype: torch.dtype, cq: int = 8, cv: int = 12, h: int = 3):
    n, m, e = graph.num_dst, graph.num_src, graph.num_edges
    q = torch.randn(n, h, cq, dtype=dtype, device=DEV)
    k = torch.randn(m, h, cq, dtype=dtype, device=DEV)
    v = torch.randn(m, h, cv, dtype=dtype, device=DEV)
    bias = torch.randn(e, h, dtype=dtype, device=DEV)
    keep = torch.rand(e, h, device=DEV) > 0.25
    factor = keep.to(dtype) / 0.75
    return q, k, v, bias, factor


def _both(graph, q, k, v, scale, bias, factor, block: int = 16):
    """Outputs, lse and gradients of the reference and of the Triton kernels."""
    plan = block_plan(graph.to(q.device), block)
    res = []
    for run in (
        lambda *a: tile_attention(*a, need_lse=True)[:2],
        lambda *a: tile_attention_triton(*a, block_k=16),
    ):
        ins = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        b = bias.detach().clone().requires_grad_() if bias is not None else None
        out, lse = run(*ins, plan, scale, b, factor)
        torch.manual_seed(7)
        go = torch.randn(out.shape, dtype=out.dtype, device=out.device)
        fin = torch.where(torch.isfinite(lse), lse, 0.0)
        loss = (out * go).sum() + (fin * torch.linspace(0, 1, fin.numel()).view_as(fin)).sum()
        wrt = ins + ([b] if b is not None else [])
        grads = torch.autograd.grad(loss, wrt, allow_unused=True) if loss.requires_grad else ()
        res.append((out, lse, grads))
    return res


@pytest.mark.parametrize("name", list(GRAPHS))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("options", ["plain", "bias", "bias+dropout"])
def test_triton_tiles_equal_the_reference(name: str, dtype: torch.dtype, options: str) -> None:
    graph = GRAPHS[name]()
    q, k, v, bias, factor = _inputs(graph, dtype)
    b = bias if "bias" in options else None
    f = factor if "dropout" in options else None
    (o1, l1, g1), (o2, l2, g2) = _both(graph, q, k, v, 0.37, b, f)
    torch.testing.assert_close(o2, o1, **TOL[dtype])
    torch.testing.assert_close(l2, l1, **TOL[dtype])
    assert len(g1) == len(g2)
    for x, y in zip(g2, g1, strict=True):
        if y is None:
            assert x is None or not x.abs().any()
        else:
            torch.testing.assert_close(x, y, **TOL[dtype])


def test_triton_tiles_empty_rows_and_large_logits() -> None:
    """Targets without edges get zeros and lse -inf; logits scaled by 1e3 stay finite."""
    graph = _random_graph()
    q, k, v, bias, _ = _inputs(graph, torch.float64)
    (o1, l1, g1), (o2, l2, g2) = _both(graph, q * 1e3, k, v, 1.0, bias * 1e3, None)
    assert torch.isinf(l2[27:]).all() and not o2[27:].abs().any()
    assert torch.isfinite(o2).all() and all(torch.isfinite(g).all() for g in g2)
    torch.testing.assert_close(o2, o1, **TOL[torch.float64])
    for x, y in zip(g2, g1, strict=True):
        torch.testing.assert_close(x, y, **TOL[torch.float64])


def test_triton_tiles_nan_bias_makes_its_row_nan() -> None:
    graph = GRAPHS["window"]()
    q, k, v, bias, _ = _inputs(graph, torch.float64)
    bias[5, 1] = float("nan")
    target = int(graph.edge_index[1, 5])
    plan = block_plan(graph.to(q.device), 16)
    out, lse = tile_attention_triton(q, k, v, plan, 0.5, bias, block_k=16)
    ref, rlse, _ = tile_attention(q, k, v, plan, 0.5, bias, need_lse=True, guard=True)
    assert torch.isnan(out[target, 1]).all() and torch.isnan(lse[target, 1])
    torch.testing.assert_close(out, ref, equal_nan=True, **TOL[torch.float64])


def test_triton_tiles_edge_permutation_invariant() -> None:
    graph = _batch_graph()
    q, k, v, bias, _ = _inputs(graph, torch.float64)
    perm = torch.randperm(graph.num_edges)
    shuffled = AttentionGraph(graph.edge_index[:, perm], num_nodes=graph.num_nodes)
    a, la = tile_attention_triton(q, k, v, block_plan(graph, 16), 0.3, bias, block_k=16)
    b, lb = tile_attention_triton(q, k, v, block_plan(shuffled, 16), 0.3, bias[perm], block_k=16)
    torch.testing.assert_close(b, a, **TOL[torch.float64])
    torch.testing.assert_close(lb, la, **TOL[torch.float64])


_COMPILE = textwrap.dedent(
    r"""
    import os
    os.environ.pop("TRITON_INTERPRET", None)
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from gnnattn.kernels import triton_tiles as tt

    INDEX = ("rows_ptr", "out_rows_ptr", "cols_ptr")
    ACC = ("lse_ptr", "d_ptr", "dq_ptr", "dk_ptr", "dv_ptr", "ds_ptr", "bias_ptr", "fac_ptr")

    def signature(fn, dt, acc, consts):
        sig = {}
        for name in fn.arg_names:
            if name in consts:
                sig[name] = "constexpr"
            elif name in INDEX:
                sig[name] = "*i64"
            elif name == "mask_ptr":
                sig[name] = "*u8"
            elif name in ACC:
                sig[name] = "*" + acc
            elif name.endswith("_ptr"):
                sig[name] = "*" + dt
            else:
                sig[name] = "i32"
        return sig

    target = GPUTarget("cuda", 90, 32)

    def compile(fn, dt, acc_name, consts):
        src = ASTSource(fn=fn, signature=signature(fn, dt, acc_name, consts), constexprs=consts)
        compiled = triton.compile(src, target=target)
        assert "cubin" in compiled.asm, fn
        return compiled.asm["ptx"]

    count = 0
    for dt, acc_name, acc, prec in (("fp32", "fp32", tl.float32, "ieee"),
                                    ("bf16", "fp32", tl.float32, "tf32"),
                                    ("fp16", "fp32", tl.float32, "tf32"),
                                    ("fp64", "fp64", tl.float64, "tf32")):
        base = dict(C=64, CV=64, ACC=acc, PREC=prec, BLOCK_R=64, BLOCK_K=64, BLOCK_C=64,
                    BLOCK_CV=64)
        for flags in (dict(HAS_MASK=True, HAS_BIAS=True, HAS_FAC=True),
                      dict(HAS_MASK=False, HAS_BIAS=False, HAS_FAC=False)):
            for fn, extra in ((tt._tile_fwd, {}), (tt._tile_bwd, dict(STORE_DS=flags["HAS_BIAS"]))):
                ptx = compile(fn, dt, acc_name, dict(base, **flags, **extra))
                # float32 products stay float32 (TF32 rounds them to 10 mantissa bits).
                assert dt != "fp32" or "tf32" not in ptx, fn
                count += 1
    # What that check tells apart: the same kernel allowed TF32 multiplies in it.
    tf32 = dict(base, **flags, ACC=tl.float32, PREC="tf32")
    assert "tf32" in compile(tt._tile_fwd, "fp32", "fp32", tf32)
    print("compiled", count)
    """
)


def test_triton_tiles_compile_for_sm90() -> None:
    """Lower both kernels to cubins for sm_90 without a GPU (the interpreter accepts
    what the compiler may reject); nothing about speed or results on the device."""
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run(
        [sys.executable, "-c", _COMPILE], env=env, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "compiled 16" in res.stdout


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_tiles_cuda_window(dtype: torch.dtype) -> None:
    graph = AttentionGraph(sliding_window_graph(2048, window=64)).to("cuda")
    q, k, v = (torch.randn(2048, 8, 64, device="cuda", dtype=dtype) for _ in range(3))
    plan = block_plan(graph, 64)
    out, lse = tile_attention_triton(q, k, v, plan, 0.125)
    ref, rlse, _ = tile_attention(q.double(), k.double(), v.double(), plan, 0.125, need_lse=True)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(out.double(), ref, atol=tol, rtol=tol)
    torch.testing.assert_close(lse.double(), rlse, atol=tol, rtol=tol)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.gpu
def test_triton_tiles_cuda_backend_equals_mp() -> None:
    """backend='tiles' on CUDA runs the Triton kernels; outputs and gradients equal mp's."""
    from gnnattn import attention

    graph = AttentionGraph(sliding_window_graph(300, window=9)).to("cuda")
    q, k, v = (
        torch.randn(300, 4, 16, device="cuda", dtype=torch.float64, requires_grad=True)
        for _ in range(3)
    )
    bias = torch.randn(graph.num_edges, 4, device="cuda", dtype=torch.float64, requires_grad=True)
    outs = []
    for backend in ("tiles", "mp"):
        out = attention(q, k, v, graph, score_bias=bias, backend=backend)
        outs.append((out, *torch.autograd.grad(out.square().sum(), (q, k, v, bias))))
    for x, y in zip(*outs, strict=True):
        torch.testing.assert_close(x, y, **TOL[torch.float64])


def test_triton_tiles_float32_products_follow_torchs_tf32_switch() -> None:
    """IEEE float32 unless torch allows TF32, by either of its switches (the new one set,
    reading the legacy one would raise)."""
    code = textwrap.dedent(
        """
        import torch
        from gnnattn.kernels.triton_tiles import _precision
        got = [_precision(torch.float32)]
        torch.backends.cuda.matmul.allow_tf32 = True
        got.append(_precision(torch.float32))
        torch.backends.cuda.matmul.allow_tf32 = False
        got.append(_precision(torch.float32))
        if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
            torch.backends.cuda.matmul.fp32_precision = "tf32"
            got.append(_precision(torch.float32))
        got.append(_precision(torch.bfloat16))  # not read: the product is bf16's
        print(got)
        """
    )
    # A process of its own: torch's precision switches are global and sticky.
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    got = ast.literal_eval(res.stdout.strip().splitlines()[-1])
    assert got[:3] == ["ieee", "tf32", "ieee"] and got[-1] == "tf32"
    assert all(p == "tf32" for p in got[3:])
