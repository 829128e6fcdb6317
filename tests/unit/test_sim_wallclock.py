"""The Scaling Laws paper's wall-clock model (Appendix A) on its stated settings: D = 20N, H = 30, M in {1,2,4,8}."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diloco.sim import predict_utilization
from diloco.sim.wallclock import (
    Network,
    allreduce_time_s,
    compute_time_s,
    data_parallel_wallclock,
    diloco_wallclock,
    num_steps,
)

N = 1e10  # 10B parameters
D = 20 * N  # Chinchilla-optimal tokens, as in the paper
B = 2048 * 512  # tokens per global batch
R = 1024  # chips
Q = 4e14  # achieved FLOP/s per chip
WITHIN = Network(bandwidth_bps=800e9, latency_s=1e-5)
CROSS = Network(bandwidth_bps=100e9, latency_s=1e-2)


def test_compute_is_6nd_over_rq():
    assert compute_time_s(num_params=N, num_tokens=D, num_chips=R, flops_per_chip=Q) == pytest.approx(
        6 * 1e10 * 2e11 / (1024 * 4e14), rel=1e-15
    )
    assert compute_time_s(num_params=1e9, num_tokens=2e10, num_chips=1000, flops_per_chip=1e14) == pytest.approx(1200.0)


def test_ring_allreduce_by_hand():
    # 1e9 bf16 parameters over 2 chips at 10 Gbit/s: 2 * 1.6e10 bits / 1e10 * (1 - 1/2) = 1.6 s, + 1 ms.
    t = allreduce_time_s(num_params=1e9, ring_size=2, network=Network(1e10, 1e-3), bits_per_param=16)
    assert t == pytest.approx(1.601)
    assert allreduce_time_s(num_params=1e9, ring_size=1, network=Network(1e10, 0.0)) == 0.0  # nothing to reduce


def test_data_parallel_pays_the_cross_datacenter_allreduce_every_step():
    wc = data_parallel_wallclock(num_params=N, num_tokens=D, batch_tokens=B, num_chips=R, flops_per_chip=Q, cross=CROSS)
    T = D / B
    per_step = 2 * N * 16 / 100e9 * (1 - 1 / R) + 1e-2
    assert wc.cross_comm_s == pytest.approx(per_step * T, rel=1e-12)
    assert wc.within_comm_s == 0.0
    assert wc.total_s == pytest.approx(wc.compute_s + per_step * T)
    assert wc.utilization == pytest.approx(wc.compute_s / (wc.compute_s + per_step * T))


@pytest.mark.parametrize("M", [2, 4, 8])
def test_diloco_terms_on_the_papers_settings(M):
    H = 30
    wc = diloco_wallclock(
        num_params=N,
        num_tokens=D,
        batch_tokens=B,
        num_chips=R,
        flops_per_chip=Q,
        num_replicas=M,
        sync_every=H,
        within=WITHIN,
        cross=CROSS,
    )
    T = num_steps(num_tokens=D, batch_tokens=B)
    assert wc.within_comm_s == pytest.approx((2 * N * 16 / 800e9 * (1 - M / R) + 1e-5) * T, rel=1e-12)
    assert wc.cross_comm_s == pytest.approx((2 * N * 16 / 100e9 * (1 - 1 / R) + 1e-2) * T / H, rel=1e-12)
    # The cross-datacenter part is exactly data-parallel's divided by H.
    dp = data_parallel_wallclock(num_params=N, num_tokens=D, batch_tokens=B, num_chips=R, flops_per_chip=Q, cross=CROSS)
    assert wc.cross_comm_s * H == pytest.approx(dp.cross_comm_s, rel=1e-12)
    assert wc.compute_s == dp.compute_s


def test_diloco_with_one_replica_is_data_parallel_inside_one_datacenter():
    wc = diloco_wallclock(
        num_params=N,
        num_tokens=D,
        batch_tokens=B,
        num_chips=R,
        flops_per_chip=Q,
        num_replicas=1,
        sync_every=30,
        within=WITHIN,
        cross=CROSS,
    )
    dp_inside = data_parallel_wallclock(
        num_params=N, num_tokens=D, batch_tokens=B, num_chips=R, flops_per_chip=Q, cross=WITHIN
    )
    assert wc.cross_comm_s == 0.0
    assert wc.within_comm_s == pytest.approx(dp_inside.cross_comm_s, rel=1e-12)


def test_more_replicas_and_larger_h_only_reduce_communication():
    kw = dict(num_params=N, num_tokens=D, batch_tokens=B, num_chips=R, flops_per_chip=Q, within=WITHIN, cross=CROSS)
    comm = [diloco_wallclock(num_replicas=M, sync_every=30, **kw).within_comm_s for M in (2, 4, 8)]
    assert comm[0] > comm[1] > comm[2]
    cross = [diloco_wallclock(num_replicas=2, sync_every=H, **kw).cross_comm_s for H in (1, 30, 300)]
    assert cross[0] == pytest.approx(30 * cross[1]) and cross[1] == pytest.approx(10 * cross[2])


@settings(max_examples=40, deadline=None)
@given(
    params=st.floats(1e6, 1e11),
    step=st.floats(0.01, 10),
    gbps=st.floats(0.01, 1e4),
    lat=st.floats(0, 0.5),
    bits=st.sampled_from([4.0, 16.0]),
)
def test_agrees_with_the_simulator_when_nothing_can_overlap(params, step, gbps, lat, bits):
    # Two chips, one each side, one layer: the simulator cannot hide the reduction behind anything, and the
    # ring over R = 2 chips sends N b bits; so wall-clock utilization = simulated utilization. The paper's
    # model charges its latency e once per all-reduce: the simulator's one-hop exchange at M = 2 (all-gather).
    batch = 1e6
    flops = 6 * params * batch / (2 * step)  # chosen so that one step computes for `step` seconds
    wc = data_parallel_wallclock(
        num_params=params,
        num_tokens=batch * 100,
        batch_tokens=batch,
        num_chips=2,
        flops_per_chip=flops,
        cross=Network(gbps * 1e9, lat),
        bits_per_param=bits,
    )
    sim = predict_utilization(
        method="dp",
        num_params=params,
        num_layers=1,
        step_time_s=step,
        bandwidth_bps=gbps * 1e9,
        latency_s=lat,
        bits=bits,
        exchange="all_gather",
    )
    assert wc.utilization == pytest.approx(sim, rel=1e-9)


def test_user_errors():
    with pytest.raises(ValueError, match="multiple of num_replicas"):
        diloco_wallclock(
            num_params=N,
            num_tokens=D,
            batch_tokens=B,
            num_chips=10,
            flops_per_chip=Q,
            num_replicas=4,
            sync_every=30,
            within=WITHIN,
            cross=CROSS,
        )
    with pytest.raises(ValueError, match="bandwidth_bps"):
        Network(0.0)
    with pytest.raises(ValueError, match="num_tokens"):
        num_steps(num_tokens=-1, batch_tokens=B)
