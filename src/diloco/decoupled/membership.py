"""Who holds each learner index of a syncer service: the claims of learner jobs, their heartbeats, who finished.

A learner job that connects with a session (:func:`diloco.decoupled.ray_transport.connect` with
``fingerprint=``) claims its index first (:meth:`Membership.hello`), is refused if its config differs from the
syncer's in what the merge depends on, and holds the index with a heartbeat every :data:`HEARTBEAT_S`; a claim
lapses :data:`LEASE_S` after its session was last heard from, so the job of a killed learner that restarts at
once gets in, while a second job started on a live learner's index is refused. :class:`Membership` is a part of
the syncer actor (:class:`~diloco.decoupled.ray_transport.SyncerActor`), which runs these calls on its event
loop with the syncer's.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

#: Seconds a learner's claim on its index lasts after it was last heard from (a join or a heartbeat): a second
#: job claiming a live learner's index waits this long for the claim to lapse, then is refused. (Not the learner
#: lease, :mod:`diloco.decoupled.learner_lease`: that one decides whom a merge waits for, this one who holds an index.)
LEASE_S = 5.0
#: Seconds between the heartbeats of a learner connected with a session (``connect`` with ``session=``).
HEARTBEAT_S = 1.0


class Membership:
    """The claims part of the syncer actor (module docstring). The actor sets ``fingerprint`` (the config keys
    learners must match, or None), ``_claims`` (learner -> (session, monotonic time last heard from)) and
    ``_finished``, and provides ``syncer``, ``restored_merges`` and ``_log``."""

    syncer: Any
    fingerprint: dict[str, Any] | None
    restored_merges: int | None
    _claims: dict[int, tuple[str, float]]
    _finished: set[int]

    def _log(self, event: str, **fields: Any) -> None:
        raise NotImplementedError

    def _release(self, learner: int, session: str | None) -> bool:
        """A ``leave`` from ``session``: whether it may go on (it still holds ``learner``'s index, or came without a
        session); the claim is given up."""
        if session is None:
            return True
        claim = self._claims.get(learner)
        if claim is not None and claim[0] != session:
            return False
        self._claims.pop(learner, None)
        return True

    async def hello(
        self, learner: int, session: str, fingerprint: dict[str, Any] | None = None, host: str | None = None
    ) -> str | None:
        """A learner job's claim on index ``learner`` before it joins: None when granted, else why it is refused
        (the caller raises it as a ConfigError). Refused: an index out of range, a ``fingerprint`` that differs
        from this syncer's (each key named with both values), a learner that has finished, and an index another
        session holds and was heard from within ``LEASE_S`` (waited for up to ``LEASE_S`` first: the job of a
        killed learner that restarts at once gets in once its predecessor's claim lapses). ``host``: where the job runs
        (``host pid N``), for the status page."""
        num = self.syncer.num_learners
        if not isinstance(learner, int) or isinstance(learner, bool) or not 0 <= learner < num:
            return (
                f"learner={learner!r} is out of range: this syncer serves {num} learners, numbered 0..{num - 1} "
                f"(replicas={num}); give --set learner=0..{num - 1}"
            )
        if self.fingerprint is not None:
            from diloco.decoupled.fingerprint import describe_differences

            differences = describe_differences(syncer=self.fingerprint, learner=fingerprint or {})
            if differences:
                self._log("refused", learner=learner, why="config")
                return (
                    f"learner {learner}'s config differs from the syncer's in what the merge depends on: "
                    f"{differences}. Start the learner with the syncer's settings (the command `diloco syncer` "
                    f"printed, also in its syncer.json)"
                )
        # a claim lapses when its session has not been heard from for LEASE_S, seen twice HEARTBEAT_S apart:
        # heartbeats queued while this actor was busy (a merge, a checkpoint) are taken in between
        deadline, lapsed_at = time.monotonic() + LEASE_S, None
        while True:
            if learner in self._finished:  # (also when it finished while this call waited for its claim)
                return (
                    f"learner {learner} has finished this run (it left after its last step) and cannot join "
                    f"again: start a new run (a new `diloco syncer --out`) to train more"
                )
            claim = self._claims.get(learner)
            now = time.monotonic()
            if claim is None or claim[0] == session:
                break
            if now - claim[1] >= LEASE_S:
                lapsed_at = now if lapsed_at is None else lapsed_at
                if now - lapsed_at >= 2 * HEARTBEAT_S:
                    break
            else:
                lapsed_at = None
                if now >= deadline:
                    self._log("refused", learner=learner, why="claimed")
                    return (
                        f"learner {learner} is taken: another job holding that index was heard from "
                        f"{now - claim[1]:.1f} s ago (its claim lapses {LEASE_S:g} s after it stops): "
                        f"give this job another --set learner=0..{num - 1}, or stop the other job first"
                    )
            await asyncio.sleep(0.1)
        self._claims[learner] = (session, time.monotonic())
        self._log("hello", learner=learner, session=session, host=host)
        return None

    async def heartbeat(self, learner: int, session: str) -> bool:
        """``session`` is alive; True while it holds ``learner``'s index (a restarted syncer, which has lost
        the claims, gives the index back to the session that beats for it)."""
        claim = self._claims.get(learner)
        if claim is None and learner not in self._finished:
            claim = (session, 0.0)
        if claim is None or claim[0] != session:
            return False
        self._claims[learner] = (session, time.monotonic())
        return True

    async def status(self) -> dict[str, Any]:
        """What the service's monitor prints: merges so far, members, learners heard from within the lease,
        finished learners, this process's pid and the merges it was restored from."""
        now = time.monotonic()
        return {
            "num_learners": self.syncer.num_learners,
            "merges": len(self.syncer.records),
            "members": sorted(self.syncer.members),
            "live": sorted(m for m, (_, t) in self._claims.items() if now - t < LEASE_S),
            "finished": sorted(self._finished),
            "pid": os.getpid(),
            "restored_merges": self.restored_merges,
        }


__all__ = ["HEARTBEAT_S", "LEASE_S", "Membership"]
