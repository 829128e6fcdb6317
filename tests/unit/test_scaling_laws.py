"""The law forms and their Huber fit: the paper's coefficients from its own losses, known laws recovered."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import approx_fprime

from diloco.scaling.fit import fit_scaling
from diloco.scaling.laws import FORMS, FittedLaw, fit_law, get_form, log_residual
from diloco.scaling.records import paper_table4, paper_table4_records

# Fitting the paper's Table 4 losses reproduces its Table 7 (A, alpha per method) and Table 10
# (joint A, alpha, beta) to at most 0.23 % (measured); the issue asks for 2 %.
PAPER_TOLERANCE = 0.0025


@pytest.fixture(scope="module")
def paper_fit():
    return fit_scaling(paper_table4_records(), alternatives=())


def test_table4_data_file_has_its_source_and_shape():
    table = paper_table4()
    assert "2503.09799" in table["source"] and "Table 4" in table["source"]
    assert len(table["rows"]) == 7 and all(len(r) == len(table["columns"]) for r in table["rows"])
    assert len(paper_table4_records()) == 7 * 5


def test_independent_fits_recover_table7(paper_fit):
    expected = paper_table4()["expected"]["table7_independent"]
    assert set(paper_fit.loss_laws) == set(expected)
    for key, coef in expected.items():
        for name, value in coef.items():
            got = paper_fit.loss_laws[key].coef[name]
            assert got == pytest.approx(value, rel=PAPER_TOLERANCE), (key, name, got, value)


def test_joint_fit_recovers_table10(paper_fit):
    expected = paper_table4()["expected"]["table10_joint_loss"]
    joint = paper_fit.joint["joint"]
    assert joint.num_points == 28  # DiLoCo only, M in {1, 2, 4, 8}
    for name, value in expected.items():
        assert joint.coef[name] == pytest.approx(value, rel=PAPER_TOLERANCE), (name, joint.coef[name], value)


def test_huber_fit_equals_least_squares_when_residuals_are_small():
    # Table 4's residuals are all below delta, where the Huber loss is the squared loss.
    table = paper_table4()
    n = np.array([r[1] for r in table["rows"]], float)
    y = np.array([r[2] for r in table["rows"]], float)
    slope, intercept = np.polyfit(np.log(n), np.log(y), 1)
    law = fit_law("power", n, 1, y, huber_delta=0.02)
    assert law.coef["alpha"] == pytest.approx(slope, rel=1e-6)
    assert law.coef["A"] == pytest.approx(np.exp(intercept), rel=1e-6)


@settings(max_examples=30, deadline=None)
@given(A=st.floats(2.0, 50.0), alpha=st.floats(-0.3, -0.02), beta=st.floats(-0.05, 0.05))
def test_noise_free_joint_law_is_recovered_exactly(A, alpha, beta):
    n = np.repeat(np.geomspace(1e7, 3e9, 6), 4)
    m = np.tile([1, 2, 4, 8], 6)
    y = A * n**alpha * m**beta
    law = fit_law("joint", n, m, y, max_inits=4)
    assert law.coef["A"] == pytest.approx(A, rel=1e-5)
    assert law.coef["alpha"] == pytest.approx(alpha, abs=1e-6)
    assert law.coef["beta"] == pytest.approx(beta, abs=1e-6)


def test_noisy_joint_law_is_recovered_within_its_standard_error():
    rng = np.random.default_rng(1234)
    n = np.repeat(np.geomspace(1e7, 3e9, 8), 4)
    m = np.tile([1, 2, 4, 8], 8)
    sigma = 0.002
    y = 19.226 * n**-0.0985 * m**0.0116 * np.exp(sigma * rng.standard_normal(n.size))
    law = fit_law("joint", n, m, y)
    # OLS standard error of alpha: sigma / (sqrt(n) * std(log N)) ~ 1.8e-4; allow about 5 of them.
    assert law.coef["alpha"] == pytest.approx(-0.0985, abs=1e-3)
    assert law.coef["beta"] == pytest.approx(0.0116, abs=1.5e-3)
    assert law.coef["A"] == pytest.approx(19.226, rel=0.02)


@pytest.mark.parametrize(
    "form,coef",
    [
        ("joint+C", {"A": 30.0, "alpha": -0.15, "beta": 0.02, "C": 1.0}),
        ("exp-M+C", {"A": 40.0, "alpha": -0.16, "beta": 3e-4, "C": 1.1}),
        ("additive", {"A": 35.0, "alpha": -0.15, "B": 0.05, "beta": 0.5, "C": 0.9}),
    ],
)
def test_offset_forms_recover_a_known_law_and_extrapolate(form, coef):
    truth = FittedLaw(form, coef, 0, 0.0)
    n = np.repeat(np.geomspace(3e7, 2e9, 7), 4)
    m = np.tile([1, 2, 4, 8], 7)
    law = fit_law(form, n, m, truth.predict(n, m), max_inits=32)
    # The offset forms have nearly flat directions, so compare what matters: the extrapolation.
    for big in (1e10, 1e11):
        np.testing.assert_allclose(law.predict(big, [1, 2, 4, 8]), truth.predict(big, [1, 2, 4, 8]), rtol=2e-3)
    assert law.coef["alpha"] == pytest.approx(coef["alpha"], rel=0.05)


def test_huber_resists_an_outlier_that_drags_least_squares():
    rng = np.random.default_rng(7)
    n = np.geomspace(1e7, 1e10, 10)
    y = 18.0 * n**-0.095 * np.exp(0.001 * rng.standard_normal(n.size))
    y[-1] *= 1.25  # one diverged-looking run at the largest size
    robust = fit_law("power", n, 1, y, huber_delta=0.02)
    squares = fit_law("power", n, 1, y, huber_delta=10.0)
    assert abs(robust.coef["alpha"] + 0.095) < 0.004
    assert abs(squares.coef["alpha"] + 0.095) > 3 * abs(robust.coef["alpha"] + 0.095)


@pytest.mark.parametrize("name", list(FORMS))
def test_analytic_jacobian_matches_finite_differences(name):
    form = get_form(name)
    rng = np.random.default_rng(0)
    x = np.log(np.geomspace(1e7, 1e10, 5))
    m = np.array([1.0, 2.0, 4.0, 8.0, 2.0])
    theta = rng.normal(0, 0.3, len(form.params))
    _, jac = form.model(theta, x, m)
    for i in range(len(x)):
        numeric = approx_fprime(theta, lambda t: form.model(t, x, m)[0][i], 1e-7)
        np.testing.assert_allclose(jac[i], numeric, rtol=1e-4, atol=1e-5)


def test_formula_and_round_trip():
    law = FittedLaw("joint", {"A": 19.226, "alpha": -0.0985, "beta": 0.0116}, 28, 0.0)
    assert law.formula() == "19.23 * N^-0.0985 * M^0.0116"
    assert FittedLaw.from_dict(law.to_dict()) == law
    assert float(law.predict(1e9, 2)) == pytest.approx(19.226 * 1e9**-0.0985 * 2**0.0116)


def test_log_residual_is_symmetric_in_ratio():
    assert log_residual(2.0, 2.0 * np.e**0.01) == pytest.approx(0.01)
    assert log_residual(2.0 * np.e**0.01, 2.0) == pytest.approx(0.01)


def test_user_errors_are_value_errors():
    with pytest.raises(ValueError, match="unknown law form"):
        fit_law("cubic", [1e7, 1e8, 1e9], 1, [3.0, 2.8, 2.6])
    with pytest.raises(ValueError, match="only 2 points"):
        fit_law("joint+C", [1e7, 1e8], 1, [3.0, 2.8])
    with pytest.raises(ValueError, match="two distinct model sizes"):
        fit_law("power", [1e8, 1e8, 1e8], [1, 2, 4], [3.0, 2.9, 2.8])
    with pytest.raises(ValueError, match="positive"):
        fit_law("power", [1e7, 1e8, 1e9], 1, [3.0, -1.0, 2.6])
    with pytest.raises(ValueError, match="positive"):
        FittedLaw("power", {"A": 1.0, "alpha": -0.1}, 2, 0.0).predict(0.0)
