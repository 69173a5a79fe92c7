r"""Block plans: a graph's targets in row windows, each window's sources in dense columns.

A tile kernel (:mod:`gnnattn.kernels.tiles`) computes attention as matrix
products on tiles instead of one edge at a time. The plan says which tiles:

* **Row windows.** The targets are cut into windows of at most :math:`B`
  consecutive ids. A window never straddles a *cut* of a square graph (a
  position no edge :math:`j \to i` crosses, such as the boundary between two
  graphs of a PyG batch), so the blocks of a batch get windows of their own;
  a block longer than :math:`B` is split into windows of equal length (a
  multiple of 8), and runs of blocks of a few rows share a window.
  Consecutive windows with the same columns (the windows of one complete
  block) are merged, up to :data:`CHUNK_SLOTS` slots: a block's windows
  would each gather all its keys and values.
* **Dense columns.** A window's columns are the union of its targets'
  sources, sorted by id (a source repeated by duplicate edges into one
  target gets one column per copy), so a window's tile is
  :math:`R \times K`: its rows against its columns.
* **Slots.** Each slot (row, column) of a tile holds one edge or none; the
  plan lists, for every edge, its slot, its id in ``graph.edge_index`` order
  and its destination-CSR position (the dropout stream's counter), and
  masks the empty slots (``-inf`` in the scores).
* **Buckets.** Tiles are padded to multiples of 8 rows and 16 columns and
  grouped greedily, widest first, into buckets whose padded slots are at most
  :data:`MAX_PADDING` of the bucket's, so that a window graph is one bucket
  and a batch of graphs of many sizes a few: each bucket runs as batched
  matrix products, in chunks of at most :data:`CHUNK_SLOTS` slots (which bound
  the memory of a call).

The plan's *fill* is :math:`|\mathcal{E}|` over the slots of all its tiles:

.. math::
    \text{fill} = \frac{|\mathcal{E}|}{\sum_{\text{chunks}} n \, R \, K}

about :math:`(2w + 1) / (B + 2w)` for a sliding window of half-width
:math:`w`, about :math:`1 / B` for a random sparse graph. :func:`block_plan`
makes the plan once per graph and block size and keeps it on the graph
(:meth:`~gnnattn.AttentionGraph.derived`); :func:`fill_estimate` estimates
its fill from a sample of windows, without making it, for the choice of
``backend="auto"``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ..checks import check_int
from .csr import segment_ids
from .graph import AttentionGraph
from .structure import Structure

__all__ = [
    "CHUNK_SLOTS",
    "MAX_PADDING",
    "TILES_MIN_EDGES",
    "TILES_MIN_FILL",
    "TileChunk",
    "TilePlan",
    "block_plan",
    "default_block",
    "fill_estimate",
    "sdpa_first",
]

#: Tile rows are padded to a multiple of this, columns to a multiple of :data:`COL_QUANTUM`.
ROW_QUANTUM = 8
COL_QUANTUM = 16

#: The most padded slots a bucket of tiles may hold, as a fraction of all its
#: slots (as :data:`gnnattn.ops.sdpa.MAX_PADDING` for SDPA's buckets of blocks).
MAX_PADDING = 0.15

#: The most slots (rows x columns, summed over windows) one chunk of a bucket
#: holds: the score tile of a call is ``H`` times that (16 MB for 8 heads of
#: float32), so a call's memory stays bounded and its tiles stay in cache.
CHUNK_SLOTS = 1 << 19

#: Windows sampled by :func:`fill_estimate`.
_SAMPLE = 64


#: ``"auto"`` takes the tiles for a plan that fills at least this much of its tiles.
#: Measured on the CPU (one thread, float32, banded graphs of 8192 nodes and the
#: sliding window of 4096): against the fused CSR kernel the tiles take 2.4x
#: the forward's time at fill 0.2, 1.1-1.4x at 0.32, 0.93-0.97x at 0.44 and 0.5x
#: at 0.79 (head widths 32 and 64); forward+backward, 1.2x at 0.2, 0.6-1.2x at
#: 0.32, 0.4-0.7x at 0.44 and 0.33x at 0.79.
TILES_MIN_FILL = 0.4

#: ... and has at least this many edges (below, a tile call's dozen torch
#: operations cost more than the fused kernel's one pass).
TILES_MIN_EDGES = 4096


def sdpa_first(graph: AttentionGraph, structure: Structure | None) -> bool:
    """Whether ``"auto"`` takes SDPA's dense kernel for ``structure`` (the graph's, where
    SDPA takes the call) before the tiles are looked at: complete or causal blocks, or a
    window filling more than a quarter of the dense matrix."""
    return structure is not None and (
        structure.kind in ("complete", "causal") or graph.density > 0.25
    )


def default_block(device: torch.device) -> int:
    """The row-window size :math:`B` of ``device``: 64 (measured on the CPU; see
    :mod:`gnnattn.kernels.tiles`)."""
    return 64


class TileChunk(NamedTuple):
    """Windows of one bucket that run as one batch of matrix products.

    Attributes:
        rows: ``[n, R]`` int64 target of each tile row (a padded row repeats
            the window's last target; its result is dropped).
        out_rows: ``[n, R]`` int64 the same, but ``N`` (a zero row past the
            targets) for a padded row or a target without edges: where a row's
            output gradient is read.
        cols: ``[n, K]`` int64 source of each tile column (a padded column
            repeats the window's last source; it is masked).
        masked: ``[n, R, K]`` bool, ``True`` where a slot of a row with edges
            holds no edge (its score is ``-inf``), or ``None`` when there is none.
        slot: ``[E_c]`` int64 flat slot ``(w * R + r) * K + c`` of each edge.
        edge: ``[E_c]`` int64 its id in ``graph.edge_index`` order.
        pos: ``[E_c]`` int64 its destination-CSR position (the counter of the
            dropout stream, :mod:`gnnattn.kernels.common`).
        key_masked: ``[n, K]`` bool, the columns ``masked`` masks on every row
            with edges, when it masks no other slot (padding columns only, as
            for complete blocks): a key-padding mask, or ``None``.
        band: ``(row0, row_step, col0, col_step)`` when window ``w``'s rows are
            ``row0 + w row_step + arange(R)`` and its columns ``col0 + w
            col_step + arange(K)`` (the interior of a window graph): the tiles
            are then strided views of ``q``, ``k``, ``v``, read with no gather.
            ``None`` otherwise.
    """

    rows: Tensor
    out_rows: Tensor
    cols: Tensor
    masked: Tensor | None
    slot: Tensor
    edge: Tensor
    pos: Tensor
    key_masked: Tensor | None = None
    band: tuple[int, int, int, int] | None = None


def _banded(ch: TileChunk, num_dst: int) -> list[TileChunk]:
    """``ch`` cut where needed so that its longest stretch of banded windows is a chunk
    of its own, with its :attr:`TileChunk.band` (the others keep ``None``); the
    windows keep their order.

    A window is banded when its rows and columns are consecutive ids; a stretch
    when their first ids also advance by one step each. Only the slots that matter
    must follow: a padded row (its output is dropped) and a column masked on every
    row (it holds no edge: its finite key and value get weight 0) may read any
    row, or a zero row past the inputs (the kernel pads them there).
    """
    n, r = ch.rows.shape
    kk = ch.cols.shape[1]
    live_rows = ch.out_rows < num_dst  # (n, R)
    live_cols = ~ch.masked.all(1) if ch.masked is not None else torch.ones_like(ch.cols).bool()
    row0, col0 = ch.rows[:, :1], ch.cols[:, :1]  # (n, 1)
    ok = (
        ((ch.rows == row0 + torch.arange(r, device=row0.device)) | ~live_rows).all(1)
        & ((ch.cols == col0 + torch.arange(kk, device=col0.device)) | ~live_cols).all(1)
    ).tolist()
    rs, cs = row0.view(-1).tolist(), col0.view(-1).tolist()
    best, a = (0, 0), 0
    while a < n:
        b = a + 1
        if ok[a] and b < n and ok[b]:
            step = (rs[b] - rs[a], cs[b] - cs[a])
            while b < n and ok[b] and (rs[b] - rs[b - 1], cs[b] - cs[b - 1]) == step:
                b += 1
            if min(step) >= 0 and b - a > best[1] - best[0]:
                best = (a, b)
        a = b
    a, b = best
    if b - a < 2:
        return [ch]
    band = (rs[a], rs[a + 1] - rs[a], cs[a], cs[a + 1] - cs[a])
    parts = [
        _chunk_part(ch, 0, a),
        _chunk_part(ch, a, b)._replace(band=band),
        _chunk_part(ch, b, n),
    ]
    return [part for part in parts if part.rows.shape[0]]


def _chunk_part(ch: TileChunk, a: int, b: int) -> TileChunk:
    """Windows ``a:b`` of a chunk, its edges' slots renumbered."""
    rk = ch.rows.shape[1] * ch.cols.shape[1]
    window = ch.slot // rk
    keep = (window >= a) & (window < b)
    return TileChunk(
        ch.rows[a:b],
        ch.out_rows[a:b],
        ch.cols[a:b],
        ch.masked[a:b] if ch.masked is not None else None,
        ch.slot[keep] - a * rk,
        ch.edge[keep],
        ch.pos[keep],
        ch.key_masked[a:b] if ch.key_masked is not None else None,
    )


class TilePlan(NamedTuple):
    """A graph's tiles (see the module's docstring): made by :func:`block_plan`.

    Attributes:
        block: :math:`B`, the most rows of a window.
        chunks: the chunks, bucket by bucket.
        rows: ``[sum n R]`` every chunk's ``rows``, one after another (the
            chunks' are views of it).
        cols: ``[sum n K]`` every chunk's ``cols``, one after another.
        take: ``[N]`` int64 the row of each target among the chunks' rows
            concatenated (``R`` per window); a target without edges takes row
            ``num_rows``, past the last (a zero row).
        num_rows: the chunks' rows.
        num_edges: :math:`|\\mathcal{E}|`.
        slots: the chunks' slots, :math:`\\sum n R K`.
        num_windows: the windows (those without edges included).
        num_buckets: the buckets the chunks come from.
    """

    block: int
    chunks: tuple[TileChunk, ...]
    rows: Tensor
    cols: Tensor
    take: Tensor
    num_rows: int
    num_edges: int
    slots: int
    num_windows: int
    num_buckets: int

    @property
    def fill(self) -> float:
        """Edges over slots (1.0 for a graph without edges)."""
        return self.num_edges / self.slots if self.slots else 1.0

    def __repr__(self) -> str:
        return (
            f"TilePlan(block={self.block}, windows={self.num_windows}, "
            f"buckets={self.num_buckets}, chunks={len(self.chunks)}, fill={self.fill:.3f})"
        )


def _round_up(x: Tensor, q: int) -> Tensor:
    return (x + (q - 1)) // q * q


def _windows(graph: AttentionGraph, block: int, cuts: bool = True) -> tuple[Tensor, Tensor]:
    """``(starts, rows)`` ``[W]`` of the row windows: the first target of each and its
    number of targets, in target order (see the module's docstring).

    The blocks of a graph of known structure are its sequences; other graphs'
    are found from the edges (a pass over them), or with ``cuts=False`` not
    looked for (one block).
    """
    n = graph.num_dst
    dev = graph.csr.ptr.device
    if n == 0:
        empty = torch.zeros(0, dtype=torch.int64, device=dev)
        return empty, empty
    s = graph.structure
    if s is not None:
        lengths = torch.tensor(s.lengths, dtype=torch.int64, device=dev)
        seg_start = torch.cumsum(lengths, 0) - lengths
    elif graph.is_bipartite or not cuts:
        seg_start = torch.zeros(1, dtype=torch.int64, device=dev)
    else:
        ptr, col, _ = graph.csr
        tgt = segment_ids(ptr, col.numel())
        src = col.long()
        # An edge j -> i covers the positions p with min(i, j) < p <= max(i, j):
        # a window starting at p would split its two ends. A cut is a position
        # no edge covers (0 always is).
        lo, hi = torch.minimum(src, tgt), torch.maximum(src, tgt)
        delta = torch.bincount(lo + 1, minlength=n + 1) - torch.bincount(hi + 1, minlength=n + 1)
        cover = torch.cumsum(delta, 0)[:n]  # (N,) edges covering each position
        seg_start = (cover == 0).nonzero().view(-1)  # (S,), seg_start[0] == 0
    seg_len = torch.diff(seg_start, append=seg_start.new_tensor([n]))  # (S,)
    # Runs of short blocks share a window per aligned span of `pack` ids (at
    # most 2 * pack - 1 rows, under B and ROW_QUANTUM): their padded tile is no
    # larger than one of theirs alone.
    pack = max(1, min(ROW_QUANTUM, block) // 2)
    short = seg_len < pack
    span = seg_start // pack
    prev_short = torch.cat([short.new_zeros(1), short[:-1]])
    prev_span = torch.cat([span.new_full((1,), -1), span[:-1]])
    opens = ~short | ~prev_short | (span != prev_span)  # (S,) a short block opening a window
    # A long block: nw windows of r rows (r a multiple of ROW_QUANTUM), the last shorter.
    nw = torch.where(short, torch.ones_like(seg_len), (seg_len + block - 1) // block)
    r = torch.clamp(_round_up((seg_len + nw - 1) // nw, ROW_QUANTUM), max=block)
    r = torch.where(short, seg_len, torch.maximum(r, torch.ones_like(r)))
    nw = torch.where(short, opens.long(), (seg_len + r - 1) // r)  # (S,) windows opened
    owner = torch.repeat_interleave(torch.arange(seg_start.numel(), device=dev), nw)  # (W,)
    first = torch.cumsum(nw, 0) - nw
    j = torch.arange(owner.numel(), device=dev) - first[owner]  # window's index in its block
    starts = seg_start[owner] + j * r[owner]
    rows = torch.diff(starts, append=starts.new_tensor([n]))
    return starts, rows


def _columns(
    graph: AttentionGraph, starts: Tensor, window: Tensor, tgt: Tensor, src: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(cols, col_start, col_src, col_of)``: the number of columns of each window
    ``[W]``, where its columns begin ``[W]``, each column's source ``[U]`` (the
    windows' columns one after another, sorted by source within a window) and the
    column of each edge within its window ``[E]``.

    A source with duplicate edges into one target takes one column per copy
    (the ``r``-th copy the ``r``-th column of that source), so no slot holds
    two edges.
    """
    e, m = src.numel(), graph.num_src
    rank = torch.zeros(e, dtype=torch.int64, device=src.device)
    if e > 1:
        # Copies of an edge are adjacent once the edges are sorted by target, then
        # source: the CSR's order when it was sorted, else sorted here.
        step = (tgt[1:] > tgt[:-1]) | ((tgt[1:] == tgt[:-1]) & (src[1:] >= src[:-1]))
        order = None if bool(step.all()) else torch.argsort(tgt * m + src, stable=True)
        ts, ss = (tgt, src) if order is None else (tgt[order], src[order])
        same = (ts[1:] == ts[:-1]) & (ss[1:] == ss[:-1])
        if bool(same.any()):
            pos = torch.arange(e, device=src.device)
            run = torch.where(torch.cat([same.new_zeros(1), same]), 0, pos)
            ranked = pos - torch.cummax(run, 0).values  # the r-th copy has rank r
            rank = ranked if order is None else torch.empty_like(ranked).scatter_(0, order, ranked)
    copies = int(rank.max()) + 1 if e else 1
    key = (window * m + src) * copies + rank  # (E,) sorted by window, then source
    uniq, inverse = torch.unique(key, sorted=True, return_inverse=True)
    col_window = uniq // (m * copies)
    cols = torch.bincount(col_window, minlength=starts.numel())  # (W,)
    col_start = torch.cumsum(cols, 0) - cols
    col_src = (uniq // copies) % m  # (U,)
    return cols, col_start, col_src, inverse - col_start[window]


def _merge_same(
    starts: Tensor, rows: Tensor, cols: Tensor, col_start: Tensor, col_src: Tensor
) -> tuple[Tensor, Tensor] | None:
    """Consecutive windows with the same columns (the windows of one complete block,
    of a complete bipartite graph) merged while a window's slots stay at most
    :data:`CHUNK_SLOTS`: ``(group [W], first [W'])``, each window's merged window
    and each merged window's first, or ``None`` when none merge.

    A block's windows would each gather all of its keys and values; merged, the
    block is one tile, whose rows the kernels block themselves.
    """
    w = starts.numel()
    if w < 2:
        return None
    # Same width, then the same sources column by column.
    cand = ((cols[1:] == cols[:-1]) & (cols[1:] > 0)).nonzero().view(-1)  # (P,) pairs w, w+1
    if cand.numel() == 0:
        return None
    width = cols[cand]
    owner = torch.repeat_interleave(torch.arange(cand.numel(), device=cols.device), width)
    j = torch.arange(int(width.sum()), device=cols.device) - (torch.cumsum(width, 0) - width)[owner]
    here, there = col_start[cand][owner] + j, col_start[cand + 1][owner] + j
    differ = torch.zeros(cand.numel(), dtype=torch.bool, device=cols.device)
    differ.index_fill_(0, owner[col_src[here] != col_src[there]], True)
    same = torch.zeros(w - 1, dtype=torch.bool, device=cols.device)
    same[cand[~differ]] = True
    if not bool(same.any()):
        return None
    # Greedy on the host: a window joins the previous one's group while the
    # group's slots stay within a chunk.
    same_l, rows_l, cols_l = same.tolist(), rows.tolist(), cols.tolist()
    group = [0] * w
    first = [0]
    acc = rows_l[0]
    for i in range(1, w):
        if same_l[i - 1] and (acc + rows_l[i]) * cols_l[i] <= CHUNK_SLOTS:
            acc += rows_l[i]
        else:
            first.append(i)
            acc = rows_l[i]
        group[i] = len(first) - 1
    dev = starts.device
    return torch.tensor(group, device=dev), torch.tensor(first, device=dev)


def _buckets(rp: list[int], kp: list[int], real: list[int]) -> list[list[int]]:
    """Windows (ids into ``rp``/``kp``, those with columns) grouped greedily, widest
    first: a bucket takes the next window while its padded slots stay at most
    :data:`MAX_PADDING` of the bucket's."""
    order = sorted(range(len(rp)), key=lambda w: (-kp[w], -rp[w]))
    out: list[list[int]] = []
    i = 0
    while i < len(order):
        w0 = order[i]
        top_k, top_r, used = kp[w0], rp[w0], real[w0]
        group = [w0]
        i += 1
        while i < len(order):
            w = order[i]
            r = max(top_r, rp[w])
            # Sorted by width: the bucket's columns are its first window's.
            if used + real[w] < (1.0 - MAX_PADDING) * (len(group) + 1) * r * top_k:
                break
            top_r, used = r, used + real[w]
            group.append(w)
            i += 1
        out.append(group)
    return out


def plan_tiles(graph: AttentionGraph, block: int) -> TilePlan:
    """The block plan of ``graph`` for windows of at most ``block`` targets (not kept;
    :func:`block_plan` keeps it on the graph).

    All in vectorised torch ops on the graph's device, but for the greedy
    bucketing of the windows (a loop over their sizes on the host).
    """
    check_int(block, "block", min=1)
    ptr, col, perm = graph.csr
    dev = ptr.device
    n, e = graph.num_dst, col.numel()
    starts, rows = _windows(graph, block)
    nwin = starts.numel()
    tgt = segment_ids(ptr, e)  # (E,) target of each CSR position
    src = col.long()
    window = torch.searchsorted(starts, tgt, right=True) - 1  # (E,)
    cols, col_start, col_src, c_e = _columns(graph, starts, window, tgt, src)
    merged = _merge_same(starts, rows, cols, col_start, col_src)
    if merged is not None:
        merged_of, first = merged
        window = merged_of[window]
        starts, cols, col_start = starts[first], cols[first], col_start[first]
        rows = torch.diff(starts, append=starts.new_tensor([n]))
        nwin = starts.numel()
    rp = _round_up(rows, ROW_QUANTUM)
    kp = _round_up(cols, COL_QUANTUM)
    live = (cols > 0).nonzero().view(-1).tolist()  # windows with edges
    rp_l, kp_l = rp.tolist(), kp.tolist()
    groups = _buckets(
        [rp_l[w] for w in live], [kp_l[w] for w in live], [rp_l[w] * kp_l[w] for w in live]
    )
    # Each window's chunk, its place in it, and its chunk's tile shape.
    chunk_of = [-1] * nwin
    local_of = [0] * nwin
    shapes: list[tuple[int, int, list[int]]] = []
    for group in groups:
        ws = [live[g] for g in group]
        r = max(rp_l[w] for w in ws)
        k = kp_l[ws[0]]
        per = max(1, CHUNK_SLOTS // (r * k))
        for c0 in range(0, len(ws), per):
            part = ws[c0 : c0 + per]
            for i, w in enumerate(part):
                chunk_of[w], local_of[w] = len(shapes), i
            shapes.append((r, k, part))
    tile_r = [s[0] for s in shapes]
    tile_k = [s[1] for s in shapes]
    base = [0] * len(shapes)  # first row of each chunk among all chunks' rows
    for i in range(1, len(shapes)):
        base[i] = base[i - 1] + len(shapes[i - 1][2]) * tile_r[i - 1]
    num_rows = base[-1] + len(shapes[-1][2]) * tile_r[-1] if shapes else 0

    def tensor(values: list[int]) -> Tensor:
        return torch.tensor(values, dtype=torch.int64, device=dev)

    w_chunk, w_local = tensor(chunk_of), tensor(local_of)
    # One more entry past the chunks, for the windows without edges.
    ch_r, ch_k, ch_base = tensor(tile_r + [0]), tensor(tile_k + [0]), tensor(base + [0])
    # Each target's row among the chunks' rows; a target without edges takes
    # the zero row past them.
    t_win = torch.searchsorted(starts, torch.arange(n, device=dev), right=True) - 1
    tc = w_chunk[t_win]
    row = ch_base[tc] + w_local[t_win] * ch_r[tc] + torch.arange(n, device=dev) - starts[t_win]
    take = torch.where(ptr.diff() > 0, row, num_rows)  # (N,)
    # The target of each row of the chunks, n for padded rows and targets without edges.
    row_target = torch.full((num_rows + 1,), n, dtype=torch.int64, device=dev)
    row_target[take] = torch.arange(n, device=dev)
    row_target = row_target[:num_rows]
    # Each edge's slot in its chunk; edges grouped by chunk (stable: CSR order within).
    e_chunk = w_chunk[window]
    e_k = ch_k[e_chunk]
    slot = (w_local[window] * ch_r[e_chunk] + (tgt - starts[window])) * e_k + c_e
    sizes = [len(p) * r * k for r, k, p in shapes]
    # Every chunk's mask in one tensor (one fill, one scatter), then split.
    masked = torch.ones(sum(sizes), dtype=torch.bool, device=dev)
    if e:
        first_slot = torch.cumsum(tensor(sizes), 0) - tensor(sizes)
        masked[first_slot[e_chunk] + slot] = False
    order = torch.sort(e_chunk, stable=True).indices
    counts = torch.bincount(e_chunk, minlength=len(shapes)).tolist() if e else [0] * len(shapes)
    edge_id = order if perm is None else perm[order]
    chunks = []
    for (tr, tk, part), mk, rt, sl, ed, ps in zip(
        shapes,
        masked.split(sizes),
        row_target.split([len(p) * r for r, _, p in shapes]),
        slot[order].split(counts),
        edge_id.split(counts),
        order.split(counts),
        strict=True,
    ):
        wt = tensor(part)
        ri = torch.arange(tr, device=dev)
        row_ids = starts[wt, None] + torch.minimum(ri, rows[wt, None] - 1)  # (n, R)
        cj = torch.arange(tk, device=dev)
        col_ids = col_src[col_start[wt, None] + torch.minimum(cj, cols[wt, None] - 1)]  # (n, K)
        # A row without edges (padding, or a target without edges) is left
        # unmasked: a softmax over finite scores, where all -inf would give NaN.
        # Its output is dropped and its gradient comes from a zero row.
        out_ids = rt.view(len(part), tr)
        dead = (rt == n).view(len(part), tr, 1)
        mk = mk.view(len(part), tr, tk)
        masked_c = key_c = None
        if bool(mk.any()):
            # A mask the same on every row with edges (padding columns only, as
            # for complete blocks) is also kept as a [n, K] key mask.
            keys = (mk | dead).all(1)  # (n, K) masked on every row with edges
            if not bool((mk & ~dead & ~keys.unsqueeze(1)).any()):
                key_c = keys
            masked_c = mk.masked_fill_(dead, False)
        chunks.append(TileChunk(row_ids, out_ids, col_ids, masked_c, sl, ed, ps, key_c))
    chunks = [part for ch in chunks for part in _banded(ch, graph.num_dst)]
    # The chunks' rows and columns as views of one tensor each, so that a call can
    # gather every chunk's rows at once (one gather, one scatter in its backward).
    all_rows = torch.cat([c.rows.reshape(-1) for c in chunks]) if chunks else src.new_zeros(0)
    all_cols = torch.cat([c.cols.reshape(-1) for c in chunks]) if chunks else src.new_zeros(0)
    row_views = all_rows.split([c.rows.numel() for c in chunks])
    col_views = all_cols.split([c.cols.numel() for c in chunks])
    chunks = [
        c._replace(
            rows=r.view(c.rows.shape),
            cols=k.view(c.cols.shape),
        )
        for c, r, k in zip(chunks, row_views, col_views, strict=True)
    ]
    slots = sum(len(p) * r * k for r, k, p in shapes)
    return TilePlan(
        block, tuple(chunks), all_rows, all_cols, take, num_rows, e, slots, nwin, len(groups)
    )


def block_plan(graph: AttentionGraph, block: int | None = None) -> TilePlan:
    """The block plan of ``graph`` (see the module's docstring), made on first use and
    kept by the graph.

    Args:
        graph (AttentionGraph): the graph.
        block (int, optional): :math:`B`, the most targets of a row window;
            :func:`default_block` of the graph's device by default.
            (default: :obj:`None`)

    Example:
        >>> from gnnattn.graphs import sliding_window_graph
        >>> g = AttentionGraph(sliding_window_graph(256, window=32))
        >>> plan = block_plan(g, 64)
        >>> plan
        TilePlan(block=64, windows=4, buckets=1, chunks=2, fill=0.476)
        >>> [tuple(c.masked.shape) for c in plan.chunks]  # windows of 64 rows x 128 columns
        [(2, 64, 128), (2, 64, 128)]
        >>> [c.band for c in plan.chunks]  # the banded stretch (windows 1 and 2) first
        [(64, 64, 32, 64), None]
    """
    b = default_block(graph.device) if block is None else block
    check_int(b, "block", min=1)
    return graph.derived(("tiles", b), lambda: plan_tiles(graph, b))


def fill_estimate(graph: AttentionGraph, block: int | None = None) -> float:
    """The fill of :func:`block_plan`, estimated from up to 64 windows spread over the
    graph; made once per graph and block size and kept, or read from the plan when
    that was made.

    Reads the sampled windows' edges only (the plan sorts every edge): the
    blocks of a graph without known structure are not looked for, so a batch
    of graphs given as plain edges is estimated as one graph (lower than its
    plan's fill, whose windows never straddle two graphs). Exact but for the
    bucketing's padding on a graph of known structure with at most 64 windows.

    Example:
        >>> from gnnattn.graphs import sliding_window_graph
        >>> round(fill_estimate(AttentionGraph(sliding_window_graph(256, window=32)), 64), 3)
        0.544
    """
    check_int(block, "block", min=1, optional=True)
    b = default_block(graph.device) if block is None else block
    made = graph.peek(("tiles", b))
    if made is not None:
        return float(made.fill)

    def estimate() -> float:
        ptr, col, _ = graph.csr
        starts, rows = _windows(graph, b, cuts=False)
        w = starts.numel()
        if col.numel() == 0 or w == 0:
            return 1.0
        pick = torch.linspace(0, w - 1, min(w, _SAMPLE), device=ptr.device).round().long()
        pick = torch.unique(pick)
        lo, hi = ptr[starts[pick]], ptr[starts[pick] + rows[pick]]
        count = hi - lo  # (S,) edges of each sampled window
        owner = torch.repeat_interleave(torch.arange(pick.numel(), device=ptr.device), count)
        first = torch.cumsum(count, 0) - count
        pos = lo[owner] + torch.arange(int(count.sum()), device=ptr.device) - first[owner]
        src = col[pos].long()
        tgt = torch.searchsorted(ptr, pos, right=True) - 1
        cols = _columns(graph, starts[pick], owner, tgt, src)[0]
        area = _round_up(rows[pick], ROW_QUANTUM) * _round_up(cols, COL_QUANTUM)
        total = int(area.sum())
        return int(count.sum()) / total if total else 1.0

    return graph.derived(("tiles fill", b), estimate)
