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
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import Tensor

from ..harness import BenchConfig, Candidate, Case
from .common import random_graph

if TYPE_CHECKING:
    from ...graphs import AttentionGraph

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

    gen = torch.Generator().manual_seed(cfg.seed + 6)
    e = n * deg
    graph = AttentionGraph(random_graph(n, deg, gen), n)
    ptr, col, _ = graph.csr
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "sparse CSR support is in beta"
        adj = torch.sparse_csr_tensor(ptr, col, torch.ones(e), (n, n))
    qkvd = tuple(torch.randn(n, h, c, generator=gen) for _ in range(4))
    xmat = torch.randn(n, h * c, generator=gen)
    floor = _floor(n, e, h * c, h, col.element_size(), graph.csc[1].element_size())
    cands = [
        *_torch_candidates(adj, xmat, floor),
        *_kernel_candidates(graph, qkvd, floor),
        *_operator_candidates(graph, qkvd, floor),
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


class _Floor(NamedTuple):
    """Bytes each call must move at least: gathered rows per edge, the index
    arrays once, the rows each node reads and writes once."""

    spmm: int
    fwd: int
    dst: int
    src: int


def _floor(n: int, e: int, w: int, h: int, ix: int, trow_ix: int) -> _Floor:
    f32 = 4
    row = w * f32
    return _Floor(
        spmm=e * (row + ix + f32) + 2 * n * row + 8 * (n + 1),
        fwd=e * (2 * row + ix) + n * (2 * row + h * f32) + 8 * (n + 1),
        dst=e * (2 * row + ix) + n * (3 * row + 3 * h * f32) + 8 * (n + 1),
        src=e * (2 * row + 2 * h * f32 + trow_ix) + 4 * n * row + 8 * (n + 1),
    )


def _call(f: Callable[[], object]) -> Callable[[Tensor], Tensor]:
    """``f`` as a candidate: its input is a placeholder, returned as is."""

    def fn(x: Tensor) -> Tensor:
        f()
        return x

    return fn


def _torch_candidates(adj: Tensor, xmat: Tensor, floor: _Floor) -> list[Candidate]:
    """The yardsticks: torch's CSR SpMM and SDDMM on the same adjacency."""

    def spmm_fn(x: Tensor) -> Tensor:
        return torch.sparse.mm(adj, x)

    def sddmm_fn(x: Tensor) -> Tensor:
        return torch.sparse.sampled_addmm(adj, x, xmat.T, beta=0.0).values()

    return [
        Candidate("CSR SpMM: torch.sparse.mm(A, X)", spmm_fn, bytes=floor.spmm),
        Candidate(
            "CSR SDDMM: torch.sparse.sampled_addmm",
            sddmm_fn,
            note="the scores pass of one head of width H*C, in torch",
            bytes=floor.spmm,
        ),
    ]


def _kernel_candidates(
    graph: AttentionGraph, qkvd: tuple[Tensor, ...], floor: _Floor
) -> list[Candidate]:
    """Each pass of :mod:`gnnattn.kernels.cpu`, called directly with plans made once."""
    from ...kernels import cpu

    q, k, v, dout = qkvd
    ptr, col, _ = graph.csr
    tptr, trow, tperm = graph.csc
    csc = (tptr, trow, tperm)
    # The kernels' checked plans, made once (as the operator keeps them on the graph).
    pl = cpu.plan(ptr, col, graph.num_nodes)
    tpl = cpu.plan(tptr, trow, graph.num_nodes, perm=tperm)
    scale = q.shape[2] ** -0.5
    _, lse = cpu.attention_fwd(q, k, v, ptr, col, scale, plan=pl)
    _, ld, _ = cpu.attention_bwd_dst(q, k, v, lse, dout, ptr, col, scale, plan=pl)

    def kernel_bwd() -> None:
        cpu.attention_bwd(q, k, v, None, lse, dout, ptr, col, scale, csc=csc, plan=pl, csc_plan=tpl)

    def kernel_fwdbwd() -> None:
        _, ls = cpu.attention_fwd(q, k, v, ptr, col, scale, plan=pl)
        cpu.attention_bwd(q, k, v, None, ls, dout, ptr, col, scale, csc=csc, plan=pl, csc_plan=tpl)

    bwd = floor.dst + floor.src
    return [
        Candidate(
            "fused forward (kernel)",
            _call(lambda: cpu.attention_fwd(q, k, v, ptr, col, scale, plan=pl)),
            note="gathers k_j, v_j",
            bytes=floor.fwd,
        ),
        Candidate(
            "backward destination pass (kernel)",
            _call(lambda: cpu.attention_bwd_dst(q, k, v, lse, dout, ptr, col, scale, plan=pl)),
            note="gathers k_j, v_j: D_i, dq",
            bytes=floor.dst,
        ),
        Candidate(
            "backward source pass (kernel)",
            _call(lambda: cpu.attention_bwd_src(q, k, v, ld, dout, csc, scale, csc_plan=tpl)),
            note="gathers q_i, dout_i, (lse_i, D_i): dk, dv",
            bytes=floor.src,
        ),
        Candidate("backward, both passes (kernel)", _call(kernel_bwd), bytes=bwd),
        Candidate("forward + backward (kernel)", _call(kernel_fwdbwd), bytes=floor.fwd + bwd),
    ]


def _operator_candidates(
    graph: AttentionGraph, qkvd: tuple[Tensor, ...], floor: _Floor
) -> list[Candidate]:
    """``gnnattn.attention(..., backend="fused")`` as the layer calls it."""
    from ...ops import attention

    q, k, v, dout = qkvd
    scale = q.shape[2] ** -0.5
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

    return [
        Candidate(
            "forward: gnnattn.attention",
            _call(op_fwd),
            note="the operator as the layer calls it (no grad)",
            bytes=floor.fwd,
        ),
        Candidate(
            "forward + backward: gnnattn.attention",
            _call(op_fwdbwd),
            note="through autograd, as in training",
            bytes=floor.fwd + floor.dst + floor.src,
        ),
    ]
