r"""The kernels as PyTorch operators: the ``gnnattn`` namespace of ``torch.ops``.

Each fused entry point is one ``torch.library.custom_op`` with a fake
(shape-only) kernel and, where it has a gradient, a registered autograd, so
that ``torch.compile`` and ``torch.export`` see one opaque, shape-correct op
instead of a Python function they cannot trace:

=====================================  ===========================================
``torch.ops.gnnattn.``                 computes
=====================================  ===========================================
``attention_fwd`` / ``attention_bwd``  fused sparse attention over a CSR and its
                                       gradients (autograd: the forward's)
``block_attention_fwd`` / ``_bwd``     attention within complete blocks (a batch
                                       of small graphs) and its gradients
``segment_softmax_fwd`` / ``_bwd``     the stable softmax of CSR segments
``dropout``                            dropout by the counter-based stream
``relu_dropout`` / ``relu_dropout_bwd``  ``dropout(relu(x))``, backward from the output
``dropout_bits``                       the stream's 24-bit numbers at counters
=====================================  ===========================================

**One contract.** An op runs the kernel module of its tensors' device
(:func:`gnnattn.kernels.get`: numba on the CPU, Triton on CUDA, the torch
reference elsewhere); every module has the reference's signatures. Schemas
take tensors and scalars only:

* the graph's layouts and plans are tensors the graph holds (``plan``: the
  kernel module's :func:`plan_tensors` of the CSR, one int64 tensor;
  ``tptr``, ``trow``, ``tperm``: the transposed CSR, ``None`` where no
  backward will run; ``csc_plan``: its plan). An empty plan means "not
  made": the op then checks and plans inside the call, as a graph built
  inside a compiled region or exported with its edges as inputs needs;
* the dropout key is an int64 tensor ``[seed, offset]`` on the CPU
  (:func:`draw_key`), saved for the backward, which regenerates the mask;
* an absent result is an empty tensor (schemas have no optional results).

The ops trust their inputs: :func:`gnnattn.attention` validates a call once,
before any op runs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .common import Dropout, acc_dtype, under_func_transform

__all__ = [
    "attention",
    "block_attention",
    "differentiable_backward",
    "draw_key",
    "dropout_of",
    "plan_from_tensors",
    "plan_tensors",
]

_OFFSET_MASK = 0x7FFF_FFFF


def get(device: torch.device) -> Any:
    """The kernel module of ``device`` (:func:`gnnattn.kernels.get`, looked up per call)."""
    from . import get as kernel_module

    return kernel_module(device)


def draw_key() -> Tensor:
    """A fresh dropout key ``[seed, offset]`` (int64, CPU) from torch's default generator.

    The CPU generator whatever the device (drawing there never waits on a
    GPU, and ``torch.manual_seed`` seeds it): a seed in ``[0, 2^62)`` and an
    offset in ``[0, 2^31)``, the ranges of
    :class:`gnnattn.kernels.common.Dropout`. Traceable, so a compiled model
    draws a new key per call.
    """
    key = torch.randint(0, 2**62, (2,), dtype=torch.int64, device="cpu")
    return key & torch.tensor([2**63 - 1, _OFFSET_MASK], device="cpu")


def dropout_of(key: Tensor | None, p: float) -> Dropout | None:
    """The :class:`~gnnattn.kernels.common.Dropout` of a key tensor (``None``: no dropout)."""
    if key is None or p <= 0.0:
        return None
    seed, offset = key.tolist()  # a CPU tensor: no device synchronisation
    return Dropout(float(p), int(seed), int(offset))


def plan_tensors(
    ptr: Tensor, col: Tensor, num_cols: int, *, perm: Tensor | None = None, check: bool = True
) -> Tensor:
    """The kernel module's work plan of a CSR, as the ops take it: one int64 tensor.

    Made once per graph and layout (:class:`gnnattn.AttentionGraph` keeps it);
    a module without plans (the reference) gives an empty one. The indices are
    checked (a host read) unless ``check=False``: a graph's own layouts, made
    from edges it checked, are not checked twice.
    """
    kern = get(ptr.device)
    make = getattr(kern, "plan_tensors", None)
    if make is None:
        if check:
            kern.plan(ptr, col, num_cols, perm=perm)
        return torch.empty(0, dtype=torch.int64, device=ptr.device)
    return make(ptr, col, num_cols, perm=perm, check=check)


def plan_from_tensors(
    kern: Any, ptr: Tensor, col: Tensor, num_cols: int, packed: Tensor, perm: Tensor | None
) -> Any:
    """The module's plan object from :func:`plan_tensors`' tensor, or a new (checked) plan
    when it is empty (not made)."""
    if packed.numel() == 0 or not hasattr(kern, "plan_from_tensors"):
        return kern.plan(ptr, col, num_cols, perm=perm)
    return kern.plan_from_tensors(ptr, col, num_cols, packed, perm=perm)


def _empty(like: Tensor) -> Tensor:
    return like.new_empty(0)


def _owned(results: list[Tensor | None], inputs: tuple[Any, ...], like: Tensor) -> tuple:
    """The results as an op may return them: contiguous (as the fake kernels say), never
    sharing memory with an input or another result (an empty graph's kernels may
    return an input, and ``dbias`` may view the ``[dS | P]`` buffer with ``P``);
    ``None`` becomes an empty tensor. Only what breaks a rule is copied: a view of a
    buffer the kernel made is returned as it is."""
    seen = {t.untyped_storage().data_ptr() for t in inputs if isinstance(t, Tensor) and t.numel()}
    out = []
    for t in results:
        if t is None:
            out.append(_empty(like))
            continue
        ptr = t.untyped_storage().data_ptr() if t.numel() else None
        if ptr in seen or not t.is_contiguous():
            t = t.clone(memory_format=torch.contiguous_format)
            ptr = t.untyped_storage().data_ptr() if t.numel() else None
        if ptr is not None:
            seen.add(ptr)
        out.append(t)
    return tuple(out)


# --------------------------------------------------------------------------- attention


def _attention_fwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    ptr: Tensor,
    col: Tensor,
    plan: Tensor,
    tptr: Tensor | None,
    trow: Tensor | None,
    tperm: Tensor | None,
    csc_plan: Tensor,
    bias: Tensor | None,
    edge_attr: Tensor | None,
    edge_query: Tensor | None,
    dropout_key: Tensor | None,
    scale: float,
    dropout_p: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """``(out [N, H, Cv], lse [N, H], edge_out [N, H, F])`` over the CSR ``(ptr, col)``.

    The transposed CSR and its plan are not read here: they are the
    backward's layout, inputs so that the registered autograd can reach them.
    ``edge_out`` is ``[N, H, 0]`` without ``edge_attr``.
    """
    kern = get(q.device)
    dropout = dropout_of(dropout_key, dropout_p)
    op = getattr(kern, "attention_fwd_op", None)
    if op is not None and plan.numel():
        # The module's entry for validated calls over a graph's plan (see its docs).
        res = op(q, k, v, ptr, col, plan, bias, edge_attr, edge_query, dropout, scale)
        eo = res[2] if edge_attr is not None else q.new_empty(q.shape[0], q.shape[1], 0)
        return res[0], res[1], eo
    pl = plan_from_tensors(kern, ptr, col, k.shape[0], plan, None)
    opts = {} if edge_attr is None else {"edge_attr": edge_attr, "edge_query": edge_query}
    res = kern.attention_fwd(
        q,
        k,
        v,
        ptr,
        col,
        scale,
        bias,
        dropout=dropout,
        plan=pl,
        **opts,
    )
    out, lse = res[0], res[1]
    n, h = q.shape[0], q.shape[1]
    eo = res[2] if edge_attr is not None else q.new_empty(n, h, 0)
    return _owned([out, lse, eo], (q, k, v, bias, edge_attr, edge_query), q)


attention_fwd = torch.library.custom_op("gnnattn::attention_fwd", mutates_args=())(_attention_fwd)


@attention_fwd.register_fake
def _attention_fwd_fake(
    q,
    k,
    v,
    ptr,
    col,
    plan,
    tptr,
    trow,
    tperm,
    csc_plan,
    bias,
    edge_attr,
    edge_query,
    dropout_key,
    scale,
    dropout_p,
):  # type: ignore[no-untyped-def]
    n, h, f = q.shape[0], q.shape[1], edge_attr.shape[-1] if edge_attr is not None else 0
    out = q.new_empty(n, h, v.shape[2])
    lse = q.new_empty(n, h, dtype=acc_dtype(q.dtype))
    return out, lse, q.new_empty(n, h, f)


def _attention_bwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor | None,
    lse: Tensor,
    grad_out: Tensor,
    ptr: Tensor,
    col: Tensor,
    plan: Tensor,
    tptr: Tensor | None,
    trow: Tensor | None,
    tperm: Tensor | None,
    csc_plan: Tensor,
    bias: Tensor | None,
    edge_attr: Tensor | None,
    edge_query: Tensor | None,
    edge_out: Tensor | None,
    grad_edge_out: Tensor | None,
    dropout_key: Tensor | None,
    scale: float,
    dropout_p: float,
    need_dedge_attr: bool,
    grad_lse: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``(dq, dk, dv, dbias, dedge_attr, dedge_query)``; an absent one is empty ``[0]``.

    ``grad_lse`` is the gradient of the forward's ``lse`` (``None``: zero).

    ``out`` (and ``edge_out``) are read by the kernels that take ``D_i`` from
    the outputs (Triton's); the CPU kernels recompute it from the edges, and
    are given ``None``.
    """
    kern = get(q.device)
    dropout = dropout_of(dropout_key, dropout_p)
    op = getattr(kern, "attention_bwd_op", None)
    if op is not None and not plan.numel():
        # A graph built in a compiled region has no plan: made here (its indices
        # checked), so that the op takes the source pass an eager call takes.
        plan = plan_tensors(ptr, col, k.shape[0])
    layouts = (ptr, col, plan, tptr, trow, tperm, csc_plan)
    if op is not None:
        grads = op(
            q,
            k,
            v,
            lse,
            grad_out,
            layouts,
            bias,
            edge_attr,
            edge_query,
            grad_edge_out,
            dropout,
            scale,
            need_dedge_attr,
            grad_lse,
        )
        # Four results without edge features, six with (d edge_attr, d edge_query).
        dea, deq = grads[4:] if edge_attr is not None else (None, None)

        def given(t: Tensor | None) -> Tensor:
            return t if t is not None else _empty(q)

        dq, dk, dv, dbias = grads[:4]
        return given(dq), given(dk), given(dv), given(dbias), given(dea), given(deq)
    pl = plan_from_tensors(kern, ptr, col, k.shape[0], plan, None)
    layout: dict[str, Any] = {}
    if tptr is not None and trow is not None and tperm is not None:
        layout["csc"] = (tptr, trow, tperm)
        if csc_plan.numel():
            layout["csc_plan"] = plan_from_tensors(kern, tptr, trow, q.shape[0], csc_plan, tperm)
    opts: dict[str, Any] = {} if grad_lse is None else {"grad_lse": grad_lse}
    if edge_attr is not None:
        opts |= {
            "edge_attr": edge_attr,
            "edge_query": edge_query,
            "grad_edge_out": grad_edge_out,
            "need_dedge_attr": need_dedge_attr,
        }
        if edge_out is not None:
            opts["edge_out"] = edge_out
    res = kern.attention_bwd(
        q,
        k,
        v,
        out,
        lse,
        grad_out,
        ptr,
        col,
        scale,
        bias,
        dropout=dropout,
        plan=pl,
        **layout,
        **opts,
    )
    dq, dk, dv, dbias = res[0], res[1], res[2], res[3]
    # With edge features the last two results are d edge_attr and d edge_query.
    dea = res[-2] if edge_attr is not None else None
    deq = res[-1] if edge_attr is not None else None
    grads = [dq, dk, dv, dbias, dea, deq]
    inputs = (q, k, v, out, lse, grad_out, bias, edge_attr, edge_query, edge_out, grad_edge_out)
    return _owned(grads, (*inputs, grad_lse), q)


attention_bwd = torch.library.custom_op("gnnattn::attention_bwd", mutates_args=())(_attention_bwd)


@attention_bwd.register_fake
def _attention_bwd_fake(
    q,
    k,
    v,
    out,
    lse,
    grad_out,
    ptr,
    col,
    plan,
    tptr,
    trow,
    tperm,
    csc_plan,
    bias,
    edge_attr,
    edge_query,
    edge_out,
    grad_edge_out,
    dropout_key,
    scale,
    dropout_p,
    need_dedge_attr,
    grad_lse=None,
):  # type: ignore[no-untyped-def]
    # Contiguous, as _owned makes the results, whatever the inputs' strides.
    dbias = bias.new_empty(bias.shape) if bias is not None else _empty(q)
    dea = (
        edge_attr.new_empty(edge_attr.shape)
        if edge_attr is not None and need_dedge_attr
        else _empty(q)
    )
    deq = edge_query.new_empty(edge_query.shape) if edge_query is not None else _empty(q)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dbias, dea, deq


def _attention_setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, ...]) -> None:
    q, k, v, ptr, col, plan, tptr, trow, tperm, csc_plan, bias, ea, eq, key, scale, p = inputs
    out, lse, eo = output
    # A kernel module declares whether its backward reads the forward's output:
    # the CPU kernels' recompute D_i from the edges, so theirs is not kept (at
    # N = 1M, embed 128, 0.5 GB less at the backward's peak).
    keep_out = getattr(get(q.device), "BACKWARD_READS_OUTPUT", True)
    ctx.save_for_backward(
        q,
        k,
        v,
        ptr,
        col,
        plan,
        tptr,
        trow,
        tperm,
        csc_plan,
        bias,
        ea,
        eq,
        key,
        out if keep_out else None,
        lse,
        eo if keep_out and ea is not None else None,
    )
    ctx.scale, ctx.p = scale, p
    # The outputs a loss does not use get None, not zeros: the usual call (out alone)
    # then passes no lse gradient down to be read by the kernels.
    ctx.set_materialize_grads(False)


def _attention_backward(
    ctx: Any, grad_out: Tensor | None, grad_lse: Tensor | None, grad_eo: Tensor | None
) -> Any:
    q, k, v, ptr, col, plan, tptr, trow, tperm, csc_plan, bias, ea, eq, key, out, lse, eo = (
        ctx.saved_tensors
    )
    if torch.is_grad_enabled():
        # A double backward (create_graph=True: a gradient penalty, MAML). The kernels'
        # gradients have no graph: differentiated again, they would be constants and the
        # second derivative silently wrong. The torch reference's can be differentiated;
        # only this case pays its [|E|, C] messages.
        from . import reference

        def forward(q: Tensor, k: Tensor, v: Tensor, *options: Tensor | None) -> Any:
            bias, ea, eq = options
            drop = dropout_of(key, ctx.p)
            return reference.attention_fwd(
                q, k, v, ptr, col, ctx.scale, bias, dropout=drop, edge_attr=ea, edge_query=eq
            )

        inputs = {0: q, 1: k, 2: v, 10: bias, 11: ea, 12: eq}
        return differentiable_backward(ctx, forward, inputs, (grad_out, grad_lse, grad_eo), 16)
    need_dea = ea is not None and ctx.needs_input_grad[11]
    ge = grad_eo.contiguous() if ea is not None and grad_eo is not None else None
    if grad_out is None:  # a loss of lse (or edge_out) alone
        grad_out = q.new_zeros(q.shape[0], q.shape[1], v.shape[2])
    grad_out = grad_out.contiguous()
    glse = grad_lse.contiguous() if grad_lse is not None else None
    saved = (q, k, v, out, lse, grad_out, bias, ea, eq, eo, ge, glse)
    bwd = _attention_bwd if _eager(saved) else torch.ops.gnnattn.attention_bwd
    dq, dk, dv, dbias, dea, deq = bwd(
        q,
        k,
        v,
        out,
        lse,
        grad_out,
        ptr,
        col,
        plan,
        tptr,
        trow,
        tperm,
        csc_plan,
        bias,
        ea,
        eq,
        eo,
        ge,
        key,
        ctx.scale,
        ctx.p,
        need_dea,
        glse,
    )
    return (
        dq,
        dk,
        dv,
        None,
        None,
        None,
        None,
        None,
        None,
        None,
        dbias if bias is not None else None,
        dea if need_dea else None,
        deq if eq is not None else None,
        None,
        None,
        None,
    )


def differentiable_backward(
    ctx: Any,
    forward: Any,
    inputs: dict[int, Tensor | None],
    grads: tuple[Tensor | None, ...],
    num_inputs: int,
) -> tuple[Tensor | None, ...]:
    """What an op's autograd returns under ``create_graph=True`` (a double backward): the
    gradients of its ``inputs`` (keyed by their position among its ``num_inputs``), from
    ``forward``, its torch reference, run again on them (in the order of ``inputs``) in
    the accumulation dtype, as the kernels compute, for the outputs' gradients ``grads``;
    differentiable, where the kernels' have no graph."""
    result: list[Tensor | None] = [None] * num_inputs
    wanted = [i for i, t in inputs.items() if t is not None and ctx.needs_input_grad[i]]
    if not wanted or all(g is None for g in grads):
        return tuple(result)
    # Views: the gradient of each input as a variable of its own. One input may be
    # computed from another (an edge query from q): differentiated as they are, the
    # path between them would be counted here and again by the caller's backward.
    views = {i: t.view_as(t) if t is not None else None for i, t in inputs.items()}
    with torch.enable_grad():
        outs = forward(*(_in_acc_dtype(t) for t in views.values()))
        # The gradients of the outputs a loss used (the reference may make fewer outputs
        # than the op: none for an absent edge_out), each output in its gradient's dtype.
        pairs = [(o.to(g.dtype), g) for o, g in zip(outs, grads, strict=False) if g is not None]
        got = torch.autograd.grad(
            [o for o, _ in pairs],
            [t for i, t in views.items() if i in wanted and t is not None],
            [g for _, g in pairs],
            create_graph=True,
            allow_unused=True,
        )
    for i, g in zip(wanted, got, strict=True):
        t = views[i]
        assert t is not None
        result[i] = g if g is not None else torch.zeros_like(t)
    return tuple(result)


def _in_acc_dtype(t: Tensor | None) -> Tensor | None:
    return t.to(acc_dtype(t.dtype)) if t is not None and t.is_floating_point() else t


attention_fwd.register_autograd(_attention_backward, setup_context=_attention_setup)


# A Parameter is a plain tensor to the dispatcher (its __torch_function__ is
# disabled): a learned score bias takes the short path too. Other subclasses may
# override any op, so they go through the dispatcher.
_PLAIN = (Tensor, torch.nn.Parameter)


def _eager(tensors: tuple[Any, ...]) -> bool:
    """Whether a call may run an op's implementation directly, without the dispatcher:
    in eager mode (not compiling, no dispatch or function mode active: no tracer, no
    fake tensors) on plain tensors. What the dispatcher and the registered autograd
    then add, per call (a scan of the schema, a generated autograd function), was
    half of the op's cost on a batch of molecules."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return False
    if torch._C._len_torch_dispatch_stack() or torch._C._is_torch_function_mode_enabled():
        return False
    if under_func_transform():  # vmap, grad: the op's rules apply
        return False
    return all(type(t) in _PLAIN for t in tensors if isinstance(t, Tensor))


class _Attention(torch.autograd.Function):
    """``attention_fwd``'s registered autograd, applied to its implementation directly
    (the eager path of :func:`attention`): the same setup and the same backward."""

    # forward(ctx, ...) rather than a separate setup_context: autograd then
    # does not bind the 16 arguments to a signature on every call.
    @staticmethod
    def forward(ctx: Any, *inputs: Any) -> tuple[Tensor, Tensor, Tensor]:  # type: ignore[override]
        output = _attention_fwd(*inputs)
        _attention_setup(ctx, inputs, output)
        return output

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> Any:  # type: ignore[override]
        return _attention_backward(ctx, *grads)


def attention(*inputs: Any) -> tuple[Tensor, Tensor, Tensor]:
    """``torch.ops.gnnattn.attention_fwd(*inputs)`` with its autograd.

    In eager mode on plain tensors the op's implementation runs directly
    (:func:`_eager`); compiled, exported or traced, the op runs, which those see.
    """
    if not _eager(inputs):
        return torch.ops.gnnattn.attention_fwd(*inputs)
    if torch.is_grad_enabled() and any(isinstance(t, Tensor) and t.requires_grad for t in inputs):
        return _Attention.apply(*inputs)
    return _attention_fwd(*inputs)


# --------------------------------------------------------------------------- block attention


def _block_kernels(device: torch.device) -> Any:
    """The module with the block kernels for ``device`` (the CPU's; the reference elsewhere)."""
    kern = get(device)
    if not hasattr(kern, "block_attention_fwd"):
        from . import reference

        return reference
    return kern


def _block_attention_fwd(
    q: Tensor, k: Tensor, v: Tensor, ptr: Tensor, scale: float
) -> tuple[Tensor, Tensor]:
    """``(out, lse)`` of attention within each complete block of ``ptr`` (the nodes
    ``ptr[b] .. ptr[b + 1]`` attend to each other): :mod:`.cpu.blocks`."""
    # The kernel reads every row of ptr's blocks, v as wide as k: unchecked, a
    # wrong shape would read out of bounds.
    assert q.shape == k.shape == v.shape and int(ptr[-1]) == q.shape[0]
    q, k, v = (t.contiguous() for t in (q, k, v))
    return _block_kernels(q.device).block_attention_fwd(q, k, v, ptr, scale)


block_attention_fwd = torch.library.custom_op("gnnattn::block_attention_fwd", mutates_args=())(
    _block_attention_fwd
)


@block_attention_fwd.register_fake
def _(q: Tensor, k: Tensor, v: Tensor, ptr: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    return q.new_empty(q.shape), q.new_empty(q.shape[:2])


def _block_attention_bwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    grad: Tensor,
    ptr: Tensor,
    scale: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """``(dq, dk, dv)`` of ``block_attention_fwd``."""
    q, k, v, grad = (t.contiguous() for t in (q, k, v, grad))
    kern = _block_kernels(q.device)
    return kern.block_attention_bwd(q, k, v, out, lse, grad, ptr, scale)


block_attention_bwd = torch.library.custom_op("gnnattn::block_attention_bwd", mutates_args=())(
    _block_attention_bwd
)


@block_attention_bwd.register_fake
def _(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    grad: Tensor,
    ptr: Tensor,
    scale: float,
) -> tuple[Tensor, Tensor, Tensor]:
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _block_setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, Tensor]) -> None:
    q, k, v, ptr, scale = inputs
    ctx.save_for_backward(q, k, v, *output, ptr)
    ctx.scale = scale
    # lse is an output for the backward only: its gradient would be dropped.
    ctx.mark_non_differentiable(output[1])


def _block_backward(ctx: Any, grad: Tensor, _grad_lse: Tensor | None) -> tuple[Any, ...]:
    q, k, v, out, lse, ptr = ctx.saved_tensors
    if torch.is_grad_enabled():
        # A double backward, as in the attention op's: the reference's gradients.
        from . import reference

        def forward(q: Tensor, k: Tensor, v: Tensor) -> Any:
            return reference.block_attention_fwd(q, k, v, ptr, ctx.scale)[:1]

        return differentiable_backward(ctx, forward, {0: q, 1: k, 2: v}, (grad,), 5)
    inputs = (q, k, v, out, lse, grad, ptr, ctx.scale)
    run = _block_attention_bwd if _eager(inputs) else torch.ops.gnnattn.block_attention_bwd
    dq, dk, dv = run(*inputs)
    return dq, dk, dv, None, None


block_attention_fwd.register_autograd(_block_backward, setup_context=_block_setup)


class _BlockAttention(torch.autograd.Function):
    """``block_attention_fwd``'s registered autograd on its implementation (eager)."""

    @staticmethod
    def forward(ctx: Any, *inputs: Any) -> tuple[Tensor, Tensor]:  # type: ignore[override]
        output = _block_attention_fwd(*inputs)
        _block_setup(ctx, inputs, output)
        return output

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> Any:  # type: ignore[override]
        return _block_backward(ctx, *grads)


def block_attention(q: Tensor, k: Tensor, v: Tensor, ptr: Tensor, scale: float) -> Tensor:
    """Attention within each complete block of ``ptr``, ``[N, H, C]``, with its autograd.

    ``torch.ops.gnnattn.block_attention_fwd``; in eager mode on plain tensors
    its implementation runs directly, as in :func:`attention`.
    """
    # Contiguous before the op, so that the backward reuses the forward's copies.
    q, k, v = (t.contiguous() for t in (q, k, v))
    inputs = (q, k, v, ptr, scale)
    if not _eager(inputs):
        return torch.ops.gnnattn.block_attention_fwd(*inputs)[0]
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        return _BlockAttention.apply(*inputs)[0]
    return _block_attention_fwd(*inputs)[0]


# --------------------------------------------------------------------------- segment softmax


def _like_first(x: Tensor, *args: Any) -> Tensor:
    """The fake kernel of the ops whose result is shaped and typed like their first input
    (contiguous, as the kernels make it, whatever the input's strides)."""
    return x.new_empty(x.shape)


@torch.library.custom_op("gnnattn::segment_softmax_fwd", mutates_args=())
def segment_softmax_fwd(src: Tensor, ptr: Tensor) -> Tensor:
    """The stable softmax of ``src`` ``[E, F]`` within each CSR segment of ``ptr``."""
    return get(src.device).segment_softmax_fwd(src.contiguous(), ptr)


segment_softmax_fwd.register_fake(_like_first)


@torch.library.custom_op("gnnattn::segment_softmax_bwd", mutates_args=())
def segment_softmax_bwd(y: Tensor, grad: Tensor, ptr: Tensor) -> Tensor:
    """The gradient of :func:`segment_softmax_fwd` from its output ``y``."""
    return get(y.device).segment_softmax_bwd(y, grad.contiguous(), ptr)


segment_softmax_bwd.register_fake(_like_first)


def _softmax_setup(ctx: Any, inputs: tuple[Tensor, Tensor], output: Tensor) -> None:
    ctx.save_for_backward(output, inputs[1])


def _softmax_backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
    y, ptr = ctx.saved_tensors
    if torch.is_grad_enabled():
        # A double backward: the same formula in torch ops, differentiable through the
        # output y (the op's, with its autograd) and the incoming gradient.
        from . import reference

        return reference.segment_softmax_bwd(y, grad, ptr), None
    return torch.ops.gnnattn.segment_softmax_bwd(y, grad, ptr), None


segment_softmax_fwd.register_autograd(_softmax_backward, setup_context=_softmax_setup)


# --------------------------------------------------------------------------- activation dropout


def _stream_kernels(x: Tensor) -> Any:
    """The module with the stream's dense kernels for ``x`` (the CPU's take float32/64 only)."""
    kern = get(x.device)
    if not hasattr(kern, "relu_dropout_bwd") or x.dtype not in (torch.float32, torch.float64):
        from . import reference

        return reference
    return kern


@torch.library.custom_op("gnnattn::dropout", mutates_args=())
def dropout(x: Tensor, key: Tensor, p: float) -> Tensor:
    """``x`` with the elements the stream drops zeroed and the rest scaled by ``1 / (1 - p)``.

    Its own gradient: the backward applies the same mask (the same key) to
    the incoming gradient.
    """
    drop = dropout_of(key, p)
    if drop is None:
        return x.clone(memory_format=torch.contiguous_format)
    # Contiguous, as the fake says: the reference's product keeps a strided x's strides.
    return _stream_kernels(x).dropout(x, drop).contiguous()


dropout.register_fake(_like_first)


def _dropout_setup(ctx: Any, inputs: tuple[Tensor, Tensor, float], output: Tensor) -> None:
    ctx.save_for_backward(inputs[1])
    ctx.p = inputs[2]


def _dropout_backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
    (key,) = ctx.saved_tensors
    return torch.ops.gnnattn.dropout(grad, key, ctx.p), None, None


dropout.register_autograd(_dropout_backward, setup_context=_dropout_setup)


@torch.library.custom_op("gnnattn::relu_dropout", mutates_args=())
def relu_dropout(x: Tensor, key: Tensor, p: float) -> Tensor:
    """``dropout(relu(x))`` in one pass, by the stream of :func:`dropout`."""
    drop = dropout_of(key, p)
    if drop is None:
        return torch.relu(x).contiguous()
    return _stream_kernels(x).relu_dropout(x, drop).contiguous()  # as dropout's


relu_dropout.register_fake(_like_first)


@torch.library.custom_op("gnnattn::relu_dropout_bwd", mutates_args=())
def relu_dropout_bwd(y: Tensor, grad: Tensor, p: float) -> Tensor:
    """The gradient of :func:`relu_dropout` read from its output: ``grad / (1 - p)`` where
    ``y > 0``."""
    return _stream_kernels(y).relu_dropout_bwd(y, grad, 1.0 / (1.0 - p)).contiguous()


relu_dropout_bwd.register_fake(_like_first)


def _relu_dropout_setup(ctx: Any, inputs: tuple[Tensor, Tensor, float], output: Tensor) -> None:
    # The output, not the input or a mask: the next linear layer keeps it for
    # its own backward anyway, so this costs no memory.
    ctx.save_for_backward(output)
    ctx.p = inputs[2]


def _relu_dropout_backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
    (y,) = ctx.saved_tensors
    return torch.ops.gnnattn.relu_dropout_bwd(y, grad, ctx.p), None, None


relu_dropout.register_autograd(_relu_dropout_backward, setup_context=_relu_dropout_setup)


def _relu_dropout_bwd_setup(ctx: Any, inputs: tuple[Tensor, Tensor, float], output: Tensor) -> None:
    ctx.save_for_backward(inputs[0])
    ctx.p = inputs[2]


def _relu_dropout_bwd_backward(ctx: Any, grad: Tensor) -> tuple[None, Tensor, None]:
    # A double backward (a gradient penalty): linear in the incoming gradient, so the
    # same mask again; piecewise constant in y, whose gradient is zero.
    (y,) = ctx.saved_tensors
    return None, torch.ops.gnnattn.relu_dropout_bwd(y, grad, ctx.p), None


relu_dropout_bwd.register_autograd(
    _relu_dropout_bwd_backward, setup_context=_relu_dropout_bwd_setup
)


@torch.library.custom_op("gnnattn::dropout_bits", mutates_args=())
def dropout_bits(counter: Tensor, key: Tensor) -> Tensor:
    """The stream's 24-bit numbers (int64) at ``counter`` for ``key``.

    An op so that the message-passing path's mask is one opaque call under
    ``torch.compile``: Inductor's C++ backend vectorises the hash's int64
    products as floats and fails to compile them.
    """
    from .common import dropout_bits as bits

    seed, offset = key.tolist()
    return bits(Dropout(0.5, int(seed), int(offset)), counter)


@dropout_bits.register_fake
def _dropout_bits_fake(counter, key):  # type: ignore[no-untyped-def]
    return torch.empty_like(counter, dtype=torch.int64)
