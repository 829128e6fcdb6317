"""Crash-safe checkpoints of M replicas, the same for threads and for processes.

Layout in a run directory::

    checkpoints/step-00000480/replica-0.pt   # one file per replica, each written atomically
    checkpoints/step-00000480/replica-1.pt
    checkpoints/step-00000480/syncer.pt       # a method's own state beside the replicas' (decoupled: the syncer)
    checkpoints/step-00000480.json           # {"step": 480, "config": ..., "files": {name: {bytes, sha256}}}
    checkpoints/step-00000360/...            # the one before (the last K = keep_checkpoints are kept)
    checkpoints/step-00000360.json
    checkpoints/latest.json                  # a copy of the newest step's record: written last, atomically

Every replica writes its own file (temporary file, fsync, rename); after a
barrier, replica 0 records the step (with each file's size and SHA-256),
points ``latest.json`` at it, and only then deletes steps older than the last
K. A crash at any moment leaves ``latest.json`` naming a complete checkpoint. A method with a service of its
own (:mod:`diloco.train.runtime`) writes its state into the step's folder after the barrier, before the record:
the record lists those files too, so they are checked, kept and deleted with the step.

Resuming (:func:`find_resumable`) takes the newest recorded step whose files
all match their records; a damaged newest one (a disk error, a truncated copy)
is reported and the one before it is used. Loading uses ``weights_only=True``:
tensors and plain containers, never code.

FSDP workers (``worker_sharding = "fsdp"``) write sharded checkpoints instead: a
folder per worker in the step's folder, every rank writing its shard with
``torch.distributed.checkpoint`` (:mod:`diloco.train.sharded_checkpoint`). Their
record says ``"format": "dcp"`` and lists every file of the step's folder with its
size and SHA-256; the commit, keep-K and fallback rules are the same.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from diloco.errors import ConfigError
from diloco.files import atomic_write_with, read_json, write_json

_DIR = "checkpoints"
_PREFIX = "step-"


class CheckpointError(ConfigError):
    """A checkpoint is missing or cannot be read; the message names the file and a fix."""


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / _DIR


def step_dir(run_dir: Path, step: int) -> Path:
    """The folder of one step's checkpoint files."""
    return checkpoint_dir(run_dir) / f"{_PREFIX}{step:08d}"


def _replica_file(run_dir: Path, step: int, rank: int) -> Path:
    return step_dir(run_dir, step) / f"replica-{rank}.pt"


def _meta_file(run_dir: Path, step: int) -> Path:
    return checkpoint_dir(run_dir) / f"{_PREFIX}{step:08d}.json"


def save_replica(run_dir: Path, step: int, rank: int, state: dict[str, Any]) -> None:
    """Write one replica's state for ``step`` (call on every replica, then barrier, then :func:`commit`)."""
    atomic_write_with(_replica_file(run_dir, step, rank), lambda f: torch.save(state, f))


def _digest(path: Path) -> dict[str, Any]:
    h, size = hashlib.sha256(), 0
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            h.update(chunk)
            size += len(chunk)
    return {"bytes": size, "sha256": h.hexdigest()}


def commit(
    run_dir: Path,
    step: int,
    meta: dict[str, Any],
    *,
    keep: int = 2,
    extra: Sequence[str] = (),
    replicas: Sequence[int] | None = None,
    prune: bool = True,
) -> None:
    """Replica 0, after every replica saved ``step``: record the files' digests, make ``step`` the latest,
    and keep only the last ``keep`` steps. ``extra``: more files of the step's folder to record (by name).

    ``replicas``: the replicas whose files this folder holds, when each machine has a folder of its own
    (:mod:`diloco.train.run_folders`; recorded as ``"folder_replicas"``); default every one. ``prune=False``: keep
    the older steps (:func:`prune` deletes them once every folder has recorded this one)."""
    if keep < 1:
        raise ConfigError(f"keep={keep}: keep at least the checkpoint just written")
    n = int(meta.get("num_replicas", 1))
    here = range(n) if replicas is None else list(replicas)
    if replicas is not None:
        meta = {**meta, "folder_replicas": list(here)}
    if meta.get("format") == "dcp":  # sharded: every file every rank wrote, by its path in the step's folder
        root = step_dir(run_dir, step)
        files = {
            p.relative_to(root).as_posix(): _digest(p)
            for w in here
            for p in sorted((root / f"worker-{w}").rglob("*"))
            if p.is_file()
        }
    else:
        files = {f"replica-{r}.pt": _digest(_replica_file(run_dir, step, r)) for r in here}
    for name in extra:
        assert name not in files, f"{name} is a replica's file"
        files[name] = _digest(step_dir(run_dir, step) / name)
    body = {"step": step, **meta, "files": files}
    write_json(_meta_file(run_dir, step), body)
    write_json(checkpoint_dir(run_dir) / "latest.json", body)
    if prune:
        prune_steps(run_dir, step, keep=keep)


def prune_steps(run_dir: Path, step: int, *, keep: int) -> None:
    """Delete the steps before ``step`` beyond the last ``keep``: each step's record first (a step without its
    record is not resumable), then its folder."""
    for old in saved_steps(run_dir)[:-keep]:
        if old < step:
            _meta_file(run_dir, old).unlink(missing_ok=True)
            shutil.rmtree(step_dir(run_dir, old), ignore_errors=True)


def verify_replica(run_dir: Path, rank: int, step: int, meta: dict[str, Any]) -> None:
    """Check one replica's file against the size and SHA-256 in ``meta`` (or, without a record, load it)."""
    path = _replica_file(run_dir, step, rank)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} is missing (was the run written with fewer replicas?)")
    want = meta.get("files", {}).get(path.name)
    if want is None:  # written before digests were recorded
        load_replica(run_dir, rank, step)
        return
    got = _digest(path)
    if got != want:
        raise CheckpointError(
            f"checkpoint {path} is damaged ({got['bytes']} bytes whose SHA-256 differs from "
            f"the {want['bytes']} bytes written)"
        )


def discard_uncommitted(run_dir: Path, step: int) -> list[int]:
    """Delete the step folders after ``step`` (the one a resume starts from): writes a crash interrupted, or
    damaged ones skipped. Sharded checkpoints are written into a folder per worker by many processes: a
    folder must be empty before a run writes that step again. Returns the steps deleted."""
    gone = [s for s in saved_steps(run_dir) if s > step]
    for s in gone:
        _meta_file(run_dir, s).unlink(missing_ok=True)
        shutil.rmtree(step_dir(run_dir, s), ignore_errors=True)
    return gone


def verify_files(run_dir: Path, step: int, meta: dict[str, Any], *, names: Sequence[str] | None = None) -> None:
    """Check every file of a sharded (DCP) checkpoint against the size and SHA-256 in its record (``names``: only
    those files)."""
    root = step_dir(run_dir, step)
    files = meta.get("files") or {}
    if not files:
        raise CheckpointError(f"the record of {root} lists no files")
    for name, want in files.items():
        if names is not None and name not in names:
            continue
        path = root / name
        if not path.is_file():
            raise CheckpointError(f"checkpoint file {path} is missing")
        got = _digest(path)
        if got != want:
            raise CheckpointError(
                f"checkpoint file {path} is damaged ({got['bytes']} bytes whose SHA-256 differs "
                f"from the {want['bytes']} bytes written)"
            )


def saved_steps(run_dir: Path) -> list[int]:
    """Steps that have a checkpoint folder, oldest first (complete or not)."""
    root = checkpoint_dir(run_dir)
    steps = []
    for d in root.glob(f"{_PREFIX}*") if root.is_dir() else ():
        if not d.is_dir():
            continue
        try:
            steps.append(int(d.name[len(_PREFIX) :]))
        except ValueError:
            continue
    return sorted(steps)


def latest_meta(run_dir: Path) -> dict[str, Any]:
    """The metadata ``latest.json`` names (the newest committed checkpoint, not checked for damage)."""
    path = checkpoint_dir(run_dir) / "latest.json"
    if not path.exists():
        raise CheckpointError(
            f"no checkpoint in {run_dir} ({path} missing): nothing to resume; run without --resume to start afresh"
        )
    try:
        return read_json(path)
    except ValueError as exc:
        raise CheckpointError(
            f"{exc}; resume falls back to the newest readable step (see {checkpoint_dir(run_dir)})"
        ) from None


def load_replica(run_dir: Path, rank: int, step: int | None = None) -> dict[str, Any]:
    """One replica's state at ``step`` (default: the latest)."""
    step = latest_meta(run_dir)["step"] if step is None else step
    path = _replica_file(run_dir, step, rank)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} is missing (was the run written with fewer replicas?)")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        # Not `from exc`: torch's message advises weights_only=False, i.e. running code from a bad file.
        raise CheckpointError(
            f"checkpoint {path} is damaged or not a checkpoint ({_reason(exc)}); to resume from the checkpoint "
            f"before it, delete {step_dir(run_dir, step)} and {_meta_file(run_dir, step)}, or start afresh "
            f"with --overwrite"
        ) from None


def load_latest(run_dir: Path) -> dict[str, Any]:
    """The latest checkpoint of every replica: ``{"step", "config", ..., "replicas": [state, ...]}``."""
    meta = latest_meta(run_dir)
    n = int(meta.get("num_replicas", 1))
    return {**meta, "replicas": [load_replica(run_dir, r, meta["step"]) for r in range(n)]}


@dataclass(frozen=True)
class Resumable:
    """The checkpoint a resume starts from, and the newer ones skipped because they are damaged."""

    meta: dict[str, Any]
    skipped: tuple[str, ...]  # one line per skipped step: which file and why

    @property
    def step(self) -> int:
        return int(self.meta["step"])


def find_resumable(run_dir: Path, *, upto: int | None = None) -> Resumable:
    """The newest committed step whose meta and every replica file load, newest first (``upto``: no later
    than that step, as the workers' folders agree on one: :func:`~diloco.train.run_folders.agree_plan`).

    Each replica file is checked against the size and SHA-256 recorded when it was written.
    Raises :class:`CheckpointError` naming every damaged step when none is usable.
    """
    root = checkpoint_dir(run_dir)
    latest = root / "latest.json"
    if not root.is_dir() or not (latest.exists() or saved_steps(run_dir)):
        raise CheckpointError(
            f"no checkpoint in {run_dir} ({latest} missing): nothing to resume; run without --resume to start afresh"
        )
    committed = _committed_step(run_dir)
    skipped: list[str] = []
    for step in reversed(saved_steps(run_dir)):
        if committed is not None and step > committed:
            continue  # written after the last commit: an interrupted checkpoint, not a damaged one
        if upto is not None and step > upto:
            continue  # newer than another folder's newest
        try:
            meta = _step_meta(run_dir, step)
            if meta.get("format") == "dcp":
                verify_files(run_dir, step, meta)
            else:
                here = meta.get("folder_replicas", range(int(meta.get("num_replicas", 1))))  # this folder's
                for rank in here:
                    verify_replica(run_dir, rank, step, meta)
                replicas = {f"replica-{r}.pt" for r in here}
                verify_files(run_dir, step, meta, names=[f for f in meta.get("files", {}) if f not in replicas])
        except (CheckpointError, ValueError, KeyError, TypeError) as exc:
            skipped.append(f"step {step}: {exc}")
            continue
        return Resumable(meta, tuple(skipped))
    raise CheckpointError(
        f"no readable checkpoint in {root}:\n  "
        + "\n  ".join(skipped or ["(no complete step)"])
        + "\nnothing can be resumed: start afresh with --overwrite (deletes this run's results) "
        "or train into another --out"
    )


def _committed_step(run_dir: Path) -> int | None:
    try:
        return int(latest_meta(run_dir)["step"])
    except (CheckpointError, KeyError, TypeError, ValueError):
        return None  # latest.json damaged: every step folder is a candidate


def _step_meta(run_dir: Path, step: int) -> dict[str, Any]:
    path = _meta_file(run_dir, step)
    if path.exists():
        meta = read_json(path)
    else:  # written before per-step records existed: only the latest step has its metadata
        latest = latest_meta(run_dir)
        if int(latest["step"]) != step:
            raise CheckpointError(f"{path} is missing (the step was not committed)")
        meta = latest
    if not isinstance(meta, dict) or int(meta.get("step", -1)) != step:
        raise CheckpointError(f"{path} does not describe step {step}")
    return meta


def _reason(exc: BaseException) -> str:
    """Why torch.load failed, without its advice to retry with weights_only=False (that runs code)."""
    text = str(exc)
    if "weights_only" in text or "Weights only" in text:
        return "it holds objects other than tensors and plain containers; it is not loaded, as that could run code"
    lines = text.strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:200]}" if lines else type(exc).__name__


def checkpoint_errors(cfg: Any) -> list[str]:
    """What is wrong with a training config's checkpoint cadence and retention (each message names the value and
    the fix)."""
    from diloco.train.config import AUTO_CHECKPOINT_STEPS

    errors = []
    if cfg.checkpoint_every < -1:
        errors.append(
            f"checkpoint_every={cfg.checkpoint_every}: steps between checkpoints, 0 = only at the end, "
            f"-1 = auto (every {AUTO_CHECKPOINT_STEPS} steps, rounded up to an outer-sync boundary)"
        )
    if cfg.keep_checkpoints < 1:
        errors.append(f"keep_checkpoints={cfg.keep_checkpoints}: keep at least 1 (default 2)")
    return errors


__all__ = [
    "checkpoint_errors",
    "CheckpointError",
    "Resumable",
    "checkpoint_dir",
    "commit",
    "discard_uncommitted",
    "find_resumable",
    "latest_meta",
    "load_latest",
    "load_replica",
    "prune_steps",
    "save_replica",
    "saved_steps",
    "step_dir",
    "verify_files",
    "verify_replica",
]
