"""The planner's syncer figures: pinned to the syncer benchmark's JSON, closed forms, and `diloco plan --method
decoupled` printing them with their sources."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from diloco.cli import main
from diloco.cli.simulate import format_duration
from diloco.errors import ConfigError
from diloco.sim.syncer_cost import (
    BENCHMARK,
    SYNCER_COSTS,
    TIME_KEY,
    fit_merge_times,
    memory_bytes,
    merge_seconds,
    plan_syncer,
    shards_needed,
)

ROOT = Path(__file__).resolve().parents[2]


def test_every_figure_is_the_fit_of_the_committed_benchmark_rows():
    doc = json.loads((ROOT / BENCHMARK).read_text())
    for codec, cost in SYNCER_COSTS.items():
        rows = [r for r in doc["runs"][cost.run]["rows"] if r["codec"] == codec and r["merge"] == cost.merge]
        assert tuple(r["learners"] for r in rows) == cost.learners and {r["values"] for r in rows} == {cost.values}
        fixed, per_learner = fit_merge_times(rows)
        assert cost.fixed_ns == pytest.approx(fixed, rel=1e-3), codec
        assert cost.per_learner_ns == pytest.approx(per_learner, rel=1e-3), codec
        assert cost.peak_growth == pytest.approx(max(r["peak_growth_over_model"] for r in rows), rel=1e-3)
        assert cost.lossy == (codec != "fp32") and all(r["threads"] == 1 for r in rows)
        # the fit reproduces each measured time within the run's noise (the 2-core box: 25 %)
        for r in rows:
            assert merge_seconds(cost, values=r["values"], learners=r["learners"]) == pytest.approx(
                r[TIME_KEY], rel=0.25
            )


def test_fit_merge_times_recovers_a_line():
    rows = [{"learners": m, "values": 1000, TIME_KEY: 1000 * (7.0 + 2.5 * m) * 1e-9} for m in (2, 4, 16)]
    fixed, per_learner = fit_merge_times(rows)
    assert fixed == pytest.approx(7.0) and per_learner == pytest.approx(2.5)


def test_closed_forms_at_7b():
    cost = SYNCER_COSTS["fp4_e3m0"]
    N, L, k, M, tau, step = 7e9, 32, 3, 8, 5, 1.0
    sp = plan_syncer(
        num_params=N,
        non_block_params=0.0,
        num_layers=L,
        fragment_layers=k,
        learners=M,
        tau=tau,
        step_time_s=step,
        step_time_source="given",
    )
    n = k * N / L  # the largest fragment: 3 of 32 blocks
    t = n * (cost.fixed_ns + cost.per_learner_ns * M) * 1e-9
    assert sp.fragment_values == pytest.approx(n) and sp.fragments == math.ceil(L / k)
    assert sp.merge_s == pytest.approx(t)
    assert sp.shards == math.ceil(t / (tau * step))
    # S shards fit the merge in tau steps and S - 1 do not
    assert merge_seconds(cost, values=n / sp.shards, learners=M) <= tau * step
    assert merge_seconds(cost, values=n / (sp.shards - 1), learners=M) > tau * step
    # memory: Theta, its copy, the momentum and one shared copy of the model, plus one merge's working set
    assert sp.memory_bytes == pytest.approx(4 * N * 4 + 4 * n * (cost.peak_growth - 2))
    assert memory_bytes(SYNCER_COSTS["fp32"], num_params=N, fragment_values=n) == pytest.approx(
        4 * N * 3 + 4 * n * (SYNCER_COSTS["fp32"].peak_growth - 1)
    )
    # the largest fragment is the non-block one when it is larger
    big = plan_syncer(
        num_params=N,
        non_block_params=2e9,
        num_layers=L,
        fragment_layers=k,
        learners=M,
        tau=tau,
        step_time_s=step,
        step_time_source="given",
    )
    assert big.fragment_values == 2e9 and big.fragments == math.ceil(L / k) + 1


def test_shards_and_settings_that_cannot_plan():
    cost = SYNCER_COSTS["fp4_e3m0"]
    assert shards_needed(cost, values=1e3, learners=2, budget_s=1.0) == 1
    with pytest.raises(ValueError, match="tau >= 1"):
        shards_needed(cost, values=1e9, learners=2, budget_s=0.0)
    kw = dict(num_params=7e9, non_block_params=0.0, num_layers=32, fragment_layers=3, learners=4, step_time_s=1.0)
    with pytest.raises(ConfigError, match="tau=0"):
        plan_syncer(**kw, tau=0, step_time_source="given")
    with pytest.raises(ConfigError, match="'int8'"):
        plan_syncer(**kw, tau=1, step_time_source="given", codec="int8")


def test_diloco_plan_method_decoupled_prints_the_syncer_with_sources(tmp_path, capsys):
    args = ["plan", "--params", "7e9", "--layers", "32", "--step-time", "1.0", "--workers", "8"]
    args += ["--tokens-per-step", "4e6", "--bandwidth", "1", "--overlap", "1,5", "--no-plot"]
    assert main([*args, "--method", "decoupled", "--out", str(tmp_path / "d")]) == 0
    out = capsys.readouterr().out
    sp = plan_syncer(
        num_params=7e9,
        non_block_params=0.0,
        num_layers=32,
        fragment_layers=3,
        learners=8,
        tau=5,
        step_time_s=1.0,
        step_time_source="x",
    )
    for line in ("learners' step time", "syncer merge per fragment", "syncer memory", "syncer shards needed"):
        assert line in out
    assert int(re.search(r"syncer shards needed +(\d+)", out).group(1)) == sp.shards
    assert re.search(r"syncer merge per fragment +" + re.escape(format_duration(sp.merge_s)), out)
    for key in ("syncer_merge_time", "syncer_memory", "syncer_shards"):
        assert f"  {key}: " in out and BENCHMARK in out
    data = json.loads((tmp_path / "d" / "plan.json").read_text())
    assert data["syncer"]["merge_s_per_fragment"] == pytest.approx(sp.merge_s)
    assert data["syncer"]["memory_bytes"] == pytest.approx(sp.memory_bytes)
    assert data["syncer"]["shards_needed"] == sp.shards and data["syncer"]["tau"] == 5
    assert set(data["syncer"]["sources"]) >= {"syncer_merge_time", "syncer_memory", "syncer_shards"}
    assert "syncer_merge_time" in data["sources"]
    # without --method decoupled the plan charges no syncer
    assert main([*args, "--out", str(tmp_path / "p")]) == 0
    assert "syncer" not in capsys.readouterr().out
    assert "syncer" not in json.loads((tmp_path / "p" / "plan.json").read_text())
