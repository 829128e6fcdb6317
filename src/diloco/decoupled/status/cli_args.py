"""``diloco syncer``'s options for the status page (``--status-port``, ``--status-host``, ``--status-eval``,
``--no-status``)."""

from __future__ import annotations

import argparse
from typing import Any


def add_status_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--status-port",
        type=int,
        default=0,
        help="the port of the run's status page and Prometheus metrics (/metrics), token-protected; refused before "
        "anything is written when out of range or taken (default: 0, a free port; printed, and in syncer.json)",
    )
    p.add_argument(
        "--status-host",
        default=None,
        help="the address the status page listens on (default: --host's, loopback unless given)",
    )
    p.add_argument(
        "--status-eval",
        type=float,
        default=30.0,
        help="seconds between evaluations of the global parameters for the page's loss plot (default: 30; 0: none)",
    )
    p.add_argument("--no-status", action="store_true", help="serve no status page")


def status_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """``run_service``'s status keywords from the parsed options."""
    host = args.status_host or args.host
    return {
        "status_port": None if args.no_status else args.status_port,
        "status_host": host,
        "status_eval_s": args.status_eval,
    }


__all__ = ["add_status_args", "status_kwargs"]
