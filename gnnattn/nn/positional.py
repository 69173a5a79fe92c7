r"""Positional information: where a token sits in its sequence, where a node sits in its graph.

Attention over a complete graph is permutation-equivariant: without positions
a sequence is a bag of tokens. Sequences get sinusoidal or learned position
embeddings, counted from the first node of each sequence of a PyG ``batch``
vector; graphs get a linear map of a structural encoding that PyG's transforms
compute per graph (:class:`torch_geometric.transforms.AddLaplacianEigenvectorPE`,
:class:`torch_geometric.transforms.AddRandomWalkPE`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..checks import check_float, check_int, check_x
from ..graphs import check_batch

__all__ = [
    "GraphPositionalEncoding",
    "LearnedPositionalEncoding",
    "SinusoidalPositionalEncoding",
    "sequence_positions",
]


def sequence_positions(
    num_nodes: int, batch: Tensor | None = None, *, device: torch.device | None = None
) -> Tensor:
    """The position of every node within its sequence (``0`` at each sequence's start).

    Args:
        num_nodes (int): number of nodes :math:`N`.
        batch (Tensor, optional): sorted sequence id of every node ``[N]``;
            :obj:`None` is one sequence. (default: :obj:`None`)
        device (torch.device, optional): where to build them (default: that of
            ``batch``, else the CPU).

    Shapes:
        - **output:** ``[N]`` int64

    Example:
        >>> from gnnattn.nn import sequence_positions
        >>> sequence_positions(5, torch.tensor([0, 0, 0, 1, 1]))
        tensor([0, 1, 2, 0, 1])
    """
    check_int(num_nodes, "num_nodes", min=0)
    if batch is None:
        return torch.arange(num_nodes, device=device)
    batch = check_batch(batch, num_nodes)
    idx = torch.arange(num_nodes, device=batch.device)
    if num_nodes == 0:
        return idx
    # The first index of each node's sequence: a running max of sequence starts.
    is_start = torch.ones_like(batch, dtype=torch.bool)
    is_start[1:] = batch[1:] != batch[:-1]
    start = torch.where(is_start, idx, torch.zeros_like(idx)).cummax(0).values
    pos = idx - start
    return pos if device is None else pos.to(device)


def _positions(x: Tensor, pos: Tensor | None, batch: Tensor | None) -> Tensor:
    if pos is not None and batch is not None:
        raise ValueError("Expected either 'pos' or 'batch', got both")
    if pos is None:
        return sequence_positions(x.shape[0], batch, device=x.device)
    if not isinstance(pos, Tensor) or pos.dtype not in (torch.int64, torch.int32):
        raise TypeError(
            f"Expected 'pos' to be an int64 Tensor, got {getattr(pos, 'dtype', type(pos))}"
        )
    if pos.shape != (x.shape[0],):
        raise ValueError(
            f"Expected 'pos' of shape [{x.shape[0]}] (one per row of x), got {list(pos.shape)}"
        )
    return pos


class SinusoidalPositionalEncoding(torch.nn.Module):
    r"""Adds the fixed sinusoids of "Attention Is All You Need" to the nodes.

    .. math::
        \mathrm{PE}(p, 2k) = \sin\!\left(p / b^{2k/D}\right), \qquad
        \mathrm{PE}(p, 2k+1) = \cos\!\left(p / b^{2k/D}\right)

    computed for any position (no maximum length, no parameters).

    Args:
        embed_dim (int): :math:`D` (even).
        base (float, optional): :math:`b`. (default: ``10000.0``)

    Shapes:
        - **input:** ``x`` ``[N, D]``, optional ``pos`` ``[N]`` or ``batch`` ``[N]``
        - **output:** ``[N, D]``

    Example:
        >>> from gnnattn.nn import SinusoidalPositionalEncoding
        >>> pe = SinusoidalPositionalEncoding(4)
        >>> pe(torch.zeros(2, 4))
        tensor([[0.0000, 1.0000, 0.0000, 1.0000],
                [0.8415, 0.5403, 0.0100, 0.9999]])
    """

    def __init__(self, embed_dim: int, base: float = 10000.0) -> None:
        super().__init__()
        check_int(embed_dim, "embed_dim", min=1)
        if embed_dim % 2:
            raise ValueError(f"Expected an even 'embed_dim' (sin/cos pairs), got {embed_dim}")
        self.embed_dim = embed_dim
        self.base = check_float(base, "base", finite=True)
        if self.base <= 0:  # log(base) below: a NaN encoding otherwise
            raise ValueError(f"Expected 'base' > 0, got {base}")

    def encoding(self, pos: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
        """The ``[N, D]`` encodings of integer positions ``pos`` ``[N]``, computed in
        float64 and rounded once to ``dtype`` (default float32)."""
        # The frequencies made per call in float64 (D/2 numbers), not kept as a buffer:
        # .half() would round a buffer, and sin(pos * freq) at pos ~ 1e3 with it.
        k = torch.arange(0, self.embed_dim, 2, dtype=torch.float64, device=pos.device)
        inv_freq = torch.exp(-math.log(self.base) * k / self.embed_dim)  # (D/2,)
        ang = pos.to(torch.float64).view(-1, 1) * inv_freq.view(1, -1)  # (N, D/2)
        pe = torch.stack([ang.sin(), ang.cos()], dim=-1)  # (N, D/2, 2)
        return pe.view(pos.shape[0], self.embed_dim).to(dtype)  # (N, D)

    def forward(
        self, x: Tensor, pos: Tensor | None = None, *, batch: Tensor | None = None
    ) -> Tensor:
        """``x + PE(pos)``; ``pos`` defaults to the positions within ``batch``'s sequences."""
        check_x(x, self.embed_dim)
        return x + self.encoding(_positions(x, pos, batch), x.dtype)

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.embed_dim})"


class LearnedPositionalEncoding(torch.nn.Module):
    r"""Adds a trained embedding of each node's position: :math:`x_i + P_{p_i}`.

    Args:
        max_len (int): number of positions (the longest sequence).
        embed_dim (int): :math:`D`.

    Shapes:
        - **input:** ``x`` ``[N, D]``, optional ``pos`` ``[N]`` or ``batch`` ``[N]``
        - **output:** ``[N, D]``

    Example:
        >>> from gnnattn.nn import LearnedPositionalEncoding
        >>> pe = LearnedPositionalEncoding(16, 8)
        >>> pe(torch.zeros(5, 8), batch=torch.tensor([0, 0, 1, 1, 1])).shape
        torch.Size([5, 8])
    """

    def __init__(self, max_len: int, embed_dim: int) -> None:
        super().__init__()
        check_int(max_len, "max_len", min=1)
        check_int(embed_dim, "embed_dim", min=1)
        self.max_len = max_len
        self.embed_dim = embed_dim
        self.embedding = torch.nn.Embedding(max_len, embed_dim)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Normal(0, 0.02) entries, as GPT-2's position table."""
        torch.nn.init.normal_(self.embedding.weight, std=0.02)

    def forward(
        self, x: Tensor, pos: Tensor | None = None, *, batch: Tensor | None = None
    ) -> Tensor:
        """``x + P[pos]``; ``pos`` defaults to the positions within ``batch``'s sequences."""
        check_x(x, self.embed_dim)
        p = _positions(x, pos, batch)
        if not torch.compiler.is_compiling() and p.numel():
            lo, hi = (int(t) for t in p.aminmax())  # one pass, one host read
            if hi >= self.max_len:
                raise ValueError(
                    f"Expected positions below max_len={self.max_len}, got {hi}; build "
                    f"the encoding with a larger max_len"
                )
            if lo < 0:
                raise ValueError(f"Expected positions >= 0 in 'pos', got {lo}")
        return x + self.embedding(p).to(x.dtype)

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.max_len}, {self.embed_dim})"


class GraphPositionalEncoding(torch.nn.Module):
    r"""Adds a linear map of a per-node structural encoding: :math:`x_i + W p_i`.

    ``pe`` is what a PyG transform stored on the data: ``AddLaplacianEigenvectorPE(k)``
    (``data.laplacian_eigenvector_pe``, the ``k`` smallest non-trivial
    eigenvectors of the Laplacian) or ``AddRandomWalkPE(k)``
    (``data.random_walk_pe``, return probabilities of 1..k-step walks).
    Eigenvectors are defined up to sign; with ``random_sign_flip=True`` each
    column's sign is flipped at random in training, so the model learns not to
    depend on it (the standard trick for Laplacian PEs).

    Args:
        pe_dim (int): width ``k`` of ``pe``.
        embed_dim (int): :math:`D`.
        random_sign_flip (bool, optional): flip column signs while training.
            (default: :obj:`False`)

    Shapes:
        - **input:** ``x`` ``[N, D]``, ``pe`` ``[N, k]``
        - **output:** ``[N, D]``

    Example:
        >>> from torch_geometric.data import Data
        >>> from torch_geometric.transforms import AddRandomWalkPE
        >>> from gnnattn.nn import GraphPositionalEncoding
        >>> data = AddRandomWalkPE(walk_length=4)(
        ...     Data(edge_index=causal_graph(5), num_nodes=5))
        >>> enc = GraphPositionalEncoding(4, 8)
        >>> enc(torch.zeros(5, 8), data.random_walk_pe).shape
        torch.Size([5, 8])
    """

    def __init__(self, pe_dim: int, embed_dim: int, *, random_sign_flip: bool = False) -> None:
        super().__init__()
        check_int(pe_dim, "pe_dim", min=1)
        check_int(embed_dim, "embed_dim", min=1)
        self.pe_dim = pe_dim
        self.embed_dim = embed_dim
        self.random_sign_flip = random_sign_flip
        self.lin = torch.nn.Linear(pe_dim, embed_dim)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.lin.reset_parameters()

    def forward(self, x: Tensor, pe: Tensor) -> Tensor:
        """``x + W pe`` (with random column signs of ``pe`` in training, if enabled)."""
        check_x(x, self.embed_dim)
        if not isinstance(pe, Tensor):
            raise TypeError(f"Expected 'pe' to be a Tensor, got {type(pe).__name__}")
        if pe.shape != (x.shape[0], self.pe_dim):
            raise ValueError(
                f"Expected 'pe' of shape [{x.shape[0]}, {self.pe_dim}] (one row per node of x), "
                f"got {list(pe.shape)}"
            )
        if self.training and self.random_sign_flip:
            sign = torch.randint(0, 2, (1, self.pe_dim), device=pe.device) * 2 - 1  # (1, k)
            pe = pe * sign.to(pe.dtype)
        return x + self.lin(pe.to(self.lin.weight.dtype)).to(x.dtype)

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.pe_dim}, {self.embed_dim})"
