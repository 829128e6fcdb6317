"""``diloco syncer`` serves loopback unless asked otherwise (:mod:`diloco.decoupled.rpc.bind`): the address the sites
are told follows what is bound, and a loopback service told to advertise another address, or a loopback standby of an
active on another host, is refused before anything is written."""

from __future__ import annotations

import pytest

from diloco.cli import main
from diloco.decoupled.rpc.bind import DEFAULT_HOST, check_endpoint, is_loopback, sites_address
from diloco.decoupled.standby import run_standby
from diloco.errors import ConfigError


def _no_ray() -> str:
    raise AssertionError("Ray's address asked although one address is bound")


def test_loopback_is_the_default_and_the_sites_are_told_what_is_bound():
    assert DEFAULT_HOST == "127.0.0.1" and is_loopback(DEFAULT_HOST)
    assert is_loopback("localhost") and is_loopback("::1") and is_loopback("[::1]") and is_loopback("127.0.0.2")
    assert not is_loopback("10.0.0.5") and not is_loopback("0.0.0.0") and not is_loopback("site-a.example")
    assert sites_address("127.0.0.1", None, _no_ray) == "127.0.0.1"
    assert sites_address("10.0.0.5", None, _no_ray) == "10.0.0.5"
    assert sites_address("0.0.0.0", None, lambda: "10.0.0.7") == "10.0.0.7"  # every address: Ray's view of this host
    assert sites_address("0.0.0.0", "203.0.113.9", _no_ray) == "203.0.113.9"
    check_endpoint("0.0.0.0", "10.0.0.5")  # every address bound: any address may be advertised
    check_endpoint("127.0.0.1", "127.0.0.1")
    check_endpoint("127.0.0.1", None)
    with pytest.raises(ConfigError, match=r"--advertise 10.0.0.5: .* serves only 127.0.0.1 .*--host 0.0.0.0"):
        check_endpoint("127.0.0.1", "10.0.0.5")


def test_a_loopback_service_advertising_another_address_is_refused_before_anything_is_written(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["syncer", "--preset", "tiny", "--set", "replicas=2", "--out", str(out), "--advertise", "10.0.0.5"]
    assert main([*argv, "--cache-dir", str(tmp_path / "cache"), "--no-status"]) == 2
    err = capsys.readouterr().err
    assert "--advertise 10.0.0.5" in err and "--host 0.0.0.0" in err
    assert not out.exists() and not (tmp_path / "cache").exists()


def test_a_loopback_standby_of_an_active_on_another_host_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"--standby-of s@10.0.0.5:7171: .*serve only 127.0.0.1.*--host 0.0.0.0"):
        run_standby("s@10.0.0.5:7171", out=tmp_path / "new", cache_dir=tmp_path, token="t")
    with pytest.raises(ConfigError, match=r"--advertise 10.0.0.6"):
        run_standby("s@127.0.0.1:1", out=tmp_path / "new", cache_dir=tmp_path, token="t", advertise="10.0.0.6")
    assert not (tmp_path / "new").exists()
