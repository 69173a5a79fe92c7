"""The ``limit`` suite: each pass of the fused CPU operator against CSR SpMM.

``torch.sparse.mm`` of the graph's CSR adjacency with an ``[N, H*C]`` matrix
gathers one row of ``H*C`` numbers per edge: exactly the memory pattern of
attention's aggregation, in a tuned library kernel. Every row of this suite
runs on the same random graph (N nodes, 32 in-edges each, ``H*C = 128``) and
reports how many bytes the call must move at least (the gathered rows, the
per-node rows read and written, the index arrays) and the GB/s that makes.
One gathered row per edge per pass is the honest floor: the forward gathers
two (``k_j``, ``v_j``), the backward four (``k_j``, ``v_j`` in the
destination pass; ``q_i``, ``dout_i`` in the source pass).

The kernel rows call :mod:`gnnattn.kernels.cpu` directly on the graph
object's CSR and transposed CSR and the kernels' plans of them (built once,
outside the timing); the
``gnnattn.attention(..., backend="fused")`` rows go through autograd as the
layer does. Outputs of different operators are not compared here;
``tests/test_kernels_cpu.py`` checks every kernel against the float64
reference.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

import torch
from torch import Tensor

from ..harness import BenchConfig, Candidate, Case
from .common import random_graph

__all__ = ["SIZES", "limit_cases"]

# (nodes, in-degree, heads, head dim)
SIZES: Mapping[str, list[tuple[int, int, int, int]]] = MappingProxyType(
    {
        "full": [(20_000, 32, 4, 32), (200_000, 32, 4, 32)],
        "quick": [(2_000, 8, 4, 8)],
    }
)


def limit_cases(cfg: BenchConfig, device: torch.device) -> list[Case]:
    """SpMM, SDDMM and every pass of the fused operator on one graph per size."""
    if device.type != "cpu":
        return []  # the passes measured here are the CPU kernels'
    return [_case(cfg, *size) for size in SIZES["quick" if cfg.quick else "full"]]


def _case(cfg: BenchConfig, n: int, deg: int, h: int, c: int) -> Case:
    import warnings

    from ...graphs import AttentionGraph
    from ...kernels import cpu
    from ...ops import attention

    gen = torch.Generator().manual_seed(cfg.seed + 6)
    w = h * c
    e = n * deg
    graph = AttentionGraph(random_graph(n, deg, gen), n)
    ptr, col, _ = graph.csr
    tptr, trow, tperm = graph.csc
    csc = (tptr, trow, tperm)
    # The kernels' checked plans, made once (as the operator keeps them on the graph).
    pl = cpu.plan(ptr, col, n)
    tpl = cpu.plan(tptr, trow, n, perm=tperm)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "sparse CSR support is in beta"
        adj = torch.sparse_csr_tensor(ptr, col, torch.ones(e), (n, n))
    q, k, v, dout = (torch.randn(n, h, c, generator=gen) for _ in range(4))
    xmat = torch.randn(n, w, generator=gen)
    scale = c**-0.5
    _, lse = cpu.attention_fwd(q, k, v, ptr, col, scale, plan=pl)
    _, ld, _, _ = cpu.attention_bwd_dst(q, k, v, lse, dout, ptr, col, scale, plan=pl)

    # Bytes each call must move at least: gathered rows per edge, the index
    # arrays once, the rows each node reads and writes once.
    f32, ix = 4, col.element_size()
    row = w * f32
    spmm = e * (row + ix + f32) + 2 * n * row + 8 * (n + 1)
    fwd = e * (2 * row + ix) + n * (2 * row + h * f32) + 8 * (n + 1)
    dst = e * (2 * row + ix) + n * (3 * row + 3 * h * f32) + 8 * (n + 1)
    src = e * (2 * row + 2 * h * f32 + csc[1].element_size()) + 4 * n * row + 8 * (n + 1)

    def spmm_fn(x: Tensor) -> Tensor:
        return torch.sparse.mm(adj, x)

    def sddmm_fn(x: Tensor) -> Tensor:
        return torch.sparse.sampled_addmm(adj, x, xmat.T, beta=0.0).values()

    def call(f: Callable[[], object]) -> Callable[[Tensor], Tensor]:
        def fn(x: Tensor) -> Tensor:
            f()
            return x

        return fn

    lq, lk, lv = (t.clone().requires_grad_() for t in (q, k, v))

    def op_fwdbwd() -> None:
        with torch.enable_grad():
            out = attention(lq, lk, lv, graph, scale=scale, backend="fused")
            assert isinstance(out, Tensor)
            out.backward(dout)
        for t in (lq, lk, lv):
            t.grad = None

    def op_fwd() -> None:
        attention(q, k, v, graph, scale=scale, backend="fused")

    def kernel_bwd() -> None:
        cpu.attention_bwd(q, k, v, None, lse, dout, ptr, col, scale, csc=csc, plan=pl, csc_plan=tpl)

    def kernel_fwdbwd() -> None:
        _, ls = cpu.attention_fwd(q, k, v, ptr, col, scale, plan=pl)
        cpu.attention_bwd(q, k, v, None, ls, dout, ptr, col, scale, csc=csc, plan=pl, csc_plan=tpl)

    cands = [
        Candidate("CSR SpMM: torch.sparse.mm(A, X)", spmm_fn, bytes=spmm),
        Candidate(
            "CSR SDDMM: torch.sparse.sampled_addmm",
            sddmm_fn,
            note="the scores pass of one head of width H*C, in torch",
            bytes=e * (row + ix + f32) + 2 * n * row + 8 * (n + 1),
        ),
        Candidate(
            "fused forward (kernel)",
            call(lambda: cpu.attention_fwd(q, k, v, ptr, col, scale, plan=pl)),
            note="gathers k_j, v_j",
            bytes=fwd,
        ),
        Candidate(
            "backward destination pass (kernel)",
            call(lambda: cpu.attention_bwd_dst(q, k, v, lse, dout, ptr, col, scale, plan=pl)),
            note="gathers k_j, v_j: D_i, dq",
            bytes=dst,
        ),
        Candidate(
            "backward source pass (kernel)",
            call(lambda: cpu.attention_bwd_src(q, k, v, ld, dout, csc, scale, csc_plan=tpl)),
            note="gathers q_i, dout_i, (lse_i, D_i): dk, dv",
            bytes=src,
        ),
        Candidate("backward, both passes (kernel)", call(kernel_bwd), bytes=dst + src),
        Candidate("forward + backward (kernel)", call(kernel_fwdbwd), bytes=fwd + dst + src),
        Candidate(
            "forward: gnnattn.attention",
            call(op_fwd),
            note="the operator as the layer calls it (no grad)",
            bytes=fwd,
        ),
        Candidate(
            "forward + backward: gnnattn.attention",
            call(op_fwdbwd),
            note="through autograd, as in training",
            bytes=fwd + dst + src,
        ),
    ]
    return Case(
        "limit",
        f"random graph N={n:,}, {deg} in-edges each, H*C = {h}*{c}, |E|={e:,}, {col.dtype} col",
        xmat,
        xmat,
        "CSR SpMM: torch.sparse.mm(A, X)",
        cands,
        [],
        {"num_nodes": n, "in_degree": deg, "heads": h, "head_dim": c, "num_edges": e},
        modes=("fwd",),
        compare=False,
        memory=False,
        mode_label="one call each",
    )
