"""`diloco chaos` refuses bad input before anything is written or started (no Ray needed)."""

from __future__ import annotations

import pytest

from diloco.cli import main as cli_main


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--kill", "3"], "SECONDS:LEARNER"),
        (["--kill", "3:5"], "learner in 0..1"),
        (["--slowdown", "1,3,1"], "one factor >= 1 per learner"),
        (["--slowdown", "1,x"], "numbers separated by commas"),
        (["--syncer-kill", "-1"], "seconds after the start"),
        (["--step-time", "-0.1"], "--step-time=-0.1"),
        (["--set", "quorum=3"], "quorum"),
        (["--corrupt", "12"], "SECONDS:LEARNER[:SCALE[:DURATION]]"),
        (["--corrupt", "12:2:1e4"], "learner in 0..1"),
        (["--corrupt", "12:1:1e4:0"], "duration > 0"),
        (["--set", "guard=median"], "guard='median'"),
    ],
)
def test_bad_settings_are_refused_naming_the_value(extra, message, tmp_path, capsys):
    out = tmp_path / "new"
    code = cli_main(["chaos", "--preset", "tiny", "--set", "replicas=2", "--out", str(out), *extra])
    assert code == 2 and message in capsys.readouterr().err
    assert not out.exists()


def test_an_out_folder_holding_files_is_left_alone(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "results.txt").write_text("keep me")
    code = cli_main(["chaos", "--preset", "tiny", "--set", "replicas=2", "--out", str(out)])
    assert code == 2 and "not a new or empty folder" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["results.txt"] and (out / "results.txt").read_text() == "keep me"


def _closed_port() -> int:
    import socket

    with socket.socket() as s:  # a port nothing listens on once this socket is closed
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_ray_address_that_does_not_answer_is_named_at_once(tmp_path, capsys):
    """Ray's own init would wait for minutes without a word; the address is probed first."""
    pytest.importorskip("ray")
    import time

    port = _closed_port()
    out = tmp_path / "new"
    t0 = time.monotonic()
    code = cli_main(
        [
            "chaos",
            "--preset",
            "tiny",
            "--set",
            "replicas=2",
            "--set",
            f"ray_address=127.0.0.1:{port}",
            "--out",
            str(out),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and f"ray_address='127.0.0.1:{port}' does not answer" in err and "ray start --head" in err
    assert time.monotonic() - t0 < 30 and not out.exists()
    code = cli_main(["chaos", "--preset", "tiny", "--set", "ray_address=nonsense", "--out", str(out)])
    assert code == 2 and "give HOST:PORT" in capsys.readouterr().err
