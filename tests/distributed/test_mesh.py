"""2 workers x 2 ranks on gloo: DDP inside each worker, Streaming DiLoCo across workers.

Reference: the in-process run with 2 replicas whose batch at every step is the
concatenation of its worker's two ranks' batches. DDP averages the two ranks'
gradients of their half-batch mean losses, which is the gradient of the mean
loss over the concatenated batch: the same number, summed in a different FP32
order (gloo's (g_a/2 + g_b/2) vs autograd's sum over 2B rows), so the runs agree
to a few ulps rather than bit for bit. The inner optimizer is SGD with momentum,
linear in the gradient, so those ulps stay ulps (AdamW's g/sqrt(v) would blow a
1-ulp difference in a near-zero gradient up to a full lr-sized step).
Tolerance: rtol 1e-5, atol 1e-6 (measured max abs difference: ~1.2e-7).
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
from _replicas import mesh_exchange_rank, mesh_rank, mesh_reference_replica, single_thread
from torch.testing import assert_close

from diloco.comm.local import run_replicas
from diloco.distributed import ProcessFailure, run_processes

pytestmark = pytest.mark.timeout(120)

CFG = {"workers": 2, "ranks_per_worker": 2, "H": 4, "P": 2, "tau": 1, "steps": 12}


def test_ddp_inside_workers_and_streaming_diloco_across_equals_the_in_process_run():
    mesh = run_processes(mesh_rank, 4, args=(CFG,), timeout_s=90)
    with single_thread():
        ref = run_replicas(partial(mesh_reference_replica, cfg=CFG), 2, timeout=60)

    assert [(m["worker"], m["local_rank"]) for m in mesh] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [m["intra"] for m in mesh] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert [m["cross"] for m in mesh] == [[0, 2], [1, 3], [0, 2], [1, 3]]
    for m in mesh:
        expected = ref[m["worker"]]
        for a, b in zip(m["global"], expected["global"], strict=True):
            assert_close(a, b, rtol=1e-5, atol=1e-6)
        for a, b in zip(m["local"], expected["local"], strict=True):
            assert_close(a, b, rtol=1e-5, atol=1e-6)
        assert m["stats"] == expected["stats"]  # logical bytes per worker: as with one rank per worker
        # every rank of the grid decoded the same payloads in the same order: one global copy everywhere
        for a, b in zip(m["global"], mesh[0]["global"], strict=True):
            assert torch.equal(a, b)
    # the sync really moved the parameters: the comparison is not vacuous
    assert not torch.equal(ref[0]["local"][0], ref[1]["local"][0])

    # bytes on the slow link: each rank sends only its half of each fp32 payload to the other worker
    sizes, stats = mesh[0]["fragment_sizes"], mesh[0]["stats"]
    assert stats["bytes_sent"] == sum(4 * n for n in sizes) * CFG["steps"] // CFG["H"]
    for m in mesh:
        assert m["cross_stats"]["bytes_sent"] == sum(-(-4 * n // 2) for n in sizes) * CFG["steps"] // CFG["H"]


def _mismatched_layout(comm) -> None:
    from diloco.comm.mesh import build_layout

    build_layout(2, 2)  # 4 ranks asked for, 2 present


def test_layout_that_does_not_cover_the_world_is_rejected():
    with pytest.raises(ProcessFailure, match=r"2 x 2 must equal the world size 2; e.g. ranks_per_worker=1"):
        run_processes(_mismatched_layout, 2, timeout_s=60)


def test_layout_needs_an_initialized_process_group():
    from diloco.comm.mesh import build_layout

    with pytest.raises(ValueError, match="not initialized"):
        build_layout(2, 2)


def test_three_workers_of_two_ranks_run_the_reduce_scatter_exchange_like_three_replicas():
    """M = 3 workers x R = 2 ranks: the all-to-all of shards and of means is cut into byte-pieces per local
    rank (as the all-gather is); every rank ends with the 3-replica result, bit for bit."""
    from _replicas import exchange_cases

    cases = [
        {"codec": "fp32", "numel": 1001, "seed": 7},
        {"codec": "fp4_e3m0", "numel": 1001, "seed": 8},
        {"codec": "int8", "numel": 999, "seed": 9, "poison": [2]},
    ]
    grid = run_processes(
        mesh_exchange_rank, 6, args=({"workers": 3, "ranks_per_worker": 2, "cases": cases},), timeout_s=90
    )
    flat = run_processes(exchange_cases, 3, args=(cases,), timeout_s=90)
    for g in grid:
        for got, want in zip(g["cases"], flat[g["worker"]], strict=True):
            assert got["exchange"] == want["exchange"] == "reduce_scatter"
            assert got["dropped"] == want["dropped"]
            assert torch.equal(got["mean"], want["mean"])
            assert got["counted"] == want["counted"]  # per worker: the traffic function, as one replica
    assert grid[0]["cases"][2]["dropped"] == [2]
    # each local rank carries about half of its worker's slow-link bytes
    per_worker = sum(c["counted"]["wire_sent"] for c in flat[0])
    assert abs(grid[0]["cross_wire"] + grid[1]["cross_wire"] - per_worker) <= 8 * len(cases)
