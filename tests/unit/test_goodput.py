"""Goodput under failures: Table 1 of Decoupled DiLoCo, the closed forms' limits, and the Monte-Carlo."""

import math

import numpy as np
import pytest

from diloco.sim.goodput import (
    METHODS,
    FailureModel,
    checkpoint_factor,
    cluster_mtbf_hours,
    goodput,
    goodput_by_method,
    goodput_decoupled,
    goodput_elastic,
    goodput_non_elastic,
    straggler_factor,
)
from diloco.sim.goodput_mc import simulate_goodput
from diloco.sim.goodput_paper import (
    TABLE1_CHIPS,
    TABLE1_LEARNERS,
    TABLE1_PAPER,
    TABLE1_TOLERANCE_POINTS,
    fit_table1,
    reproduce_table1,
    rule_of_thumb_gap,
)

CHIPS = np.geomspace(1_000, 10_000_000, 25)


def test_table1_every_cell_within_five_points():
    r = reproduce_table1()
    assert r["cells"] == 30 and r["cells_within_tolerance"] == 30
    assert TABLE1_TOLERANCE_POINTS == 5.0
    assert r["max_abs_diff"] < 4.3 + 0.01  # documented: elastic DP at 1.2M (-4.1) and M = 16 at 2.4M (+4.3)
    assert r["mean_abs_diff"] < 1.8
    worst = {(row["row"], TABLE1_CHIPS[j]) for row in r["rows"] for j, d in enumerate(row["diff"]) if abs(d) > 4}
    assert worst == {("dp_elastic", 1_200_000), ("decoupled_M16", 2_400_000)}


def test_the_defaults_are_the_fit_to_table1():
    m = FailureModel()
    fit = fit_table1()
    assert abs(fit["recovery_mean_s"] - m.recovery_mean_s) <= 0.5  # 0.5 s grid; the default median is rounded
    assert fit["rescale_s"] == pytest.approx(m.rescale_s)
    assert fit["dp_row_max_abs_diff"] < 3.2 and fit["elastic_rows_max_abs_diff"] < 4.3
    assert m.chip_mtbi_hours == 8760 and cluster_mtbf_hours(150_000) == pytest.approx(8760 / 150_000)


def test_no_failures_means_goodput_one():
    never = FailureModel(chip_mtbi_hours=1e30)
    free = FailureModel(recovery_median_s=1e-300, recovery_sigma=0, downscale_s=0, upscale_s=0, slice_chips=0)
    for model in (never, free):
        for n in (1e3, 1e6, 1e9):
            for method, value in goodput_by_method(chips=n, learners=8, model=model).items():
                assert value == pytest.approx(1.0, abs=1e-12), (method, n)


@pytest.mark.parametrize("method", METHODS)
def test_goodput_falls_with_chips(method):
    g = np.array([goodput(method, chips=n, learners=4) for n in CHIPS])
    assert np.all(np.diff(g) < 0) and 0 < g[-1] < g[0] <= 1


@pytest.mark.parametrize("method", METHODS)
def test_goodput_falls_with_recovery_time(method):
    medians = [1, 10, 45.8, 300, 3600]
    g = np.array([goodput(method, chips=600_000, learners=4, model=FailureModel(recovery_median_s=r)) for r in medians])
    assert np.all(np.diff(g) < 0), g
    heavier = goodput(method, chips=600_000, learners=4, model=FailureModel(recovery_sigma=2.0))
    assert heavier < goodput(method, chips=600_000, learners=4)  # same median, heavier tail: larger mean


def test_m_learners_on_n_chips_is_elastic_dp_on_n_over_m():
    # In this model it is exact (each learner is an elastic DP job on N / M chips and waits for nobody)...
    for n in CHIPS[CHIPS >= 16 * 256]:
        for m in (2, 4, 8, 16):
            assert goodput_decoupled(n, m) == pytest.approx(goodput_elastic(n / m), rel=1e-12)
    # ...and the paper's own table follows the rule of thumb within 4 points (10 cells where both exist).
    gaps = [abs(c["decoupled"] - c["elastic_dp_on_n_over_m"]) for c in rule_of_thumb_gap(TABLE1_PAPER)]
    assert len(gaps) == 10 and max(gaps) == 4


def test_closed_forms_by_hand():
    m = FailureModel()
    lam = 150_000 / (8760 * 3600)
    assert goodput_non_elastic(150_000) == pytest.approx(1 / (1 + lam * m.recovery_mean_s))
    rho = 1 / (1 + lam * 22.5)
    assert goodput_elastic(150_000) == pytest.approx(rho * (1 - rho * 256 * m.recovery_mean_s / (8760 * 3600)))
    assert m.recovery_mean_s == pytest.approx(45.8 * math.exp(0.5))
    # checkpoints: only whole intervals of an exponential running period are kept
    assert checkpoint_factor(0.0, 30) == 1.0 and checkpoint_factor(1e-3, 0) == 1.0
    assert checkpoint_factor(1e-4, 30) == pytest.approx(1 - 1e-4 * 30 / 2, rel=1e-6)
    assert goodput_non_elastic(1e6, m.with_(checkpoint_interval_s=60)) < goodput_non_elastic(1e6)


def test_stragglers_slow_only_the_methods_that_wait():
    slow = FailureModel(slowdowns=(1.0, 1.18))
    assert straggler_factor(slow, waits=True) == pytest.approx(2.18 / 2 / 1.18)
    assert straggler_factor(FailureModel(slowdowns=(1.0,) * 7 + (1.18,)), waits=True) == pytest.approx(8.18 / 8 / 1.18)
    for method in ("dp", "dp_elastic", "synchronous"):
        assert goodput(method, chips=1e5, learners=2, model=slow) == pytest.approx(
            goodput(method, chips=1e5, learners=2) * 2.18 / 2 / 1.18
        )
    assert goodput("decoupled", chips=1e5, learners=2, model=slow) == goodput("decoupled", chips=1e5, learners=2)


@pytest.mark.parametrize(
    "method, chips, learners, changes",
    [
        ("dp", 150_000, 1, {}),
        ("dp", 1_200_000, 1, {"checkpoint_interval_s": 20.0}),
        ("dp_elastic", 2_400_000, 1, {"slice_chips": 4096, "recovery_median_s": 600.0}),
        ("synchronous", 600_000, 4, {"slowdowns": (1.0, 1.1, 1.0, 1.18)}),
        ("decoupled", 2_400_000, 16, {}),
    ],
)
def test_monte_carlo_agrees_with_the_closed_form(method, chips, learners, changes):
    model = FailureModel(**changes)
    mc = simulate_goodput(
        method, chips=chips, learners=learners, model=model, failures_per_unit=600, num_runs=24, seed=1
    )
    closed = goodput(method, chips=chips, learners=learners, model=model)
    # three standard errors, plus the fixed horizon's O(1 / failures) bias
    assert abs(mc.mean - closed) <= 3 * mc.stderr + 1 / 600, (mc, closed)
    assert mc.stderr < 0.005


def test_monte_carlo_of_learners_that_leave_and_rejoin():
    mc = simulate_goodput(
        "decoupled", chips=1_200_000, learners=4, elastic_learners=False, failures_per_unit=600, num_runs=24, seed=2
    )
    closed = goodput_decoupled(1_200_000, 4, elastic_learners=False)
    assert abs(mc.mean - closed) <= 3 * mc.stderr + 1 / 600
    assert closed < goodput_decoupled(1_200_000, 4)  # waiting out R costs more than a re-scale stall


def test_bad_settings_name_the_value_and_the_fix():
    with pytest.raises(ValueError, match=r"chip_mtbi_hours=0: give a positive number of hours"):
        FailureModel(chip_mtbi_hours=0)
    with pytest.raises(ValueError, match=r"slowdowns=.*relative step time"):
        FailureModel(slowdowns=(1.0, 0.0))
    with pytest.raises(ValueError, match=r"learners=0: give a whole number of learners"):
        goodput("decoupled", chips=1e5, learners=0)
    with pytest.raises(ValueError, match=r"chips=0: give the number of chips"):
        goodput("dp_elastic", chips=0)
    with pytest.raises(ValueError, match=r"recovery_sigma=-1: give a finite number >= 0"):
        FailureModel(recovery_sigma=-1)
    with pytest.raises(ValueError, match=r"method='ddp': give one of dp, dp_elastic"):
        goodput("ddp", chips=1e5)
    assert TABLE1_LEARNERS == (2, 4, 8, 16)


def test_plan_reports_goodput_under_a_given_mtbf(tmp_path, capsys):
    import json

    from diloco.cli import main

    base = [
        "plan",
        "--size",
        "1B",
        "--workers",
        "8",
        "--tokens-per-step",
        "1e6",
        "--bandwidth",
        "10",
        "--no-plot",
        "--top",
        "1",
        "--sync-every",
        "30",
        "--codecs",
        "bf16",
        "--overlap",
        "0",
    ]
    # the cluster's MTBF for 1.2M chips at 1 year per chip: the chips follow from it, Table 1's column
    assert main([*base, "--mtbf-hours", str(8760 / 1.2e6), "--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    report = json.loads((tmp_path / "a" / "plan.json").read_text())["goodput"]
    assert report["chips"] == pytest.approx(1.2e6) and report["learners"] == 8
    assert report["goodput"] == pytest.approx(goodput_by_method(chips=1.2e6, learners=8))
    assert report["goodput"]["decoupled"] == pytest.approx(0.903, abs=5e-4)  # paper: 88
    assert "decoupled DiLoCo (K = 1)" in out and "90.3%" in out
    assert "Goodput under failures" in (tmp_path / "a" / "plan.md").read_text()
    # one chip's MTBI with the chips of the hardware step time
    hw = ["--chips", "64", "--peak-flops", "1e15", "--mfu", "0.4"]
    assert (
        main(
            [
                base[0],
                "--params",
                "1e9",
                "--layers",
                "24",
                *base[3:],
                *hw,
                "--chip-mtbi-years",
                "0.01",
                "--out",
                str(tmp_path / "b"),
            ]
        )
        == 0
    )
    report = json.loads((tmp_path / "b" / "plan.json").read_text())["goodput"]
    model = FailureModel(chip_mtbi_hours=87.6)
    assert report["goodput"] == pytest.approx(goodput_by_method(chips=64, learners=8, model=model))
    # without the chips, or with both settings: a message that says what to give
    capsys.readouterr()
    assert main([*base, "--chip-mtbi-years", "1", "--out", str(tmp_path / "c")]) == 2
    assert "--chip-mtbi-years needs --chips N" in capsys.readouterr().err
    assert main([*base, "--chip-mtbi-years", "1", "--mtbf-hours", "1", "--out", str(tmp_path / "c")]) == 2
    assert "not both" in capsys.readouterr().err
    assert main([*base, "--mtbf-hours", "0", "--out", str(tmp_path / "c")]) == 2
    assert "--mtbf-hours=0.0: give a positive number" in capsys.readouterr().err
