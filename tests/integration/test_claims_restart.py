"""Learner claims survive a syncer restart: a second job is refused a live learner's index right after the syncer
actor was restarted from its checkpoint (a real local Ray instance; the restart is Ray's, of the actor's process).
The same across a restarted ``diloco syncer`` monitor: tests/hosts/test_deploy_monitor_restart.py. Skipped when Ray is not installed."""

from __future__ import annotations

import time

import pytest
import torch

ray = pytest.importorskip("ray")

from _tiny import batches, make_model  # noqa: E402

from diloco.decoupled.learner import Learner  # noqa: E402
from diloco.decoupled.membership import LEASE_S, claims_state, restore_claims  # noqa: E402
from diloco.decoupled.syncer import Syncer  # noqa: E402

pytestmark = pytest.mark.timeout(120)
NAMESPACE = "diloco-test"


def _syncer() -> Syncer:
    return Syncer(make_model(seed=0), num_learners=2, quorum=1, num_fragments=2, overlap_steps=1, codec="fp32")


def test_the_claims_pair_keeps_each_session_and_starts_a_fresh_lease():
    saved = claims_state({1: ("b" * 32, 12.5), 0: ("a" * 32, 3.0)})
    assert saved == {"0": "a" * 32, "1": "b" * 32}  # strict JSON: string keys, no process-local times
    assert restore_claims(saved, now=100.0) == {0: ("a" * 32, 100.0), 1: ("b" * 32, 100.0)}
    assert restore_claims(None, now=100.0) == {}  # a checkpoint written before claims were saved


@pytest.mark.slow  # 12-17 s on 2 cores (load 6-9): the actor's restart (2-3 s), the lease B waits out (LEASE_S = 5 s)
def test_a_live_learners_index_is_refused_to_a_second_job_right_after_a_syncer_restart(local_ray, tmp_path):
    """Job A claims learner 0 (a session, as a site job does) and its claim is saved with the syncer's state. The
    actor's process is killed and Ray restarts it from its checkpoint; job B's claim on index 0 is the first call
    the restored syncer gets, before any heartbeat of A's: B is refused (it waited the lease out, A's heartbeats
    kept the claim), where a syncer that lost its claims would have granted it at once. A then goes on: its beats
    are held, it trains, merges (weight > 0) and finishes."""
    from diloco.decoupled.ray_channel import RayChannel
    from diloco.decoupled.ray_transport import start_syncer

    name = "syncer-claims-restart"
    handle = start_syncer(_syncer(), name=name, namespace=NAMESPACE, checkpoint_dir=str(tmp_path))
    a = RayChannel(handle, 0, session="a" * 32)
    assert ray.get(handle.hello.remote(0, a.session, {}, "job A")) is None  # granted, and saved
    first = ray.get(handle.pid.remote())

    ray.kill(handle, no_restart=False)  # Ray restarts the actor from its checkpoint
    end = time.monotonic() + 60
    while True:
        try:
            if ray.get(handle.pid.remote(), timeout=10) != first:
                break
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            pass
        assert time.monotonic() < end, "the syncer actor was not restarted"
    restarted = time.monotonic()
    b = handle.hello.remote(0, "b" * 32, {}, "job B")  # B's claim first, then A's heartbeats resume
    a.start_heartbeat()
    refused = ray.get(b)
    assert refused is not None and "learner 0 is taken" in refused, refused
    assert time.monotonic() - restarted >= LEASE_S - 0.5  # it waited the lease out (A beat meanwhile), then refused
    assert ray.get(handle.restored.remote()) == 0  # restored from its checkpoint (of no merge yet)

    # A goes on: its beats hold the index, it trains and contributes, and finishes
    assert ray.get(handle.heartbeat.remote(0, a.session)) is True
    model = make_model(seed=10)
    algo = Learner(model, channel=a, learner=0, sync_every=4, num_fragments=2, overlap_steps=1, codec="fp32")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for x, y in batches(0, 8):
        model(x, y)[1].backward()
        opt.step()
        opt.zero_grad()
        algo.after_optimizer_step(tokens=x.numel())
    algo.finish()
    records = ray.get(handle.records.remote())
    status = ray.get(handle.status.remote())
    ray.kill(handle)
    assert records and all(r.learners == (0,) and r.weights[0] > 0 for r in records)
    assert status["finished"] == [0]
