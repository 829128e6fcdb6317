"""What ``diloco syncer --standby-of`` refuses, before it writes anything, and the epoch a service runs at."""

from __future__ import annotations

import json

import pytest

from diloco.cli import main
from diloco.decoupled.standby import run_standby, service_epoch
from diloco.errors import ConfigError


def test_a_standby_folder_is_refused_as_an_active_until_its_takeover_and_a_resumed_epoch_is_kept(tmp_path):
    standby = {"name": "s", "role": "standby", "epoch": 2, "active": "s@a:7171"}
    with pytest.raises(ConfigError, match=r"standby's copy of the syncer s \(epoch 2\).*--standby-of s@a:7171"):
        service_epoch(tmp_path, standby, 0)
    assert service_epoch(tmp_path, standby, 3) == 3  # its takeover
    assert service_epoch(tmp_path, {"name": "s", "epoch": 3}, 0) == 3  # the new active, resumed
    assert service_epoch(tmp_path, None, 0) == 0


def test_a_standby_without_a_token_of_two_addresses_or_in_another_folder_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv("DILOCO_SYNCER_TOKEN", raising=False)
    with pytest.raises(ConfigError, match="needs the active syncer's token"):
        run_standby("s@127.0.0.1:1", out=tmp_path / "new", cache_dir=tmp_path)
    with pytest.raises(ConfigError, match="the active syncer's one address"):
        run_standby("s@127.0.0.1:1,127.0.0.1:2", out=tmp_path / "new", cache_dir=tmp_path, token="t")
    with pytest.raises(ConfigError, match="--takeover-after 0"):
        run_standby("s@127.0.0.1:1", out=tmp_path / "new", cache_dir=tmp_path, token="t", takeover_s=0)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="holds files but no standby of the syncer s"):
        run_standby("s@127.0.0.1:1", out=tmp_path / "mine", cache_dir=tmp_path, token="t")
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "syncer.json").write_text(json.dumps({"name": "s", "epoch": 1}))
    with pytest.raises(ConfigError, match=r"took over already \(epoch 1\).*no --standby-of"):
        run_standby("s@127.0.0.1:1", out=taken, cache_dir=tmp_path, token="t")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "mine" and not (tmp_path / "new").exists()


def test_the_cli_refuses_settings_a_standby_takes_from_its_active(tmp_path, capsys):
    out = str(tmp_path / "o")
    assert main(["syncer", "--standby-of", "s@127.0.0.1:1", "--set", "replicas=2", "--out", out]) == 2
    assert "takes the run's config from the active syncer: drop --set" in capsys.readouterr().err
    assert main(["syncer", "--takeover-after", "3", "--out", out]) == 2
    assert "--takeover-after is a standby's setting" in capsys.readouterr().err


def test_an_active_that_gives_no_copy_or_never_answers_is_refused_and_no_folder_is_left(tmp_path, monkeypatch):
    """A real gateway on loopback: one without a replicator (a syncer on a Ray cluster) refuses saying why; another
    run's name is refused; nothing answering is refused once FIRST_COPY_S is out. The folder the standby made for
    itself is gone again each time."""
    pytest.importorskip("grpc")
    import socket

    from diloco.decoupled import standby
    from diloco.decoupled.rpc.gateway import Gateway

    gateway = Gateway((lambda *a: None, 1), name="s", token="t", host="127.0.0.1", port=0)
    gateway.start()
    try:
        with pytest.raises(ConfigError, match="keeps no standby: its actor runs on a Ray cluster"):
            run_standby(f"s@127.0.0.1:{gateway.port}", out=tmp_path / "a", cache_dir=tmp_path, token="t")
        with pytest.raises(ConfigError, match="serves the syncer 's', not 'other'"):
            run_standby(f"other@127.0.0.1:{gateway.port}", out=tmp_path / "a", cache_dir=tmp_path, token="t")
    finally:
        gateway.stop()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        nothing = sock.getsockname()[1]
    monkeypatch.setattr(standby, "FIRST_COPY_S", 0.5)
    with pytest.raises(ConfigError, match="the active syncer does not answer"):
        run_standby(f"s@127.0.0.1:{nothing}", out=tmp_path / "a", cache_dir=tmp_path, token="t")
    assert not (tmp_path / "a").exists()


def test_a_service_told_of_a_newer_epoch_stops_its_syncer_and_writes_its_summary_but_no_result(tmp_path):
    """The monitor's loop returns at once when its gateway was fenced (before it asks the syncer anything), and the
    fenced end kills the syncer's actors and writes summary.json with ``fenced_by``, no merges.jsonl or checkpoint
    (the standby that took over writes those). The actors are a stand-in recording the calls it gets."""
    pytest.importorskip("ray")
    from diloco.decoupled.service import watch_run
    from diloco.decoupled.standby import end_fenced

    class Shards:
        calls: list[str] = []

        def status(self, timeout=None):
            self.calls.append("status")

        def kill(self):
            self.calls.append("kill")

    shards, said = Shards(), []
    summary = watch_run(shards, num_learners=2, poll_s=0.01, echo=said.append, fenced=lambda: 2)
    assert summary["fenced_by"] == 2 and shards.calls == []
    got = end_fenced(shards, summary | {"name": "s"}, tmp_path, 1, None, said.append)
    assert shards.calls == ["kill"] and got["epoch"] == 1 and got["replication"] is None
    assert json.loads((tmp_path / "summary.json").read_text())["fenced_by"] == 2
    assert not (tmp_path / "merges.jsonl").exists() and "merges no more and stops" in said[-1]
