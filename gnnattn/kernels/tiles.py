r"""Tile attention: batched matrix products on gathered tiles, forward and backward.

The kernels of the ``"tiles"`` backend. A graph's block plan
(:mod:`gnnattn.graphs.blocks`) groups its targets into row windows and
compacts each window's sources into dense columns; per chunk of windows of
one tile shape :math:`R \times K` and per head, with :math:`Q_w` the
window's queries gathered ``[R, C]`` and :math:`K_w, V_w` its columns' keys
and values gathered ``[K, C]``,

.. math::
    S = Q_w K_w^\top \cdot \text{scale} + B_w + M_w, \qquad
    P = \operatorname{softmax}_{\text{row}}(S), \qquad
    O_w = (P \odot F_w)\, V_w

with :math:`B_w` the score bias scattered into the slots of the edges,
:math:`M_w` ``-inf`` in the slots without one and :math:`F_w` the dropout
factors of the slots' edges (the stream of :mod:`gnnattn.kernels.common` at
each edge's CSR position, so the mask is the CSR kernels'). The plan leaves
the rows without edges (padding, targets without edges) unmasked, so every
row has a finite score and the softmax is one fused op; their output is
dropped and their output gradient read from a zero row. Two kernels:

* **The CPU's fused attention kernel** (:func:`_flash`: aten's FlashAttention
  for the CPU, which ``scaled_dot_product_attention`` runs there), one call
  per chunk with the chunk's mask (the bias in it, as a float mask). Its
  blocked softmax never writes a chunk's scores; autograd differentiates it
  (its backward recomputes the scores from its log-sum-exp) and the gathers.
  For a call without dropout (its own is not the CSR kernels' stream),
  without the weights, without a gradient for the bias or the lse, and with
  values as wide as the keys: measured 20-25% faster than the other kernel.
* **Batched GEMMs** (:class:`_TileAttention`), every option: ``bmm`` for
  :math:`S` and :math:`O_w`, the softmax and the dropout factors in place
  between them, the weights gathered from the slots of the edges. Its
  backward recomputes :math:`S` and :math:`P` per chunk (a chunk's tiles
  are its memory; the softmax from :math:`S` is one fused op, where
  :math:`e^{S - \text{lse}}` from the saved log-sum-exp would be two), then

  .. math::
      dP = (dO\, V_w^\top) \odot F_w + G, \qquad
      dS = P \odot \bigl(dP - \textstyle\sum_j P_{:j}\, dP_{:j}\bigr)
          + P\, g^{\text{lse}}

  (:math:`G` the gradient of the weights when they are an output; the
  softmax's fused backward), :math:`dQ = dS\,K_w\,\text{scale}`,
  :math:`dK = dS^\top Q_w\,\text{scale}` and :math:`dV = (P \odot F_w)^\top
  dO`, scattered back to the rows they came from (a source is a column of
  many windows: its gradients are added, every head in one ``index_add``).

Only torch operations (gathers, ``bmm``, the aten attention op), so it runs
on every device (the fused kernel on the CPU only) and under
``torch.compile``. It takes finite ``q``, ``k``, ``v`` whose scores cannot
overflow: a padded column is shared by every row of its window, and a
non-finite value there would reach them through ``0 * NaN`` in
:math:`P V_w`. The operator sends other inputs to the CSR kernels. A score
bias may hold any value: with ``guard`` (a bias that is not finite) the GEMM
kernel applies the contract's rules explicitly (a row without a finite score
is shifted by 0 and gets zero weights and ``lse = -inf``; the slots without
an edge are zeroed after the division and in :math:`dS`, since a NaN or
``+inf`` bias makes its row's maximum NaN, and ``-inf - NaN`` is NaN).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from ..graphs.blocks import TileChunk, TilePlan
from .common import acc_dtype

__all__ = ["tile_attention"]


def _gather(t: Tensor, index: Tensor, n: int) -> Tensor:
    """Rows ``index`` (``[n, L]``) of ``t`` ``[H, N, C]`` as ``[H * n, L, C]``."""
    h, c = t.shape[0], t.shape[2]
    return t.index_select(1, index.view(-1)).view(h * n, index.shape[1], c)


def _scores(qt: Tensor, kt: Tensor, bt: Tensor | None, ch: TileChunk) -> tuple[Tensor, ...]:
    """``(S, Q_w, K_w)``: the chunk's scores ``[H * n, R, K]`` (bias added, empty slots
    ``-inf``) from the scaled queries ``qt`` ``[H, N, C]``, and the gathered tiles."""
    h, n = qt.shape[0], ch.rows.shape[0]
    qw = _gather(qt, ch.rows, n)  # (H * n, R, C)
    kw = _gather(kt, ch.cols, n)  # (H * n, K, C)
    s = torch.bmm(qw, kw.transpose(1, 2))  # (H * n, R, K)
    if bt is not None:
        s.view(h, -1).index_add_(1, ch.slot, bt.index_select(1, ch.edge))
    if ch.masked is not None:
        s.view(h, *ch.masked.shape).masked_fill_(ch.masked, float("-inf"))
    return s, qw, kw


def _zero_masked(t: Tensor, ch: TileChunk) -> Tensor:
    if ch.masked is not None:
        t.view(-1, *ch.masked.shape).masked_fill_(ch.masked, 0.0)
    return t


def _probs(s: Tensor, ch: TileChunk, guard: bool, need_lse: bool) -> tuple[Tensor, Tensor | None]:
    """The weights ``P`` of the scores ``s`` ``[H * n, R, K]`` (and their log-sum-exp
    ``[H * n, R]`` with ``need_lse``).

    Every row of a tile has a finite score unless a score bias is ``-inf``
    (padded rows and targets without edges are left unmasked, see
    :class:`~gnnattn.graphs.blocks.TileChunk`), so without ``guard`` it is
    one fused ``torch.softmax``. With ``guard`` (a bias that is not finite),
    the contract's rules explicitly: a row without a finite score is shifted
    by 0 (its weights are 0, its lse ``-inf``), only a zero sum is replaced
    (a NaN sum stays NaN), and the empty slots are zeroed after the
    exponential (``exp(-inf - NaN)`` is NaN).
    """
    if not guard:
        lse = torch.logsumexp(s, -1) if need_lse else None
        return torch.softmax(s, -1), lse
    m = s.amax(-1, keepdim=True)  # (H * n, R, 1)
    m.masked_fill_(m == float("-inf"), 0.0)
    p = s.sub_(m).exp_()
    denom = p.sum(-1, keepdim=True)
    lse = torch.where(denom == 0, float("-inf"), m + denom.log()).squeeze(-1) if need_lse else None
    # Zeroed after the division: a NaN row's sum is NaN, and 0 / NaN is NaN.
    return _zero_masked(p.div_(torch.where(denom == 0, 1.0, denom)), ch), lse


def _scale_edges(flat: Tensor, ch: TileChunk, factor: Tensor) -> Tensor:
    """Multiply the slots of the chunk's edges in ``flat`` ``[H, n R K]`` by ``factor``
    ``[H, E_c]`` (in place); returns their values before."""
    before = flat.index_select(1, ch.slot)  # (H, E_c)
    flat.index_copy_(1, ch.slot, before * factor)
    return before


def _forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None,
    factor: Tensor | None,
    plan: TilePlan,
    scale: float,
    need_alpha: bool,
    need_lse: bool,
    guard: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    h, cv = q.shape[1], v.shape[2]
    qt = (q * scale).transpose(0, 1).contiguous()  # (H, N, C), the scale folded in
    kt = k.transpose(0, 1).contiguous()  # (H, M, C)
    vt = v.transpose(0, 1).contiguous()  # (H, M, Cv)
    bt = bias.t().contiguous() if bias is not None else None  # (H, E)
    ft = factor.t().contiguous() if factor is not None else None  # (H, E)
    alpha_t = q.new_zeros(h, plan.num_edges if need_alpha else 0)  # (H, E)
    outs, lses = [], []
    for ch in plan.chunks:
        w, r = ch.rows.shape
        p, lse = _probs(_scores(qt, kt, bt, ch)[0], ch, guard, need_lse)  # (H * n, R, K)
        flat = p.view(h, -1)
        if need_alpha:
            alpha_t.index_copy_(1, ch.edge, flat.index_select(1, ch.slot))
        if ft is not None:
            _scale_edges(flat, ch, ft.index_select(1, ch.edge))
        outs.append(torch.bmm(p, _gather(vt, ch.cols, w)).view(h, w * r, cv))
        if lse is not None:
            lses.append(lse.view(h, w * r))
    # Targets without edges take the row past the chunks' rows: zeros, lse -inf.
    outs.append(q.new_zeros(h, 1, cv))
    out = torch.cat(outs, 1).index_select(1, plan.take).transpose(0, 1)  # (N, H, Cv)
    lse_out = q.new_zeros(0, h)
    if need_lse:
        lses.append(q.new_full((h, 1), float("-inf")))
        lse_out = torch.cat(lses, 1).index_select(1, plan.take).t().contiguous()  # (N, H)
    return out.contiguous(), lse_out, alpha_t.t()


def _backward(
    ctx: Any, grad_out: Tensor, grad_lse: Tensor | None, grad_alpha: Tensor | None
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    q, k, v, bias, factor = ctx.saved_tensors
    plan: TilePlan = ctx.plan
    scale, guard = ctx.scale, ctx.guard
    n, h, c = q.shape
    m_src, cv = k.shape[0], v.shape[2]
    qt = (q * scale).transpose(0, 1).contiguous()  # (H, N, C)
    kt = k.transpose(0, 1).contiguous()  # (H, M, C)
    vt = v.transpose(0, 1).contiguous()  # (H, M, Cv)
    bt = bias.t().contiguous() if bias is not None else None  # (H, E)
    ft = factor.t().contiguous() if factor is not None else None  # (H, E)
    # The output's gradient, with a zero row N for the rows whose output was
    # dropped (padding, targets without edges): their dS and dV terms vanish.
    got = grad_out.new_zeros(h, n + 1, cv)
    got[:, :n] = grad_out.transpose(0, 1)  # (H, N + 1, Cv)
    glt = None
    if grad_lse is not None:
        glt = grad_lse.new_zeros(h, n + 1)
        glt[:, :n] = grad_lse.t()  # (H, N + 1)
    gat = grad_alpha.t().contiguous() if grad_alpha is not None else None  # (H, E)
    # dK and dV of every head in one [H * M, C] tensor: one index_add per chunk.
    dk = q.new_zeros(h * m_src, c)
    dv = q.new_zeros(h * m_src, cv)
    heads = torch.arange(h, device=q.device).view(h, 1) * m_src  # (H, 1)
    dbias_t = q.new_zeros(h, plan.num_edges) if ctx.needs_input_grad[3] else None
    dqs = []
    for ch in plan.chunks:
        w, r = ch.rows.shape
        s, qw, kw = _scores(qt, kt, bt, ch)
        p, _ = _probs(s, ch, guard, False)  # (H * n, R, K)
        del s
        flat = p.view(h, -1)
        dow = _gather(got, ch.out_rows, w)  # (H * n, R, Cv)
        cols = (ch.cols.view(1, -1) + heads).view(-1)  # (H * n * K,)
        fe = pe = None
        if ft is not None:
            fe = ft.index_select(1, ch.edge)  # (H, E_c)
            pe = _scale_edges(flat, ch, fe)  # the kept weights, for dV
        # cols.numel() rows, not -1: values of width 0 leave nothing to infer it from.
        dv.index_add_(0, cols, torch.bmm(p.transpose(1, 2), dow).view(cols.numel(), cv))
        if pe is not None:
            flat.index_copy_(1, ch.slot, pe)  # back to the weights
        dp = torch.bmm(dow, _gather(vt, ch.cols, w).transpose(1, 2))  # (H * n, R, K)
        if fe is not None:
            _scale_edges(dp.view(h, -1), ch, fe)
        if gat is not None:
            dp.view(h, -1).index_add_(1, ch.slot, gat.index_select(1, ch.edge))
        # dS = P (dP - sum_j P dP): the softmax's fused backward.
        ds = torch._softmax_backward_data(dp, p, -1, p.dtype)
        if glt is not None:
            # d lse_i / d S_ij = P_ij.
            ds.add_(p * glt.index_select(1, ch.out_rows.view(-1)).view(h * w, r, 1))
        if guard:
            _zero_masked(ds, ch)
        if dbias_t is not None:
            dbias_t.index_copy_(1, ch.edge, ds.view(h, -1).index_select(1, ch.slot))
        dqs.append(torch.bmm(ds, kw).view(h, w * r, c))
        dk.index_add_(0, cols, torch.bmm(ds.transpose(1, 2), qw).view(cols.numel(), c))
    dqs.append(q.new_zeros(h, 1, c))
    dq = torch.cat(dqs, 1).index_select(1, plan.take).transpose(0, 1).mul_(scale)  # (N, H, C)
    dbias = dbias_t.t() if dbias_t is not None else None
    return dq, dk.view(h, m_src, c).transpose(0, 1), dv.view(h, m_src, cv).transpose(0, 1), dbias


#: The CPU's fused attention kernel (FlashAttention's blocking, with a mask and a
#: backward), which ``scaled_dot_product_attention`` runs on the CPU; called as the
#: op to have the log-sum-exp too. ``None`` where torch has no such op.
_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _flash_takes(
    plan: TilePlan,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None,
    factor: Tensor | None,
    need_alpha: bool,
    need_lse: bool,
    guard: bool,
) -> bool:
    """Whether :func:`_flash` computes the call: on the CPU, without dropout (the
    kernel's own is not the CSR kernels' stream), weights, a bias that is not finite
    or has a gradient (the kernel's mask has none), a log-sum-exp that needs one
    (the kernel's has none), and with values as wide as the keys. A graph without
    edges takes the other path, whose zeros are an autograd function's output."""
    if _FLASH is None or q.device.type != "cpu" or q.shape[2] != v.shape[2] or not plan.chunks:
        return False
    if factor is not None or need_alpha or guard:
        return False
    grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (q, k, v, bias)
    )
    return not (bias is not None and bias.requires_grad) and not (need_lse and grad)


def _runs(chunks: tuple[TileChunk, ...], bias: bool) -> list[list[TileChunk]]:
    """Consecutive chunks of one tile shape (a bucket's) and, without a bias, one kind
    of mask: one call of the fused kernel each (which never writes the scores, so
    needs no chunking), where one per chunk multiplies the calls by four on a
    batch of graphs of many sizes."""

    def kind(ch: TileChunk) -> tuple[int | bool, ...]:
        shape = (ch.rows.shape[1], ch.cols.shape[1])
        return shape if bias else (*shape, ch.masked is None, ch.key_masked is None)

    runs: list[list[TileChunk]] = []
    for ch in chunks:
        if runs and kind(runs[-1][-1]) == kind(ch):
            runs[-1].append(ch)
        else:
            runs.append([ch])
    return runs


def _run_mask(run: list[TileChunk], bt: Tensor | None, q: Tensor) -> Tensor | None:
    """The fused kernel's mask of a run of chunks, in the queries' dtype (the op takes
    no bool mask): 0 and ``-inf`` in the empty slots ``[n, 1, R, K]``, a key-padding
    ``[n, 1, 1, K]`` where the chunks have one, or with a bias ``[n, H, R, K]``
    holding the bias in the slots of the edges."""
    r, kk = run[0].rows.shape[1], run[0].cols.shape[1]
    rk = r * kk
    w = sum(ch.rows.shape[0] for ch in run)
    full = [
        ch.masked if ch.masked is not None else ch.rows.new_zeros(ch.rows.shape[0], r, kk).bool()
        for ch in run
    ]
    if bt is None:
        if run[0].masked is None:
            return None
        if run[0].key_masked is not None:
            keys = torch.cat([ch.key_masked for ch in run if ch.key_masked is not None])
            return q.new_zeros(w, 1, 1, kk).masked_fill_(keys.view(w, 1, 1, kk), -math.inf)
        masked = torch.cat(full).unsqueeze(1)  # (n, 1, R, K)
        return q.new_zeros(w, 1, r, kk).masked_fill_(masked, -math.inf)
    # Each edge's place in [n, H, R * K]: its window, its head, its slot.
    first = [0]
    for ch in run[:-1]:
        first.append(first[-1] + ch.rows.shape[0] * rk)
    slot = torch.cat([ch.slot + f for ch, f in zip(run, first, strict=True)])  # (E_run,)
    edge = torch.cat([ch.edge for ch in run])
    at = slot + (slot // rk) * ((bt.shape[0] - 1) * rk)  # head 0
    heads = torch.arange(bt.shape[0], device=q.device).view(-1, 1) * rk
    mask = q.new_zeros(w * bt.shape[0] * rk)
    mask.index_put_(((at.view(1, -1) + heads).view(-1),), bt.index_select(1, edge).view(-1))
    mask = mask.view(w, bt.shape[0], r, kk)
    if any(ch.masked is not None for ch in run):
        mask.masked_fill_(torch.cat(full).unsqueeze(1), -math.inf)
    return mask


def _flash(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    plan: TilePlan,
    scale: float,
    bias: Tensor | None,
    need_lse: bool,
) -> tuple[Tensor, Tensor | None]:
    """The tiles through the CPU's fused attention kernel, one call per run of
    chunks of one shape (:func:`_runs`): its blocked softmax never writes the
    scores, and its backward (autograd's, through the gathers) recomputes them
    from its log-sum-exp. For a call without dropout, weights or a bias with a
    gradient (:func:`_flash_takes`); the mask is :func:`_run_mask`'s.

    Without a gradient, a banded chunk (:attr:`~gnnattn.graphs.blocks.TileChunk.band`,
    the interior of a window graph) reads its tiles as strided views of ``q``,
    ``k``, ``v``, one call of its own: on the sliding window of 4096 tokens the
    gathers it saves wrote 90 MB per call, more time than the kernel took.
    """
    assert _FLASH is not None
    h, cv = q.shape[1], v.shape[2]
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    bt = bias.t().contiguous() if bias is not None else None  # (H, E)
    strided = not (
        torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    )
    # Per chunk, in plan order (plan.take's): its (out [n R, H, Cv], lse [n R, H]).
    results: list[tuple[Tensor, Tensor] | None] = [None] * len(plan.chunks)
    at = {id(ch): i for i, ch in enumerate(plan.chunks)}
    gathered: list[list[TileChunk]] = []
    for run in _runs(plan.chunks, bt is not None):
        rest = []
        for ch in run:
            if strided and ch.band is not None:
                tiles = _band_views(q, k, v, ch)
                results[at[id(ch)]] = _call(tiles, [ch], bt, q, scale)
            else:
                rest.append(ch)
        if rest:
            gathered.append(rest)
    if gathered:
        chunks = [ch for run in gathered for ch in run]
        # One gather per tensor for these chunks (its backward is one index_add: per
        # chunk, each would zero a gradient as large as q, k or v).
        every = len(chunks) == len(plan.chunks)
        rows = plan.rows if every else torch.cat([ch.rows.view(-1) for ch in chunks])
        cols = plan.cols if every else torch.cat([ch.cols.view(-1) for ch in chunks])
        qs = q.index_select(0, rows).split([sum(x.rows.numel() for x in run) for run in gathered])
        col_sizes = [sum(x.cols.numel() for x in run) for run in gathered]
        ks = k.index_select(0, cols).split(col_sizes)
        vs = v.index_select(0, cols).split(col_sizes)
        for run, qc, kc, vc in zip(gathered, qs, ks, vs, strict=True):
            r, kk = run[0].rows.shape[1], run[0].cols.shape[1]
            w = qc.shape[0] // r
            tiles = (
                qc.view(w, r, h, -1).transpose(1, 2),  # (n, H, R, C)
                kc.view(w, kk, h, -1).transpose(1, 2),  # (n, H, K, C)
                vc.view(w, kk, h, cv).transpose(1, 2),  # (n, H, K, Cv)
            )
            o, lse = _call(tiles, run, bt, q, scale)
            sizes = [ch.rows.numel() for ch in run]
            for ch, oc, lc in zip(run, o.split(sizes), lse.split(sizes), strict=True):
                results[at[id(ch)]] = (oc, lc)
    assert all(x is not None for x in results)
    # Targets without edges take the row past the chunks' rows: zeros, lse -inf.
    outs = [x[0] for x in results if x is not None] + [q.new_zeros(1, h, cv)]
    out = torch.cat(outs).index_select(0, plan.take)  # (N, H, Cv)
    if not need_lse:
        return out, None
    lses = [x[1] for x in results if x is not None] + [q.new_full((1, h), float("-inf"))]
    return out, torch.cat(lses).index_select(0, plan.take).to(acc_dtype(q.dtype))


def _band_views(q: Tensor, k: Tensor, v: Tensor, ch: TileChunk) -> tuple[Tensor, ...]:
    """The tiles of a banded chunk as views ``(n, H, R, C)``, ``(n, H, K, C)``,
    ``(n, H, K, Cv)`` of the contiguous ``[N, H, C]`` inputs (overlapping: a source
    is a column of several windows)."""
    assert ch.band is not None
    row0, row_step, col0, col_step = ch.band
    (n, r), kk = ch.rows.shape, ch.cols.shape[1]

    def view(t: Tensor, first: int, step: int, width: int) -> Tensor:
        h, c = t.shape[1], t.shape[2]
        past = first + (n - 1) * step + width - t.shape[0]
        if past > 0:
            # The last window's padding reaches past the rows: zero rows there
            # (read only by dropped rows and fully masked columns).
            t = torch.cat([t, t.new_zeros(past, h, c)])
        size, stride = (n, h, width, c), (step * h * c, c, h * c, 1)
        # From a slice, whose storage offset as_strided keeps: no storage_offset()
        # read, which torch.compile cannot trace on a graph input.
        return t.reshape(-1)[first * h * c :].as_strided(size, stride)

    return view(q, row0, row_step, r), view(k, col0, col_step, kk), view(v, col0, col_step, kk)


def _call(
    tiles: tuple[Tensor, ...], run: list[TileChunk], bt: Tensor | None, q: Tensor, scale: float
) -> tuple[Tensor, Tensor]:
    """The fused kernel on a run's tiles: ``out`` ``[n R, H, Cv]``, ``lse`` ``[n R, H]``."""
    assert _FLASH is not None
    o, lse = _FLASH(*tiles, attn_mask=_run_mask(run, bt, q), scale=scale)
    n, h, r, cv = o.shape
    return o.transpose(1, 2).reshape(n * r, h, cv), lse.transpose(1, 2).reshape(n * r, h)


class _TileAttention(torch.autograd.Function):
    """:func:`tile_attention` with its FlashAttention-style backward."""

    @staticmethod
    def forward(  # type: ignore[override]
        q: Tensor,
        k: Tensor,
        v: Tensor,
        bias: Tensor | None,
        factor: Tensor | None,
        plan: TilePlan,
        scale: float,
        need_alpha: bool,
        need_lse: bool,
        guard: bool,
    ) -> tuple[Tensor, Tensor, Tensor]:
        return _forward(q, k, v, bias, factor, plan, scale, need_alpha, need_lse, guard)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, ...]) -> None:
        q, k, v, bias, factor, plan, scale, need_alpha, need_lse, guard = inputs
        ctx.save_for_backward(q, k, v, bias, factor)
        ctx.plan, ctx.scale, ctx.guard = plan, scale, guard
        ctx.need_alpha, ctx.need_lse = need_alpha, need_lse
        ctx.set_materialize_grads(False)  # unused outputs' gradients come as None

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, grad_out: Tensor, grad_lse: Tensor | None, grad_alpha: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        q, v = ctx.saved_tensors[0], ctx.saved_tensors[2]
        if grad_out is None:
            grad_out = q.new_zeros(q.shape[0], q.shape[1], v.shape[2])
        dq, dk, dv, dbias = _backward(
            ctx,
            grad_out,
            grad_lse if ctx.need_lse else None,
            grad_alpha if ctx.need_alpha else None,
        )
        return dq, dk, dv, dbias, None, None, None, None, None, None


def tile_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    plan: TilePlan,
    scale: float,
    bias: Tensor | None = None,
    factor: Tensor | None = None,
    *,
    need_alpha: bool = False,
    need_lse: bool = False,
    guard: bool = False,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    r"""Attention over the tiles of ``plan`` (see the module's docstring), with autograd.

    .. math::
        o_i = \sum_{j} \alpha_{ij} f_{ij} v_j, \qquad
        \alpha_{ij} = \operatorname{softmax}_j(\text{scale}\, q_i \cdot k_j + b_{ij})

    over the edges :math:`j \to i` of the plan's graph.

    Args:
        q (Tensor): ``[N, H, C]`` queries (finite, one dtype with ``k``, ``v``).
        k (Tensor): ``[M, H, C]`` keys.
        v (Tensor): ``[M, H, Cv]`` values.
        plan (TilePlan): the graph's :func:`~gnnattn.graphs.blocks.block_plan`.
        scale (float): multiplies :math:`q \cdot k`.
        bias (Tensor, optional): ``[|E|, H]`` added to the scores, in
            ``graph.edge_index`` order. (default: :obj:`None`)
        factor (Tensor, optional): ``[|E|, H]`` multiplies the weights
            (dropout's ``keep / (1 - p)``), in ``graph.edge_index`` order;
            ``lse`` and ``alpha`` are those before it. (default: :obj:`None`)
        need_alpha (bool, optional): also return the weights :math:`\alpha`,
            differentiable. (default: :obj:`False`)
        need_lse (bool, optional): also return the log-sum-exp,
            differentiable. (default: :obj:`False`)
        guard (bool, optional): ``bias`` may hold NaN or ``+inf``: zero the
            empty slots after the exponential. (default: :obj:`False`)

    Returns:
        ``out`` ``[N, H, Cv]``, ``lse`` ``[N, H]`` (``-inf`` for a target
        without edges) or ``None``, and ``alpha`` ``[|E|, H]`` or ``None``.

    Shapes:
        - **q, k, v:** ``[N, H, C]``, ``[M, H, C]``, ``[M, H, Cv]``
        - **output:** ``[N, H, Cv]``, ``[N, H]``, ``[|E|, H]``

    Example:
        >>> from gnnattn import AttentionGraph
        >>> from gnnattn.graphs import sliding_window_graph
        >>> from gnnattn.graphs.blocks import block_plan
        >>> g = AttentionGraph(sliding_window_graph(100, window=3))
        >>> q = k = v = torch.randn(100, 2, 8, dtype=torch.float64)
        >>> out, _, _ = tile_attention(q, k, v, block_plan(g, 32), 8**-0.5)
        >>> want = torch.softmax((q[:4, 0] @ k[:4, 0].T)[0] * 8**-0.5, 0) @ v[:4, 0]
        >>> torch.allclose(out[0, 0], want)
        True
    """
    if _flash_takes(plan, q, k, v, bias, factor, need_alpha, need_lse, guard):
        return (*_flash(q, k, v, plan, scale, bias, need_lse), None)
    out, lse, alpha = _TileAttention.apply(
        q, k, v, bias, factor, plan, scale, need_alpha, need_lse, guard
    )
    return out, (lse if need_lse else None), (alpha if need_alpha else None)
