"""The package's shape: the import layering.

Layers, lowest first: ``graphs`` and ``kernels`` < ``ops`` < ``distributed`` < ``nn`` < ``cli``
(with ``compare``, ``bench`` and ``viz`` on top). A lower layer never imports
a higher one, not even inside a function, so each can be read and tested
without the ones above it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "gnnattn"


# What each layer must never import (each name covers its submodules).
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "graphs": ("ops", "distributed", "nn", "cli", "compare", "bench", "viz"),
    "kernels": ("ops", "distributed", "nn", "cli", "compare", "bench", "viz"),
    "ops": ("distributed", "nn", "cli", "bench", "viz"),
    "distributed": ("nn", "cli", "compare", "bench", "viz"),
    "nn": ("cli", "bench"),
}


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _rel(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def _module(path: Path) -> str:
    """``gnnattn.a.b`` for ``gnnattn/a/b.py`` (``gnnattn.a`` for ``gnnattn/a/__init__.py``)."""
    parts = ["gnnattn", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    """``(line, module)`` of every import in ``path``, relative ones made absolute.

    ``from . import x`` yields both the package and ``package.x`` (``x`` may be
    a submodule).
    """
    package = _module(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            yield node.lineno, base
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}"


def test_sources_found() -> None:
    rels = {_rel(p) for p in _sources()}
    assert {"__init__.py", "graphs/graph.py", "kernels/chunks.py", "nn/conv.py"} <= rels


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_lower_layers_never_import_higher_ones(layer: str) -> None:
    banned = tuple(f"gnnattn.{name}" for name in FORBIDDEN[layer])
    paths = [PACKAGE / f"{layer}.py", *sorted((PACKAGE / layer).rglob("*.py"))]
    bad = [
        f"{_rel(path)}:{line} imports {module}"
        for path in paths
        if path.exists()
        for line, module in _imports(path)
        if any(module == b or module.startswith(b + ".") for b in banned)
    ]
    assert not bad, "\n".join(bad)


def test_relative_imports_resolve_as_python_does() -> None:
    """The resolver the layering test relies on, on a package and a module."""
    kernels = {m for _, m in _imports(PACKAGE / "kernels" / "triton_attention" / "backward.py")}
    assert {"gnnattn.graphs.csr", "gnnattn.kernels.chunks"} <= kernels
    graphs = {m for _, m in _imports(PACKAGE / "graphs" / "__init__.py")}
    assert "gnnattn.graphs.graph" in graphs
