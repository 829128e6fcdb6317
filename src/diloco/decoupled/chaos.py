"""Faults to inject into a decoupled run (pure functions); what the logs say about them afterwards is
:mod:`diloco.decoupled.chaos_logs`.

:class:`Chaos` describes the faults: learner kills (at given times, or at a Poisson rate), the time a
killed learner stays down, per-learner slow-downs (stragglers), syncer kills and corrupted learners (for
a while, a learner's reports carry a scaled or random outer gradient: finite and wrong).
:meth:`Chaos.events` turns the kills into a schedule; :mod:`diloco.decoupled.ray_learners` carries it out
with SIGKILL on learners that run the trainer (site jobs), and has each corrupted learner send through
:class:`diloco.decoupled.corrupt.CorruptingChannel`.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from diloco.errors import ConfigError


@dataclass(frozen=True)
class Event:
    """At ``at`` seconds after the start, SIGKILL ``target`` (``"learner"`` ``index``, or the ``"syncer"``)."""

    at: float
    target: str
    index: int = 0


@dataclass(frozen=True)
class Chaos:
    """The faults of one run (all off by default).

    Args:
        kills: ``(seconds after start, learner)`` pairs: learner kills at fixed times.
        kill_rate: learner kills per learner per minute, drawn as a Poisson process from ``seed``.
        downtime_s: a killed learner's restart waits this long before it joins again (a machine's reboot).
        slowdown: per learner, its step time multiplied by this (1 = normal, 3 = a 3x straggler).
        syncer_kills: seconds after start at which the syncer is killed (it restarts from its checkpoint).
        corrupt: ``(seconds after start, learner, scale, duration)``: from then on, for ``duration`` seconds, the
            learner's reports carry its outer gradient times ``scale`` (``None``: values drawn from N(0, 1), the
            difference to an unrelated model) (:func:`parse_corrupt`).
        seed: for ``kill_rate`` (and the random corruption).
    """

    kills: tuple[tuple[float, int], ...] = ()
    kill_rate: float = 0.0
    downtime_s: float = 0.0
    slowdown: tuple[float, ...] = ()
    syncer_kills: tuple[float, ...] = ()
    corrupt: tuple[tuple[float, int, float | None, float], ...] = ()
    seed: int = 0

    def check(self, num_learners: int) -> None:
        for at, m in self.kills:
            if at < 0 or not 0 <= m < num_learners:
                raise ConfigError(f"chaos kill ({at}, {m}): give seconds >= 0 and a learner in 0..{num_learners - 1}")
        if self.kill_rate < 0 or self.downtime_s < 0:
            raise ConfigError(f"chaos kill_rate={self.kill_rate}, downtime_s={self.downtime_s}: both must be >= 0")
        if self.slowdown and (len(self.slowdown) != num_learners or min(self.slowdown) < 1):
            raise ConfigError(
                f"chaos slowdown={list(self.slowdown)}: give one factor >= 1 per learner "
                f"({num_learners} learners), e.g. {[1.0] * (num_learners - 1) + [3.0]}"
            )
        if any(t < 0 for t in self.syncer_kills):
            raise ConfigError(f"chaos syncer_kills={list(self.syncer_kills)}: seconds after the start, >= 0")
        for at, m, scale, duration in self.corrupt:
            if at < 0 or duration <= 0 or not 0 <= m < num_learners or (scale is not None and not math.isfinite(scale)):
                raise ConfigError(
                    f"chaos corrupt ({at}, {m}, {scale}, {duration}): give seconds >= 0, a learner in "
                    f"0..{num_learners - 1}, a finite scale (or none: random) and a duration > 0"
                )

    def corrupt_windows(self, learner: int) -> tuple[tuple[float, float, float | None], ...]:
        """``learner``'s corruption windows: (from, until) seconds after the start, and the scale (None: random)."""
        return tuple((at, at + duration, scale) for at, m, scale, duration in self.corrupt if m == learner)

    def factor(self, learner: int) -> float:
        return float(self.slowdown[learner]) if self.slowdown else 1.0

    def events(self, *, num_learners: int, duration_s: float) -> list[Event]:
        """Every kill within ``duration_s``, in time order (a Poisson draw per learner for ``kill_rate``)."""
        self.check(num_learners)
        out = [Event(float(at), "learner", int(m)) for at, m in self.kills]
        out += [Event(float(at), "syncer") for at in self.syncer_kills]
        if self.kill_rate > 0:
            rng = random.Random(self.seed)
            for m in range(num_learners):
                t = rng.expovariate(self.kill_rate / 60.0)
                while t < duration_s:
                    out.append(Event(t, "learner", m))
                    t += self.downtime_s + rng.expovariate(self.kill_rate / 60.0)
        return sorted((e for e in out if e.at < duration_s), key=lambda e: (e.at, e.target, e.index))


def parse_kills(text: str) -> tuple[tuple[float, int], ...]:
    """``"3:1,12.5:0"`` -> ((3.0, 1), (12.5, 0)): seconds after the start, then the learner."""
    out = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        at, sep, m = item.partition(":")
        try:
            if not sep:
                raise ValueError
            out.append((float(at), int(m)))
        except ValueError:
            raise ConfigError(
                f"chaos kill {item!r}: write SECONDS:LEARNER, e.g. '3:1' (learner 1 killed 3 s in)"
            ) from None
    return tuple(out)


#: Seconds a ``--corrupt`` fault lasts when its form gives no duration.
DEFAULT_CORRUPT_SECONDS = 5.0


def parse_corrupt(text: str) -> tuple[tuple[float, int, float | None, float], ...]:
    """``"12:1:1e4,20:2"`` -> ((12.0, 1, 10000.0, 5.0), (20.0, 2, None, 5.0)): ``S:M[:SCALE[:DURATION]]``, learner M
    sends SCALE x its outer gradient (no SCALE or an empty one: N(0, 1) values) from S seconds after the start for
    DURATION seconds (default :data:`DEFAULT_CORRUPT_SECONDS`)."""
    out = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        parts = item.split(":")
        try:
            if not 2 <= len(parts) <= 4:
                raise ValueError
            scale = float(parts[2]) if len(parts) > 2 and parts[2] else None
            duration = float(parts[3]) if len(parts) > 3 else DEFAULT_CORRUPT_SECONDS
            out.append((float(parts[0]), int(parts[1]), scale, duration))
        except ValueError:
            raise ConfigError(
                f"chaos corrupt {item!r}: write SECONDS:LEARNER[:SCALE[:DURATION]], e.g. '12:1:1e4' "
                f"(learner 1 sends 1e4 x its outer gradient from 12 s for {DEFAULT_CORRUPT_SECONDS:g} s) "
                f"or '12:1' (random values)"
            ) from None
    return tuple(out)


def parse_floats(text: str, what: str) -> tuple[float, ...]:
    """``"1,1,3"`` -> (1.0, 1.0, 3.0)."""
    try:
        return tuple(float(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise ConfigError(f"{what}={text!r}: give numbers separated by commas, e.g. '1,1,3'") from None


__all__ = [
    "Chaos",
    "Event",
    "parse_corrupt",
    "parse_floats",
    "parse_kills",
]
