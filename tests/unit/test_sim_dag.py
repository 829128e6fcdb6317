"""The utilization simulator against closed forms, invariances and equivalences."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diloco.sim import ModelSpec, data_parallel, diloco, predict_utilization, streaming, utilization_curve
from diloco.sim.dag import ComputeStream
from diloco.sim.utilization import build_plan, fragment_units, paper_methods
from diloco.traffic import EXCHANGES, exchange_bytes

FAST = settings(max_examples=40, deadline=None)
layers = st.integers(1, 30)
step_times = st.floats(0.01, 10.0)
params = st.floats(1e5, 1e11)
bits = st.sampled_from([1.0, 4.0, 8.0, 16.0, 32.0])


def test_compute_stream_offsets_by_hand():
    # L = 3: F0 F1 F2 | Ba2 Bp2 Ba1 Bp1 Bp0 -> 8 nodes of 1 s each.
    s = ComputeStream(3, 8.0)
    assert s.num_nodes == 8 and s.node_time_s == 1.0
    assert [s.forward_start(layer) for layer in range(3)] == [0.0, 1.0, 2.0]
    assert [s.param_backward_end(layer) for layer in range(3)] == [8.0, 7.0, 5.0]


@FAST
@given(L=layers, T=step_times, N=params)
def test_infinite_bandwidth_is_full_utilization(L, T, N):
    model = ModelSpec(L, N, T)
    for method in paper_methods(max(L, 3), sync_every=100, fragment_layers=3)[:1] + [
        diloco(sync_every=7),
        streaming(sync_every=10, num_fragments=min(L + 1, 4), overlap_steps=1),
    ]:
        assert utilization_curve(model, method, [np.inf])[0] == pytest.approx(1.0, abs=1e-12)


@FAST
@given(
    T=step_times,
    N=params,
    b=bits,
    gbps=st.floats(0.01, 1e4),
    latency=st.floats(0, 1.0),
    M=st.integers(2, 9),
    exchange=st.sampled_from(EXCHANGES),
)
def test_data_parallel_one_layer_by_hand(T, N, b, gbps, latency, M, exchange):
    # One layer: its gradient is ready at the end of the step and needed at the start of the next,
    # so the whole reduction is exposed: CU = T / (T + link bits / W + hops * latency), with the
    # link bits of the shared traffic function and one latency per ring hop.
    bw = gbps * 1e9
    cu = predict_utilization(
        method="dp",
        num_params=N,
        num_layers=1,
        step_time_s=T,
        bandwidth_bps=bw,
        latency_s=latency,
        bits=b,
        num_workers=M,
        exchange=exchange,
    )
    link_bits = 8 * exchange_bytes(payload_bytes=N * b / 8, num_replicas=M, exchange=exchange)
    hops = 2 * (M - 1) if exchange == "reduce_scatter" else M - 1
    assert cu == pytest.approx(T / (T + link_bits / bw + hops * latency), rel=1e-12)


def test_papers_all_reduce_and_the_all_gather_send_the_same_at_two_workers():
    model = ModelSpec(12, 1e9, 0.3)
    bw = np.logspace(8, 11, 7)
    a = utilization_curve(model, diloco(sync_every=10), bw, exchange="all_gather")
    b = utilization_curve(model, diloco(sync_every=10), bw, exchange="reduce_scatter")
    np.testing.assert_array_equal(a, b)
    # at M = 4 the all-gather sends (M-1) = 3 payloads, the all-reduce 1.5: it needs more bandwidth
    a4 = utilization_curve(model, diloco(sync_every=10), bw, exchange="all_gather", num_workers=4)
    b4 = utilization_curve(model, diloco(sync_every=10), bw, exchange="reduce_scatter", num_workers=4)
    assert np.all(a4 <= b4 + 1e-12) and np.any(a4 < b4 - 1e-3)


def test_latency_is_pipelined_not_link_time():
    # 48 layers, 50 ms per hop, unlimited bandwidth: the old model charged 49 x 100 ms of link time per step
    # (29.9 % for DP); pipelined, each message is only delayed, so DP loses about one exchange's latency.
    model = ModelSpec(48, 1e10, 0.8)
    cu = utilization_curve(model, data_parallel(), [np.inf], latency_s=0.05)[0]
    assert 0.8 / (0.8 + 0.1) - 1e-9 <= cu < 1.0
    # latency grows with the ring: 2(M-1) hops
    cu8 = utilization_curve(model, data_parallel(), [np.inf], latency_s=0.05, num_workers=8)[0]
    assert cu8 < cu


@FAST
@given(T=step_times, N=params, nb_frac=st.floats(0.01, 0.9), gbps=st.floats(0.01, 1e4))
def test_non_block_parameters_are_exposed_after_the_last_layer(T, N, nb_frac, gbps):
    # One layer + non-block params: both ready at the end of the backward, both needed first: FIFO, back to back.
    bw = gbps * 1e9
    nb = nb_frac * N
    model = ModelSpec(1, N, T, non_block_params=nb)
    cu = utilization_curve(model, data_parallel(), [bw])[0]
    assert cu == pytest.approx(T / (T + 16 * N / bw), rel=1e-12)


@FAST
@given(L=st.integers(2, 40), T=step_times, N=params, frac=st.floats(0.01, 1.0))
def test_data_parallel_hides_all_but_the_first_layer_when_transfers_are_short(L, T, N, frac):
    # Per-layer transfer c <= one node (T / (3L - 1)): every reduction but layer 1's (released last,
    # needed first) hides behind the backward, so CU = T / (T + c).
    d = T / (3 * L - 1)
    c = frac * d
    bw = (N / L) * 16 / c
    cu = utilization_curve(ModelSpec(L, N, T), data_parallel(), [bw])[0]
    assert cu == pytest.approx(T / (T + c), rel=1e-9)


@FAST
@given(L=st.integers(1, 40), T=step_times, H=st.integers(1, 300), mult=st.floats(2.0, 1e4))
def test_diloco_slow_link_closed_form(L, T, H, mult):
    # Transfers c >= 2 nodes keep the link busy from the first release (layer L's parameter-backward
    # at (L + 2) nodes) until all L are through; layer 1 is last and gates the next step:
    # period = H T + (L + 2) d + L c - T.
    N = 1e9
    d = T / (3 * L - 1)
    c = mult * d
    bw = (N / L) * 16 / c
    cu = utilization_curve(ModelSpec(L, N, T), diloco(sync_every=H), [bw])[0]
    first_release = (L + 2) * d if L > 1 else T
    assert cu == pytest.approx(H * T / (H * T + first_release + L * c - T), rel=1e-9)


@FAST
@given(L=layers, T=step_times, gbps=st.floats(0.05, 500), k=st.floats(0.1, 10.0), latency=st.floats(0, 0.1))
def test_invariant_under_scaling_time_and_bandwidth(L, T, gbps, k, latency):
    # Everything is seconds: k times slower compute, k times less bandwidth, k times the latency -> same CU.
    method = streaming(sync_every=20, num_fragments=min(L + 1, 5), overlap_steps=1)
    a = utilization_curve(ModelSpec(L, 1e9, T), method, [gbps * 1e9], latency_s=latency)
    b = utilization_curve(ModelSpec(L, 1e9, T * k), method, [gbps * 1e9 / k], latency_s=latency * k)
    np.testing.assert_allclose(a, b, rtol=1e-9)


@FAST
@given(L=layers, b=bits, k=st.floats(0.1, 10.0))
def test_only_bits_over_bandwidth_matters(L, b, k):
    model = ModelSpec(L, 1e9, 0.5)
    grid = np.logspace(8, 11, 7)
    a = utilization_curve(model, diloco(sync_every=10, bits=b), grid)
    c = utilization_curve(model, diloco(sync_every=10, bits=b * k), grid * k)
    np.testing.assert_allclose(a, c, rtol=1e-9)


@pytest.mark.parametrize("M", [1, 2, 3, 4, 8])
def test_workers_enter_through_the_ring_factor(M):
    model = ModelSpec(12, 1e9, 0.3)
    grid = np.logspace(8, 11, 9)
    got = utilization_curve(model, diloco(sync_every=30), grid, num_workers=M)
    if M == 1:
        np.testing.assert_array_equal(got, 1.0)  # nothing to exchange
    else:  # each worker sends 2(M-1)/M of the payload: the same as M=2 at a proportionally lower bandwidth
        ref = utilization_curve(model, diloco(sync_every=30), grid / (2 * (M - 1) / M), num_workers=2)
        np.testing.assert_allclose(got, ref, rtol=1e-12)


@FAST
@given(L=st.integers(1, 30), H=st.integers(2, 200), gbps=st.floats(0.05, 100))
def test_diloco_stall_per_sync_does_not_depend_on_h(L, H, gbps):
    # With tau = 0 each sync's reductions finish before the next step's forward uses them, so syncs never
    # interact: CU = H T / (H T + S) with one stall S per sync, whatever H (H = 1 is data-parallel).
    model = ModelSpec(L, 1e9, 0.2)
    stall = lambda h: (1 / utilization_curve(model, diloco(sync_every=h), [gbps * 1e9])[0] - 1) * h * 0.2
    assert stall(H) == pytest.approx(stall(1), rel=1e-9, abs=1e-12)


@FAST
@given(L=st.integers(3, 30), per=st.integers(1, 4), gbps=st.floats(0.05, 100), s=st.integers(1, 10))
def test_streaming_without_overlap_does_not_depend_on_fragment_placement(L, per, gbps, s):
    # Same argument per fragment: without overlap their stalls add up, wherever the schedule puts them.
    P = math.ceil(L / per) + 1
    H = 12 * P
    model = ModelSpec(L, 1e9, 0.2, non_block_params=1e8)
    spread = utilization_curve(model, streaming(sync_every=H, num_fragments=P), [gbps * 1e9])
    spaced = utilization_curve(model, streaming(sync_every=H, num_fragments=P, fragment_spacing=s), [gbps * 1e9])
    np.testing.assert_allclose(spread, spaced, rtol=1e-9)


def test_streaming_fragments_follow_the_trainer_layout():
    # Fragment 0 = non-block unit (index L); blocks strided over P - 1 groups, or contiguous runs.
    assert fragment_units(6, 1) == ((0, 1, 2, 3, 4, 5, 6),)
    assert fragment_units(6, 3) == ((6,), (0, 2, 4), (1, 3, 5))
    assert fragment_units(6, 3, "sequential") == ((6,), (0, 1, 2), (3, 4, 5))
    assert fragment_units(24, 9)[1] == (0, 8, 16)  # the paper's 1B: fragments of 3 strided layers
    with pytest.raises(ValueError, match="num_fragments=9"):
        fragment_units(4, 9)


def test_plan_sends_the_paper_payload():
    model = ModelSpec(24, 1e9, 0.1)
    plan = build_plan(model, paper_methods(24)[4])  # 4-bit, M = 2: each worker sends the full payload
    assert sum(plan.unit_bits) == pytest.approx(4 * 1e9)
    assert plan.schedule.offsets == tuple(11 * (p + 1) for p in range(9))  # one fragment every 11 steps


def test_overlap_and_fewer_bits_only_help_here():
    model = ModelSpec(48, 1e10, 0.96)
    grid = np.logspace(8, 11, 30)
    dp, dl, sd, ov, q = (utilization_curve(model, m, grid) for m in paper_methods(48))
    assert np.all(dl >= dp) and np.all(sd >= dl - 1e-12) and np.all(ov >= sd - 0.01) and np.all(q >= ov - 1e-12)


def test_user_errors():
    with pytest.raises(ValueError, match="bandwidth_bps"):
        utilization_curve(ModelSpec(2, 1e6, 1.0), data_parallel(), [0.0])
    with pytest.raises(ValueError, match="latency_s"):
        utilization_curve(ModelSpec(2, 1e6, 1.0), data_parallel(), [1e9], latency_s=-1)
    with pytest.raises(ValueError, match="method must be one of"):
        predict_utilization(method="ddp", num_params=1e6, num_layers=2, step_time_s=1.0, bandwidth_bps=1e9)
    with pytest.raises(ValueError, match="data-parallel reduces every step"):
        predict_utilization(
            method="dp", num_params=1e6, num_layers=2, step_time_s=1.0, bandwidth_bps=1e9, sync_every=10
        )
    with pytest.raises(ValueError, match="non_block_params"):
        ModelSpec(2, 1e6, 1.0, non_block_params=2e6)
    with pytest.raises(ValueError, match="fragment_spacing"):
        streaming(sync_every=10, num_fragments=4, fragment_spacing=3)


def test_streaming_with_every_fragment_at_the_same_step_is_diloco():
    # The simulator places reductions where the schedule says: if the schedule syncs all fragments after
    # the same step, Streaming DiLoCo's DAG is DiLoCo's, whatever the fragment layout.
    from diloco.algorithm.schedule import Schedule
    from diloco.sim.dag import SyncPlan, simulate_utilization

    L, H, P = 12, 20, 5
    model = ModelSpec(L, 1e9, 0.3)
    grid = np.logspace(8, 11, 15)
    dl = utilization_curve(model, diloco(sync_every=H), grid)
    ref = build_plan(model, streaming(sync_every=H, num_fragments=P))
    together = SyncPlan(Schedule(H, P, 0, offsets=(H,) * P), ref.fragment_units, ref.unit_bits)
    np.testing.assert_allclose(simulate_utilization(ComputeStream(L, 0.3), together, grid), dl, rtol=1e-12)


def test_overlapping_fragments_queue_on_the_link():
    # With tau = 1 a slow transfer spills into later steps; fragments one step apart then queue behind each
    # other on the FIFO link, fragments far apart do not.
    model = ModelSpec(12, 1e9, 0.3)
    bw = [2e9]  # a 3-layer fragment (4e9 bits) takes 2 s, about 7 steps
    near = utilization_curve(
        model, streaming(sync_every=100, num_fragments=5, overlap_steps=1, fragment_spacing=1), bw
    )[0]
    far = utilization_curve(
        model, streaming(sync_every=100, num_fragments=5, overlap_steps=1, fragment_spacing=20), bw
    )[0]
    assert near < far - 0.01


@FAST
@given(L=layers, T=step_times, H=st.integers(1, 40), gbps=st.floats(0.01, 100), latency=st.floats(0, 0.05))
def test_exchange_after_the_step_closed_form(L, T, H, gbps, latency):
    # overlap_backward=False (how DataParallel / StreamingDiLoCo at tau=0 exchange): nothing overlaps,
    # so every H steps the whole payload (L + 1 units sent back to back; only the last one's latency,
    # two ring hops at M = 2, is exposed: latency is pipelined) is added to H T.
    model = ModelSpec(L, 1e9, T, non_block_params=2e8)
    method = data_parallel() if H == 1 else diloco(sync_every=H)
    bits = sum(build_plan(model, method).unit_bits)
    cu = utilization_curve(model, method, [gbps * 1e9], latency_s=latency, overlap_backward=False)[0]
    assert cu == pytest.approx(H * T / (H * T + bits / (gbps * 1e9) + 2 * latency), rel=1e-9)
    overlapped = utilization_curve(model, method, [gbps * 1e9], latency_s=latency)[0]
    assert overlapped >= cu - 1e-12  # releasing layer by layer can only help


def test_predict_utilization_passes_overlap_backward() -> None:
    kw = dict(method="dp", num_params=2e6, num_layers=5, step_time_s=0.4, bandwidth_bps=75e6, non_block_params=1e6)
    bits = sum(build_plan(ModelSpec(5, 2e6, 0.4, non_block_params=1e6), data_parallel()).unit_bits)
    after = predict_utilization(**kw, overlap_backward=False)
    assert after == pytest.approx(0.4 / (0.4 + bits / 75e6), rel=1e-9)
    assert after < predict_utilization(**kw)


@pytest.mark.parametrize("mbps", [5.0, 20.0])
def test_predict_utilization_eager(mbps: float) -> None:
    # eager updates (tau = H): each round's exchange overlaps the whole next round, so in steady state a
    # round takes max(H T, the exchange's link time): utilization = min(1, H T / (bits / bandwidth))
    H, T = 8, 0.5
    kw = dict(
        method="diloco",
        num_params=2e6,
        num_layers=5,
        step_time_s=T,
        bandwidth_bps=mbps * 1e6,
        non_block_params=1e6,
        sync_every=H,
        overlap_steps=H,
        overlap_backward=False,
    )
    bits = sum(build_plan(ModelSpec(5, 2e6, T, non_block_params=1e6), diloco(sync_every=H)).unit_bits)
    assert predict_utilization(**kw, eager=True) == pytest.approx(min(1.0, H * T / (bits / (mbps * 1e6))), rel=1e-9)
    with pytest.raises(ValueError, match="overlap_steps must equal sync_every"):
        predict_utilization(**{**kw, "overlap_steps": 1}, eager=True)
