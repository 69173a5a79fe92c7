r"""Sparse attention patterns with locality: dilated windows and BigBird.

Each builder returns an :class:`~gnnattn.AttentionGraph` whose edges are
sorted by target, then source (so its CSR is the edges themselves, with no
permutation), one pattern per sequence of ``batch`` / ``lengths``. The graph
also carries a :class:`Pattern` (read it with :func:`pattern_of`): the
pattern's parameters and, for BigBird, the random key blocks that were drawn,
so a block plan can be made from the pattern itself rather than guessed from
the edges.

Positions :math:`i` (target) and :math:`j` (source) count from the first node
of their sequence; edges never cross sequences. With ``causal=True`` every
pattern keeps only :math:`j \le i`.

* :func:`dilated_window_graph`: Longformer's dilated sliding window,
  :math:`i - j \in \{-wd, \dots, -d, 0, d, \dots, wd\}`: the sliding
  window's :math:`2w + 1` sources per target spread over a receptive field
  :math:`d` times wider.
* :func:`bigbird_graph`: BigBird's block-sparse pattern (Zaheer et al.,
  2020): the sequence cut into blocks of :math:`b` tokens; each query block
  attends to its :math:`w` neighbouring blocks on each side, to
  :math:`r` random key blocks, and to the first :math:`g` tokens, which
  attend to everything.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..checks import check_bool, check_int
from .builders import resolve_lengths
from .graph import AttentionGraph

__all__ = ["PATTERN_KEY", "Pattern", "bigbird_graph", "dilated_window_graph", "pattern_of"]

#: The key of a builder's :class:`Pattern` in its graph's :meth:`~AttentionGraph.derived` data.
PATTERN_KEY = "pattern"

#: Random keys drawn per chunk of query blocks (bounds the memory of the draw).
_DRAW_CHUNK = 1 << 22


@dataclass(frozen=True)
class Pattern:
    r"""What a pattern builder made: enough to rebuild its edges block by block.

    Attributes:
        kind: ``"dilated_window"`` or ``"bigbird"``.
        lengths: the sequence lengths, in node order.
        causal: whether only :math:`j \le i` was kept.
        window: the half-width :math:`w`: in steps of ``dilation`` tokens
            (dilated window) or in blocks (BigBird).
        dilation: :math:`d` of a dilated window (1 for BigBird).
        block_size: :math:`b` of BigBird (0 for a dilated window).
        num_global: :math:`g`, BigBird's global tokens per sequence (the
            first :math:`\min(g, T)` of each).
        num_random: :math:`r`, BigBird's random key blocks per query block.
        seed: the seed the random blocks were drawn with.
        random_blocks: ``[Q, min(r, B)]`` int64 (:math:`B` the blocks of the
            longest sequence), the random key blocks of each of the
            :math:`Q` query blocks (all sequences, in order; block ids count
            from each sequence's first block), ascending, ``-1`` where a
            query block had fewer than :math:`r` blocks to draw from.
            ``None`` for a dilated window.
    """

    kind: str
    lengths: tuple[int, ...]
    causal: bool
    window: int
    dilation: int = 1
    block_size: int = 0
    num_global: int = 0
    num_random: int = 0
    seed: int = 0
    random_blocks: Tensor | None = field(default=None, compare=False, repr=False)


def pattern_of(graph: AttentionGraph) -> Pattern | None:
    """The :class:`Pattern` a builder of this module attached to ``graph``, else ``None``.

    It lives in the graph's derived data: :meth:`AttentionGraph.to` and
    pickling drop it (build the graph on its device with ``device=``), and
    :func:`~gnnattn.graphs.permute` makes a graph without one (the ids it
    describes are gone).

    Example:
        >>> pattern_of(dilated_window_graph(8, window=1, dilation=2)).kind
        'dilated_window'
    """
    p = graph.peek(PATTERN_KEY)
    return p if isinstance(p, Pattern) else None


def _with_pattern(graph: AttentionGraph, pattern: Pattern) -> AttentionGraph:
    graph.derived(PATTERN_KEY, lambda: pattern)
    return graph


def _layout(lengths: tuple[int, ...], device: torch.device) -> tuple[Tensor, Tensor]:
    """Per node: the first node of its sequence and its sequence's length, ``[N]`` each."""
    t = torch.tensor(lengths, dtype=torch.long, device=device)
    starts = torch.cumsum(t, 0) - t
    return torch.repeat_interleave(starts, t), torch.repeat_interleave(t, t)


def _segments(dst: Tensor, first: Tensor, count: Tensor, step: Tensor | int) -> Tensor:
    """Edges ``first[s] + step * (0 .. count[s] - 1) -> dst[s]`` for each segment ``s``, in
    segment order (``[2, sum(count)]``); segments with ``count`` 0 give none."""
    total = int(count.sum()) if count.numel() else 0
    seg = torch.repeat_interleave(torch.arange(count.numel(), device=count.device), count)
    seg_ptr = torch.cumsum(count, 0) - count  # (S,) first edge of each segment
    offset = torch.arange(total, device=count.device) - seg_ptr[seg]
    step_e = step[seg] if isinstance(step, Tensor) else step
    return torch.stack([first[seg] + offset * step_e, dst[seg]])


def _device(device: torch.device | str | None, found: object) -> torch.device:
    if device is not None:
        return torch.device(device)
    return found if isinstance(found, torch.device) else torch.device("cpu")


def dilated_window_graph(
    num_nodes: int | None = None,
    *,
    window: int,
    dilation: int,
    causal: bool = False,
    batch: Tensor | None = None,
    lengths: Sequence[int] | None = None,
    device: torch.device | str | None = None,
) -> AttentionGraph:
    r"""Dilated sliding window: token :math:`i` attends to every :math:`d`-th token within
    :math:`w d` of it.

    .. math::
        \mathcal{E} = \{(j, i) : i - j = d s,\ s \in \mathbb{Z},\ |s| \le w\}
        \quad\text{or, causal,}\quad 0 \le s \le w

    within each sequence (Longformer's dilated window). A target far from the
    sequence's ends has :math:`2w + 1` sources (:math:`w + 1` causal), as
    many as the sliding window of half-width :math:`w`, over a receptive
    field :math:`d` times wider; ``dilation=1`` is that sliding window, and
    the graph is marked as one (``structure``).

    In the dense picture: ``2w + 1`` diagonals, ``d`` apart. A row window of
    :math:`B > d` targets reads :math:`B + 2 w d` contiguous sources, every
    :math:`d`-th of them per target (tile fill :math:`(2w + 1) / (B + 2wd)`,
    under :math:`1/d`); a plan that groups the targets of one residue modulo
    :math:`d` fills its tiles.

    Args:
        num_nodes (int, optional): number of tokens :math:`T`. (default: :obj:`None`)
        window (int): :math:`w \ge 0`, sources on each side of a target.
        dilation (int): :math:`d \ge 1`, the step between them.
        causal (bool, optional): only look back. (default: :obj:`False`)
        batch (Tensor, optional): sorted sequence id of every node, ``[N]``.
            (default: :obj:`None`)
        lengths (list of int, optional): the sequence lengths instead of
            ``batch``. (default: :obj:`None`)
        device (torch.device, optional): where to build the graph; defaults
            to ``batch``'s device, else the CPU. (default: :obj:`None`)

    Returns:
        An :class:`~gnnattn.AttentionGraph` with edges sorted by target, then
        source, and its :class:`Pattern`.

    Shapes:
        - **edge_index:** ``[2, |E|]`` int64, :math:`|E| \le T (2w + 1)`.

    Example:
        >>> g = dilated_window_graph(5, window=1, dilation=2)
        >>> g.edge_index
        tensor([[0, 2, 1, 3, 0, 2, 4, 1, 3, 2, 4],
                [0, 0, 1, 1, 2, 2, 2, 3, 3, 4, 4]])
    """
    check_int(window, "window")
    check_int(dilation, "dilation", min=1)
    check_bool(causal, "causal")
    seqs, found = resolve_lengths(num_nodes, batch, lengths)
    dev = _device(device, found)
    pattern = Pattern("dilated_window", seqs, bool(causal), window, dilation)
    if dilation == 1:
        return _with_pattern(
            AttentionGraph.window(window=window, causal=causal, lengths=seqs, device=dev), pattern
        )
    start, length = _layout(seqs, dev)
    n = start.numel()
    i = torch.arange(n, device=dev)
    pos = i - start  # (N,) position in the sequence
    lo = torch.clamp(pos // dilation, max=window)  # (N,) steps back
    hi = torch.zeros_like(lo) if causal else torch.clamp((length - 1 - pos) // dilation, max=window)
    ei = _segments(i, i - lo * dilation, lo + hi + 1, dilation)
    return _with_pattern(AttentionGraph(ei, n, causal=causal), pattern)


def _random_blocks(
    qb: Tensor,
    nb: Tensor,
    length: Tensor,
    block: int,
    window: int,
    num_global: int,
    num_random: int,
    causal: bool,
    gen: torch.Generator,
) -> Tensor:
    """``[Q, r]`` random key blocks per query block (ascending, ``-1`` padded), drawn
    without replacement from the blocks not already attended in full: outside the
    window, not wholly inside the global tokens, earlier than the window when causal."""
    q = qb.numel()
    out = torch.full((q, num_random), -1, dtype=torch.long)
    if q == 0 or num_random == 0:
        return out
    width = int(nb.max())
    kb = torch.arange(width)
    chunk = max(1, _DRAW_CHUNK // width)
    for lo in range(0, q, chunk):
        sl = slice(lo, min(lo + chunk, q))
        qs, ns, ts = qb[sl, None], nb[sl, None], length[sl, None]
        gap = qs - kb if causal else (qs - kb).abs()
        global_only = torch.minimum((kb + 1) * block, ts) <= num_global
        ok = (kb < ns) & (gap > window) & ~global_only
        keys = torch.rand(ok.shape, generator=gen)  # (chunk, width), uniform in [0, 1)
        keys[~ok] = 2.0  # never drawn before an eligible block
        k = min(num_random, width)
        val, idx = torch.topk(keys, k, dim=1, largest=False)  # the k smallest keys
        idx[val > 1.0] = -1
        # Ascending, with the -1 padding last.
        idx = torch.where(idx < 0, width, idx).sort(dim=1).values
        out[sl, :k] = torch.where(idx == width, -1, idx)
    return out


def bigbird_graph(
    num_nodes: int | None = None,
    *,
    block_size: int = 64,
    window_blocks: int = 1,
    num_global: int = 64,
    num_random_blocks: int = 3,
    seed: int = 0,
    causal: bool = False,
    batch: Tensor | None = None,
    lengths: Sequence[int] | None = None,
    device: torch.device | str | None = None,
) -> AttentionGraph:
    r"""BigBird's block-sparse attention: a window of blocks, random blocks and global tokens.

    Each sequence of length :math:`T` is cut into :math:`\lceil T / b \rceil`
    blocks of :math:`b` tokens (the last one shorter); :math:`q(i) =
    \lfloor i / b \rfloor` is the block of position :math:`i`. Then

    .. math::
        (j, i) \in \mathcal{E} \iff |q(i) - q(j)| \le w
        \ \lor\ q(j) \in R_{q(i)} \ \lor\ j < g \ \lor\ i < g

    (and :math:`j \le i` when causal): a sliding window of :math:`2w + 1`
    blocks, the first :math:`g` tokens as global tokens (every token attends
    to them and they attend to every token), and for each query block
    :math:`q` a set :math:`R_q` of :math:`r` key blocks drawn uniformly
    without replacement from those not already attended in full: outside
    the window, not wholly inside the first :math:`g` tokens, and, causal,
    before the window (fewer when fewer are left).

    The draw is deterministic: a CPU ``torch.Generator`` seeded with
    ``seed``, query blocks in node order, so the same arguments give the
    same graph on every device. Every tile of :math:`b \times b` is either
    full or empty, but for the global columns and rows, the sequence's last
    block and, causal, the diagonal blocks.

    Args:
        num_nodes (int, optional): number of tokens :math:`T`. (default: :obj:`None`)
        block_size (int, optional): :math:`b`, tokens per block. (default: ``64``)
        window_blocks (int, optional): :math:`w`, neighbouring blocks on each
            side (BigBird's 3-block window is ``1``). (default: ``1``)
        num_global (int, optional): :math:`g`, global tokens at the start of
            each sequence (``0`` for none). (default: ``64``)
        num_random_blocks (int, optional): :math:`r`, random key blocks per
            query block. (default: ``3``)
        seed (int, optional): seeds the random blocks. (default: ``0``)
        causal (bool, optional): keep only :math:`j \le i`. (default: :obj:`False`)
        batch (Tensor, optional): sorted sequence id of every node, ``[N]``.
            (default: :obj:`None`)
        lengths (list of int, optional): the sequence lengths instead of
            ``batch``. (default: :obj:`None`)
        device (torch.device, optional): where to build the graph; defaults
            to ``batch``'s device, else the CPU. (default: :obj:`None`)

    Returns:
        An :class:`~gnnattn.AttentionGraph` with edges sorted by target, then
        source, and its :class:`Pattern` (whose ``random_blocks`` are the
        :math:`R_q`).

    Shapes:
        - **edge_index:** ``[2, |E|]`` int64; a target away from the global
          tokens and the ends has :math:`(2w + 1 + r) b + g` sources.

    Example:
        >>> g = bigbird_graph(12, block_size=2, window_blocks=1, num_global=2,
        ...                   num_random_blocks=1, seed=0)
        >>> g.csr.ptr.diff().tolist()  # global tokens: all 12; inside: (3 + 1) * 2 + 2
        [12, 12, 8, 8, 10, 10, 10, 10, 10, 10, 8, 8]
        >>> pattern_of(g).random_blocks.view(-1).tolist()  # R_q of the 6 query blocks
        [2, 4, 4, 1, 1, 2]
    """
    check_int(block_size, "block_size", min=1)
    check_int(window_blocks, "window_blocks")
    check_int(num_global, "num_global")
    check_int(num_random_blocks, "num_random_blocks")
    check_int(seed, "seed")
    check_bool(causal, "causal")
    seqs, found = resolve_lengths(num_nodes, batch, lengths)
    dev = _device(device, found)
    b, w, g, r = block_size, window_blocks, num_global, num_random_blocks
    # Blocks are planned on the CPU (small: one row per query block), edges made on dev.
    t = torch.tensor(seqs, dtype=torch.long)
    nb = (t + b - 1) // b  # (S,) blocks per sequence
    seq = torch.repeat_interleave(torch.arange(t.numel()), nb)  # (Q,) sequence of each block
    qb = torch.arange(seq.numel()) - (torch.cumsum(nb, 0) - nb)[seq]  # (Q,) block in sequence
    gen = torch.Generator().manual_seed(seed)
    # A sequence has at most nbmax blocks: wider windows, more global blocks or
    # random draws add nothing but memory (Q rows of them), so they are capped.
    nbmax = int(nb.max()) if nb.numel() else 0
    rand = _random_blocks(qb, nb[seq], t[seq], b, w, g, min(r, nbmax), bool(causal), gen)
    pattern = Pattern("bigbird", seqs, bool(causal), w, 1, b, g, r, seed, rand)

    # Key blocks of each query block: window, random, and those holding global tokens;
    # "full" when all of a block's tokens are read, else only its tokens j < g.
    w = min(w, nbmax)
    gb = min((g + b - 1) // b, nbmax)
    win = qb[:, None] + torch.arange(-w, (0 if causal else w) + 1)  # (Q, 2w + 1)
    glob = torch.arange(gb).expand(qb.numel(), gb)  # (Q, gb)
    cand = torch.cat([win, rand, glob], 1)  # (Q, K)
    full = torch.ones_like(cand, dtype=torch.bool)
    full[:, cand.shape[1] - gb :] = False
    cand = torch.where((cand < 0) | (cand >= nb[seq, None]), -1, cand)
    # Sort by block, a full entry before a global-only one of the same block, and drop
    # the repeats: then every block appears once, ascending (sources come sorted).
    big = int(nb.max()) + 1 if nb.numel() else 1
    key = torch.where(cand < 0, big, cand) * 2 + (~full).long()
    key = key.sort(dim=1).values
    cand, full = key // 2, key % 2 == 0
    repeat = torch.zeros_like(full)
    repeat[:, 1:] = cand[:, 1:] == cand[:, :-1]
    tq = t[seq, None]
    first = cand * b  # (Q, K) first token of each key block
    end = torch.minimum(first + b, tq)
    end = torch.where(full, end, torch.minimum(end, torch.full_like(end, g)))
    end = torch.where((cand == big) | repeat, first, end)

    # Rows: every token of a query block reads its block's segments (clipped at j <= i
    # when causal); a global token reads its whole sequence.
    start, length = _layout(seqs, torch.device("cpu"))
    n = start.numel()
    pos = torch.arange(n) - start  # (N,)
    row_block = (torch.cumsum(nb, 0) - nb)[torch.repeat_interleave(torch.arange(t.numel()), t)]
    row_block = row_block + pos // b  # (N,) query block of each token
    seg_first, seg_end = first[row_block], end[row_block]  # (N, K)
    is_global = pos < g
    if is_global.any():
        whole = torch.zeros_like(seg_first[is_global])
        seg_first[is_global] = whole
        seg_end[is_global] = whole
        seg_end[is_global, 0] = length[is_global]
    if causal:
        seg_end = torch.minimum(seg_end, pos[:, None] + 1)
    count = (seg_end - seg_first).clamp_min(0).reshape(-1)  # (N * K,)
    nz = count > 0
    dst = torch.arange(n).repeat_interleave(seg_first.shape[1])[nz]
    src_first = (seg_first + start[:, None]).reshape(-1)[nz]
    ei = _segments(dst.to(dev), src_first.to(dev), count[nz].to(dev), 1)
    return _with_pattern(AttentionGraph(ei, n, causal=causal), pattern)
