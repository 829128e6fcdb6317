"""The pure parts of ``benchmarks/hosts_table.py`` (:mod:`diloco.bench.hosts_table`): the measured window of a run's
rows, the simulator's column at the measured bytes and step time, and the gap. Closed forms, no processes."""

from __future__ import annotations

import math

import pytest

from diloco.bench.hosts_table import gaps, learner_window, predict, sim_bits, sync_window
from diloco.traffic import exchange_bytes

PARAMS, LAYERS, NON_BLOCK = 312_160, 5, 35_000.0


def _sync_rows(n: int, *, compute: float, wall: float, sent: float) -> list[dict]:
    rows = [
        {"step": s, "loss": 5.0, "compute_time_s": compute, "step_time_s": wall, "bytes_sent": sent * s}
        for s in range(1, n + 1)
    ]
    rows[0]["step_time_s"] = 100.0  # the first step (start-up) is outside the window
    return rows + [{"step": n, "eval_loss": 4.0}]  # an evaluation row is not a step


def test_sync_window_reads_the_steps_between_skip_and_last_only():
    got = sync_window(_sync_rows(10, compute=0.1, wall=0.4, sent=1e6), skip=2, last=10, tokens_per_step=384)
    assert got["steps"] == 7  # steps 3..9
    assert got["utilization"] == pytest.approx(0.25)
    assert got["tokens_per_s"] == pytest.approx(384 / 0.4)
    assert got["compute_s_per_step"] == pytest.approx(0.1)
    assert got["bytes_per_step"] == pytest.approx(1e6)  # cumulative bytes differenced from the step before
    with pytest.raises(ValueError, match="no step rows"):
        sync_window(_sync_rows(4, compute=0.1, wall=0.4, sent=1.0), skip=8, last=4, tokens_per_step=1)


def test_learner_window_means_the_learners_and_sums_their_rates():
    def rows(dt: float, wait: float) -> list[dict]:
        return [
            {"step": s, "dt": dt, "compute_s": 0.1, "wait_s": wait, "bytes_sent": 2e4 * s} for s in range(1, 11)
        ] + [{"event": "joined", "t": 0.0}]

    got = learner_window({0: rows(0.1, 0.0), 1: rows(0.2, 0.1)}, skip=2, last=10, tokens_per_step=128)
    assert got["utilization"] == pytest.approx((1.0 + 0.5) / 2)
    assert got["tokens_per_s"] == pytest.approx(128 / 0.1 + 128 / 0.2)
    assert got["wait_share"] == pytest.approx((0.0 + 0.5) / 2)
    assert got["bytes_per_step"] == pytest.approx(2e4)


@pytest.mark.parametrize(("bits", "sync_every"), [(32.0, 1), (4.25, 8)])
def test_sim_bits_gives_back_the_bits_whose_exchange_moves_the_measured_bytes(bits, sync_every):
    # what a reduce-scatter among 3 moves for one sync of every parameter at `bits`, spread over the round's steps
    per_round = exchange_bytes(payload_bytes=PARAMS * bits / 8, num_replicas=3, exchange="reduce_scatter")
    got = sim_bits(
        bytes_per_step=per_round / sync_every,
        sync_every=sync_every,
        num_params=PARAMS,
        workers=3,
        exchange="reduce_scatter",
    )
    assert got == pytest.approx(bits, rel=1e-12)


def test_dp_prediction_is_the_closed_form_of_an_exchange_after_each_step():
    """DP, exchange after the step (overlap_backward=False), no latency: a step takes compute + link bytes / rate,
    so utilization = c / (c + 8 B / R) and tokens/s = tokens / (c + 8 B / R), B the measured bytes a step."""
    c, mbps, sent, tokens = 0.1, 50.0, 1.665e6, 384
    got = predict(
        method="dp",
        mbps=mbps,
        compute_s_per_step=c,
        bytes_per_step=sent,
        tokens_per_step=tokens,
        num_params=PARAMS,
        num_layers=LAYERS,
        non_block_params=NON_BLOCK,
        workers=3,
        sync_every=8,  # ignored for DP: it syncs every step
        num_fragments=3,
        overlap_steps=1,
    )
    comm = 8 * sent / (mbps * 1e6)
    assert got["sim_utilization"] == pytest.approx(c / (c + comm), rel=1e-6)
    assert got["sim_tokens_per_s"] == pytest.approx(tokens / (c + comm), rel=1e-6)
    assert got["sim_model"] == "dp" and got["sim_bits_per_param"] == pytest.approx(
        8 * sent / (PARAMS * 4 / 3), rel=1e-12
    )


def test_decoupled_stands_in_with_streaming_of_the_same_schedule_and_bytes_and_streaming_hides_a_small_exchange():
    kw = dict(
        mbps=50.0,
        compute_s_per_step=0.1,
        bytes_per_step=2e4,
        tokens_per_step=384,
        num_params=PARAMS,
        num_layers=LAYERS,
        non_block_params=NON_BLOCK,
        workers=3,
        sync_every=8,
        num_fragments=3,
        overlap_steps=1,
    )
    s, d = predict(method="streaming", **kw), predict(method="decoupled", **kw)
    assert d["sim_model"] == "streaming (stand-in)"
    assert d["sim_utilization"] == s["sim_utilization"] == pytest.approx(1.0)  # 0.03 s of link under a 0.1 s step
    # at 1 Mbit/s the same fragments (8 * 2e4 * 8 / 3 bits each, 0.43 s) cannot hide under one 0.1 s step
    slow = predict(method="streaming", **(kw | {"mbps": 1.0}))
    assert slow["sim_utilization"] < 0.9


def test_gaps_are_points_of_utilization_and_a_ratio_of_tokens():
    g = gaps({"utilization": 0.2, "sim_utilization": 0.27, "tokens_per_s": 800.0, "sim_tokens_per_s": 1000.0})
    assert g["gap_utilization_points"] == pytest.approx(-7.0)
    assert g["gap_tokens_per_s"] == pytest.approx(-0.2)
    assert gaps({"utilization": 0.5})["gap_utilization_points"] is None
    assert all(not math.isnan(v) for v in gaps({"utilization": 1.0, "sim_utilization": 1.0}).values() if v is not None)
