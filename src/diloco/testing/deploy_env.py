"""What the runs deployed on emulated hosts (:mod:`diloco.testing.hosts`) share, for tests and benchmarks: the
environment every host's processes run with (:func:`host_env`) and the check that a syncer's merges lost no version
(:func:`contiguous`). Used by tests/hosts/_deploy.py and :mod:`diloco.testing.standby_hosts`."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any


def host_env(token: str | None = None) -> dict[str, str]:
    """What every host's processes run with: this environment (PYTHONPATH: this tree), this venv's tools first on
    PATH, the host's own token cache, and no token unless ``token`` is given (the printed command brings it)."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}"
    env["DILOCO_CACHE"] = "/tmp/cache"
    env.pop("DILOCO_SYNCER_TOKEN", None)
    if token:
        env["DILOCO_SYNCER_TOKEN"] = token
    env.setdefault("RAY_gcs_server_port_wait_time_s", "120")  # Ray's 30 s for its GCS to start: not on 2 loaded cores
    return env


def contiguous(merges: list[dict[str, Any]]) -> bool:
    """Every fragment's merge versions run 1, 2, ... without a gap or a repeat."""
    return all(
        [r["version"] for r in merges if r["fragment"] == p]
        == list(range(1, 1 + sum(r["fragment"] == p for r in merges)))
        for p in {r["fragment"] for r in merges}
    )


__all__ = ["contiguous", "host_env"]
