"""The status page's own CPU time, counted where it is spent: each route's requests and the monitor's reads and
evaluations on the thread that runs them (``time.thread_time``: CPU seconds of that thread alone, whatever else the
host runs), and the server's thread as a whole (aiohttp: accepting, parsing, the token check, answering). CPU time,
not wall time: a loaded machine delays the page's work but does not make it count more, so the page's cost can be
compared with the syncer's across runs (``benchmarks/status_page.py``)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any


class CpuMeter:
    """CPU seconds and calls per kind of work (``"page"``, ``"metrics"``, ``"read"``, ...). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    @contextlib.contextmanager
    def measure(self, kind: str) -> Iterator[None]:
        """Count the CPU time of this thread inside the block as ``kind``'s."""
        began = time.thread_time()
        try:
            yield
        finally:
            spent = time.thread_time() - began
            with self._lock:
                self.seconds[kind] = self.seconds.get(kind, 0.0) + spent
                self.calls[kind] = self.calls.get(kind, 0) + 1

    def as_row(self) -> dict[str, Any]:
        with self._lock:
            return {"cpu_s": dict(self.seconds), "calls": dict(self.calls)}


def thread_cpu_s(thread: threading.Thread | None) -> float | None:
    """CPU seconds a live thread of this process has used (None: not started, ended, or no per-thread clock here)."""
    if thread is None or thread.ident is None or not thread.is_alive():
        return None
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    except (AttributeError, OSError):  # a platform without per-thread CPU clocks
        return None


def process_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) a process has used, from ``/proc`` (None: gone, or no ``/proc`` here)."""
    import os
    from pathlib import Path

    try:
        fields = (
            Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        )  # after the name, which may hold spaces
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


__all__ = ["CpuMeter", "process_cpu_s", "thread_cpu_s"]
