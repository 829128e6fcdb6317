"""The status page of a finished (or stopped) syncer service, from its folder: ``diloco status DIR``.

The same board as the live page (:class:`~diloco.decoupled.status.board.Board`), folded from what the service left
on its own host: the syncer's events (``syncer/events.jsonl``, or each shard's ``syncer/shard-<s>/events.jsonl``),
its merges (``merges.jsonl``, else each shard's ``records.jsonl``), the loss of the global parameters the monitor
evaluated (``status-loss.jsonl``) and, for the ``finished`` flag, ``summary.json``. Nothing is read from the sites.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from diloco.decoupled.chaos_logs import read_learner_log
from diloco.decoupled.status.board import Board
from diloco.errors import ConfigError


def _shard_dirs(folder: Path, num_shards: int) -> list[Path]:
    root = folder / "syncer"
    return [root] if num_shards == 1 else [root / f"shard-{s}" for s in range(num_shards)]


def board_of_run(folder: Path | str) -> Board:
    """The board of the ``diloco syncer`` run in ``folder`` (module docstring); a ConfigError for a folder that
    holds none."""
    from diloco.decoupled.checkpoint import saved_states
    from diloco.files import read_json

    folder = Path(folder)
    if not (folder / "syncer.json").is_file() or not (folder / "config.json").is_file():
        raise ConfigError(
            f"{folder} holds no `diloco syncer` run (no syncer.json and config.json): give the --out folder of "
            f"`diloco syncer`"
        )
    config, info = read_json(folder / "config.json"), read_json(folder / "syncer.json")
    num_shards = int(config.get("syncer_shards", 1))
    board = Board(num_learners=int(config["replicas"]), name=str(info.get("name", folder.name)))
    dirs = _shard_dirs(folder, num_shards)
    rows = sorted((r for d in dirs for r in read_learner_log(d / "events.jsonl")), key=lambda r: r.get("t", 0.0))
    for row in rows:
        board.observe(row)
    if (folder / "merges.jsonl").is_file():
        records = read_learner_log(folder / "merges.jsonl")
    else:  # a run that did not end: each shard's own records (shard s's fragment p is p * S + s)
        records = [
            {**r, "fragment": r["fragment"] * num_shards + s}
            for s, d in enumerate(dirs)
            for r in read_learner_log(d / "records.jsonl")
        ]
    for record in sorted(records, key=lambda r: r.get("at", 0.0)):
        board.merged(record)
    for point in read_learner_log(folder / "status-loss.jsonl"):
        board.losses.append((float(point["t"]), float(point["tokens"]), float(point["loss"])))
    states = [p for d in dirs for p in saved_states(d)]
    if states:
        board.checkpoint_at = max(p.stat().st_mtime for p in states)
    board.finished_run = board.ended = (folder / "summary.json").is_file()
    return board


def write_page(folder: Path | str, out: Path | str | None = None) -> tuple[Path, dict[str, Any]]:
    """Render ``folder``'s page to ``out`` (default ``folder/status.html``, which the live service also writes at
    its end); an existing ``out`` that is not such a page is refused. Returns the path and the snapshot."""
    from diloco.decoupled.status.page import render
    from diloco.files import atomic_write_bytes

    folder = Path(folder)
    path = Path(out) if out is not None else folder / "status.html"
    if path.exists() and (path.is_dir() or "<title>diloco run " not in path.read_text(errors="replace")[:2000]):
        raise ConfigError(f"--out {path} exists and is not a status page: give a new file (nothing is overwritten)")
    snap = board_of_run(folder).snapshot()
    atomic_write_bytes(path, render(snap).encode("utf-8"))
    return path, snap


__all__ = ["board_of_run", "write_page"]
