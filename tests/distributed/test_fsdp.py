"""FSDP inside a worker: 2 workers x R = 2 or 3 ranks, each worker's model ``fully_shard``'ed (FSDP2) on gloo.

Each rank keeps the global copy and outer-optimizer state of its own shard and
exchanges it with the same-index rank of the other worker
(``Layout.shard_communicator``). Against the in-process run of 2 replicas, each
training on its worker's two half-batches concatenated (fp32, same data, same
inits): equal within float tolerance (FSDP averages two half-batch gradients
where the reference differentiates the mean over the whole batch: the same
number, summed in another order), and the R ranks of a worker together hold
exactly one replica's global copy and outer state, each about 1/R of it.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
from _replicas import fsdp_rank, reference_state, single_thread
from _tiny import make_model
from torch.testing import assert_close

from diloco.comm.local import run_replicas
from diloco.distributed import run_processes

pytestmark = pytest.mark.timeout(180)


@pytest.mark.parametrize("R", [2, 3], ids=["2x2", "2x3-uneven-shards"])
def test_two_sharded_workers_equal_two_replicated_replicas(R):
    """R = 3 cuts TinyNet's dimension 8 (and 16) into uneven shards (3, 3, 2): each column still agrees."""
    CFG = {"workers": 2, "ranks_per_worker": R, "H": 4, "P": 2, "tau": 1, "steps": 12}
    grid = run_processes(fsdp_rank, 2 * R, args=(CFG,), timeout_s=150)
    with single_thread():
        ref = run_replicas(partial(reference_state, cfg=CFG), 2, timeout=60)
    assert all(g["sharded"] for g in grid)  # the parameters really were DTensor shards
    for g in grid:
        want = ref[g["worker"]]
        assert set(g["global"]) == set(want["global"])
        for name, value in want["global"].items():
            assert_close(g["global"][name], value, rtol=1e-5, atol=1e-6, msg=name)
        for name, value in want["local"].items():
            assert_close(g["local"][name], value, rtol=1e-5, atol=1e-6, msg=name)
        # the global copies of the two workers are the same bits (rank order sums on identical shards)
        for name, value in grid[0]["global"].items():
            assert torch.equal(g["global"][name], value)
    for w in range(2):  # the worker's R ranks together hold exactly one replica's state, and send its bytes
        ranks = [g for g in grid if g["worker"] == w]
        for key in ("global_bytes", "outer_state_bytes"):
            assert sum(g["memory"][key] for g in ranks) == ref[w]["memory"][key] > 0
            # each rank about 1/R of it (uneven shards: up to a row more)
            assert all(g["memory"][key] <= ref[w]["memory"][key] / R * 1.5 for g in ranks)
        assert sum(g["stats"]["bytes_sent"] for g in ranks) == ref[w]["stats"]["bytes_sent"] > 0
    # training and the syncs really moved the parameters: the comparison is not vacuous
    start = make_model(seed=0).state_dict()
    for name in ("embed.weight", "blocks.0.fc.weight", "head.weight"):
        assert (grid[0]["global"][name] - start[name]).abs().max() > 1e-2
