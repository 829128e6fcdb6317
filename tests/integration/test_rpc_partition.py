"""A site's channel to the syncer's endpoint (:mod:`diloco.decoupled.rpc`) through a partition, on loopback: a
relay between them holds every byte (:class:`~diloco.decoupled.rpc.relay.Relay`). The gateway's backend is a stand-in
that answers at once (the partition is between the learner and the gateway: what is behind the gateway, the Ray actor
in ``diloco syncer``, plays no part; the site-job tests run it)."""

from __future__ import annotations

import time

import pytest
import torch

pytest.importorskip("grpc")

from diloco.decoupled.messages import Reply, Report, Welcome
from diloco.decoupled.rpc.client import KEEPALIVE_S, PING_TIMEOUT_S, Unreachable, connect_site
from diloco.decoupled.rpc.gateway import Gateway
from diloco.decoupled.rpc.relay import Relay

PAYLOAD = torch.arange(64, dtype=torch.uint8)


def _backend(shard, method, args, timeout):
    if method == "join":
        return Welcome([torch.zeros(64)], [0], incarnation=0)
    if method == "wait_reply":
        learner, fragment, _at, base_version = args
        return Reply(learner, fragment, PAYLOAD.flip(0), version=base_version + 1)
    return {"hello": None, "beat": None}.get(method)  # beat: None, the claim still held


@pytest.fixture
def relay():
    gateway = Gateway((_backend, 1), name="s", token="t", host="127.0.0.1", port=0)
    relay = Relay(gateway.start())
    yield relay
    relay.release()
    relay.close()
    gateway.stop()


def _report(version: int) -> Report:
    return Report(0, 0, PAYLOAD, steps=4, tokens=512.0, step_time=0.1, sent_after_step=4, base_version=version)


def test_a_report_sent_during_a_partition_returns_at_once_and_is_answered_once_it_heals(relay):
    """While the link is held the learner's send returns at once and its polls find no reply (it trains on, as
    ride_out_steps lets it); released after 2 s, the reply comes (the held bytes go through: no call failed)."""
    channel = connect_site(learner=0, syncer=f"s@127.0.0.1:{relay.port}", token="t")
    assert channel.join().versions == [0]
    relay.hold()
    start = time.monotonic()
    channel.send(_report(0))
    assert time.monotonic() - start < 0.5  # (a thread of the channel's sends it)
    while time.monotonic() - start < 2.0:
        assert channel.poll_reply(0) is None
        time.sleep(0.1)
    relay.release()
    reply = channel.wait_reply(0)
    assert reply.version == 1 and torch.equal(reply.payload, PAYLOAD.flip(0))
    channel.leave()


def test_a_partition_longer_than_retry_for_is_told_to_the_learner_naming_the_syncer(relay):
    """Held for good: the learner's wait for the reply ends with Unreachable, naming the syncer and what restarts
    the site, within retry_for plus gRPC's noticing the dead link (keepalive: a ping every 10 s unanswered for 5 s;
    on a WAN that drops packets also 5 s of unacknowledged bytes), not the call's deadline (60 s)."""
    channel = connect_site(learner=0, syncer=f"s@127.0.0.1:{relay.port}", token="t", retry_for=2.0)
    channel.join()
    relay.hold()
    start = time.monotonic()
    channel.send(_report(0))
    with pytest.raises(Unreachable, match=r"the syncer s@127\.0\.0\.1:\d+ did not answer .*--max-restarts"):
        channel.wait_reply(0)
    # the report's call fails once a keepalive ping goes unanswered (at most KEEPALIVE_S + PING_TIMEOUT_S after it
    # was sent), past retry_for: told then; 8 s more for a loaded machine
    assert time.monotonic() - start < KEEPALIVE_S + PING_TIMEOUT_S + 2.0 + 8.0
