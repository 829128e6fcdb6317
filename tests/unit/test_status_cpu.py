"""The status page's CPU meter (:mod:`diloco.decoupled.status.cpu`): CPU time of the thread that does the work, so
a block that sleeps counts (almost) nothing and one that spins counts what it spun, on a loaded machine too."""

from __future__ import annotations

import threading
import time

from diloco.decoupled.status.cpu import CpuMeter, thread_cpu_s

SPIN_S = 0.05


def _spin(seconds: float) -> None:
    """Use ``seconds`` of this thread's CPU (however long that takes in wall time)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_the_meter_counts_cpu_not_wall_time_per_kind():
    meter = CpuMeter()
    with meter.measure("page"):
        _spin(SPIN_S)
    with meter.measure("read"):
        time.sleep(0.2)  # waiting: no CPU (a few microseconds of the call itself)
    with meter.measure("read"):
        pass
    row = meter.as_row()
    assert row["calls"] == {"page": 1, "read": 2}
    assert SPIN_S <= row["cpu_s"]["page"] < 1.0
    assert row["cpu_s"]["read"] < SPIN_S / 5  # far below the 0.2 s slept


def test_another_threads_cpu_is_read_while_it_lives():
    spun, done = threading.Event(), threading.Event()

    def work() -> None:
        _spin(SPIN_S)
        spun.set()
        done.wait(timeout=30)

    thread = threading.Thread(target=work)
    assert thread_cpu_s(thread) is None  # not started
    thread.start()
    assert spun.wait(timeout=30)
    assert SPIN_S <= thread_cpu_s(thread) < 1.0
    done.set()
    thread.join()
    assert thread_cpu_s(thread) is None and thread_cpu_s(None) is None
