"""The status board: a run's state folded from what reaches the syncer's host (pure; no I/O, no clock of its own).

:meth:`Board.observe` takes the syncer's event rows (``events.jsonl``: ``started``, ``hello``, ``joined``,
``report``, ``merged``, ``left``, ``refused``), :meth:`Board.merged` its merge records, :meth:`Board.poll` the
membership status the service's monitor reads every ``--poll`` seconds (who is heard from, who finished; ``None``
when the syncer does not answer), and
:meth:`Board.loss` the loss of the global parameters the monitor evaluates. :meth:`Board.snapshot` gives what the
page and the metrics show, as plain data (strict JSON):

* per learner (site ``m``): its host, its state (``live``: heard from at the monitor's last poll, or joined since;
  ``lost``: no heartbeat within the lease; ``left``:
  said it stops without finishing; ``finished``; ``not joined``), its latest step and tokens, its waiting share,
  its staleness, the last merge it counted in, its guard events and its restarts;
* the merges: per minute (the last minute) and their quorum sizes (how many learners each merged);
* the syncer: ``active`` (answering), ``not answering`` or ``stopped`` (the service ended), its epoch (1 + restarts), pid, checkpoint age.

Waiting share: a report says how many steps the learner made since it last sent that fragment and its mean
seconds of work per step; over the reports of the last :data:`WINDOW_S` seconds, the wall time not accounted for
by work is the time it waited: ``1 - (steps x step_time) / wall``. Tokens: the latest step times the report's
tokens per step.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

#: Seconds of reports the waiting share and the step rate are taken over.
WINDOW_S = 60.0
#: At most one point of a learner's step series per this many seconds (the step-rate plot).
SERIES_EVERY_S = 1.0


@dataclass
class LearnerState:
    """What the board knows about learner ``m``."""

    m: int
    host: str | None = None
    joined: bool = False
    said: str | None = None  # "left" or "finished": its last leave
    incarnation: int = 0
    joined_at: float | None = None
    step: int | None = None
    tokens_per_step: float | None = None
    staleness: int | None = None
    last_merge: dict[str, Any] | None = None
    guard: dict[str, int] = field(default_factory=dict)  # action -> count
    reports: int = 0
    last_report_at: float | None = None
    last_heard_at: float | None = None  # the last poll that found it live
    live: bool = False
    window: deque = field(default_factory=deque)  # (t, step, step_time) of recent reports
    series: list[tuple[float, int]] = field(default_factory=list)  # (t, step), one per SERIES_EVERY_S

    def waiting_share(self) -> float | None:
        w = list(self.window)
        if len(w) < 2 or w[-1][0] <= w[0][0] or w[-1][1] <= w[0][1]:
            return None
        wall = w[-1][0] - w[0][0]
        mean_step = sum(x[2] for x in w[1:]) / (len(w) - 1)
        return min(1.0, max(0.0, 1.0 - (w[-1][1] - w[0][1]) * mean_step / wall))

    def step_rate(self) -> float | None:
        w = list(self.window)
        if len(w) < 2 or w[-1][0] <= w[0][0] or w[-1][1] < w[0][1]:
            return None
        return (w[-1][1] - w[0][1]) / (w[-1][0] - w[0][0])

    def state(self) -> str:
        if self.said == "finished":
            return "finished"
        if self.live:
            return "live"
        if self.said == "left":
            return "left"
        return "lost" if self.joined else "not joined"


class Board:
    """A run's status, folded from the syncer's events and the monitor's polls (module docstring)."""

    def __init__(self, *, num_learners: int, name: str = "", started_at: float | None = None) -> None:
        self.name = name
        self.learners = [LearnerState(m) for m in range(num_learners)]
        self.merges: list[tuple[float, int, int, int, float]] = []  # (at, fragment, version, k, sync_time)
        self.epoch, self.pid, self.restored_merges = 0, None, None
        self.answering: bool | None = None
        self.polled_at: float | None = None  # wall time of the last poll the syncer answered
        self.checkpoint_age_s: float | None = None
        self.checkpoint_at: float | None = None  # wall time of the newest checkpoint (from its age at a poll)
        self.refused = 0
        self.losses: list[tuple[float, float, float]] = []  # (t, tokens, loss)
        self.started_at = started_at
        self.now = started_at or 0.0
        self.finished_run = False
        self.ended = False  # the service ended (the syncer stopped with it)

    # -- input ---------------------------------------------------------------
    def observe(self, row: dict[str, Any]) -> None:
        """One event row of the syncer (``events.jsonl``'s format)."""
        t, event = float(row.get("t", self.now)), row.get("event")
        self.now = max(self.now, t)
        self.started_at = t if self.started_at is None else min(self.started_at, t)
        m = row.get("learner")
        lr = self.learners[m] if isinstance(m, int) and 0 <= m < len(self.learners) else None
        if event == "started":
            self.epoch += 1
            self.pid, self.restored_merges = row.get("pid"), row.get("restored_merges")
        elif event == "refused":
            self.refused += 1
        elif lr is None:
            pass
        elif event == "hello":
            lr.host = row.get("host") or lr.host
        elif event == "joined":
            lr.joined, lr.said, lr.joined_at = True, None, t
            if self.answering and self.polled_at is not None and t >= self.polled_at:
                lr.live = True  # the syncer heard it join after the last poll (a folder read offline is never polled)
            lr.incarnation = int(row.get("incarnation") or 0)
            lr.window.clear()
        elif event == "left":
            lr.said = "finished" if row.get("finished") else "left"
            lr.live = False
        elif event == "report" and not row.get("ignored") and row.get("step") is not None:
            self._report(lr, t, row)

    def merged(self, record: dict[str, Any]) -> None:
        """One merge record of the syncer (``merges.jsonl``'s format: ``at``, ``fragment``, ``version``,
        ``learners``, ``guard``, ``sync_time``)."""
        t = float(record.get("at") or self.now)
        self.now = max(self.now, t)
        learners = [int(x) for x in record.get("learners", [])]
        fragment, version = int(record.get("fragment", 0)), int(record.get("version", 0))
        self.merges.append((t, fragment, version, len(learners), float(record.get("sync_time") or 0.0)))
        for k in learners:
            if 0 <= k < len(self.learners):
                self.learners[k].last_merge = {"fragment": fragment, "version": version, "at": t}
        for g in record.get("guard") or []:
            k = g.get("learner")
            if isinstance(k, int) and 0 <= k < len(self.learners):
                action = str(g.get("action", "event"))
                self.learners[k].guard[action] = self.learners[k].guard.get(action, 0) + 1

    def _report(self, lr: LearnerState, t: float, row: dict[str, Any]) -> None:
        step = int(row["step"])
        lr.step, lr.reports, lr.last_report_at = step, lr.reports + 1, t
        if row.get("steps"):
            lr.tokens_per_step = float(row.get("tokens", 0.0)) / float(row["steps"])
        lr.staleness = row.get("staleness")
        if lr.window and step < lr.window[-1][1]:  # resumed from an older checkpoint: a new window
            lr.window.clear()
        lr.window.append((t, step, float(row.get("step_time") or 0.0)))
        while lr.window and lr.window[0][0] < t - WINDOW_S:
            lr.window.popleft()
        if not lr.series or t - lr.series[-1][0] >= SERIES_EVERY_S:
            lr.series.append((t, step))

    def poll(self, status: dict[str, Any] | None, *, now: float, checkpoint_age_s: float | None = None) -> None:
        """The membership status at wall time ``now`` (``None``: the syncer did not answer)."""
        self.now = max(self.now, now)
        self.answering = status is not None
        if status is None:
            return
        self.polled_at = now
        live, finished = set(status.get("live", [])), set(status.get("finished", []))
        for lr in self.learners:
            lr.live = lr.m in live and lr.m not in finished
            if lr.live:
                lr.last_heard_at = now
            if lr.m in finished:
                lr.said = "finished"
        if checkpoint_age_s is not None:
            self.checkpoint_at = now - checkpoint_age_s
        self.finished_run = len(finished) >= len(self.learners)

    def loss(self, *, t: float, loss: float) -> None:
        """The loss of the global parameters, evaluated at wall time ``t``: plotted against the run's tokens then."""
        self.losses.append((t, self.tokens(), float(loss)))

    # -- output --------------------------------------------------------------
    def tokens(self) -> float:
        return sum((lr.step or 0) * (lr.tokens_per_step or 0.0) for lr in self.learners)

    def merges_per_minute(self) -> float:
        recent = [m for m in self.merges if m[0] > self.now - 60.0]
        return float(len(recent))

    def quorum_sizes(self) -> dict[str, int]:
        sizes: dict[str, int] = {}
        for m in self.merges:
            sizes[str(m[3])] = sizes.get(str(m[3]), 0) + 1
        return dict(sorted(sizes.items(), key=lambda kv: int(kv[0])))

    def snapshot(self) -> dict[str, Any]:
        """What the page and the metrics show (strict JSON: no NaN; unknowns are None)."""
        now = self.now
        rows = []
        for lr in self.learners:
            share, rate = lr.waiting_share(), lr.step_rate()
            rows.append(
                {
                    "learner": lr.m,
                    "site": f"site {lr.m}",
                    "host": lr.host,
                    "state": lr.state(),
                    "silent_s": None if lr.live or lr.last_heard_at is None else round(now - lr.last_heard_at, 1),
                    "step": lr.step,
                    "tokens": None if lr.step is None or lr.tokens_per_step is None else lr.step * lr.tokens_per_step,
                    "waiting_share": share,
                    "step_rate": rate,
                    "staleness": lr.staleness,
                    "last_merge": lr.last_merge,
                    "last_merge_age_s": None if lr.last_merge is None else round(now - lr.last_merge["at"], 1),
                    "guard": dict(lr.guard),
                    "guard_events": sum(lr.guard.values()),
                    "restarts": lr.incarnation,
                    "reports": lr.reports,
                }
            )
        recent = [m[3] for m in self.merges if m[0] > now - 60.0]
        return {
            "name": self.name,
            "now": now,
            "elapsed_s": None if self.started_at is None else now - self.started_at,
            "finished": self.finished_run,
            "learners": rows,
            "merges": {
                "total": len(self.merges),
                "per_minute": self.merges_per_minute(),
                "quorum_sizes": self.quorum_sizes(),
                "mean_quorum_last_minute": sum(recent) / len(recent) if recent else None,
                "mean_sync_s": _mean([m[4] for m in self.merges[-100:]]),
            },
            "syncer": {
                "state": "stopped"
                if self.ended
                else "active"
                if self.answering
                else ("not answering" if self.answering is False else "unknown"),
                "epoch": self.epoch,
                "restarts": max(0, self.epoch - 1),
                "pid": self.pid,
                "restored_merges": self.restored_merges,
                "checkpoint_age_s": None if self.checkpoint_at is None else max(0.0, now - self.checkpoint_at),
                "refused": self.refused,
            },
            "tokens": self.tokens(),
            "loss": [{"t": t, "tokens": k, "loss": v} for t, k, v in self.losses if math.isfinite(v)],
            "series": {str(lr.m): [[t, s] for t, s in lr.series] for lr in self.learners},
            "merge_times": [[m[0], m[3]] for m in self.merges],
        }


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


__all__ = ["SERIES_EVERY_S", "WINDOW_S", "Board", "LearnerState"]
