"""The syncer's checkpoints: one file per state, written atomically, the newest ``keep`` kept.

``syncer-<merges>.pt`` in a folder of its own, where ``<merges>`` is the number of merges the state
holds (it only grows). A file is written under a temporary name and renamed, so a crash mid-write
leaves the previous files as they were; loading takes the newest file that loads
(``weights_only=True``) and falls back to an older one otherwise, saying so.
"""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path
from typing import Any

import torch

from diloco.files import atomic_write_bytes

_NAME = re.compile(r"^syncer-(\d{8,})\.pt$")


def saved_states(directory: Path | str) -> list[Path]:
    """The syncer checkpoints in ``directory``, oldest first (none if it does not exist)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def save_state(directory: Path | str, state: dict[str, Any], *, merges: int, keep: int = 2) -> Path:
    """Write ``state`` as ``syncer-<merges>.pt`` (atomic) and delete all but the newest ``keep`` files."""
    if not isinstance(keep, int) or keep < 1:
        raise ValueError(f"keep={keep!r}: keep at least 1 syncer checkpoint")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    path = directory / f"syncer-{merges:08d}.pt"
    atomic_write_bytes(path, buffer.getvalue())
    for old in saved_states(directory)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def load_latest_state(directory: Path | str) -> dict[str, Any] | None:
    """The newest syncer checkpoint that loads, or None if there is none."""
    for path in reversed(saved_states(directory)):
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - a damaged file: the previous one will do
            print(f"diloco: syncer checkpoint {path} does not load ({type(exc).__name__}: {exc}); "
                  f"trying the one before", file=sys.stderr)
    return None


__all__ = ["load_latest_state", "save_state", "saved_states"]
