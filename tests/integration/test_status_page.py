"""``diloco syncer``'s status page options, checked before anything is written. The page of a real run (the service
and site jobs on their own hosts, one killed and started again, the page scraped and loaded in headless Chromium from
another host's network) is tests/hosts/test_deploy_host_kill.py's; the page's parts have their unit tests
(tests/unit/test_status_*.py)."""

from __future__ import annotations


def test_a_bad_status_port_is_refused_before_anything_is_written(tmp_path, capsys):
    """``diloco syncer --status-port`` out of range, or taken by another process, is refused (exit 2, the port
    named with the fix) before the run's folder (or anything else) is written."""
    import socket

    from diloco.cli import main

    out = tmp_path / "svc"
    common = ["syncer", "--preset", "tiny", "--out", str(out), "--cache-dir", str(tmp_path / "cache")]
    assert main([*common, "--status-port", "70000"]) == 2
    assert "--status-port 70000 is out of range: give 1..65535, or 0 for a free port" in capsys.readouterr().err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert main([*common, "--status-host", "127.0.0.1", "--status-port", str(port)]) == 2
    assert f"--status-port {port} is taken on 127.0.0.1" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == []
