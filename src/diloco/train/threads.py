"""How many torch intra-op threads each replica gets by default (``threads = 0``).

torch's CPU kernels split work over a team of threads that meet at a barrier
after every operation. When another process takes one of those cores, the whole
team waits for the descheduled thread at every barrier, and a step can become
ten times slower than with a single thread (measured: see
``benchmarks/threads.py`` and the table in docs/training.md). So the default
counts only the cores that are free:

    free    = usable cores (os.sched_getaffinity) - other load (1-minute load average)
    threads = max(1, floor(free / replicas))

On an idle machine this is cores // replicas (the previous default); with
other work running it drops towards one thread per replica, which loses at
most the parallel speed-up and never collapses. ``--set threads=N`` overrides it.
The trainer chooses once per run and records the count in its checkpoints, so a
resumed run uses the same count (it can change float summation order).
"""

from __future__ import annotations

import math
import os


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity; os.cpu_count() where affinity is unknown)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def other_load() -> float:
    """Runnable processes averaged over the last minute (0 where the OS does not say)."""
    try:
        return max(0.0, os.getloadavg()[0])
    except (AttributeError, OSError):
        return 0.0


def default_threads(replicas: int, *, cores: int | None = None, load: float | None = None) -> int:
    """Threads per replica for ``replicas`` replicas sharing this process's cores (see the module docstring)."""
    if replicas < 1:
        raise ValueError(f"replicas={replicas}: need at least 1")
    cores = usable_cores() if cores is None else cores
    load = other_load() if load is None else load
    free = min(cores, max(0, cores - math.ceil(load - 0.5)))  # a load of 0.4 is noise; 0.6 is a busy core
    return max(1, free // replicas)


__all__ = ["default_threads", "other_load", "usable_cores"]
