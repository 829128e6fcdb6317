"""Monte-Carlo of the failure timelines behind :mod:`diloco.sim.goodput` (seeded, vectorised numpy).

Each unit that must run as one (the whole data-parallel job, or one decoupled learner) gets its own
timeline over a fixed wall-clock horizon: running periods drawn exponential (failures arrive at
rate chips / MTBI while it runs), each followed by what that method does on a failure:

* non-elastic DP: down for a recovery time R (lognormal) and back at its last checkpoint (only
  whole checkpoint intervals of each running period are kept);
* elastic DP, synchronous M and elastic decoupled learners: stalls of t_down + t_up; the failed
  slice's chips are idle for R, of which the unit's running share is charged (during a stall every
  chip is idle already);
* non-elastic decoupled learners: down for R + t_up, nothing else lost.

Goodput of a run = useful chip-time / (chips x horizon), pooled over the units; the estimate is the
mean over ``num_runs`` independent runs, with its standard error. Stragglers enter as the same
deterministic factor as in the closed form. This checks the closed forms' algebra (renewal-reward,
the checkpoint factor, the lognormal mean, the horizon) against the timeline they describe; it
does not check that the timeline is the paper's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from diloco.errors import ConfigError
from diloco.sim.goodput import METHODS, FailureModel, failure_rate, straggler_factor


@dataclass(frozen=True)
class MonteCarloGoodput:
    mean: float
    stderr: float
    num_runs: int
    failures_per_unit: float


def _unit(method: str, chips: float, learners: int) -> tuple[float, int]:
    """Chips per independent unit, and how many units."""
    if method == "decoupled":
        return chips / learners, learners
    return chips, 1


def simulate_goodput(
    method: str,
    *,
    chips: float,
    learners: int = 1,
    model: FailureModel = FailureModel(),
    elastic_learners: bool = True,
    failures_per_unit: float = 1000.0,
    num_runs: int = 32,
    seed: int = 0,
) -> MonteCarloGoodput:
    """Goodput of ``method`` (one of :data:`~diloco.sim.goodput.METHODS`) by simulating its timeline.

    The horizon is ``failures_per_unit`` mean failure cycles of one unit, so every unit sees about
    that many failures; ``num_runs`` independent runs give the mean and its standard error.
    """
    if method not in METHODS:
        raise ConfigError(f"method={method!r}: give one of {', '.join(METHODS)}")
    if not (failures_per_unit >= 10 and num_runs >= 2):
        raise ConfigError(
            f"failures_per_unit={failures_per_unit}, num_runs={num_runs}: give >= 10 failures per "
            "unit and >= 2 runs (the standard error needs two)"
        )
    n_unit, units = _unit(method, chips, learners)
    if not (n_unit > 0 and math.isfinite(n_unit)):
        raise ConfigError(f"chips={chips!r}, learners={learners!r}: give chips > 0 and learners >= 1")
    lam = failure_rate(n_unit, model)
    non_elastic = method == "dp"
    learner_down = method == "decoupled" and not elastic_learners
    if non_elastic:
        stall = 0.0
    elif learner_down:
        stall = model.upscale_s
    else:
        stall = model.rescale_s
    down_r = non_elastic or learner_down  # the unit waits for R itself
    mean_cycle = 1 / lam + stall + (model.recovery_mean_s if down_r else 0.0)
    horizon = failures_per_unit * mean_cycle
    rng = np.random.default_rng(seed)
    cycles = int(failures_per_unit + 8 * math.sqrt(failures_per_unit) + 16)
    while True:
        shape = (num_runs, units, cycles)
        u = rng.exponential(1 / lam, shape)
        r = (
            rng.lognormal(math.log(model.recovery_median_s), model.recovery_sigma, shape)
            if model.recovery_sigma > 0
            else np.full(shape, model.recovery_median_s)
        )
        length = u + stall + (r if down_r else 0.0)
        end = np.cumsum(length, axis=-1)
        if np.all(end[..., -1] >= horizon):
            break
        cycles *= 2  # rare: a run's cycles did not cover the horizon; draw again with more
    start = end - length
    run = np.clip(horizon - start, 0.0, u)  # running time inside the horizon
    if non_elastic and model.checkpoint_interval_s > 0:
        c = model.checkpoint_interval_s
        whole = start + u <= horizon  # running periods that ended in a failure lose work since the checkpoint
        run = np.where(whole, c * np.floor(u / c), run)
    useful = n_unit * run.sum(axis=-1)  # (runs, units)
    if not down_r:
        failed = start + u < horizon
        slice_down = np.where(failed, np.minimum(r, horizon - (start + u)), 0.0).sum(axis=-1)
        share = run.sum(axis=-1) / horizon
        useful = useful - min(model.slice_chips, n_unit) * share * slice_down
    per_run = useful.sum(axis=-1) / (chips * horizon)
    per_run = per_run * straggler_factor(model, waits=method != "decoupled")
    return MonteCarloGoodput(
        float(per_run.mean()), float(per_run.std(ddof=1) / math.sqrt(num_runs)), num_runs, failures_per_unit
    )


__all__ = ["MonteCarloGoodput", "simulate_goodput"]
