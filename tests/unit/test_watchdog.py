"""A worker whose launcher is SIGKILLed stops by itself (diloco.distributed.watchdog), saying why."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from diloco.distributed.watchdog import exit_when_orphaned

# The launcher: starts a worker that watches it, prints the worker's pid, then waits to be killed.
LAUNCHER = textwrap.dedent("""
    import subprocess, sys, time
    worker = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stderr=open(sys.argv[2], "w"))
    print(worker.pid, flush=True)
    time.sleep(120)
""")
WORKER = textwrap.dedent("""
    import time
    from diloco.distributed.watchdog import exit_when_orphaned
    exit_when_orphaned(interval_s=0.1, what="the test launcher")
    print("watching", flush=True)
    time.sleep(120)  # "training": only the watchdog ends it early
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); it has exited though
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(sys.platform != "linux", reason="re-parenting as on Linux")
def test_a_worker_exits_soon_after_its_launcher_is_killed(tmp_path):
    log = tmp_path / "worker.err"
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, WORKER, str(log)], stdout=subprocess.PIPE, text=True)
    worker = int(launcher.stdout.readline())
    assert launcher.stdout.readline().strip() == "watching"  # the worker's watchdog has started
    assert _alive(worker)
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    deadline = time.monotonic() + 20
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(worker), "the orphaned worker kept running"
    message = log.read_text()
    assert f"the test launcher (pid {launcher.pid}) is gone" in message and "--resume" in message


def test_the_watchdog_stays_quiet_while_the_parent_lives_and_rejects_a_bad_interval():
    fired = []
    thread = exit_when_orphaned(interval_s=0.01, on_orphaned=lambda: fired.append(True))
    time.sleep(0.1)
    assert thread.is_alive() and not fired
    with pytest.raises(ValueError, match="interval_s must be > 0"):
        exit_when_orphaned(interval_s=0)
