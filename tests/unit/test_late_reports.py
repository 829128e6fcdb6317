"""A report that comes after its slot's merge (K < M): it waits for the next quorum, or merges alone at once."""

from __future__ import annotations

import pytest
import torch
from _tiny import make_model

from diloco.decoupled.messages import Report
from diloco.decoupled.syncer import Syncer
from diloco.wire.registry import get_codec


def _report(syncer: Syncer, m: int, *, step: int) -> Report:
    base = syncer._base[m][0]
    return Report(
        learner=m,
        fragment=0,
        payload=get_codec("fp32").encode(base - (base - 0.01 * (m + 1))),
        steps=8,
        tokens=80.0,
        step_time=0.0,
        sent_after_step=step,
        base_version=syncer._held[m][0],
    )


@pytest.mark.parametrize("late", ["next", "alone"])
def test_the_third_report_of_a_slot_merges_at_once_only_when_asked(late):
    """M = 3, K = 2, no grace window; the three learners report after step 8, in phase. The first two merge; the
    third comes a moment later. ``next``: it opens a round that waits for a second report, which comes only
    after step 16 (a learner waits about H steps for its reply); ``alone``: it is merged at once, by itself."""
    t = [0.0]
    syncer = Syncer(make_model(), num_learners=3, quorum=2, grace_gamma=0.0, late_reports=late, clock=lambda: t[0])
    for m in range(3):
        syncer.join(m)
    assert syncer.receive(_report(syncer, 0, step=8)) == []
    replies = syncer.receive(_report(syncer, 1, step=8))
    assert sorted(r.learner for r in replies) == [0, 1] and syncer.records[-1].learners == (0, 1)
    t[0] = 0.01
    third = syncer.receive(_report(syncer, 2, step=8))
    if late == "next":
        assert third == [] and len(syncer.records) == 1  # waits for a partner from the next slot
        t[0] = 1.6
        replies = syncer.receive(_report(syncer, 0, step=16))
        assert sorted(r.learner for r in replies) == [0, 2] and syncer.records[-1].learners == (0, 2)
    else:
        assert [r.learner for r in third] == [2] and syncer.records[-1].learners == (2,)
        assert syncer.records[-1].version == 2
        # the next slot is a new one: its reports wait for a quorum of two again
        t[0] = 1.6
        assert syncer.receive(_report(syncer, 0, step=16)) == []
        replies = syncer.receive(_report(syncer, 2, step=16))
        assert sorted(r.learner for r in replies) == [0, 2]


def test_at_k_equal_m_nothing_is_late_and_the_setting_changes_nothing():
    """K = M merges every report of a slot together: the two settings give the same bits."""
    out = []
    for late in ("next", "alone"):
        syncer = Syncer(make_model(), num_learners=2, quorum=2, grace_gamma=0.0, late_reports=late)
        for m in range(2):
            syncer.join(m)
        for step in (8, 16):
            for m in range(2):
                syncer.receive(_report(syncer, m, step=step))
        out.append([g.detach().clone() for g in syncer.global_flat])
    assert all(torch.equal(a, b) for a, b in zip(*out, strict=True))


def test_an_unknown_setting_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="late_reports='later'.*'next'.*'alone'"):
        Syncer(make_model(), num_learners=2, late_reports="later")
