"""The learner lease (the syncer's failure detector): with K = M, a learner silent past its lease leaves the quorum,
the others merge without it, and it counts again once its job has joined again and done new work.

The syncer runs on an injected clock (a list holding the time): a legitimate fake, since time itself is what these
tests are about, and the syncer is a transport-free state machine that reads it only through ``clock``. The test
moves the clock as a transport's timer would (to :meth:`Syncer.next_deadline`) and beats for the live learners
every second as their jobs' heartbeat threads do."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch
from _tiny import make_model

from diloco.decoupled.learner_lease import (
    CONFIRM_S,
    LEASE_MARGIN_S,
    LearnerLease,
    check_learner_lease,
    combine_summaries,
)
from diloco.decoupled.lease_actor import LeaseLog
from diloco.decoupled.messages import Report
from diloco.decoupled.syncer import Syncer
from diloco.errors import ConfigError
from diloco.wire.registry import get_codec

LEASE = 10.0


def _syncer(t: list[float], *, lease: float = LEASE, beat: bool = True) -> Syncer:
    syncer = Syncer(make_model(), num_learners=3, grace_gamma=0.0, guard="off", learner_lease=lease, clock=lambda: t[0])
    assert syncer.quorum == 3  # K = M
    for m in range(3):
        syncer.join(m)
        if beat:
            syncer.heartbeat(m)
    return syncer


def _report(syncer: Syncer, m: int, *, step: int, steps: int = 8, step_time: float = 0.1) -> Report:
    base = syncer._base[m][0]
    gen = torch.Generator().manual_seed(31 * step + m)
    return Report(
        learner=m,
        fragment=0,
        payload=get_codec("fp32").encode(1e-2 * torch.randn(base.shape, generator=gen)),
        steps=steps,
        tokens=64.0 * steps,
        step_time=step_time,
        sent_after_step=step,
        base_version=syncer._held[m][0],
    )


def _merges(syncer: Syncer) -> list[tuple[int, ...]]:
    return [r.learners for r in syncer.records]


def test_a_silent_learner_leaves_at_its_lease_the_others_merge_and_it_counts_again_after_it_joins():
    """Round 1: all three merge. Learner 2 then falls silent (its last sign of life: its report at t = 1); 0 and 1
    beat every second and report after step 16. The round waits for learner 2 (K = M) until a look finds it past
    the lease (t = 11), and a second look CONFIRM_S later (t = 13) lets it go: the round merges 0 and 1 then, not
    before. The next rounds of 0 and 1 merge at once (none is blocked). A report from learner 2's old process is
    refused, saying why. Its restarted job joins again: the round open at its join does not wait for it, the next
    one does, and its work counts there (weight > 0). The leave and the join are the lease's events and counts."""
    t = [0.0]
    syncer = _syncer(t)
    t[0] = 1.0
    for m in range(3):
        syncer.receive(_report(syncer, m, step=8))
    assert _merges(syncer) == [(0, 1, 2)]

    looks = []  # the times the syncer's timer wakes it (next_deadline), beats of 0 and 1 each second between
    t[0] = 2.0
    for m in (0, 1):
        syncer.heartbeat(m)
        assert syncer.receive(_report(syncer, m, step=16)) == []
    while len(syncer.records) == 1:
        due = syncer.next_deadline()
        assert due is not None, "an open round waits for learner 2: the lease must wake the syncer"
        while t[0] + 1.0 < due:  # heartbeats of the live learners, each second until the timer
            t[0] += 1.0
            for m in (0, 1):
                syncer.heartbeat(m)
            assert syncer.poll() == []
        t[0] = due
        looks.append(due)
        replies = syncer.poll()
    assert looks == [1.0 + LEASE, 1.0 + LEASE + CONFIRM_S]  # first past the lease, then confirmed
    assert sorted(r.learner for r in replies) == [0, 1] and _merges(syncer)[-1] == (0, 1)
    assert 2 not in syncer.members and syncer.lease.leaves == 1
    left = syncer.lease.events[-1]
    assert left["event"] == "lease left" and left["learner"] == 2 and left["silent_s"] == LEASE + CONFIRM_S

    for rnd in range(3):  # no merge waits for learner 2 any more
        t[0] += 1.0
        for m in (0, 1):
            syncer.heartbeat(m)
        syncer.receive(_report(syncer, 0, step=24 + 8 * rnd))
        assert len(syncer.receive(_report(syncer, 1, step=24 + 8 * rnd))) == 2
        assert _merges(syncer)[-1] == (0, 1) and all(w > 0 for w in syncer.records[-1].weights)

    with pytest.raises(ConfigError, match=r"learner 2 left the quorum: .* 12\.0 s, past its learner_lease of 10\.0 s"):
        syncer.receive(Report(2, 0, torch.zeros(1), 8, 512.0, 0.1, 56, base_version=0))

    syncer.receive(_report(syncer, 0, step=56))  # a round opens; then learner 2's job joins again
    welcome = syncer.join(2)
    syncer.heartbeat(2)
    assert welcome.incarnation == 1 and welcome.step == 56 and 2 in syncer.members
    assert syncer.lease.joins == 1 and syncer.lease.events[-1] == {
        "event": "lease joined",
        "learner": 2,
        "lease_s": LEASE,
    }
    assert len(syncer.receive(_report(syncer, 1, step=56))) == 2  # opened before its join: not waited for
    assert _merges(syncer)[-1] == (0, 1)
    for m in (0, 1):
        assert syncer.receive(_report(syncer, m, step=64)) == []  # opened after: K = M waits for it again
    replies = syncer.receive(_report(syncer, 2, step=64))
    assert sorted(r.learner for r in replies) == [0, 1, 2]
    rec = syncer.records[-1]
    assert rec.learners == (0, 1, 2) and rec.weights[2] > 0  # counted again

    summary = syncer.lease.summary()
    assert summary["setting"] == LEASE and summary["seconds"] == LEASE
    assert (summary["leaves"], summary["joins"]) == (1, 1)
    assert [e["event"] for e in summary["events"]] == ["lease left", "lease joined"]
    json.dumps(summary, allow_nan=False)  # strict JSON, as summary.json holds it


def test_a_slow_learner_that_beats_is_not_dropped():
    """Learner 2 takes 3 leases to report (a slow step) but beats every second: the round waits for it the whole
    time (K = M), it never leaves, and the merge is of all three."""
    t = [0.0]
    syncer = _syncer(t)
    for m in (0, 1):
        syncer.receive(_report(syncer, m, step=8))
    for _ in range(int(3 * LEASE)):
        t[0] += 1.0
        for m in range(3):
            syncer.heartbeat(m)
        assert syncer.poll() == []
    assert syncer.lease.leaves == 0 and syncer.members == {0, 1, 2}
    syncer.receive(_report(syncer, 2, step=8, step_time=3 * LEASE / 8))
    assert _merges(syncer) == [(0, 1, 2)]


def test_a_syncer_that_hears_from_no_one_drops_no_one():
    """The syncer's process starved (or its host cut off) for 3 leases: no learner was heard, so no look counts and
    nobody leaves. When the beats come back, learners 0 and 1 first: a look then finds learner 2 past its lease,
    but its beat comes before the confirming look, so it stays; the round merges all three."""
    t = [0.0]
    syncer = _syncer(t)
    for m in (0, 1):
        syncer.receive(_report(syncer, m, step=8))
    for _ in range(3):
        t[0] = syncer.next_deadline()
        assert t[0] <= 3 * LEASE + CONFIRM_S and syncer.poll() == []
    t[0] = 3 * LEASE + 5.0
    assert syncer.poll() == [] and syncer.lease._suspect == {}
    for m in (0, 1):
        syncer.heartbeat(m)
    assert syncer.poll() == [] and set(syncer.lease._suspect) == {2}  # first look: suspected
    t[0] += 1.0
    syncer.heartbeat(2)  # its beat, queued behind the others'
    t[0] += CONFIRM_S
    for m in (0, 1):
        syncer.heartbeat(m)
    assert syncer.poll() == [] and syncer.members == {0, 1, 2} and syncer.lease.leaves == 0
    syncer.receive(_report(syncer, 2, step=8))
    assert _merges(syncer) == [(0, 1, 2)]


def test_a_learner_that_never_beats_is_never_timed_out():
    """The threads transport's learners (threads of one process) send no heartbeat: however long one is silent, the
    round waits for it, and the lease asks the syncer's timer for nothing."""
    t = [0.0]
    syncer = _syncer(t, beat=False)
    for m in (0, 1):
        syncer.receive(_report(syncer, m, step=8))
    assert syncer.next_deadline() is None
    t[0] = 1e6
    assert syncer.poll() == [] and syncer.members == {0, 1, 2} and syncer.lease.leaves == 0


def test_the_automatic_lease_is_a_margin_above_the_slowest_step_seen():
    """``learner_lease=0``: LEASE_MARGIN_S before any report, then that much above the slowest step reported."""
    t = [0.0]
    syncer = _syncer(t, lease=0.0)
    assert syncer.lease.seconds == LEASE_MARGIN_S and syncer.lease.summary()["setting"] == "auto"
    syncer.receive(_report(syncer, 0, step=8, step_time=4.0))
    syncer.receive(_report(syncer, 1, step=8, step_time=0.5))
    assert syncer.lease.seconds == LEASE_MARGIN_S + 4.0


def test_a_restored_syncer_keeps_the_lease_and_watches_its_learners_from_its_start():
    """A syncer restarted from its state keeps the leaves, joins and events, and the learners that beat before: one
    that never beats again leaves a lease after the restart (not never)."""
    t = [0.0]
    syncer = _syncer(t)
    t[0] = 20.0
    for m in (0, 1):
        syncer.heartbeat(m)
    syncer.poll()
    t[0] = 23.0
    for m in (0, 1):
        syncer.heartbeat(m)
    syncer.poll()
    assert syncer.lease.leaves == 1
    syncer.join(2)
    state = syncer.state_dict()
    t[0] = 100.0
    again = Syncer(make_model(), num_learners=3, guard="off", learner_lease=LEASE, clock=lambda: t[0])
    again.load_state_dict(state)
    assert (again.lease.leaves, again.lease.joins, len(again.lease.events)) == (1, 1, 2)
    assert again.next_deadline() == 100.0 + LEASE


@pytest.mark.parametrize("bad", [-1.0, 1.0, float("nan"), "10", True])
def test_a_bad_lease_is_refused_naming_the_value_and_the_fix(bad):
    with pytest.raises(ConfigError, match=r"learner_lease=.*give 0 \(auto: 5 s above the slowest step"):
        check_learner_lease(bad)


def test_the_config_refuses_a_bad_lease():
    from diloco.train.config import TrainConfig

    with pytest.raises(ConfigError, match=r"learner_lease=2\.0: give 0"):
        TrainConfig.from_dict({"method": "decoupled", "replicas": 2, "steps": 8, "learner_lease": 2.0})
    assert TrainConfig.from_dict({"method": "decoupled", "replicas": 2, "steps": 8}).learner_lease == 0.0


def test_the_actor_carries_beats_of_the_claim_holder_and_logs_the_lease_events():
    """The syncer actor's part (:class:`LeaseLog`, without Ray): a beat of the session holding the index reaches the
    syncer, another session's does not; the lease's events go to the actor's log once each."""
    t = [0.0]

    class Actor(LeaseLog):
        def __init__(self) -> None:
            self.syncer = Syncer(make_model(), num_learners=2, learner_lease=LEASE, clock=lambda: t[0])
            self.fingerprint, self.restored_merges = None, None
            self._claims, self._finished, self.logged = {0: ("s0", 0.0), 1: ("s1", 0.0)}, set(), []

        def _log(self, event: str, **fields) -> None:
            self.logged.append((event, fields))

        def _arm(self) -> None:
            self.logged.append(("armed", {}))

    actor = Actor()
    for m in (0, 1):
        actor.syncer.join(m)
    assert asyncio.run(actor.heartbeat(0, "s0")) and asyncio.run(actor.heartbeat(0, "s0"))  # armed once
    assert not asyncio.run(actor.heartbeat(1, "other")) and not actor.syncer.lease.watches(1)
    assert actor.syncer.next_deadline() == LEASE  # learner 0 is watched; learner 1 (no beat of its own) is not
    for now in (LEASE, LEASE + CONFIRM_S):  # learner 1's job beats; learner 0's is silent
        t[0] = now
        assert asyncio.run(actor.heartbeat(1, "s1"))
        actor.syncer.poll()
    actor._log_lease()
    actor._log_lease()
    assert actor.logged == [
        ("armed", {}),  # the first beat of a claim holder puts it under the lease: the timer is set
        ("armed", {}),
        ("lease left", {"learner": 0, "silent_s": LEASE + CONFIRM_S, "lease_s": LEASE}),
    ]
    assert asyncio.run(actor.learner_lease())["leaves"] == 1


def test_shards_summaries_combine():
    a, b = LearnerLease(LEASE), LearnerLease(LEASE)
    for lease in (a, b):
        lease.beat(1, 0.0)
        for now in (LEASE, LEASE + CONFIRM_S):
            lease.beat(0, now)
            lease.expire(now, [0, 1])
    both = combine_summaries([a.summary(), b.summary()])
    assert both["leaves"] == 2 and [e["shard"] for e in both["events"]] == [0, 1]
    assert combine_summaries([a.summary()]) == a.summary()


def test_a_claim_granted_puts_its_learner_under_the_lease_so_one_dead_before_its_first_beat_leaves_too():
    """A site job that claims its index (``hello`` with a session) and dies before its first heartbeat: its claim
    is its first sign of life, so it leaves at its lease like any silent learner (across emulated hosts a learner
    killed a second after it joined was never watched, and at K = M every merge waited for it for good)."""
    t = [0.0]

    class Actor(LeaseLog):
        def __init__(self) -> None:
            self.syncer = Syncer(make_model(), num_learners=2, learner_lease=LEASE, clock=lambda: t[0])
            self.fingerprint, self.restored_merges = None, None
            self._claims, self._finished, self.logged = {}, set(), []

        def _log(self, event: str, **fields) -> None:
            self.logged.append((event, fields))

        def _arm(self) -> None:
            self.logged.append(("armed", {}))

        def _claims_changed(self) -> None:
            pass

    actor = Actor()
    assert asyncio.run(actor.hello(0, "s0")) is None and asyncio.run(actor.hello(1, "s1")) is None
    assert actor.syncer.lease.watches(0) and actor.syncer.lease.watches(1)
    for m in (0, 1):
        actor.syncer.join(m)
    for now in (LEASE, LEASE + CONFIRM_S):  # learner 1 beats; learner 0 never did
        t[0] = now
        assert asyncio.run(actor.heartbeat(1, "s1"))
        actor.syncer.poll()
    actor._log_lease()
    assert ("lease left", {"learner": 0, "silent_s": LEASE + CONFIRM_S, "lease_s": LEASE}) in actor.logged
