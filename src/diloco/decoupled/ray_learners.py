"""A decoupled run under a fault schedule: each learner a Ray actor running the trainer as a site job.

::

    cfg = TrainConfig.from_dict({**load_preset("tiny")["base"], "method": "decoupled", "replicas": 3, "quorum": 1})
    result = run_on_ray(cfg, out_dir="runs/chaos", cache_dir=cache, chaos=Chaos(kills=((5, 1),), syncer_kills=(12,)))

What runs where: the syncer is a named async actor (:mod:`.ray_transport`) that saves every merge to
``out_dir/syncer`` and is restarted from there if it dies; with ``syncer_shards`` S > 1, S such actors
(:mod:`.ray_shards`), shard s saving to ``out_dir/syncer/shard-<s>``, and the i-th syncer kill of the schedule
kills shard i mod S. Learner m is an actor of its own (a process; on a
cluster, wherever Ray places it) that runs the trainer's one loop on the config with ``learner=m`` and
``syncer=NAME@ray:ADDRESS`` (a site job inside the cluster, :class:`~diloco.train.trainer.Trainer`) in ``out_dir/learner-m``: its
config, metrics, checkpoints, summary and ``learner-m.jsonl`` (a ``joined`` row per process, a row per step).
Every trainer setting holds (inner optimizer, bf16, compile, z-loss, gradient clipping, lr schedule,
evaluation, the data sampler): this module adds only the faults, through the trainer's hooks
(:class:`ChaosHooks`, a :class:`~diloco.train.trainer.TrainerCallback`): the start (every learner has joined,
then the clock starts), corrupted reports, and the stop (``max_seconds`` after the start, or a ``STOP`` file
in ``out_dir``). Step padding and stragglers are the config's ``step_time`` and ``slowdown``
(:mod:`diloco.train.pace`).

A learner that dies (SIGKILL) is restarted by Ray (``max_restarts=-1``); the new process waits
``Chaos.downtime_s`` and runs the trainer again with ``--resume auto``: from its newest checkpoint if it has
one, else from the start; either way it takes the syncer's current parameters on joining and weighs nothing
until it has done new work. The driver carries out the :class:`~diloco.decoupled.chaos.Chaos` schedule with
SIGKILL (a learner's pid is in its newest ``joined`` row) and writes ``merges.jsonl``, ``chaos.json`` and
``summary.json`` at the end. On a cluster ``out_dir`` must be a folder every node shares.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import ray
import torch

from diloco.decoupled.chaos import Chaos, Event
from diloco.decoupled.chaos_logs import kept_steps, learner_log_path, read_learner_log, run_rows, summarize
from diloco.decoupled.ray_shards import RayShards
from diloco.decoupled.ray_transport import DEFAULT_NAMESPACE
from diloco.errors import ConfigError
from diloco.files import write_json
from diloco.train.trainer import TrainerCallback

#: ``stop_when(rows, merges, faults)``: the learners' log rows, the merges so far and the faults carried out.
StopWhen = Callable[[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]], bool]
#: How long a learner waits for the driver's start (every learner joined) before it gives up.
START_TIMEOUT_S = 600.0


class ChaosHooks(TrainerCallback):
    """One learner's faults, as trainer hooks: waits for the run's start (the ``START`` file the driver writes
    in ``run_dir`` once every learner has joined), sends through a
    :class:`~diloco.decoupled.corrupt.CorruptingChannel` inside its ``corrupt`` windows (seconds after the
    start), and stops ``max_seconds`` after the start or once ``run_dir/STOP`` exists."""

    def __init__(self, *, run_dir: str, corrupt: tuple = (), seed: int = 0, max_seconds: float = 3600.0) -> None:
        self.run_dir, self.corrupt, self.seed, self.max_seconds = Path(run_dir), tuple(corrupt), seed, max_seconds
        self.stop_at = float("inf")
        self.algo: Any = None

    def started_at(self) -> float:
        """The run's second 0 (written by the driver), waited for."""
        start, deadline = self.run_dir / "START", time.time() + START_TIMEOUT_S
        while not start.exists():
            if time.time() > deadline:
                raise TimeoutError(f"no {start} {START_TIMEOUT_S:.0f} s after this learner joined: is the driver gone?")
            time.sleep(0.02)
        return float(json.loads(start.read_text())["started_at"])

    def on_replica_start(self, algo: Any, *, replica: int, step: int) -> None:
        started = self.started_at()
        time.sleep(max(0.0, started - time.time()))
        self.stop_at = started + self.max_seconds
        if self.corrupt:
            from diloco.decoupled.corrupt import CorruptingChannel

            algo.channel = CorruptingChannel(
                algo.channel,
                windows=self.corrupt,
                start_at=started,
                sizes=[f.numel for f in algo.fragments],
                codec=algo.codec,
                seed=self.seed * 1000 + replica,
            )
        self.algo = algo

    def should_stop(self, step: int, *, replica: int) -> bool:
        return time.time() >= self.stop_at or (self.run_dir / "STOP").exists()


@ray.remote(max_restarts=-1, max_task_retries=-1, num_cpus=0)
class LearnerActor:
    """One learner (a process of its own) running the trainer as a site job in ``out_dir``. Restarted by Ray when
    it dies; ``run`` is then retried on the new process, which waits ``downtime_s`` and resumes (``reuse``)."""

    def __init__(self, cfg: dict[str, Any], out_dir: str, cache_dir: str, downtime_s: float, hooks: ChaosHooks):
        self.cfg, self.out_dir, self.cache_dir, self.downtime_s, self.hooks = cfg, out_dir, cache_dir, downtime_s, hooks
        self.restarted = ray.get_runtime_context().was_current_actor_reconstructed

    def run(self) -> dict[str, Any]:
        from diloco.train.config import TrainConfig
        from diloco.train.trainer import Trainer

        if self.restarted and self.downtime_s > 0:
            time.sleep(self.downtime_s)
        cfg = TrainConfig.from_dict(self.cfg)
        trainer = Trainer(
            cfg, Path(self.out_dir), cache_dir=Path(self.cache_dir), progress=False, callbacks=[self.hooks]
        )
        result = trainer.run(reuse=True)  # `--resume auto`: the newest checkpoint, else from the start
        algo = self.hooks.algo
        return {
            "learner": cfg.learner,
            "incarnation": None if algo is None else algo.incarnation,
            "steps": result.steps,
            "final_eval_loss": result.to_dict()["final_eval_loss"],
            "resent": getattr(getattr(algo, "channel", None), "resent", 0),
            "corrupted": getattr(getattr(algo, "channel", None), "corrupted", 0),
        }


@dataclass
class RayRunResult:
    """What :func:`run_on_ray` leaves: the syncer's global parameters, merge rows, learner rows and faults."""

    global_parameters: dict[str, torch.Tensor]
    eval_loss: float | None
    merges: list[dict[str, Any]]
    rows: list[dict[str, Any]]
    faults: list[dict[str, Any]]
    started_at: float
    wall_s: float
    learners: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)  # diloco.decoupled.chaos_logs.summarize, and the eval loss


def _kill(pid: int | None) -> int | None:
    if pid is not None:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pid


def _learner_pid(out: Path, m: int) -> int | None:
    """The pid in learner ``m``'s newest ``joined`` row (the process training now, or the last one that did)."""
    joined = [r for r in read_learner_log(learner_log_path(out, m)) if r.get("event") == "joined"]
    return int(joined[-1]["pid"]) if joined else None


def learner_configs(cfg: Any, *, chaos: Chaos, name: str, address: str) -> list[dict[str, Any]]:
    """Each learner's site-job config: ``cfg`` with ``learner=m``, ``syncer=NAME@ray:ADDRESS``, the chaos slow-downs
    as ``slowdown`` and (``threads=0``, auto) one torch thread per learner process."""
    base = cfg.to_dict()
    if chaos.slowdown:
        factors = ",".join(f"{f:g}" for f in chaos.slowdown)
        if cfg.slowdown and tuple(cfg.slowdown_factors) != tuple(chaos.slowdown):
            raise ConfigError(
                f"slowdown={cfg.slowdown!r} and chaos slowdown {factors}: give the stragglers once (--slowdown or "
                f"--set slowdown=...)"
            )
        base["slowdown"] = factors
    base["threads"] = cfg.threads or 1  # M learner processes share the machine
    # "ray:": inside the syncer's cluster the learners reach the actor through Ray (a site's address is gRPC's)
    return [{**base, "learner": m, "syncer": f"{name}@ray:{address}"} for m in range(cfg.replicas)]


def run_on_ray(
    cfg: Any,
    *,
    out_dir: Path | str,
    cache_dir: Path | str,
    chaos: Chaos | None = None,
    max_seconds: float = 3600.0,
    total_tokens: int = 0,
    start_delay_s: float = 0.2,
    stop_when: StopWhen | None = None,
) -> RayRunResult:
    """Run the config's ``replicas`` learners as Ray actors (site jobs of the trainer) and its syncer as a
    checkpointed actor, carrying out ``chaos``; see the module docstring. Ray must be initialised (the
    driver's cluster is the learners'). ``out_dir`` must be new or empty. The schedule's time 0 comes
    ``start_delay_s`` after every learner has joined; learners stop at ``steps``, ``max_seconds`` after the
    start, or (``total_tokens`` > 0) once the learners together have trained that many tokens that reached the
    syncer (the driver leaves a ``STOP`` file in ``out_dir``), or once ``stop_when(rows, merges, faults)`` holds
    after the last fault was carried out (an event rather than the clock: ``max_seconds`` is then a deadline).
    The eval loss is the threads run's: the syncer's
    final parameters on the config's evaluation batches."""
    from diloco.decoupled.ray_syncers import syncers_for_ray
    from diloco.train.evaluation import evaluate_parameters
    from diloco.train.inputs import prepare_inputs

    chaos = chaos or Chaos()
    M = cfg.replicas
    chaos.check(M)
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"out_dir {out} is not empty: give a new folder (nothing in it is overwritten)")
    inputs = prepare_inputs(cfg, cache_dir)  # the data cache, built once here before the learners read it
    out.mkdir(parents=True, exist_ok=True)
    name = f"diloco-syncer-{os.getpid()}-{time.monotonic_ns()}"
    syncers, gpus = syncers_for_ray(cfg, inputs.model, inputs.fragments)
    shards = RayShards.start(
        syncers, name=name, namespace=DEFAULT_NAMESPACE, checkpoint_dir=str(out / "syncer"), num_gpus=gpus
    )
    for s, pid in enumerate(shards.pids()):
        (out / _pid_file(s, shards.num_shards)).write_text(str(pid))
    address = ray.get_runtime_context().gcs_address
    configs = learner_configs(cfg, chaos=chaos, name=name, address=address)
    actors = [
        LearnerActor.remote(
            configs[m],
            str(out / f"learner-{m}"),
            str(cache_dir),
            chaos.downtime_s,
            ChaosHooks(run_dir=str(out), corrupt=chaos.corrupt_windows(m), seed=cfg.seed, max_seconds=max_seconds),
        )
        for m in range(M)
    ]
    runs = [a.run.remote() for a in actors]
    try:
        started = _start_when_joined(out, M, runs, start_delay_s)
        faults, wall = _carry_out(
            chaos, out, shards, runs, started, max_seconds=max_seconds, total_tokens=total_tokens, stop_when=stop_when
        )
        learners = ray.get(runs)
        merges = [r.as_row() for r in shards.records()]
        params, lease = shards.global_named_parameters(), shards.lease_summary()
    finally:
        for a in actors:
            ray.kill(a, no_restart=True)
        shards.kill()
    rows = run_rows(out, M)
    (out / "merges.jsonl").write_text("".join(json.dumps(r) + "\n" for r in merges))
    write_json(
        out / "chaos.json",
        {"chaos": asdict(chaos), "faults": faults, "started_at": started, "wall_s": wall, "learners": learners},
    )
    loss = evaluate_parameters(inputs.model, params, inputs.val_batches, bf16=cfg.bf16, device=torch.device("cpu"))
    summary = {
        "eval_loss": loss,
        "wall_s": wall,
        **summarize(rows, merges, faults, num_learners=M, wall_s=wall),
        "corrupted_reports": sum(r.get("corrupted", 0) for r in learners),
        "guard_events": [e for r in merges for e in r.get("guard", ())],
        "learner_lease": lease,
    }
    write_json(out / "summary.json", summary)
    return RayRunResult(params, loss, merges, rows, faults, started, wall, learners, summary)


def _start_when_joined(out: Path, M: int, runs: list, delay_s: float, timeout_s: float = START_TIMEOUT_S) -> float:
    """Once every learner has built its model and joined (its ``joined`` row), the start: now + ``delay_s``, written
    to ``out/START`` for the learners' :class:`ChaosHooks`."""
    deadline = time.time() + timeout_s
    while not all(
        any(r.get("event") == "joined" for r in read_learner_log(learner_log_path(out, m))) for m in range(M)
    ):
        done, _ = ray.wait(runs, num_returns=len(runs), timeout=0.05)
        for ref in done:  # a learner that ended before the start failed: its error, now
            ray.get(ref)
        if time.time() > deadline:
            raise TimeoutError(f"learners not joined {timeout_s:.0f} s after they were started; see {out}")
    started = time.time() + delay_s
    write_json(out / "START", {"started_at": started})
    return started


def _carry_out(
    chaos: Chaos,
    out: Path,
    shards: RayShards,
    runs: list,
    started: float,
    *,
    max_seconds: float,
    total_tokens: int,
    stop_when: StopWhen | None = None,
) -> tuple[list[dict[str, Any]], float]:
    """Carry out the faults that fall due and watch the token budget (and ``stop_when``, once every fault is carried
    out) until every learner is done; the faults as carried out and the wall seconds from the start."""
    M = len(runs)
    events = chaos.events(num_learners=M, duration_s=max_seconds)
    faults, pending, deadline = [], list(runs), started + max_seconds + 300
    while pending:
        while events and started + events[0].at <= time.time():
            ev = events.pop(0)
            shard = sum(f["target"] == "syncer" for f in faults) % shards.num_shards  # the i-th kill: shard i mod S
            faults.append(_fault(ev, out, shards.handles[shard], shard=shard, num_shards=shards.num_shards))
        if total_tokens and not (out / "STOP").exists() and _tokens_kept(out, M) >= total_tokens:
            (out / "STOP").write_text(f"{total_tokens} tokens trained\n")
        if stop_when is not None and not events and not (out / "STOP").exists():
            if stop_when(run_rows(out, M), [r.as_row() for r in shards.records()], faults):
                (out / "STOP").write_text("the awaited event happened\n")
        nxt = started + events[0].at - time.time() if events else 1.0
        poll = 0.25 if total_tokens or stop_when is not None else 1.0
        _, pending = ray.wait(pending, num_returns=len(pending), timeout=max(0.01, min(nxt, poll)))
        if time.time() > deadline:
            raise TimeoutError(f"learners still running {max_seconds + 300:.0f} s after the start; see {out}")
    return faults, time.time() - started


def _tokens_kept(out: Path, num_learners: int) -> int:
    return int(sum(r["tokens"] for r in kept_steps(run_rows(out, num_learners))[0]))


def _pid_file(shard: int, num_shards: int) -> str:
    """The file holding the pid of the syncer's (shard's) actor process."""
    return "syncer.pid" if num_shards == 1 else f"syncer-{shard}.pid"


def _fault(ev: Event, out: Path, handle: Any, *, shard: int = 0, num_shards: int = 1) -> dict[str, Any]:
    """Carry out one event (SIGKILL); for the syncer (its shard ``shard``, whose actor is ``handle``), note how many
    merges it had just before."""
    row: dict[str, Any] = {"at": time.time(), "target": ev.target, "index": ev.index}
    if ev.target == "syncer":
        pid_file = out / _pid_file(shard, num_shards)
        row["shard"] = shard
        row["merges_before"] = len(ray.get(handle.records.remote()))
        row["pid"] = _kill(int(pid_file.read_text()))
        row["killed_at"] = time.time()
        pid_file.write_text(str(ray.get(handle.pid.remote())))  # the restarted actor's
        row["restored_merges"] = ray.get(handle.restored.remote())
        row["back_at"] = time.time()
    else:
        row["pid"] = _kill(_learner_pid(out, ev.index))
    return row


__all__ = ["ChaosHooks", "LearnerActor", "RayRunResult", "learner_configs", "run_on_ray"]
