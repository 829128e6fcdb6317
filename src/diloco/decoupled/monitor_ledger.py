"""A ``diloco syncer`` monitor that is killed and started again on the same ``--out``: what it keeps.

The monitor (:func:`diloco.decoupled.service.run_service`) holds three things in its process: the local Ray
instance it started (the syncer's actors live there), the gRPC gateway the sites call, and the status page. A
SIGKILL of the monitor takes all three down: Ray's head processes share the fate of the process that started them
(the GCS server and the raylet are its children, and are ended with it; two of the raylet's agents were seen to
outlive it by about 40 s, then end), so the detached syncer actor goes with them, and the sites' calls are refused. What survives is on disk: ``DIR/syncer`` holds every merge (each saved,
with its record, before its replies leave the syncer) and the learners' claims and finished flags, and
``DIR/syncer.json`` the syncer's name, port and token.

Started again with the same ``--out`` (and the same arguments), the monitor resumes: it serves the same name,
token and port (:func:`resume_port`: a resumed run's port, also for ``--port 0``, whose sites were told it), finds
no running actor (or, on a Ray cluster it joined with ``ray_address``, the one still running: it monitors that one)
and starts the syncer again from its newest checkpoint, the claims restored with a fresh lease. No merge is lost;
the reports of rounds that were open are sent again by their learners (a reply asked for before the syncer's start
is answered "none": the report is sent again). The sites ride the gap out as a syncer restart: their calls are
tried again for up to :data:`~diloco.decoupled.rpc.client.RETRY_FOR_S` seconds, each learner waiting for a
reply (or training on, up to ``ride_out_steps``).

This module keeps what the monitor counts across its own restarts in ``DIR/monitor.json`` (:class:`MonitorLedger`):
the monitor's starts, the syncer restarts it saw, the gateway's calls, added up in the run's ``summary.json``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from diloco.decoupled.rpc import DEFAULT_PORT

LEDGER = "monitor.json"


def resume_port(port: int | None, previous: dict[str, Any] | None) -> int:
    """The port the gateway serves on: ``port`` as given for a new run (None: :data:`DEFAULT_PORT`; 0: a free one);
    for a resumed run (``previous``: its syncer.json) the port its sites were told, unless ``port`` names another
    one (then the sites need the newly printed commands)."""
    if previous is not None and not port:
        return int(previous.get("port", DEFAULT_PORT))
    return DEFAULT_PORT if port is None else int(port)


class MonitorLedger:
    """The counts of ``DIR/monitor.json`` (module docstring): read at the monitor's start, written as they change."""

    def __init__(self, out: Path | str, *, resumed: bool) -> None:
        from diloco.files import read_json

        self.path = Path(out) / LEDGER
        before = read_json(self.path) if self.path.is_file() else {}
        # a resumed run from before this file existed had one start
        self.starts = int(before.get("monitor_starts", 1 if resumed else 0)) + 1
        self._restarts_before = int(before.get("syncer_restarts", 0))
        self._calls_before = int(before.get("gateway_calls", 0))
        self.syncer_restarts = 0  # seen by this monitor
        self._pid: Any = None
        self._written: dict[str, int] = {}
        self.write(0)

    def observe(self, status: dict[str, Any] | None, gateway_calls: int) -> None:
        """One status read of the monitor's (None: the syncer did not answer): a new syncer pid than the last one
        this monitor saw is a syncer restart."""
        if status is not None:
            if self._pid is not None and status["pid"] != self._pid:
                self.syncer_restarts += 1
            self._pid = status["pid"]
        self.write(gateway_calls)

    def chain(self, on_status: Callable[[dict[str, Any] | None], None], gateway: Any) -> Callable[[Any], None]:
        """A monitor's ``on_status``: ``on_status`` (the status page's), then :meth:`observe` with the gateway's
        calls so far."""

        def both(status: dict[str, Any] | None) -> None:
            on_status(status)
            self.observe(status, gateway.calls)

        return both

    def totals(self, gateway_calls: int) -> dict[str, int]:
        """The run's counts so far, every start of the monitor included."""
        return {
            "monitor_restarts": self.starts - 1,
            "syncer_restarts": self._restarts_before + self.syncer_restarts,
            "gateway_calls": self._calls_before + int(gateway_calls),
        }

    def write(self, gateway_calls: int) -> None:
        """``DIR/monitor.json`` (atomic), when a count changed."""
        from diloco.files import write_json

        now = {"monitor_starts": self.starts, **self.totals(gateway_calls)}
        now.pop("monitor_restarts")
        if now != self._written:
            write_json(self.path, now)
            self._written = now


__all__ = ["LEDGER", "MonitorLedger", "resume_port"]
