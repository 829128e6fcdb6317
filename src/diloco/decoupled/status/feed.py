"""The syncer actor's side of the status page: its events kept in memory for the service's monitor to read.

Every row the actor writes to ``events.jsonl`` (``started``, ``hello``, ``joined``, ``report``, ``merged``,
``left``, ``refused``, ...) also goes into a bounded in-memory list; :meth:`StatusFeed.status_feed` hands the
monitor the rows since its cursor and the merge records since its count, with the claims' liveness (:meth:`Membership.status`) and the age of the
newest checkpoint. The monitor (:mod:`diloco.decoupled.status.monitor`) folds them into its board, so what the page
shows comes from what reached the syncer's host, and survives a restart of the actor (the monitor keeps it; a new
incarnation's feed starts from its own ``started`` row).
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from typing import Any

#: The events the actor logs right after saving a checkpoint.
SAVED_WITH = ("merged", "joined", "left")
#: Rows kept for the monitor (it reads every 2 s; a report or an event is one row).
FEED_ROWS = 20_000


def whoami() -> str:
    """What a learner job tells the syncer about where it runs: ``host pid N``."""
    return f"{socket.gethostname()} pid {os.getpid()}"


class StatusFeed:
    """Mixed into the syncer actor, which calls :meth:`_feed_event` with each event row (from its ``_log``)."""

    checkpoint_dir: str | None
    _feed_rows: list[dict[str, Any]] | None = None
    _feed_first = 0  # the index of the first row kept
    _feed_id = ""
    _feed_saved_at: float | None = None  # wall time of the newest checkpoint
    _feed_busy_s = 0.0  # seconds this actor spent answering status_feed (what the page costs the syncer)
    _feed_cpu_s = 0.0
    _feed_calls = 0

    def _feed_event(self, row: dict[str, Any]) -> None:
        if self._feed_rows is None:
            self._feed_rows, self._feed_id = [], uuid.uuid4().hex
        self._feed_rows.append(row)
        if row.get("event") in SAVED_WITH:
            self._feed_saved_at = row["t"]
        if len(self._feed_rows) > FEED_ROWS:
            drop = len(self._feed_rows) - FEED_ROWS // 2
            del self._feed_rows[:drop]
            self._feed_first += drop

    def _checkpoint_age(self) -> float | None:
        """Seconds since the newest checkpoint: the actor saves one right before it logs a merge, a join or a
        leave (at its start: the age of the file it restored from, read once)."""
        if self.checkpoint_dir is None:
            return None
        if self._feed_saved_at is None:
            from diloco.decoupled.checkpoint import saved_states

            states = saved_states(self.checkpoint_dir)
            try:
                self._feed_saved_at = states[-1].stat().st_mtime if states else None
            except FileNotFoundError:  # replaced meanwhile: the next call looks again
                return None
        return None if self._feed_saved_at is None else max(0.0, time.time() - self._feed_saved_at)

    async def status_feed(self, feed: str = "", cursor: int = 0, merges: int = 0) -> dict[str, Any]:
        """The rows after ``cursor`` of the feed ``feed`` (all kept rows when ``feed`` is another incarnation's),
        the merge records after the first ``merges`` (every merge, from the syncer's own records: a restarted
        syncer holds them all again), the membership status, the checkpoint's age and this feed's id; ``lost``:
        rows dropped before they were read."""
        began, began_cpu = time.perf_counter(), time.thread_time()
        if self._feed_rows is None:
            self._feed_rows, self._feed_id = [], uuid.uuid4().hex
        start = cursor if feed == self._feed_id else 0
        lost = max(0, self._feed_first - start)
        rows = self._feed_rows[max(0, start - self._feed_first) :]
        answer = {
            "feed": self._feed_id,
            "next": self._feed_first + len(self._feed_rows),
            "rows": rows,
            "records": [r.as_row() for r in self.syncer.records[merges:]],  # type: ignore[attr-defined]
            "merges": len(self.syncer.records),  # type: ignore[attr-defined]
            "lost": lost,
            "status": await self.status(),  # type: ignore[attr-defined]  (Membership's)
            "checkpoint_age_s": self._checkpoint_age(),
            "now": time.time(),
            "busy_s": self._feed_busy_s,  # this actor's seconds in these calls before this one (wall)
            "cpu_s": self._feed_cpu_s,  # (its thread's CPU time: without the time other processes took)
            "calls": self._feed_calls,
        }
        self._feed_busy_s += time.perf_counter() - began
        self._feed_cpu_s += time.thread_time() - began_cpu
        self._feed_calls += 1
        return answer


__all__ = ["FEED_ROWS", "StatusFeed", "whoami"]
