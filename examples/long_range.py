"""A long-range task: local message passing vs GPS with Exphormer and with full attention.

Every graph is a path of ``--nodes`` nodes. Its first node carries one of four
colours; every node must output that colour. A node ``L`` hops or more from the
first one cannot see it through ``L`` layers of local message passing, so a
local MPNN is right there only by chance (one in four). Global attention
reaches it: full attention in one hop, Exphormer's graph (the path both ways,
a random 3-regular expander, one virtual node per graph, self-loops; see
:func:`gnnattn.exphormer_graph`) in a few. The three models have ``--layers``
layers each and about the same number of parameters (the MPNN is wider):

* a local MPNN: GIN layers with residuals;
* GPS with Exphormer attention: ``GPSConv(attn_type="exphormer")`` around the
  same GIN layer, the batch's graph built once per step and passed to every
  layer (``attn_graph=``), with a learned score bias per edge kind and head
  (``attn_bias=``: a path edge, an expander edge, a virtual one);
* GPS with full attention: ``GPSConv(attn_type="multihead")``, every pair of
  nodes of a graph (fits at these sizes; its cost is quadratic per graph).

The table gives test accuracy over all nodes and the median training time of an
epoch: a process's first epoch also pays one-off costs (the fused kernels'
compile or load, first calls), which a total over the epochs charged to
whichever model ran first.

    python examples/long_range.py            # 64-node paths, 4 layers
    python examples/long_range.py --quick    # 32-node paths, 3 layers: under a minute

The last line printed is ``RESULT {...}`` (also written to ``long_range.json`` in --out).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.nn import GINConv

from gnnattn import exphormer_graph
from gnnattn.graphs import EDGE_KINDS
from gnnattn.nn import GPSConv

COLOURS = 4


def paths(num_graphs: int, n: int, gen: torch.Generator) -> dict[str, Tensor]:
    """A batch of ``num_graphs`` paths of ``n`` nodes: ``x`` (the first node's colour,
    one-hot, and a flag for it), ``edge_index`` (both ways), ``batch``, ``y``."""
    colour = torch.randint(0, COLOURS, (num_graphs,), generator=gen)
    x = torch.zeros(num_graphs, n, COLOURS + 1)
    x[:, 0, :COLOURS] = F.one_hot(colour, COLOURS).float()
    x[:, 0, COLOURS] = 1.0
    step = torch.stack([torch.arange(n - 1), torch.arange(1, n)])
    offsets = (torch.arange(num_graphs) * n).repeat_interleave(n - 1)
    one_way = step.repeat(1, num_graphs) + offsets
    return {
        "x": x.view(-1, COLOURS + 1),
        "edge_index": torch.cat([one_way, one_way.flip(0)], 1),
        "batch": torch.arange(num_graphs).repeat_interleave(n),
        "y": colour.repeat_interleave(n),
    }


def gin(dim: int) -> GINConv:
    mlp = torch.nn.Sequential(torch.nn.Linear(dim, dim), torch.nn.ReLU(), torch.nn.Linear(dim, dim))
    return GINConv(mlp)


class LocalMPNN(torch.nn.Module):
    """GIN layers with residuals: each layer reaches one hop further."""

    def __init__(self, dim: int, layers: int):
        super().__init__()
        self.embed = torch.nn.Linear(COLOURS + 1, dim)
        self.convs = torch.nn.ModuleList(gin(dim) for _ in range(layers))
        self.head = torch.nn.Linear(dim, COLOURS)

    def forward(self, data: dict[str, Tensor], seed: int) -> Tensor:
        h = self.embed(data["x"])
        for conv in self.convs:
            h = h + F.relu(conv(h, data["edge_index"]))
        return self.head(h)


class GPS(torch.nn.Module):
    """GPSConv layers (local GIN + global attention) with ``attn_type`` attention."""

    def __init__(self, dim: int, layers: int, attn_type: str, heads: int = 4):
        super().__init__()
        self.attn_type = attn_type
        self.embed = torch.nn.Linear(COLOURS + 1, dim)
        self.convs = torch.nn.ModuleList(
            GPSConv(dim, gin(dim), heads=heads, attn_type=attn_type) for _ in range(layers)
        )
        # Exphormer only: a learned score bias per edge kind and head, shared by the layers.
        self.kind_bias = (
            torch.nn.Embedding(len(EDGE_KINDS), heads) if attn_type == "exphormer" else None
        )
        self.head = torch.nn.Linear(dim, COLOURS)

    def forward(self, data: dict[str, Tensor], seed: int) -> Tensor:
        h, ei, batch = self.embed(data["x"]), data["edge_index"], data["batch"]
        extra = {}
        if self.kind_bias is not None:
            # Built once per batch, for every layer; the seed draws its expander.
            graph = exphormer_graph(ei, batch=batch, expander_degree=3, virtual_nodes=1, seed=seed)
            bias = self.kind_bias(graph.composition.edge_kind.long())  # (E_attn, H)
            extra = {"attn_graph": graph, "attn_bias": bias}
        for conv in self.convs:
            h = conv(h, ei, batch, **extra)
        return self.head(h)


def train(model: torch.nn.Module, train_set: list, test_set: list, epochs: int) -> dict:
    """Adam on the batches of ``train_set``; accuracy on ``test_set``, median time of an
    epoch."""
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    times = []
    for epoch in range(epochs):
        start = time.perf_counter()
        model.train()
        for i, data in enumerate(train_set):
            loss = F.cross_entropy(model(data, seed=epoch * len(train_set) + i), data["y"])
            opt.zero_grad()
            loss.backward()
            opt.step()
        times.append(time.perf_counter() - start)
    per_epoch = statistics.median(times)
    model.eval()
    right = total = 0
    with torch.no_grad():
        for i, data in enumerate(test_set):
            right += int((model(data, seed=10**6 + i).argmax(-1) == data["y"]).sum())
            total += data["y"].numel()
    params = sum(p.numel() for p in model.parameters())
    return {"params": params, "accuracy": right / total, "s_per_epoch": per_epoch}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer graphs and epochs, under a minute")
    p.add_argument("--nodes", type=int, default=None, help="nodes per path (64; quick: 32)")
    p.add_argument("--layers", type=int, default=None, help="layers of each model (4; quick: 3)")
    p.add_argument("--dim", type=int, default=32, help="width of the GPS models")
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("gnnattn-demo-out"))
    args = p.parse_args(argv)
    nodes, layers = (
        args.nodes or (32 if args.quick else 64),
        args.layers or (3 if args.quick else 4),
    )
    epochs = args.epochs or 20
    batches, size = (8, 16) if args.quick else (16, 32)  # training batches, graphs per batch
    args.out.mkdir(parents=True, exist_ok=True)

    gen = torch.Generator().manual_seed(args.seed)
    train_set = [paths(size, nodes, gen) for _ in range(batches)]
    test_set = [paths(32, nodes, gen) for _ in range(4)]
    # GPS layers hold about 5x the parameters of a GIN layer: the MPNN is sqrt(5)x wider.
    models = {
        "local MPNN (GIN)": lambda: LocalMPNN(int(args.dim * 5**0.5), layers),
        "GPS + Exphormer": lambda: GPS(args.dim, layers, "exphormer"),
        "GPS + full attention": lambda: GPS(args.dim, layers, "multihead"),
    }
    rows = {}
    for name, make in models.items():
        torch.manual_seed(args.seed)
        rows[name] = train(make(), train_set, test_set, epochs)
    print(f"paths of {nodes} nodes, {layers} layers, {epochs} epochs; chance is 0.25")
    print("| model | params | accuracy | time/epoch (median) |\n| --- | ---: | ---: | ---: |")
    for name, r in rows.items():
        ms = r["s_per_epoch"] * 1e3
        print(f"| {name} | {r['params']:,} | {r['accuracy']:.3f} | {ms:.0f} ms |")
    result = {"nodes": nodes, "layers": layers, "epochs": epochs, "models": rows}
    (args.out / "long_range.json").write_text(json.dumps(result, indent=2))
    print("RESULT " + json.dumps(result))
    return result


if __name__ == "__main__":
    main()
