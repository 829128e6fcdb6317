"""The syncer's failure detector: a learner silent past its *learner lease* leaves the quorum.

A learner job that holds its index with a session beats every :data:`~diloco.decoupled.membership.HEARTBEAT_S`
(a daemon thread of its process, over gRPC from a site or through Ray in-cluster); the syncer also hears from it
when it joins or reports. :class:`LearnerLease` keeps, on the syncer's injected clock, when each learner
was last heard from. A member that has beaten at least once and is then silent for ``learner_lease`` seconds, as
seen at two of the syncer's looks :data:`CONFIRM_S` apart (heartbeats that queued while the syncer was busy with
a merge or a checkpoint are taken in between), each while another learner was heard from within the last
:data:`CONFIRM_S` (a syncer that hears from no one, starved or cut off itself, drops no one), *leaves*: the syncer drops it as :meth:`Syncer.leave
<diloco.decoupled.syncer.Syncer.leave>` does (its reports in open rounds go, the rounds no longer wait for it), so
with K = M the others merge without it: K = M means "every learner alive". It comes back as a restarted learner
does: its job joins again (:meth:`Syncer.join <diloco.decoupled.syncer.Syncer.join>`: the current global
fragments, the others' step, weight 0 until it has done new work). A learner whose process lived through its
silence (a stall, a partition) finds its next report refused with a message saying so, and its job stops; torchrun
restarts it and it joins again the same way: taken back without joining, it would be out of phase with the others
and, with K = M, wait for a fragment they have passed while they wait for it (the syncer module's docstring).

A learner that never beats (the threads transport: its learners are threads of one process and cannot die alone;
a Ray channel opened without a session) is never timed out.

``learner_lease`` (the config's setting, seconds): 0 (the default) is *auto*: :data:`LEASE_MARGIN_S` above the
slowest step any report has shown (``Report.step_time``), so that a live learner whose beats stall for a whole step
(a step that holds its process's interpreter, a first step compiling) is not dropped, and a lost one is noticed
within a few seconds plus a step. A learner therefore leaves within ``lease + CONFIRM_S`` of its last sign of
life (measured: ``benchmarks/site_faults.py``'s "K = M, a site lost for good" row).

Not to be confused with :data:`diloco.decoupled.membership.LEASE_S`, the *claim* lease: how long a learner job's
claim on its index outlives its last heartbeat, so that a second job started on a live learner's index is refused
while a killed learner's restarted job gets in. That one decides who may hold an index; this one decides whom a
merge waits for.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from diloco.errors import ConfigError

#: Seconds the automatic lease (``learner_lease=0``) adds to the slowest step seen: five missed heartbeats.
LEASE_MARGIN_S = 5.0
#: The shortest lease a user may give: three heartbeats (a shorter one would drop live learners between beats).
MIN_LEARNER_LEASE_S = 3.0
#: Seconds between the two looks that find a learner past its lease before it leaves (two heartbeats).
CONFIRM_S = 2.0


def check_learner_lease(value: Any) -> float:
    """``value`` as the lease setting (0: auto, else seconds >= :data:`MIN_LEARNER_LEASE_S`); a ConfigError naming
    the value and the fix otherwise."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (value != 0 and value < MIN_LEARNER_LEASE_S):
        raise ConfigError(
            f"learner_lease={value!r}: give 0 (auto: {LEASE_MARGIN_S:g} s above the slowest step the syncer has "
            f"seen) or seconds >= {MIN_LEARNER_LEASE_S:g} (learners beat every second; a shorter lease drops live "
            f"ones); a learner silent that long leaves the quorum until its job joins again"
        )
    return float(value)


class LearnerLease:
    """Who the syncer has heard from, and when (module docstring). Transport-free: the syncer calls it with its
    own clock's ``now``. ``events``: one dict per leave and per join after a leave, in order; ``leaves`` and
    ``joins`` count them."""

    def __init__(self, setting: float = 0.0) -> None:
        self.setting = check_learner_lease(setting)
        self.slowest_step = 0.0  # the slowest Report.step_time seen (the automatic lease's base)
        self._heard: dict[int, float] = {}  # learner (that has beaten) -> clock time last heard from
        self._last: dict[int, float] = {}  # any learner -> clock time last heard from (a beat, join or report)
        self._suspect: dict[int, float] = {}  # learner -> when a look first found it past its lease
        self.lapsed: dict[int, float] = {}  # learner -> its silence when it left (until it joins again)
        self.events: list[dict[str, Any]] = []
        self.leaves = self.joins = 0

    @property
    def seconds(self) -> float:
        """The lease now: the setting, or (auto) :data:`LEASE_MARGIN_S` above the slowest step seen."""
        return self.setting if self.setting > 0 else LEASE_MARGIN_S + self.slowest_step

    def beat(self, learner: int, now: float) -> None:
        """A heartbeat: ``learner`` is under the lease from now on."""
        self._heard[learner] = self._last[learner] = now
        self._suspect.pop(learner, None)

    def watches(self, learner: int) -> bool:
        """Whether ``learner`` is under the lease (it has beaten, and has not left since)."""
        return learner in self._heard

    def heard(self, learner: int, now: float, *, step_time: float = 0.0) -> None:
        """A join or report from ``learner`` (``step_time``: a report's seconds per step)."""
        self.slowest_step = max(self.slowest_step, float(step_time))
        self._last[learner] = now
        if learner in self._heard:
            self.beat(learner, now)

    def joined(self, learner: int, now: float) -> None:
        """``learner`` joined (again): back in the quorum if it had left by its lease (an event)."""
        self.heard(learner, now)
        away = self.lapsed.pop(learner, None)
        if away is not None:
            self.joins += 1
            self.events.append({"event": "lease joined", "learner": learner, "lease_s": self.seconds})

    def left(self, learner: int) -> None:
        """``learner`` left by itself (finished, or stopping): no longer watched."""
        self._heard.pop(learner, None)
        self._suspect.pop(learner, None)
        self._last.pop(learner, None)

    def _others_heard(self, learner: int, now: float, members: set[int]) -> bool:
        """Whether a member other than ``learner`` was heard from within the last ``CONFIRM_S``."""
        return any(now - t <= CONFIRM_S for o, t in self._last.items() if o != learner and o in members)

    def expire(self, now: float, members: Iterable[int]) -> list[int]:
        """The ``members`` that leave now: beaten before, silent past the lease at two looks ``CONFIRM_S`` apart,
        each while another member was heard from lately (each leave an event)."""
        gone, members = [], set(members)
        for m in sorted(members & set(self._heard)):
            silent = now - self._heard[m]
            if silent < self.seconds or not self._others_heard(m, now, members):
                self._suspect.pop(m, None)  # (nobody else heard either: this look does not count)
            elif m not in self._suspect:
                self._suspect[m] = now
            elif now - self._suspect[m] >= CONFIRM_S:
                gone.append(m)
        for m in gone:
            silent = now - self._heard.pop(m)
            self._suspect.pop(m)
            self.lapsed[m] = silent
            self.leaves += 1
            self.events.append({"event": "lease left", "learner": m, "silent_s": silent, "lease_s": self.seconds})
        return gone

    def due(self, members: Iterable[int], now: float) -> list[float]:
        """When the next look is due for each of ``members`` under the lease (clock seconds): its lease's end, the
        confirming look, or (past its lease at a look that did not count) ``CONFIRM_S`` from ``now``."""
        out = []
        for m in set(members) & set(self._heard):
            end = self._heard[m] + self.seconds
            out.append(self._suspect[m] + CONFIRM_S if m in self._suspect else end if end > now else now + CONFIRM_S)
        return out

    def refusal(self, learner: int) -> str:
        """Why a report from ``learner``, not a member, is refused (it left by its lease, or has not joined)."""
        if learner not in self.lapsed:
            return f"a report from learner {learner}, which has not joined: join first"
        return (
            f"learner {learner} left the quorum: the syncer heard nothing from it for {self.lapsed[learner]:.1f} s, "
            f"past its learner_lease of {self.seconds:.1f} s, and the others merge without it. Restart its job "
            f"(torchrun --max-restarts does; --resume auto resumes it): it joins again with the current global "
            f"parameters and counts again once it has done new work"
        )

    def summary(self) -> dict[str, Any]:
        """The lease and what it did, for a run's ``summary.json`` (plain JSON)."""
        return {
            "setting": "auto" if self.setting == 0 else self.setting,
            "seconds": self.seconds,
            "leaves": self.leaves,
            "joins": self.joins,
            "events": [dict(e) for e in self.events],
        }

    def state_dict(self, members: Iterable[int]) -> dict[str, Any]:
        """What a restarted syncer needs: the learners under the lease (watched again from its start), those that
        left by it, the slowest step, the counts and events."""
        return {
            "watched": sorted(set(self._heard) & set(members)),
            "lapsed": {str(m): s for m, s in self.lapsed.items()},
            "slowest_step": self.slowest_step,
            "events": [dict(e) for e in self.events],
            "counts": [self.leaves, self.joins],
        }

    def load_state_dict(self, state: dict[str, Any] | None, now: float) -> None:
        """Restore a :meth:`state_dict` (None: a syncer state written before the lease existed: nothing)."""
        if state is None:
            return
        self._heard = {int(m): now for m in state["watched"]}
        self._last = dict(self._heard)
        self._suspect = {}
        self.lapsed = {int(m): float(s) for m, s in state["lapsed"].items()}
        self.slowest_step = float(state["slowest_step"])
        self.events = [dict(e) for e in state["events"]]
        self.leaves, self.joins = (int(n) for n in state["counts"])


def combine_summaries(each: list[dict[str, Any]]) -> dict[str, Any]:
    """The :meth:`LearnerLease.summary` of a syncer's shards as one: one shard's as it is; of several, the leaves and
    joins summed (a learner lost leaves at each shard: each decides on its own), the longest lease, the events of
    each with its ``shard``."""
    if len(each) == 1:
        return each[0]
    return {
        "setting": each[0]["setting"],
        "seconds": max(s["seconds"] for s in each),
        "leaves": sum(s["leaves"] for s in each),
        "joins": sum(s["joins"] for s in each),
        "events": [{**e, "shard": i} for i, s in enumerate(each) for e in s["events"]],
    }


__all__ = [
    "CONFIRM_S",
    "LEASE_MARGIN_S",
    "MIN_LEARNER_LEASE_S",
    "LearnerLease",
    "check_learner_lease",
    "combine_summaries",
]
