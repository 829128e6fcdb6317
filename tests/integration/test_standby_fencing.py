"""Epochs between a learner and the syncers it names (``syncer=NAME@HOST:PORT,HOST2:PORT2``), on loopback: real
gateways and links; each gateway's backend is a stand-in that answers at once and records the calls it got (what is
behind a gateway plays no part in the fencing rule; test_standby_replication runs the syncer actor's class)."""

from __future__ import annotations

import socket

import pytest
import torch

pytest.importorskip("grpc")

from diloco.decoupled.messages import Reply, Report, Welcome
from diloco.decoupled.rpc.client import Link, Unreachable, accept_epoch, connect_site, parse_addresses
from diloco.decoupled.rpc.gateway import Gateway
from diloco.decoupled.rpc.probe import check_syncer
from diloco.errors import ConfigError

PAYLOAD = torch.arange(64, dtype=torch.uint8)


class Backend:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, shard, method, args, timeout):
        self.calls.append(method)
        if method == "join":
            return Welcome([torch.zeros(64)], [0], incarnation=0)
        if method == "wait_reply":
            learner, fragment, _at, base_version = args
            return Reply(learner, fragment, PAYLOAD.flip(0), version=base_version + 1)
        return {"hello": None, "beat": None}.get(method)


def _gateway(epoch: int, port: int = 0) -> tuple[Gateway, list[str]]:
    backend = Backend()
    gateway = Gateway((backend, 1), name="s", token="t", host="127.0.0.1", port=port, epoch=epoch)
    gateway.start()
    return gateway, backend.calls


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _report(version: int) -> Report:
    return Report(0, 0, PAYLOAD, steps=4, tokens=512.0, step_time=0.1, sent_after_step=4, base_version=version)


def test_the_rule_an_older_epoch_is_ignored_an_equal_or_newer_one_taken():
    assert accept_epoch(-1, 0) and accept_epoch(1, 1) and accept_epoch(1, 2)
    assert not accept_epoch(2, 1) and not accept_epoch(1, 0)


def test_several_addresses_parse_and_a_malformed_list_is_refused_naming_the_form():
    assert parse_addresses("s@10.0.0.1:7171,h2:7172") == ("s", [("10.0.0.1", 7171), ("h2", 7172)])
    assert parse_addresses("s@[::1]:7171") == ("s", [("::1", 7171)])
    for bad in ("s@10.0.0.1:7171,", "s@h:x", "@h:1", "s@"):
        with pytest.raises(ConfigError, match="NAME@ADDRESS"):
            parse_addresses(bad)


def test_a_learner_rides_over_to_the_standby_and_a_former_active_that_comes_back_is_fenced():
    """Learner 0 talks to the active (epoch 0) at its first address; the active is lost, so its report goes on at
    the second address, a standby that took over (epoch 1), and its reply comes from there. The standby then goes
    down too and the former active comes back (epoch 0, same port): the learner's next report reaches it carrying
    epoch 1, is refused (UNAVAILABLE, the learner told Unreachable once retry_for is out) and never reaches its
    syncer; the former active stays fenced for a learner that never saw epoch 1 as well."""
    old, old_calls = _gateway(0)
    old_port, new_port = old.port, _free_port()
    channel = connect_site(learner=0, syncer=f"s@127.0.0.1:{old_port},127.0.0.1:{new_port}", token="t", retry_for=6.0)
    assert channel.join().versions == [0] and channel.link.epoch == 0
    old.stop()
    new, new_calls = _gateway(1, port=new_port)
    channel.send(_report(0))
    assert channel.wait_reply(0).version == 1
    assert channel.link.epoch == 1 and channel.link.switches >= 1 and "report_from" in new_calls

    new.stop()
    back, back_calls = _gateway(0, port=old_port)
    try:
        channel.send(_report(1))
        with pytest.raises(Unreachable):  # (its last try may be the standby's closed port: the message says that)
            channel.wait_reply(0)
        assert back.fenced_by == 1 and "report_from" not in back_calls and "wait_reply" not in back_calls
        fresh = Link(f"s@127.0.0.1:{old_port}", token="t", retry_for=0.0)  # has seen no epoch
        with pytest.raises(Unreachable, match="epoch 0 was replaced"):
            fresh.call("Status", {"shard": 0})
        fresh.close()
        assert back_calls == []
    finally:
        back.stop()


def test_a_site_probe_takes_the_first_address_that_answers_and_names_each_that_does_not():
    gateway, _ = _gateway(1)
    nothing = _free_port()
    try:
        header = check_syncer(f"s@127.0.0.1:{nothing},127.0.0.1:{gateway.port}", token="t")
        assert header["syncer"] == "s" and header["epoch"] == 1
    finally:
        gateway.stop()
    with pytest.raises(ConfigError, match=r"no address answers.*refused the connection.*refused the connection"):
        check_syncer(f"s@127.0.0.1:{nothing},127.0.0.1:{gateway.port}", token="t", timeout_s=2.0)
