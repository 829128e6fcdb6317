"""Atomic checkpoints: written to a temporary file, fsynced, then renamed over the old one.

A crash while saving leaves the previous checkpoint intact. Loading uses
``weights_only=True``: a checkpoint holds tensors and plain containers only,
never code.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch


def save_atomic(state: dict[str, Any], path: Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def load(path: Path) -> dict[str, Any]:
    path = Path(path)
    if not path.exists():
        raise ValueError(f"no checkpoint at {path}: nothing to resume (run without --resume to start afresh)")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means a bad file
        raise ValueError(f"checkpoint {path} is unreadable or corrupt ({exc}); delete it to start afresh") from exc
