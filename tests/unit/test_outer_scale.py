"""The share of an outer step a partial merge applies (diloco.decoupled.outer_scale), and the syncer's refusal of
a merged outer gradient that is not finite."""

from __future__ import annotations

import math

import pytest
import torch
from _tiny import make_model

from diloco.decoupled.messages import Report
from diloco.decoupled.outer_scale import AUTO, check_outer_scale, outer_step_share
from diloco.decoupled.syncer import Syncer
from diloco.train.config import TrainConfig
from diloco.wire.registry import get_codec


def _report(syncer, m, theta, *, steps=4):
    """Learner m's report of fragment 0 with values ``theta`` (against the copy the syncer gave it)."""
    return Report(
        learner=m,
        fragment=0,
        payload=get_codec("fp32").encode(syncer._base[m][0] - theta),
        steps=steps,
        tokens=steps * 10.0,
        step_time=0.0,
        sent_after_step=steps,
        base_version=syncer._held[m][0],
    )


@pytest.mark.parametrize("k, M", [(1, 2), (1, 3), (2, 4), (3, 8)])
def test_the_share_of_a_merge_of_k_of_m_learners(k, M):
    assert outer_step_share(merged=k, members=M, rule="share", merge="rda") == pytest.approx(k / M)
    assert outer_step_share(merged=k, members=M, rule="sqrt-share", merge="mean") == pytest.approx(math.sqrt(k / M))
    assert outer_step_share(merged=k, members=M, rule="none", merge="mean") == 1.0
    for merge, rule in AUTO.items():
        assert outer_step_share(merged=k, members=M, rule="auto", merge=merge) == outer_step_share(
            merged=k, members=M, rule=rule, merge=merge
        )
    for rule in ("auto", "share", "sqrt-share", "none"):  # a merge of every member is a whole step
        assert outer_step_share(merged=M, members=M, rule=rule, merge="mean") == 1.0


def test_an_unknown_rule_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="outer_scale='half'.*'share'"):
        check_outer_scale("half")
    with pytest.raises(ValueError, match="outer_scale='half'"):
        TrainConfig(method="decoupled", outer_scale="half", steps=10)


@pytest.mark.parametrize("rule, expected_share", [("share", 1.0), ("none", 4.0)])
def test_k1_merges_of_a_round_sum_to_the_k_equal_m_mean_only_when_each_is_a_share(rule, expected_share):
    """M = 4 learners each report once (their own progress d_m, outer SGD lr 1, no momentum). K = 4: one merge
    of the mean. K = 1: four merges of one; with "share" they sum to the same mean; with "none" to 4 x it."""
    M = 4
    d = [torch.full_like(Syncer(make_model(seed=0), num_learners=M)._snapshot[0], 0.01 * (m + 1)) for m in range(M)]

    def run(quorum):
        syncer = Syncer(
            make_model(seed=0),
            num_learners=M,
            quorum=quorum,
            grace_gamma=0.0,
            merge="mean",
            outer_gradient="own",
            outer_scale=rule,
            outer_optimizer=lambda p: torch.optim.SGD(p, lr=1.0),
        )
        for m in range(M):
            syncer.join(m)
        start = syncer._snapshot[0].clone()
        for m in range(M):
            syncer.receive(_report(syncer, m, syncer._base[m][0] - d[m]))
        assert len(syncer.records) == (1 if quorum == M else M)
        return syncer._snapshot[0] - start

    together = run(M)
    torch.testing.assert_close(together, -sum(d) / M)
    torch.testing.assert_close(run(1), expected_share * together)


def test_the_syncer_refuses_a_merged_outer_gradient_that_is_not_finite_and_goes_on():
    """Two finite reports whose sum overflows float32: no outer step (Theta and the momentum as they were), the
    merge recorded with both learners dropped; the next merge steps as usual."""
    syncer = Syncer(
        make_model(seed=0),
        num_learners=2,
        grace_gamma=0.0,
        merge="mean",
        outer_optimizer=lambda p: torch.optim.SGD(p, lr=0.5, momentum=0.9),
    )
    for m in (0, 1):
        syncer.join(m)
    theta = syncer._snapshot[0].clone()
    big = torch.full_like(theta, 3e38)  # each finite; their sum is inf
    for m in (0, 1):
        syncer.receive(_report(syncer, m, syncer._base[m][0] - big))
    assert syncer.refused_merges == 1
    assert torch.equal(syncer._snapshot[0], theta)
    assert not syncer.outer_optimizers[0].state  # no momentum buffer was made from it
    rec = syncer.records[-1]
    assert rec.learners == () and rec.dropped == (0, 1) and rec.weights == ()
    for m in (0, 1):
        syncer.receive(_report(syncer, m, syncer._base[m][0] - 0.1))
    assert syncer.refused_merges == 1 and syncer.records[-1].learners == (0, 1)
    torch.testing.assert_close(syncer._snapshot[0], theta - 0.05)
    assert syncer.state_dict()["refused_merges"] == 1
