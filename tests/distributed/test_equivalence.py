"""The same replica code on two backends: threads in one process vs gloo processes.

Both runs use one intra-op thread per replica, the same model, data, seed and
codec, and the algorithm sums the decoded payloads in FP32 in rank order; gloo
moves the payload bytes unchanged. So the results must be *bit-identical*, not
merely close: any difference is a bug in a backend.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
from _replicas import data_parallel_replica, single_thread, streaming_replica

from diloco.algorithm.schedule import Schedule
from diloco.comm.local import run_replicas
from diloco.distributed import run_processes
from diloco.traffic import shard_sizes
from diloco.wire.registry import get_codec

pytestmark = pytest.mark.timeout(120)


def both_backends(fn, world_size: int, cfg: dict) -> tuple[list[dict], list[dict]]:
    with single_thread():
        local = run_replicas(partial(fn, cfg=cfg), world_size, timeout=60)
    return local, run_processes(fn, world_size, args=(cfg,), timeout_s=90)


def assert_bit_identical(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y), (x - y).abs().max()


@pytest.mark.parametrize(
    "cfg",
    [
        {"H": 4, "steps": 12},  # plain DiLoCo
        {"H": 4, "P": 3, "tau": 1, "alpha": 0.5, "codec": "fp4_e3m0", "steps": 14},  # streaming, overlap, FP4
    ],
    ids=["diloco-fp32", "streaming-overlap-fp4"],
)
def test_streaming_diloco_gloo_equals_in_process_bit_for_bit(cfg):
    local, gloo = both_backends(streaming_replica, 2, cfg)
    for r in range(2):
        assert_bit_identical(local[r]["global"], gloo[r]["global"])
        assert_bit_identical(local[r]["local"], gloo[r]["local"])
        assert local[r]["stats"] == gloo[r]["stats"]
        assert local[r]["reports"] == gloo[r]["reports"]
    assert_bit_identical(gloo[0]["global"], gloo[1]["global"])  # and the replicas agree
    assert len(gloo[0]["reports"]) >= 3  # several syncs happened: the comparison is not vacuous


def test_data_parallel_gloo_equals_in_process_bit_for_bit():
    local, gloo = both_backends(data_parallel_replica, 2, {"steps": 6})
    for r in range(2):
        assert_bit_identical(local[r]["local"], gloo[r]["local"])
        assert local[r]["stats"] == gloo[r]["stats"]
    assert_bit_identical(gloo[0]["local"], gloo[1]["local"])
    # fp32 gradients every step: 4 bytes per parameter, sent once and received from the one peer
    nbytes = 4 * gloo[0]["numel"] * 6
    assert gloo[0]["stats"]["bytes_sent"] == nbytes and gloo[0]["stats"]["bytes_received"] == nbytes


def test_byte_counts_on_gloo_equal_the_analytic_ones():
    """Per replica, M = 3 (the reduce-scatter exchange): for every fragment sync the schedule starts, the
    shards it sends and receives in the all-to-all and the means in the all-gather: 2(M-1)/M of a payload."""
    H, P, steps, codec = 6, 3, 24, get_codec("fp4_e3m0")
    cfg = {"H": H, "P": P, "tau": 1, "codec": codec.name, "steps": steps}
    results = run_processes(streaming_replica, 3, args=(cfg,), timeout_s=90)
    sizes = results[0]["fragment_sizes"]
    assert sum(sizes) == sum(t.numel() for t in results[0]["local"])  # the fragments partition the model
    schedule = Schedule(H, P, 1)
    starts = [p for t in range(1, steps + 1) for p in schedule.starts(t)]
    for rank, res in enumerate(results):

        def link(n: int) -> int:
            shards = [codec.num_bytes(s) for s in shard_sizes(n, 3)]
            # the others' shards out, 2 copies of its own in; then its mean out twice, the 2 others' in
            return sum(shards) - shards[rank] + 2 * shards[rank]

        expected = sum(link(sizes[p]) for p in starts)
        stats = res["stats"]
        assert stats["num_exchanges"] == len(starts)  # one exchange per fragment sync, nothing else counted
        assert stats["bytes_sent"] == stats["bytes_received"] == expected
        # 2(M-1)/M of the whole payload, but for the scales each shard carries on its own: a tensor-scale
        # byte, a partial block's scale and half a byte of codes at most, in each of the 2(M-1) = 4 shard
        # messages each way per sync
        analytic = sum(2 * 2 / 3 * codec.num_bytes(sizes[p]) for p in starts)
        assert 0 <= expected - analytic <= 4 * 3 * len(starts)
        assert stats["peak_exchange"] == max(link(n) for n in sizes)


def test_a_non_finite_outer_gradient_from_one_process_is_dropped_and_training_goes_on():
    # replica 1's parameters get a NaN right before the step-8 sync; H = 4, 16 steps: syncs at 4, 8, 12, 16
    cfg = {"H": 4, "steps": 16, "poison": (1, 8)}
    local, gloo = both_backends(streaming_replica, 2, cfg)
    for r in range(2):
        dropped = [(rep["step"], rep["dropped_replicas"]) for rep in gloo[r]["reports"]]
        assert dropped == [(4, []), (8, [1]), (12, []), (16, [])]
        assert all(torch.isfinite(g).all() for g in gloo[r]["global"])
        assert all(torch.isfinite(p).all() for p in gloo[r]["local"])  # the alpha = 0 merge healed replica 1
        assert_bit_identical(local[r]["global"], gloo[r]["global"])
    assert_bit_identical(gloo[0]["global"], gloo[1]["global"])
