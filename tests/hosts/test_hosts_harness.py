"""The emulated-hosts harness itself (:mod:`diloco.testing.hosts`): names, addresses, private /tmp, kill, partition,
shaped links, cleanup. Real namespaces and real TCP; skipped without root or iproute2/util-linux."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from diloco.testing.hosts import Hosts, HostsUnavailable, namespaces, unavailable

pytestmark = [pytest.mark.hosts, pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))]

NET = str(Path(__file__).with_name("_net.py"))
PY = sys.executable


def _wait_file(path: Path, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)
    time.sleep(0.05)
    return json.loads(path.read_text())


def test_two_hosts_reach_each_other_by_hostname_over_tcp_and_each_has_its_own_tmp_and_name():
    with Hosts(2) as (h0, h1):
        server = h0.run([PY, NET, "serve", "5001", "/tmp/got.json"])
        client = h1.run([PY, NET, "send", "host0", "5001", "1000"])
        assert client.wait(timeout=30) == 0, client.stderr_path.read_text()
        got = _wait_file(h0.path("/tmp/got.json"))
        assert got == {"peer_says": "host1", "bytes": 1000, "seconds": got["seconds"]}
        assert server.wait(timeout=10) == 0
        # each host: its own hostname, its own /tmp (host1 does not see host0's file)
        for h in (h0, h1):
            p = h.run(["sh", "-c", "hostname; ls /tmp"])
            assert p.wait(timeout=10) == 0
            names = p.stdout_path.read_text().split()
            assert names[0] == h.name
            assert ("got.json" in names[1:]) == (h is h0)
        assert not h1.path("/tmp/got.json").exists()
        # a working directory is the host's own: a relative path written there lands in the host's /tmp
        marker = f"cwd-{os.getpid()}"
        p = h1.run(["sh", "-c", f"pwd; touch {marker}"], cwd="/tmp")
        assert p.wait(timeout=10) == 0 and p.stdout_path.read_text().strip() == "/tmp"
        assert h1.path(f"/tmp/{marker}").exists() and not Path("/tmp", marker).exists()


def test_kill_ends_every_process_of_the_host_at_once_and_run_boots_it_again():
    with Hosts(2) as (h0, h1):
        a = h0.run(["sh", "-c", "sleep 300 & sleep 300 & wait"])
        b = h0.run(["setsid", "sh", "-c", "sleep 300"])  # a session of its own: no process group reaches it
        other = h1.run(["sleep", "300"])
        h0.run(["sh", "-c", "echo kept > /tmp/disk"]).wait(timeout=10)
        deadline = time.monotonic() + 10
        while len(h0.pids()) < 6 and time.monotonic() < deadline:  # pid 1, sh + 2 sleeps, setsid'd sh + sleep
            time.sleep(0.05)
        pids = h0.pids()
        assert len(pids) >= 6, pids
        h0.kill()
        assert a.returncode == -9 and b.returncode == -9
        assert not [p for p in pids if Path(f"/proc/{p}").exists()]
        assert other.poll() is None  # the other host is untouched
        again = h0.run(["cat", "/tmp/disk"])  # booted again: same disk
        assert again.wait(timeout=10) == 0 and again.stdout_path.read_text() == "kept\n"


def test_partition_stops_traffic_and_heal_restores_it():
    with Hosts(2) as (h0, h1):
        h0.run([PY, NET, "serve", "5002", "/tmp/got.json"])

        def probe() -> str:
            p = h1.run([PY, NET, "probe", "host0", "5002", "1.5"])
            assert p.wait(timeout=30) == 0, p.stderr_path.read_text()
            return p.stdout_path.read_text().strip()

        deadline = time.monotonic() + 20
        while (first := probe()) != "ok" and time.monotonic() < deadline:  # the server is starting
            time.sleep(0.1)
        assert first == "ok"
        h0.partition()
        assert probe() != "ok"
        h0.heal()
        assert probe() == "ok"


def test_a_shaped_link_carries_about_its_rate():
    """20 Mbit/s each way: 2.5 MB take ~1 s. Bound: within 2x of the rate (the HTB burst of ~10 ms, TCP slow start
    and a loaded machine move it by far less; an unshaped veth carries this in milliseconds, > 50x the rate)."""
    rate_mbit, nbytes = 20, 2_500_000
    with Hosts(2, rate_mbit=rate_mbit) as (h0, h1):
        h0.run([PY, NET, "serve", "5003", "/tmp/got.json"])
        client = h1.run([PY, NET, "send", "host0", "5003", str(nbytes)])
        assert client.wait(timeout=60) == 0, client.stderr_path.read_text()
        got = _wait_file(h0.path("/tmp/got.json"))
        measured = got["bytes"] * 8 / got["seconds"] / 1e6
        assert got["bytes"] == nbytes
        assert rate_mbit / 2 < measured < rate_mbit * 2, f"{measured:.1f} Mbit/s over a {rate_mbit} Mbit/s link"


def test_cleanup_leaves_no_namespace_bridge_or_folder_even_when_the_block_raises():
    harness = Hosts(2)
    with pytest.raises(RuntimeError, match="boom"):
        with harness as (h0, _):
            h0.run(["sleep", "300"])
            assert {f"{harness.tag}-br", f"{harness.tag}-0", f"{harness.tag}-1"} <= set(namespaces())
            raise RuntimeError("boom")
    assert not [ns for ns in namespaces() if ns.startswith(harness.tag)]
    assert not harness.root.exists()


def test_the_harness_refuses_clearly_where_it_cannot_run(monkeypatch):
    import diloco.testing.hosts as mod

    monkeypatch.setattr(mod.os, "geteuid", lambda: 1000)
    assert "root" in str(mod.unavailable())
    with pytest.raises(HostsUnavailable, match="root"):
        with Hosts(1):
            pass
