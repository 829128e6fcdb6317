"""Goodput under chip failures and stragglers: data-parallel, elastic DP, synchronous and decoupled learners.

Goodput is the share of allocated chip-time spent on useful training. Chips fail as a Poisson
process, each at rate 1 / MTBI, so a unit of n chips that must all run (a data-parallel job, or one
learner) is interrupted at rate lambda = n / MTBI. Every method below is a renewal-reward process
whose cycle is one interruption:

* **data-parallel, not elastic**: the job runs until an interruption (exponential, mean 1/lambda),
  stops until the failed chips are back (recovery time R, lognormal), and restarts from its last
  checkpoint (work since it is lost; checkpoints every C seconds of running). While it is down no
  further interruption is counted (its chips are idle; a failure then falls in the same recovery).
  Goodput = [lambda C / (e^{lambda C} - 1)] / (1 + lambda E[R])  (the first factor is 1 at C = 0).
* **data-parallel, elastic**: the job stalls for a down-scale (t_down), goes on without the failed
  slice, and stalls again for an up-scale (t_up) when the slice is back. Running share
  rho = 1 / (1 + lambda (t_down + t_up)); the failed slice (s chips) is idle for R, of which the
  share rho falls in running time: goodput = rho (1 - rho s E[R] / MTBI).
* **decoupled, M learners** (quorum K = 1): each learner is an elastic data-parallel job on N / M
  chips and no learner ever waits for another, so goodput is elastic DP's on N / M chips. With
  ``elastic_learners=False`` a failed learner leaves, waits R, and rejoins from the syncer's state
  (an up-scale, t_up): nothing is lost but its own time, 1 / (1 + lambda_{N/M} (E[R] + t_up)).
* **synchronous, M replicas** (DiLoCo / Streaming DiLoCo, K = M): every replica waits for the others
  at each sync, so a stall anywhere costs everyone: elastic DP's goodput on all N chips.

Stragglers: ``slowdowns`` gives each learner's (or each replica's, or each group of the DP job's)
step time relative to nominal. Methods that synchronise run at the slowest, so a group of
relative step time s_m is busy s_m / max(s) of the time: factor mean(s) / max(s). Decoupled
learners (K = 1) never wait: factor 1.

Everything here is a pure function of a :class:`FailureModel` (numpy only; no torch). The
Monte-Carlo of the same timelines is :mod:`diloco.sim.goodput_mc`; the paper's Table 1 and how
the defaults were fitted to it, :mod:`diloco.sim.goodput_paper`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from diloco.errors import ConfigError

HOURS_PER_YEAR = 8760.0

#: The methods :func:`goodput` knows, in the order ``diloco plan`` prints them.
METHODS = ("dp", "dp_elastic", "synchronous", "decoupled")
METHOD_LABELS = {
    "dp": "data-parallel, not elastic",
    "dp_elastic": "data-parallel, elastic",
    "synchronous": "DiLoCo / Streaming DiLoCo (synchronous, K = M)",
    "decoupled": "decoupled DiLoCo (K = 1)",
}


@dataclass(frozen=True, kw_only=True)
class FailureModel:
    """The failure, recovery and straggler assumptions; the defaults reproduce the paper's Table 1.

    * ``chip_mtbi_hours``: mean time between interruptions of one chip (the paper: 1 year).
    * ``recovery_median_s``, ``recovery_sigma``: the recovery time R, lognormal (heavy-tailed) with
      this median and log-space sigma; mean = median * exp(sigma^2 / 2). The median is fitted to
      Table 1's non-elastic DP row (its mean, 75.5 s, is what the row constrains); sigma = 1 is chosen.
    * ``checkpoint_interval_s``: running seconds between checkpoints of a non-elastic job; 0 means
      every step (in-memory), no work lost. Table 1's DP row is fitted best at 0 (see the docs).
    * ``downscale_s``, ``upscale_s``: the stalls of an elastic job (or learner) when it drops a failed
      slice and when it takes it back; their sum (22.5 s) is fitted to the elastic and decoupled
      rows; the even split is a choice (only the sum enters goodput).
    * ``slice_chips``: chips idled by one failure while it recovers (an elastic job drops the whole
      model-parallel slice holding the failed chip); chosen, 256. A job or learner smaller than a
      slice loses all its chips (the slice is capped at its size).
    * ``slowdowns``: relative step time of each group (learner / replica); empty: no stragglers.
    """

    chip_mtbi_hours: float = HOURS_PER_YEAR
    recovery_median_s: float = 45.8
    recovery_sigma: float = 1.0
    checkpoint_interval_s: float = 0.0
    downscale_s: float = 11.25
    upscale_s: float = 11.25
    slice_chips: float = 256.0
    slowdowns: tuple[float, ...] = field(default=())

    def __post_init__(self) -> None:
        for name in ("chip_mtbi_hours", "recovery_median_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ConfigError(
                    f"{name}={v!r}: give a positive number of {'hours' if 'hours' in name else 'seconds'}"
                )
        for name in ("recovery_sigma", "checkpoint_interval_s", "downscale_s", "upscale_s", "slice_chips"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ConfigError(f"{name}={v!r}: give a finite number >= 0")
        slow = tuple(float(s) for s in self.slowdowns)
        if any(not (math.isfinite(s) and s > 0) for s in slow):
            raise ConfigError(
                f"slowdowns={self.slowdowns!r}: give each group's relative step time, > 0 "
                "(1 = nominal, 1.18 = 18 % slower)"
            )
        object.__setattr__(self, "slowdowns", slow)

    @property
    def chip_mtbi_s(self) -> float:
        return self.chip_mtbi_hours * 3600.0

    @property
    def recovery_mean_s(self) -> float:
        """E[R] of the lognormal: median * exp(sigma^2 / 2)."""
        return self.recovery_median_s * math.exp(self.recovery_sigma**2 / 2)

    @property
    def rescale_s(self) -> float:
        """Stall per failure of an elastic job: down-scale plus up-scale."""
        return self.downscale_s + self.upscale_s

    def with_(self, **changes: Any) -> FailureModel:
        """A copy with some settings changed (validated again)."""
        return FailureModel(**{**asdict(self), **changes})

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "slowdowns": list(self.slowdowns),
            "recovery_mean_s": self.recovery_mean_s,
            "rescale_s": self.rescale_s,
        }


def failure_rate(chips: float, model: FailureModel) -> float:
    """Interruptions per second of a unit of ``chips`` chips that all must run: chips / MTBI."""
    return chips / model.chip_mtbi_s


def cluster_mtbf_hours(chips: float, *, chip_mtbi_hours: float = HOURS_PER_YEAR) -> float:
    """The cluster's mean time between failures: MTBI per chip / chips."""
    return chip_mtbi_hours / chips


def _check_chips(chips: float, learners: int) -> None:
    if not (isinstance(chips, (int, float)) and math.isfinite(chips) and chips > 0):
        raise ConfigError(f"chips={chips!r}: give the number of chips, > 0 (e.g. 150_000)")
    if not (isinstance(learners, int) and learners >= 1):
        raise ConfigError(f"learners={learners!r}: give a whole number of learners >= 1 (M)")


def straggler_factor(model: FailureModel, *, waits: bool) -> float:
    """Share of chip-time not spent waiting for a slower group: mean(s) / max(s) if groups wait, else 1."""
    if not waits or not model.slowdowns:
        return 1.0
    return sum(model.slowdowns) / len(model.slowdowns) / max(model.slowdowns)


def checkpoint_factor(rate: float, interval_s: float) -> float:
    """Expected share of running time kept when a run restarts from its last checkpoint.

    Running time between interruptions is exponential (rate ``rate``) and only whole checkpoint
    intervals are kept: E[C floor(U / C)] / E[U] = x / (e^x - 1), x = rate * C.
    """
    x = rate * interval_s
    return 1.0 if x == 0 else x / math.expm1(x)


def goodput_non_elastic(chips: float, model: FailureModel = FailureModel()) -> float:
    """Data-parallel that stops on every failure, waits for recovery and restarts from a checkpoint."""
    _check_chips(chips, 1)
    lam = failure_rate(chips, model)
    return checkpoint_factor(lam, model.checkpoint_interval_s) / (1.0 + lam * model.recovery_mean_s)


def goodput_elastic(chips: float, model: FailureModel = FailureModel()) -> float:
    """Data-parallel that drops a failed slice (stall t_down) and takes it back after recovery (t_up)."""
    _check_chips(chips, 1)
    rho = 1.0 / (1.0 + failure_rate(chips, model) * model.rescale_s)
    idle = rho * min(model.slice_chips, chips) * model.recovery_mean_s / model.chip_mtbi_s
    return rho * (1.0 - idle)


def goodput_decoupled(
    chips: float, learners: int, model: FailureModel = FailureModel(), *, elastic_learners: bool = True
) -> float:
    """M learners on ``chips`` chips (N / M each) that never wait for each other (quorum K = 1)."""
    _check_chips(chips, learners)
    per_learner = chips / learners
    if elastic_learners:
        return goodput_elastic(per_learner, model)
    lam = failure_rate(per_learner, model)
    return 1.0 / (1.0 + lam * (model.recovery_mean_s + model.upscale_s))


def goodput_synchronous(chips: float, learners: int, model: FailureModel = FailureModel()) -> float:
    """M replicas that sync (DiLoCo / Streaming DiLoCo): a stall anywhere waits everyone (elastic DP on N)."""
    _check_chips(chips, learners)
    return goodput_elastic(chips, model) * straggler_factor(model, waits=True)


def goodput(method: str, *, chips: float, learners: int = 1, model: FailureModel = FailureModel()) -> float:
    """Goodput of one of :data:`METHODS` on ``chips`` chips with ``learners`` learners (M)."""
    if method == "dp":
        return goodput_non_elastic(chips, model) * straggler_factor(model, waits=True)
    if method == "dp_elastic":
        return goodput_elastic(chips, model) * straggler_factor(model, waits=True)
    if method == "synchronous":
        return goodput_synchronous(chips, learners, model)
    if method == "decoupled":
        return goodput_decoupled(chips, learners, model) * straggler_factor(model, waits=False)
    raise ConfigError(f"method={method!r}: give one of {', '.join(METHODS)}")


def goodput_by_method(*, chips: float, learners: int, model: FailureModel = FailureModel()) -> dict[str, float]:
    """Goodput of every method in :data:`METHODS` (what ``diloco plan --chip-mtbi-years`` prints)."""
    return {m: goodput(m, chips=chips, learners=learners, model=model) for m in METHODS}


def goodput_table(
    chips: Sequence[float], learners: Sequence[int], model: FailureModel = FailureModel()
) -> dict[str, list[float]]:
    """Rows like the paper's Table 1: DP, elastic DP and decoupled M for each M, over ``chips``."""
    rows = {
        "dp": [goodput_non_elastic(n, model) for n in chips],
        "dp_elastic": [goodput_elastic(n, model) for n in chips],
    }
    for m in learners:
        rows[f"decoupled_M{m}"] = [goodput_decoupled(n, m, model) for n in chips]
    return rows


__all__ = [
    "FailureModel",
    "HOURS_PER_YEAR",
    "METHODS",
    "METHOD_LABELS",
    "checkpoint_factor",
    "cluster_mtbf_hours",
    "failure_rate",
    "goodput",
    "goodput_by_method",
    "goodput_decoupled",
    "goodput_elastic",
    "goodput_non_elastic",
    "goodput_synchronous",
    "goodput_table",
    "straggler_factor",
]
