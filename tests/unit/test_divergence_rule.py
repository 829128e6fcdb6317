"""The divergence guard's rule (diloco.train.divergence): its reference, threshold and message."""

from __future__ import annotations

import pytest

from diloco.train.config import TrainConfig
from diloco.train.divergence import DivergenceError, DivergenceGuard, check_training_loss


def cfg(**kw) -> TrainConfig:
    return TrainConfig(steps=100, **kw)


def test_the_first_evaluation_is_the_reference_and_three_times_it_stops_the_run():
    guard = DivergenceGuard(cfg(inner_lr=0.5, outer_lr=0.7))
    guard.check_eval(5.0, step=20)  # the reference
    guard.check_eval(14.9, step=40)  # 2.98 x: still on
    with pytest.raises(DivergenceError) as err:
        guard.check_eval(15.5, step=60)
    msg = str(err.value)
    for part in (
        "step 60",
        "15.5",
        "3.1 x the reference 5",
        "5 at step 20",
        "diverge_factor=3",
        "inner_lr=0.5",
        "outer_lr=0.7",
        "No checkpoint of this state was written",
    ):
        assert part in msg, (part, msg)


@pytest.mark.parametrize("loss", [float("nan"), float("inf")])
def test_a_loss_that_is_not_finite_stops_the_run(loss):
    guard = DivergenceGuard(cfg())
    guard.check_eval(5.0, step=10)
    with pytest.raises(DivergenceError, match="step 20: the evaluation loss is (nan|inf)"):
        guard.check_eval(loss, step=20)
    with pytest.raises(DivergenceError, match="step 7: replica 2's training loss is (nan|inf)"):
        check_training_loss(loss, step=7, replica=2, cfg=cfg())


def test_a_decoupled_run_is_told_its_quorum_and_outer_step():
    c = cfg(method="decoupled", replicas=3, global_batch=12, quorum=1, outer_scale="none")
    with pytest.raises(DivergenceError, match=r"quorum K=1 of replicas M=3 with outer_scale='none'.*outer_scale=auto"):
        check_training_loss(float("nan"), step=3, replica=0, cfg=c)


def test_factor_zero_turns_the_guard_off_and_other_factors_must_exceed_one():
    off = cfg(diverge_factor=0)
    guard = DivergenceGuard(off)
    for step, loss in ((1, 5.0), (2, 500.0), (3, float("nan"))):
        guard.check_eval(loss, step=step)
    check_training_loss(float("nan"), step=3, replica=0, cfg=off)
    with pytest.raises(ValueError, match="diverge_factor=0.5: give a factor > 1"):
        cfg(diverge_factor=0.5)


def test_an_aborted_local_transport_stops_a_learner_waiting_for_its_reply():
    """A learner that diverged aborts the decoupled run's transport: one waiting for a reply (K = M, the others
    still training) raises CommError, not waiting out the transport's timeout; its stop() does not raise."""
    import threading
    import time

    from _tiny import make_model

    from diloco.comm.base import CommError
    from diloco.decoupled.local import LocalTransport
    from diloco.decoupled.syncer import Syncer

    syncer = Syncer(make_model(seed=0), num_learners=2, grace_gamma=0.0)
    with LocalTransport(syncer, timeout=60.0) as transport:
        channel = transport.channel(0)
        channel.join()
        errors = []

        def wait():
            try:
                channel.wait_reply(0)
            except CommError as exc:
                errors.append(exc)

        t0 = time.monotonic()
        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(0.2)
        transport.abort("learner 1 diverged")
        waiter.join(10.0)
        assert not waiter.is_alive() and time.monotonic() - t0 < 5.0
        assert "learner 1 diverged" in str(errors[0])
        with pytest.raises(CommError):
            channel.poll_reply(0)


def test_eval_sequences_must_not_be_negative():
    assert cfg(eval_sequences=2048).eval_sequences == 2048
    with pytest.raises(ValueError, match="eval_sequences=-1: give the number of validation windows"):
        cfg(eval_sequences=-1)
