"""Syncer shards as checkpointed Ray actors: one killed mid-run holds up only its own fragments, and restarts from
its own checkpoint without losing a merge (``diloco chaos`` with a shard killed under learners that are processes:
test_decoupled_ray's kill/rejoin test). Skipped when Ray is not installed (the optional ``ray`` extra)."""

from __future__ import annotations

import time

import pytest
import torch

ray = pytest.importorskip("ray")

from _tiny import make_model  # noqa: E402

from diloco.decoupled.messages import Report  # noqa: E402
from diloco.decoupled.ray_channel import RayChannel  # noqa: E402
from diloco.decoupled.ray_transport import start_syncer  # noqa: E402
from diloco.decoupled.shards import ShardedChannel, build_shards  # noqa: E402
from diloco.decoupled.syncer import Syncer  # noqa: E402
from diloco.wire.registry import get_codec  # noqa: E402

pytestmark = pytest.mark.timeout(120)


@pytest.mark.slow  # ~15 s on 2 cores: two actor processes start, one is killed and restarts
def test_a_killed_shard_holds_up_only_its_fragments_and_loses_no_merge(local_ray, tmp_path):
    """One learner (K = M = 1) and P = 2 fragments on S = 2 shards. Shard 1's actor is killed with fragment 1's
    report in flight: while it restarts, fragment 0 (shard 0) goes on merging round after round; fragment 1's reply
    comes from the restarted shard, which took up its checkpoint (version 1) and merges version 2."""
    syncers = build_shards(
        make_model(seed=0),
        num_shards=2,
        num_fragments=2,
        build=lambda model, n, groups: Syncer(
            model, num_learners=1, num_fragments=n, fragments=groups, codec="fp32", grace_gamma=0.0
        ),
    )
    handles = [
        start_syncer(s, name=f"shard-kill-{i}", namespace="diloco-test", checkpoint_dir=str(tmp_path / f"shard-{i}"))
        for i, s in enumerate(syncers)
    ]
    channel = ShardedChannel([RayChannel(h, 0) for h in handles])
    welcome = channel.join()
    versions = list(welcome.versions)
    step = 0

    def report(p: int) -> None:
        nonlocal step
        step += 1
        payload = get_codec("fp32").encode(torch.full_like(welcome.fragments[p], 1e-3))  # base - theta: some work
        channel.send(Report(0, p, payload, steps=1, tokens=1.0, step_time=0.0, sent_after_step=step,
                            base_version=versions[p]))  # fmt: skip

    for p in (0, 1):
        report(p)
        versions[p] = channel.wait_reply(p).version
    assert versions == [1, 1]
    pid = ray.get(handles[1].pid.remote())
    ray.kill(handles[1], no_restart=False)  # Ray restarts it (max_restarts=-1) from its checkpoint
    report(1)
    merged_meanwhile = 0
    deadline = time.monotonic() + 90
    while (reply := channel.poll_reply(1)) is None:
        assert time.monotonic() < deadline, "the killed shard did not come back"
        report(0)
        reply0 = channel.wait_reply(0)  # shard 0 answers while shard 1 is down
        assert reply0.version == versions[0] + 1
        versions[0] = reply0.version
        merged_meanwhile += 1
    assert reply.fragment == 1 and reply.version == 2  # no merge lost: the restarted shard went on from version 1
    assert ray.get(handles[1].pid.remote()) != pid
    # ray.kill is asynchronous: the report sent just after it can reach the old actor, which then merges and saves
    # version 2 before it dies, and its successor restores both merges (seen once under a loaded suite)
    assert ray.get(handles[1].restored.remote()) in (1, 2)
    assert merged_meanwhile >= 1, "fragment 0 waited for the killed shard"  # ~300 measured here
    records = [ray.get(h.records.remote()) for h in handles]
    assert [r.version for r in records[0]] == list(range(1, versions[0] + 1))
    assert [r.version for r in records[1]] == [1, 2]
    channel.leave()
    for h in handles:
        ray.kill(h)


def _chaos_cfg(**kw):
    from diloco.train.config import TrainConfig, load_preset

    base = {**load_preset("tiny")["base"], "method": "decoupled", "threads": 1}
    return TrainConfig.from_dict({**base, **kw})


def test_diloco_train_with_two_shard_actors_gives_one_syncer_threads_bits(local_ray, tmp_path, token_cache):
    """``diloco train`` with ``decoupled_transport=ray`` and ``syncer_shards=2`` (two actors, each shard built in its
    actor: ``syncer_device=auto``, as a GPU syncer is) against one syncer on a thread: K = M, mean, no grace window:
    the same merges and the same final loss, to the bit."""
    import json

    from diloco.train.trainer import train_model

    kw = dict(num_fragments=2, overlap_steps=1, quorum=0, merge="mean", grace_gamma=0.0, steps=12, eval_every=12)
    one = train_model(_chaos_cfg(**kw), tmp_path / "one", cache_dir=token_cache, progress=False)
    two = train_model(
        _chaos_cfg(**kw, decoupled_transport="ray", syncer_shards=2, syncer_device="auto"), tmp_path / "two",
        cache_dir=token_cache,
        progress=False,
    )  # fmt: skip
    assert two.final_eval_loss == one.final_eval_loss
    rows = [[json.loads(x) for x in (tmp_path / r / "merges.jsonl").read_text().splitlines()] for r in ("one", "two")]
    assert sorted((m["fragment"], m["version"], m["weights"]) for m in rows[0]) == sorted(
        (m["fragment"], m["version"], m["weights"]) for m in rows[1]
    )
    assert {m["fragment"] for m in rows[1]} == {0, 1}


def test_the_service_builds_each_shard_in_its_actor_and_reads_them_as_one(local_ray, tmp_path, token_cache):
    """``diloco syncer``'s actors with ``syncer_shards=2``: each shard built in its own (detached, checkpointed)
    actor from the config, found again by name, its status summed; a learner of another ``syncer_shards`` is told
    the shards' names."""
    from functools import partial

    from diloco.decoupled.ray_shards import RayShards, connect_shards
    from diloco.decoupled.service import build_syncer
    from diloco.errors import ConfigError
    from diloco.train.inputs import prepare_inputs

    cfg = _chaos_cfg(num_fragments=2, syncer_shards=2)
    vocab = prepare_inputs(cfg, token_cache).data.vocab_size
    builds = [partial(build_syncer, cfg.to_dict(), vocab, s) for s in range(2)]
    shards = RayShards.start(builds, name="svc-shards", checkpoint_dir=tmp_path / "syncer", detached=True)
    try:
        again = RayShards.find("svc-shards", 2)
        status = again.status()
        assert status["merges"] == 0 and status["num_learners"] == cfg.replicas and len(status["pid"]) == 2
        sizes = [p.numel() for p in again.global_named_parameters().values()]
        assert sum(sizes) == sum(p.numel() for p in prepare_inputs(cfg, token_cache).model.parameters())
        assert sorted(p.name for p in (tmp_path / "syncer").iterdir()) == ["shard-0", "shard-1"]
        with pytest.raises(ConfigError, match="no syncer named 'svc-shards'.*syncer_shards=1"):
            connect_shards(learner=0, name="svc-shards", num_shards=1)
    finally:
        shards.kill()
