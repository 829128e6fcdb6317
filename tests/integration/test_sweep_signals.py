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


def test_an_interrupt_while_the_runs_are_handed_out_stops_the_started_run(monkeypatch):
    """Ctrl-C or SIGTERM can land while the local executor is still handing runs to its processes, after a run's
    process started: that run is stopped and the pool shut down at once. (Before, the interrupt skipped the clean-up;
    the run trained on, and at exit the pool waited for it to end: a sweep sent SIGTERM at that moment hung for its
    run's whole length, which the test above met once in a loaded suite.) The moment is made here: the pool's
    ``submit`` hands out the run and then raises KeyboardInterrupt, as the signal handler would."""
    import concurrent.futures as cf
    import functools
    import multiprocessing

    from diloco.cli.sweep import delayed
    from diloco.scaling.executors import LocalExecutor
    from diloco.scaling.synthetic import synthetic_run

    real = cf.ProcessPoolExecutor.submit

    def submit_then_interrupted(self, *args, **kwargs):
        real(self, *args, **kwargs)
        raise KeyboardInterrupt("signal 15")

    monkeypatch.setattr(cf.ProcessPoolExecutor, "submit", submit_then_interrupted)
    before = set(multiprocessing.active_children())
    slow = functools.partial(delayed, fn=synthetic_run, delay=120)
    runs = LocalExecutor(1).run(slow, [dict(size="35M", method="dp", replicas=1, inner_lr=1e-3, global_batch=16)])
    start = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            next(runs)
        left = set(multiprocessing.active_children()) - before
        assert not left, f"the run's process {left} outlived the interrupted sweep"
        assert time.monotonic() - start < 60  # not the run's 120 s
    finally:
        for p in set(multiprocessing.active_children()) - before:  # (what the old code left behind)
            p.kill()
            p.join()
