"""The outer-steps rule: pinned to its study's summary, and what the config, the presets and the planner do with it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _close import assert_tree_close

from diloco.cli import main as cli_main
from diloco.cli._common import load_preset
from diloco.outer_steps import MIN_OUTER_STEPS, OUTER_MOMENTUM, outer_steps_warning, recommended_sync_every
from diloco.sim.hardware import PRESETS
from diloco.sim.loss import LossModel
from diloco.sim.planner import Setup, candidates, evaluate
from diloco.train.config import TrainConfig

STUDY = Path(__file__).resolve().parents[2] / "studies" / "outer-steps"


def _summary() -> dict:
    return json.loads((STUDY / "outer-steps-summary.json").read_text())


def _report_module():
    from diloco.studies import outer_steps_report

    return outer_steps_report


def test_the_rule_is_the_studys_summary():
    rule = _summary()["rule"]
    assert MIN_OUTER_STEPS == rule["min_outer_steps"]
    assert OUTER_MOMENTUM == rule["outer_momentum"]


def test_the_summary_is_what_the_records_give():
    """The committed summary is the report's reading of the committed records (the frontier's DP seeds included)."""
    report = _report_module()
    fresh = report.summarize(
        report.load([STUDY / "results-gpu.jsonl", report.FRONTIER / "results-gpu.jsonl"]),
        report.dp_records(),
        report.inner_lr_bracket(STUDY / "results-gpu.jsonl"),
    )
    assert_tree_close(json.loads(json.dumps(fresh)), _summary())  # floats to _close.RTOL: they come through fits
    # the rule is the fewest outer steps of any batch's best point, and each method's best seed mean's momentum
    best = [row for m in fresh["methods"].values() for row in m["best_per_batch"].values()]
    assert fresh["rule"]["min_outer_steps"] == min(row["outer_steps"] for row in best)
    for method, name in (("diloco", "diloco-m2"), ("streaming", "streaming-fp4-tau1")):
        seeded = fresh["methods"][name]["seeded"]
        assert fresh["rule"]["outer_momentum"][method] == min(seeded, key=lambda r: r["mean"])["outer_momentum"]
        assert all(r["n"] >= 3 for r in seeded)


def test_the_demo_preset_follows_the_rule():
    preset = load_preset("demo")
    for name, over in preset["methods"].items():
        cfg = TrainConfig.from_dict({**preset["base"], **over})
        if cfg.method == "dp":
            continue
        assert cfg.total_steps // cfg.sync_every >= MIN_OUTER_STEPS, name
        assert cfg.outer_momentum == OUTER_MOMENTUM[cfg.method], name
        assert cfg.warnings == [], name


def test_a_run_with_few_outer_steps_is_warned_naming_the_settings_that_give_more(capsys):
    assert cli_main(["config", "--preset", "demo", "--method", "streaming", "--set", "sync_every=30"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["derived"]["outer_steps"] == 480 // 30
    assert "sync_every=30 gives 16 outer steps" in captured.err
    assert f"sync_every={480 // MIN_OUTER_STEPS}" in captured.err and "steps >= " in captured.err
    assert out["warnings"] and out["warnings"][0] in captured.err


@pytest.mark.parametrize(
    "method, steps, H, P, warned",
    [
        ("diloco", 480, 6, 1, False),
        ("diloco", 480, 7, 1, True),
        ("streaming", 1000, 12, 3, False),
        ("streaming", 100, 5, 3, True),
        ("dp", 10, 1, 1, False),
        ("decoupled", 10, 5, 1, False),
    ],
)
def test_the_warning_fires_below_the_rule_only(method, steps, H, P, warned):
    w = outer_steps_warning(method=method, total_steps=steps, sync_every=H, num_fragments=P)
    assert (w is not None) == warned
    if warned and steps // P >= MIN_OUTER_STEPS:
        assert f"sync_every={recommended_sync_every(total_steps=steps, num_fragments=P)}" in w
    if warned and steps // P < MIN_OUTER_STEPS:  # no H reaches the rule: more steps or fewer fragments
        assert "sync_every=" not in w.split("For more:")[1].split(";")[0] and "fewer fragments" in w


def test_the_planner_recommends_only_enough_outer_steps_with_the_rules_momentum():
    model = PRESETS["10B"]
    tokens_per_step = 4e6
    for tokens in (2e10, 2e11):  # 5,000 and 50,000 steps of 4M tokens
        setup = Setup(model, "given", 2, tokens, tokens_per_step)
        h = recommended_sync_every(total_steps=int(setup.steps))
        plan = evaluate(
            setup, candidates(model.num_layers, sync_every=(h, 30, 100, 300)), [1e8, 1e9, 1e10], LossModel.paper()
        )
        for rec in plan.recommended.values():
            c = rec.candidate
            assert c.method == "dp" or setup.steps / c.sync_every >= MIN_OUTER_STEPS
            assert c.to_dict()["outer_momentum"] == (None if c.method == "dp" else OUTER_MOMENTUM[c.method])
        few = [
            e
            for rows in plan.rows.values()
            for e in rows
            if e.candidate.method != "dp" and setup.steps / e.candidate.sync_every < MIN_OUTER_STEPS
        ]
        assert few or tokens == 2e11  # at 5,000 steps H = 100 and 300 are shown but never recommended


def test_train_warns_once_it_starts(tmp_path, token_cache, capsys):
    """The warning comes with the run's other notices, after every check (an error is never preceded by it)."""
    out = tmp_path / "run"
    assert (
        cli_main(
            [
                "train",
                "--preset",
                "tiny",
                "--method",
                "streaming",
                "--out",
                str(out),
                "--cache-dir",
                str(token_cache),
                "--no-progress",
                "--set",
                "steps=4",
                "--set",
                "eval_every=4",
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert "diloco: warning: sync_every=8 gives 0 outer steps over 4 inner steps" in err
    assert cli_main(["train", "--preset", "tiny", "--out", str(out), "--set", "steps=-3"]) == 2
    assert capsys.readouterr().err.startswith("diloco train: error:")
