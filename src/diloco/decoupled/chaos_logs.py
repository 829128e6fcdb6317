"""What a faulty run's logs say about its faults (pure functions); the faults themselves are
:mod:`diloco.decoupled.chaos`.

The analysis reads the learners' step rows (one dict per step: ``learner``, ``incarnation``, ``step``,
``t`` wall time at the end of the step, ``dt`` its wall seconds, ``compute_s``), their ``joined`` rows (one per
process of a learner: ``t``, ``incarnation``, ``pid``, ``start_step``; :class:`diloco.decoupled.trainer.LearnerLog`
writes both, :func:`run_rows` reads a run's) and the syncer's merge records (``at`` wall time, ``learners``,
``weights``):

* :func:`survivor_stalls`: for each kill, each other learner's longest step in the window after it,
  as a multiple of its median step before the kill, and the share of its steps it kept;
* :func:`rejoin_seconds`: from a killed learner's restart (its new incarnation joining) to the first
  merge it takes part in with a weight above zero;
* :func:`goodput`: useful learner-seconds / allocated learner-seconds, where useful is the compute of
  steps whose work reached the syncer (the steps of a killed incarnation after its last received
  reply are lost), and allocated is M x the run's wall time.

:func:`committed_steps`: for replicas that commit their work at syncs and heal from a peer (torchft), the
steps whose work reached the global model.

A run that recovers by restarting every worker from its last checkpoint (data-parallel under TorchElastic)
logs the same step rows, with ``incarnation`` the restart count, and ``joined`` rows when a new incarnation
starts its first step; :func:`summarize_restarts` gives the same figures for it:

* :func:`final_steps`: the final trajectory, each worker's last execution of each step (a step trained
  again after a restart from an older checkpoint counts once: the executions it superseded are lost);
* :func:`restart_stalls`: as :func:`survivor_stalls`, but a step's length is the time since the worker's
  previous step ended in any incarnation (the restart is one long step of every survivor), and the steps
  kept in the window are the final executions that ended in it;
* per kill: seconds to the killed worker's new incarnation starting, from that start to the end of its
  first kept step, the steps redone (reached before the kill, beyond the checkpoint resumed from) and the
  seconds until the run trains past the step it had reached at the kill.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from diloco.errors import ConfigError


def step_row(
    *,
    learner: int,
    incarnation: int,
    step: int,
    dt: float,
    compute_s: float,
    wait_s: float,
    loss: float,
    blocked_s: float = 0.0,
    cpu_s: float | None = None,
    tokens: int,
    staleness: int,
    synced: Sequence[int],
) -> dict[str, Any]:
    """One learner step as its log holds it (``learner-<m>.jsonl``, written by the trainer's
    :class:`~diloco.decoupled.trainer.LearnerLog` for ``diloco train --method decoupled`` and ``diloco chaos``): ``t``
    wall time at its end, ``dt`` its wall seconds, split so that a stall has a name: ``compute_s`` (forward,
    backward, optimizer; padded to ``step_time`` where the config pads), ``wait_s`` seconds waited for replies,
    ``blocked_s`` seconds in the other calls to the syncer (sends, polls, holds: near 0 unless the syncer is
    down, restarting or partitioned away), ``other_s`` the rest (evaluation, checkpoints, logging); ``cpu_s`` the
    process' CPU seconds in the step (well below its compute seconds times its threads when other processes took
    the cores: a step slowed by a loaded machine, not by the syncer); then the loss, tokens, ``staleness`` (the
    most steps since the learner last received any of its fragments) and the fragments whose reply it applied
    after it (``synced``)."""
    return {
        "learner": learner,
        "incarnation": incarnation,
        "step": step,
        "t": time.time(),
        "dt": dt,
        "compute_s": compute_s,
        "wait_s": wait_s,
        "blocked_s": blocked_s,
        "other_s": max(0.0, dt - compute_s - wait_s - blocked_s),
        "cpu_s": cpu_s,
        "loss": loss,
        "tokens": tokens,
        "staleness": staleness,
        "synced": list(synced),
    }


def read_learner_log(path: Path | str) -> list[dict[str, Any]]:
    """A learner's rows; a line cut short by a SIGKILL mid-write (not JSON) is skipped."""
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def learner_log_path(run_dir: Path | str, learner: int) -> Path:
    """Where learner ``learner``'s rows are: ``learner-<m>/learner-<m>.jsonl`` in a ``diloco chaos`` run (each
    learner a site job with its own folder), ``learner-<m>.jsonl`` in a ``diloco train`` run."""
    run_dir = Path(run_dir)
    site = run_dir / f"learner-{learner}" / f"learner-{learner}.jsonl"
    return site if site.exists() or (run_dir / f"learner-{learner}").is_dir() else run_dir / f"learner-{learner}.jsonl"


def run_rows(run_dir: Path | str, num_learners: int) -> list[dict[str, Any]]:
    """Every learner's rows of the run in ``run_dir`` (:func:`learner_log_path`), learner by learner."""
    return [r for m in range(num_learners) for r in read_learner_log(learner_log_path(run_dir, m))]


def _by_learner(rows: Sequence[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        if "step" in r:
            out.setdefault(int(r["learner"]), []).append(r)
    for v in out.values():
        v.sort(key=lambda r: r["t"])
    return out


@dataclass
class Stall:
    """One survivor around one kill: its longest step after the kill / its median step before it, and the
    steps it made in ``window_s`` after the kill / the steps in ``window_s`` before it."""

    learner: int
    kill_at: float
    worst_step_ratio: float
    steps_kept: float


def survivor_stalls(
    rows: Sequence[dict[str, Any]], *, kill_at: float, killed: int, window_s: float, until: float | None = None
) -> list[Stall]:
    """Each learner other than ``killed`` around a kill at wall time ``kill_at`` (see the module docstring);
    ``until``: end the after-window there if earlier (e.g. at the next fault)."""
    end = kill_at + window_s if until is None else min(kill_at + window_s, until)
    out = []
    for m, steps in sorted(_by_learner(rows).items()):
        if m == killed:
            continue
        before = [r for r in steps if kill_at - window_s <= r["t"] < kill_at]
        last = min(end, steps[-1]["t"])  # a learner that finished early: its window ends with its last step
        after = [r for r in steps if kill_at <= r["t"] - r["dt"] and r["t"] <= last]
        if not before or not after or last <= kill_at:
            continue
        typical = statistics.median(r["dt"] for r in before)
        before_s = kill_at - max(kill_at - window_s, before[0]["t"] - before[0]["dt"])  # from its first step in it
        kept = (len(after) / (last - kill_at)) / (len(before) / before_s)
        out.append(Stall(m, kill_at, max(r["dt"] for r in after) / typical, kept))
    return out


def rejoin_seconds(
    rows: Sequence[dict[str, Any]], merges: Sequence[dict[str, Any]], *, learner: int, incarnation: int
) -> float | None:
    """Seconds from ``learner``'s ``incarnation`` joining to the first merge it takes part in with weight > 0
    (None if it never does)."""
    joined = [
        r["t"]
        for r in rows
        if r.get("event") == "joined" and r["learner"] == learner and r["incarnation"] == incarnation
    ]
    if not joined:
        return None
    t0 = joined[0]
    for rec in sorted(merges, key=lambda r: r["at"]):
        if rec["at"] >= t0 and any(
            m == learner and w > 0 for m, w in zip(rec["learners"], rec["weights"], strict=True)
        ):
            return rec["at"] - t0
    return None


@dataclass
class Goodput:
    useful_s: float
    allocated_s: float
    lost_steps: int
    value: float = field(init=False)

    def __post_init__(self) -> None:
        self.value = self.useful_s / self.allocated_s if self.allocated_s > 0 else 0.0


def kept_steps(rows: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """The step rows whose work reached (or, for a live learner, will reach) the syncer, and how many were lost:
    a killed incarnation's steps after the last one at which it received a reply."""
    incarnations: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for r in rows:
        if "step" in r:
            incarnations.setdefault((int(r["learner"]), int(r["incarnation"])), []).append(r)
    last = {m: max(i for mm, i in incarnations if mm == m) for m, _ in incarnations}
    kept, lost = [], 0
    for (m, inc), steps in incarnations.items():
        steps.sort(key=lambda r: r["step"])
        if inc < last[m]:  # killed: the steps after its last received reply never reached the syncer
            synced = [r["step"] for r in steps if r.get("synced")]
            keep_until = synced[-1] if synced else 0
            lost += sum(1 for r in steps if r["step"] > keep_until)
            steps = [r for r in steps if r["step"] <= keep_until]
        kept += steps
    return kept, lost


def goodput(rows: Sequence[dict[str, Any]], *, num_learners: int, wall_s: float) -> Goodput:
    """Useful learner-seconds / allocated learner-seconds (see the module docstring)."""
    kept, lost = kept_steps(rows)
    return Goodput(sum(float(r["compute_s"]) for r in kept), num_learners * wall_s, lost)


def wait_shares(rows: Sequence[dict[str, Any]], *, num_learners: int) -> list[float | None]:
    """Each learner's share of its step time spent waiting for replies: sum(wait_s) / sum(dt) over its step rows
    (every incarnation; None for a learner with no step)."""
    out: list[float | None] = []
    for m in range(num_learners):
        steps = [r for r in rows if r.get("learner") == m and "step" in r and "dt" in r]
        total = sum(float(r["dt"]) for r in steps)
        out.append(sum(float(r.get("wait_s", 0.0)) for r in steps) / total if total > 0 else None)
    return out


def summarize(
    rows: Sequence[dict[str, Any]],
    merges: Sequence[dict[str, Any]],
    faults: Sequence[dict[str, Any]],
    *,
    num_learners: int,
    wall_s: float,
    window_s: float = 10.0,
) -> dict[str, Any]:
    """What a faulty run comes to: goodput, and per fault what it cost (plain numbers, for JSON).

    Per learner kill: the survivors' worst step / typical step and the share of steps they kept in
    ``window_s`` after it (up to the next fault), seconds from the kill to the restart joining, and from
    joining to its first merge with weight > 0. Per syncer kill: seconds down, merges restored and the learners'
    worst step / typical step in ``window_s`` after it. ``wait_share``: each learner's share of its step time
    spent waiting for replies."""
    g = goodput(rows, num_learners=num_learners, wall_s=wall_s)
    out: dict[str, Any] = {
        "goodput": g.value,
        "useful_learner_s": g.useful_s,
        "allocated_learner_s": g.allocated_s,
        "lost_steps": g.lost_steps,
        "merges": len(merges),
        "wait_share": wait_shares(rows, num_learners=num_learners),
        "learner_kills": [],
        "syncer_kills": [],
    }
    times = sorted(f["at"] for f in faults)
    incarnation: dict[int, int] = {}
    for f in faults:
        later = [t for t in times if t > f["at"]]
        if f["target"] == "syncer":  # every learner is a survivor: its longest step after the kill / its typical
            stalls = survivor_stalls(
                rows, kill_at=f["at"], killed=-1, window_s=window_s, until=later[0] if later else None
            )
            out["syncer_kills"].append(
                {
                    "down_s": f["back_at"] - f["at"],
                    "merges_before": f["merges_before"],
                    "restored_merges": f["restored_merges"],
                    "worst_step_ratio": max((s.worst_step_ratio for s in stalls), default=None),
                }
            )
            continue
        m = int(f["index"])
        incarnation[m] = incarnation.get(m, 0) + 1
        stalls = survivor_stalls(rows, kill_at=f["at"], killed=m, window_s=window_s, until=later[0] if later else None)
        joined = sorted(
            r["t"]
            for r in rows
            if r.get("event") == "joined" and r["learner"] == m and r["incarnation"] == incarnation[m]
        )
        out["learner_kills"].append(
            {
                "learner": m,
                "worst_step_ratio": max((s.worst_step_ratio for s in stalls), default=None),
                "steps_kept": min((s.steps_kept for s in stalls), default=None),
                "restart_s": joined[0] - f["at"] if joined else None,
                "rejoin_s": rejoin_seconds(rows, merges, learner=m, incarnation=incarnation[m]),
            }
        )
    return out


def committed_steps(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """For replicas that commit their work at syncs (torchft's DiLoCo): the step rows whose work reached the
    global model. Each process (``learner``, ``incarnation``) logs its steps and ``sync`` event rows
    (``committed``) and ``healed`` event rows in time order; a step counts when the next sync of its process
    committed and no healing came between them (a failed commit loses its round; healing overwrites the
    process's own steps with a peer's state)."""
    out: list[dict[str, Any]] = []
    by_process: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for r in rows:
        by_process.setdefault((int(r["learner"]), int(r["incarnation"])), []).append(r)
    for process in by_process.values():
        pending: list[dict[str, Any]] = []
        for r in sorted(process, key=lambda r: r["t"]):
            if "step" in r:
                pending.append(r)
            elif r.get("event") in ("healed", "sync"):
                if r.get("event") == "sync" and r["committed"]:
                    out += pending
                pending = []
    return out


# -- runs that restart every worker from a checkpoint ---------------------------------------------------------------
def final_steps(rows: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """Each worker's last execution of each step (in time order per worker), and how many executions
    were superseded by a later one (work lost to a restart from an older checkpoint)."""
    last: dict[tuple[int, int], dict[str, Any]] = {}
    executions = 0
    for r in rows:
        if "step" not in r:
            continue
        executions += 1
        key = (int(r["learner"]), int(r["step"]))
        if key not in last or (r["incarnation"], r["t"]) > (last[key]["incarnation"], last[key]["t"]):
            last[key] = r
    kept = sorted(last.values(), key=lambda r: (int(r["learner"]), r["t"]))
    return kept, executions - len(kept)


def _gaps(steps: Sequence[dict[str, Any]]) -> list[float]:
    """Seconds from each step row's predecessor ending to its own end (the first row: its own ``dt``)."""
    return [float(r["dt"]) if i == 0 else r["t"] - steps[i - 1]["t"] for i, r in enumerate(steps)]


def restart_stalls(
    rows: Sequence[dict[str, Any]], *, kill_at: float, killed: int, window_s: float, until: float | None = None
) -> list[Stall]:
    """Each worker other than ``killed`` around a kill at ``kill_at`` after which every worker restarts (see the
    module docstring). The worst step is the longest in the window, or the first step after the kill if it
    ended later (the window then kept nothing); ``until`` ends the window there if earlier."""
    if window_s <= 0:
        raise ConfigError(f"window_s={window_s}: give the seconds after a kill to look at, > 0")
    end = kill_at + window_s if until is None else min(kill_at + window_s, until)
    final = {id(r) for r in final_steps(rows)[0]}
    out = []
    for m, steps in sorted(_by_learner(rows).items()):
        if m == killed or steps[-1]["t"] <= kill_at:
            continue
        gaps = _gaps(steps)
        before = [i for i, r in enumerate(steps) if kill_at - window_s <= r["t"] < kill_at]
        if not before:
            continue
        last = min(end, steps[-1]["t"])
        after = [i for i, r in enumerate(steps) if kill_at <= r["t"] <= last]
        first = next(i for i, r in enumerate(steps) if r["t"] >= kill_at)
        typical = statistics.median(gaps[i] for i in before)
        before_s = kill_at - max(kill_at - window_s, steps[before[0]]["t"] - gaps[before[0]])
        kept = (
            sum(1 for i in after if id(steps[i]) in final) / (last - kill_at) / (len(before) / before_s)
            if last > kill_at
            else 0.0
        )
        out.append(Stall(m, kill_at, max(gaps[i] for i in {first, *after}) / typical, kept))
    return out


def restart_kill(rows: Sequence[dict[str, Any]], *, kill_at: float, killed: int) -> dict[str, Any]:
    """What one kill cost a run that restarts from checkpoints: ``restart_s`` (the kill to the killed worker's
    next ``joined`` row), ``rejoin_s`` (from there to the end of its first step in the final trajectory),
    ``redone_steps`` (the highest step the incarnation running at the kill finished, minus the step the restart
    resumed from) and ``caught_up_s`` (the kill to the first step beyond that one). None where it never happened."""
    final = {id(r) for r in final_steps(rows)[0]}
    joined = sorted(
        r["t"] for r in rows if r.get("event") == "joined" and int(r["learner"]) == killed and r["t"] >= kill_at
    )
    # the incarnation running at the kill: its highest step (a survivor may log the step it shared with the killed
    # worker just after the kill)
    before = [r for r in rows if "step" in r and r["t"] < kill_at]
    running = max(before, key=lambda r: r["t"])["incarnation"] if before else None
    reached = max((int(r["step"]) for r in rows if "step" in r and r["incarnation"] == running), default=0)
    out: dict[str, Any] = {
        "learner": killed,
        "restart_s": None,
        "rejoin_s": None,
        "redone_steps": None,
        "caught_up_s": None,
    }
    if joined:
        out["restart_s"] = joined[0] - kill_at
        mine = sorted(
            (r for r in rows if "step" in r and int(r["learner"]) == killed and r["t"] > joined[0]),
            key=lambda r: r["t"],
        )
        kept = [r for r in mine if id(r) in final]
        if kept:
            out["rejoin_s"] = kept[0]["t"] - joined[0]
        if mine:
            out["redone_steps"] = reached - (int(mine[0]["step"]) - 1)
    beyond = [r["t"] for r in rows if "step" in r and r["t"] >= kill_at and int(r["step"]) > reached]
    if beyond:
        out["caught_up_s"] = min(beyond) - kill_at
    return out


def summarize_restarts(
    rows: Sequence[dict[str, Any]],
    faults: Sequence[dict[str, Any]],
    *,
    num_workers: int,
    wall_s: float,
    window_s: float = 10.0,
) -> dict[str, Any]:
    """:func:`summarize`'s figures for a run that recovers by restarting every worker from its last checkpoint:
    goodput counts the compute of the final trajectory (:func:`final_steps`), ``lost_steps`` the superseded
    executions; per learner kill the survivors' worst step ÷ typical, steps kept (:func:`restart_stalls`) and
    :func:`restart_kill`'s figures."""
    if num_workers < 1 or wall_s <= 0:
        raise ConfigError(f"num_workers={num_workers}, wall_s={wall_s}: give at least one worker and a wall time > 0")
    kept, lost = final_steps(rows)
    g = Goodput(sum(float(r["compute_s"]) for r in kept), num_workers * wall_s, lost)
    out: dict[str, Any] = {
        "goodput": g.value,
        "useful_learner_s": g.useful_s,
        "allocated_learner_s": g.allocated_s,
        "lost_steps": lost,
        "learner_kills": [],
    }
    times = sorted(f["at"] for f in faults)
    for f in sorted(faults, key=lambda f: f["at"]):
        if f["target"] != "learner":
            raise ConfigError(f"fault {f}: a run restarted from checkpoints has no syncer; give learner kills")
        later = [t for t in times if t > f["at"]]
        stalls = restart_stalls(
            rows, kill_at=f["at"], killed=int(f["index"]), window_s=window_s, until=later[0] if later else None
        )
        out["learner_kills"].append(
            {
                "worst_step_ratio": max((s.worst_step_ratio for s in stalls), default=None),
                "steps_kept": min((s.steps_kept for s in stalls), default=None),
                **restart_kill(rows, kill_at=f["at"], killed=int(f["index"])),
            }
        )
    return out


__all__ = [
    "Goodput",
    "Stall",
    "committed_steps",
    "final_steps",
    "goodput",
    "kept_steps",
    "learner_log_path",
    "read_learner_log",
    "rejoin_seconds",
    "restart_kill",
    "restart_stalls",
    "run_rows",
    "step_row",
    "summarize",
    "summarize_restarts",
    "survivor_stalls",
    "wait_shares",
]
