"""ShardSampler.recut_from: an elastic restart with another number of replicas reads each window of
the epoch once (the equal-shards leftovers aside), then returns to the usual partition."""

from __future__ import annotations

import numpy as np
import pytest

from diloco.data import ShardSampler

SEQ = 3  # windows of 4 tokens


def _samplers(tokens: np.ndarray, world: int, batch: int, seed: int = 7, partition: str = "interleaved"):
    return [
        ShardSampler(tokens, rank=r, world_size=world, batch_size=batch, seq_len=SEQ, seed=seed, partition=partition)
        for r in range(world)
    ]


def _read(samplers, steps: int) -> list[int]:
    """Window indices read by all replicas in lockstep for ``steps`` steps."""
    out: list[int] = []
    for _ in range(steps):
        for s in samplers:
            out += (s.next_starts() // (SEQ + 1)).tolist()
    return out


def _recut(samplers, world: int, batch: int, tokens: np.ndarray, partition: str = "interleaved"):
    new = _samplers(tokens, world, batch, partition=partition)
    state = samplers[0].state_dict()
    for s in new:
        s.recut_from(state)
    return new


@pytest.mark.parametrize("partition", ["interleaved", "contiguous"])
@pytest.mark.parametrize("worlds", [(2, 1), (1, 2), (2, 3), (4, 2, 3)])
def test_an_epoch_cut_between_replica_counts_reads_every_window_once(worlds, partition):
    n_windows = 120
    tokens = np.arange(n_windows * (SEQ + 1), dtype=np.int64)
    global_batch = 12
    samplers = _samplers(tokens, worlds[0], global_batch // worlds[0], partition=partition)
    read = _read(samplers, 2)
    for world in worlds[1:]:  # every restart after 2 more steps, within epoch 0
        samplers = _recut(samplers, world, global_batch // world, tokens, partition)
        assert all(s.epoch == 0 and s.index == 0 for s in samplers)
        read += _read(samplers, 2)
    # the rest of the epoch: each replica until its shard is done
    left = samplers[0].windows_per_epoch - samplers[0].index
    assert all(s.windows_per_epoch - s.index == left for s in samplers)  # equal shards: still in lockstep
    for s in samplers:
        read += (s.tokens[s.window_starts[s._epoch_order()[s.index :]]] // (SEQ + 1)).tolist()
    assert len(read) == len(set(read)), "a window was read twice in the epoch"
    assert n_windows - len(read) < worlds[-1], "more windows skipped than the equal-shards leftovers"


def test_the_recut_lasts_one_epoch_then_the_usual_partition_applies():
    tokens = np.arange(40 * (SEQ + 1), dtype=np.int64)
    old = _samplers(tokens, 2, 2)
    _read(old, 3)
    new = _recut(old, 1, 4, tokens)
    assert new[0].state_dict()["cuts"] == [[2, 6]]
    assert new[0].windows_per_epoch == 40 - 12
    while new[0].epoch == 0:
        new[0].next_starts()
    plain = ShardSampler(tokens, rank=0, world_size=1, batch_size=4, seq_len=SEQ, seed=7)
    plain.epoch = 1
    assert "cuts" not in new[0].state_dict()
    np.testing.assert_array_equal(new[0].window_starts, plain.window_starts)
    assert (new[0].epoch, new[0].index) == (1, 0)
    np.testing.assert_array_equal(new[0].next_starts(), plain.next_starts())


def test_a_recut_state_round_trips_and_the_same_count_is_a_plain_resume():
    tokens = np.arange(60 * (SEQ + 1), dtype=np.int64)
    old = _samplers(tokens, 3, 2)
    _read(old, 2)
    new = _recut(old, 2, 3, tokens)
    _read(new, 1)
    copy = ShardSampler(tokens, rank=1, world_size=2, batch_size=3, seq_len=SEQ, seed=7)
    copy.load_state_dict(new[1].state_dict())
    np.testing.assert_array_equal(copy.next_starts(), new[1].next_starts())
    same = ShardSampler(tokens, rank=1, world_size=2, batch_size=3, seq_len=SEQ, seed=7)
    same.recut_from(new[1].state_dict())  # same M and batch: load_state_dict
    assert same.state_dict() == new[1].state_dict()


def test_recut_refuses_other_data():
    tokens = np.arange(60 * (SEQ + 1), dtype=np.int64)
    state = _samplers(tokens, 2, 2)[0].state_dict()
    other = ShardSampler(tokens, rank=0, world_size=1, batch_size=4, seq_len=SEQ, seed=8)
    with pytest.raises(ValueError, match="seed=7 but this sampler has 8"):
        other.recut_from(state)
