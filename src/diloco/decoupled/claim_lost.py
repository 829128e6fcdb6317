"""A learner job that lost its claim on its index while it lived: it stops, saying so.

A site job holds learner index m with a session and a heartbeat (:mod:`diloco.decoupled.membership`). Cut off or
stalled for longer than the claim lease (``LEASE_S``), its claim lapses; if another job then claims m (the same
site's command run again elsewhere), that job is learner m from then on. Two jobs must never both train as learner
m and both have their reports counted, so:

* the syncer refuses every report and hold of a session that no longer holds its learner's index
  (:class:`~diloco.decoupled.membership.Membership`'s ``report_from``, ``hold_from``; a ``refused`` row with
  ``why: "claim lost"`` in its ``events.jsonl``), whatever the learner does;
* the job hears it from its next heartbeat's answer (``held`` False, with :func:`lost_message` as the why) or
  from the refusal of its next report, whichever comes first, and stops at its next call to the syncer with
  :class:`ClaimLost`, naming the index, the job that holds it now and what to do; its ``learner-<m>.jsonl``
  gets a ``claim lost`` row (:class:`~diloco.decoupled.trainer.LearnerLog`).

A claim that lapsed while *nobody* took the index is not lost: the job's next beat holds it again and it goes on
without a gap (a lapse only lets another job in). A syncer that forgot the claim (restored from a checkpoint
written before claims were saved) gives the index back to the session that beats for it.
"""

from __future__ import annotations

from typing import Any

from diloco.errors import RunError

#: What every lost-claim message says (how a refusal that crossed the wire as text is told from others).
LOST_MARK = "is no longer this job's"


class ClaimLost(RunError):
    """This learner job's claim on its index went to another job: it stops (its reports are no longer counted)."""


def lost_message(learner: int, holder: str | None, lease_s: float) -> str:
    """Why a job that lost learner ``learner``'s index stops; ``holder``: where the job holding it runs, if known."""
    where = f" ({holder})" if holder else ""
    return (
        f"learner {learner}'s index {LOST_MARK}: the syncer heard nothing from this job for more than {lease_s:g} s "
        f"(a partition or a stall), its claim lapsed, and another job{where} claimed learner {learner} and trains as "
        f"it now. This job stops here so that two jobs never train as one learner (its reports are no longer "
        f"counted). If that other job is the one meant to run learner {learner}, nothing is to do (do not restart "
        f"this one: it would be refused as taken); otherwise stop the other job, then run this site's command again "
        f"(--resume auto resumes from this job's newest checkpoint)"
    )


class ClaimWatch:
    """Mixed into a learner's channel with a session (:class:`~diloco.decoupled.rpc.client.RpcChannel`,
    :class:`~diloco.decoupled.ray_channel.RayChannel`): :attr:`claim_lost` is the syncer's message once the claim
    went to another job; each call to the syncer checks it first (:meth:`_check_claim`)."""

    learner: int
    _stop: Any  # a threading.Event: set, the channel's heartbeat thread ends
    claim_lost: str | None = None

    def _beat_answer(self, lost: str | None) -> None:
        """A heartbeat's answer: None (held), or the syncer's why the claim is lost (then the beats stop)."""
        if lost is not None:
            self.claim_lost = str(lost)
            self._stop.set()

    def _check_claim(self) -> None:
        if self.claim_lost is not None:
            raise ClaimLost(self.claim_lost)

    def _checked(self, report: Any) -> Any:
        """``report``, once :meth:`_check_claim` passed (a job that lost its index sends nothing more)."""
        self._check_claim()
        return report

    def _refused(self, exc: BaseException) -> BaseException:
        """A call's error: :class:`ClaimLost` (and :attr:`claim_lost` set) where the syncer refused it for a lost
        claim, else ``exc`` itself."""
        text = str(exc)
        if LOST_MARK not in text:
            return exc
        start = text.find(f"learner {self.learner}'s index")  # the syncer's own words, past the call's
        self.claim_lost = text[start:] if start >= 0 else text
        return ClaimLost(self.claim_lost)


def claim_lost_of(channel: Any) -> str | None:
    """The lost-claim message of a learner's channel (one of a sharded or a torchrun group's), or None."""
    lost = getattr(channel, "claim_lost", None)
    if lost is not None:
        return lost
    for inner in list(getattr(channel, "channels", ())) + [getattr(channel, "channel", None)]:
        if inner is not None and inner is not channel and (found := claim_lost_of(inner)) is not None:
            return found
    return None


__all__ = ["LOST_MARK", "ClaimLost", "ClaimWatch", "claim_lost_of", "lost_message"]
