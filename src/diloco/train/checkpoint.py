"""Crash-safe checkpoints of M replicas, the same for threads and for processes.

Layout in a run directory::

    checkpoints/step-00000480/replica-0.pt   # one file per replica, each written atomically
    checkpoints/step-00000480/replica-1.pt
    checkpoints/latest.json                  # {"step": 480, ...}: written last, atomically

Every replica writes its own file (temporary file, fsync, rename); after a
barrier, replica 0 points ``latest.json`` at the new step and only then deletes
older steps. A crash at any moment leaves ``latest.json`` naming a complete
checkpoint. Loading uses ``weights_only=True``: tensors and plain containers,
never code.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

_DIR = "checkpoints"


def _step_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / _DIR / f"step-{step:08d}"


def _atomic_write(path: Path, write) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def save_replica(run_dir: Path, step: int, rank: int, state: dict[str, Any]) -> None:
    """Write one replica's state for ``step`` (call on every replica, then barrier, then :func:`commit`)."""
    _atomic_write(_step_dir(run_dir, step) / f"replica-{rank}.pt", lambda f: torch.save(state, f))


def commit(run_dir: Path, step: int, meta: dict[str, Any]) -> None:
    """Replica 0, after every replica saved ``step``: make it the latest and drop older ones."""
    root = Path(run_dir) / _DIR
    body = json.dumps({"step": step, **meta}, indent=2).encode()
    _atomic_write(root / "latest.json", lambda f: f.write(body))
    keep = _step_dir(run_dir, step).name
    for d in root.glob("step-*"):
        if d.name != keep:
            shutil.rmtree(d, ignore_errors=True)


def latest_meta(run_dir: Path) -> dict[str, Any]:
    path = Path(run_dir) / _DIR / "latest.json"
    if not path.exists():
        raise ValueError(f"no checkpoint in {run_dir} ({path} missing): nothing to resume; "
                         f"run without --resume to start afresh")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is corrupt ({exc}); delete {Path(run_dir) / _DIR} to start afresh") from None


def load_replica(run_dir: Path, rank: int, step: int | None = None) -> dict[str, Any]:
    step = latest_meta(run_dir)["step"] if step is None else step
    path = _step_dir(run_dir, step) / f"replica-{rank}.pt"
    if not path.exists():
        raise ValueError(f"checkpoint {path} is missing (a run with more replicas?); delete "
                         f"{Path(run_dir) / _DIR} to start afresh")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means a bad file
        raise ValueError(f"checkpoint {path} is unreadable or corrupt ({exc}); delete it to start afresh") from exc


def load_latest(run_dir: Path) -> dict[str, Any]:
    """The latest checkpoint of every replica: ``{"step", "config", ..., "replicas": [state, ...]}``."""
    meta = latest_meta(run_dir)
    n = int(meta.get("num_replicas", 1))
    return {**meta, "replicas": [load_replica(run_dir, r, meta["step"]) for r in range(n)]}
