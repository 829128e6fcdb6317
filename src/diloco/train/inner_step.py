"""One inner step of a training replica, and the metrics row it logs.

:func:`train_step` sets the step's learning rate, takes the replica's batch (this rank's
rows of it), runs forward and backward (bf16 autocast if configured), averages the
gradients inside the worker, lets the algorithm act before the optimizer step (data
parallel's gradient average), clips, steps the inner optimizer, then runs the algorithm's
outer syncs (all of them finished at the last step). :func:`step_record` is the row
:class:`~diloco.train.step_log.StepTable` merges over the replicas into ``metrics.jsonl``.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from diloco.algorithm.base import SyncReport
from diloco.train.config import TrainConfig
from diloco.train.evaluation import autocast
from diloco.train.lr import lr_at
from diloco.train.replica import Replica
from diloco.train.sharding import scalar

# The replicas of one process are threads: their first step (where torch.compile compiles the model) runs
# under this lock, one replica at a time. Concurrent compilation made compiled runs irreproducible (the
# same config ending 5.430 or 5.461 on the tiny preset in bf16); serialized, they are bit for bit.
_COMPILE_LOCK = threading.Lock()


@dataclass
class StepOutcome:
    """What one inner step measured."""

    loss: float
    lr: float
    tokens: int
    grad_norm: float | None
    synced_fragments: list[int]  # outer syncs finished after this step
    step_time: float
    compute_time: float
    last: bool = False  # the replica's last step (it has finished: left its syncer, or made its last sync)


def train_step(
    rep: Replica,
    step: int,
    *,
    cfg: TrainConfig,
    device: torch.device,
    after_compute: Callable[..., float] | None = None,
) -> StepOutcome:
    """One inner step: batch, forward/backward, gradient syncs, optimizer step, then the algorithm's syncs.

    ``after_compute(compute_s, step=, replica=)``: called between the optimizer step and the algorithm's syncs;
    returns the step's compute seconds (:meth:`~diloco.train.trainer.TrainerCallback.after_compute`)."""
    dev = device
    t_start = time.perf_counter()
    lr = lr_at(step, cfg)
    for group in rep.opt.param_groups:
        group["lr"] = lr
    x, y = rep.sampler.next_batch()
    tokens = x.numel()  # the replica's
    x, y = x[rep.rows].to(dev, non_blocking=True), y[rep.rows].to(dev, non_blocking=True)
    with _COMPILE_LOCK if (cfg.compile and not rep.compiled) else contextlib.nullcontext():
        with autocast(cfg.bf16, dev):
            _, loss = rep.model(x, y)
        loss.backward()
    rep.compiled = True
    compute = time.perf_counter() - t_start
    if rep.in_worker is not None:  # communication, not compute: outside `compute`
        rep.dropped += _dropped(rep.in_worker.before_optimizer_step())
    rep.dropped += _dropped(rep.algo.before_optimizer_step())
    t1 = time.perf_counter()
    grad_norm = torch.nn.utils.clip_grad_norm_(rep.params, cfg.grad_clip) if cfg.grad_clip > 0 else None
    grad_norm = None if grad_norm is None else scalar(grad_norm)  # sharded: a DTensor, gathered here
    rep.opt.step()
    rep.opt.zero_grad(set_to_none=True)
    compute += time.perf_counter() - t1
    if after_compute is not None:
        compute = after_compute(compute, step=step)
    reports = rep.algo.after_optimizer_step()
    last = ends_after(rep.algo, step, cfg)
    if last:
        reports += rep.algo.finish()
    rep.dropped += _dropped(reports)
    step_time = time.perf_counter() - t_start
    rep.train_time += step_time
    return StepOutcome(
        loss=loss.item(),
        lr=lr,
        tokens=tokens,
        grad_norm=grad_norm,
        synced_fragments=[r.fragment for r in reports],
        step_time=step_time,
        compute_time=compute,
        last=last,
    )


def ends_after(algo: Any, step: int, cfg: TrainConfig) -> bool:
    """Whether the replica's training ends after ``step``: at the config's ``steps``, or (``learner_budget=tokens``, a
    decoupled learner) once its syncer has counted the learners' shared budget as trained
    (:attr:`~diloco.decoupled.learner.Learner.budget_spent`), before or after ``steps``."""
    if cfg.learner_budget == "tokens":
        return bool(algo.budget_spent)
    return step == cfg.total_steps


def step_record(rep: Replica, step: int, out: StepOutcome) -> dict[str, Any]:
    """The replica's metrics row of ``step``: the step's measurements and the communicator's byte counters."""
    stats = rep.comm.stats
    return {
        "step": step,
        "loss": out.loss,
        "lr": out.lr,
        "tokens": out.tokens,
        "grad_norm": out.grad_norm,
        "bytes_sent": stats.bytes_sent,
        "bytes_received": stats.bytes_received,
        "peak_in_flight": stats.peak_in_flight,
        "peak_bytes_per_sync": stats.peak_exchange,
        "synced_fragments": out.synced_fragments,
        "dropped": rep.dropped,
        "step_time_s": out.step_time,
        "compute_time_s": out.compute_time,
    }


def _dropped(reports: list[SyncReport]) -> int:
    return sum(len(r.dropped_replicas) for r in reports)


__all__ = ["StepOutcome", "ends_after", "step_record", "train_step"]
