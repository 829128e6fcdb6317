"""Waiting on processes of emulated hosts (:mod:`diloco.testing.hosts`), for tests and benchmarks: :func:`wait` polls
a check until it holds, failing at once (with the end of the process's output) when one of the processes watched
exits non-zero, and :func:`tail` is that output. Used by tests/hosts/_deploy.py and :mod:`diloco.testing.standby_hosts`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any


def tail(proc: Any, n: int = 3000) -> str:
    """The end of a process's output (``proc.stdout_path``, ``proc.stderr_path``: :meth:`Host.run`'s files), and its
    first lines that name an error (a torchrun job's last lines are its agent's summary, the rank's own error comes
    before)."""
    texts = [Path(p).read_text(errors="replace") for p in (proc.stdout_path, proc.stderr_path)]
    errors = [line for t in texts for line in t.splitlines() if "Error" in line or "error:" in line][:12]
    return "\n".join(errors) + "\n...\n" + "\n".join(t[-n:] for t in texts)


def wait(what: str, check: Callable[[], Any], *, timeout: float, procs: Iterable[Any] = (), every: float = 0.1) -> Any:
    """``check()``'s first truthy value, tried every ``every`` seconds; an AssertionError naming ``what`` after
    ``timeout`` seconds, or as soon as one of ``procs`` exits non-zero (with its :func:`tail`)."""
    procs = list(procs)
    end = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        for p in procs:
            if p.poll() not in (None, 0):
                raise AssertionError(f"{p.args[-1]} exited {p.returncode} waiting for {what}:\n{tail(p)}")
        if time.monotonic() >= end:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)


__all__ = ["tail", "wait"]
