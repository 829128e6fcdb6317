"""The benchmark harness (diloco.bench): timings from a known clock, min and median of known lists, rounds that
alternate, strict and atomic JSON results, the table's layout."""

from __future__ import annotations

import argparse
import json
import math
import time

import pytest

from diloco import bench, files
from diloco.errors import ConfigError


class FakeClock:
    """A clock that only moves when ``sleep`` is called: times are exact."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def test_min_and_median_of_known_lists():
    t = bench.summarize([3.0, 1.0, 2.0, 10.0])
    assert (t.min, t.median, t.max) == (1.0, 2.5, 10.0)
    assert t.all == (3.0, 1.0, 2.0, 10.0)  # in the order measured
    assert bench.summarize([5.0, 1.0, 4.0]).median == 4.0
    assert bench.summarize([5.0, 1.0, 4.0]).as_dict() == {
        "median_s": 4.0,
        "min_s": 1.0,
        "max_s": 5.0,
        "all_s": [5, 1, 4],
    }
    with pytest.raises(ValueError):
        bench.summarize([])


def test_time_it_times_each_repeat_after_untimed_warmups_and_before_hooks():
    clock, durations, calls = FakeClock(), iter([100.0, 100.0, 3.0, 1.0, 2.0]), []

    def fn():
        calls.append("fn")
        clock.sleep(next(durations))

    def before():
        calls.append("before")
        clock.sleep(50.0)  # e.g. a barrier: not counted

    t = bench.time_it(fn, repeats=3, warmup=2, before=before, clock=clock)
    assert t.all == (3.0, 1.0, 2.0) and t.min == 1.0 and t.median == 2.0
    assert calls == ["fn", "fn", "before", "fn", "before", "fn", "before", "fn"]
    with pytest.raises(ValueError):
        bench.time_it(fn, repeats=0)


def test_time_it_with_the_real_clock_sees_a_sleep():
    t = bench.time_it(lambda: time.sleep(0.02), repeats=3)
    assert 0.02 <= t.min <= t.median < 0.5


def test_rounds_alternate_and_the_ratio_is_of_medians_of_one_run():
    clock, order = FakeClock(), []

    def step(name: str, s: float):
        def fn():
            order.append(name)
            clock.sleep(s)

        return fn

    timings = bench.time_rounds({"a": step("a", 2.0), "b": step("b", 3.0)}, repeats=3, warmup=1, clock=clock)
    assert order == ["a", "b"] * 4
    assert timings["a"].all == (2.0, 2.0, 2.0) and timings["b"].median == 3.0
    assert bench.ratio(timings["b"], timings["a"]) == 1.5


def test_round_ratios_are_immune_to_a_round_that_drifted():
    # The trainer runs at 0.95 of the bare loop whenever both run undisturbed. Round 1: a neighbour slowed the
    # trainer alone to 57; round 2: the whole machine ran at 0.6 (bare 60, trainer 57). The median of the per-round
    # ratios stays 0.95 (rounds 2 and 3); the ratio of the medians falls to 57 / 100 = 0.57.
    bare, trainer = [100.0, 60.0, 100.0], [57.0, 57.0, 95.0]
    ratios, median = bench.round_ratios(trainer, bare)
    assert ratios == pytest.approx([0.57, 0.95, 0.95]) and median == pytest.approx(0.95)
    assert bench.ratio(bench.summarize(trainer), bench.summarize(bare)) == pytest.approx(0.57)
    assert bench.round_ratios([2.0, 3.0], [4.0, 4.0]) == ([0.5, 0.75], 0.625)  # an even count: the middle two's mean
    with pytest.raises(ValueError, match="one value of each configuration per round, got 2 and 1"):
        bench.round_ratios([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="denominators must be > 0"):
        bench.round_ratios([1.0], [0.0])


def test_write_result_is_strict_and_atomic(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench, "RESULTS_DIR", tmp_path)
    path = bench.write_result("demo", {"x": 1.5, "rows": [{"a": None}]})
    assert path == tmp_path / "demo.json" and json.loads(path.read_text()) == {"x": 1.5, "rows": [{"a": None}]}
    assert path.read_text().endswith("}\n") and f"wrote {path}" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="NaN"):
        bench.write_result("demo", {"x": math.nan})
    assert json.loads(path.read_text())["x"] == 1.5  # the refused write left the old file whole

    def killed(fd):  # the writer dies after writing, before the rename
        raise OSError("killed")

    monkeypatch.setattr(files.os, "fsync", killed)
    with pytest.raises(OSError, match="killed"):
        bench.write_result("demo", {"x": 2.5})
    monkeypatch.undo()
    assert json.loads(path.read_text())["x"] == 1.5  # the old file, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo.json"]  # and no temporary file behind
    monkeypatch.setattr(bench, "RESULTS_DIR", tmp_path)
    other = bench.write_result("ignored", {"y": 2}, out=tmp_path / "sub" / "o.json", quiet=True)
    assert json.loads(other.read_text()) == {"y": 2} and capsys.readouterr().out == ""


def test_the_table_aligns_text_left_numbers_right_and_prints_missing_as_a_dash():
    rows = [{"name": "dp", "s": 1.0, "n": 12}, {"name": "streaming", "s": 0.25, "n": None}]
    table = bench.format_table(rows, [("method", "name", ""), ("s/step", "s", ".2f"), ("x", lambda r: r["n"], "")])
    assert table.splitlines() == [
        "method    s/step  x",
        "dp          1.00 12",
        "streaming   0.25  -",
    ]


def test_quick_and_out_arguments():
    ap = argparse.ArgumentParser()
    bench.add_quick(ap)
    bench.add_out(ap, "demo")
    args = ap.parse_args(["--quick"])
    assert args.quick and args.out == bench.RESULTS_DIR / "demo.json"
    assert bench.RESULTS_DIR.parts[-2:] == ("benchmarks", "results") and bench.RESULTS_DIR.is_dir()
