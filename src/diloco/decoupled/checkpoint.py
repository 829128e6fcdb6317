"""The syncer's checkpoints: one file per state, written atomically, the newest ``keep`` kept.

``syncer-<merges>.pt`` in a folder of its own, where ``<merges>`` is the number of merges the state
holds (it only grows). A file is written under a temporary name and renamed, so a crash mid-write
leaves the previous files as they were; loading takes the newest file that loads
(``weights_only=True``) and falls back to an older one otherwise, saying so.

The merge records are not in those files (a state holding every record so far would grow with the run,
and writing one per merge would cost time quadratic in the run's length): they go to ``records.jsonl``
in the same folder, one JSON row per merge, appended (and flushed to disk) before the state that counts
them is written. A state says how many records it holds; on loading, :func:`load_records` takes that
many rows and drops any after them (merges whose state never reached the disk, as their replies never
left the syncer), rewriting the file atomically.
"""

from __future__ import annotations

import io
import json
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from diloco.errors import ConfigError
from diloco.files import atomic_write_bytes

_NAME = re.compile(r"^syncer-(\d{8,})\.pt$")
RECORDS = "records.jsonl"


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
        raise ConfigError(f"keep={keep!r}: keep at least 1 syncer checkpoint")
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
        except Exception as exc:
            print(
                f"diloco: syncer checkpoint {path} does not load ({type(exc).__name__}: {exc}); trying the one before",
                file=sys.stderr,
            )
    return None


def append_records(directory: Path | str, rows: Sequence[dict[str, Any]]) -> None:
    """Append merge records to ``directory/records.jsonl``, on disk (fsync) when this returns."""
    if not rows:
        return
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / RECORDS, "a", encoding="utf-8") as fh:
        fh.write("".join(json.dumps(r, allow_nan=False) + "\n" for r in rows))
        fh.flush()
        os.fsync(fh.fileno())


def load_records(directory: Path | str, count: int) -> list[dict[str, Any]]:
    """The first ``count`` merge records of ``directory/records.jsonl`` (those a loaded state holds).

    Rows after them (merges whose state was never written) and a line cut by a crash are dropped from the
    file. Fewer than ``count`` whole rows: the log does not belong to the state (a folder mixed up or
    edited by hand), an error that names the file."""
    path = Path(directory) / RECORDS
    rows: list[dict[str, Any]] = []
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    for line in text.splitlines(keepends=True):
        if not line.endswith("\n"):
            break  # the last line, cut by a crash mid-write
        rows.append(json.loads(line))
    if len(rows) < count:
        raise RuntimeError(
            f"{path} holds {len(rows)} merge records but the syncer's newest state holds "
            f"{count}: the records and the states in {directory} do not belong together"
        )
    if len(rows) > count or not text.endswith("\n") and text:
        atomic_write_bytes(path, "".join(json.dumps(r, allow_nan=False) + "\n" for r in rows[:count]).encode())
    return rows[:count]


__all__ = ["RECORDS", "append_records", "load_latest_state", "load_records", "save_state", "saved_states"]
