"""What the status monitor reads on the syncer's host, without asking the syncer anything: the files the syncer
actor writes anyway (its events, its merge records, its checkpoints), read as they grow.

* :class:`Tail`: the whole rows appended to a JSONL file since the last read (a line still being written waits);
* :func:`checkpoint_age_s`: seconds since the newest checkpoint of any shard;
* :func:`global_parameters`: the global parameters in the shards' newest checkpoints, by name (what the loss plot
  evaluates): each shard's flat fragments cut back into the template's parameters.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


class Tail:
    """Reads the rows appended to ``path`` since the last :meth:`read` (the file may not exist yet)."""

    def __init__(self, path: Path | str) -> None:
        self.path, self.offset = Path(path), 0

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1  # whole lines only: a line being written is read next time
        self.offset += end
        rows = []
        for line in data[:end].splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut by a SIGKILL mid-write, then written after
                continue
        return rows


def shard_dirs(root: Path, num_shards: int) -> list[Path]:
    """The syncer's checkpoint folders under ``root`` (``DIR/syncer``), shard by shard."""
    from diloco.decoupled.ray_shards import shard_checkpoint_dir

    return [Path(shard_checkpoint_dir(root, s, num_shards)) for s in range(num_shards)]  # type: ignore[arg-type]


def checkpoint_age_s(dirs: Sequence[Path], *, now: float | None = None) -> float | None:
    """Seconds since the newest checkpoint in ``dirs`` (None: none yet)."""
    from diloco.decoupled.checkpoint import saved_states

    times = []
    for d in dirs:
        for path in saved_states(d)[-1:]:
            try:
                times.append(path.stat().st_mtime)
            except FileNotFoundError:  # replaced meanwhile
                continue
    return None if not times else max(0.0, (time.time() if now is None else now) - max(times))


def global_parameters(dirs: Sequence[Path], fragments: Sequence[Any]) -> dict[str, Any] | None:
    """The global parameters by name from each shard's newest checkpoint (``fragments``: the run's, of the
    template model: shard s holds fragment p = i * S + s as its i-th); None while a shard has none."""
    from diloco.decoupled.checkpoint import load_latest_state

    S, named = len(dirs), {}
    for s, d in enumerate(dirs):
        state = load_latest_state(d)
        if state is None:
            return None
        for i, flat in enumerate(state["syncer"]["global"]):
            frag, offset = fragments[i * S + s], 0
            for name, param in zip(frag.names, frag.params, strict=True):
                named[name] = flat[offset : offset + param.numel()].view_as(param)
                offset += param.numel()
            assert offset == flat.numel(), (frag.index, offset, flat.numel())
    return named


__all__ = ["Tail", "checkpoint_age_s", "global_parameters", "shard_dirs"]
