"""The scale suite's GPS case (issue 29) at its quick sizes: the machinery, not the figures."""

import pytest

from gnnattn.bench.harness import BenchConfig
from gnnattn.bench.suites.scale import GPS_SIZES, gps_rows, multihead_status


@pytest.mark.slow
def test_scale_gps_case_runs_in_its_own_processes():
    # A GPS layer with Exphormer attention on a kNN graph, and PyG's multihead GPSConv
    # measured and extrapolated, each in a fresh process.
    mine, pyg = gps_rows(BenchConfig(quick=True))
    assert mine["status"] == "ok", mine["status"]
    assert mine["reps"] == GPS_SIZES["quick"][4] and mine["median_ms"] > 0
    assert 0 < mine["peak_rss"] < 8e9 and "attention graph" in mine["note"]
    assert pyg["status"].startswith("not run (time)") and "h at N=20,000" in pyg["status"]


def test_multihead_status_extrapolates_quadratically():
    res = {"nodes": 1000, "s": 3.6, "delta_peak": 8_000_000}
    status = multihead_status(res, 100_000, [])
    assert "about 10.0 h at N=100,000" in status and "8.0 kB per node" in status
    assert "24 GB at N=3,000,000" in status
    assert multihead_status(None, 10, ["MemoryError"]) == "error: MemoryError"
