"""The README's and docs' Python snippets run as written, and CI installs and tests as the
README says.

The README's ```python blocks run in order in one namespace, as a reader pasting them
into one session would (later blocks use the ``layer``, ``x`` and ``model`` of earlier
ones); so do each docs page's, one namespace per page. A block that cannot run here
would carry ``no-run`` in its fence line (```python no-run).
"""

import re
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
FENCE = re.compile(r"^```python([^\n]*)\n(.*?)^```$", re.M | re.S)


def python_blocks(path: Path = README) -> list[tuple[int, str]]:
    """``(line, source)`` of every runnable ```python block of ``path``."""
    text = path.read_text(encoding="utf-8")
    return [
        (text[: m.start()].count("\n") + 1, m.group(2))
        for m in FENCE.finditer(text)
        if "no-run" not in m.group(1)
    ]


def doc_pages() -> list[Path]:
    """The docs pages with runnable Python blocks."""
    return [p for p in sorted(DOCS.glob("*.md")) if python_blocks(p)]


def test_the_readme_is_a_front_door():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 210
    assert len(python_blocks()) >= 5


def _run_all(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    import matplotlib

    matplotlib.use("Agg")  # the drawing snippets make figures: files only
    monkeypatch.chdir(tmp_path)  # a snippet writes explorer.html
    ns: dict = {"__name__": "readme"}
    for line, source in python_blocks(path):
        code = compile(source, f"{path.relative_to(ROOT)}, block at line {line}", "exec")
        exec(code, ns)
    return ns


def test_readme_python_blocks_run_as_written(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    try:
        ns = _run_all(README, tmp_path, monkeypatch)
    finally:
        plt.close("all")
    assert (tmp_path / "explorer.html").exists()
    assert ns["out"].shape == (128, 64)


@pytest.mark.parametrize("page", doc_pages(), ids=lambda p: p.name)
def test_docs_python_blocks_run_as_written(page, tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    try:
        ns = _run_all(page, tmp_path, monkeypatch)
    finally:
        plt.close("all")
    if page.name == "api.md":
        assert ns["classifier"](ns["data"]).shape == (2, 3)


def test_the_api_page_builds_a_model():
    # The GPU test below reads its classifier: the page must keep it.
    assert "api.md" in {p.name for p in doc_pages()}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_docs_graph_classifier_runs_on_the_gpu(tmp_path, monkeypatch):
    # Its pooling buffer once came without device=: a CPU tensor beside CUDA nodes.
    import matplotlib.pyplot as plt

    try:
        ns = _run_all(DOCS / "api.md", tmp_path, monkeypatch)
    finally:
        plt.close("all")
    out = ns["classifier"].cuda()(ns["data"].cuda())
    assert out.shape == (2, 3) and out.device.type == "cuda"


def test_ci_installs_and_tests_as_the_readme_says():
    readme = README.read_text(encoding="utf-8")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    # The quick start installs the user extra; the tests install dev and run pytest.
    assert 'pip install torch==2.13.0 && pip install -e ".[viz]" && gnnattn demo' in readme
    assert 'pip install -e ".[dev]" && pytest' in readme
    assert "pip install -q torch==2.13.0" in ci and 'pip install -q -e ".[dev]"' in ci
    assert re.search(r"^pytest$", ci, re.M)


def test_the_dev_extra_has_what_addopts_needs():
    # The README's bare `pytest` runs on one xdist worker per core (addopts' -n auto,
    # groups in conftest.py): the dev extra must install pytest-xdist, or pytest stops
    # at the unknown option.
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    dev = re.search(r"^dev = \[(.*?)^\]", pyproject, re.M | re.S)
    assert dev and re.search(r'^\s*"pytest-xdist>=', dev.group(1), re.M)
    addopts = re.search(r'^addopts = "(.*)"$', pyproject, re.M)
    assert addopts and "-n auto" in addopts.group(1)
