r"""The peers gnnattn is measured against, written once for :mod:`gnnattn.compare` and
:mod:`gnnattn.bench`.

Each peer computes scaled dot-product attention (scale :math:`1/\sqrt{C}`, as
:class:`torch.nn.MultiheadAttention`) with the weights of a
:class:`~gnnattn.SelfAttentionConv` (its four projections ``lin_query``,
``lin_key``, ``lin_value``, ``lin_out``), so that its output can be compared
with the layer's and its time set beside it:

* :func:`mha`: :class:`torch.nn.MultiheadAttention` from
  :meth:`SelfAttentionConv.to_torch`, with a boolean mask for causal and
  window attention;
* :func:`sdpa`: :func:`torch.nn.functional.scaled_dot_product_attention` on
  ``[1, H, T, C]`` between the layer's projections (``is_causal`` for causal
  attention, a boolean mask for a window);
* :func:`flex`: FlexAttention with a block mask, where this torch has it
  (:class:`PeerUnavailable` otherwise). On the CPU it runs eagerly, without
  ``torch.compile``, which materializes the score matrix: a floor for "what a
  block mask buys without a compiler", not FlexAttention's best;
* :func:`transformer_conv`: PyG's ``TransformerConv`` (``heads=H,
  out_channels=C, concat=True, root_weight=False``) with the layer's query,
  key and value weights copied in and the layer's output projection after it;
* :func:`pyg_softmax`: PyG's ``torch_geometric.utils.softmax``, the peer of
  :func:`gnnattn.scatter_softmax`.

Masks follow the graph builders: target :math:`i` attends to source :math:`j`
iff :math:`j \le i` (causal), :math:`|i - j| \le w` (window) or
:math:`0 \le i - j \le w` (causal window).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from .nn import SelfAttentionConv

__all__ = [
    "PeerUnavailable",
    "dense_mask",
    "flex",
    "merge_heads",
    "mha",
    "pyg_softmax",
    "sdpa",
    "split_heads",
    "transformer_conv",
]


class PeerUnavailable(RuntimeError):
    """A peer that this installation cannot run (for example no FlexAttention in this torch)."""


def _device(layer: SelfAttentionConv) -> torch.device:
    return layer.lin_query.weight.device


def dense_mask(
    t: int,
    *,
    causal: bool = False,
    window: int | None = None,
    device: torch.device | str | None = None,
) -> Tensor | None:
    r"""The ``[T, T]`` boolean mask of a sequence's graph: ``mask[i, j]`` iff :math:`j \to i`.

    Args:
        t (int): sequence length :math:`T`.
        causal (bool, optional): keep :math:`j \le i` only. (default: :obj:`False`)
        window (int, optional): keep :math:`|i - j| \le w` only.
            (default: :obj:`None`)
        device (torch.device or str, optional): where to build it.
            (default: :obj:`None`, the CPU)

    Returns:
        The mask, or :obj:`None` for the complete graph (no mask needed).

    Example:
        >>> dense_mask(3, causal=True, window=1).int()
        tensor([[1, 0, 0],
                [1, 1, 0],
                [0, 1, 1]], dtype=torch.int32)
    """
    if not causal and window is None:
        return None
    i = torch.arange(t, device=device).view(-1, 1)
    j = torch.arange(t, device=device).view(1, -1)
    mask = torch.ones(t, t, dtype=torch.bool, device=device)
    if causal:
        mask &= j <= i
    if window is not None:
        mask &= (i - j).abs() <= window
    return mask


def split_heads(layer: SelfAttentionConv, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``q``, ``k``, ``v`` of ``x`` through the layer's projections, ``[N, H, C]`` each."""
    n, h, c = x.shape[0], layer.num_heads, layer.head_dim
    q = layer.lin_query(x).view(n, h, c)  # (N, H, C)
    k = layer.lin_key(x).view(n, h, c)  # (N, H, C)
    v = layer.lin_value(x).view(n, h, c)  # (N, H, C)
    return q, k, v


def merge_heads(layer: SelfAttentionConv, o: Tensor) -> Tensor:
    """The layer's output projection of the ``[N, H, C]`` attention result: ``[N, D]``."""
    return layer.lin_out(o.reshape(o.shape[0], layer.embed_dim))


def _projected(
    layer: SelfAttentionConv, attend: Callable[[Tensor, Tensor, Tensor], Tensor]
) -> Callable[[Tensor], Tensor]:
    """``x [T, D] -> [T, D]``: ``attend`` on ``[1, H, T, C]`` between the layer's projections."""

    def fn(x: Tensor) -> Tensor:
        q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in split_heads(layer, x))  # (1, H, T, C)
        o = attend(q, k, v)  # (1, H, T, C)
        return merge_heads(layer, o[0].transpose(0, 1))  # (T, D)

    return fn


def mha(
    layer: SelfAttentionConv,
    t: int,
    *,
    causal: bool = False,
    window: int | None = None,
    need_weights: bool = False,
) -> tuple[torch.nn.MultiheadAttention, Callable[[Tensor], tuple[Tensor, Tensor | None]]]:
    """:class:`torch.nn.MultiheadAttention` with the layer's weights, and a call on ``[T, D]``.

    Args:
        layer (SelfAttentionConv): the weights (without edge features).
        t (int): the sequence length the mask is made for.
        causal (bool, optional): causal mask. (default: :obj:`False`)
        window (int, optional): window mask. (default: :obj:`None`)
        need_weights (bool, optional): the call also returns the ``[H, T, T]``
            weights (otherwise ``None``, and MHA may take its fast path).
            (default: :obj:`False`)

    Returns:
        ``(module, fn)``: ``fn(x)`` is ``(out [T, D], weights or None)``.
    """
    module = layer.to_torch(batch_first=True).train(layer.training)
    allowed = dense_mask(t, causal=causal, window=window, device=_device(layer))
    # nn.MultiheadAttention's boolean mask is True where attention is NOT allowed;
    # is_causal is only a hint next to that mask.
    mask = None if allowed is None else ~allowed
    is_causal = causal and window is None

    def fn(x: Tensor) -> tuple[Tensor, Tensor | None]:
        xb = x.unsqueeze(0)  # (1, T, D)
        out, w = module(
            xb,
            xb,
            xb,
            attn_mask=mask,
            is_causal=is_causal,
            need_weights=need_weights,
            average_attn_weights=False,
        )
        return out[0], (w[0] if w is not None else None)

    return module, fn


def sdpa(
    layer: SelfAttentionConv, t: int, *, causal: bool = False, window: int | None = None
) -> Callable[[Tensor], Tensor]:
    """:func:`~torch.nn.functional.scaled_dot_product_attention` between the layer's projections.

    ``is_causal=True`` for causal attention, a boolean mask made for length
    ``t`` for a window. Returns ``fn(x [T, D]) -> [T, D]``.
    """
    # Complete: no mask; causal: is_causal (SDPA's own kernel); a window: its mask.
    mask = None
    if window is not None:
        mask = dense_mask(t, window=window, causal=causal, device=_device(layer))
    is_causal = causal and window is None

    def attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal)

    return _projected(layer, attend)


def flex(
    layer: SelfAttentionConv, t: int, *, causal: bool = False, window: int | None = None
) -> Callable[[Tensor], Tensor]:
    """FlexAttention with a block mask of length ``t`` between the layer's projections.

    Returns ``fn(x [T, D]) -> [T, D]``. Eager (no ``torch.compile``): on the
    CPU it has no backward (``NotImplementedError`` from the call).

    Raises:
        PeerUnavailable: this torch has no FlexAttention, or cannot make the
            block mask on this device.
    """
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError as err:
        raise PeerUnavailable(f"no FlexAttention in torch {torch.__version__} ({err})") from err

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        keep = q_idx >= kv_idx if causal else q_idx >= 0
        if window is not None:
            keep = keep & ((q_idx - kv_idx).abs() <= window)
        return keep

    device = _device(layer)
    try:
        block_mask = create_block_mask(mask_mod, None, None, t, t, device=str(device))
    except Exception as err:  # noqa: BLE001 - any failure means: not available here
        raise PeerUnavailable(f"no block mask on {device} ({type(err).__name__})") from err

    def attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        with warnings.catch_warnings():
            # Eager flex_attention warns that it is unfused: here it is a peer as it is.
            warnings.simplefilter("ignore", UserWarning)
            out = flex_attention(q, k, v, block_mask=block_mask)
        assert isinstance(out, Tensor)
        return out

    return _projected(layer, attend)


def transformer_conv(
    layer: SelfAttentionConv, edge_index: Tensor
) -> tuple[torch.nn.Module, Callable[[Tensor], Tensor]]:
    """PyG's ``TransformerConv`` with the layer's weights, then the layer's output projection.

    Args:
        layer (SelfAttentionConv): the weights (without edge features).
        edge_index (Tensor): ``[2, |E|]``, the graph of every call.

    Returns:
        ``(conv, fn)``: ``fn(x [N, D]) -> [N, D]``.
    """
    from torch_geometric.nn import TransformerConv

    h, c, d = layer.num_heads, layer.head_dim, layer.embed_dim
    w = layer.lin_query.weight
    conv = TransformerConv(
        d, c, heads=h, concat=True, root_weight=False, dropout=layer.dropout, bias=True
    ).to(device=w.device, dtype=w.dtype)
    with torch.no_grad():
        for name in ("lin_query", "lin_key", "lin_value"):
            ours, theirs = getattr(layer, name), getattr(conv, name)
            theirs.weight.copy_(ours.weight)
            if ours.bias is not None:
                theirs.bias.copy_(ours.bias)
            else:
                theirs.bias.zero_()
    conv.train(layer.training)

    def fn(x: Tensor) -> Tensor:
        return layer.lin_out(conv(x, edge_index))

    return conv, fn


def pyg_softmax(
    src: Tensor,
    index: Tensor | None = None,
    *,
    ptr: Tensor | None = None,
    num_nodes: int | None = None,
) -> Tensor:
    """PyG's ``torch_geometric.utils.softmax`` over ``index`` (or ``ptr``), along dim 0."""
    from torch_geometric.utils import softmax

    return softmax(src, index, ptr=ptr, num_nodes=num_nodes)
