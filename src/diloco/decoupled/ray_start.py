"""Starting a local Ray instance on a busy machine: ``ray.init`` with Ray's own start-up timeouts retried.

Ray gives its head node's processes fixed times to come up: 30 s for the raylet to register with the GCS
(hard-coded in Ray 2.x), and ``RAY_gcs_server_port_wait_time_s`` (30 s unless set) for the GCS to write its
port. A start launches about nine processes (GCS, raylet, agents, prestarted workers), each importing Ray; on
2 cores shared with other work they can miss those times, and ``ray.init`` then raises although nothing is
wrong. A child forked while another thread of this process is inside gRPC can also die before it runs its program
(gRPC's fork handlers: :mod:`diloco.decoupled.rpc` turns them off), and the GCS port is then never written.
:func:`start_ray` sets the GCS wait to 60 s (unless the user set it): room for a slow start on busy cores, and a
failed one costs a minute rather than two. Where a local start times out it ends the processes that attempt left
behind (only this process' descendants started by it, a hung fork among them) and starts again, up to
``attempts`` times, saying so on stderr. Joining a running cluster (``address`` given) is
tried once: its errors are not a busy machine's.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

#: How many times a local start is tried before its last error is raised.
START_ATTEMPTS = 3
#: Seconds Ray's GCS gets to write its port (Ray's own default is 30), unless RAY_gcs_server_port_wait_time_s is set:
#: a slow start on 2 busy cores writes it within seconds; a dead or hung fork never does, and is retried after this long.
GCS_WAIT_S = 60


def is_startup_timeout(exc: BaseException) -> bool:
    """Whether ``exc`` is one of Ray's start-up timeouts (the raylet not registered, the GCS port not written)."""
    return isinstance(exc, TimeoutError) or "timed out" in str(exc).lower()


def start_ray(address: str | None = None, *, attempts: int = START_ATTEMPTS, **kw: Any) -> None:
    """``ray.init(address=address, **kw)``; a local start (``address`` empty) that hits one of Ray's start-up
    timeouts is cleaned up and tried again, ``attempts`` times in all. The last error is raised as a RuntimeError
    that adds the number of attempts to its message."""
    import ray

    if attempts < 1:
        raise ValueError(f"attempts={attempts}: give 1 or more")
    os.environ.setdefault("RAY_gcs_server_port_wait_time_s", str(GCS_WAIT_S))
    tries = 1 if address else attempts
    for attempt in range(1, tries + 1):
        before = descendants(os.getpid())
        try:
            ray.init(address=address or None, **kw)
            return
        except Exception as exc:
            if address or not is_startup_timeout(exc):
                raise
            left = end_new_ray_processes(before)
            if attempt == tries:
                raise RuntimeError(f"{exc} (Ray's start timed out {tries} times on this machine)") from exc
            print(
                f"diloco: Ray's start timed out ({exc}); ended the {left} process(es) it left and trying again "
                f"(attempt {attempt + 1} of {tries}): the machine is busy",
                file=sys.stderr,
                flush=True,
            )


def descendants(pid: int) -> set[int]:
    """The pids of every process below ``pid`` (empty where /proc is not there)."""
    children: dict[int, list[int]] = {}
    proc = Path("/proc")
    if not proc.is_dir():
        return set()
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])  # after the command name, which may hold spaces
        children.setdefault(ppid, []).append(int(entry.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _is_ray(pid: int) -> bool:
    """A process of Ray's, or a child this process forked that never ran its program (its command line is still
    this process' own: a fork while another thread held a lock, e.g. inside gRPC, can hang there)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        own = Path(f"/proc/{os.getpid()}/cmdline").read_bytes()
    except OSError:
        return False
    return b"/ray/" in cmdline or cmdline.startswith(b"ray::") or cmdline == own


def end_new_ray_processes(before: set[int], passes: int = 3, settle_s: float = 5.0) -> int:
    """SIGKILL the Ray processes below this one that were not there in ``before`` (what a failed start left:
    its GCS, raylet, agents); how many. A pass waits (up to ``settle_s``) for what it ended to be gone, and the next
    pass ends what was forked meanwhile, until a pass finds nothing (a fresh-clone run once found a GCS left)."""
    total = 0
    for _ in range(passes):
        ended = []
        for pid in sorted(descendants(os.getpid()) - before):
            if _is_ray(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                    ended.append(pid)
                except ProcessLookupError:
                    pass
        if not ended:
            break
        for pid in ended:  # reaped where it was this process' own child (else its parent, killed too, is gone)
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        deadline = time.monotonic() + settle_s
        while any(_is_ray(pid) for pid in ended) and time.monotonic() < deadline:
            time.sleep(0.05)
        total += len(ended)
    return total


__all__ = ["GCS_WAIT_S", "START_ATTEMPTS", "descendants", "end_new_ray_processes", "is_startup_timeout", "start_ray"]
