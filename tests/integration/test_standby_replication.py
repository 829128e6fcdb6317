"""A standby's copy of the syncer (:mod:`diloco.decoupled.rpc.replicate`), on loopback: the syncer actor's own class
(:class:`~diloco.decoupled.ray_transport.SyncerActor`, its checkpoint code unchanged) runs on an event loop of this
process instead of in Ray (Ray would add ~10 s of startup and nothing to what is tested: the files the actor writes
and the gateway's answers); the gateway, the standby's follower and the learners' channels are the real gRPC parts."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("grpc")
pytest.importorskip("ray")

from _syncers import small_syncer, tensors

from diloco.decoupled.checkpoint import RECORDS, load_latest_state, saved_states
from diloco.decoupled.messages import Report
from diloco.decoupled.ray_transport import SyncerActor
from diloco.decoupled.rpc.client import Link, connect_site
from diloco.decoupled.rpc.gateway import Gateway
from diloco.decoupled.rpc.replicate import Follower, Replicator
from diloco.wire.registry import get_codec

pytestmark = pytest.mark.timeout(120)
CODEC, M = "fp4_e3m0", 2


class LocalActor:
    """The actor class behind ``@ray.remote``, its async methods run on an event loop thread of this process."""

    def __init__(self, checkpoint_dir: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.actor = SyncerActor(lambda: small_syncer("cpu", codec=CODEC, M=M, K=M), str(checkpoint_dir))

    def backend(self, shard, method, args, timeout):
        return asyncio.run_coroutine_threadsafe(getattr(self.actor, method)(*args), self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def _serve(actor: LocalActor, *, epoch: int, replicator=None) -> Gateway:
    gateway = Gateway(
        (actor.backend, 1), name="s", token="t", host="127.0.0.1", port=0, epoch=epoch, replicator=replicator
    )
    gateway.start()
    return gateway


def _round(channels, versions: list[list[int]], rnd: int) -> list:
    """Each learner reports each fragment (seeded payloads); the replies, once both merges are done."""
    codec, sizes = get_codec(CODEC), [64 * 16 + 40 * 16 + 64, 64 * 32]  # (small_syncer's fragments)
    for p, numel in enumerate(sizes):
        for m, ch in enumerate(channels):
            gen = torch.Generator().manual_seed(100 * rnd + 10 * p + m)
            payload = codec.encode(torch.randn(numel, generator=gen).mul_(1e-2))
            ch.send(Report(m, p, payload, 4, 256.0, 0.0, sent_after_step=4 * (rnd + 1), base_version=versions[m][p]))
    replies = []
    for p in range(len(sizes)):
        for m, ch in enumerate(channels):
            reply = ch.wait_reply(p)
            versions[m][p] = reply.version
            replies.append(reply)
    return replies


def _same_files(a: Path, b: Path) -> int:
    """The standby's newest state equals the active's (every tensor bit for bit, every other value), and its merge
    records are the active's rows; the number of merges."""
    sa, sb = load_latest_state(a), load_latest_state(b)
    assert saved_states(a)[-1].name == saved_states(b)[-1].name
    ta, tb = list(tensors(sa)), list(tensors(sb))
    assert len(ta) == len(tb) and all(torch.equal(x, y) for x, y in zip(ta, tb, strict=True))
    assert repr(_without_tensors(sa)) == repr(_without_tensors(sb))
    assert (a / RECORDS).read_bytes() == (b / RECORDS).read_bytes()
    return len((a / RECORDS).read_text().splitlines())


def _without_tensors(tree):
    if isinstance(tree, torch.Tensor):
        return "T"
    if isinstance(tree, dict):
        return {k: _without_tensors(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [_without_tensors(v) for v in tree]
    return tree


@pytest.fixture
def pair(tmp_path):
    """The active (actor, replicating gateway at epoch 0) and a standby following it into tmp_path/standby."""
    actor = LocalActor(tmp_path / "active")
    replicator = Replicator(tmp_path / "active", info={"epoch": 0, "name": "s"})
    gateway = _serve(actor, epoch=0, replicator=replicator)
    follower = Follower(Link(f"s@127.0.0.1:{gateway.port}", token="t", retry_for=0.0), tmp_path / "standby")
    stop = threading.Event()
    why: list[str] = []
    thread = threading.Thread(target=lambda: why.append(follower.follow(takeover_s=3.0, stop=stop)), daemon=True)
    thread.start()
    yield actor, gateway, replicator, follower, why, thread
    stop.set()
    gateway.stop()
    actor.close()


def test_every_answer_waits_for_the_standby_so_its_copy_equals_the_active_after_each_merge(pair, tmp_path):
    """Right after each round's replies reach the learners (no wait of the test's own), the standby's checkpoint is
    the active's: the same file, every tensor bit-identical (Theta, the outer momentum, the learners' bases, the
    replies held), the same merge records; the merge count grows by 2 a round. Each answer was held for the copy
    (answers_gated counts them), and each copy is the whole state file."""
    actor, gateway, replicator, follower, _, _ = pair
    channels = [connect_site(learner=m, syncer=f"s@127.0.0.1:{gateway.port}", token="t") for m in range(M)]
    versions = [list(ch.join().versions) for ch in channels]
    counts = []
    for rnd in range(3):
        _round(channels, versions, rnd)
        counts.append(_same_files(tmp_path / "active", tmp_path / "standby"))
    assert counts == [2, 4, 6]
    assert len(actor.actor.syncer.records) == 6
    stats = replicator.stats()
    assert stats["answers_gated"] >= 2 + 3 * 2 * M and stats["standby_let_go"] == 0
    # a copy per round at least (the round's replies wait for one taken after its merges; the two merges of a round
    # may share one), each the whole state file: after the first merge its tensors keep their shapes (Theta, the
    # momentum, each learner's bases and replies), so each such copy is the newest file's size less a few scalars
    assert stats["copies"] >= 1 + 3
    assert stats["bytes_sent"] >= 3 * (saved_states(tmp_path / "active")[-1].stat().st_size - 1024)
    assert follower.info == {"epoch": 0, "name": "s"}
    for ch in channels:
        ch.leave()


def test_the_standby_takes_over_from_its_copy_and_the_learners_go_on_there(pair, tmp_path):
    """After two rounds the active is lost (its gateway and actor stop): the standby's follower returns (silence
    past takeover_s), an actor started from its copy at epoch 1 holds the active's Theta bit for bit, the learners
    (given both addresses) go on there, and the merge versions go on without a gap (3, then 4)."""
    actor, gateway, _, follower, why, thread = pair
    standby_port = _free_port()
    spec = f"s@127.0.0.1:{gateway.port},127.0.0.1:{standby_port}"
    channels = [connect_site(learner=m, syncer=spec, token="t") for m in range(M)]
    versions = [list(ch.join().versions) for ch in channels]
    for rnd in range(2):
        _round(channels, versions, rnd)
    theta = {k: v.clone() for k, v in actor.actor.syncer.global_named_parameters().items()}
    gateway.stop()
    actor.close()
    thread.join(30)
    assert why and why[0].startswith("the active syncer did not answer"), why
    assert follower.epoch == 0

    taken = LocalActor(tmp_path / "standby")
    assert taken.actor.restored_merges == 4
    restored = taken.actor.syncer.global_named_parameters()
    assert all(torch.equal(theta[k], restored[k]) for k in theta)
    new = Gateway((taken.backend, 1), name="s", token="t", host="127.0.0.1", port=standby_port, epoch=1)
    new.start()
    try:
        replies = _round(channels, versions, 2)
        assert sorted({r.version for r in replies}) == [3]
        assert [r.version for r in taken.actor.syncer.records] == [1, 1, 2, 2, 3, 3]
        for ch in channels:  # (one shard: the channel itself)
            assert ch.link.epoch == 1 and ch.link.switches >= 1
            ch.leave()
    finally:
        new.stop()
        taken.close()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_granted_claim_is_in_the_standbys_copy_before_the_job_hears_of_it(pair, tmp_path, monkeypatch):
    """A learner job's claim (hello) is answered only once the standby holds it: right after ``connect_site``
    returns (no join yet, the first answer the job gets), the standby's newest state names that job's session for
    its index, though each copy takes 0.5 s to land (``apply_copy`` slowed: a slow link to the standby). The active
    is then lost before anything else: the actor a takeover starts from the standby's copy holds the claim (a fresh
    lease), so the index stays the job's there (a second job is refused it as after any restart:
    test_claims_restart.py; across a real takeover: tests/hosts/test_deploy_standby_claims.py).
    Before the hello was gated, the standby's copy had no claim ({}) when the job was told it held the index, and
    a second job reaching the standby before the first job's heartbeat was granted that index."""
    from diloco.decoupled.rpc import replicate

    slow = replicate.apply_copy

    def apply_slowly(*args, **kwargs):
        time.sleep(0.5)
        slow(*args, **kwargs)

    actor, gateway, *_ = pair
    monkeypatch.setattr(replicate, "apply_copy", apply_slowly)
    standby_port = _free_port()
    spec = f"s@127.0.0.1:{gateway.port},127.0.0.1:{standby_port}"
    channel = connect_site(learner=0, syncer=spec, token="t")  # its claim; its heartbeat from now on
    copied = load_latest_state(tmp_path / "standby")  # (None: no copy at all yet)
    assert copied is not None and copied["claims"] == {"0": channel.session}, copied and copied["claims"]
    gateway.stop()  # the active lost; the actor a takeover starts from the copy (not waiting out takeover_s)
    actor.close()
    taken = LocalActor(tmp_path / "standby")
    assert {m: s for m, (s, _) in taken.actor._claims.items()} == {0: channel.session}
    channel._stop.set()  # (its heartbeat; no leave: nothing serves the taken-over actor here)
    channel.link.close()
    taken.close()
