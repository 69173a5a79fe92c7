"""The ``softmax`` suite: segment softmax over a sorted index, ``[E, H]`` scores.

Baseline: PyG ``torch_geometric.utils.softmax`` with ``index`` (and, as a
second peer, with ``ptr``), through :func:`gnnattn.peers.pyg_softmax`.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import torch

from ..harness import BenchConfig, Candidate, Case

__all__ = ["SIZES", "softmax_cases"]

# (entries E, heads H, mean segment length)
SIZES: Mapping[str, tuple[int, int, int]] = MappingProxyType(
    {
        "full": (10_000_000, 4, 32),
        "quick": (100_000, 4, 32),
    }
)


def softmax_cases(cfg: BenchConfig, device: torch.device) -> list[Case]:
    """``scatter_softmax`` against PyG's ``softmax`` on the same scores."""
    from ...peers import pyg_softmax
    from ...softmax import scatter_softmax

    gen = torch.Generator().manual_seed(cfg.seed + 3)
    e, h, deg = SIZES["quick" if cfg.quick else "full"]
    n = max(e // deg, 1)
    index = torch.randint(0, n, (e,), generator=gen).sort().values.to(device)
    ptr = torch.zeros(n + 1, dtype=torch.long, device=device)
    torch.cumsum(torch.bincount(index, minlength=n), 0, out=ptr[1:])
    x = (torch.randn(e, h, generator=gen) * 3).to(device).requires_grad_()
    g = torch.randn(e, h, generator=gen).to(device)
    cands = [
        Candidate("PyG utils.softmax(index)", lambda s: pyg_softmax(s, index, num_nodes=n)),
        Candidate("PyG utils.softmax(ptr)", lambda s: pyg_softmax(s, ptr=ptr)),
        Candidate("gnnattn scatter_softmax(index)", lambda s: scatter_softmax(s, index, n)),
    ]
    return [
        Case(
            "softmax",
            f"E={e:,}, H={h}, {n:,} segments (sorted index)",
            x,
            g,
            "PyG utils.softmax(index)",
            cands,
            [],
            {"num_edges": e, "heads": h, "num_segments": n},
        )
    ]
