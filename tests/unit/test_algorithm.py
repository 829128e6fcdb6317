"""Equivalences and closed forms for StreamingDiLoCo / DataParallel on the in-process backend."""

from __future__ import annotations

import copy
from functools import partial

import pytest
import torch
from _tiny import ConstantStep, Scalar, batches, make_model
from torch.testing import assert_close

from diloco.algorithm.data_parallel import DataParallel
from diloco.algorithm.streaming import StreamingDiLoCo
from diloco.comm.local import run_replicas

SGD_LR1 = partial(torch.optim.SGD, lr=1.0)


def train_replicas(M, steps, make_algo, *, inner=partial(torch.optim.AdamW, lr=1e-2), seed=0, hook=None):
    """Run M replicas in threads; return (models, algos, per-step global snapshots)."""

    def replica(comm):
        model = make_model(seed=comm.rank)  # deliberately different inits: the wrapper must equalise them
        opt = inner(model.parameters())
        algo = make_algo(model, opt, comm)
        snaps = []
        for t, (x, y) in enumerate(batches(comm.rank, steps, seed=seed), start=1):
            _, loss = model(x, y)
            loss.backward()
            if isinstance(algo, DataParallel):
                algo.sync_gradients()
            opt.step()
            opt.zero_grad()
            reports = algo.step()
            if hook:
                hook(comm.rank, t, model)
            if reports:
                snaps.append((t, [g.detach().clone() for g in algo.global_flat], reports))
        return model, algo, snaps

    return run_replicas(replica, M, timeout=60)


def reference_diloco(M, steps, H, *, outer_lr=0.7, inner_lr=1e-2, seed=0):
    """Plain DiLoCo written out by hand (one process, no communicator)."""
    base = make_model(seed=0)
    global_params = [p.detach().clone() for p in base.parameters()]
    replicas = [copy.deepcopy(base) for _ in range(M)]
    opts = [torch.optim.AdamW(m.parameters(), lr=inner_lr) for m in replicas]
    outer_vars = [g.clone().requires_grad_(True) for g in global_params]
    outer = torch.optim.SGD(outer_vars, lr=outer_lr, momentum=0.9, nesterov=True)
    data = [batches(r, steps, seed=seed) for r in range(M)]
    for t in range(1, steps + 1):
        for r in range(M):
            x, y = data[r][t - 1]
            _, loss = replicas[r](x, y)
            loss.backward()
            opts[r].step()
            opts[r].zero_grad()
        if t % H == 0:
            with torch.no_grad():
                for i, v in enumerate(outer_vars):
                    v.grad = sum(v.detach() - list(m.parameters())[i].detach() for m in replicas) / M
            outer.step()
            with torch.no_grad():
                for m in replicas:
                    for p, v in zip(m.parameters(), outer_vars):
                        p.copy_(v)
    return [v.detach() for v in outer_vars], replicas


def test_p1_tau0_alpha0_is_plain_diloco():
    M, steps, H = 2, 12, 4
    out = train_replicas(M, steps, lambda m, o, c: StreamingDiLoCo(m, comm=c, sync_every=H))
    ref_global, ref_models = reference_diloco(M, steps, H)
    for model, algo, _ in out:
        got = list(algo.global_named_parameters().values())
        assert len(got) == len(ref_global)
        for a, b in zip(got, ref_global):
            assert_close(a, b)
        for a, b in zip(model.parameters(), ref_models[0].parameters()):
            assert_close(a, b)


def test_h1_sgd_outer_lr1_equals_data_parallel():
    M, steps = 3, 6
    sgd = partial(torch.optim.SGD, lr=0.1)
    diloco = train_replicas(
        M, steps, lambda m, o, c: StreamingDiLoCo(m, comm=c, sync_every=1, outer_optimizer=SGD_LR1), inner=sgd
    )
    dp = train_replicas(M, steps, lambda m, o, c: DataParallel(m, comm=c), inner=sgd)
    for (m_d, _, _), (m_p, _, _) in zip(diloco, dp):
        for a, b in zip(m_d.parameters(), m_p.parameters()):
            assert_close(a, b, rtol=1e-5, atol=1e-6)
    # and data-parallel really moved the parameters (the comparison is not vacuous)
    assert not torch.equal(next(dp[0][0].parameters()), next(make_model(0).parameters()))


def test_one_replica_outer_lr1_no_momentum_is_plain_training():
    steps = 9
    out = train_replicas(1, steps, lambda m, o, c: StreamingDiLoCo(m, comm=c, sync_every=3, outer_optimizer=SGD_LR1))
    plain = make_model(seed=0)
    opt = torch.optim.AdamW(plain.parameters(), lr=1e-2)
    for x, y in batches(0, steps):
        plain(x, y)[1].backward()
        opt.step()
        opt.zero_grad()
    model, algo, _ = out[0]
    for a, b in zip(model.parameters(), plain.parameters()):
        assert_close(a, b)
    for a, b in zip(algo.global_named_parameters().values(), plain.parameters()):
        assert_close(a, b)


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
def test_overlap_and_merge_match_hand_computation(alpha):
    """H=2, tau=1, M=2, replica r steps w -= c_r (c = 1, 3), outer SGD lr 0.5 without momentum.

    step 2: start; Delta_r = 0 - (-2 c_r) = 2 c_r, mean 4.   step 3: w_r = -3 c_r;
    finish: global = 0 - 0.5 * 4 = -2; w_r <- alpha (-3 c_r) + (1 - alpha)(-2).
    step 4: w_r -= c_r; start: Delta_r = -2 - w_r.   step 5: w_r -= c_r; finish: global = -2 - 0.5 mean(Delta);
    w_r <- alpha w_r + (1 - alpha) global.
    """
    c = [1.0, 3.0]

    def replica(comm):
        model = Scalar()
        opt = ConstantStep(model.parameters(), c[comm.rank])
        algo = StreamingDiLoCo(
            model,
            comm=comm,
            sync_every=2,
            overlap_steps=1,
            merge_alpha=alpha,
            outer_optimizer=partial(torch.optim.SGD, lr=0.5),
        )
        trace = []
        for _ in range(5):
            opt.step()
            algo.step()
            trace.append((model.w.item(), algo.global_flat[0].item()))
        return trace

    traces = run_replicas(replica, 2, timeout=30)
    # hand computation
    w3 = [alpha * (-3 * cr) + (1 - alpha) * (-2.0) for cr in c]
    w4 = [w - cr for w, cr in zip(w3, c)]
    delta = [-2.0 - w for w in w4]
    g5 = -2.0 - 0.5 * sum(delta) / 2
    w5 = [alpha * (w - cr) + (1 - alpha) * g5 for w, cr in zip(w4, c)]
    for r in range(2):
        assert traces[r][1] == pytest.approx((-2 * c[r], 0.0))  # started, not yet applied
        assert traces[r][2] == pytest.approx((w3[r], -2.0))
        assert traces[r][4] == pytest.approx((w5[r], g5))


@pytest.mark.parametrize("codec", ["fp32", "fp4_e3m0", "int8"])
def test_replicas_bit_identical_global_after_every_sync(codec):
    out = train_replicas(
        3,
        16,
        lambda m, o, c: StreamingDiLoCo(
            m, comm=c, sync_every=4, num_fragments=3, overlap_steps=1, merge_alpha=0.5, codec=codec
        ),
    )
    snaps = [s for _, _, s in out]
    assert len(snaps[0]) >= 10
    for r in (1, 2):
        assert [s[0] for s in snaps[r]] == [s[0] for s in snaps[0]]
        for (_, a, _), (_, b, _) in zip(snaps[0], snaps[r]):
            assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_byte_counts_equal_codec_sizes_on_schedule():
    from diloco.wire.registry import get_codec

    H, P, steps = 6, 3, 30
    out = train_replicas(
        2, steps, lambda m, o, c: StreamingDiLoCo(m, comm=c, sync_every=H, num_fragments=P, codec="fp4_e3m0")
    )
    _, algo, _ = out[0]
    codec = get_codec("fp4_e3m0")
    expected = sum(
        codec.num_bytes(algo.fragment_sizes()[p]) for t in range(1, steps + 1) for p in algo.schedule.starts(t)
    )
    stats = algo.comm.stats
    assert stats.bytes_sent == expected and stats.bytes_received == expected  # M - 1 = 1 peer
    assert stats.peak_in_flight == max(codec.num_bytes(n) for n in algo.fragment_sizes())


def test_nonfinite_outer_gradient_is_dropped_and_training_goes_on():
    def poison(rank, t, model):
        if rank == 1 and t == 4:
            with torch.no_grad():
                model.blocks[0].fc.weight[0, 0] = float("nan")

    out = train_replicas(
        2,
        8,
        lambda m, o, c: StreamingDiLoCo(m, comm=c, sync_every=4, codec="fp32"),
        hook=poison,
    )
    for model, algo, snaps in out:
        assert all(torch.isfinite(p).all() for p in algo.global_named_parameters().values())
        # the first sync (step 4) was clean; at step 8 replica 1's outer gradient was NaN and dropped
        assert [r.dropped_replicas for _, _, reports in snaps for r in reports] == [[], [1]]
        assert all(torch.isfinite(p).all() for p in model.parameters())  # alpha=0 merge healed replica 1
    g0 = out[0][1].global_flat[0]
    assert torch.equal(g0, out[1][1].global_flat[0])


def test_state_dict_round_trip_with_exchange_in_flight():
    H, tau, steps, cut = 4, 2, 14, 5  # after step 5 fragment syncs started at 4 are still in flight

    def make(m, o, c):
        return StreamingDiLoCo(m, comm=c, sync_every=H, num_fragments=2, overlap_steps=tau, codec="int8")

    full = train_replicas(2, steps, make)

    def resumed(comm):
        model = make_model(seed=comm.rank)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        algo = make(model, opt, comm)
        data = batches(comm.rank, steps)
        for x, y in data[:cut]:
            model(x, y)[1].backward()
            opt.step()
            opt.zero_grad()
            algo.step()
        assert algo.pending_fragments, "the test must cut while an exchange is in flight"
        saved = copy.deepcopy((model.state_dict(), opt.state_dict(), algo.state_dict()))
        # a brand-new replica restored from the checkpoint
        model2 = make_model(seed=99)
        opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-2)
        algo2 = make(model2, opt2, comm)
        # drain the stale exchange of the first instance so collectives stay matched
        algo.flush()
        model2.load_state_dict(saved[0])
        opt2.load_state_dict(saved[1])
        algo2.load_state_dict(saved[2])
        for x, y in data[cut:]:
            model2(x, y)[1].backward()
            opt2.step()
            opt2.zero_grad()
            algo2.step()
        return model2, algo2

    res = run_replicas(resumed, 2, timeout=60)
    for (m_full, a_full, _), (m_res, a_res) in zip(full, res):
        for a, b in zip(m_full.parameters(), m_res.parameters()):
            assert torch.equal(a, b)
        for a, b in zip(a_full.global_flat, a_res.global_flat):
            assert torch.equal(a, b)
        assert a_full.comm.stats.bytes_sent == a_res.comm.stats.bytes_sent


def test_merge_alpha_out_of_range_is_rejected():
    with pytest.raises(ValueError, match="merge_alpha"):
        run_replicas(lambda c: StreamingDiLoCo(make_model(), comm=c, sync_every=2, merge_alpha=1.5), 1)


def test_offload_keeps_global_copy_on_requested_device():
    out = train_replicas(1, 4, lambda m, o, c: StreamingDiLoCo(m, comm=c, sync_every=2, offload_device="cpu"))
    assert all(g.device.type == "cpu" for g in out[0][1].global_flat)


@pytest.mark.parametrize("M", [1, 3])
def test_every_sync_report_quotes_the_bytes_the_communicator_counted(M):
    from diloco.traffic import reduce_scatter_bytes, shard_sizes
    from diloco.wire.registry import get_codec

    H, P, steps = 6, 3, 18
    out = train_replicas(
        M,
        steps,
        lambda m, o, c: StreamingDiLoCo(m, comm=c, sync_every=H, num_fragments=P, overlap_steps=1, codec="int8"),
    )
    codec = get_codec("int8")
    for _, algo, snaps in out:
        reports = [r for _, _, rs in snaps for r in rs]
        assert len(reports) == sum(len(algo.schedule.finishes(t)) for t in range(1, steps + 1))
        rank = algo.comm.rank

        def link(fragment: int) -> int:  # M = 3: the reduce-scatter exchange, same bytes each way
            n = algo.fragment_sizes()[fragment]
            if M == 1:
                return 0
            shards = [codec.num_bytes(s) for s in shard_sizes(n, M)]
            lb = reduce_scatter_bytes(shards, rank)
            assert lb.sent == lb.received
            return lb.sent

        for r in reports:
            assert (r.bytes_sent, r.bytes_received) == (link(r.fragment), link(r.fragment))
        in_flight = sum(link(p) for p in algo.pending_fragments)
        assert sum(r.bytes_sent for r in reports) + in_flight == algo.comm.stats.bytes_sent
        assert sum(r.bytes_received for r in reports) + in_flight == algo.comm.stats.bytes_received


def test_data_parallel_reports_the_gradient_payload_each_step():
    from diloco.wire.registry import get_codec

    out = train_replicas(2, 3, lambda m, o, c: DataParallel(m, comm=c, codec="bf16"))
    model, algo, _ = out[0]
    n = sum(p.numel() for p in model.parameters())
    assert algo.comm.stats.bytes_sent == 3 * get_codec("bf16").num_bytes(n)


def test_global_state_dict_gives_tied_weights_their_global_value():
    """GPT-2-style tying (head.weight is embed.weight): every alias in the state dict holds the global value."""
    import copy

    from _tiny import TinyNet

    from diloco import StreamingDiLoCo, run_replicas

    def replica(comm):
        torch.manual_seed(0)
        model = TinyNet(vocab=16, d=16)
        model.head.weight = model.embed.weight  # tied: one parameter, two names
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        algo = StreamingDiLoCo(model, comm=comm, sync_every=2, merge_alpha=0.5)
        g = torch.Generator().manual_seed(comm.rank)
        for _ in range(3):  # a sync after step 2, then one more local step: local != global
            x = torch.randint(0, 16, (4, 5), generator=g)
            model(x, (x + 1) % 16)[1].backward()
            opt.step()
            opt.zero_grad()
            algo.step()
        state = algo.global_state_dict()
        glob = algo.global_named_parameters()["embed.weight"]
        assert torch.equal(state["embed.weight"], glob) and torch.equal(state["head.weight"], glob)
        assert not torch.equal(model.embed.weight, glob)
        evaluator = copy.deepcopy(model)
        evaluator.load_state_dict(state)
        assert torch.equal(evaluator.head.weight, glob)
        return True

    assert run_replicas(replica, 2) == [True, True]


def test_training_on_after_a_flush_continues_the_schedule_alike_live_and_resumed():
    """A finished run (flushed at its last step) resumed with a larger budget: the steps at which the flushed
    exchanges were due finish nothing, later syncs run as scheduled, and continuing live after the flush
    equals continuing from the flushed checkpoint bit for bit."""
    H, tau, cut, more = 4, 2, 5, 9  # after step 5 the syncs started at step 4 are due at 6: flushed instead

    def make(m, c):
        return StreamingDiLoCo(m, comm=c, sync_every=H, num_fragments=2, overlap_steps=tau, codec="int8")

    def replica(comm):
        model = make_model(seed=comm.rank)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        algo = make(model, comm)
        data = batches(comm.rank, cut + more)

        def train(m, o, a, part):
            done = []
            for x, y in part:
                m(x, y)[1].backward()
                o.step()
                o.zero_grad()
                done += [(r.step, r.fragment) for r in a.step()]
            return done

        train(model, opt, algo, data[:cut])
        in_flight = algo.pending_fragments
        assert in_flight, "the test must flush while an exchange is in flight"
        algo.flush()
        saved = copy.deepcopy((model.state_dict(), opt.state_dict(), algo.state_dict()))
        live = train(model, opt, algo, data[cut:])
        model2 = make_model(seed=99)
        opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-2)
        algo2 = make(model2, comm)
        model2.load_state_dict(saved[0])
        opt2.load_state_dict(saved[1])
        algo2.load_state_dict(saved[2])
        resumed = train(model2, opt2, algo2, data[cut:])
        return in_flight, live, resumed, model, model2, algo, algo2

    for in_flight, live, resumed, model, model2, algo, algo2 in run_replicas(replica, 2, timeout=60):
        assert live == resumed
        finished_at = {step for step, _ in live}
        assert cut + 1 not in finished_at or not {f for s, f in live if s == cut + 1} & set(in_flight)
        assert any(step > cut + 1 for step in finished_at)  # the next syncs ran as scheduled
        for a, b in zip(model.parameters(), model2.parameters(), strict=True):
            assert torch.equal(a, b)
        for a, b in zip(algo.global_flat, algo2.global_flat, strict=True):
            assert torch.equal(a, b)
