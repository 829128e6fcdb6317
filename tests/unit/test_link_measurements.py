"""The simulator against the slow-link benchmark's saved measurements (benchmarks/results/link*.json).

The predictions are recomputed here from each saved row (its measured compute per step, bytes, H, P, tau,
M) with the current simulator, so a change to ``diloco.sim`` that moves it away from what was measured
fails here. The runs themselves need root and network namespaces (``sudo benchmarks/link.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diloco.bench.link_report import with_predictions

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _rows(name: str) -> list[dict]:
    saved = json.loads((BENCH / "results" / name).read_text())
    probes = {float(k): v for k, v in saved["overlap_probe"].items()}
    latency = saved["config"].get("latency_ms", 0.0)
    return [r | with_predictions(r, probes[float(r["mbps"])], r["mbps"], latency) for r in saved["rows"]]


@pytest.mark.parametrize("name", ["link_m4_accel.json", "link_m4_accel_repeat.json"])
def test_m4_with_an_accelerator_step_every_cell_within_two_points_at_the_configured_rate(name):
    rows = _rows(name)
    assert len(rows) == 6 and {r["workers"] for r in rows} == {4}
    for r in rows:
        assert r["compute_emulated"]
        gap = 100 * (r["predicted_utilization"] - r["utilization"])
        assert abs(gap) <= 2.0, f"{r['method']}: simulator {gap:+.1f} points from the measurement"


def test_m4_the_new_exchange_sends_half_the_all_gathers_bytes_and_gains_utilization():
    by = {r["method"]: r for r in _rows("link_m4_accel.json")}
    for base in ("DiLoCo", "+overlap"):
        ag, rs = by[f"{base} [all_gather]"], by[f"{base} [reduce_scatter]"]
        assert rs["bytes_sent"] * 2 == pytest.approx(ag["bytes_sent"], rel=1e-3)
        assert rs["utilization"] > ag["utilization"] + 0.05


def test_m2_every_cell_within_five_points_at_the_delivered_rate():
    rows = _rows("link.json")
    assert len(rows) == 15
    for r in rows:
        gap = 100 * (r["predicted_utilization_effective"] - r["utilization"])
        assert abs(gap) <= 5.0, f"{r['method']} at {r['mbps']:g} Mbit/s: {gap:+.1f}"
