"""What both passes check and prepare before a launch.

Two kinds of host code: the plans made in a call (:func:`_plan_now`), which
read tensors, and the checks of given plans and inputs (``_check_*``) and the
launch scalars (:func:`_scales`), which read nothing but metadata and Python
numbers, so the launchers (``forward._fwd``, ``backward._bwd``) never wait for
the GPU.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..chunks import DEFAULT_CHUNK, TritonPlan, plan
from ..common import Dropout
from ._tiles import _block_e, _tile


def _plan_now(
    ptr: Tensor,
    col: Tensor,
    num_cols: int,
    shape: tuple[int, int, int],
    block_e: int | None,
    split_blocks: int | None,
) -> TritonPlan:
    """A plan made in the call (checks included: host synchronisations).

    The chunk is ``block_e * split_blocks`` when ``split_blocks`` is given,
    else :data:`~gnnattn.kernels.chunks.DEFAULT_CHUNK`.
    """
    chunk = DEFAULT_CHUNK
    if split_blocks is not None:
        if split_blocks < 1:
            raise ValueError(f"Expected 'split_blocks' >= 1, got {split_blocks}")
        if block_e is None:
            block_e = _block_e(col.numel(), ptr.numel() - 1, _tile(*shape)[3], None)
        chunk = block_e * split_blocks
    return plan(ptr, col, num_cols, chunk=chunk)


def _check_plan(
    pl: object,
    name: str,
    rows: int,
    edges: int,
    cols: int,
    device: torch.device,
    split_blocks: int | None,
) -> TritonPlan:
    """A given plan fits the call (metadata only: no host synchronisation)."""
    if not isinstance(pl, TritonPlan):
        raise TypeError(f"Expected '{name}' from gnnattn.kernels.triton_attention.plan, got {pl!r}")
    if (pl.num_rows, pl.num_edges, pl.num_cols) != (rows, edges, cols):
        raise ValueError(
            f"Expected '{name}' of a CSR with {rows} rows, {edges} edges and ids below {cols}, "
            f"got {pl.num_rows}, {pl.num_edges} and {pl.num_cols}"
        )
    if pl.ptr.device != device:
        raise ValueError(f"Expected '{name}' on {device}, got {pl.ptr.device}")
    if split_blocks is not None:
        raise ValueError(f"Expected 'split_blocks' or '{name}', not both: the plan fixes the chunk")
    return pl


def _check_inputs(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    ptr: Tensor,
    col: Tensor,
    bias: Tensor | None,
    dropout: Dropout | None,
) -> None:
    """Shapes, dtypes, devices and the dropout key: metadata and Python numbers only.

    The shapes of ``q``, ``k``, ``v`` are asserted, not raised on:
    :func:`gnnattn.attention` validates a call, once.
    """
    assert q.dim() == 3 and k.dim() == 3 and v.dim() == 3, (q.shape, k.shape, v.shape)
    assert k.shape[:2] == v.shape[:2] and q.shape[1:] == k.shape[1:], (q.shape, k.shape, v.shape)
    for name, t in (("k", k), ("v", v), ("ptr", ptr), ("col", col), ("bias", bias)):
        if t is not None and t.device != q.device:
            raise ValueError(f"Expected '{name}' on the device of 'q' ({q.device}), got {t.device}")
    if ptr.dtype != torch.int64 or col.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"Expected 'ptr' int64 and 'col' int32/int64, got {ptr.dtype}, {col.dtype}")
    if ptr.dim() != 1 or ptr.numel() != q.shape[0] + 1:
        raise ValueError(f"Expected 'ptr' of shape [{q.shape[0] + 1}], got {list(ptr.shape)}")
    if col.dim() != 1:
        raise ValueError(f"Expected 'col' of shape [E], got {list(col.shape)}")
    e, h = col.numel(), q.shape[1]
    if bias is not None and tuple(bias.shape) != (e, h):
        raise ValueError(f"Expected 'bias' of shape [{e}, {h}], got {list(bias.shape)}")
    if dropout is not None:
        if not isinstance(dropout, Dropout):
            raise TypeError(f"Expected 'dropout' a gnnattn.kernels.common.Dropout, got {dropout!r}")
        if not (0 <= dropout.p < 1 and 0 <= dropout.seed < 2**63 and 0 <= dropout.offset < 2**31):
            raise ValueError(
                f"Expected 'dropout' with p in [0, 1), seed in [0, 2**63), offset in "
                f"[0, 2**31), got {dropout}"
            )


def _check_edge(
    q: Tensor,
    e: int,
    edge_attr: Tensor | None,
    edge_query: Tensor | None,
    grad_edge_out: Tensor | None = None,
    edge_out: Tensor | None = None,
) -> None:
    """The edge-feature options: ``edge_attr`` ``[E, F]``, ``edge_query`` and the
    backward's ``grad_edge_out`` / ``edge_out`` ``[N, H, F]`` (metadata only)."""
    if edge_attr is None:
        for name, t in (
            ("edge_query", edge_query),
            ("grad_edge_out", grad_edge_out),
            ("edge_out", edge_out),
        ):
            if t is not None:
                raise ValueError(f"Expected 'edge_attr' with '{name}', got None")
        return
    if not isinstance(edge_attr, Tensor) or not edge_attr.is_floating_point():
        raise TypeError(f"Expected 'edge_attr' a floating-point tensor, got {edge_attr!r:.80}")
    if edge_attr.dim() != 2 or edge_attr.shape[0] != e:
        raise ValueError(f"Expected 'edge_attr' of shape [{e}, F], got {list(edge_attr.shape)}")
    rows = (q.shape[0], q.shape[1], edge_attr.shape[1])
    named = (("edge_query", edge_query), ("grad_edge_out", grad_edge_out), ("edge_out", edge_out))
    for name, t in (("edge_attr", edge_attr), *named):
        if t is None:
            continue
        if not t.is_floating_point():
            raise TypeError(f"Expected '{name}' a floating-point tensor, got {t.dtype}")
        if t.device != q.device:
            raise ValueError(f"Expected '{name}' on the device of 'q' ({q.device}), got {t.device}")
        if name != "edge_attr" and tuple(t.shape) != rows:
            raise ValueError(f"Expected '{name}' of shape {list(rows)}, got {list(t.shape)}")


def _check_csc(
    csc: tuple[Tensor, Tensor, Tensor], m: int, e: int, device: torch.device
) -> tuple[Tensor, Tensor, Tensor]:
    """The transposed CSR's shapes, dtypes and devices (metadata only)."""
    tptr, trow, tperm = csc
    if tptr.shape != (m + 1,) or trow.shape != (e,) or tperm.shape != (e,):
        raise ValueError(
            f"Expected 'csc' = transpose_csr(ptr, col, {m}), got shapes "
            f"{[list(t.shape) for t in csc]}"
        )
    for t in csc:
        if t.device != device or t.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"Expected 'csc' int32/int64 on {device}, got {t.dtype} on {t.device}")
    return tptr, trow, tperm.contiguous()


def _scales(
    scale: float, dropout: Dropout | None, dtype: torch.dtype, device: torch.device
) -> Tensor:
    """``[scale, 1 / (1 - p)]`` on the device, by two fills (a copy from the host
    would synchronise)."""
    t = torch.full((2,), scale, dtype=dtype, device=device)
    t[1:].fill_(dropout.scale if dropout is not None else 1.0)
    return t
