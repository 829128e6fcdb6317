"""FSDP inside a worker: 2 workers x 2 ranks, each worker's model ``fully_shard``'ed (FSDP2) on gloo.

Each rank keeps the global copy and outer-optimizer state of its own shard and
exchanges it with the same-index rank of the other worker
(``Layout.shard_communicator``). Against the in-process run of 2 replicas, each
training on its worker's two half-batches concatenated (fp32, same data, same
inits): equal within float tolerance (FSDP averages two half-batch gradients
where the reference differentiates the mean over the whole batch: the same
number, summed in another order), and each rank holds half of the replica's
global copy and outer state.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
from torch.testing import assert_close

from _replicas import fsdp_rank, reference_state, single_thread
from _tiny import make_model
from diloco.comm.local import run_replicas
from diloco.distributed import run_processes

pytestmark = pytest.mark.timeout(180)

CFG = {"workers": 2, "ranks_per_worker": 2, "H": 4, "P": 2, "tau": 1, "steps": 12}


def test_two_sharded_workers_of_two_ranks_equal_two_replicated_replicas():
    grid = run_processes(fsdp_rank, 4, args=(CFG,), timeout_s=150)
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
        # memory: half of the replica's global copy and outer state on each of the R = 2 ranks
        assert g["memory"]["global_bytes"] * 2 == want["memory"]["global_bytes"]
        assert g["memory"]["outer_state_bytes"] * 2 == want["memory"]["outer_state_bytes"] > 0
        # bytes: each rank exchanges its shard only: half of a replicated worker's, per rank
        assert g["stats"]["bytes_sent"] * 2 == want["stats"]["bytes_sent"] > 0
    # training and the syncs really moved the parameters: the comparison is not vacuous
    start = make_model(seed=0).state_dict()
    for name in ("embed.weight", "blocks.0.fc.weight", "head.weight"):
        assert (grid[0]["global"][name] - start[name]).abs().max() > 1e-2
