"""Error feedback on a decoupled learner: what the codec drops from a report is kept and sent later."""

from __future__ import annotations

import pytest
import torch
from _tiny import make_model

from diloco.algorithm.fragments import flatten
from diloco.decoupled.learner import Learner
from diloco.decoupled.messages import Reply, Welcome
from diloco.wire.registry import get_codec


class _Recorder:
    """A syncer stand-in that records every report's payload and replies with the global values unchanged (a
    lossy codec's reply is the change to the learner's copy: zero)."""

    def __init__(self, start: torch.Tensor, codec: str) -> None:
        self.start, self.codec, self.payloads = start, get_codec(codec), []

    def join(self):
        return Welcome(fragments=[self.start.clone()], versions=[0], incarnation=0)

    def send(self, report):
        self.payloads.append(report.payload)

    def wait_reply(self, fragment):
        return Reply(learner=0, fragment=fragment, payload=self.codec.encode(torch.zeros_like(self.start)), version=1)

    poll_reply = wait_reply

    def leave(self):
        pass


def test_a_learner_keeps_what_the_codec_dropped_and_sends_it_later():
    """Each report sends Q(beta e + Delta) and keeps the rest: e_new + sent = beta e_old + Delta at every report
    (the invariant of diloco.wire.error_feedback), with a 4-bit codec whose error is far from zero."""
    torch.manual_seed(0)
    model = make_model()
    start = flatten(list(model.parameters()))
    channel = _Recorder(start, "fp4_e2m1")
    beta, codec = 0.9, get_codec("fp4_e2m1")
    algo = Learner(model, channel=channel, learner=0, sync_every=2, codec="fp4_e2m1", error_feedback_decay=beta)
    e_old = torch.zeros_like(start)
    for _ in range(3):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.01)
        delta = start - flatten(list(model.parameters()))
        algo.after_optimizer_step()  # step 1 of 2: nothing due
        algo.after_optimizer_step()  # step 2: the report goes, the reply (the start values) comes back at once
        sent = codec.decode(channel.payloads[-1], start.numel())
        e_new = algo.error_feedback.accumulators[0]
        torch.testing.assert_close(e_new + sent, beta * e_old + delta, rtol=0, atol=1e-6)
        assert e_new.abs().max() > 0  # the 4-bit codec dropped something, and it is kept
        e_old = e_new.clone()
    assert "error_feedback" in algo.state_dict()


def test_without_error_feedback_the_report_is_the_codec_of_the_difference():
    model = make_model()
    start = flatten(list(model.parameters()))
    channel = _Recorder(start, "fp4_e2m1")
    algo = Learner(model, channel=channel, learner=0, sync_every=1, codec="fp4_e2m1")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
    delta = start - flatten(list(model.parameters()))
    algo.after_optimizer_step()
    assert torch.equal(channel.payloads[0], get_codec("fp4_e2m1").encode(delta))
    assert algo.error_feedback is None and "error_feedback" not in algo.state_dict()


def test_eager_updates_are_refused_with_the_reason():
    from diloco.train.config import TrainConfig, load_preset

    with pytest.raises(ValueError, match="waits for no average"):
        TrainConfig.from_dict(
            {**load_preset("tiny")["base"], "method": "decoupled", "eager": True, "overlap_steps": 8, "sync_every": 8}
        )
