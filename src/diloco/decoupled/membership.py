"""Who holds each learner index of a syncer service: the claims of learner jobs, their heartbeats, who finished.

A learner job that connects with a session (:func:`diloco.decoupled.ray_channel.connect` with
``fingerprint=``) claims its index first (:meth:`Membership.hello`), is refused if its config differs from the
syncer's in what the merge depends on, and holds the index with a heartbeat every :data:`HEARTBEAT_S`; a claim
lapses :data:`LEASE_S` after its session was last heard from, so the job of a killed learner that restarts at
once gets in, while a second job started on a live learner's index is refused. :class:`Membership` is a part of
the syncer actor (:class:`~diloco.decoupled.ray_transport.SyncerActor`), which runs these calls on its event
loop with the syncer's.

The claims outlive the actor: each learner index's session is part of the syncer's checkpointed state
(:func:`claims_state` / :func:`restore_claims`, saved whenever a claim changes hands), and a restored syncer (Ray's
restart of the actor, or a restarted ``diloco syncer`` monitor) starts a fresh lease for each at restore time. A
second job claiming a live learner's index is refused across a restart as before it, while the live learner's
heartbeats, which reach the restored syncer within the lease, keep its claim.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

#: Seconds a learner's claim on its index lasts after it was last heard from (a join or a heartbeat): a second
#: job claiming a live learner's index waits this long for the claim to lapse, then is refused. (Not the learner
#: lease, :mod:`diloco.decoupled.learner_lease`: that one decides whom a merge waits for, this one who holds an index.)
LEASE_S = 5.0
#: Seconds between the heartbeats of a learner connected with a session (``connect`` with ``session=``).
HEARTBEAT_S = 1.0


def claims_state(claims: dict[int, tuple[str, float]]) -> dict[str, str]:
    """The claims as saved (strict JSON, also what a replica of the syncer's state carries): learner index (a
    string) -> the session holding it. The times last heard from are not saved: they are this process's
    monotonic clock, meaningless to another (:func:`restore_claims` starts a fresh lease instead)."""
    return {str(m): session for m, (session, _) in sorted(claims.items())}


def restore_claims(saved: dict[str, str] | None, now: float) -> dict[int, tuple[str, float]]:
    """:func:`claims_state`'s claims, each heard from at ``now`` (the restore's monotonic time): a fresh lease of
    ``LEASE_S``, in which a live learner's heartbeat comes and holds it, and after which a dead learner's lapses.
    ``saved`` None (a checkpoint written before claims were saved): no claims."""
    return {int(m): (str(session), now) for m, session in (saved or {}).items()}


def holders_from_events(checkpoint_dir: str | None, claims: dict[int, tuple[str, float]]) -> dict[int, str]:
    """Where each restored claim's job runs (learner -> its ``host``, "HOST pid N"), from the ``hello`` rows of
    ``checkpoint_dir/events.jsonl`` whose session still holds the index: a syncer restarted from its folder names
    the holder to a job that lost the index, as its predecessor did. Learners with no such row are left out (a
    standby's folder holds no events of the active's)."""
    path = os.path.join(checkpoint_dir, "events.jsonl") if checkpoint_dir else None
    if not claims or path is None or not os.path.exists(path):
        return {}
    held = {session: m for m, (session, _) in claims.items()}
    holders: dict[int, str] = {}
    with open(path) as fh:
        for line in fh:
            if '"hello"' not in line:
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # a row cut short by a crash
                continue
            m = held.get(row.get("session"))
            if row.get("event") == "hello" and m is not None and row.get("host"):
                holders[m] = str(row["host"])
    return holders


class Membership:
    """The claims part of the syncer actor (module docstring). The actor sets ``fingerprint`` (the config keys
    learners must match, or None), ``_claims`` (learner -> (session, monotonic time last heard from)) and
    ``_finished``, and provides ``syncer``, ``restored_merges``, ``checkpoint_dir``, ``_save`` (its state, the
    claims included: :func:`claims_state`) and ``_log``."""

    syncer: Any
    fingerprint: dict[str, Any] | None
    restored_merges: int | None
    checkpoint_dir: str | None
    _claims: dict[int, tuple[str, float]]
    _finished: set[int]

    def _log(self, event: str, **fields: Any) -> None:
        raise NotImplementedError

    def _claims_changed(self) -> None:
        """A claim changed hands (granted to a new session): the actor's state, claims included, is saved."""
        if self.checkpoint_dir is not None:
            self._save()

    def _save(self) -> None:
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
        changed = self._claims.get(learner, (None,))[0] != session
        self._claims[learner] = (session, time.monotonic())
        self._log("hello", learner=learner, session=session, host=host)
        self.__dict__.setdefault("_holders", {})[learner] = host  # named to a job that lost this index
        if changed:  # on disk before the job is told it holds the index: a syncer restored after this keeps it
            self._claims_changed()
        return None

    async def heartbeat(self, learner: int, session: str) -> bool:
        """``session`` is alive; True while it holds ``learner``'s index (a syncer restored from a checkpoint
        that holds no claim for it, one written before claims were saved, gives the index to the session that
        beats for it)."""
        claim = self._claims.get(learner)
        regained = claim is None and learner not in self._finished
        if regained:
            claim = (session, 0.0)
        if claim is None or claim[0] != session:
            return False
        self._claims[learner] = (session, time.monotonic())
        if regained:
            self._claims_changed()
        return True

    def claim_refusal(self, learner: int, session: str | None) -> str | None:
        """Why ``session`` may no longer act as learner ``learner`` (another session holds its index:
        :mod:`diloco.decoupled.claim_lost`), or None (it holds it, nobody does, or a call without a session)."""
        claim = self._claims.get(learner)
        if session is None or claim is None or claim[0] == session:
            return None
        from diloco.decoupled.claim_lost import lost_message

        return lost_message(learner, self.__dict__.get("_holders", {}).get(learner), LEASE_S)

    async def beat(self, learner: int, session: str) -> str | None:
        """A job's heartbeat (:meth:`heartbeat`, the actor's, which the learner lease hears too): None, or why this
        session no longer holds ``learner``'s index (:meth:`claim_refusal`: the job stops)."""
        held = await self.heartbeat(learner, session)
        return None if held else self.claim_refusal(learner, session)

    async def report_from(self, report: Any, session: str | None = None) -> None:
        """The actor's ``report`` from a job of ``session``: refused (a ConfigError; logged), not counted, where that
        session lost the learner's index to another (:mod:`diloco.decoupled.claim_lost`)."""
        self._refuse_lost(report.learner, session)
        await self.report(report)

    async def hold_from(self, learner: int, step: int, session: str | None = None) -> None:
        """The actor's ``hold`` from a job of ``session``: refused as :meth:`report_from` is, where that session
        lost the learner's index (the rounds of the job now holding it must not stop waiting for it)."""
        self._refuse_lost(learner, session)
        await self.hold(learner, step)

    def _refuse_lost(self, learner: int, session: str | None) -> None:
        """A ConfigError (logged: ``refused``, ``claim lost``) where ``session`` lost ``learner``'s index."""
        refused = self.claim_refusal(learner, session)
        if refused is not None:
            self._log("refused", learner=learner, why="claim lost")
            from diloco.errors import ConfigError

            raise ConfigError(refused)

    async def report(self, report: Any) -> None:
        raise NotImplementedError

    async def hold(self, learner: int, step: int) -> None:
        raise NotImplementedError

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


__all__ = ["HEARTBEAT_S", "LEASE_S", "Membership", "claims_state", "holders_from_events", "restore_claims"]
