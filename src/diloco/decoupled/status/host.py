"""What a learner job tells the syncer about where it runs (its ``hello``), for the status page."""

from __future__ import annotations

import os
import socket


def whoami() -> str:
    """``HOSTNAME pid N`` of this process."""
    return f"{socket.gethostname()} pid {os.getpid()}"


__all__ = ["whoami"]
