"""Decoupled DiLoCo end to end on the in-process transport: equivalence with synchronous Streaming
DiLoCo, lossy codecs, stragglers, and the errors a user can make."""

from __future__ import annotations

import time
from functools import partial

import pytest
import torch
from _tiny import batches, make_model

from diloco.algorithm.streaming import StreamingDiLoCo
from diloco.comm.local import run_replicas
from diloco.decoupled.learner import Learner
from diloco.decoupled.local import LocalTransport, run_learners
from diloco.decoupled.syncer import Syncer

ADAMW = partial(torch.optim.AdamW, lr=1e-2)


def _loop(model, algo, steps, rank, *, sleep=0.0):
    opt = ADAMW(model.parameters())
    for x, y in batches(rank, steps):
        model(x, y)[1].backward()
        opt.step()
        opt.zero_grad()
        if sleep:
            time.sleep(sleep)
        if isinstance(algo, Learner):
            algo.after_optimizer_step(tokens=x.numel())
        else:
            algo.after_optimizer_step()


def run_decoupled(M, steps, *, sleeps=None, learner_steps=None, **kw):
    """M learner threads against one syncer thread; returns (syncer, per-learner (model, learner, seconds))."""
    sync_kw = {
        k: kw[k]
        for k in ("sync_every", "num_fragments", "overlap_steps", "codec", "merge_alpha", "overwrite_after")
        if k in kw
    }
    syncer_kw = {k: v for k, v in kw.items() if k not in ("sync_every", "merge_alpha", "overwrite_after")}
    syncer = Syncer(make_model(seed=0), num_learners=M, **syncer_kw)

    def learner(channel, m):
        model = make_model(seed=10 + m)  # different inits: joining must equalise them
        algo = Learner(model, channel=channel, learner=m, **sync_kw)
        start = time.monotonic()
        n = learner_steps[m] if learner_steps else steps
        _loop(model, algo, n, m, sleep=(sleeps or [0.0] * M)[m])
        seconds = time.monotonic() - start
        algo.close()
        return model, algo, seconds

    with LocalTransport(syncer, timeout=60) as transport:
        out = run_learners(learner, transport)
    return syncer, out


def test_synchronous_decoupled_equals_streaming_diloco_bit_for_bit():
    """K = M, no grace window, mean merge, equal batches (equal token weights), fp32 both ways, alpha = 0.

    Then every round merges the same M outer gradients as Streaming DiLoCo's all-reduce, summed in the
    same (rank) order and divided by M: the same floating-point operations, so the test asks for equality
    of every bit, of the global and of each learner's local parameters.
    """
    M, steps, H, P, tau = 3, 16, 4, 2, 1

    def replica(comm):
        model = make_model(seed=comm.rank)
        algo = StreamingDiLoCo(model, comm=comm, sync_every=H, num_fragments=P, overlap_steps=tau, codec="fp32")
        _loop(model, algo, steps, comm.rank)
        algo.flush()
        return model, algo

    streaming = run_replicas(replica, M, timeout=60)
    syncer, dec = run_decoupled(
        M, steps, sync_every=H, num_fragments=P, overlap_steps=tau, codec="fp32", merge="mean", grace_gamma=0.0
    )
    assert len(syncer.records) == sum(1 for t in range(1, steps + 1) for _ in streaming[0][1].schedule.starts(t))
    assert all(len(r.learners) == M for r in syncer.records)
    glob_s = streaming[0][1].global_named_parameters()
    glob_d = syncer.global_named_parameters()
    for name in glob_s:
        assert torch.equal(glob_s[name], glob_d[name]), name
    for (ms, _), (md, _, _) in zip(streaming, dec):
        for (n, a), b in zip(ms.named_parameters(), md.parameters()):
            assert torch.equal(a, b), n
    assert not torch.equal(glob_d["head.weight"], make_model(seed=0).head.weight)  # it trained


def test_rda_and_a_lossy_codec_train_and_report_weights():
    syncer, out = run_decoupled(
        2, 12, sync_every=4, num_fragments=2, overlap_steps=1, codec="fp4_e2m1", merge="rda", quorum=2
    )  # K = M: both learners hold the last version
    assert syncer.records and all(abs(sum(r.weights) - 1) < 1e-9 for r in syncer.records)
    assert syncer.bytes_received > 0 and syncer.bytes_sent > 0
    glob = syncer.global_named_parameters()
    assert all(torch.isfinite(v).all() for v in glob.values())
    # fragment 1 was sent after the last step and flushed: alpha = 0 overwrote it with the decoded global copy
    for model, algo, _ in out:
        state = algo.global_state_dict()
        for n in algo.fragments[1].names:
            assert torch.equal(dict(model.named_parameters())[n], state[n]), n
        # the copy decoded from 4.5-bit differences stays near the syncer's FP32 values (fragment-wide L2)
        mine = torch.cat([state[n].flatten() for n in algo.fragments[1].names])
        theirs = torch.cat([glob[n].flatten() for n in algo.fragments[1].names])
        assert float((mine - theirs).norm() / theirs.norm()) < 0.02


def _fast_rate(out, fast=(0, 1)):
    return sum(60 / out[m][2] for m in fast) / len(fast)


@pytest.fixture
def one_torch_thread():
    """Step times measured on a busy 2-core machine: one intra-op thread per learner (no OpenMP wake-ups)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("overwrite_after", ["send", "arrival"])
def test_straggler_quorum_one_with_grace_keeps_the_fast_learners_fast_and_full_quorum_waits(
    one_torch_thread, overwrite_after
):
    """3 learners, one 3x slower (sleep per step). K = 1 + grace window: the fast ones never wait for the slow one
    (under 10 % of their time waiting for replies); K = M: they wait for it at every reply (over 40 % of their time:
    about 2/3 of it, less the tau = 2 steps of overlap). Shares of each learner's own time, so a loaded machine
    that slows every step alike moves neither; the step rates are printed (on an idle machine the fast ones keep
    0.95-1.02 of their solo rate at K = 1 and fall to 0.36-0.38 at K = M).

    The slow learner runs 20 steps under K = 1 (the time the fast ones take for 60) and 60 under K = M.
    """
    step, steps = 0.015, 60  # seconds of sleep per step dominate the ~1.5 ms of compute
    kw = dict(
        sync_every=4, num_fragments=2, overlap_steps=2, codec="fp32", merge="rda", overwrite_after=overwrite_after
    )
    _, solo = run_decoupled(1, steps, sleeps=[step], **kw)
    solo_rate = steps / solo[0][2]
    sleeps = [step, step, 3 * step]
    _, k1 = run_decoupled(3, steps, sleeps=sleeps, learner_steps=[60, 60, 20], quorum=1, grace_gamma=0.2, **kw)
    _, km = run_decoupled(3, steps, sleeps=sleeps, learner_steps=[60, 60, 60], quorum=3, grace_gamma=0.2, **kw)
    r1, rm = _fast_rate(k1) / solo_rate, _fast_rate(km) / solo_rate
    print(
        f"{overwrite_after}: fast learners' step rate / solo: K=1 + grace {r1:.2f}, K=M {rm:.2f} (solo {solo_rate:.0f} steps/s)"
    )
    w1, wm = (max(out[m][1].wait_seconds / out[m][2] for m in (0, 1)) for out in (k1, km))
    print(f"{overwrite_after}: the fast learners' largest share of time waiting: K=1 + grace {w1:.2f}, K=M {wm:.2f}")
    assert w1 < 0.1
    assert wm > 0.4


class _ScriptedChannel:
    """A syncer stand-in whose reply (all zeros) becomes visible once the learner has done ``visible_after`` steps."""

    def __init__(self, start, visible_after):
        self.start, self.visible_after, self.step, self.sent = start, visible_after, 0, []

    def join(self):
        from diloco.decoupled.messages import Welcome

        return Welcome(fragments=[s.clone() for s in self.start], versions=[0] * len(self.start), incarnation=0)

    def send(self, report):
        self.sent.append(report.sent_after_step)

    def _reply(self, fragment):
        from diloco.decoupled.messages import Reply
        from diloco.wire.registry import get_codec

        return Reply(
            learner=0, fragment=fragment, payload=get_codec("fp32").encode(torch.zeros_like(self.start[0])), version=1
        )

    def wait_reply(self, fragment):
        return self._reply(fragment)

    def poll_reply(self, fragment):
        return self._reply(fragment) if self.step >= self.visible_after else None

    def leave(self):
        pass

    def hold(self, step):
        pass


@pytest.mark.parametrize("mode, overwritten_after", [("send", 10), ("arrival", 13)])
def test_overwrite_tau_steps_after_sending_or_after_the_reply_arrives(mode, overwritten_after):
    """H = 8, tau = 2: the report goes after step 8; the reply is seen after step 11. 'send' overwrites after
    step 8 + 2 = 10 (waiting for the reply there), 'arrival' after step 11 + 2 = 13."""
    from diloco.algorithm.fragments import flatten

    model = make_model()
    channel = _ScriptedChannel([flatten(list(model.parameters()))], visible_after=11)
    algo = Learner(model, channel=channel, learner=0, sync_every=8, overlap_steps=2, overwrite_after=mode)
    zeroed = []
    for t in range(1, 15):
        channel.step = t
        algo.after_optimizer_step()
        zeroed.append(all(bool((p == 0).all()) for p in model.parameters()))
    assert channel.sent == [8]
    assert zeroed.index(True) + 1 == overwritten_after


def test_a_slow_learner_joins_merges_with_positive_weight_under_a_grace_window():
    syncer, _ = run_decoupled(
        2, 16, sleeps=[0.005, 0.01], sync_every=4, num_fragments=1, overlap_steps=2, quorum=1, grace_gamma=0.5
    )
    assert any(1 in r.learners for r in syncer.records)
    assert all(r.grace_wait <= r.grace_window + 0.5 for r in syncer.records)


def test_settings_a_user_gets_wrong_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="quorum=4 with 3 learners.*1..3"):
        Syncer(make_model(), num_learners=3, quorum=4)
    with pytest.raises(ValueError, match="merge='avg'"):
        Syncer(make_model(), num_learners=2, merge="avg")
    with pytest.raises(ValueError, match="grace_gamma=-1"):
        Syncer(make_model(), num_learners=2, grace_gamma=-1, overlap_steps=1)
    with pytest.raises(ValueError, match="overwrite_after='later'"):
        Learner(make_model(), channel=None, learner=0, sync_every=4, overwrite_after="later")
    with pytest.raises(ValueError, match="grace_gamma=1.5"):
        Syncer(make_model(), num_learners=2, grace_gamma=1.5, overlap_steps=1)


def test_syncer_state_dict_round_trip():
    syncer, _ = run_decoupled(2, 8, sync_every=4, overlap_steps=1, quorum=2, grace_gamma=0.0)
    other = Syncer(make_model(seed=5), num_learners=2, overlap_steps=1, grace_gamma=0.0)
    other.load_state_dict(syncer.state_dict())
    a, b = syncer.global_named_parameters(), other.global_named_parameters()
    assert all(torch.equal(a[n], b[n]) for n in a) and other.versions == syncer.versions
    # the learners' steps as counted from their reports (8 steps each; a report falls on step 8): kept after they
    # leave and across a restore
    assert syncer.reached == {0: 8, 1: 8} and syncer.trained == 16 and other.trained == 16


class _LateChannel(_ScriptedChannel):
    """Replies become visible only after step ``visible_after`` (a syncer down); a wait_reply is recorded."""

    def __init__(self, start, *, visible_after):
        super().__init__(start, visible_after=visible_after)
        self.waited_at = []

    def wait_reply(self, fragment):
        self.waited_at.append(self.step)
        return self._reply(fragment)


@pytest.mark.parametrize(
    "bound, sent, waited_at, overwritten_after",
    [
        (20, [8, 24], [], 23),  # rides out 13 steps past t + tau = 10, skips the report due at 16, never waits
        (5, [8, 16, 24], [15], 15),  # past its bound (10 + 5) it waits at step 15; the next (sent at 16) it rides out
        # from 18 until it comes after step 23, within 18 + 5
        (0, [8, 16, 24], [10, 18], 10),  # no ride-out: waits at t + tau, the Streaming DiLoCo timing
    ],
)
def test_a_learner_rides_out_a_late_reply_for_up_to_its_bound(bound, sent, waited_at, overwritten_after):
    """H = 8, tau = 2; the report after step 8 has its reply visible only after step 23 (the syncer down)."""
    from diloco.algorithm.fragments import flatten

    model = make_model()
    channel = _LateChannel([flatten(list(model.parameters()))], visible_after=23)
    algo = Learner(model, channel=channel, learner=0, sync_every=8, overlap_steps=2, ride_out_steps=bound)
    zeroed = []
    for t in range(1, 25):
        channel.step = t
        algo.after_optimizer_step()
        zeroed.append(all(bool((p == 0).all()) for p in model.parameters()))
    assert channel.sent == sent and channel.waited_at == waited_at
    assert zeroed.index(True) + 1 == overwritten_after
    if bound:
        assert algo.ride_outs >= 1 and algo.ride_out_waits == len(waited_at)
        assert algo.skipped_reports == (1 if bound == 20 else 0)
    with pytest.raises(ValueError, match="ride_out_steps=-1"):
        Learner(
            make_model(),
            channel=_ScriptedChannel([flatten(list(model.parameters()))], visible_after=0),
            learner=0,
            sync_every=8,
            ride_out_steps=-1,
        )


def test_learners_that_finish_leave_so_the_last_learners_reports_still_merge():
    """M = 3, K = 2. Learners 1 and 2 train 8 steps (H = 4) and finish; learner 0 then trains alone. Had the
    two stayed members after their last step, learner 0's first report would wait for a second one that no
    one sends (the trainer's run hung at its last step so); they leave, and its reports merge alone."""
    import threading

    syncer = Syncer(make_model(seed=0), num_learners=3, quorum=2, grace_gamma=0.0)
    with LocalTransport(syncer, timeout=10) as transport:

        def run(m):
            model = make_model(seed=10 + m)
            algo = Learner(model, channel=transport.channel(m), learner=m, sync_every=4, overlap_steps=1)
            _loop(model, algo, 8, m)
            algo.finish()

        pair = [threading.Thread(target=run, args=(m,)) for m in (1, 2)]
        for th in pair:
            th.start()
        for th in pair:
            th.join()
        assert syncer_members(transport) == set()
        run(0)  # a TransportError after 10 s if its reports waited for a quorum
    alone = [r for r in syncer.records if r.learners == (0,)]
    assert len(alone) == 2 and all(set(r.learners) == {1, 2} for r in syncer.records if r not in alone)


def syncer_members(transport):
    return transport._call(lambda: set(transport.syncer.members))
