r"""Ring attention: a complete or causal sequence split over ranks, never materialised.

A sequence of :math:`T` tokens attending to all of them (or, causally, to those
before it) is a graph with :math:`T^2` (or :math:`T(T+1)/2`) edges, too many to
build as CSR when :math:`T` is large. Here every rank holds a set of tokens
(:func:`sequence_shard`: one contiguous block, or two mirrored chunks of
:math:`2P` so that causal work is balanced) and their queries, keys and values.
The key/value blocks travel round a ring of :math:`P` ranks; at each step a
rank attends its queries to the block it holds (a dense block: two GEMMs) and
merges the block's result into its own with their log-sum-exps:

.. math::
    \ell = \log\!\big(e^{\ell_a} + e^{\ell_b}\big), \qquad
    o = e^{\ell_a - \ell}\, o_a + e^{\ell_b - \ell}\, o_b

The backward pass goes round the ring again (flash-attention's:
:math:`D_i = \sum_c dO_{ic} O_{ic}`, :math:`dS = P \circ (dP - D)`), the
gradients of each key/value block travelling with the block and ending at its
owner. Memory is :math:`O(T_\text{local} \cdot T_\text{block})` per rank.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
import torch.distributed as dist
from torch import Tensor

from ..checks import check_choice, check_float, check_int, check_probability, check_tensor
from ..kernels.common import acc_dtype
from ..ops import AttentionOutput

if TYPE_CHECKING:  # a torch built without distributed support still imports gnnattn
    from torch.distributed import ProcessGroup

__all__ = ["SequencePart", "ring_attention", "sequence_shard"]

LAYOUTS = ("contiguous", "zigzag")
# The dtypes a rank can announce to the others (its index travels as an int).
_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _rank_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    if (rank is None) != (world_size is None):
        raise ValueError(
            f"Expected 'rank' and 'world_size' both given or both None, got rank={rank} "
            f"and world_size={world_size}"
        )
    if rank is None or world_size is None:
        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError(
                "Expected 'rank' and 'world_size', or torch.distributed initialised "
                "(dist.init_process_group) to read them from, got neither"
            )
        return dist.get_rank(), dist.get_world_size()
    check_int(world_size, "world_size", min=1)
    check_int(rank, "rank")
    if rank >= world_size:
        raise ValueError(f"Expected 'rank' in [0, {world_size}) (world_size), got {rank}")
    return rank, world_size


def sequence_shard(
    num_tokens: int,
    *,
    layout: str = "contiguous",
    rank: int | None = None,
    world_size: int | None = None,
) -> Tensor:
    r"""The global ids of the tokens that rank ``rank`` of ``world_size`` holds, ascending.

    ``"contiguous"`` gives rank :math:`r` the :math:`r`-th of :math:`P` blocks;
    ``"zigzag"`` cuts the sequence into :math:`2P` chunks and gives rank
    :math:`r` chunks :math:`r` and :math:`2P - 1 - r`, so that under a causal
    mask every rank has the same work:

    .. math::
        |\{(i, j) : j \le i,\ i \in \text{rank } r\}| \approx \frac{T^2}{2P}

    Blocks differ by at most one token when :math:`P` (or :math:`2P`) does not
    divide :math:`T`, and a rank holds no token when :math:`T` is too small.

    Args:
        num_tokens (int): :math:`T`, the length of the whole sequence.
        layout (str, optional): ``"contiguous"`` or ``"zigzag"``.
            (default: ``"contiguous"``)
        rank (int, optional): which rank; with ``world_size``, or both
            :obj:`None` to read them from the default process group.
            (default: :obj:`None`)
        world_size (int, optional): :math:`P`. (default: :obj:`None`)

    Shapes:
        - **output:** ``[T_local]`` int64

    Example:
        >>> sequence_shard(10, rank=1, world_size=3)
        tensor([4, 5, 6])
        >>> sequence_shard(10, layout="zigzag", rank=0, world_size=2)
        tensor([0, 1, 2, 8, 9])
    """
    check_int(num_tokens, "num_tokens")
    check_choice(layout, "layout", LAYOUTS)
    rank, world_size = _rank_world(rank, world_size)
    ids = torch.arange(num_tokens)
    if layout == "contiguous":
        return ids.tensor_split(world_size)[rank].clone()
    chunks = ids.tensor_split(2 * world_size)  # 2P chunks; rank r: r and its mirror 2P-1-r
    return torch.cat([chunks[rank], chunks[2 * world_size - 1 - rank]])


class _Ring(NamedTuple):
    """What one call needs to know about the ring (built per call, kept by autograd)."""

    group: ProcessGroup | None  # None: the default group
    rank: int
    world: int
    nxt: int  # global rank blocks are sent to
    prev: int  # global rank blocks come from
    ids: tuple[Tensor, ...]  # every rank's token ids (CPU, ascending)
    causal: bool
    scale: float


def _peer(group: ProcessGroup | None, group_rank: int) -> int:
    # Point-to-point calls name peers by their global rank, even inside a group.
    return group_rank if group is None else dist.get_global_rank(group, group_rank)


def _make_ring(
    q: Tensor, v: Tensor, causal: bool, scale: float, layout: str, group: ProcessGroup | None
) -> _Ring:
    """Check, with one all-gather, that every rank holds its shard with the same
    heads, widths, dtype, mask and layout (so that no rank waits for a message of
    the wrong size, and no rank computes another sequence than the others)."""
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(
            "ring_attention needs torch.distributed initialised (dist.init_process_group), "
            "got no process group"
        )
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if rank < 0:
        raise ValueError("Expected this process to be a member of 'group', got a group without it")
    n, h, c = q.shape
    meta = [n, h, c, v.shape[2], _DTYPES.index(q.dtype), int(causal), LAYOUTS.index(layout)]
    metas = [torch.tensor(meta, device=q.device) for _ in range(world)]
    dist.all_gather(metas, metas[rank].clone(), group=group)
    table = torch.stack(metas).tolist()  # [P, 7]: what every rank called with
    if any(row[1:] != table[rank][1:] for row in table):
        raise ValueError(
            f"Expected 'q', 'k', 'v' with the same heads, widths and dtype, and the same "
            f"'causal' and 'layout', on every rank, got [rows, H, C, Cv, dtype index, causal, "
            f"layout index] = {table}"
        )
    sizes = [row[0] for row in table]
    ids = tuple(
        sequence_shard(sum(sizes), layout=layout, rank=r, world_size=world) for r in range(world)
    )
    if [len(t) for t in ids] != sizes:
        raise ValueError(
            f"Expected each rank's 'q' to hold its sequence_shard(T={sum(sizes)}, "
            f"layout={layout!r}) rows, {[len(t) for t in ids]} per rank, got {sizes}"
        )
    return _Ring(
        group,
        rank,
        world,
        _peer(group, (rank + 1) % world),
        _peer(group, (rank - 1) % world),
        ids,
        causal,
        scale,
    )


def _shift(send: Tensor, recv_rows: int, ring: _Ring) -> tuple[list[Any], Tensor]:
    """Post the send of ``send`` to the next rank and the receive of the previous
    rank's ``recv_rows`` rows; returns the requests to wait on and the buffer."""
    if ring.world == 1:
        return [], send
    recv = send.new_empty((recv_rows, *send.shape[1:]))
    ops = []
    # An empty block is not sent at all: both ends know its size from the shards.
    if send.shape[0]:
        ops.append(dist.P2POp(dist.isend, send.contiguous(), ring.nxt, ring.group))
    if recv_rows:
        ops.append(dist.P2POp(dist.irecv, recv, ring.prev, ring.group))
    return (dist.batch_isend_irecv(ops) if ops else []), recv


def _wait(works: list[Any]) -> None:
    for work in works:
        work.wait()


def _block(ring: _Ring, ids_q: Tensor, ids_k: Tensor) -> tuple[int, int, Tensor | None] | None:
    """Which queries ``[r0:]`` see which keys ``[:c1]`` of a block, and the mask
    of the pairs among them (``None``: all); ``None`` when no pair is visible."""
    n, m = len(ids_q), len(ids_k)
    if n == 0 or m == 0:
        return None
    if not ring.causal:
        return 0, m, None
    # Ids ascend on every rank, so the queries that see any key of the block are
    # a suffix and the keys that any query sees a prefix: a zig-zag rank skips
    # the half of a block that is in its future instead of masking it.
    r0 = int(torch.searchsorted(ids_q, ids_k[:1]))
    c1 = int(torch.searchsorted(ids_k, ids_q[-1:], right=True))
    if r0 == n or c1 == 0:
        return None
    if ids_k[c1 - 1] <= ids_q[r0]:
        return r0, c1, None  # the whole rectangle is in the past
    return r0, c1, ids_q[r0:, None] >= ids_k[None, :c1]


def _finite_or_zero(lse: Tensor) -> Tensor:
    # A row without a visible key has lse = -inf; exp(s - 0) = 0 then, not NaN.
    return lse.masked_fill(lse == -math.inf, 0.0)


def _matmul(w: Tensor, x: Tensor, mask: Tensor | None) -> Tensor:
    """``sum_j w[h, i, j] x[j, h, :]`` over the pairs of ``mask``: ``[H, a, b]`` x
    ``[b, H, c]`` -> ``[a, H, c]``."""
    y = torch.matmul(w, x.transpose(0, 1))  # [H, a, c]
    if mask is not None:
        bad = ~torch.isfinite(x).flatten(1).all(1)  # [b]: rows holding inf or NaN
        if bool(bad.any()):
            # 0 * NaN is NaN: a masked pair would carry a non-finite row to a
            # target without an edge to it, so those rows are added apart, masked.
            y = torch.matmul(w, x.masked_fill(bad[:, None, None], 0.0).transpose(0, 1))
            j = bad.nonzero().squeeze(1)
            terms = w[:, :, j, None] * x[j].transpose(0, 1)[:, None]  # [H, a, |j|, c]
            y = y + terms.masked_fill(~mask[None, :, j, None], 0.0).sum(2)
    return y.transpose(0, 1)


def _scores(q: Tensor, k: Tensor, mask: Tensor | None, scale: float) -> Tensor:
    s = torch.matmul(q.transpose(0, 1), k.permute(1, 2, 0)) * scale  # [H, n, m]
    return s if mask is None else s.masked_fill(~mask, -math.inf)


def _merge(out: Tensor, lse: Tensor, o_b: Tensor, lse_b: Tensor) -> None:
    """Fold a block's normalised result ``o_b`` ``[n, H, Cv]`` (log-sum-exp
    ``lse_b`` ``[n, H]``) into ``out`` and ``lse``, in place."""
    new = torch.logaddexp(lse, lse_b)
    safe = _finite_or_zero(new)
    out.mul_(torch.exp(lse - safe)[..., None]).add_(o_b * torch.exp(lse_b - safe)[..., None])
    lse.copy_(new)


def _ring_forward(q: Tensor, k: Tensor, v: Tensor, ring: _Ring) -> tuple[Tensor, Tensor]:
    acc = acc_dtype(q.dtype)
    n, h, c = q.shape
    out = q.new_zeros((n, h, v.shape[2]), dtype=acc)
    lse = q.new_full((n, h), -math.inf, dtype=acc)
    qa = q.to(acc)
    kv = torch.cat([k, v], dim=-1)  # [m, H, C + Cv]: one message per step
    for step in range(ring.world):
        src = (ring.rank - step) % ring.world
        works: list[Any] = []
        nxt = kv
        if step < ring.world - 1:  # the next block travels while this one is used
            works, nxt = _shift(kv, len(ring.ids[(src - 1) % ring.world]), ring)
        blk = _block(ring, ring.ids[ring.rank], ring.ids[src])
        if blk is not None:
            r0, c1, mask = blk
            mask = None if mask is None else mask.to(q.device)
            kb, vb = kv[:c1, :, :c].to(acc), kv[:c1, :, c:].to(acc)
            s = _scores(qa[r0:], kb, mask, ring.scale)
            lse_b = torch.logsumexp(s, dim=-1)  # [H, n']
            p = torch.exp(s - _finite_or_zero(lse_b)[..., None])
            _merge(out[r0:], lse[r0:], _matmul(p, vb, mask), lse_b.T)
        _wait(works)
        kv = nxt
    return out.to(q.dtype), lse


def _block_backward(
    q: Tensor,
    kv: Tensor,
    dkv: Tensor,
    dout: Tensor,
    d: Tensor,
    lse: Tensor,
    dq: Tensor,
    mask: Tensor | None,
    scale: float,
) -> None:
    """Add one block's gradients to ``dq`` and ``dkv`` (both accumulators, in place)."""
    c = q.shape[2]
    k, v = kv[..., :c].to(dq.dtype), kv[..., c:].to(dq.dtype)
    p = torch.exp(_scores(q, k, mask, scale) - _finite_or_zero(lse).T[..., None])  # [H, n, m]
    dp = torch.matmul(dout.transpose(0, 1), v.permute(1, 2, 0))  # [H, n, m]
    ds = p * (dp - d.T[..., None])
    if mask is not None:
        ds = ds.masked_fill(~mask, 0.0)  # a masked pair's 0 * (non-finite dP) stays out
    mask_t = None if mask is None else mask.T
    dq.add_(_matmul(ds, k, mask), alpha=scale)
    dkv[..., :c].add_(_matmul(ds.transpose(1, 2), q, mask_t), alpha=scale)
    dkv[..., c:].add_(_matmul(p.transpose(1, 2), dout, mask_t))


def _ring_backward(
    saved: tuple[Tensor, ...], dout: Tensor, dlse: Tensor | None, ring: _Ring
) -> tuple[Tensor, Tensor, Tensor]:
    q, k, v, out, lse = saved
    acc = lse.dtype
    c = k.shape[2]
    dout = dout.to(acc)
    d = (dout * out.to(acc)).sum(-1)  # [n, H]: flash-attention's D = rowsum(dO * O)
    if dlse is not None:
        d = d - dlse  # d lse_i / d s_ij = P_ij, so a gradient of lse enters as -D
    qa = q.to(acc)
    dq = torch.zeros_like(qa)
    kv = torch.cat([k, v], dim=-1)  # [m, H, C + Cv]
    dkv = kv.new_zeros(kv.shape, dtype=acc)  # travels with its block, back to its owner
    for step in range(ring.world):
        src = (ring.rank - step) % ring.world
        rows = len(ring.ids[(src - 1) % ring.world])
        works: list[Any] = []
        nxt = kv
        if step < ring.world - 1:
            works, nxt = _shift(kv, rows, ring)
        blk = _block(ring, ring.ids[ring.rank], ring.ids[src])
        if blk is not None:
            r0, c1, mask = blk
            mask = None if mask is None else mask.to(q.device)
            _block_backward(
                qa[r0:], kv[:c1], dkv[:c1], dout[r0:], d[r0:], lse[r0:], dq[r0:], mask, ring.scale
            )
        _wait(works)
        kv = nxt
        # This block's sums go on with it; after the last step (P shifts) every
        # block's sums are back at their owner.
        works, dkv = _shift(dkv, rows, ring)
        _wait(works)
    dk, dv = dkv.split([c, dkv.shape[2] - c], dim=-1)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class _RingAttention(torch.autograd.Function):
    """Autograd function of the ring: saves the inputs, the output and the lse."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, ring: _Ring):  # type: ignore[override]
        out, lse = _ring_forward(q, k, v, ring)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring = ring
        return out, lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout: Tensor, dlse: Tensor | None):  # type: ignore[override]
        dq, dk, dv = _ring_backward(ctx.saved_tensors, dout, dlse, ctx.ring)
        return dq, dk, dv, None


def _check_qkv(q: Any, k: Any, v: Any) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(t, name)
        if t.dim() != 3:
            raise ValueError(f"Expected '{name}' of shape [T_local, H, C], got {list(t.shape)}")
        if t.dtype not in _DTYPES:
            raise TypeError(f"Expected '{name}' of dtype in {_DTYPES}, got {t.dtype}")
        if t.device != q.device or t.dtype != q.dtype:
            raise ValueError(
                f"Expected 'q', 'k', 'v' of one device and dtype, got {q.device}/{q.dtype} "
                f"and {t.device}/{t.dtype} for '{name}'"
            )
    if q.shape != k.shape or k.shape[:2] != v.shape[:2]:
        raise ValueError(
            f"Expected 'q' and 'k' [T_local, H, C] and 'v' [T_local, H, Cv] (this rank's "
            f"tokens), got {list(q.shape)}, {list(k.shape)} and {list(v.shape)}"
        )


def ring_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
    layout: str = "contiguous",
    group: ProcessGroup | None = None,
    return_lse: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    r"""Attention over a whole sequence whose tokens are spread over the ranks of ``group``.

    Each rank passes the queries, keys and values of its own tokens (those of
    :func:`sequence_shard` with the same ``layout``, in that order) and gets
    their rows of

    .. math::
        O = \operatorname{softmax}\!\big(\text{scale}\; Q K^\top + \log M\big)\, V

    with :math:`M` all ones (complete) or lower-triangular (``causal``), as if
    one process held the :math:`T` tokens. Every rank of ``group`` must call it
    (and the backward pass) together; the graph is never built.

    Args:
        q (Tensor): ``[T_local, H, C]`` this rank's queries.
        k (Tensor): ``[T_local, H, C]`` its keys.
        v (Tensor): ``[T_local, H, Cv]`` its values.
        causal (bool, optional): token :math:`i` sees :math:`j \le i` only.
            (default: :obj:`False`)
        scale (float, optional): multiplies :math:`q \cdot k`; default
            :math:`1/\sqrt{C}`. (default: :obj:`None`)
        layout (str, optional): how tokens are spread, as in
            :func:`sequence_shard`. (default: ``"contiguous"``)
        group (ProcessGroup, optional): the ranks of the ring. (default:
            :obj:`None`, the default group)
        return_lse (bool, optional): also return the log-sum-exp of each
            query's scores (differentiable). (default: :obj:`False`)

    Returns:
        ``out``, or ``(out, lse)`` with ``return_lse``.

    Shapes:
        - **q, k, v:** ``[T_local, H, C]``, ``[T_local, H, C]``, ``[T_local, H, Cv]``
        - **output:** ``[T_local, H, Cv]``; lse ``[T_local, H]``

    Example:
        >>> ids = sequence_shard(1000, layout="zigzag")  # doctest: +SKIP
        >>> q, k, v = q_all[ids], k_all[ids], v_all[ids]  # doctest: +SKIP
        >>> out = ring_attention(q, k, v, causal=True, layout="zigzag")  # doctest: +SKIP
    """
    _check_qkv(q, k, v)
    if not isinstance(causal, bool):
        raise TypeError(f"Expected 'causal' to be a bool, got {type(causal).__name__}")
    check_choice(layout, "layout", LAYOUTS)
    scale = 1.0 / math.sqrt(q.shape[2]) if scale is None else check_float(scale, "scale")
    ring = _make_ring(q, v, causal, scale, layout, group)
    out, lse = _RingAttention.apply(q, k, v, ring)
    return (out, lse) if return_lse else out


def _refuse(option: str, value: Any, why: str) -> None:
    raise ValueError(f"SequencePart.attention does not support '{option}' (got {value!r}): {why}")


_NO_EDGES = "per-edge tensors do not exist on a complete or causal graph that is never built"


class SequencePart:
    r"""What one rank holds of a complete or causal sequence of ``num_tokens`` tokens.

    The part of a sequence-parallel model: a layer called with this rank's
    rows calls :meth:`attention` instead of :func:`gnnattn.attention`, and the
    ranks compute, by :func:`ring_attention`,

    .. math::
        o_i = \sum_{j \in N(i)} \operatorname{softmax}_j(\text{scale}\; q_i \cdot k_j)\, v_j,
        \qquad N(i) = \{0..T-1\} \text{ or } \{j \le i\}

    for the tokens :attr:`tokens` they hold, without building the graph.

    Args:
        num_tokens (int): :math:`T`.
        causal (bool, optional): token :math:`i` sees :math:`j \le i` only.
            (default: :obj:`False`)
        layout (str, optional): ``"contiguous"`` or ``"zigzag"`` (balanced
            when causal), see :func:`sequence_shard`. (default: ``"contiguous"``)
        group (ProcessGroup, optional): the ranks sharing the sequence; this
            rank's rank and the world size are read from it. (default:
            :obj:`None`, the default group)

    Attributes:
        tokens (Tensor): ``[T_local]`` the global ids held, ascending.
        num_tokens, causal, layout, group, rank, world_size: as given or read.

    Shapes:
        - **shard:** ``[T, ...]`` -> ``[T_local, ...]``
        - **attention:** ``q, k, v`` ``[T_local, H, C / C / Cv]`` -> ``[T_local, H, Cv]``

    Example:
        >>> part = SequencePart(4096, causal=True, layout="zigzag")  # doctest: +SKIP
        >>> out = part.attention(part.shard(q), part.shard(k), part.shard(v))  # doctest: +SKIP
    """

    def __init__(
        self,
        num_tokens: int,
        *,
        causal: bool = False,
        layout: str = "contiguous",
        group: ProcessGroup | None = None,
    ) -> None:
        check_int(num_tokens, "num_tokens")
        if not isinstance(causal, bool):
            raise TypeError(f"Expected 'causal' to be a bool, got {type(causal).__name__}")
        check_choice(layout, "layout", LAYOUTS)
        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError(
                "SequencePart needs torch.distributed initialised (dist.init_process_group), "
                "got no process group"
            )
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        if rank < 0:
            raise ValueError("Expected this process to be a member of 'group', got one without it")
        self.num_tokens, self.causal, self.layout, self.group = num_tokens, causal, layout, group
        self.rank, self.world_size = rank, world
        self.tokens = sequence_shard(num_tokens, layout=layout, rank=rank, world_size=world)

    def __repr__(self) -> str:
        return (
            f"SequencePart({self.num_tokens}, causal={self.causal}, layout={self.layout!r}, "
            f"rank={self.rank}, world_size={self.world_size})"
        )

    def shard(self, x: Tensor) -> Tensor:
        """The rows of a whole-sequence tensor ``x`` ``[T, ...]`` that this rank holds."""
        check_tensor(x, "x")
        if x.dim() == 0 or x.shape[0] != self.num_tokens:
            raise ValueError(
                f"Expected 'x' of shape [{self.num_tokens}, ...] (the whole sequence), "
                f"got {list(x.shape)}"
            )
        return x[self.tokens.to(x.device)]

    @property
    def num_edges(self) -> int:
        """Edges of the whole sequence's graph (never built): T^2, or T(T+1)/2 causal."""
        t = self.num_tokens
        return t * (t + 1) // 2 if self.causal else t * t

    @property
    def edge_index(self) -> Tensor:
        """Not available: the graph of a ring is never built."""
        raise ValueError(
            "Expected a graph with edges for attention weights, got a SequencePart (its "
            "complete or causal graph is never built)"
        )

    def select_edges(self, edge_attr: Tensor, name: str = "edge_attr") -> Tensor:
        """Refuses per-edge features: the graph of a ring is never built (the layers' hook)."""
        raise ValueError(
            f"Expected no '{name}' with a SequencePart: per-edge tensors do not exist on a "
            f"complete or causal graph that is never built"
        )

    def attention(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        scale: float | None = None,
        score_bias: Tensor | None = None,
        dropout_p: float = 0.0,
        backend: str = "auto",
        need_weights: bool = False,
        return_lse: bool = False,
        edge_attr: Tensor | None = None,
        edge_key: Tensor | None = None,
        edge_value: Tensor | None = None,
    ) -> Tensor | AttentionOutput:
        """:func:`gnnattn.attention`'s signature on this rank's rows (backend ``"ring"``).

        Every rank of the group calls it together (and the backward pass).
        The per-edge options (``score_bias``, ``edge_attr``, ``edge_key``,
        ``edge_value``), a dropout in (0, 1) and ``need_weights`` raise a
        ``ValueError``; ``backend`` is ``"auto"`` or ``"ring"`` (the blocks are
        dense matmuls whatever the backend, so naming another one is an error).

        Returns:
            ``out`` ``[T_local, H, Cv]``, or ``AttentionOutput(out, lse, None, "ring")``
            with ``return_lse``.
        """
        edges = {"score_bias": score_bias, "edge_attr": edge_attr}
        edges.update(edge_key=edge_key, edge_value=edge_value)
        for option, value in edges.items():
            if value is not None:
                _refuse(option, type(value).__name__, _NO_EDGES)
        # p = 1 drops every weight (as F.dropout and gnnattn.attention): no mask to draw.
        drop_all = check_probability(dropout_p, "dropout_p") == 1.0
        if 0.0 < dropout_p < 1.0:
            _refuse("dropout_p", dropout_p, "the ring has no attention dropout; use 0.0")
        if need_weights:
            _refuse("need_weights", need_weights, "the ring never holds the [T, T] weights")
        check_choice(backend, "backend", ("auto", "ring"), " (a SequencePart runs the ring)")
        _check_qkv(q, k, v)
        if q.shape[0] != len(self.tokens):
            raise ValueError(
                f"Expected 'q', 'k', 'v' with this rank's {len(self.tokens)} rows "
                f"(part.shard(x) of the whole sequence), got {q.shape[0]}"
            )
        out, lse = ring_attention(
            q,
            k,
            v,
            causal=self.causal,
            scale=scale,
            layout=self.layout,
            group=self.group,
            return_lse=True,
        )
        if drop_all:
            out = out * 0.0  # zero gradients to q, k and v; the lse is that before dropout
        return AttentionOutput(out, lse, None, "ring") if return_lse else out
