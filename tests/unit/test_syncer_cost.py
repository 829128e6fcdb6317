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
        sync_every=300,
        step_time_s=step,
        step_time_source="given",
    )
    n = k * N / L  # the largest fragment: 3 of 32 blocks
    t = n * (cost.fixed_ns + cost.per_learner_ns * M) * 1e-9
    assert sp.fragment_values == pytest.approx(n) and sp.fragments == math.ceil(L / k) + 1  # and the non-block one
    assert sp.merge_s == pytest.approx(t)
    assert sp.shards == sp.shards_for_merge == math.ceil(t / (tau * step)) and sp.bound == "merge"
    assert sp.load_s == pytest.approx(sp.fragments * t) and sp.shards_for_load == math.ceil(sp.fragments * t / 300)
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
        sync_every=300,
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
        plan_syncer(**kw, tau=0, sync_every=30, step_time_source="given")
    with pytest.raises(ConfigError, match="'int8'"):
        plan_syncer(**kw, tau=1, sync_every=30, step_time_source="given", codec="int8")
    with pytest.raises(ConfigError, match="sync_every=0"):
        plan_syncer(**kw, tau=1, sync_every=0, step_time_source="given")


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
        sync_every=30,  # the smallest of the plan's H values (the defaults 30, 100, 300)
        step_time_s=1.0,
        step_time_source="x",
    )
    for line in ("learners' step time", "syncer merge per fragment", "syncer memory", "syncer shards needed"):
        assert line in out
    assert int(re.search(r"syncer shards needed +(\d+)", out).group(1)) == sp.shards
    assert (
        sp.bound == "load"
        and f"set by the load within H = 30 steps; a merge within tau needs {sp.shards_for_merge}" in out
    )
    assert re.search(r"syncer merge per fragment +" + re.escape(format_duration(sp.merge_s)), out)
    for key in ("syncer_merge_time", "syncer_memory", "syncer_shards"):
        assert f"  {key}: " in out and BENCHMARK in out
    data = json.loads((tmp_path / "d" / "plan.json").read_text())
    assert data["syncer"]["merge_s_per_fragment"] == pytest.approx(sp.merge_s)
    assert data["syncer"]["memory_bytes"] == pytest.approx(sp.memory_bytes)
    assert data["syncer"]["shards_needed"] == sp.shards and data["syncer"]["tau"] == 5
    assert data["syncer"]["sync_every"] == 30 and data["syncer"]["shards_bound"] == "load"
    assert data["syncer"]["merge_s_per_outer_period"] == pytest.approx(sp.load_s)
    assert set(data["syncer"]["sources"]) >= {"syncer_merge_time", "syncer_memory", "syncer_shards"}
    assert "syncer_merge_time" in data["sources"]
    # without --method decoupled the plan charges no syncer
    assert main([*args, "--out", str(tmp_path / "p")]) == 0
    assert "syncer" not in capsys.readouterr().out
    assert "syncer" not in json.loads((tmp_path / "p" / "plan.json").read_text())


def _plan(*, fragments: int, tau: int, sync_every: int, merge_over_tau: float):
    """A plan of ``fragments`` fragments of n values (one-layer ones and the non-block one) whose step time makes a
    merge take ``merge_over_tau`` x tau steps."""
    cost, n, M = SYNCER_COSTS["fp4_e3m0"], 1e6, 4
    t = merge_seconds(cost, values=n, learners=M)
    return t, plan_syncer(
        num_params=fragments * n,
        non_block_params=n,
        num_layers=fragments - 1,
        fragment_layers=1,
        learners=M,
        tau=tau,
        sync_every=sync_every,
        step_time_s=t / (merge_over_tau * tau),
        step_time_source="given",
    )


@pytest.mark.parametrize(
    ("fragments", "tau", "sync_every", "merge_over_tau", "merge_s", "load_s", "bound"),
    [
        (4, 1, 2, 0.9, 1, 2, "load"),  # a merge takes 0.9 steps of 1; 4 of them 3.6 steps of H = 2
        (2, 1, 10, 1.5, 2, 1, "merge"),  # a merge takes 1.5 steps of 1; 2 of them 3 steps of H = 10
        (4, 1, 4, 1.5, 2, 2, "both"),  # a merge takes 1.5 steps of 1; 4 of them 6 steps of H = 4
    ],
)
def test_the_shards_meet_both_bounds_and_name_the_one_that_sets_them(
    fragments, tau, sync_every, merge_over_tau, merge_s, load_s, bound
):
    t, sp = _plan(fragments=fragments, tau=tau, sync_every=sync_every, merge_over_tau=merge_over_tau)
    step = sp.step_time_s
    assert sp.fragments == fragments and sp.merge_s == pytest.approx(t)
    assert (sp.shards_for_merge, sp.shards_for_load, sp.bound) == (merge_s, load_s, bound)
    assert sp.shards == max(merge_s, load_s) and sp.shards_note is None
    # each bound's S meets it and one shard fewer does not (a shard merges one fragment at a time)
    assert t / sp.shards_for_merge <= tau * step * (1 + 1e-9)
    assert sp.shards_for_merge == 1 or t / (sp.shards_for_merge - 1) > tau * step
    assert fragments / sp.shards_for_load * t <= sync_every * step * (1 + 1e-9)
    assert sp.shards_for_load == 1 or fragments / (sp.shards_for_load - 1) * t > sync_every * step
    d = sp.to_dict()
    assert (d["shards_needed"], d["shards_for_merge"], d["shards_for_load"], d["shards_bound"]) == (
        sp.shards,
        merge_s,
        load_s,
        bound,
    )
    assert d["load_over_sync_every_steps"] == pytest.approx(fragments * merge_over_tau * tau / sync_every)


def test_the_shards_are_the_fewest_that_meet_the_bounds_and_divide_the_fragments():
    _, sp = _plan(fragments=3, tau=1, sync_every=100, merge_over_tau=1.5)  # the merge bound: 2 shards, 3 fragments
    assert (sp.shards_for_bounds, sp.shards, sp.bound) == (2, 3, "merge")
    assert sp.shards_note == (
        "the bounds need 2 shards; 2 does not divide the 3 fragments and shards own whole fragments, so 3, the fewest "
        "that does"
    )
    assert sp.to_dict()["shards_note"] == sp.shards_note and sp.to_dict()["shards_for_bounds"] == 2
    # more shards than fragments cannot be had: the bounds' count and the syncer's own rule, with its fix
    _, sp = _plan(fragments=2, tau=1, sync_every=100, merge_over_tau=2.5)  # a merge takes 2.5 steps of 1: 3 shards
    assert (sp.shards_for_bounds, sp.shards) == (3, 3)
    assert "the bounds need 3 shards, more than the 2 fragments" in sp.shards_note
    assert "syncer_shards=3 with num_fragments=2: a shard owns whole fragments" in sp.shards_note


def test_a_7b_model_of_one_layer_fragments_needs_two_shards_for_its_load_and_gets_three():
    """The decoupled guide's case: 32 block fragments of 2.19e8 values and the non-block one, M = 8, tau = 5, H = 100
    steps of 1 s."""
    cost = SYNCER_COSTS["fp4_e3m0"]
    sp = plan_syncer(
        num_params=7e9,
        non_block_params=0.0,
        num_layers=32,
        fragment_layers=1,
        learners=8,
        tau=5,
        sync_every=100,
        step_time_s=1.0,
        step_time_source="given",
    )
    t = 7e9 / 32 * (cost.fixed_ns + 8 * cost.per_learner_ns) * 1e-9
    assert sp.fragments == 33 and sp.merge_s == pytest.approx(t) and t < 5.0  # one merge fits in tau = 5 steps
    assert sp.load_s == pytest.approx(33 * t) and 100 < sp.load_s < 200  # but 33 of them do not fit in 100 s
    assert sp.load_s == pytest.approx(130.5, abs=0.05)  # the figure the guide quotes
    assert (sp.shards_for_merge, sp.shards_for_load, sp.shards, sp.bound) == (1, 2, 3, "load")
    assert "2 does not divide the 33 fragments" in sp.shards_note  # 3 shards of 11 fragments do


def test_the_printed_plan_names_the_bound_that_sets_the_shards(tmp_path, capsys):
    args = ["plan", "--params", "7e9", "--layers", "32", "--step-time", "1.0", "--workers", "8", "--sync-every"]
    args += ["100", "--tokens-per-step", "4e6", "--bandwidth", "1", "--method", "decoupled", "--no-plot"]
    assert main([*args, "--fragment-layers", "1", "--out", str(tmp_path / "one")]) == 0
    out = capsys.readouterr().out
    assert re.search(
        r"syncer shards needed +3  \(set by the load within H = 100 steps; a merge within tau needs 1\)", out
    )
    assert re.search(r"syncer merges per H steps +2\.18 min  \(33 merges, 1\.31 x H = 100 steps", out)
    assert "the bounds need 2 shards; 2 does not divide the 33 fragments" in out
    data = json.loads((tmp_path / "one" / "plan.json").read_text())["syncer"]
    assert (data["shards_needed"], data["shards_for_bounds"], data["shards_bound"]) == (3, 2, "load")
    assert "Decoupled DiLoCo's syncer" in (tmp_path / "one" / "plan.md").read_text()
    assert "set by the load within H = 100 steps" in (tmp_path / "one" / "plan.md").read_text()
    # three layers a fragment: the merge bound sets 3, which divides the 12 fragments
    assert main([*args, "--out", str(tmp_path / "three")]) == 0
    out = capsys.readouterr().out
    assert re.search(
        r"syncer shards needed +3  \(set by a merge within tau = 5 steps, fragments 3x smaller on syncer_shards; the load needs 2\)",
        out,
    )
    assert "does not divide" not in out
    data = json.loads((tmp_path / "three" / "plan.json").read_text())["syncer"]
    assert (data["shards_needed"], data["shards_bound"], data["fragments"]) == (3, "merge", 12)
    assert data["shards_note"] is None


def test_the_7b_plan_at_three_layers_a_fragment_asks_for_six_shards_of_its_twelve_fragments(tmp_path, capsys):
    """H = 30 (the plan's default smallest): the load bound asks for 5 shards, which do not divide 12 fragments."""
    args = ["plan", "--method", "decoupled", "--params", "7e9", "--layers", "32", "--step-time", "1.0"]
    args += ["--workers", "8", "--tokens-per-step", "4e6", "--bandwidth", "1", "--no-plot"]
    assert main([*args, "--out", str(tmp_path / "p")]) == 0
    out = capsys.readouterr().out
    assert re.search(r"syncer shards needed +6  \(set by the load within H = 30 steps", out)
    assert "(the bounds need 5 shards; 5 does not divide the 12 fragments and shards own whole fragments, so 6" in out


def test_the_planning_guide_shows_what_the_planner_prints(tmp_path, capsys):
    """docs/guides/planning.md quotes the 7B plan's syncer block: it is the planner's output, line for line."""
    args = ["plan", "--method", "decoupled", "--params", "7e9", "--layers", "32", "--step-time", "1.0"]
    args += ["--workers", "8", "--tokens-per-step", "4e6", "--bandwidth", "1", "--sync-every", "100", "--no-plot"]
    doc = (ROOT / "docs" / "guides" / "planning.md").read_text()
    assert " ".join(args[1:-1]).replace("--bandwidth 1 ", "\\\n    --bandwidth 1 ") in doc  # the command shown
    assert main([*args, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    block = out[out.index("syncer (method=decoupled)") :].split("\n\n")[0]
    assert len(block.splitlines()) == 8 and block in doc  # no note (the 3 shards divide the 12 fragments); the standby


def test_the_standby_gets_a_shards_state_after_each_of_its_merges_and_the_plan_says_whether_the_link_keeps_up():
    from diloco.cli.plan_report import format_syncer
    from diloco.sim.syncer_cost import SYNCER_COSTS, plan_syncer

    sp = plan_syncer(
        num_params=7e9,
        non_block_params=2.6e8,
        num_layers=32,
        fragment_layers=3,
        learners=8,
        tau=5,
        sync_every=30,
        step_time_s=1.0,
        step_time_source="given",
    )
    lossy = SYNCER_COSTS["fp4_e3m0"].lossy
    assert sp.state_bytes == pytest.approx(4 * 7e9 * (3 + lossy))  # Theta, its copy, the momentum (+ a shared copy)
    assert sp.standby_copy_bytes == pytest.approx(sp.state_bytes / sp.shards)
    assert sp.shard_merge_interval_s == pytest.approx(30 * 1.0 * sp.shards / sp.fragments)
    assert sp.to_dict()["standby_copy_bytes"] == sp.standby_copy_bytes
    slow, fast = 1e9, 1e9 * 8 * sp.standby_copy_bytes / sp.shard_merge_interval_s / 1e9 * 2  # a copy: 10x, 0.5x
    text = format_syncer(sp, [slow, fast])
    assert "standby syncer, per shard" in text and "--standby-of" in text
    lines = [line for line in text.splitlines() if " a copy, " in line]
    ratio = 8 * sp.standby_copy_bytes / slow / sp.shard_merge_interval_s
    assert f"{ratio:.3g} x the time between merges (does not keep up" in lines[0]
    assert "0.5 x the time between merges (keeps up)" in lines[1]
