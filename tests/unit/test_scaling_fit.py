"""From records to laws: best points, quadratic refinement, hyperparameter laws, held-out residuals, predict."""

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diloco.scaling.fit import best_points, fit_scaling, quadratic_optimum
from diloco.scaling.laws import fit_law, log_residual
from diloco.scaling.records import load_records, method_key, split_key
from diloco.scaling.sweep import GridSpec, expand
from diloco.scaling.synthetic import SyntheticLaw, synthetic_run

SIZES = {"s1": 20_000_000, "s2": 50_000_000, "s3": 120_000_000, "s4": 300_000_000, "s5": 800_000_000}


def synthetic_records(law: SyntheticLaw, *, lr_steps: int = 9, batches=(16, 32, 64, 128, 256)) -> list[dict]:
    """Every grid point's synthetic record, with each size's lr ladder centred near its optimum."""
    lrs = {}
    for s, n in SIZES.items():
        centre = float(law.optimal_inner_lr(n, 2))
        lrs[s] = [float(f"{centre * 2 ** (k / 2):.6g}") for k in range(-(lr_steps // 2), lr_steps // 2 + 1)]
    grid = GridSpec(
        sizes=tuple(SIZES),
        num_params=SIZES,
        inner_lr=lrs,
        global_batch=list(batches),
        replicas=(1, 2, 4, 8),
        outer_lr=(0.4, 0.6, 0.8),
        runner="synthetic",
    )
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
    assert quadratic_optimum(xs, [-((math.log(x) - u0) ** 2) for x in xs]) is None  # opens downward
    assert quadratic_optimum(xs, [(math.log(x) - math.log(1.0)) ** 2 for x in xs]) is None  # vertex outside
    assert quadratic_optimum(xs[:2], [1.0, 2.0]) is None  # too few values


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(2.0, 5.0), min_size=3, max_size=12), st.integers(0, 2**31 - 1))
def test_best_point_without_smoothing_is_the_minimum(losses, seed):
    rng = np.random.default_rng(seed)
    recs = [
        {
            "method": "diloco",
            "replicas": 2,
            "num_params": 10**8,
            "size": "x",
            "eval_loss": loss,
            "inner_lr": float(rng.choice([1e-3, 2e-3, 4e-3])),
            "global_batch": int(rng.choice([8, 16])),
            "outer_lr": 0.7,
            "sync_every": 30,
        }
        for loss in losses
    ]
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
    assert pr.loss_law == "power+C:diloco-m4"  # the group's law with an offset, when fitted
    assert pr.loss == pytest.approx(float(exact_fit.loss_laws_c["diloco-m4"].predict(n)))
    pure = exact_fit.predict(n, method="diloco", replicas=4, law="power")
    assert pure.loss == pytest.approx(float(exact_fit.loss_laws["diloco-m4"].predict(n)))
    assert pr.loss == pytest.approx(pure.loss, rel=2e-3)  # the data is a pure power law: C ~ 0
    assert any("outside the fitted sizes" in n_ for n_ in pr.notes)
    assert pr.inner_lr == pytest.approx(float(exact_fit.lr_laws["diloco-m4"].predict(n)))
    b = pr.global_batch_rounded
    assert b % 4 == 0 and b & (b - 1) == 0 and abs(math.log2(b / pr.global_batch)) <= 0.5
    assert pr.outer_lr == pytest.approx(0.6)  # the synthetic optimum for M = 4, swept exactly
    assert pr.sync_every == 30
    joint = exact_fit.predict(n, method="diloco", replicas=16)  # no per-M law: the joint law, said in the notes
    assert joint.loss_law == "joint" and joint.outer_lr == pytest.approx(0.8)  # nearest swept M (8)
    assert any("no law fitted for diloco-m16" in x and "extrapolation to M = 16" in x for x in joint.notes)
    three = exact_fit.predict(n, method="diloco", replicas=3)
    assert any("interpolation to M = 3" in x for x in three.notes)
    dp = exact_fit.predict(n, method="dp")
    assert dp.outer_lr is None and dp.replicas == 1
    with pytest.raises(ValueError, match="not fitted"):
        exact_fit.predict(n, method="dp", law="joint")


def test_fit_serialises_to_json_and_tables(exact_fit):
    data = json.loads(json.dumps(exact_fit.to_dict()))
    assert set(data["loss_laws"]) == {"dp", "diloco-m1", "diloco-m2", "diloco-m4", "diloco-m8"}
    assert set(data["loss_laws_c"]) == {"dp", "diloco-m1", "diloco-m2", "diloco-m4", "diloco-m8"}
    table = exact_fit.coefficient_table()
    assert table.count("\n") + 1 == 2 + 2 * 5 + 1 + 2 * (5 + 1)  # header + loss (+C) + joint + two hparams
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


def _write(path, lines):
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


GOOD = {"run_id": "g", "status": "ok", "eval_loss": 3.0, "method": "dp", "num_params": 1000}


@pytest.mark.parametrize(
    "bad, message",
    [
        ("[1, 2]", "r.jsonl:2: a record must be a JSON object"),
        ('"text"', "r.jsonl:2: a record must be a JSON object"),
        ({"run_id": "x", "status": "ok", "eval_loss": 3.0, "num_params": 10}, "r.jsonl:2: the record has no 'method'"),
        (
            {"run_id": "x", "status": "ok", "eval_loss": 3.0, "method": "dp"},
            "r.jsonl:2: the record has no 'num_params'",
        ),
        (
            {"run_id": "x", "status": "ok", "eval_loss": "3.1", "method": "dp", "num_params": 10},
            "r.jsonl:2: eval_loss='3.1' is not a number",
        ),
        (
            {"run_id": "x", "status": "ok", "eval_loss": 3.0, "method": "dp", "num_params": 10, "replicas": 1.5},
            "r.jsonl:2: replicas=1.5",
        ),
        ("{not json", "r.jsonl:2 is not valid JSON"),
    ],
)
def test_fit_input_errors_name_the_file_and_line(tmp_path, bad, message):
    path = _write(tmp_path / "r.jsonl", [GOOD, bad, GOOD])
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(")):
        load_records(path)


@pytest.mark.parametrize("position", [0, 1])
def test_a_nan_loss_is_skipped_with_a_warning_wherever_it_sits(tmp_path, position):
    nan = {"run_id": "n", "status": "ok", "eval_loss": float("nan"), "method": "dp", "num_params": 500}
    lines = [GOOD]
    lines.insert(position, nan)
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))  # json.dumps writes NaN, as old files hold
    with pytest.warns(UserWarning, match=f"r.jsonl:{position + 1}: skipped a run with eval_loss=nan"):
        recs = load_records(path)
    assert [r["run_id"] for r in recs] == ["g"]


def test_an_unfinished_last_line_is_skipped_with_a_warning(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + '{"run_id": "h", "status": "ok", "eval_lo')
    with pytest.warns(UserWarning, match="r.jsonl:2: skipped an unfinished last line"):
        assert [r["run_id"] for r in load_records(path)] == ["g"]


def test_forms_with_more_parameters_in_n_than_sizes_are_not_fitted_and_say_so():
    law = SyntheticLaw(noise=0.0)
    records = [
        {"method": "diloco", "replicas": m, "num_params": n, "eval_loss": float(law.best_loss(n, m)), "status": "ok"}
        for n in (2e7, 5e7, 1.2e8)
        for m in (1, 2, 4)
    ]
    fit = fit_scaling(records, max_inits=8)
    assert set(fit.loss_laws) == {"diloco-m1", "diloco-m2", "diloco-m4"} and not fit.loss_laws_c
    assert "joint" in fit.joint and not {"joint+C", "exp-M+C", "additive"} & set(fit.joint)
    text = "\n".join(fit.warnings)
    assert "power+C law for diloco-m1 not fitted: it has 3 parameters in N but the data has 3 model sizes" in text
    assert "joint+C law for diloco (all M) not fitted" in text


def test_a_fit_whose_optimizer_never_converges_is_an_error_not_an_assert():
    # maxiter-free way to make L-BFGS-B fail: non-finite data is refused up front, so feed a form a target
    # that makes every start stop abnormally: a zero-width Huber threshold is refused too; use max_inits=1
    # with an impossible bound instead: C's upper bound is min y, and y spans 60 orders of magnitude.
    n = np.array([1e6, 1e7, 1e8, 1e9, 1e10])
    y = np.array([1e-30, 1e30, 1e-30, 1e30, 1e-30])
    try:
        fit_law("power+C", n, 1, y, max_inits=4)
    except ValueError as exc:
        assert "no start converged" in str(exc)


def test_bootstrap_intervals_cover_the_fitted_value_and_token_budget_moves_the_loss():
    from diloco.scaling.records import paper_table4_records

    fit = fit_scaling(paper_table4_records(), alternatives=("joint+C",), max_inits=16, bootstrap=40)
    pr = fit.predict(1e10, method="dp")
    lo, hi = pr.loss_interval
    assert lo <= pr.loss <= hi and hi - lo < 0.1 * pr.loss
    assert pr.tokens is None and not any("token budget" in x for x in pr.notes)
    more = fit.predict(1e10, method="dp", tokens=4e11)  # 40 tokens / param: lower loss, said to be extrapolated
    assert more.loss < pr.loss and any("token budget 4e+11" in x and "extrapolation" in x for x in more.notes)
    same = fit.predict(1e10, method="dp", tokens=2e11)
    assert same.loss == pr.loss
    # the paper's extrapolations (DP 2.224 at 4B, 2.090 at 10B; M = 2: 2.218, 2.083): within ~1 % with C
    for method, m, n, paper in (
        ("dp", 1, 4e9, 2.224),
        ("dp", 1, 1e10, 2.090),
        ("diloco", 2, 4e9, 2.218),
        ("diloco", 2, 1e10, 2.083),
    ):
        assert fit.predict(n, method=method, replicas=m).loss == pytest.approx(paper, rel=0.012)
    assert fit.predict(1e10, method="dp", law="power").loss < 0.975 * 2.090  # a pure power law: ~3 % low at 10B


def test_cli_fit_reports_bad_lines_and_warnings(tmp_path, capsys):
    from diloco.cli import main

    good = [
        {
            "run_id": f"r{i}",
            "status": "ok",
            "method": "dp",
            "replicas": 1,
            "num_params": n,
            "tokens": 20 * n,
            "eval_loss": 20 * n**-0.1,
        }
        for i, n in enumerate((1e6, 3e6, 1e7, 3e7, 1e8))
    ]
    path = tmp_path / "r.jsonl"
    nan = {"run_id": "bad", "status": "ok", "method": "dp", "replicas": 1, "num_params": 5e6, "eval_loss": float("nan")}
    path.write_text("".join(json.dumps(r) + "\n" for r in [nan, *good]))
    assert (
        main(
            ["fit", "--results", str(path), "--bootstrap", "5", "--predict", "1e9", "--json", str(tmp_path / "f.json")]
        )
        == 0
    )
    captured = capsys.readouterr()
    assert f"warning: {path}:1: skipped a run with eval_loss=nan" in captured.err
    assert "90 % interval" in captured.out and "outside the fitted sizes" in captured.out
    assert json.loads((tmp_path / "f.json").read_text())["predictions"][0]["loss_interval"]
    path.write_text(json.dumps(good[0]) + "\n[1, 2]\n")
    assert main(["fit", "--results", str(path)]) == 2
    assert f"{path}:2: a record must be a JSON object" in capsys.readouterr().err
