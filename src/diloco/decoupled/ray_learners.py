"""Learners as Ray actors (processes Ray restarts when they die), and a run under a fault schedule.

::

    spec = LearnerSpec(size="tiny", vocab_size=4096, seq_len=64, tokens=data.train, batch_size=8,
                       sync_every=8, num_fragments=2, overlap_steps=1, duration_s=20)
    result = run_on_ray(spec, syncer=Syncer(model, num_learners=3, quorum=2, ...), num_learners=3,
                        out_dir="runs/chaos", chaos=Chaos(kills=((5, 1),), syncer_kills=(12,)))

What runs where: the syncer is a named async actor (:mod:`.ray_transport`) that saves every merge to
``out_dir/syncer`` and is restarted from there if it dies; each learner is an actor of its own (a
process; on a cluster, wherever Ray places it) that builds its model, finds the syncer by name, joins
(taking the global parameters) and trains until ``duration_s`` after the start. The object store
carries the learner's token array (once, at the start), the reports and replies (encoded fragments)
and the merge records. Learners never talk to each other.

A learner that dies is restarted by Ray (``max_restarts=-1``): the new process waits
``Chaos.downtime_s``, joins again with fresh counters (so it weighs nothing until it has done work)
and a fresh inner optimizer, and trains on. Each learner appends one JSON row per step to
``out_dir/learner-<m>.jsonl`` (and a ``joined`` row per incarnation), so the rows of a killed process
survive it. The driver carries out the :class:`~diloco.decoupled.chaos.Chaos` schedule with SIGKILL
(each process writes its pid next to its log) and writes ``merges.jsonl`` and ``chaos.json`` at the end.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch

from diloco.algorithm.codecs import Codec
from diloco.decoupled.chaos import Chaos, Event, kept_steps, read_learner_log, step_row, summarize
from diloco.decoupled.ray_transport import DEFAULT_NAMESPACE, connect, start_syncer
from diloco.decoupled.syncer import Syncer
from diloco.errors import ConfigError
from diloco.files import write_json
from diloco.train.lr import cosine_lr


@dataclass(frozen=True)
class LearnerSpec:
    """What every learner trains and how (the project's transformer on a token array).

    ``step_time_s``: pad each step to at least this many seconds with a sleep (0: off), to emulate an
    accelerator's step on a CPU machine: the padded time is idle, so many learners share few cores without
    slowing each other. ``duration_s``: learners stop this long after the run's start; ``max_steps``
    (0: no limit): or once they have made this many steps that reached the syncer (a restarted learner
    redoes the steps its predecessor lost); ``total_tokens`` (0: no limit): or once all learners together have
    trained this many tokens that reached the syncer (the driver watches the learners' logs and leaves a
    ``STOP`` file in the run folder: on a cluster that folder must be shared). The inner learning rate: linear warmup over ``warmup_steps``,
    then cosine decay to ``min_lr_ratio`` at ``schedule_steps`` (default ``max_steps``; without either,
    constant after the warmup).
    """

    tokens: np.ndarray
    vocab_size: int
    seq_len: int = 64
    size: str = "tiny"
    model: str = ""  # as the config's model: "" the project's Transformer of `size`
    batch_size: int = 8
    inner_lr: float = 3e-3
    weight_decay: float = 0.1
    sync_every: int = 8
    num_fragments: int = 1
    fragment_pattern: str = "strided"
    overlap_steps: int = 0
    merge_alpha: float = 0.0
    codec: str | Codec = "fp32"  # a name, or the codec itself (a config's make_codec(): top-k settings kept)
    seed: int = 0
    step_time_s: float = 0.0
    duration_s: float = 10.0
    max_steps: int = 0
    total_tokens: int = 0
    ride_out_steps: int = 0  # steps a learner trains on while a reply is late (a syncer restarting); see Learner
    schedule_steps: int = 0
    warmup_steps: int = 0
    min_lr_ratio: float = 0.1
    threads: int = 1

    def lr(self, step: int) -> float:
        horizon = self.schedule_steps or self.max_steps
        if not horizon:
            return self.inner_lr * min(1.0, step / self.warmup_steps) if self.warmup_steps else self.inner_lr
        return cosine_lr(
            step,
            peak=self.inner_lr,
            warmup_steps=self.warmup_steps,
            total_steps=horizon,
            min_lr_ratio=self.min_lr_ratio,
        )


def _windows(tokens: np.ndarray, *, learner: int, num_learners: int, seed: int, batch: int, seq_len: int):
    """Random windows of learner ``learner``'s contiguous share of the tokens, forever."""
    share = len(tokens) // num_learners
    lo = learner * share
    rng = np.random.default_rng(seed)
    while True:
        starts = lo + rng.integers(0, share - seq_len - 1, size=batch)
        block = np.stack([tokens[s : s + seq_len + 1] for s in starts]).astype(np.int64)
        t = torch.from_numpy(block)
        yield t[:, :-1], t[:, 1:]


@dataclass
class _Prepared:
    model: torch.nn.Module
    algo: Any
    inner: torch.optim.Optimizer
    batches: Any
    channel: Any
    first_step: int = 1  # a restarted learner goes on from the last step of its predecessor that was synced


def steps_kept(log_path: Path) -> int:
    """The last step of this learner (over its previous lives, from its log) whose work reached the syncer."""
    return max((int(r["step"]) for r in read_learner_log(log_path) if r.get("synced")), default=0)


def prepare_learner(
    spec: LearnerSpec, *, learner: int, num_learners: int, syncer_name: str, namespace: str, log_path: Path
) -> _Prepared:
    """Build the model (one forward/backward to warm it up), find the syncer, join it (taking its parameters)."""
    from diloco.decoupled.learner import Learner
    from diloco.models.factory import build_model

    torch.set_num_threads(spec.threads)
    model = build_model(spec.model, size=spec.size, vocab_size=spec.vocab_size, seq_len=spec.seq_len, seed=spec.seed)
    tokens = spec.tokens if isinstance(spec.tokens, np.ndarray) else ray.get(spec.tokens)  # an ObjectRef on Ray
    warm = _windows(
        tokens,
        learner=learner,
        num_learners=num_learners,
        batch=spec.batch_size,
        seq_len=spec.seq_len,
        seed=10_000 + learner,
    )
    model(*next(warm))[1].backward()
    model.zero_grad(set_to_none=True)
    channel = connect(learner=learner, name=syncer_name, namespace=namespace)
    algo = Learner(
        model,
        channel=channel,
        learner=learner,
        sync_every=spec.sync_every,
        num_fragments=spec.num_fragments,
        fragment_pattern=spec.fragment_pattern,
        overlap_steps=spec.overlap_steps,
        merge_alpha=spec.merge_alpha,
        codec=spec.codec,
        tokens_per_step=spec.batch_size * spec.seq_len,
        ride_out_steps=spec.ride_out_steps,
    )
    inner = torch.optim.AdamW(model.parameters(), lr=spec.inner_lr, weight_decay=spec.weight_decay)
    batches = _windows(
        tokens,
        learner=learner,
        num_learners=num_learners,
        batch=spec.batch_size,
        seq_len=spec.seq_len,
        seed=spec.seed * 1000 + learner * 100 + algo.incarnation,
    )
    return _Prepared(model, algo, inner, batches, channel, first_step=steps_kept(log_path) + 1)


def train_until(
    ready: _Prepared,
    spec: LearnerSpec,
    *,
    learner: int,
    start_at: float,
    stop_at: float,
    slowdown: float,
    log_path: Path,
    corrupt: tuple = (),
) -> dict[str, Any]:
    """Train from wall time ``start_at`` (at once if it has passed) until ``stop_at``, then flush and leave;
    one row per step in ``log_path`` (see :mod:`diloco.decoupled.chaos` for what the rows hold). ``corrupt``:
    this learner's corruption windows (``Chaos.corrupt_windows``): its reports then go through a
    :class:`~diloco.decoupled.corrupt.CorruptingChannel`."""
    stop_file = log_path.parent / "STOP"
    model, algo, inner, batches = ready.model, ready.algo, ready.inner, ready.batches
    if corrupt:
        from diloco.decoupled.corrupt import CorruptingChannel

        algo.channel = CorruptingChannel(
            algo.channel,
            windows=corrupt,
            start_at=start_at,
            sizes=[f.numel for f in algo.fragments],
            codec=algo.codec,
            seed=spec.seed * 1000 + learner,
        )
    time.sleep(max(0.0, start_at - time.time()))
    with open(log_path, "a", buffering=1) as log:
        if log.tell() > 0:  # a predecessor killed mid-line leaves no newline: start on a line of our own
            log.write("\n")
        log.write(
            json.dumps(
                {
                    "learner": learner,
                    "incarnation": algo.incarnation,
                    "event": "joined",
                    "t": time.time(),
                    "pid": os.getpid(),
                }
            )
            + "\n"
        )
        step = ready.first_step - 1
        while time.time() < stop_at and not (spec.max_steps and step >= spec.max_steps) and not stop_file.exists():
            t0 = time.perf_counter()
            for group in inner.param_groups:
                group["lr"] = spec.lr(step + 1)
            x, y = next(batches)
            loss = model(x, y)[1]
            loss.backward()
            inner.step()
            inner.zero_grad(set_to_none=True)
            work = max(time.perf_counter() - t0, spec.step_time_s) * slowdown
            time.sleep(max(0.0, t0 + work - time.perf_counter()))
            waited = algo.wait_seconds
            synced = [r.fragment for r in algo.after_optimizer_step(tokens=x.numel())]
            step += 1
            log.write(
                json.dumps(
                    step_row(
                        learner=learner,
                        incarnation=algo.incarnation,
                        step=step,
                        dt=time.perf_counter() - t0,
                        compute_s=work,
                        wait_s=algo.wait_seconds - waited,
                        loss=float(loss),
                        tokens=x.numel(),
                        staleness=max(algo.steps),
                        synced=synced,
                    )
                )
                + "\n"
            )
        algo.close()
    return {
        "learner": learner,
        "incarnation": algo.incarnation,
        "steps": step,
        "resent": getattr(ready.channel, "resent", 0),
        "corrupted": getattr(algo.channel, "corrupted", 0),
    }


@ray.remote(max_restarts=-1, max_task_retries=-1, num_cpus=0)
class LearnerActor:
    """One learner (a process of its own). Restarted by Ray when it dies; ``run`` is then retried on the new
    process, which waits ``downtime_s``, prepares (builds, joins) and trains at once."""

    def __init__(
        self,
        spec: LearnerSpec,
        learner: int,
        num_learners: int,
        slowdown: float,
        downtime_s: float,
        out_dir: str,
        syncer_name: str,
        namespace: str,
        corrupt: tuple = (),
    ) -> None:
        self.spec, self.learner, self.slowdown, self.corrupt = spec, learner, slowdown, corrupt
        self.join_args = dict(learner=learner, num_learners=num_learners, syncer_name=syncer_name, namespace=namespace)
        self.log_path = Path(out_dir) / f"learner-{learner}.jsonl"
        self.restarted = ray.get_runtime_context().was_current_actor_reconstructed
        self.downtime_s = downtime_s
        self.ready: _Prepared | None = None
        (Path(out_dir) / f"learner-{learner}.pid").write_text(str(os.getpid()))

    def prepare(self) -> bool:
        if self.restarted and self.downtime_s > 0:
            time.sleep(self.downtime_s)
        self.ready = prepare_learner(self.spec, log_path=self.log_path, **self.join_args)
        return True

    def run(self, start_at: float, stop_at: float) -> dict[str, Any]:
        if self.ready is None:  # a restarted process: Ray retries only this call
            self.prepare()
        return train_until(
            self.ready,
            self.spec,
            learner=self.learner,
            start_at=start_at,
            stop_at=stop_at,
            slowdown=self.slowdown,
            log_path=self.log_path,
            corrupt=self.corrupt,
        )


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
    summary: dict[str, Any] = field(default_factory=dict)  # diloco.decoupled.chaos.summarize, and the eval loss


def _kill(pid_file: Path) -> int:
    pid = int(pid_file.read_text())
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return pid


def run_on_ray(
    spec: LearnerSpec,
    *,
    syncer: Syncer,
    num_learners: int,
    out_dir: Path | str,
    chaos: Chaos | None = None,
    address: str | None = None,
    namespace: str = DEFAULT_NAMESPACE,
    start_delay_s: float = 0.2,
    val_tokens: np.ndarray | None = None,
    eval_batches: int = 16,
) -> RayRunResult:
    """Run ``num_learners`` learner actors and ``syncer`` (a checkpointed actor) for ``spec.duration_s``,
    carrying out ``chaos``; see the module docstring. ``out_dir`` must be new or empty (nothing is
    overwritten). ``start_delay_s``: the schedule's time 0 comes this long after the actors are created
    and the learners have built their models and joined. ``val_tokens``: evaluate the syncer's final global
    parameters on ``eval_batches`` batches of them (``RayRunResult.eval_loss``)."""
    chaos = chaos or Chaos()
    chaos.check(num_learners)
    if syncer.num_learners != num_learners:
        raise ConfigError(
            f"the syncer expects {syncer.num_learners} learners, num_learners={num_learners}: give both the same M"
        )
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"out_dir {out} is not empty: give a new folder (nothing in it is overwritten)")
    out.mkdir(parents=True, exist_ok=True)
    name = f"diloco-syncer-{os.getpid()}-{time.monotonic_ns()}"
    handle = start_syncer(syncer, name=name, namespace=namespace, address=address, checkpoint_dir=str(out / "syncer"))
    (out / "syncer.pid").write_text(str(ray.get(handle.pid.remote())))
    tokens = ray.put(spec.tokens)  # once in the object store, shared by every learner
    actors = [
        LearnerActor.remote(
            replace(spec, tokens=tokens),
            m,
            num_learners,
            chaos.factor(m),
            chaos.downtime_s,
            str(out),
            name,
            namespace,
            chaos.corrupt_windows(m),
        )
        for m in range(num_learners)
    ]
    ray.get([a.prepare.remote() for a in actors])  # built, warmed up and joined: the clock starts together
    started = time.time() + start_delay_s
    runs = [a.run.remote(started, started + spec.duration_s) for a in actors]
    events = chaos.events(num_learners=num_learners, duration_s=spec.duration_s)
    faults, pending, deadline = [], list(runs), started + spec.duration_s + 300
    while pending:  # carry out the faults that are due, watch the token budget, until every learner is done
        while events and started + events[0].at <= time.time():
            faults.append(_fault(events.pop(0), out, handle))
        if spec.total_tokens and not (out / "STOP").exists() and _tokens_kept(out, num_learners) >= spec.total_tokens:
            (out / "STOP").write_text(f"{spec.total_tokens} tokens trained\n")
        nxt = started + events[0].at - time.time() if events else 1.0
        _, pending = ray.wait(
            pending, num_returns=len(pending), timeout=max(0.01, min(nxt, 0.25 if spec.total_tokens else 1.0))
        )
        if time.time() > deadline:
            raise TimeoutError(f"learners still running {spec.duration_s + 300:.0f} s after the start; see {out}")
    wall = time.time() - started
    learners = ray.get(runs)
    merges = [r.as_row() for r in ray.get(handle.records.remote())]
    params = ray.get(handle.global_named_parameters.remote())
    for a in actors:
        ray.kill(a, no_restart=True)
    ray.kill(handle, no_restart=True)
    rows = [r for m in range(num_learners) for r in read_learner_log(out / f"learner-{m}.jsonl")]
    (out / "merges.jsonl").write_text("".join(json.dumps(r) + "\n" for r in merges))
    write_json(
        out / "chaos.json",
        {"chaos": asdict(chaos), "faults": faults, "started_at": started, "wall_s": wall, "learners": learners},
    )
    loss = None if val_tokens is None else _evaluate(spec, params, val_tokens, eval_batches)
    summary = {
        "eval_loss": loss,
        "wall_s": wall,
        **summarize(rows, merges, faults, num_learners=num_learners, wall_s=wall),
        "corrupted_reports": sum(r.get("corrupted", 0) for r in learners),
        "guard_events": [e for r in merges for e in r.get("guard", ())],
    }
    write_json(out / "summary.json", summary)
    return RayRunResult(params, loss, merges, rows, faults, started, wall, learners, summary)


def _tokens_kept(out: Path, num_learners: int) -> int:
    rows = [r for m in range(num_learners) for r in read_learner_log(out / f"learner-{m}.jsonl")]
    return int(sum(r["tokens"] for r in kept_steps(rows)[0]))


def _evaluate(spec: LearnerSpec, params: dict[str, torch.Tensor], val_tokens: np.ndarray, batches: int) -> float:
    from diloco.data.shards import eval_batches
    from diloco.models.factory import build_model
    from diloco.train.evaluation import evaluate_parameters

    template = build_model(spec.model, size=spec.size, vocab_size=spec.vocab_size, seq_len=spec.seq_len, seed=spec.seed)
    val = list(eval_batches(val_tokens, batch_size=spec.batch_size, seq_len=spec.seq_len, max_batches=batches))
    return evaluate_parameters(template, params, val, bf16=False, device=torch.device("cpu"))


def _fault(ev: Event, out: Path, handle: Any) -> dict[str, Any]:
    """Carry out one event (SIGKILL); for the syncer, note how many merges it had just before."""
    row: dict[str, Any] = {"at": time.time(), "target": ev.target, "index": ev.index}
    if ev.target == "syncer":
        row["merges_before"] = len(ray.get(handle.records.remote()))
        row["pid"] = _kill(out / "syncer.pid")
        (out / "syncer.pid").write_text(str(ray.get(handle.pid.remote())))  # the restarted actor's
        row["restored_merges"] = ray.get(handle.restored.remote())
        row["back_at"] = time.time()
    else:
        row["pid"] = _kill(out / f"learner-{ev.index}.pid")
    return row


__all__ = ["LearnerActor", "LearnerSpec", "RayRunResult", "prepare_learner", "run_on_ray", "train_until"]
