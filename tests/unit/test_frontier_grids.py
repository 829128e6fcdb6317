"""The frontier study's grid writer (studies/frontier/write_grids.py): the grids that probe another batch and
that bracket each method's best inner lr, written from the report's rows."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def wg():
    spec = importlib.util.spec_from_file_location("frontier_write_grids",
                                                  ROOT / "studies" / "frontier" / "write_grids.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(method, best, tried, batch=8, size="cpu-0.1m"):
    return {"size": size, "global_batch": batch, "method": method, "inner_lr": best, "lrs_tried": tried}


def test_bracketing_halves_and_doubles_one_lr_and_steps_past_an_edge(wg):
    rows = [_row("dp", 0.032, [0.032]),                            # one lr: both neighbours
            _row("stat2-ef0.9", 0.016, [0.016, 0.032]),            # best at the low edge: half it
            _row("stat4-ef0.9", 0.032, [0.016, 0.032]),            # best at the high edge: twice it
            _row("streaming-fp4-tau1", 0.016, [0.008, 0.016, 0.032]),  # bracketed: nothing
            _row("dp", 0.032, [0.032], batch=16),                  # another batch: not this one's
            _row("no-such-method", 0.01, [0.01])]                  # not a method of the study: skipped
    out = wg.bracketing("cpu-0.1m", 8, rows)
    assert {name: g["inner_lr"] for name, g in out.items()} == {
        "cpu-0.1m-b8-dp-lr0.016": [0.016], "cpu-0.1m-b8-dp-lr0.064": [0.064],
        "cpu-0.1m-b8-stat2-ef0.9-lr0.008": [0.008], "cpu-0.1m-b8-stat4-ef0.9-lr0.064": [0.064]}
    grid = out["cpu-0.1m-b8-stat4-ef0.9-lr0.064"]
    template = wg.grids("cpu-0.1m", (8,))["cpu-0.1m-b8-stat4-ef0.9"]
    assert grid["base"] == template["base"] and grid["global_batch"] == [8] and grid["outer_lr"] == template["outer_lr"]
    assert "0.032 of 0.016, 0.032 tried" in grid["_comment"]


def test_another_batch_at_each_methods_best_lr(wg):
    rows = [_row("dp", 0.032, [0.016, 0.032, 0.064], batch=16), _row("eager-fp4-mom0.5", 0.016, [0.016], batch=16),
            _row("dp", 0.008, [0.008], batch=32)]
    out = wg.at_best_lr("cpu-0.1m", 8, 16, rows)
    assert {name: g["inner_lr"] for name, g in out.items()} == {
        "cpu-0.1m-b8-dp-lr0.032": [0.032], "cpu-0.1m-b8-eager-fp4-mom0.5-lr0.016": [0.016]}
    assert out["cpu-0.1m-b8-eager-fp4-mom0.5-lr0.016"]["base"]["eager"] is True
