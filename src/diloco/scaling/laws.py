"""Parametric scaling laws and their robust fit in log space.

Every law predicts a positive quantity y (an eval loss, an optimal learning rate, an optimal
batch size) from the model size N (non-embedding parameters) and the number of DiLoCo replicas
M. The forms are those of the DiLoCo scaling-laws paper (arXiv 2503.09799):

==========  ==============================  =====================================
name        formula                         paper
==========  ==============================  =====================================
power       A * N^alpha                     Table 7: one law per method / per M
power+C     A * N^alpha + C                 one law per method / per M, with an offset
joint       A * N^alpha * M^beta            Table 10 (loss), Tables 8-9 (lr, batch)
joint+C     A * N^alpha * M^beta + C        Table 13
exp-M+C     A * N^(alpha + beta*M) + C      Table 13 (best on held-out 2.4B)
additive    A * N^alpha + B * M^beta + C    Table 13
==========  ==============================  =====================================

Fitting follows the paper (and Chinchilla before it): minimise the Huber loss of the residuals
``log yhat - log y`` with L-BFGS-B from a grid of initialisations and keep the best optimum.
Positive coefficients (A, B, C) are optimised as their logarithms, so they stay positive and
the ``+ C`` forms become log-sum-exps with closed-form gradients.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from diloco.errors import ConfigError

# scipy is imported inside the fitting functions: reading and evaluating a fitted law (the planner)
# needs numpy only.

# A form maps internal parameters theta, x = log N and M to (log yhat, d log yhat / d theta).
_Model = Callable[[np.ndarray, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class LawForm:
    """One parametric family. ``params`` are the natural names; names in ``log_params`` are
    optimised as their logarithm (they must be positive). The first two parameters of every form
    are A and alpha, which lets the fit centre log N (see :func:`fit_law`)."""

    name: str
    formula: str
    params: tuple[str, ...]
    log_params: frozenset[str]
    model: _Model
    uses_replicas: bool

    def to_internal(self, coef: dict[str, float]) -> np.ndarray:
        return np.array([math.log(coef[p]) if p in self.log_params else coef[p] for p in self.params])

    def to_natural(self, theta: np.ndarray) -> dict[str, float]:
        return {p: float(math.exp(t) if p in self.log_params else t) for p, t in zip(self.params, theta)}


def _power(theta: np.ndarray, x: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a, alpha = theta
    return a + alpha * x, np.stack([np.ones_like(x), x], axis=1)


def _power_c(theta: np.ndarray, x: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a, alpha, c = theta
    return _plus_c(a + alpha * x, np.stack([np.ones_like(x), x], axis=1), c)


def _joint(theta: np.ndarray, x: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a, alpha, beta = theta
    lm = np.log(m)
    return a + alpha * x + beta * lm, np.stack([np.ones_like(x), x, lm], axis=1)


def _plus_c(u: np.ndarray, du: np.ndarray, c: float) -> tuple[np.ndarray, np.ndarray]:
    """log(exp(u) + exp(c)) and its gradient, given u = log of the non-constant term."""
    out = np.logaddexp(u, c)
    w = np.exp(u - out)  # share of the non-constant term, in (0, 1)
    return out, np.column_stack([w[:, None] * du, 1.0 - w])


def _joint_c(theta: np.ndarray, x: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a, alpha, beta, c = theta
    lm = np.log(m)
    return _plus_c(a + alpha * x + beta * lm, np.stack([np.ones_like(x), x, lm], axis=1), c)


def _exp_m_c(theta: np.ndarray, x: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a, alpha, beta, c = theta
    return _plus_c(a + (alpha + beta * m) * x, np.stack([np.ones_like(x), x, m * x], axis=1), c)


def _additive(theta: np.ndarray, x: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a, alpha, b, beta, c = theta
    lm = np.log(m)
    terms = np.stack([a + alpha * x, b + beta * lm, np.full_like(x, c)], axis=1)
    out = np.logaddexp.reduce(terms, axis=1)
    w = np.exp(terms - out[:, None])  # softmax over the three terms
    jac = np.stack([w[:, 0], w[:, 0] * x, w[:, 1], w[:, 1] * lm, w[:, 2]], axis=1)
    return out, jac


FORMS: dict[str, LawForm] = {
    f.name: f
    for f in (
        LawForm("power", "A * N^alpha", ("A", "alpha"), frozenset({"A"}), _power, False),
        LawForm("power+C", "A * N^alpha + C", ("A", "alpha", "C"), frozenset({"A", "C"}), _power_c, False),
        LawForm("joint", "A * N^alpha * M^beta", ("A", "alpha", "beta"), frozenset({"A"}), _joint, True),
        LawForm(
            "joint+C", "A * N^alpha * M^beta + C", ("A", "alpha", "beta", "C"), frozenset({"A", "C"}), _joint_c, True
        ),
        LawForm(
            "exp-M+C", "A * N^(alpha + beta*M) + C", ("A", "alpha", "beta", "C"), frozenset({"A", "C"}), _exp_m_c, True
        ),
        LawForm(
            "additive",
            "A * N^alpha + B * M^beta + C",
            ("A", "alpha", "B", "beta", "C"),
            frozenset({"A", "B", "C"}),
            _additive,
            True,
        ),
    )
}
ALTERNATIVE_FORMS = ("joint+C", "exp-M+C", "additive")  # the paper's Table 13


def get_form(name: str) -> LawForm:
    if name not in FORMS:
        raise ConfigError(f"unknown law form {name!r}; choose one of {', '.join(FORMS)}")
    return FORMS[name]


@dataclass(frozen=True)
class FittedLaw:
    """A law with fitted coefficients (natural units: A, not log A)."""

    form: str
    coef: dict[str, float]
    num_points: int
    objective: float  # the Huber objective at the optimum (sum over points, in log space)

    def predict(self, num_params: Any, replicas: Any = 1) -> np.ndarray:
        """yhat for model size(s) N and replica count(s) M (broadcast)."""
        form = get_form(self.form)
        n, m = np.broadcast_arrays(np.asarray(num_params, float), np.asarray(replicas, float))
        if np.any(n <= 0) or np.any(m <= 0):
            raise ConfigError(f"num_params and replicas must be positive (got N={num_params}, M={replicas})")
        logy, _ = form.model(form.to_internal(self.coef), np.log(n).ravel(), m.ravel())
        return np.exp(logy).reshape(n.shape)

    def formula(self, digits: int = 4) -> str:
        text = get_form(self.form).formula
        # Longest names first, so "alpha" is replaced before "A".
        for name in sorted(self.coef, key=len, reverse=True):
            text = text.replace(name, f"{self.coef[name]:.{digits}g}")
        return text

    def to_dict(self) -> dict[str, Any]:
        return {"form": self.form, "coef": dict(self.coef), "num_points": self.num_points, "objective": self.objective}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FittedLaw:
        return cls(d["form"], {k: float(v) for k, v in d["coef"].items()}, int(d["num_points"]), float(d["objective"]))


@contextlib.contextmanager
def _single_threaded_blas() -> Iterator[None]:
    """L-BFGS-B calls LAPACK on 20x20 matrices every iteration; a multi-threaded OpenBLAS makes that
    5-30x slower on a busy machine (threads waking up for nothing). Limit it while fitting when
    threadpoolctl is installed; the result is the same either way."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        yield
        return
    with threadpool_limits(limits=1, user_api="blas"):
        yield


def _initial_points(form: LawForm, logy: np.ndarray, x0: float) -> list[np.ndarray]:
    """A grid of starting points in the centred internal coordinates (see fit_law).

    Data-driven where it can be: the centred log A starts near the mean log y and C below the
    smallest y, so every start is in the right basin for at least the constant.
    """
    ymin, ymean = float(np.exp(logy.min())), float(logy.mean())
    alphas = (-0.5, -0.1, 0.0, 0.5)
    betas = (-0.3, -0.01, 0.0, 0.01, 0.3)
    cs = tuple(math.log(f * ymin) for f in (0.1, 0.5, 0.9))
    if form.name == "power":
        grid = [(ymean,), alphas]
    elif form.name == "power+C":
        grid = [(ymean - 1.0, ymean - 3.0), alphas, cs]
    elif form.name == "joint":
        grid = [(ymean,), alphas, betas]
    elif form.name == "joint+C":
        grid = [(ymean - 1.0, ymean - 3.0), alphas, betas, cs]
    elif form.name == "exp-M+C":
        grid = [(ymean - 1.0, ymean - 3.0), alphas, (-0.01, -1e-3, 0.0, 1e-3, 0.01), cs]
    else:  # additive: A*N^alpha + B*M^beta + C
        grid = [(ymean - 1.0, ymean - 3.0), alphas, (ymean - 2.0, ymean - 5.0), (-0.5, 0.0, 0.5), cs]
    return [np.array(p, float) for p in itertools.product(*grid)]


def fit_law(
    form_name: str,
    num_params: Any,
    replicas: Any,
    y: Any,
    *,
    huber_delta: float = 2e-2,
    max_inits: int = 200,
    seed: int = 0,
    init: dict[str, float] | None = None,
) -> FittedLaw:
    """Fit one law by minimising sum_i Huber_delta(log yhat_i - log y_i) with L-BFGS-B.

    ``huber_delta`` is in log units (2e-2: 2 %; Chinchilla used 1e-3): residuals larger than it
    count linearly, so one outlier run cannot drag the law. Starts come from a grid
    (at most ``max_inits``, a seeded random subset when the grid is larger), or from ``init`` alone
    (coefficients of a previous fit, e.g. for bootstrap refits); the best optimum wins. A fit where no
    start converges (L-BFGS-B's success flag) or every optimum is non-finite is a ValueError.
    """
    from scipy.optimize import minimize
    from scipy.special import huber

    form = get_form(form_name)
    n, m, yv = (np.asarray(v, float).ravel() for v in np.broadcast_arrays(num_params, replicas, y))
    if np.any(n <= 0) or np.any(m <= 0) or np.any(yv <= 0) or not np.all(np.isfinite(yv)):
        raise ConfigError("fit_law needs positive, finite num_params, replicas and y")
    if huber_delta <= 0:
        raise ConfigError(f"huber_delta={huber_delta}: must be > 0 (e.g. 1e-3)")
    if len(yv) < len(form.params):
        raise ConfigError(
            f"form {form.name!r} has {len(form.params)} parameters but only {len(yv)} points; "
            f"add model sizes or use a smaller form"
        )
    if len(np.unique(n)) < 2:
        raise ConfigError("a scaling law needs at least two distinct model sizes")
    x = np.log(n)
    logy = np.log(yv)
    # log A and alpha are nearly collinear when log N spans 17..22, which slows L-BFGS badly.
    # Optimise phi with phi[0] = log A + alpha * x0 (the law's value at the centre) instead.
    # (Plain element-wise numpy below, no matrix products: on tiny arrays a multi-threaded BLAS
    # on a busy machine made each evaluation ~20x slower.)
    x0 = float(x.mean())
    scale = 1.0 / huber_delta**2  # objective O(1) near the optimum, so default tolerances are meaningful

    def to_theta(phi: np.ndarray) -> np.ndarray:
        theta = phi.copy()
        theta[0] -= x0 * phi[1]
        return theta

    def objective(phi: np.ndarray) -> tuple[float, np.ndarray]:
        pred, jac = form.model(to_theta(phi), x, m)
        r = pred - logy
        psi = np.clip(r, -huber_delta, huber_delta)  # d Huber / d r
        grad = (jac * psi[:, None]).sum(axis=0)  # d/d theta
        grad[1] += -x0 * grad[0]  # chain rule through to_theta
        return float(huber(huber_delta, r).sum() * scale), grad * scale

    if init is not None:
        theta0 = form.to_internal(init)
        starts = [np.concatenate([[theta0[0] + x0 * theta0[1]], theta0[1:]])]
    else:
        starts = _initial_points(form, logy, x0)
    if len(starts) > max_inits:
        pick = np.random.default_rng(seed).choice(len(starts), size=max_inits, replace=False)
        starts = [starts[i] for i in sorted(pick)]
    # C < min y, since the other terms are positive; below min y * e^-20 it is zero for any purpose,
    # and the floor stops log C from running off towards -inf when the best C is 0.
    log_ymin = float(logy.min())
    bounds = [(log_ymin - 20.0, log_ymin) if p == "C" else (None, None) for p in form.params]
    if init is not None:  # a warm start may sit on the C bound's far side after resampling
        starts = [
            np.clip(
                phi,
                [lo if lo is not None else -np.inf for lo, _ in bounds],
                [hi if hi is not None else np.inf for _, hi in bounds],
            )
            for phi in starts
        ]
    best = None
    with _single_threaded_blas():
        results = [
            minimize(
                objective,
                phi0,
                jac=True,
                method="L-BFGS-B",
                bounds=bounds,
                options={"maxiter": 5000, "ftol": 1e-12, "gtol": 1e-8},
            )
            for phi0 in starts
        ]

    # An optimum counts if L-BFGS-B says it converged (or stopped on the relative-reduction test, which is
    # how it ends at a flat minimum) and every coefficient is finite.
    def converged(r: Any) -> bool:
        if not (np.all(np.isfinite(r.x)) and np.isfinite(r.fun)):
            return False
        if r.success:
            return True
        # "ABNORMAL_TERMINATION_IN_LNSRCH" at a minimum: the line search cannot improve a point whose
        # projected gradient is already ~0 (the objective is O(1) near the optimum). Anything else fails.
        g = np.asarray(r.jac, float).copy()
        for i, (lo, hi) in enumerate(bounds):
            if (lo is not None and r.x[i] <= lo + 1e-9 and g[i] > 0) or (
                hi is not None and r.x[i] >= hi - 1e-9 and g[i] < 0
            ):
                g[i] = 0.0  # pressing against a bound: not a gradient the optimizer could follow
        return r.status == 2 and float(np.max(np.abs(g))) < 1e-4

    usable = [r for r in results if converged(r)]
    for res in usable:
        if best is None or res.fun < best.fun:
            best = res
    if best is None:
        messages = sorted({str(r.message) for r in results})
        raise ConfigError(
            f"fitting {form.name!r} to {len(yv)} points failed: no start converged "
            f"(optimizer: {'; '.join(messages)[:300]}); try more points or a smaller form"
        )
    return FittedLaw(form.name, form.to_natural(to_theta(best.x)), len(yv), float(best.fun / scale))


def log_residual(actual: Any, predicted: Any) -> np.ndarray:
    """|log y - log yhat|: the paper's held-out error (0.0025 ~ 0.25 % of the loss)."""
    return np.abs(np.log(np.asarray(actual, float)) - np.log(np.asarray(predicted, float)))


def bootstrap_coefs(
    law: FittedLaw,
    num_params: Any,
    replicas: Any,
    y: Any,
    *,
    num_samples: int = 100,
    huber_delta: float = 2e-2,
    seed: int = 0,
) -> list[dict[str, float]]:
    """Coefficients of ``num_samples`` residual-bootstrap refits of ``law`` (for prediction intervals).

    Each replicate keeps the fitted values and adds residuals ``log y - log yhat`` drawn with
    replacement, then refits from the original coefficients. With few points (7 sizes) this
    interval reflects the scatter of the points about the law, not the choice of the form.
    """
    if num_samples < 1:
        return []
    n, m, yv = (np.asarray(v, float).ravel() for v in np.broadcast_arrays(num_params, replicas, y))
    fitted = np.log(law.predict(n, m))
    resid = np.log(yv) - fitted
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(num_samples):
        y_star = np.exp(fitted + rng.choice(resid, size=resid.size, replace=True))
        try:
            out.append(fit_law(law.form, n, m, y_star, huber_delta=huber_delta, init=law.coef).coef)
        except ValueError:  # the warm start failed: the grid of starts, then leave it out (the caller counts)
            try:
                out.append(fit_law(law.form, n, m, y_star, huber_delta=huber_delta, max_inits=16).coef)
            except ValueError:
                continue
    return out


def interval(
    law: FittedLaw, samples: list[dict[str, float]], num_params: Any, replicas: Any = 1, level: float = 0.9
) -> tuple[float, float] | None:
    """The central ``level`` interval of a prediction over bootstrap coefficients, or None without samples."""
    if not samples:
        return None
    preds = np.array(
        [float(FittedLaw(law.form, c, law.num_points, 0.0).predict(num_params, replicas)) for c in samples]
    )
    lo, hi = np.quantile(preds, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


#: Chinchilla's fit of loss against parameters N and tokens D (Hoffmann et al. 2022, Approach 3):
#: L = E + A / N^a + B / D^b. Only its data term is used, as a ratio, to move a law fitted at one
#: token budget to another (an extrapolation: the DiLoCo laws are fitted at 20 tokens per parameter).
CHINCHILLA = {"E": 1.69, "A": 406.4, "B": 410.7, "a": 0.34, "b": 0.28}
CHINCHILLA_SOURCE = "Hoffmann et al. 2022 (Chinchilla), Approach 3: L = 1.69 + 406.4/N^0.34 + 410.7/D^0.28"


def token_budget_factor(num_params: float, tokens: float, reference_tokens: float) -> float:
    """L(N, D) / L(N, D_ref) under Chinchilla's law: how a loss at ``reference_tokens`` moves to ``tokens``."""
    if not (num_params > 0 and tokens > 0 and reference_tokens > 0):
        raise ConfigError(f"need positive N, D and D_ref, got {num_params}, {tokens}, {reference_tokens}")
    c = CHINCHILLA

    def loss(d: float) -> float:
        return c["E"] + c["A"] / num_params ** c["a"] + c["B"] / d ** c["b"]

    return loss(tokens) / loss(reference_tokens)
