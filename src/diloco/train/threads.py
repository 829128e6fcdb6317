"""How many torch intra-op threads each replica gets by default (``threads = 0``).

torch's CPU kernels split work over a team of threads that meet at a barrier
after every operation. When another process takes one of those cores, the whole
team waits for the descheduled thread at every barrier, and a step can become
ten times slower than with a single thread (measured: ``benchmarks/threads.py``,
table in docs/guides/training.md). So the default counts only the cores that are free
when the run starts:

    busy    = cores of this process's CPU set in use by other work, sampled over 0.2 s (/proc/stat)
    threads = max(1, (cores - round(busy)) // replicas)

On an idle machine this is cores // replicas (the previous default); with
other work running it drops towards one thread per replica, which loses at
most the parallel speed-up and never collapses. Where /proc/stat is missing
(not Linux) the 1-minute load average stands in for ``busy``.
``--set threads=N`` overrides it. The trainer chooses once per run and records
the count in its checkpoints, so a resumed run uses the same count (it can
change the order of float sums, and so the bits).
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

from diloco.errors import ConfigError


def usable_cores() -> list[int]:
    """The CPUs this process may run on (its affinity; all of os.cpu_count() where affinity is unknown)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return list(range(os.cpu_count() or 1))


def _cpu_times(cpus: list[int]) -> tuple[int, int] | None:
    """(busy, total) jiffies summed over ``cpus`` from /proc/stat; None where it cannot be read."""
    try:
        with open("/proc/stat") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    wanted = {f"cpu{c}" for c in cpus}
    busy = total = 0
    for line in lines:
        parts = line.split()
        if parts and parts[0] in wanted:
            values = [int(v) for v in parts[1:]]
            idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
            busy += sum(values[:8]) - idle  # user nice system idle iowait irq softirq steal
            total += sum(values[:8])
    return (busy, total) if total else None


def busy_cores(cpus: list[int] | None = None, *, window_s: float = 0.2) -> float:
    """How many of ``cpus`` other work keeps busy now (this process sleeps while it is measured)."""
    cpus = usable_cores() if cpus is None else cpus
    first = _cpu_times(cpus)
    if first is None:
        try:
            return min(len(cpus), max(0.0, os.getloadavg()[0]))
        except (AttributeError, OSError):
            return 0.0
    time.sleep(window_s)
    second = _cpu_times(cpus)
    if second is None or second[1] <= first[1]:
        return 0.0
    return len(cpus) * (second[0] - first[0]) / (second[1] - first[1])


def default_threads(replicas: int, *, cores: int | None = None, busy: float | None = None) -> int:
    """Threads per replica for ``replicas`` replicas sharing this process's cores (see the module docstring)."""
    if replicas < 1:
        raise ConfigError(f"replicas={replicas}: need at least 1")
    cpus = usable_cores()
    cores = len(cpus) if cores is None else cores
    busy = busy_cores(cpus) if busy is None else busy
    free = max(0, cores - math.floor(busy + 0.5))  # 0.4 of a core busy is noise; 0.6 is a busy core
    return max(1, free // replicas)


def threads_errors(cfg: Any) -> list[str]:
    """What is wrong with a training config's ``threads`` (the message names the value and the fix)."""
    return [f"threads={cfg.threads}: must be >= 0 (0 = auto)"] if cfg.threads < 0 else []


__all__ = ["busy_cores", "default_threads", "threads_errors", "usable_cores"]
