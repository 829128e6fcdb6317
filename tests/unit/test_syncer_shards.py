"""A sharded syncer (:mod:`diloco.decoupled.shards`): S syncers, each owning the fragments p with p % S == s.

With K = M a fragment's merge depends only on its own reports and state, so S = 2 shards give the bits of one
syncer, which (mean merge, fp32) are Streaming DiLoCo's; shard counts that cannot divide the fragments are
refused before anything runs."""

from __future__ import annotations

import pytest
import torch
from _tiny import make_model
from test_decoupled import _loop

from diloco.algorithm.streaming import StreamingDiLoCo
from diloco.comm.local import run_replicas
from diloco.decoupled.learner import Learner
from diloco.decoupled.local import LocalTransport, run_learners
from diloco.decoupled.messages import Welcome
from diloco.decoupled.shards import (
    ShardedChannel,
    build_shards,
    check_syncer_shards,
    combine_records,
    combine_welcomes,
    owned_fragments,
    shard_of,
    union,
)
from diloco.decoupled.syncer import Syncer
from diloco.errors import ConfigError

M, STEPS, H, P, TAU = 3, 16, 4, 4, 1


def run_sharded(num_shards, *, learner_kw=None, **syncer_kw):
    """M learner threads against ``num_shards`` syncer threads; returns (global parameters, records, models)."""
    kw = dict(num_learners=M, overlap_steps=TAU, **syncer_kw)
    syncers = build_shards(
        make_model(seed=0),
        num_shards=num_shards,
        num_fragments=P,
        build=lambda model, n, groups: Syncer(model, num_fragments=n, fragments=groups, **kw),
    )
    transports = [LocalTransport(s, timeout=60) for s in syncers]
    codec = syncer_kw.get("codec", "fp32")

    def learner(channel, m):
        model = make_model(seed=10 + m)
        channel = ShardedChannel([t.channel(m) for t in transports]) if num_shards > 1 else channel
        algo = Learner(model, channel=channel, learner=m, sync_every=H, num_fragments=P, overlap_steps=TAU, codec=codec)
        _loop(model, algo, STEPS, m)
        algo.close()
        return model

    try:
        models = run_learners(learner, transports[0])
    finally:
        for t in transports:
            t.stop()
    records = combine_records([s.records for s in syncers])
    return union([s.global_named_parameters() for s in syncers]), records, models


def assert_same(a, b):
    (ga, ra, ma), (gb, rb, mb) = a, b
    assert ga.keys() == gb.keys()
    for name in ga:
        assert torch.equal(ga[name], gb[name]), name
    key = sorted((r.fragment, r.version, r.learners, r.weights) for r in ra)
    assert key == sorted((r.fragment, r.version, r.learners, r.weights) for r in rb)
    for x, y in zip(ma, mb, strict=True):
        for (n, p), q in zip(x.named_parameters(), y.parameters(), strict=True):
            assert torch.equal(p, q), n


def test_fragment_p_belongs_to_shard_p_mod_s_and_the_welcome_is_put_together_in_fragment_order():
    assert [owned_fragments(s, 2, 6) for s in range(2)] == [[0, 2, 4], [1, 3, 5]]
    assert [shard_of(p, 3) for p in range(6)] == [0, 1, 2, 0, 1, 2]
    w = combine_welcomes(
        [
            Welcome(fragments=[torch.zeros(1), torch.full((1,), 2.0)], versions=[5, 7], incarnation=0, step=8),
            Welcome(fragments=[torch.ones(1), torch.full((1,), 3.0)], versions=[6, 8], incarnation=1, step=12),
        ]
    )
    assert [float(f) for f in w.fragments] == [0.0, 1.0, 2.0, 3.0]
    assert w.versions == [5, 6, 7, 8] and w.incarnation == 1 and w.step == 12


def test_two_shards_give_one_syncers_bits_and_streaming_diloco_s():
    """K = M, mean merge, fp32, no grace window: S = 2 equals S = 1 (and both equal Streaming DiLoCo) in the global
    parameters, every learner's parameters and every merge's learners and weights."""

    def replica(comm):
        model = make_model(seed=comm.rank)
        algo = StreamingDiLoCo(model, comm=comm, sync_every=H, num_fragments=P, overlap_steps=TAU, codec="fp32")
        _loop(model, algo, STEPS, comm.rank)
        algo.flush()
        return model, algo

    streaming = run_replicas(replica, M, timeout=60)
    one = run_sharded(1, merge="mean", grace_gamma=0.0)
    two = run_sharded(2, merge="mean", grace_gamma=0.0)
    assert_same(one, two)
    assert {r.fragment for r in two[1]} == set(range(P)) and all(len(r.learners) == M for r in two[1])
    glob = streaming[0][1].global_named_parameters()
    for name in glob:
        assert torch.equal(glob[name], two[0][name]), name
    for (ms, _), md in zip(streaming, two[2], strict=True):
        for (n, a), b in zip(ms.named_parameters(), md.parameters(), strict=True):
            assert torch.equal(a, b), n


def test_two_shards_give_one_syncers_bits_with_rda_a_lossy_codec_and_a_grace_window():
    """K = M merges when every learner is in, whatever the grace window: RDA and a lossy codec (each learner's
    base a copy of its own) are per fragment too."""
    assert_same(run_sharded(1, codec="fp8_e4m3"), run_sharded(2, codec="fp8_e4m3"))


@pytest.mark.parametrize(
    ("shards", "fragments", "match"),
    [
        (3, 4, r"syncer_shards=3 does not divide num_fragments=4.*one of \[1, 2, 4\]"),
        (4, 2, r"syncer_shards=4 with num_fragments=2.*at most 2.*divisor of 2"),
        (0, 2, r"syncer_shards=0: .*at least 1"),
    ],
)
def test_shard_counts_that_cannot_divide_the_fragments_are_refused_with_the_fix(shards, fragments, match):
    with pytest.raises(ConfigError, match=match):
        check_syncer_shards(shards, fragments)
    from diloco.train.config import TrainConfig, load_preset

    base = {**load_preset("tiny")["base"], "method": "decoupled"}
    with pytest.raises(ConfigError, match=match):  # before the run starts
        TrainConfig.from_dict({**base, "num_fragments": fragments, "syncer_shards": shards})
