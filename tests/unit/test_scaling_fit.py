"""From records to laws: best points, quadratic refinement, hyperparameter laws, held-out residuals, predict."""

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diloco.scaling.fit import best_points, fit_scaling, load_records, method_key, quadratic_optimum, split_key
from diloco.scaling.laws import fit_law, log_residual
from diloco.scaling.sweep import GridSpec, expand
from diloco.scaling.synthetic import SyntheticLaw, synthetic_run

SIZES = {"s1": 20_000_000, "s2": 50_000_000, "s3": 120_000_000, "s4": 300_000_000, "s5": 800_000_000}


def synthetic_records(law: SyntheticLaw, *, lr_steps: int = 9, batches=(16, 32, 64, 128, 256)) -> list[dict]:
    """Every grid point's synthetic record, with each size's lr ladder centred near its optimum."""
    lrs = {}
    for s, n in SIZES.items():
        centre = float(law.optimal_inner_lr(n, 2))
        lrs[s] = [float(f"{centre * 2 ** (k / 2):.6g}") for k in range(-(lr_steps // 2), lr_steps // 2 + 1)]
    grid = GridSpec(sizes=tuple(SIZES), num_params=SIZES, inner_lr=lrs, global_batch=list(batches),
                    replicas=(1, 2, 4, 8), outer_lr=(0.4, 0.6, 0.8), runner="synthetic")
    return [{**c, **synthetic_run(c, law), "status": "ok"} for c in expand(grid)]


@pytest.fixture(scope="module")
def exact_law():
    return SyntheticLaw(noise=0.0)


@pytest.fixture(scope="module")
def exact_fit(exact_law):
    return fit_scaling(synthetic_records(exact_law), smooth_by="inner_lr", alternatives=(), max_inits=8)


def test_quadratic_optimum_is_the_vertex_of_an_exact_parabola():
    xs = [1e-3 * 2 ** (k / 2) for k in range(5)]
    u0, a, c = math.log(1.7e-3), 0.3, 2.5
    opt = quadratic_optimum(xs, [a * (math.log(x) - u0) ** 2 + c for x in xs])
    assert opt is not None
    assert opt[0] == pytest.approx(1.7e-3, rel=1e-9) and opt[1] == pytest.approx(c, rel=1e-12)
    assert quadratic_optimum(xs, [-(math.log(x) - u0) ** 2 for x in xs]) is None  # opens downward
    assert quadratic_optimum(xs, [(math.log(x) - math.log(1.0)) ** 2 for x in xs]) is None  # vertex outside
    assert quadratic_optimum(xs[:2], [1.0, 2.0]) is None  # too few values


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(2.0, 5.0), min_size=3, max_size=12), st.integers(0, 2**31 - 1))
def test_best_point_without_smoothing_is_the_minimum(losses, seed):
    rng = np.random.default_rng(seed)
    recs = [{"method": "diloco", "replicas": 2, "num_params": 10**8, "size": "x", "eval_loss": loss,
             "inner_lr": float(rng.choice([1e-3, 2e-3, 4e-3])), "global_batch": int(rng.choice([8, 16])),
             "outer_lr": 0.7, "sync_every": 30} for loss in losses]
    (p,) = best_points(recs)
    assert p.loss == min(losses) and p.num_runs == len(losses) and p.key == "diloco-m2"
    best = min(recs, key=lambda r: r["eval_loss"])
    assert (p.inner_lr, p.global_batch) == (best["inner_lr"], best["global_batch"])


def test_smoothing_finds_the_exact_optimal_lr_of_a_quadratic_bowl(exact_law):
    # The synthetic loss is exactly quadratic in log lr, so the parabola's vertex is lr* itself.
    points = best_points(synthetic_records(exact_law), smooth_by="inner_lr")
    assert len(points) == len(SIZES) * 5  # dp and diloco-m1..m8 at every size
    for p in points:
        assert p.smoothed_by == "inner_lr"
        assert p.inner_lr == pytest.approx(float(exact_law.optimal_inner_lr(p.num_params, p.replicas)), rel=1e-6)


def test_hyperparameter_laws_recover_the_synthetic_ones(exact_fit, exact_law):
    lr = exact_fit.lr_joint
    assert lr.coef["A"] == pytest.approx(exact_law.lr_A, rel=1e-4)
    assert lr.coef["alpha"] == pytest.approx(exact_law.lr_alpha, abs=1e-6)
    assert lr.coef["beta"] == pytest.approx(exact_law.lr_beta, abs=1e-6)
    # Batch optima are grid values (powers of 2), so their law is only as good as the grid: the
    # fitted optimum stays within a factor sqrt 2 of the true one over the swept sizes.
    for n in SIZES.values():
        for m in (1, 2, 4, 8):
            ratio = float(exact_fit.batch_joint.predict(n, m) / exact_law.optimal_global_batch(n, m))
            assert abs(math.log2(ratio)) <= 0.5 + 0.15


def test_loss_laws_recover_the_synthetic_law_with_noise():
    law = SyntheticLaw(noise=0.002)
    fit = fit_scaling(synthetic_records(law), smooth_by="inner_lr", alternatives=(), max_inits=8)
    joint = fit.joint["joint"]
    assert joint.coef["alpha"] == pytest.approx(law.loss_alpha, abs=2e-3)
    assert joint.coef["beta"] == pytest.approx(law.loss_beta, abs=2e-3)
    # The best loss sits on the bowl's floor plus the lr-grid and batch-grid offsets (< 0.5 %).
    for n in SIZES.values():
        assert float(joint.predict(n, 4)) == pytest.approx(float(law.best_loss(n, 4)), rel=5e-3)
    dp = fit.loss_laws["dp"]
    assert dp.coef["alpha"] == pytest.approx(law.loss_alpha, abs=3e-3)


def test_holdout_residual_is_the_error_of_a_fit_without_the_largest_size(exact_fit):
    largest = max(SIZES.values())
    rows = [h for h in exact_fit.holdout if h.target == "loss" and h.law == "power" and h.group == "diloco-m4"]
    assert len(rows) == 1 and rows[0].num_params == largest
    pts = [p for p in exact_fit.points if p.key == "diloco-m4"]
    small = [p for p in pts if p.num_params < largest]
    refit = fit_law("power", [p.num_params for p in small], 1, [p.loss for p in small], max_inits=8)
    actual = next(p.loss for p in pts if p.num_params == largest)
    expected = float(log_residual(actual, refit.predict(largest)))
    assert rows[0].residual == pytest.approx(expected, rel=1e-6, abs=1e-9)
    assert exact_fit.settings["held_out_num_params"] == largest


def test_predict_returns_law_values_and_a_valid_batch(exact_fit):
    n = 2e9
    pr = exact_fit.predict(n, method="diloco", replicas=4)
    assert pr.loss_law == "power"
    assert pr.loss == pytest.approx(float(exact_fit.loss_laws["diloco-m4"].predict(n)))
    assert pr.inner_lr == pytest.approx(float(exact_fit.lr_laws["diloco-m4"].predict(n)))
    b = pr.global_batch_rounded
    assert b % 4 == 0 and b & (b - 1) == 0 and abs(math.log2(b / pr.global_batch)) <= 0.5
    assert pr.outer_lr == pytest.approx(0.6)  # the synthetic optimum for M = 4, swept exactly
    assert pr.sync_every == 30
    joint = exact_fit.predict(n, method="diloco", replicas=16)  # no per-M law: falls back to the joint law
    assert joint.loss_law == "joint" and joint.outer_lr == pytest.approx(0.8)  # nearest swept M (8)
    dp = exact_fit.predict(n, method="dp")
    assert dp.outer_lr is None and dp.replicas == 1
    with pytest.raises(ValueError, match="not fitted"):
        exact_fit.predict(n, method="dp", law="joint")


def test_fit_serialises_to_json_and_tables(exact_fit):
    data = json.loads(json.dumps(exact_fit.to_dict()))
    assert set(data["loss_laws"]) == {"dp", "diloco-m1", "diloco-m2", "diloco-m4", "diloco-m8"}
    table = exact_fit.coefficient_table()
    assert table.count("\n") + 1 == 2 + 5 + 1 + 2 * (5 + 1)  # header + loss + joint + two hparams
    assert "A * N^alpha * M^beta" in table


def test_load_records_keeps_the_last_record_of_each_run(tmp_path):
    path = tmp_path / "r.jsonl"
    lines = [
        {"run_id": "a", "status": "failed", "eval_loss": None, "method": "dp", "num_params": 1},
        {"run_id": "a", "status": "ok", "eval_loss": 3.0, "method": "dp", "num_params": 1},
        {"run_id": "b", "status": "ok", "eval_loss": 2.0, "method": "dp", "num_params": 2},
        {"run_id": "b", "status": "failed", "eval_loss": None, "method": "dp", "num_params": 2},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    recs = load_records(path)
    assert [(r["run_id"], r["eval_loss"]) for r in recs] == [("a", 3.0)]
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ValueError, match="no finished runs"):
        load_records(tmp_path / "empty.jsonl")


@given(st.sampled_from(["diloco", "streaming"]), st.integers(1, 64))
def test_method_key_round_trips(method, m):
    assert split_key(method_key(method, m)) == (method, m)
    assert method_key("dp", m) == "dp" and split_key("dp") == ("dp", 1)


def test_user_errors_are_value_errors():
    with pytest.raises(ValueError, match="smooth_by"):
        best_points([], smooth_by="outer_lr")
    with pytest.raises(ValueError, match="no records"):
        fit_scaling([])
