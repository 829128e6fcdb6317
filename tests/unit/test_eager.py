"""Eager updates (tau = H): equal to DiLoCo at M = 1, every contribution applied once, bytes, resume, simulator."""

from __future__ import annotations

import copy
from functools import partial

import numpy as np
import pytest
import torch
from _tiny import ConstantStep, Scalar, batches, make_model

from diloco.algorithm.schedule import Schedule
from diloco.algorithm.streaming import StreamingDiLoCo
from diloco.comm.local import run_replicas
from diloco.sim.dag import ComputeStream, SyncPlan, simulate_utilization
from diloco.traffic import all_gather_bytes
from diloco.wire.registry import get_codec

SGD_LR1 = partial(torch.optim.SGD, lr=1.0)


def run(M, steps, make_algo, *, cut=None, flush=True):
    """M replicas of the tiny net, AdamW inside; returns (model, algo) per replica.

    ``cut``: after that step, round-trip everything through state_dict into fresh objects (a resume).
    """

    def replica(comm):
        model = make_model(seed=comm.rank)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        algo = make_algo(model, comm)
        for t, (x, y) in enumerate(batches(comm.rank, steps), start=1):
            model(x, y)[1].backward()
            opt.step()
            opt.zero_grad()
            algo.step()
            if t == cut:
                assert algo.pending_fragments, "cut while an exchange is in flight"
                saved = copy.deepcopy((model.state_dict(), opt.state_dict(), algo.state_dict()))
                model2 = make_model(seed=50 + comm.rank)
                opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-2)
                algo2 = make_algo(model2, comm)
                algo.flush()  # drain the old instance's exchanges: collectives stay matched
                model2.load_state_dict(saved[0])
                opt2.load_state_dict(saved[1])
                algo2.load_state_dict(saved[2])
                model, opt, algo = model2, opt2, algo2
        if flush:
            algo.flush()
        return model, algo

    return run_replicas(replica, M, timeout=60)


@pytest.mark.parametrize("codec", ["fp32", "fp4_e3m0"])
@pytest.mark.parametrize("P", [1, 2])
def test_eager_with_one_replica_is_diloco_bit_for_bit(codec, P):
    H, steps = 4, 14  # ends mid-window: the flush lands an exchange in flight
    plain = run(1, steps, lambda m, c: StreamingDiLoCo(m, comm=c, sync_every=H, num_fragments=P, codec=codec))
    eager = run(
        1,
        steps,
        lambda m, c: StreamingDiLoCo(
            m, comm=c, sync_every=H, num_fragments=P, codec=codec, overlap_steps=H, eager=True
        ),
    )
    (m_plain, a_plain), (m_eager, a_eager) = plain[0], eager[0]
    for a, b in zip(m_plain.parameters(), m_eager.parameters(), strict=True):
        assert torch.equal(a, b)
    for a, b in zip(a_plain.global_flat, a_eager.global_flat, strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(m_eager.embed.weight, make_model(0).embed.weight)  # it trained: not vacuous


def test_eager_two_replicas_apply_every_contribution_once_over_two_rounds():
    """M = 2, H = 2, replica r steps w -= c_r (c = 1, 3), outer SGD lr 1, no momentum, alpha = 0.

    Every round replica r sends Delta_r = 2 c_r (mean 4) and its share is c_r. Round k applies
    (mean(k-1) - c_r) + c_r, so after round k the global copy is -4 (k - 1) - c_r: the others'
    contributions one round late, its own at once. The flush swaps the last share for the last mean:
    -4 K on both replicas, each contribution applied exactly once.
    """
    H, rounds, cs = 2, 4, (1.0, 3.0)

    def replica(comm):
        model = Scalar()
        opt = ConstantStep(model.parameters(), cs[comm.rank])
        algo = StreamingDiLoCo(model, comm=comm, sync_every=H, overlap_steps=H, eager=True, outer_optimizer=SGD_LR1)
        seen = []
        for t in range(1, H * rounds + 1):
            opt.step()
            algo.step()
            if t % H == 0:
                seen.append(float(algo.global_flat[0].detach()))
                assert float(model.w.detach()) == seen[-1]  # alpha = 0: the local copy is the (own) global one
        algo.flush()
        return seen, float(algo.global_flat[0].detach())

    for rank, (seen, final) in enumerate(run_replicas(replica, 2, timeout=30)):
        assert seen == [-4.0 * (k - 1) - cs[rank] for k in range(1, rounds + 1)]
        assert final == -4.0 * rounds


def test_eager_bytes_equal_the_traffic_function():
    H, P, steps, M = 4, 2, 12, 2
    out = run(
        M,
        steps,
        lambda m, c: StreamingDiLoCo(
            m, comm=c, sync_every=H, num_fragments=P, codec="stat2", overlap_steps=H, eager=True
        ),
    )
    codec = get_codec("stat2")
    for _, algo in out:
        schedule = algo.schedule
        starts = [p for t in range(1, steps + 1) for p in schedule.starts(t)]
        expected = sum(all_gather_bytes(codec.num_bytes(algo.fragment_sizes()[p]), M).sent for p in starts)
        assert algo.comm.stats.bytes_sent == expected
        # tau = H: every fragment's exchange is in flight at once (between its sends)
        assert algo.comm.stats.peak_in_flight == sum(
            all_gather_bytes(codec.num_bytes(n), M).sent for n in algo.fragment_sizes()
        )


@pytest.mark.parametrize("codec, decay", [("fp32", 0.0), ("topk", 0.95)])
def test_eager_resume_is_bit_identical_with_shares_and_accumulators_in_flight(codec, decay):
    H, P, steps, cut = 4, 2, 14, 7

    def make(m, c):
        return StreamingDiLoCo(
            m,
            comm=c,
            sync_every=H,
            num_fragments=P,
            overlap_steps=H,
            eager=True,
            codec=codec,
            error_feedback_decay=decay,
        )

    full = run(2, steps, make)
    resumed = run(2, steps, make, cut=cut)
    for (m_full, a_full), (m_res, a_res) in zip(full, resumed, strict=True):
        for a, b in zip(m_full.parameters(), m_res.parameters(), strict=True):
            assert torch.equal(a, b)
        for a, b in zip(a_full.global_flat, a_res.global_flat, strict=True):
            assert torch.equal(a, b)
        if decay:
            for a, b in zip(a_full.error_feedback.accumulators, a_res.error_feedback.accumulators, strict=True):
                assert torch.equal(a, b)
        assert a_full.comm.stats.bytes_sent == a_res.comm.stats.bytes_sent
    # the replicas' global copies differ (each applied its own latest share) but only a little
    assert not torch.equal(full[0][1].global_flat[0], full[1][1].global_flat[0])


def test_eager_state_counts_one_share_buffer_per_fragment():
    def replica(comm):
        model = make_model(seed=0)
        algo = StreamingDiLoCo(
            model, comm=comm, sync_every=2, num_fragments=2, overlap_steps=2, eager=True, error_feedback_decay=0.9
        )
        for _ in range(2):
            algo.step()
        return algo.state_bytes(), sum(algo.fragment_sizes())

    ((state, n),) = run_replicas(replica, 1)
    assert state["eager_shares"] == 4 * n and state["error_feedback"] == 4 * n and state["global"] == 4 * n


def test_schedule_needs_eager_for_tau_equal_h_and_tau_h_for_eager():
    with pytest.raises(ValueError, match="eager"):
        Schedule(4, 2, 4)
    with pytest.raises(ValueError, match="overlap_steps=4"):
        Schedule(4, 2, 3, eager=True)
    s = Schedule(4, 2, 4, eager=True)
    assert [s.finishes(t) for t in range(1, 11)] == [(), (), (), (), (), (0,), (), (1,), (), (0,)]
    assert all(set(s.finishes(t)) <= set(s.starts(t)) for t in range(1, 40))
    with pytest.raises(ValueError, match="eager"):
        StreamingDiLoCo(Scalar(), comm=run_replicas(lambda c: c, 1)[0], sync_every=4, overlap_steps=4)


def test_simulator_hides_a_whole_outer_step_with_eager_updates():
    """One fragment whose exchange takes 3.5 steps of compute: tau = 0 stalls 3.5 of every H = 4 steps,
    tau = 1 stalls 2.5, eager (tau = H) hides it all."""
    stream = ComputeStream(num_layers=2, step_time_s=1.0)
    bits = 3.5e9  # at 1 Gbit/s: 3.5 s on the link

    def utilization(tau, eager=False):
        plan = SyncPlan(Schedule(4, 1, tau, eager=eager), ((0, 1),), (bits / 2, bits / 2), overlap_backward=False)
        return float(simulate_utilization(stream, plan, 1e9)[0])

    assert utilization(0) == pytest.approx(4 / 7.5)
    assert utilization(1) == pytest.approx(4 / 6.5)
    assert utilization(4, eager=True) == pytest.approx(1.0)
    # and it is not free: an exchange longer than H steps stalls even eagerly
    plan = SyncPlan(Schedule(4, 1, 4, eager=True), ((0, 1),), (3e9, 3e9), overlap_backward=False)
    assert float(simulate_utilization(stream, plan, 1e9)[0]) == pytest.approx(4 / 6, rel=1e-6)
    assert np.isfinite(utilization(4, eager=True))


def test_eager_utilization_curve_is_never_below_overlap_of_one_step():
    from diloco.sim.hardware import bandwidth_grid, preset
    from diloco.sim.utilization import diloco, utilization_curve

    model, bw = preset("100B"), bandwidth_grid(0.01, 100, 21)
    tau0, tau1, eager = (
        utilization_curve(model, m, bw)
        for m in (
            diloco(sync_every=100, bits=4),
            diloco(sync_every=100, bits=4, overlap_steps=1),
            diloco(sync_every=100, bits=4, eager=True),
        )
    )
    assert np.all(eager >= tau1 - 1e-12) and np.all(tau1 >= tau0 - 1e-12)
    assert np.any(eager > tau1 + 0.2)  # a whole outer step hides far more than one inner step


def test_eager_run_flushed_then_continued_equals_its_resumed_continuation():
    """A finished eager run resumed with a larger budget: live and resumed continuations agree bit for bit."""
    H, P, first, more = 4, 2, 10, 6

    def make(m, c):
        return StreamingDiLoCo(
            m,
            comm=c,
            sync_every=H,
            num_fragments=P,
            overlap_steps=H,
            eager=True,
            codec="stat4",
            error_feedback_decay=0.9,
        )

    def replica(comm):
        data = batches(comm.rank, first + more)
        model = make_model(seed=comm.rank)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        algo = make(model, comm)
        for x, y in data[:first]:
            model(x, y)[1].backward()
            opt.step()
            opt.zero_grad()
            algo.step()
        algo.flush()
        saved = copy.deepcopy((model.state_dict(), opt.state_dict(), algo.state_dict()))
        model2 = make_model(seed=7)
        opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-2)
        algo2 = make(model2, comm)
        model2.load_state_dict(saved[0])
        opt2.load_state_dict(saved[1])
        algo2.load_state_dict(saved[2])
        for m, o, a in ((model, opt, algo), (model2, opt2, algo2)):  # live, then resumed (same collectives)
            for x, y in data[first:]:
                m(x, y)[1].backward()
                o.step()
                o.zero_grad()
                a.step()
            a.flush()
        return [torch.equal(a, b) for a, b in zip(model.parameters(), model2.parameters())] + [
            torch.equal(a, b) for a, b in zip(algo.global_flat, algo2.global_flat)
        ]

    for same in run_replicas(replica, 2, timeout=60):
        assert all(same)
