"""PyG's ``GPSConv`` with its global attention per graph of the batch, without padding, or
over Exphormer's sparse graph (input edges, an expander, virtual nodes)."""

from __future__ import annotations

import inspect
from types import MappingProxyType
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.nn.conv import MessagePassing
from torch_geometric.nn.inits import reset
from torch_geometric.nn.resolver import activation_resolver, normalization_resolver
from torch_geometric.typing import Adj

from ..checks import (
    check_edge_input,
    check_int,
    check_like,
    check_probability,
    check_tensor,
    check_x,
)
from ..graphs import (
    AttentionGraph,
    ComposedGraph,
    check_batch,
    exphormer_graph,
    refuse_jit_trace,
)
from ..kernels.common import outside_func_transforms, plain_index
from ..ops import AttentionOutput, BackendChoice, attention, backend_for, check_backend
from ..ops import dropout as stream_dropout
from .bias import check_attn_bias
from .dropout import Dropout

__all__ = ["GPSConv"]

#: The global attentions GPSConv provides.
ATTN_TYPES = ("multihead", "exphormer")
#: attn_kwargs of attn_type="exphormer" (with their defaults) that are not
#: MultiheadAttention's: they shape the Exphormer graph.
EXPHORMER_KWARGS = MappingProxyType({"expander_degree": 3, "virtual_nodes": 1, "seed": 0})


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
    both directions (``attn``'s weights are read, the module itself is not
    called: forward hooks on ``attn`` do not run). The difference is the
    global attention: PyG pads every
    graph to the largest one (``to_dense_batch``) and masks the padding; here
    ``attn``'s projections run on the real nodes only and
    :func:`gnnattn.attention` runs on :meth:`AttentionGraph.complete
    <gnnattn.AttentionGraph.complete>` of the batch's graphs (on ``"sdpa"``,
    the graphs bucketed by size, so that none is padded to the largest; on
    the CPU, graphs of different sizes up to 128 nodes, float32 or float64
    and without attention dropout, all in one call of the block kernel,
    unpadded). ``attn``'s
    dropout is the operator's attention dropout while training; the
    activation dropouts (``dropout``) draw from :func:`gnnattn.ops.dropout`'s
    stream (the MLP's are :class:`gnnattn.nn.Dropout`, a
    :class:`torch.nn.Dropout` without state), so in training the masks differ
    from PyG's, not their distribution.

    **Exphormer** (gnnattn's addition, ``attn_type="exphormer"``; `Shirzad et
    al., ICML 2023 <https://arxiv.org/abs/2303.06147>`_): :math:`\mathcal{G}(i)`
    becomes :math:`i`'s neighbours in :func:`~gnnattn.exphormer_graph` of the
    batch: its input edges both ways, a random expander of degree
    ``attn_kwargs["expander_degree"]`` (3) within each graph, the
    ``attn_kwargs["virtual_nodes"]`` (1) virtual nodes of its graph, and
    itself, so the attention costs :math:`O(|V| + |E|)` instead of
    :math:`O(\sum_g |V_g|^2)` and runs on graphs of a million nodes. The graph
    is built on each call from ``edge_index`` and ``batch`` (the expander drawn
    from ``attn_kwargs["seed"]`` (0): the same batch, the same graph), or
    passed once as ``attn_graph``. The virtual nodes' rows are the layer's
    parameter ``virtual_embedding`` ``[k, D]`` (one row per virtual node of a
    graph, the same for every graph), appended to ``x`` for the projections:
    they are keys and values every node can read, and queries whose outputs
    are dropped (the layer returns the real nodes, as PyG's does). As in
    Exphormer's layers a virtual node reaches every node of its graph in one
    hop and the expander any node in a few; unlike Exphormer's stack, whose
    virtual states pass from layer to layer, each layer here starts its
    virtual nodes from its own embedding. BigBird attention (PyG's open
    pyg-team/pytorch_geometric#10598) is not provided yet: it waits for the
    block-tile kernels.

    **Attention bias** (gnnattn's addition, `PyG#9511
    <https://github.com/pyg-team/pytorch_geometric/issues/9511>`_): a call's
    ``attn_bias`` :math:`b_{ij}^h` ``[|E_G|, H]``, and with ``attn_edge_dim``
    a call's ``attn_edge_attr`` :math:`e_{ij}` through ``attn_edge`` (a
    bias-free ``Linear(attn_edge_dim, H)``), are added to the global
    attention's scores (a shortest-path distance, a random-walk encoding of
    the pair, the kind of an Exphormer edge), one row per edge of the
    attention graph in its ``edge_index`` order; on the fused kernels, for
    either ``attn_type``.

    Args:
        channels (int): :math:`D`, the width of the nodes.
        conv (MessagePassing, optional): the local message passing layer, or
            :obj:`None` for attention only.
        heads (int, optional): attention heads; must divide ``channels``.
            (default: ``1``)
        dropout (float, optional): dropout of the intermediate embeddings, in
            ``[0, 1]``. (default: ``0.0``)
        act (str or Callable, optional): the MLP's activation, resolved as
            PyG does. (default: ``"relu"``)
        act_kwargs (Dict[str, Any], optional): arguments of ``act``.
            (default: :obj:`None`)
        norm (str or Callable, optional): the normalization, resolved as PyG
            does (:obj:`None` for none). (default: ``"batch_norm"``)
        norm_kwargs (Dict[str, Any], optional): arguments of ``norm``.
            (default: :obj:`None`)
        attn_type (str, optional): ``"multihead"`` (every pair of nodes of a
            graph) or ``"exphormer"`` (gnnattn's: the Exphormer graph, above);
            PyG's ``"performer"`` is not provided (use
            :class:`torch_geometric.nn.GPSConv` for it). (default: ``"multihead"``)
        attn_kwargs (Dict[str, Any], optional): arguments of
            :class:`torch.nn.MultiheadAttention` (``dropout``, ``bias``, ...;
            not ``add_bias_kv``, ``add_zero_attn``, ``kdim``, ``vdim``); with
            ``attn_type="exphormer"`` also ``expander_degree`` (3),
            ``virtual_nodes`` (1) and ``seed`` (0) of its graph.
            (default: :obj:`None`)
        backend (str, optional): the backend of :func:`gnnattn.attention`
            (``"auto"``, ``"sdpa"``, ``"fused"``, ``"mp"``); :meth:`backend_for`
            says which one a call takes and why. (default: ``"auto"``)
        attn_edge_dim (int, optional): gnnattn's: the width of a call's
            ``attn_edge_attr``, mapped to one score bias per head.
            (default: :obj:`None`)

    Shapes:
        - **input:** ``x`` ``[|V|, D]``, ``edge_index`` (what ``conv`` takes),
          optional sorted ``batch`` ``[|V|]``, ``**kwargs`` for ``conv``
        - **output:** ``[|V|, D]``; with ``return_attention_weights=True`` also
          ``(edge_index [2, |E_G|], alpha [|E_G|, H])`` of the global attention,
          :math:`|E_G| = \sum_g |V_g|^2` (every ordered pair of nodes of one
          graph, self-pairs included; for ``"exphormer"`` the Exphormer
          graph's edges, virtual nodes numbered from :math:`|V|`)
        - **attn_bias:** ``[|E_G|, H]``; **attn_edge_attr:**
          ``[|E_G|, attn_edge_dim]``

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
        >>> exp = GPSConv(16, None, heads=4, attn_type="exphormer", attn_kwargs={"seed": 1})
        >>> exp.virtual_embedding.shape  # one virtual node per graph
        torch.Size([1, 16])
        >>> exp(x, edge_index, batch).shape
        torch.Size([7, 16])
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
        attn_edge_dim: int | None = None,
    ) -> None:
        super().__init__()
        check_int(channels, "channels", min=1)
        check_int(heads, "heads", min=1)
        if channels % heads:
            raise ValueError(
                f"Expected 'channels' divisible by 'heads', got channels={channels} and "
                f"heads={heads}"
            )
        check_probability(dropout, "dropout")
        if attn_type == "performer":
            raise ValueError(
                "Expected attn_type 'multihead' or 'exphormer', got 'performer': gnnattn's "
                "GPSConv does not provide Performer attention; use "
                "torch_geometric.nn.GPSConv(..., attn_type='performer') for it"
            )
        if attn_type not in ATTN_TYPES:
            hint = (
                " (BigBird attention is not provided yet: it waits for the block-tile kernels)"
                if attn_type == "bigbird"
                else ""
            )
            raise ValueError(
                f"Expected 'attn_type' to be one of {ATTN_TYPES}, got {attn_type!r}{hint}"
            )
        check_int(attn_edge_dim, "attn_edge_dim", min=1, optional=True)
        attn_kwargs = dict(attn_kwargs or {})
        graph_kwargs = {k: attn_kwargs.pop(k) for k in EXPHORMER_KWARGS if k in attn_kwargs}
        if graph_kwargs and attn_type != "exphormer":
            raise ValueError(
                f"Expected 'attn_kwargs' without {sorted(graph_kwargs)} with attn_type="
                f"{attn_type!r} (they shape the Exphormer graph), got them; use "
                f"attn_type='exphormer'"
            )
        graph_kwargs = {**EXPHORMER_KWARGS, **graph_kwargs}
        for name, value in graph_kwargs.items():
            check_int(value, f"attn_kwargs['{name}']")
        self.expander_degree = graph_kwargs["expander_degree"]
        self.virtual_nodes = graph_kwargs["virtual_nodes"] if attn_type == "exphormer" else 0
        self.seed = graph_kwargs["seed"]
        self.channels = channels
        self.conv = conv
        self.heads = heads
        self.dropout = dropout
        self.attn_type = attn_type
        self.backend = check_backend(backend)

        self.attn = torch.nn.MultiheadAttention(channels, heads, batch_first=True, **attn_kwargs)
        check_probability(self.attn.dropout, "attn_kwargs['dropout']")
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

        # gnnattn's additions, made last so that PyG's modules draw the same
        # initial weights as PyG's layer; absent (no state_dict entry) unless asked for.
        self.attn_edge_dim = attn_edge_dim
        self.attn_edge: torch.nn.Linear | None = None
        if attn_edge_dim is not None:
            self.attn_edge = torch.nn.Linear(attn_edge_dim, heads, bias=False)
        self.virtual_embedding: torch.nn.Parameter | None
        if self.virtual_nodes:
            self.virtual_embedding = torch.nn.Parameter(torch.empty(self.virtual_nodes, channels))
            self._reset_virtual()
        else:
            self.register_parameter("virtual_embedding", None)

    def _reset_virtual(self) -> None:
        if self.virtual_embedding is not None:
            # As Exphormer's nn.Embedding: N(0, 1), the scale of normalized features.
            torch.nn.init.normal_(self.virtual_embedding)

    def reset_parameters(self) -> None:
        """Re-initialize every learnable parameter, as at construction (PyG's ``GPSConv``
        leaves ``attn.out_proj.weight`` as it is)."""
        if self.conv is not None:
            self.conv.reset_parameters()
        # As a new MultiheadAttention: out_proj's weight by its Linear (which
        # _reset_parameters leaves out), then in_proj and a zero out_proj.bias.
        self.attn.out_proj.reset_parameters()
        self.attn._reset_parameters()
        reset(self.mlp)
        for norm in (self.norm1, self.norm2, self.norm3):
            if norm is not None:
                norm.reset_parameters()
        if self.attn_edge is not None:
            self.attn_edge.reset_parameters()
        self._reset_virtual()

    def forward(
        self,
        x: Tensor,
        edge_index: Adj,
        batch: Tensor | None = None,
        *,
        attn_graph: AttentionGraph | None = None,
        attn_bias: Tensor | None = None,
        attn_edge_attr: Tensor | None = None,
        backend: str | None = None,
        return_attention_weights: bool = False,
        **kwargs: Any,
    ) -> Tensor | tuple[Tensor, tuple[Tensor, Tensor]]:
        """Local message passing and global attention per graph, then the MLP.

        Args:
            x (Tensor): node features ``[|V|, D]``.
            edge_index (Tensor or SparseTensor): the graph of ``conv`` (with
                ``"exphormer"`` and no ``attn_graph``, also the input edges of
                the attention graph: a ``[2, |E|]`` tensor, an ``EdgeIndex`` or
                a ``torch.sparse`` ``adj_t``).
            batch (Tensor, optional): sorted graph id of every node ``[|V|]``
                (nodes of one graph contiguous, as in a PyG ``Batch``); all
                nodes form one graph when omitted. (default: :obj:`None`)
            attn_graph (AttentionGraph, optional): the global attention's graph,
                built once (``AttentionGraph.from_batch(batch)``, or any
                graph; for ``"exphormer"`` the :class:`~gnnattn.ComposedGraph`
                of :func:`~gnnattn.exphormer_graph` with the layer's
                ``virtual_nodes``); made from ``batch`` (and ``edge_index``)
                on every call when omitted, which reads the graph sizes on the
                host (inside ``torch.compile``, a graph break: pass it).
                (default: :obj:`None`)
            attn_bias (Tensor, optional): gnnattn's: ``[|E_G|, H]`` added to
                the global attention's scores, one row per edge of its graph
                in that graph's ``edge_index`` order. (default: :obj:`None`)
            attn_edge_attr (Tensor, optional): gnnattn's: ``[|E_G|,
                attn_edge_dim]`` features of the attention graph's edges,
                mapped by ``attn_edge`` to a score bias per head (needs
                ``attn_edge_dim``). (default: :obj:`None`)
            backend (str, optional): overrides the layer's ``backend`` for this
                call only. (default: :obj:`None`, the layer's)
            return_attention_weights (bool, optional): also return
                ``(edge_index, alpha)`` of the global attention: its graph's
                edges (node ids of ``x``, then the virtual nodes; messages
                ``edge_index[0] -> edge_index[1]``) and ``alpha [|E_G|, H]``,
                each target's softmax over its neighbours, per head, before
                dropout (for ``"multihead"``, what ``attn(x_g, x_g, x_g,
                average_attn_weights=False)`` returns for graph :math:`g` in
                eval mode, as edges; in training ``MultiheadAttention``
                returns them after its dropout), differentiable on every
                backend. (default: :obj:`False`)
            **kwargs: further arguments of ``conv`` (``edge_attr``, ...).
        """
        check_x(x, self.channels)
        check_like(x, self.attn.in_proj_weight)
        # The graph and the bias are checked before any work is done.
        graph = self._attn_graph(x, edge_index, batch, attn_graph)
        bias = self._score_bias(x, graph, attn_bias, attn_edge_attr)
        hs = []
        if self.conv is not None:  # local message passing
            h = self.conv(x, edge_index, **kwargs)
            h = stream_dropout(h, self.dropout, self.training)
            h = h + x
            hs.append(self._norm(self.norm1, h, batch))

        # Global attention, per graph.
        h, alpha = self._attention(x, graph, bias, backend, return_attention_weights)
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
        edge_index: Adj | None = None,
        attn_graph: AttentionGraph | None = None,
        attn_bias: Tensor | None = None,
        attn_edge_attr: Tensor | None = None,
        backend: str | None = None,
    ) -> BackendChoice:
        """The backend the global attention of ``self(x, edge_index, batch,
        attn_graph=attn_graph, attn_bias=attn_bias, attn_edge_attr=attn_edge_attr)``
        takes, and why (``edge_index`` plays a part only in an ``"exphormer"``
        layer without ``attn_graph``, whose graph is built from it).

        Example:
            >>> conv = GPSConv(8, None, heads=2)
            >>> conv.backend_for(torch.randn(5, 8), torch.tensor([0, 0, 1, 1, 1])).backend
            'sdpa'
        """
        check_x(x, self.channels)
        graph = self._attn_graph(x, edge_index, batch, attn_graph)
        bias = self._score_bias(x, graph, attn_bias, attn_edge_attr)
        return backend_for(
            x.new_empty(0, self.heads, self.channels // self.heads),
            graph,
            backend=self.backend if backend is None else backend,
            score_bias=bias is not None,
            dropout_p=self.attn.dropout if self.training else 0.0,
        )

    def _norm(self, norm: torch.nn.Module | None, h: Tensor, batch: Tensor | None) -> Tensor:
        if norm is None:
            return h
        return norm(h, batch=batch) if self.norm_with_batch else norm(h)

    def _attention(
        self,
        x: Tensor,
        graph: AttentionGraph,
        score_bias: Tensor | None,
        backend: str | None,
        need_weights: bool,
    ) -> tuple[Tensor, Tensor | None]:
        """``attn`` over ``graph`` (one complete block per graph, or the Exphormer
        graph with the virtual nodes' rows after ``x``), and its weights
        ``[|E_G|, H]`` when ``need_weights``."""
        n, h, c = x.shape[0], self.heads, self.channels // self.heads
        attn = self.attn
        # The packed projection, as MultiheadAttention makes it, on the graph's nodes only.
        qkv = F.linear(x, attn.in_proj_weight, attn.in_proj_bias)
        q, k, v = qkv.view(n, 3, h, c).unbind(1)  # (N, H, C) each
        # Only the views hold it now: joined with the virtual rows, the packed [N, 3D]
        # tensor is freed before the kernels run (768 MB at a million nodes).
        del qkv
        if isinstance(graph, ComposedGraph) and graph.composition.num_virtual:
            q, k, v = self._with_virtual(graph, q, k, v)  # (M, H, C), M = N + virtual
        res = attention(
            q,
            k,
            v,
            graph,
            score_bias=score_bias,
            dropout_p=self.attn.dropout if self.training else 0.0,
            backend=self.backend if backend is None else backend,
            need_weights=need_weights,
        )
        out, alpha = (res.out, res.weights) if isinstance(res, AttentionOutput) else (res, None)
        # The virtual nodes' outputs are dropped: the layer returns the real nodes.
        return attn.out_proj(out[:n].reshape(n, self.channels)), alpha  # (N, D), (E_G, H)

    def _with_virtual(
        self, graph: ComposedGraph, q: Tensor, k: Tensor, v: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """``q``, ``k``, ``v`` of the real nodes followed by the virtual nodes' (the
        projections of their rows of ``virtual_embedding``), ``[M, H, C]`` each.

        Each is one ``cat`` of the two parts, which is also the contiguous copy
        the fused kernels take. Projecting ``[x; virtual]`` instead would keep
        that ``[M, D]`` concatenation for the backward and give strided views,
        which the kernels' call copies again: at a million nodes 256 MB more
        held and 256 MB more made.
        """
        assert self.virtual_embedding is not None  # checked with the graph
        h, c = q.shape[1], q.shape[2]
        virtual = self.virtual_embedding.index_select(0, graph.composition.virtual_index())
        # (V, D): row t of the table for virtual node t of every graph, and its q, k, v.
        attn = self.attn
        vqkv = F.linear(virtual.to(q.dtype), attn.in_proj_weight, attn.in_proj_bias)
        vq, vk, vv = vqkv.view(-1, 3, h, c).unbind(1)
        return torch.cat([q, vq]), torch.cat([k, vk]), torch.cat([v, vv])

    def _score_bias(
        self,
        x: Tensor,
        graph: AttentionGraph,
        attn_bias: Tensor | None,
        attn_edge_attr: Tensor | None,
    ) -> Tensor | None:
        """The score bias of the global attention, ``[|E_G|, H]``: ``attn_bias`` plus
        ``attn_edge(attn_edge_attr)``, each checked against the graph; or ``None``."""
        bias = None
        if attn_bias is not None:
            bias = check_attn_bias(attn_bias, graph, self.heads, x.device)
        if self.attn_edge is None:
            if attn_edge_attr is not None:
                raise ValueError(
                    "Got 'attn_edge_attr' but the layer has attn_edge_dim=None; build it with "
                    "GPSConv(..., attn_edge_dim=attn_edge_attr.shape[1])"
                )
            return bias
        if attn_edge_attr is None:
            raise ValueError(
                f"Expected 'attn_edge_attr' of shape [{graph.num_edges}, {self.attn_edge_dim}] "
                f"(the layer has attn_edge_dim={self.attn_edge_dim}), got None"
            )
        ea = check_tensor(attn_edge_attr, "attn_edge_attr")
        if ea.dim() != 2 or ea.shape[1] != self.attn_edge_dim:
            raise ValueError(
                f"Expected 'attn_edge_attr' of shape [{graph.num_edges}, {self.attn_edge_dim}] "
                f"(one row per edge of the attention graph), got {list(ea.shape)}"
            )
        check_edge_input(ea, x, "attn_edge_attr")
        mapped = self.attn_edge(graph.select_edges(ea, "attn_edge_attr"))  # (E_G, H)
        return mapped if bias is None else mapped + bias

    def _attn_graph(
        self,
        x: Tensor,
        edge_index: Adj | None,
        batch: Tensor | None,
        attn_graph: AttentionGraph | None,
    ) -> AttentionGraph:
        """The global attention's graph: ``attn_graph`` checked, or made from ``batch``
        (and, for ``"exphormer"``, ``edge_index``)."""
        if attn_graph is None:
            if batch is not None:
                batch = plain_index(check_tensor(batch, "batch"), "batch")
            edge_index = plain_index(edge_index, "edge_index")
            # Built on the host from ids, never from a torch.func transform's tensors.
            with outside_func_transforms():
                if self.attn_type == "exphormer":
                    return self._exphormer_graph(x, edge_index, batch)
                return self._graph(x, batch)
        if not isinstance(attn_graph, AttentionGraph):
            raise TypeError(
                f"Expected 'attn_graph' to be an AttentionGraph, got {type(attn_graph).__name__}"
            )
        n = x.shape[0]
        if self.attn_type != "exphormer":
            attn_graph.check_nodes(n, n, x.device)
            return attn_graph
        k = self.virtual_nodes
        if isinstance(attn_graph, ComposedGraph):
            comp = attn_graph.composition
            # Also a graph without any (k = 0): the layer's virtual embedding would go unused.
            if comp.virtual_per_graph != k:
                raise ValueError(
                    f"Expected an 'attn_graph' with {k} virtual node(s) per graph (the layer's "
                    f"virtual_nodes), got {comp.virtual_per_graph}"
                )
            if comp.num_real != n:
                raise ValueError(
                    f"Expected an 'attn_graph' of {n} real nodes (the rows of x), got "
                    f"{comp.num_real}"
                )
            attn_graph.check_nodes(attn_graph.num_nodes, attn_graph.num_nodes, x.device)
            return attn_graph
        if k:
            raise ValueError(
                f"Expected an 'attn_graph' with the layer's {k} virtual node(s) per graph "
                f"(made by exphormer_graph or with_virtual_nodes), got a plain AttentionGraph "
                f"of {attn_graph.num_nodes} nodes for {n} rows of x"
            )
        attn_graph.check_nodes(n, n, x.device)
        return attn_graph

    def _exphormer_graph(
        self, x: Tensor, edge_index: Adj | None, batch: Tensor | None
    ) -> AttentionGraph:
        """:func:`~gnnattn.exphormer_graph` of the call's edges and batch."""
        refuse_jit_trace()
        n = x.shape[0]
        if edge_index is None:
            raise ValueError(
                "Expected 'edge_index' (the Exphormer graph is built from it) or 'attn_graph', "
                "got neither"
            )
        if batch is not None:
            batch = check_batch(batch, n, device=x.device)
        ei = check_tensor(edge_index, "edge_index")
        if ei.layout != torch.strided:
            ei = AttentionGraph(ei, n).edge_index  # a torch.sparse adj_t: its edges
        if ei.device != x.device:
            raise ValueError(
                f"Expected 'edge_index' on device {x.device} (the device of x), got {ei.device}"
            )
        return exphormer_graph(
            ei,
            n,
            expander_degree=self.expander_degree,
            virtual_nodes=self.virtual_nodes,
            seed=self.seed,
            batch=batch,
        )

    def _graph(self, x: Tensor, batch: Tensor | None) -> AttentionGraph:
        """The complete graph of each graph of ``batch``, from one read of the lengths.

        ``check_batch`` and ``AttentionGraph.complete(batch=...)`` would each
        read the device; here the order check, the sign check and the lengths
        travel to the host together (one synchronisation on a GPU: the
        lengths are the graph's structure, so one is unavoidable).
        """
        refuse_jit_trace()
        n = x.shape[0]
        if batch is None:
            return AttentionGraph.complete(lengths=[n] if n else [], device=x.device)
        b = check_tensor(batch, "batch")
        if b.dim() != 1 or b.numel() != n:
            raise ValueError(
                f"Expected 'batch' of shape [{n}] (one graph id per row of x), got {list(b.shape)}"
            )
        if b.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"Expected 'batch' of dtype torch.int64 or torch.int32, got {b.dtype}")
        if b.device != x.device:
            raise ValueError(
                f"Expected 'batch' on device {x.device} (the device of x), got {b.device}"
            )
        if n == 0:
            return AttentionGraph.complete(lengths=[], device=x.device)
        if b.device.type == "cpu":
            # One compiled pass (the torch ops below are six, on a batch of molecules
            # a twentieth of a GPSConv step).
            from ..kernels.cpu.host import batch_lengths

            found = batch_lengths(b)
            unsorted, negative = found == "unsorted", found == "negative"
            lengths = found if isinstance(found, list) else []
        else:
            b = b.long()
            # The runs of equal ids (a huge id costs nothing; gaps make no run).
            counts = torch.unique_consecutive(b, return_counts=True)[1]
            flags = torch.stack([(b[1:] < b[:-1]).any(), b[0] < 0]).long()
            host = torch.cat([flags, counts]).tolist()
            unsorted, negative, lengths = bool(host[0]), bool(host[1]), host[2:]
        if unsorted:
            raise ValueError(
                "Expected 'batch' to be sorted (the nodes of one graph contiguous, as in a "
                "PyG Batch), got an unsorted vector; sort the nodes by graph first"
            )
        if negative:
            raise ValueError(f"Expected 'batch' to hold graph ids >= 0, got {int(b.min())}")
        # Ids that no node carries (gaps) are empty graphs: PyG's to_dense_batch
        # drops their all-padding rows, so they have no block here (no run).
        return AttentionGraph.complete(lengths=lengths, device=x.device)

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}({self.channels}, conv={self.conv}, "
            f"heads={self.heads}, attn_type={self.attn_type})"
        )
