"""Emulated step times: pad each inner step with a sleep, and make some replicas stragglers.

``step_time`` (seconds, 0: off) pads every inner step's compute (forward, backward, optimizer step) to at
least that long, as an accelerator's step would take: the padded time is idle, so many replicas share few
cores without slowing each other. ``slowdown`` (``"1,1,3"``: one factor per replica) multiplies replica m's
(padded) compute by its factor: a straggler. The sleep comes before the method's syncs of the step, so a
decoupled learner's reports leave when an accelerator's would, and the step's ``compute_time_s`` (and a
learner's ``compute_s``) is the padded time.

The trainer adds a :class:`Pace` to its callbacks when the config sets either
(:func:`pace_for`); ``diloco chaos --step-time S --slowdown 1,1,3`` sets both. For a synchronous method
a straggler holds up every sync (the others wait for it); for ``method=decoupled`` only its own merges.
"""

from __future__ import annotations

import math
import time
from typing import Any

from diloco.train.trainer import TrainerCallback


class Pace(TrainerCallback):
    """Pads each step's compute to ``step_time_s`` then multiplies it by the replica's ``slowdown`` factor."""

    def __init__(self, *, step_time_s: float = 0.0, slowdown: tuple[float, ...] = ()) -> None:
        assert step_time_s >= 0 and all(f >= 1 for f in slowdown), (step_time_s, slowdown)
        self.step_time_s, self.slowdown = float(step_time_s), tuple(float(f) for f in slowdown)

    def factor(self, replica: int) -> float:
        return self.slowdown[replica] if self.slowdown else 1.0

    def after_compute(self, step: int, *, replica: int, compute_s: float) -> float:
        work = max(compute_s, self.step_time_s) * self.factor(replica)
        if work > compute_s:
            time.sleep(work - compute_s)
        return work


def pace_for(cfg: Any) -> Pace | None:
    """The config's :class:`Pace` (``step_time``, ``slowdown``), or None when it sets neither."""
    factors = cfg.slowdown_factors
    if cfg.step_time <= 0 and all(f == 1 for f in factors):
        return None
    return Pace(step_time_s=cfg.step_time, slowdown=factors)


def pace_errors(cfg: Any) -> list[str]:
    """What is wrong with a training config's ``step_time`` and ``slowdown`` (each message names the value and
    the fix)."""
    errors = []
    if not (cfg.step_time >= 0 and math.isfinite(cfg.step_time)):
        errors.append(f"step_time={cfg.step_time}: give seconds >= 0 (0: no padding)")
    try:
        factors = cfg.slowdown_factors
    except ValueError:
        return [*errors, f"slowdown={cfg.slowdown!r}: give numbers separated by commas, e.g. 1,1,3 (one per replica)"]
    if factors and (len(factors) != cfg.replicas or min(factors) < 1 or not all(map(math.isfinite, factors))):
        example = ",".join(["1"] * (cfg.replicas - 1) + ["3"])
        errors.append(
            f"slowdown={cfg.slowdown!r}: give one factor >= 1 per replica ({cfg.replicas} replicas), e.g. {example}"
        )
    return errors


__all__ = ["Pace", "pace_errors", "pace_for"]
