"""Stop a worker whose launcher died: torchrun's agent is the node; without it the worker must go too.

torchrun starts each worker in a session of its own, so a SIGKILL to the agent alone leaves the worker
training with the others: nothing fails and nothing restarts until the worker stops by itself, and the
agent that would restart it is gone. :func:`exit_when_orphaned` watches the parent process from a daemon
thread and ends this process when the parent changes (the orphan is re-parented to init or a
subreaper), so that the other workers' collectives fail at once, their agents re-rendezvous, and the
job goes on without this node (``--elastic``) or stops with the usual error naming the missing rank.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable

from diloco.errors import ConfigError


def exit_when_orphaned(
    *, interval_s: float = 1.0, what: str = "the launcher", on_orphaned: Callable[[], None] | None = None
) -> threading.Thread:
    """Watch the parent process every ``interval_s`` seconds; when it is gone, print why and exit (status 1).

    ``on_orphaned`` replaces the exit (for tests). Returns the (daemon) thread.
    """
    if not interval_s > 0:
        raise ConfigError(f"interval_s must be > 0 seconds, got {interval_s!r}")
    parent = os.getppid()

    def exit_now() -> None:
        sys.stderr.write(
            f"diloco: {what} (pid {parent}) is gone; stopping this worker (pid {os.getpid()}) so "
            f"the others notice now, not at their timeout. An elastic job goes on without this "
            f"node; otherwise continue the run with --resume.\n"
        )
        sys.stderr.flush()
        os._exit(1)  # not sys.exit: the main thread may be blocked in a collective

    action = on_orphaned or exit_now

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval_s)
        action()

    thread = threading.Thread(target=watch, name="diloco-parent-watchdog", daemon=True)
    thread.start()
    return thread
