"""A sweep stopped with SIGTERM (``kill PID``, a scheduler's stop) takes its runs in progress down with it.

Before, SIGTERM killed the sweep alone: its run process trained on as an orphan, into a run folder that no
record would name, and a second sweep started the same run in the same folder beside it.
"""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process table from /proc")


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid and b"spawn_main" in cmdline:  # a run's process, not multiprocessing's resource tracker
            out.append(int(entry.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_sigterm_to_the_sweep_stops_its_run_processes_and_records_nothing(tmp_path):
    grid = dict(sizes=["35M"], inner_lr=[1e-3], global_batch=[16], methods=["dp"], replicas=[1], runner="synthetic")
    (tmp_path / "grid.json").write_text(json.dumps(grid))
    out = tmp_path / "results.jsonl"
    cmd = [
        sys.executable,
        "-m",
        "diloco",
        "sweep",
        "--grid",
        str(tmp_path / "grid.json"),
        "--out",
        str(out),
        "--executor",
        "local",
        "--synthetic-delay",
        "120",
        "--no-progress",
    ]
    sweep = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (runs := _children(sweep.pid)):
            assert sweep.poll() is None, sweep.stderr.read()
            assert time.monotonic() < deadline, "the sweep never started its run process"
            time.sleep(0.1)
        sweep.send_signal(signal.SIGTERM)
        rc = sweep.wait(timeout=30)  # not the 120 s the run would take
        err = sweep.stderr.read()
    finally:
        if sweep.poll() is None:
            sweep.kill()
    assert rc == 130 and "interrupted" in err, err
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in runs) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in runs), f"run processes {runs} outlived the sweep"
    assert not out.exists() or out.read_text() == ""  # an interrupted run leaves no record; a rerun does it again
