"""Syncer shards as checkpointed Ray actors: one killed mid-run holds up only its own fragments, and restarts from
its own checkpoint without losing a merge. Skipped when Ray is not installed (the optional ``ray`` extra)."""

from __future__ import annotations

import time

import pytest
import torch

ray = pytest.importorskip("ray")

from _tiny import make_model  # noqa: E402
from test_decoupled_ray import local_ray  # noqa: E402, F401

from diloco.decoupled.messages import Report  # noqa: E402
from diloco.decoupled.ray_transport import RayChannel, start_syncer  # noqa: E402
from diloco.decoupled.shards import ShardedChannel, build_shards  # noqa: E402
from diloco.decoupled.syncer import Syncer  # noqa: E402
from diloco.wire.registry import get_codec  # noqa: E402

pytestmark = pytest.mark.timeout(120)


@pytest.mark.slow  # ~15 s on 2 cores: two actor processes start, one is killed and restarts
def test_a_killed_shard_holds_up_only_its_fragments_and_loses_no_merge(local_ray, tmp_path):  # noqa: F811
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
    assert ray.get(handles[1].pid.remote()) != pid and ray.get(handles[1].restored.remote()) == 1
    assert merged_meanwhile >= 1, "fragment 0 waited for the killed shard"  # ~300 measured here
    records = [ray.get(h.records.remote()) for h in handles]
    assert [r.version for r in records[0]] == list(range(1, versions[0] + 1))
    assert [r.version for r in records[1]] == [1, 2]
    channel.leave()
    for h in handles:
        ray.kill(h)
