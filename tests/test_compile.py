"""``torch.compile`` and ``torch.export`` keep the fused kernels (the operators of
:mod:`gnnattn.kernels.library`), with the eager numbers.

Compiled with the default Inductor backend (C++ code on the CPU), so these are
the slowest tests of the file's group; the sizes are small.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import pytest
import torch

from gnnattn import AttentionGraph
from gnnattn.kernels import COMPILED
from gnnattn.nn import GPSConv, GraphTransformer, SelfAttentionConv, TransformerConv

pytestmark = pytest.mark.skipif("cpu" not in COMPILED, reason="numba is not installed")

# Dynamo's graphs call the op's packet, export's its overload.
FUSED = {torch.ops.gnnattn.attention_fwd, torch.ops.gnnattn.attention_fwd.default}
BLOCK = {torch.ops.gnnattn.block_attention_fwd, torch.ops.gnnattn.block_attention_fwd.default}


def _sparse(n: int, seed: int, deg: int = 8) -> tuple[torch.Tensor, AttentionGraph]:
    ei = torch.randint(0, n, (2, deg * n), generator=torch.Generator().manual_seed(seed))
    return ei, AttentionGraph(ei, n).prepare()


def _batch(n: int, seed: int) -> tuple[torch.Tensor, AttentionGraph]:
    """A sorted batch vector of graphs of 5-24 nodes, and its attention graph."""
    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(5, 25, (n,), generator=g)
    batch = torch.repeat_interleave(torch.arange(n), sizes)[:n]
    return batch, AttentionGraph.from_batch(batch).prepare()


def _layers() -> dict[str, tuple[torch.nn.Module, Callable[..., torch.Tensor]]]:
    torch.manual_seed(0)
    gps = GPSConv(32, TransformerConv(32, 8, heads=4, edge_dim=4), heads=4, dropout=0.1)
    return {
        "SelfAttentionConv": (SelfAttentionConv(32, 4, dropout=0.1), lambda m, x, d: m(x, d["g"])),
        "GraphTransformer": (
            GraphTransformer(2, 32, 4, dropout=0.1, edge_dim=4, edge_value=True),
            lambda m, x, d: m(x, d["g"], d["ea"]),
        ),
        "TransformerConv": (
            TransformerConv(32, 8, heads=4, edge_dim=4, dropout=0.1),
            lambda m, x, d: m(x, d["g"], d["ea"]),
        ),
        "GPSConv": (
            gps,
            lambda m, x, d: m(x, d["g"], d["batch"], attn_graph=d["ag"], edge_attr=d["ea"]),
        ),
    }


def _data(n: int, seed: int, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    ei, g = _sparse(n, seed)
    batch, ag = _batch(n, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    ea = torch.randn(ei.shape[1], 4, generator=gen, dtype=dtype)
    x = torch.randn(n, 32, generator=gen, dtype=dtype)
    return {"g": g, "ea": ea, "batch": batch, "ag": ag, "x": x}


def _ops_in(gm: torch.fx.GraphModule) -> set[Any]:
    return {node.target for node in gm.graph.nodes if node.op == "call_function"}


def _spy() -> tuple[Callable[..., Any], set[Any], list[torch.fx.GraphModule]]:
    """A Dynamo backend that runs the graphs as traced, and what it saw: their ops, and
    one graph module per compile."""
    seen: set[Any] = set()
    compiles: list[torch.fx.GraphModule] = []

    def spy(gm: torch.fx.GraphModule, example: Any) -> Callable[..., Any]:
        compiles.append(gm)
        seen.update(_ops_in(gm))
        return gm.forward

    return spy, seen, compiles


@pytest.mark.parametrize("name", list(_layers()))
def test_layers_compile_fullgraph_on_the_fused_kernels(name: str) -> None:
    """No graph break, the fused op in the graph, and (Inductor, dropout included) the
    eager outputs and gradients at float32's 1e-5."""
    layer, call = _layers()[name]
    d = _data(120, seed=1)
    x = d["x"].requires_grad_()
    explained = torch._dynamo.explain(lambda x: call(layer, x, d))(x)
    assert explained.graph_break_count == 0, explained.break_reasons
    seen: set[Any] = set()

    def spy(gm: torch.fx.GraphModule, example: Any) -> Callable[..., Any]:
        seen.update(_ops_in(gm))
        return gm.forward

    torch.compile(lambda x: call(layer, x, d), backend=spy, fullgraph=True)(x)
    assert FUSED & seen  # "auto" took the fused kernels inside the compiled region
    compiled = torch.compile(lambda x: call(layer, x, d), fullgraph=True)
    # Inductor's own RNG would draw other dropout keys than eager: fallback_random
    # makes it call torch's generator, so both draw the same masks.
    with torch._inductor.config.patch(fallback_random=True):
        torch.manual_seed(5)
        got = compiled(x)
        (gx,) = torch.autograd.grad(got.square().sum(), x)
    torch.manual_seed(5)
    want = call(layer, x, d)
    (wx,) = torch.autograd.grad(want.square().sum(), x)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gx, wx, atol=1e-5, rtol=1e-5)


def test_compiled_float64_equals_eager_to_1e_10() -> None:
    layer, call = _layers()["GraphTransformer"]
    layer = layer.double()
    d = _data(40, seed=2, dtype=torch.float64)
    x = d["x"].requires_grad_()
    compiled = torch.compile(lambda x: call(layer, x, d), fullgraph=True)
    with torch._inductor.config.patch(fallback_random=True):
        torch.manual_seed(9)
        got = compiled(x)
        got_grads = torch.autograd.grad(got.sum(), [x, *layer.parameters()])
    torch.manual_seed(9)
    want = call(layer, x, d)
    want_grads = torch.autograd.grad(want.sum(), [x, *layer.parameters()])
    torch.testing.assert_close(got, want, atol=1e-10, rtol=0)
    for a, b in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


@pytest.mark.parametrize("name", ["GraphTransformer", "GPSConv"])
def test_graphs_of_other_sizes_recompile_at_most_once(name: str) -> None:
    layer, call = _layers()[name]
    compiles = []

    def counting(gm: torch.fx.GraphModule, example: Any) -> Callable[..., Any]:
        compiles.append(gm)
        return gm.forward

    compiled = torch.compile(lambda x, d: call(layer, x, d), backend=counting, fullgraph=True)
    for n, seed in ((60, 3), (97, 4), (150, 5)):
        d = _data(n, seed)
        compiled(d["x"].requires_grad_(), d).sum().backward()
    assert len(compiles) <= 2  # the first compile, and one that makes the sizes dynamic


@pytest.mark.parametrize(
    "lengths, most",
    [
        # B equal graphs: one [B, H, T, C] SDPA call, its block count from x's size (a
        # guard on each of B lengths would recompile for every new B, then run eager
        # after the recompile limit).
        ([[6] * 3, [6] * 4, [6] * 5, [6] * 7, [6] * 8, [6] * 9], 2),
        # Blocks of different lengths: once more, as the longest block becomes dynamic.
        ([[3, 5, 6, 2], [4, 4, 7, 1], [2, 9, 3, 3], [5, 5, 5, 6], [1, 2, 3, 4], [6, 1, 1, 9]], 3),
    ],
    ids=["equal", "ragged"],
)
def test_batches_of_other_graphs_recompile_a_bounded_number_of_times(
    lengths: list[list[int]], most: int
) -> None:
    torch.manual_seed(0)
    layer = SelfAttentionConv(16, 2)
    compiles = []

    def counting(gm: torch.fx.GraphModule, example: Any) -> Callable[..., Any]:
        compiles.append(gm)
        return gm.forward

    compiled = torch.compile(lambda x, g: layer(x, g), backend=counting, fullgraph=True)
    for lens in lengths:
        batch = torch.arange(len(lens)).repeat_interleave(torch.tensor(lens))
        graph = AttentionGraph.from_batch(batch).prepare()
        x = torch.randn(batch.numel(), 16)
        torch.testing.assert_close(compiled(x, graph), layer(x, graph), atol=1e-5, rtol=1e-5)
    assert len(compiles) <= most


def test_a_compiled_call_may_be_the_first_use_of_the_kernels() -> None:
    """In a fresh process whose first gnnattn call is compiled with fullgraph=True (a plain
    edge_index: no graph object imported the kernels before), the kernel module's import
    is traced: no graph break, the eager numbers."""
    code = textwrap.dedent(
        """
        import sys, torch
        from gnnattn import SelfAttentionConv
        assert "gnnattn.kernels.cpu" not in sys.modules
        torch.manual_seed(0)
        layer = SelfAttentionConv(16, 2)
        ei, x = torch.randint(0, 20, (2, 60)), torch.randn(20, 16)
        out = torch.compile(lambda x, ei: layer(x, ei), fullgraph=True)(x, ei)
        torch.testing.assert_close(out, layer(x, ei))
        print("ok")
        """
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-3000:]


def test_compiled_backward_takes_the_eager_source_pass(monkeypatch) -> None:
    """Compiled, a small graph given as ``edge_index`` (built in the compiled region)
    has its backward's source pass done over the CSR, as in eager mode (no
    transposed CSR made, in the graph or in the op); a prepared graph's transposed CSR
    is passed and read. Both give the eager gradients."""
    from gnnattn.kernels.cpu import op

    csr_calls = []
    real = op.src_csr

    def spy(*args: Any) -> Any:
        csr_calls.append(1)
        return real(*args)

    monkeypatch.setattr(op, "src_csr", spy)
    torch.manual_seed(0)
    layer = TransformerConv(32, 8, heads=4, edge_dim=4)
    ei, graph = _sparse(40, seed=6, deg=2)
    ea = torch.randn(ei.shape[1], 4, generator=torch.Generator().manual_seed(7))
    x = torch.randn(40, 32, generator=torch.Generator().manual_seed(8))
    (want,) = torch.autograd.grad(layer(x.requires_grad_(), ei, ea).square().sum(), x)
    for given, expected in ((ei, 2), (graph, 0)):
        csr_calls.clear()
        torch._dynamo.reset()
        compiled = torch.compile(lambda x, g: layer(x, g, ea), fullgraph=True, dynamic=True)
        for _ in range(2):
            (got,) = torch.autograd.grad(compiled(x, given).square().sum(), x)
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        assert len(csr_calls) == expected


def test_auto_picks_sdpa_compiled_on_a_structured_graph() -> None:
    """The same choice as in eager mode: SDPA for a complete graph."""
    layer = SelfAttentionConv(32, 4)
    seen: set[Any] = set()

    def spy(gm: torch.fx.GraphModule, example: Any) -> Callable[..., Any]:
        seen.update(_ops_in(gm))
        return gm.forward

    from gnnattn.graphs import complete_graph

    x = torch.randn(30, 32)
    # Built by the builder, and given as edges (whose structure prepare() detects).
    for graph in (AttentionGraph.complete(30), AttentionGraph(complete_graph(30)).prepare()):
        seen.clear()
        torch._dynamo.reset()
        out = torch.compile(lambda x: layer(x, graph), backend=spy, fullgraph=True)(x)  # noqa: B023
        assert not FUSED & seen
        assert any("scaled_dot_product" in str(t) for t in seen), seen
        torch.testing.assert_close(out, layer(x, graph))


def test_compiled_batch_of_small_blocks_takes_the_block_kernel() -> None:
    """A batch of complete blocks of different lengths (up to the block kernel's
    limit), prepared: compiled, ``"auto"`` takes the block kernel as in eager mode,
    with the eager outputs and gradients, and batches of other lengths do not
    recompile per batch. A graph that does not hold its block starts (not
    prepared) takes the fused kernel: nothing is read per length."""
    layer = SelfAttentionConv(32, 4)
    spy, seen, compiles = _spy()
    compiled = torch.compile(lambda x, g: layer(x, g), backend=spy, fullgraph=True, dynamic=True)
    for n, seed in ((60, 3), (97, 4), (150, 5)):
        _, graph = _batch(n, seed)
        x = torch.randn(n, 32, generator=torch.Generator().manual_seed(seed), requires_grad=True)
        got = compiled(x, graph)
        (gx,) = torch.autograd.grad(got.square().sum(), x)
        want = layer(x, graph)
        (wx,) = torch.autograd.grad(want.square().sum(), x)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(gx, wx, atol=1e-5, rtol=1e-5)
    assert BLOCK & seen and not FUSED & seen
    assert len(compiles) == 1
    seen.clear()
    batch, _ = _batch(60, 3)
    compiled(torch.randn(60, 32), AttentionGraph.from_batch(batch))
    assert FUSED & seen and not BLOCK & seen


@pytest.mark.parametrize("ask", ["weights", "narrow values"])
def test_compiled_batch_of_blocks_with_weights_or_narrow_values(ask: str) -> None:
    """Values of another width than the queries, which the block kernel does not take,
    take the fused kernel on such a batch, compiled; the weights (recomputed on the
    edges by every backend) stay on the block kernel, as in eager mode. One compile
    over three batches (the buckets, or a loop over the blocks, would read each length)."""
    from gnnattn import attention

    spy, seen, compiles = _spy()
    weights = ask == "weights"
    cv = 8 if weights else 5

    def call(q: torch.Tensor, v: torch.Tensor, g: AttentionGraph) -> Any:
        return attention(q, q, v, g, need_weights=weights)

    compiled = torch.compile(call, backend=spy, fullgraph=True, dynamic=True)
    for n, seed in ((60, 3), (97, 4), (150, 5)):
        _, graph = _batch(n, seed)
        gen = torch.Generator().manual_seed(seed)
        q, v = torch.randn(n, 2, 8, generator=gen), torch.randn(n, 2, cv, generator=gen)
        got, want = compiled(q, v, graph), call(q, v, graph)
        for a, b in zip(got if weights else [got], want if weights else [want], strict=True):
            if isinstance(a, torch.Tensor):
                torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    if weights:
        assert BLOCK & seen and not FUSED & seen
        assert call(q, v, graph).backend == "sdpa"
    else:
        assert FUSED & seen and not BLOCK & seen
    assert len(compiles) == 1


class _Model(torch.nn.Module):
    """A graph transformer taking a plain ``edge_index``, as a served model would."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = GraphTransformer(2, 32, 4, edge_dim=4, edge_value=True)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, edge_attr: torch.Tensor):
        return self.encoder(x, edge_index, edge_attr)


def test_export_and_aot_inductor_package_round_trip(tmp_path) -> None:
    """``torch.export`` with dynamic node and edge counts, then an AOTInductor package
    that a fresh process loads and runs: both equal eager."""
    torch.manual_seed(0)
    model = _Model().eval()
    n, e = 50, 300
    ei = torch.randint(0, n, (2, e))
    x, ea = torch.randn(n, 32), torch.randn(e, 4)
    nodes, edges = torch.export.Dim("nodes", min=2), torch.export.Dim("edges", min=2)
    ep = torch.export.export(
        model, (x, ei, ea), dynamic_shapes=({0: nodes}, {1: edges}, {0: edges})
    )
    assert FUSED & _ops_in(ep.graph_module)
    torch.testing.assert_close(ep.module()(x, ei, ea), model(x, ei, ea), atol=1e-5, rtol=1e-5)
    n2, e2 = 37, 211  # another graph through the same program
    ei2 = torch.randint(0, n2, (2, e2))
    x2, ea2 = torch.randn(n2, 32), torch.randn(e2, 4)
    want = model(x2, ei2, ea2)
    torch.testing.assert_close(ep.module()(x2, ei2, ea2), want, atol=1e-5, rtol=1e-5)
    package = torch._inductor.aoti_compile_and_package(ep, package_path=str(tmp_path / "m.pt2"))
    torch.save({"x": x2, "ei": ei2, "ea": ea2, "want": want}, tmp_path / "io.pt")
    script = textwrap.dedent(
        f"""
        import torch
        import gnnattn  # registers torch.ops.gnnattn, which the package calls
        io = torch.load({str(tmp_path / "io.pt")!r})
        model = torch._inductor.aoti_load_package({package!r})
        got = model(io["x"], io["ei"], io["ea"])
        print(float((got - io["want"]).abs().max()))
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert float(run.stdout.strip().splitlines()[-1]) < 1e-5


def test_a_prepared_graph_takes_the_tiles_compiled_as_eager() -> None:
    """prepare() makes the tile plan where the tiles pay: a compiled call takes them
    (fullgraph) as an eager one does. With only the fill estimated (backend_for), a
    compiled call made the plan from the edges' values and failed with fullgraph;
    it now keeps the CSR kernel."""
    from gnnattn.graphs import sliding_window_graph

    torch.manual_seed(0)
    layer = SelfAttentionConv(16, 2)
    x = torch.randn(256, 16)
    compiles: list[torch.fx.GraphModule] = []

    def counting(gm: torch.fx.GraphModule, example: Any) -> Callable[..., Any]:
        compiles.append(gm)
        return gm.forward

    def fused_op_in_last_graph() -> bool:
        return any("attention_fwd" in str(n.target) for n in compiles[-1].graph.nodes)

    compiled = torch.compile(lambda x, g: layer(x, g), backend=counting, fullgraph=True)
    estimated = AttentionGraph(sliding_window_graph(256, window=32))
    assert layer.backend_for(x, estimated).backend == "tiles"  # the estimate only
    torch.testing.assert_close(compiled(x, estimated), layer(x, estimated), atol=1e-5, rtol=1e-5)
    assert fused_op_in_last_graph()
    prepared = AttentionGraph(sliding_window_graph(256, window=32)).prepare()
    torch.testing.assert_close(compiled(x, prepared), layer(x, prepared), atol=1e-5, rtol=1e-5)
    assert not fused_op_in_last_graph()


def test_tiles_on_graphs_of_other_sizes_and_the_implied_complete_graph_compile() -> None:
    """A second tiled graph makes the plan's sizes (so its fill) symbolic: the reason's
    formatted fill raised inside Dynamo. A layer called without a graph (the implied
    complete graph) with a symbolic node count: max(lengths, default=0) was not
    traceable."""

    def banded(n: int) -> AttentionGraph:
        i = torch.arange(n).repeat_interleave(65)
        j = i + torch.arange(-32, 33).repeat(n)
        keep = (j >= 0) & (j < n)
        return AttentionGraph(torch.stack([j[keep], i[keep]]), n).prepare()

    torch.manual_seed(0)
    layer = SelfAttentionConv(16, 4)
    tiled = torch.compile(lambda x, g: layer(x, g), backend="eager", fullgraph=True)
    for n in (256, 300):
        g, x = banded(n), torch.randn(n, 16)
        assert layer.backend_for(x, g).backend == "tiles"
        torch.testing.assert_close(tiled(x, g), layer(x, g), atol=1e-5, rtol=1e-5)
    complete = torch.compile(lambda x: layer(x), backend="eager", fullgraph=True, dynamic=True)
    for n in (40, 50):
        x = torch.randn(n, 16)
        torch.testing.assert_close(complete(x), layer(x), atol=1e-5, rtol=1e-5)


def test_ids_out_of_range_raise_in_a_compiled_call() -> None:
    """A graph built inside the compiled region cannot read its ids on the host: the
    traced program asserts them. A negative target was read as another node's there
    (every other bound failed somewhere), changing the outputs of other targets."""
    torch.manual_seed(0)
    layer = SelfAttentionConv(16, 2)
    x = torch.randn(20, 16)
    ei = torch.randint(0, 20, (2, 60), generator=torch.Generator().manual_seed(1))
    compiled = torch.compile(lambda x, ei: layer(x, ei), fullgraph=True)
    torch.testing.assert_close(compiled(x, ei), layer(x, ei), atol=1e-5, rtol=1e-5)
    for row, bad in ((1, -1), (0, -3), (1, 20)):
        wrong = ei.clone()
        wrong[row, 5] = bad
        with pytest.raises(ValueError, match="edge_index"):
            layer(x, wrong)
        with pytest.raises(RuntimeError, match="every id of 'edge_index' in range"):
            compiled(x, wrong)
    # batch= builds its graph from lengths read on the host: refused by name (it failed
    # on a data-dependent guard inside the batch's checks); eager calls take it.
    batch = torch.arange(3).repeat_interleave(torch.tensor([5, 7, 8]))
    by_batch = torch.compile(lambda x: layer(x, batch=batch), backend="eager", fullgraph=True)
    with pytest.raises(Exception, match=r"'batch' to be built outside torch.compile"):
        by_batch(x)
    assert layer(x, batch=batch).shape == (20, 16)


def test_the_operator_on_tiles_compiles_with_graph_inputs() -> None:
    """attention() itself, compiled with q, k, v as graph inputs on a graph whose tiles
    read strided views of them (inputs without a gradient): storage_offset() of an
    input was not traceable. With gradients (no views) too."""
    from gnnattn import attention
    from gnnattn.graphs import sliding_window_graph

    graph = AttentionGraph(sliding_window_graph(256, window=32)).prepare()
    q, k, v = (torch.randn(256, 2, 8, dtype=torch.float64) for _ in range(3))
    assert attention(q, k, v, graph, return_lse=True).backend == "tiles"
    compiled = torch.compile(
        lambda q, k, v: attention(q, k, v, graph), backend="aot_eager", fullgraph=True
    )
    torch.testing.assert_close(compiled(q, k, v), attention(q, k, v, graph), atol=1e-10, rtol=1e-10)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    got, want = compiled(q, k, v), attention(q, k, v, graph)
    for a, b in zip(
        torch.autograd.grad(got.square().sum(), (q, k, v)),
        torch.autograd.grad(want.square().sum(), (q, k, v)),
        strict=True,
    ):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


def test_jit_trace_refuses_to_build_a_graph_and_traces_a_built_one() -> None:
    """Under torch.jit.trace a layer's graph from the call failed deep inside (a node
    count traced as a tensor; numba typing a traced batch); it is refused by name. A
    module holding a built graph traces, for that graph."""
    torch.manual_seed(0)
    conv = TransformerConv(8, 4, heads=2)
    ei, x = torch.tensor([[0, 1, 2], [1, 2, 0]]), torch.randn(3, 8)
    with pytest.raises(RuntimeError, match="cannot build their graph under torch.jit.trace"):
        torch.jit.trace(conv, (x, ei), check_trace=False)
    for gps in (GPSConv(8, None, heads=2), GPSConv(8, None, heads=2, attn_type="exphormer")):
        with pytest.raises(RuntimeError, match="cannot build their graph under torch.jit.trace"):
            torch.jit.trace(gps, (x, ei), check_trace=False)

    class Held(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.graph = conv, AttentionGraph(ei, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.conv(x, self.graph)

    held = Held()
    traced = torch.jit.trace(held, (x,), check_trace=False)
    torch.testing.assert_close(traced(2 * x), held(2 * x))
