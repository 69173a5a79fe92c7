"""The first kernel compile says so, once per process and only when numba really compiles
(not when it loads the cache); ``gnnattn warmup`` compiles ahead."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap

import pytest

from gnnattn.cli import main
from gnnattn.kernels.cpu import _cache

NOTICE = "gnnattn: compiling the CPU kernels (numba) on their first use"

# A numba function of another package compiles first (it must not say anything, nor
# use up the notice), then two gnnattn kernels (float32 and float64: one notice).
FIRST_CALLS = textwrap.dedent(
    """
    import numba, torch
    numba.njit(lambda v: v + 1)(1)
    from gnnattn.kernels.cpu import segment_softmax_fwd
    for dtype in (torch.float32, torch.float64):
        segment_softmax_fwd(torch.randn(4, 2, dtype=dtype), torch.tensor([0, 1, 4]))
    print("ran")
    """
)


def _python(code: str, cache: os.PathLike, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache)}
    argv = [sys.executable, "-c", code] if code else [sys.executable, "-m", "gnnattn", *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_once_on_a_cold_cache_and_never_on_a_warm_one(tmp_path):
    cache = tmp_path / "numba-cache"
    cold = _python(FIRST_CALLS, cache)
    assert cold.returncode == 0 and cold.stdout == "ran\n", cold.stderr
    assert cold.stderr.count(NOTICE) == 1, cold.stderr
    # It names the folder the machine code went to.
    assert f"cached in {cache}" in cold.stderr and any(cache.iterdir())
    warm = _python(FIRST_CALLS, cache)
    assert warm.returncode == 0 and warm.stdout == "ran\n"
    assert NOTICE not in warm.stderr, warm.stderr


def _function_in(folder: str):
    """A function whose code says it comes from a file of ``folder``."""
    scope: dict = {}
    exec(compile("def kernel(): pass", os.path.join(folder, "k.py"), "exec"), scope)
    return scope["kernel"]


class _Dispatcher:
    def __init__(self, func):
        self.py_func = func


def test_the_notice_is_one_log_record_that_logging_silences(monkeypatch, caplog, tmp_path):
    monkeypatch.setattr(_cache, "_said", False)
    monkeypatch.setattr(_cache, "compiles", 0)
    ours = _Dispatcher(_function_in(os.path.dirname(_cache.__file__)))
    theirs = _Dispatcher(_function_in(str(tmp_path)))
    with caplog.at_level(logging.WARNING, logger="gnnattn"):
        _cache._notice(theirs)
        assert not caplog.records and _cache.compiles == 0  # not a gnnattn kernel
        _cache._notice(ours)
        _cache._notice(ours)
    assert _cache.compiles == 2
    [record] = caplog.records
    assert record.name == "gnnattn.kernels" and record.levelno == logging.WARNING
    assert record.getMessage().startswith(NOTICE) and "gnnattn warmup" in record.getMessage()
    # The documented way to silence it.
    caplog.clear()
    monkeypatch.setattr(_cache, "_said", False)
    log = logging.getLogger("gnnattn")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        _cache._notice(ours)
    finally:
        log.setLevel(level)
    assert not [r for r in caplog.records if r.name.startswith("gnnattn")]


def test_cache_dir_is_numba_s(monkeypatch, tmp_path):
    from numba.core import config

    monkeypatch.setattr(config, "CACHE_DIR", str(tmp_path))
    assert _cache.cache_dir() == str(tmp_path)
    monkeypatch.setattr(config, "CACHE_DIR", "")
    assert _cache.cache_dir() == os.path.join(os.path.dirname(_cache.__file__), "__pycache__")


@pytest.mark.slow  # minutes when the cache is cold (other tests then load what it compiled)
def test_warmup_runs_and_says_where(capsys):
    assert main(["warmup"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"compiling the cpu kernels (float32) into {_cache.cache_dir()}"
    assert out[1].startswith(("compiled ", "every kernel was compiled already")), out


def test_warmup_without_compiled_kernels(monkeypatch, capsys):
    import gnnattn.kernels

    monkeypatch.setattr(gnnattn.kernels, "COMPILED", frozenset())
    assert main(["warmup"]) == 0
    assert "numba is not installed" in capsys.readouterr().out


@pytest.mark.slow
def test_warmup_compiles_what_a_first_epoch_needs(tmp_path):
    cache = tmp_path / "numba-cache"
    warm = _python("", cache, "warmup")
    assert warm.returncode == 0, warm.stderr
    assert NOTICE not in warm.stderr  # the command says it itself
    assert warm.stdout.splitlines()[1].startswith("compiled "), warm.stdout
    # A training step of the layers a newcomer starts with, float32, in a new process:
    # every kernel it needs comes from the cache.
    epoch = textwrap.dedent(
        """
        import torch
        from torch_geometric.nn import GINConv
        from gnnattn import GPSConv, SelfAttentionConv, TransformerConv
        from gnnattn.nn import GraphTransformer
        ei = torch.randint(0, 200, (2, 2000)).unique(dim=1)
        batch = torch.repeat_interleave(torch.arange(5), torch.tensor([50, 40, 30, 45, 35]))
        gin = GINConv(torch.nn.Linear(32, 32))
        x, ea = torch.randn(200, 32), torch.randn(ei.shape[1], 4)
        learned = ea.clone().requires_grad_()  # from an edge encoder
        # As sparse as a batch of molecules: the per-edge edge term's kernels.
        few, few_ea = ei[:, :400], ea[:400]
        for model, args in [
            (TransformerConv(32, 8, heads=4, edge_dim=4, dropout=0.1), (x, ei, ea)),
            (TransformerConv(32, 8, heads=4, edge_dim=4, dropout=0.1), (x, ei, learned)),
            (TransformerConv(32, 8, heads=4, edge_dim=4, dropout=0.1), (x, few, few_ea)),
            (SelfAttentionConv(32, 4, dropout=0.1), (x, ei)),
            (GraphTransformer(2, 32, 4, dropout=0.1, edge_dim=4), (x, ei, ea)),
            (GraphTransformer(2, 32, 4, dropout=0.1, edge_dim=4, edge_value=True), (x, ei, ea)),
            (GPSConv(32, gin, heads=4), (x, ei, batch)),  # a batch of molecules
        ]:
            model.train()(*args).sum().backward()
            with torch.no_grad():
                model.eval()(*args)
        from gnnattn.kernels.cpu import _cache
        print(_cache.compiles)
        """
    )
    first = _python(epoch, cache)
    assert first.returncode == 0, first.stderr
    assert first.stdout == "0\n" and NOTICE not in first.stderr, first.stderr
