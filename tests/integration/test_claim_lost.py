"""A site job whose claim on its learner index went to another job while it lived stops, saying so, and its reports
are not counted (:mod:`diloco.decoupled.claim_lost`); a claim that lapsed while nobody took the index is held again.

The service is the real one on loopback: the gRPC gateway, the sites' channels (:func:`connect_site`), and behind
the gateway the syncer actor's own class (:class:`SyncerActor`: its claims, lease and merges) run in this process,
its calls on an asyncio loop as Ray runs an async actor's (no Ray started: its start would cost this test more
than the test itself). The partition is a relay that holds every byte of job A's link
(:class:`~diloco.decoupled.rpc.relay.Relay`). The claim lease and the beats are shortened (1 s and 0.2 s instead
of 5 s and 1 s) so that a lapse takes 1.4 s; the code paths are the same."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
import time

import pytest
import torch

pytest.importorskip("grpc")
pytest.importorskip("ray")

from _tiny import batches, make_model

from diloco.decoupled import membership
from diloco.decoupled.claim_lost import ClaimLost
from diloco.decoupled.learner import Learner
from diloco.decoupled.ray_transport import SyncerActor
from diloco.decoupled.rpc import client
from diloco.decoupled.rpc.client import connect_site
from diloco.decoupled.rpc.gateway import Gateway
from diloco.decoupled.rpc.relay import Relay
from diloco.decoupled.syncer import Syncer
from diloco.decoupled.trainer import LearnerLog
from diloco.errors import ConfigError

pytestmark = pytest.mark.timeout(60)
LEASE, BEAT = 1.0, 0.2


@pytest.fixture
def service(tmp_path, monkeypatch):
    """(the actor, the gateway's port, a relay to it) for a syncer of one learner, K = 1."""
    monkeypatch.setattr(membership, "LEASE_S", LEASE)
    monkeypatch.setattr(membership, "HEARTBEAT_S", BEAT)
    monkeypatch.setattr(client, "HEARTBEAT_S", BEAT)
    syncer = Syncer(make_model(seed=0), num_learners=1, quorum=1, num_fragments=1, overlap_steps=1, codec="fp32")
    actor = SyncerActor(syncer, str(tmp_path / "syncer"))
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    def call(shard: int, method: str, args: tuple, timeout: float):  # as gateway.ray_backend maps Ray's answers
        try:
            return asyncio.run_coroutine_threadsafe(getattr(actor, method)(*args), loop).result(timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"{method} not answered in {timeout:g} s") from None
        except ConfigError as exc:
            raise RuntimeError(str(exc)) from None

    gateway = Gateway((call, 1), name="s", token="t", host="127.0.0.1", port=0)
    port = gateway.start()
    relay = Relay(port)
    yield actor, port, relay
    relay.release()
    relay.close()
    gateway.stop()
    loop.call_soon_threadsafe(loop.stop)


def _learner(channel, seed: int):
    model = make_model(seed=seed)
    algo = Learner(model, channel=channel, learner=0, sync_every=4, num_fragments=1, overlap_steps=1, codec="fp32")
    return algo, model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _step(algo, model, opt, x, y) -> None:
    model(x, y)[1].backward()
    opt.step()
    opt.zero_grad()
    algo.after_optimizer_step(tokens=x.numel())


def _events(actor) -> list[dict]:
    with open(f"{actor.checkpoint_dir}/events.jsonl") as fh:
        return [json.loads(line) for line in fh]


def test_a_job_whose_index_another_job_took_stops_naming_it_and_its_reports_are_not_counted(service, tmp_path):
    """Job A (learner 0, through the relay) sends its report of step 4 into a partition. Its claim lapses, and job B
    (the same command run again elsewhere, reaching the syncer directly) claims learner 0 and joins. The partition
    heals: A's report reaches the syncer and is refused (not counted, a ``refused``/``claim lost`` row), and A's
    next step raises ClaimLost naming learner 0, the job holding it and what to do; its learner log ends with a
    ``claim lost`` row. B trains on as learner 0: the syncer counted one report, B's, in one merge. (Before: A's
    report was counted as learner 0's and merged, its reply taken, and A trained on beside B.)"""
    actor, port, relay = service
    a = connect_site(learner=0, syncer=f"s@127.0.0.1:{relay.port}", token="t")
    algo_a, model_a, opt_a = _learner(a, seed=1)
    log = LearnerLog(tmp_path, 0, append=False)
    log.start(algo_a, 0)
    data = batches(0, 8)
    relay.hold()  # the partition: nothing of A's reaches the syncer, A trains on
    cut = time.monotonic()
    for x, y in data[:4]:
        _step(algo_a, model_a, opt_a, x, y)  # step 4 sends its report (it waits in the relay)

    b = connect_site(learner=0, syncer=f"s@127.0.0.1:{port}", token="t")  # granted once A's claim lapsed
    assert time.monotonic() - cut >= LEASE
    algo_b, model_b, opt_b = _learner(b, seed=2)  # joins as learner 0
    relay.release()  # A's report and beats arrive

    with pytest.raises(ClaimLost) as lost:
        for x, y in data[4:]:
            _step(algo_a, model_a, opt_a, x, y)  # step 5 waits for its reply
    message = str(lost.value)
    assert "learner 0's index is no longer this job's" in message, message
    assert "another job (" in message and "pid" in message  # the job holding it now, by its hello's host
    assert "stop the other job" in message and "--resume auto" in message
    log.close()
    rows = [json.loads(line) for line in (tmp_path / "learner-0.jsonl").read_text().splitlines()]
    assert rows[-1]["event"] == "claim lost" and rows[-1]["why"] == message
    with pytest.raises(ClaimLost):  # nothing more from A: refused before it leaves this process
        a.send(a._sent[0])
    with pytest.raises(RuntimeError, match="learner 0's index is no longer this job's"):  # the syncer's own check
        a.link.call("Hold", a._head(step=8, session=a.session))  # (A's channel would not send it: ClaimLost first)
    a.leave(finished=False)  # A's leave gives up nothing of B's

    for x, y in batches(1, 5):
        _step(algo_b, model_b, opt_b, x, y)  # B reports at step 4 and takes its reply at step 5
    events = _events(actor)
    refused = [e for e in events if e["event"] == "refused"]
    assert refused and all(e["learner"] == 0 and e["why"] == "claim lost" for e in refused)  # A's report (resent)
    assert sum(e["event"] == "report" for e in events) == 1  # B's alone: A's was not counted
    assert [r.learners for r in actor.syncer.records] == [(0,)]
    assert actor._claims[0][0] == b.session
    b.leave()


def test_a_claim_that_lapsed_while_nobody_took_the_index_is_held_again_and_the_job_goes_on(service):
    """Job A is cut off past the claim lease (and the two beats the syncer waits on top) with no other job around:
    its next beat holds the index again (the lapse only lets another job in), and it goes on without a gap: it
    merges (weight > 0), no refusal."""
    actor, _, relay = service
    a = connect_site(learner=0, syncer=f"s@127.0.0.1:{relay.port}", token="t")
    algo, model, opt = _learner(a, seed=1)
    relay.hold()
    time.sleep(LEASE + 3 * BEAT)
    relay.release()
    for x, y in batches(0, 9):
        _step(algo, model, opt, x, y)
    algo.finish()
    assert a.claim_lost is None
    assert not [e for e in _events(actor) if e["event"] == "refused"]
    assert actor.syncer.records and all(r.learners == (0,) and r.weights[0] > 0 for r in actor.syncer.records)
