"""Where the processes of a torchrun job keep their files: one ``--out`` every worker shares, or one per host.

Every worker of a job passes the same ``--out``; on one machine, or on machines with a shared file system, it is
one folder, and the run writes it as it always has: every worker its own checkpoint file, the lead (worker 0's
first rank) the record of each step, ``config.json``, ``metrics.jsonl`` and ``summary.json``. Machines without a
shared file system each have a folder of their own under that name. :func:`find_folders` tells which, once per
start, by looking rather than by a setting: every worker's first rank writes an empty marker file with a random
name (new every start, so no file system can have cached its absence) into ``--out``, and after a barrier looks
for every worker's marker; the workers whose markers it sees share its folder. Then each marker is deleted.

In a folder of its own (not the lead's), its first worker (the *folder lead*) writes what that folder needs to
resume: ``config.json`` and ``tokenizer.json``, and the record of each checkpoint step listing only its own
workers' files (``"folder_replicas"``; see :mod:`diloco.train.checkpoint`). Its record is written after the same
barrier as the lead's, and a second barrier comes before any folder deletes its old steps, so that every folder
always holds the newest step recorded anywhere or the one before it. ``metrics.jsonl`` and ``summary.json`` stay
the lead's.

A start reads every folder: :func:`agree_plan` exchanges what each worker's folder says (start, resume at step s,
finished, or an error) and settles on one plan: the newest step every folder can resume, or an error naming the
worker, host and folder that cannot (e.g. a folder that holds no checkpoint while the others do). With one shared
folder every worker reads the same files and the plans agree at once: nothing changes.
"""

from __future__ import annotations

import json
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from diloco.comm.base import Communicator
from diloco.errors import ConfigError
from diloco.train.rundir import RunDirPlan

_SIZE = 4096  # bytes of one worker's value in an exchange (a JSON object of a few fields)
_MARKER = ".diloco-folder-"


@dataclass(frozen=True)
class Folder:
    """This process's ``--out`` as the job found it (:func:`find_folders`)."""

    shared: bool  # every worker writes into the lead's folder (as before: one machine, or a shared file system)
    lead: bool  # this process records the checkpoints of its folder (the lead, or a folder of its own's first)
    workers: tuple[int, ...]  # the workers whose files this folder holds


def exchange(comm: Communicator, intra: Communicator | None, value: dict[str, Any]) -> list[dict[str, Any]]:
    """Every worker's ``value`` (its first rank's), on every process: one broadcast per worker (not counted as the
    algorithm's traffic). ``value``: a JSON object of under 4 KiB."""
    data = json.dumps(value, sort_keys=True).encode()
    assert len(data) <= _SIZE, f"an exchanged value of {len(data)} bytes"
    mine = torch.zeros(_SIZE, dtype=torch.uint8)
    mine[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    if intra is not None:  # the worker's ranks hold its first rank's value (a column carries one rank's)
        intra.broadcast_([mine], src=0)
    out = []
    for worker in range(comm.world_size):
        buf = mine.clone() if worker == comm.rank else torch.zeros(_SIZE, dtype=torch.uint8)
        comm.broadcast_([buf], src=worker)
        raw = bytes(buf.tolist()).rstrip(b"\0")
        out.append(json.loads(raw))
    return out


def where(out_dir: Path) -> str:
    """``host:/path``, as messages name a worker's folder."""
    return f"{socket.gethostname()}:{Path(out_dir).resolve()}"


def find_folders(comm: Communicator, intra: Communicator | None, out_dir: Path, barrier: Callable[[], None]) -> Folder:
    """Which workers share this process's ``--out`` (see the module docstring); every process calls it, after the
    lead has set up its folder. ``barrier`` spans every process."""
    first = intra is None or intra.rank == 0
    tokens = [v["token"] for v in exchange(comm, intra, {"token": secrets.token_hex(8)})]
    marker = Path(out_dir) / f"{_MARKER}{tokens[comm.rank]}"
    if first:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
    barrier()
    seen = [w for w, t in enumerate(tokens) if (Path(out_dir) / f"{_MARKER}{t}").exists()] if first else []
    groups = [tuple(v["seen"]) for v in exchange(comm, intra, {"seen": seen})]  # every marker was looked for
    if first:
        marker.unlink(missing_ok=True)
    for w, group in enumerate(groups):
        if w not in group or any(groups[v] != group for v in group):
            raise ConfigError(
                f"--out {out_dir}: the workers see each other's files in it inconsistently (worker {w} sees the "
                f"files of workers {list(group)}; all: {[list(g) for g in groups]}); give every machine a folder "
                f"of its own, or one that all of them share"
            )
    mine = groups[comm.rank]
    return Folder(shared=len(groups[0]) == comm.world_size, lead=first and mine[0] == comm.rank, workers=mine)


def agree_plan(
    plan_at: Callable[[int | None], RunDirPlan],
    comm: Communicator,
    intra: Communicator | None,
    out_dir: Path,
) -> RunDirPlan:
    """One plan for every worker, each reading its own ``--out`` (see the module docstring). ``plan_at(bound)``: this
    process's plan, resuming no later than step ``bound`` (None: the newest); it may raise ConfigError."""
    bound = None
    here = where(out_dir)
    while True:
        try:
            plan = plan_at(bound)
            mine: dict[str, Any] = {"action": plan.action, "step": plan.start_step}
        except ConfigError as exc:
            plan, error, mine = None, exc, {"error": str(exc)[:3000]}
        every = exchange(comm, intra, {**mine, "where": here})
        if plan is None:
            raise error
        failed = [(w, v) for w, v in enumerate(every) if "error" in v]
        if failed:
            w, v = failed[0]
            raise ConfigError(f"worker {w}'s --out ({v['where']}) cannot be used: {v['error']}")
        kinds = {(v["action"], v["step"]) for v in every}
        if len(kinds) == 1:
            return plan
        if every[0]["action"] == "finished":  # the lead's folder holds the summary: the run is done
            return replace(plan, action="finished")
        starts = [w for w, v in enumerate(every) if v["action"] in ("new", "overwrite")]
        resumes = [v["step"] for v in every if v["action"] in ("resume", "finished")]
        if not resumes:  # every folder starts the run (some empty, some replaced)
            return plan
        if starts:
            w = starts[0]
            found = ", ".join(
                f"worker {u} ({v['where']}) step {v['step']}" for u, v in enumerate(every) if u not in starts
            )
            raise ConfigError(
                f"worker {w}'s --out ({every[w]['where']}) holds no checkpoint of this run, while the others do "
                f"({found}): its replica's state is not anywhere else, so the run cannot go on without it. Put that "
                f"folder back, or start the run afresh on every machine with --overwrite (deletes their runs)"
            )
        if not starts and len(set(resumes)) == 1:  # a folder says finished, the lead's not: resume it with the others
            return replace(plan, action="resume")
        if bound is not None and min(resumes) >= bound:  # every folder was asked for a step no later than bound
            raise ConfigError(
                "the workers' --out folders hold no checkpoint step in common ("
                + ", ".join(f"worker {u} ({v['where']}): step {v['step']}" for u, v in enumerate(every))
                + "); the run cannot resume: start it afresh with --overwrite on every machine"
            )
        bound = min(resumes)


__all__ = ["Folder", "agree_plan", "exchange", "find_folders", "where"]
