"""The syncer actor's side of the learner lease (:mod:`diloco.decoupled.learner_lease`): it carries each heartbeat a
learner job's claim holds to the syncer, and writes each leave and join the lease decides to the actor's
``events.jsonl`` (``lease left``: learner, seconds silent, the lease; ``lease joined``: learner, the lease). The
decisions are the syncer's (a transport-free state machine, on its own clock); this only carries and records."""

from __future__ import annotations

from typing import Any

from diloco.decoupled.membership import Membership


class LeaseLog(Membership):
    """Mixed into :class:`~diloco.decoupled.ray_transport.SyncerActor` before :class:`Membership`; the actor calls
    :meth:`_log_lease` each time the syncer may have decided (``_deliver``), and sets ``_lease_logged`` to the
    events a restored syncer already holds."""

    _lease_logged = 0

    def _arm(self) -> None:
        raise NotImplementedError

    async def hello(
        self, learner: int, session: str, fingerprint: dict[str, Any] | None = None, host: str | None = None
    ) -> str | None:
        """:meth:`Membership.hello`; a granted claim is the learner's first sign of life under the lease (a job that
        claims with a session heartbeats from then on): one that dies before its first beat leaves by its lease too
        (it was never watched, and at K = M every merge waited for it for good)."""
        refused = await super().hello(learner, session, fingerprint, host)
        if refused is None:
            first = not self.syncer.lease.watches(learner)
            self.syncer.heartbeat(learner)
            if first:
                self._arm()
        return refused

    async def heartbeat(self, learner: int, session: str) -> bool:
        """:meth:`Membership.heartbeat`; a beat of the session that holds ``learner`` is the syncer's sign of life."""
        held = await super().heartbeat(learner, session)
        if held:
            first = not self.syncer.lease.watches(learner)
            self.syncer.heartbeat(learner)
            if first:  # now under the lease: the syncer's timer must look at it (a beat after its join)
                self._arm()
        return held

    def _log_lease(self) -> None:
        events = self.syncer.lease.events
        for event in events[self._lease_logged :]:
            self._log(**event)
        self._lease_logged = len(events)

    async def learner_lease(self) -> dict[str, Any]:
        """The lease and its leaves and joins so far (:meth:`~diloco.decoupled.learner_lease.LearnerLease.summary`)."""
        return self.syncer.lease.summary()


__all__ = ["LeaseLog"]
