r"""Dense matrix attention: the references the graph layers are checked against.

Both functions take a boolean ``mask`` in the graph convention of
:func:`gnnattn.edge_index_to_mask`: ``mask[i, j]`` is true iff target
:math:`i` attends to source :math:`j` (edge :math:`j \to i`). A row with no
true entry (a node without incoming edges) gives a zero attention result, as in
the graph layers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .nn import SelfAttentionConv

__all__ = ["dense_attention_weights", "dense_self_attention", "dense_simplified_attention"]


def _check_mask(mask: Tensor | None, n: int) -> None:
    if mask is None:
        return
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        raise TypeError(f"Expected 'mask' to be a bool Tensor, got {getattr(mask, 'dtype', mask)}")
    if mask.shape != (n, n):
        raise ValueError(f"Expected 'mask' of shape [{n}, {n}], got {list(mask.shape)}")


def _scores(q: Tensor, k: Tensor, scale: float, mask: Tensor | None) -> Tensor:
    s = torch.matmul(q, k.transpose(-1, -2)) * scale  # (..., N, N)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return s


def _softmax_rows(s: Tensor, mask: Tensor | None) -> Tensor:
    p = torch.softmax(s, dim=-1)
    if mask is not None:
        # A fully masked row is all -inf: softmax gives NaN there, the graph
        # layers give zeros.
        p = torch.where(mask.any(-1, keepdim=True), p, torch.zeros_like(p))
    return p


def dense_simplified_attention(
    x: Tensor, mask: Tensor | None = None, *, scale: float = 1.0, return_weights: bool = False
) -> Tensor | tuple[Tensor, Tensor]:
    r"""Dense simplified attention :math:`Z = \operatorname{softmax}(s X X^\top) X`, row-wise.

    Args:
        x (Tensor): ``[N, d]`` token embeddings.
        mask (Tensor, optional): ``[N, N]`` bool, ``mask[i, j]`` = token
            :math:`i` attends to :math:`j`. (default: :obj:`None`, all true)
        scale (float, optional): multiplies the dot products. (default: ``1.0``)
        return_weights (bool, optional): also return the ``[N, N]`` matrix.
            (default: :obj:`False`)

    Example:
        >>> x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
        >>> dense_simplified_attention(x, return_weights=True)[1][0]
        tensor([0.4223, 0.1554, 0.4223])
    """
    if not isinstance(x, Tensor) or x.dim() != 2:
        raise ValueError(f"Expected 'x' of shape [N, d], got {list(getattr(x, 'shape', []))}")
    _check_mask(mask, x.shape[0])
    p = _softmax_rows(_scores(x, x, scale, mask), mask)  # (N, N)
    z = p @ x
    return (z, p) if return_weights else z


def dense_attention_weights(
    layer: SelfAttentionConv, x: Tensor, mask: Tensor | None = None
) -> Tensor:
    """The ``[H, N, N]`` attention matrices of ``layer`` on ``x`` (row = target)."""
    n = x.shape[0]
    h, c = layer.num_heads, layer.head_dim
    _check_mask(mask, n)
    q = layer.lin_query(x).view(n, h, c).transpose(0, 1)  # (H, N, C)
    k = layer.lin_key(x).view(n, h, c).transpose(0, 1)  # (H, N, C)
    return _softmax_rows(_scores(q, k, layer.scale, mask), mask)


def dense_self_attention(
    layer: SelfAttentionConv, x: Tensor, mask: Tensor | None = None, *, is_causal: bool = False
) -> Tensor:
    r"""``layer``'s operator computed densely with masked SDPA and the layer's own weights.

    .. math::
        O = W_O \Big\Vert_h \operatorname{softmax}\!\left(\frac{Q^h {K^h}^\top}{\sqrt{C}}
            + \log M\right) V^h

    Args:
        layer (SelfAttentionConv): whose projections are used (dropout is not
            applied: this is the evaluation-mode operator).
        x (Tensor): ``[N, D]``.
        mask (Tensor, optional): ``[N, N]`` bool, ``mask[i, j]`` = edge
            :math:`j \to i`. (default: :obj:`None`)
        is_causal (bool, optional): lower-triangular mask (SDPA's
            ``is_causal``). (default: :obj:`False`)

    Shapes:
        - **x:** ``[N, D]``; **output:** ``[N, D]``
    """
    if not isinstance(layer, SelfAttentionConv):
        raise TypeError(f"Expected 'layer' to be a SelfAttentionConv, got {type(layer).__name__}")
    if not isinstance(x, Tensor) or x.dim() != 2 or x.shape[1] != layer.embed_dim:
        raise ValueError(
            f"Expected 'x' of shape [N, {layer.embed_dim}], got {list(getattr(x, 'shape', []))}"
        )
    n = x.shape[0]
    h, c = layer.num_heads, layer.head_dim
    _check_mask(mask, n)
    q = layer.lin_query(x).view(n, h, c).transpose(0, 1)  # (H, N, C)
    k = layer.lin_key(x).view(n, h, c).transpose(0, 1)  # (H, N, C)
    v = layer.lin_value(x).view(n, h, c).transpose(0, 1)  # (H, N, C)
    if mask is None:
        o = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=layer.scale)
    else:
        if is_causal:
            mask = mask & torch.ones_like(mask).tril()
        has_any = mask.any(-1, keepdim=True)  # (N, 1)
        # Give empty rows something to attend to (SDPA would return NaN and
        # NaN gradients), then zero their result.
        safe = mask | ~has_any
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=safe, scale=layer.scale)
        o = torch.where(has_any, o, torch.zeros_like(o))
    return layer.lin_out(o.transpose(0, 1).reshape(n, h * c))  # (N, D)
