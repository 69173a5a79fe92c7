"""PyG's ``GPSConv`` with its global attention per graph of the batch, without padding."""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.nn.conv import MessagePassing
from torch_geometric.nn.inits import reset
from torch_geometric.nn.resolver import activation_resolver, normalization_resolver
from torch_geometric.typing import Adj

from ..checks import check_float, check_int, check_tensor, check_x
from ..graphs import AttentionGraph
from ..ops import AttentionOutput, BackendChoice, attention, backend_for, check_backend
from ..ops import dropout as stream_dropout
from .dropout import Dropout

__all__ = ["GPSConv"]


class GPSConv(torch.nn.Module):
    r"""The GPS graph transformer layer of `"Recipe for a General, Powerful,
    Scalable Graph Transformer" <https://arxiv.org/abs/2205.12454>`_: a drop-in
    for :class:`torch_geometric.nn.GPSConv` whose global attention runs on each
    graph of the batch as it is, with no padding.

    With :math:`\mathrm{MPNN}` the local ``conv``, :math:`\mathrm{MHA}` the
    multi-head self-attention over all node pairs of one graph,
    :math:`\mathrm{N}_{1,2,3}` the norms and :math:`\mathrm{MLP}(x) = W_2\,
    \sigma(W_1 x + b_1) + b_2` (width :math:`2D`), every node :math:`i` gets

    .. math::
        h^{L}_i = \mathrm{N}_1\big(x_i + \mathrm{MPNN}(x, \mathcal{E})_i\big),
        \qquad
        h^{G}_i = \mathrm{N}_2\big(x_i + \mathrm{MHA}(x_{\mathcal{G}(i)})_i\big),

    .. math::
        h_i = h^{L}_i + h^{G}_i, \qquad
        \mathrm{out}_i = \mathrm{N}_3\big(h_i + \mathrm{MLP}(h)_i\big)

    where :math:`\mathcal{G}(i)` are the nodes of :math:`i`'s graph in
    ``batch`` (dropout after the MPNN, after the attention and in the MLP).

    The constructor, the submodules (``conv``, ``attn`` a
    :class:`torch.nn.MultiheadAttention`, ``mlp``, ``norm1``..``norm3``), the
    ``state_dict``, the ``repr`` and the outputs are PyG's, so weights load in
    both directions. The difference is the global attention: PyG pads every
    graph to the largest one (``to_dense_batch``) and masks the padding; here
    ``attn``'s projections run on the real nodes only and
    :func:`gnnattn.attention` runs on :meth:`AttentionGraph.complete
    <gnnattn.AttentionGraph.complete>` of the batch's graphs (on ``"sdpa"``,
    the graphs bucketed by size, so that none is padded to the largest). ``attn``'s
    dropout is the operator's attention dropout while training; the
    activation dropouts (``dropout``) draw from :func:`gnnattn.ops.dropout`'s
    stream (the MLP's are :class:`gnnattn.nn.Dropout`, a
    :class:`torch.nn.Dropout` without state), so in training the masks differ
    from PyG's, not their distribution.

    Args:
        channels (int): :math:`D`, the width of the nodes.
        conv (MessagePassing, optional): the local message passing layer, or
            :obj:`None` for attention only.
        heads (int, optional): attention heads; must divide ``channels``.
            (default: ``1``)
        dropout (float, optional): dropout of the intermediate embeddings, in
            ``[0, 1)``. (default: ``0.0``)
        act (str or Callable, optional): the MLP's activation, resolved as
            PyG does. (default: ``"relu"``)
        act_kwargs (Dict[str, Any], optional): arguments of ``act``.
            (default: :obj:`None`)
        norm (str or Callable, optional): the normalization, resolved as PyG
            does (:obj:`None` for none). (default: ``"batch_norm"``)
        norm_kwargs (Dict[str, Any], optional): arguments of ``norm``.
            (default: :obj:`None`)
        attn_type (str, optional): ``"multihead"``; PyG's ``"performer"`` is
            not provided (use :class:`torch_geometric.nn.GPSConv` for it).
            (default: ``"multihead"``)
        attn_kwargs (Dict[str, Any], optional): arguments of
            :class:`torch.nn.MultiheadAttention` (``dropout``, ``bias``, ...;
            not ``add_bias_kv``, ``add_zero_attn``, ``kdim``, ``vdim``).
            (default: :obj:`None`)
        backend (str, optional): the backend of :func:`gnnattn.attention`
            (``"auto"``, ``"sdpa"``, ``"fused"``, ``"mp"``); :meth:`backend_for`
            says which one a call takes and why. (default: ``"auto"``)

    Shapes:
        - **input:** ``x`` ``[|V|, D]``, ``edge_index`` (what ``conv`` takes),
          optional sorted ``batch`` ``[|V|]``, ``**kwargs`` for ``conv``
        - **output:** ``[|V|, D]``; with ``return_attention_weights=True`` also
          ``(edge_index [2, |E_G|], alpha [|E_G|, H])`` of the global attention,
          :math:`|E_G| = \sum_g |V_g|^2` (every ordered pair of nodes of one
          graph, self-pairs included)

    Example:
        >>> from torch_geometric.nn import GINConv
        >>> conv = GPSConv(16, GINConv(torch.nn.Linear(16, 16)), heads=4)
        >>> conv
        GPSConv(16, conv=GINConv(nn=Linear(in_features=16, out_features=16, bias=True)), heads=4, attn_type=multihead)
        >>> x = torch.randn(7, 16)
        >>> edge_index = torch.tensor([[0, 1, 3, 4], [1, 0, 4, 5]])
        >>> batch = torch.tensor([0, 0, 0, 1, 1, 1, 2])
        >>> conv(x, edge_index, batch).shape
        torch.Size([7, 16])
        >>> out, (attn_edges, alpha) = conv(x, edge_index, batch, return_attention_weights=True)
        >>> attn_edges.shape, alpha.shape  # 3*3 + 3*3 + 1*1 node pairs, 4 heads
        (torch.Size([2, 19]), torch.Size([19, 4]))
    """  # noqa: E501

    def __init__(
        self,
        channels: int,
        conv: MessagePassing | None,
        heads: int = 1,
        dropout: float = 0.0,
        act: str = "relu",
        act_kwargs: dict[str, Any] | None = None,
        norm: str | None = "batch_norm",
        norm_kwargs: dict[str, Any] | None = None,
        attn_type: str = "multihead",
        attn_kwargs: dict[str, Any] | None = None,
        *,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        check_int(channels, "channels", min=1)
        check_int(heads, "heads", min=1)
        if channels % heads:
            raise ValueError(
                f"Expected 'channels' divisible by 'heads', got channels={channels} and "
                f"heads={heads}"
            )
        check_float(dropout, "dropout", lo=0.0, hi=1.0)
        if attn_type == "performer":
            raise ValueError(
                "Expected attn_type='multihead', got 'performer': gnnattn's GPSConv does not "
                "provide Performer attention; use torch_geometric.nn.GPSConv(..., "
                "attn_type='performer') for it"
            )
        if attn_type != "multihead":
            raise ValueError(f"Expected 'attn_type' to be 'multihead', got {attn_type!r}")
        self.channels = channels
        self.conv = conv
        self.heads = heads
        self.dropout = dropout
        self.attn_type = attn_type
        self.backend = check_backend(backend)

        self.attn = torch.nn.MultiheadAttention(
            channels, heads, batch_first=True, **(attn_kwargs or {})
        )
        if self.attn.bias_k is not None or self.attn.add_zero_attn:
            raise ValueError(
                "Expected 'attn_kwargs' without add_bias_kv and add_zero_attn (they add keys "
                "that are no node of the graph), got them set"
            )
        if not self.attn._qkv_same_embed_dim:
            raise ValueError(
                f"Expected 'attn_kwargs' without kdim/vdim other than channels={channels} "
                f"(self-attention), got kdim={self.attn.kdim}, vdim={self.attn.vdim}"
            )

        # gnnattn's Dropout is a torch.nn.Dropout without state: the module tree,
        # the repr and the state_dict stay PyG's.
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(channels, channels * 2),
            activation_resolver(act, **(act_kwargs or {})),
            Dropout(dropout),
            torch.nn.Linear(channels * 2, channels),
            Dropout(dropout),
        )

        norm_kwargs = norm_kwargs or {}
        self.norm1 = normalization_resolver(norm, channels, **norm_kwargs)
        self.norm2 = normalization_resolver(norm, channels, **norm_kwargs)
        self.norm3 = normalization_resolver(norm, channels, **norm_kwargs)

        self.norm_with_batch = False
        if self.norm1 is not None:
            signature = inspect.signature(self.norm1.forward)
            self.norm_with_batch = "batch" in signature.parameters

    def reset_parameters(self) -> None:
        """Re-initialize every learnable parameter, as PyG's ``GPSConv`` does."""
        if self.conv is not None:
            self.conv.reset_parameters()
        self.attn._reset_parameters()
        reset(self.mlp)
        for norm in (self.norm1, self.norm2, self.norm3):
            if norm is not None:
                norm.reset_parameters()

    def forward(
        self,
        x: Tensor,
        edge_index: Adj,
        batch: Tensor | None = None,
        *,
        attn_graph: AttentionGraph | None = None,
        backend: str | None = None,
        return_attention_weights: bool = False,
        **kwargs: Any,
    ) -> Tensor | tuple[Tensor, tuple[Tensor, Tensor]]:
        """Local message passing and global attention per graph, then the MLP.

        Args:
            x (Tensor): node features ``[|V|, D]``.
            edge_index (Tensor or SparseTensor): the graph of ``conv``.
            batch (Tensor, optional): sorted graph id of every node ``[|V|]``
                (nodes of one graph contiguous, as in a PyG ``Batch``); all
                nodes form one graph when omitted. (default: :obj:`None`)
            attn_graph (AttentionGraph, optional): the global attention's graph,
                built once (``AttentionGraph.from_batch(batch)``, or any
                graph); made from ``batch`` on every call when omitted, which
                reads the graph sizes on the host (inside ``torch.compile``,
                a graph break: pass it). (default: :obj:`None`)
            backend (str, optional): overrides the layer's ``backend`` for this
                call only. (default: :obj:`None`, the layer's)
            return_attention_weights (bool, optional): also return
                ``(edge_index, alpha)`` of the global attention: its graph's
                edges (node ids of ``x``; messages ``edge_index[0] ->
                edge_index[1]``) and ``alpha [|E_G|, H]``, each target's
                softmax over the nodes of its graph, per head, before dropout
                (what ``attn(x_g, x_g, x_g, average_attn_weights=False)``
                returns for graph :math:`g`, as edges). On ``"fused"`` the
                weights are recomputed from the saved log-sum-exp and carry no
                gradient. (default: :obj:`False`)
            **kwargs: further arguments of ``conv`` (``edge_attr``, ...).
        """
        check_x(x, self.channels)
        graph = self._attn_graph(x, batch, attn_graph)  # checks batch before any work is done
        hs = []
        if self.conv is not None:  # local message passing
            h = self.conv(x, edge_index, **kwargs)
            h = stream_dropout(h, self.dropout, self.training)
            h = h + x
            hs.append(self._norm(self.norm1, h, batch))

        # Global attention, per graph.
        h, alpha = self._attention(x, graph, backend, return_attention_weights)
        h = stream_dropout(h, self.dropout, self.training)
        h = h + x
        hs.append(self._norm(self.norm2, h, batch))

        # PyG sums the list from 0; 0 + t is t exactly, so the first term starts it.
        out = hs[0] if len(hs) == 1 else hs[0] + hs[1]
        out = out + self.mlp(out)
        out = self._norm(self.norm3, out, batch)
        if alpha is not None:
            return out, (graph.edge_index, alpha)
        return out

    def backend_for(
        self,
        x: Tensor,
        batch: Tensor | None = None,
        *,
        attn_graph: AttentionGraph | None = None,
        backend: str | None = None,
    ) -> BackendChoice:
        """The backend the global attention of ``self(x, edge_index, batch,
        attn_graph=attn_graph)`` takes, and why (``edge_index`` is the local ``conv``'s
        and plays no part).

        Example:
            >>> conv = GPSConv(8, None, heads=2)
            >>> conv.backend_for(torch.randn(5, 8), torch.tensor([0, 0, 1, 1, 1])).backend
            'sdpa'
        """
        check_x(x, self.channels)
        graph = self._attn_graph(x, batch, attn_graph)
        return backend_for(
            x.new_empty(0, self.heads, self.channels // self.heads),
            graph,
            backend=self.backend if backend is None else backend,
            dropout_p=self.attn.dropout if self.training else 0.0,
        )

    def _norm(self, norm: torch.nn.Module | None, h: Tensor, batch: Tensor | None) -> Tensor:
        if norm is None:
            return h
        return norm(h, batch=batch) if self.norm_with_batch else norm(h)

    def _attention(
        self, x: Tensor, graph: AttentionGraph, backend: str | None, need_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        """``attn`` on every graph of ``graph`` (one complete block per graph), and its
        weights ``[|E_G|, H]`` when ``need_weights``."""
        n, h, c = x.shape[0], self.heads, self.channels // self.heads
        attn = self.attn
        # The packed projection, as MultiheadAttention makes it, on the real nodes only.
        qkv = F.linear(x, attn.in_proj_weight, attn.in_proj_bias).view(n, 3, h, c)
        q, k, v = qkv.unbind(1)  # (N, H, C) each
        res = attention(
            q,
            k,
            v,
            graph,
            dropout_p=attn.dropout if self.training else 0.0,
            backend=self.backend if backend is None else backend,
            need_weights=need_weights,
        )
        out, alpha = (res.out, res.weights) if isinstance(res, AttentionOutput) else (res, None)
        return attn.out_proj(out.reshape(n, self.channels)), alpha  # (N, D), (E_G, H)

    def _attn_graph(
        self, x: Tensor, batch: Tensor | None, attn_graph: AttentionGraph | None
    ) -> AttentionGraph:
        """The global attention's graph: ``attn_graph`` checked, or made from ``batch``."""
        if attn_graph is None:
            return self._graph(x, batch)
        if not isinstance(attn_graph, AttentionGraph):
            raise TypeError(
                f"Expected 'attn_graph' to be an AttentionGraph, got {type(attn_graph).__name__}"
            )
        attn_graph.check_nodes(x.shape[0], x.shape[0], x.device)
        return attn_graph

    def _graph(self, x: Tensor, batch: Tensor | None) -> AttentionGraph:
        """The complete graph of each graph of ``batch``, from one read of the lengths.

        ``check_batch`` and ``AttentionGraph.complete(batch=...)`` would each
        read the device; here the order check, the sign check and the lengths
        travel to the host together (one synchronisation on a GPU: the
        lengths are the graph's structure, so one is unavoidable).
        """
        n = x.shape[0]
        if batch is None:
            return AttentionGraph.complete(lengths=[n] if n else [], device=x.device)
        b = check_tensor(batch, "batch")
        if b.dim() != 1 or b.numel() != n:
            raise ValueError(
                f"Expected 'batch' of shape [{n}] (one graph id per row of x), got {list(b.shape)}"
            )
        if b.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"Expected 'batch' of dtype torch.int64, got {b.dtype}")
        if b.device != x.device:
            raise ValueError(
                f"Expected 'batch' on device {x.device} (the device of x), got {b.device}"
            )
        if n == 0:
            return AttentionGraph.complete(lengths=[], device=x.device)
        b = b.long()
        # Clamped so that a negative id reaches the check below instead of
        # bincount's error.
        counts = torch.bincount(b.clamp_min(0))
        flags = torch.stack([(b[1:] < b[:-1]).any(), b[0] < 0]).long()
        host = torch.cat([flags, counts]).tolist()
        if host[0]:
            raise ValueError(
                "Expected 'batch' to be sorted (the nodes of one graph contiguous, as in a "
                "PyG Batch), got an unsorted vector; sort the nodes by graph first"
            )
        if host[1]:
            raise ValueError(f"Expected 'batch' to hold graph ids >= 0, got {int(b.min())}")
        # Ids that no node carries (gaps) are empty graphs: PyG's to_dense_batch
        # drops their all-padding rows, so they have no block here.
        return AttentionGraph.complete(lengths=[c for c in host[2:] if c], device=x.device)

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}({self.channels}, conv={self.conv}, "
            f"heads={self.heads}, attn_type={self.attn_type})"
        )
