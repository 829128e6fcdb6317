"""What the trainer needs to run ``method='decoupled'``: a syncer from the config, a learner per replica,
and the merge log (``merges.jsonl``, one row per merge: fragment, learners, weights, waits, bytes)."""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn

from diloco.decoupled.learner import Channel, Learner
from diloco.decoupled.local import LocalTransport
from diloco.decoupled.messages import MergeRecord
from diloco.decoupled.syncer import Syncer
from diloco.errors import ConfigError
from diloco.files import atomic_write_bytes


def _outer(cfg: Any):
    return partial(
        torch.optim.SGD,
        lr=cfg.outer_lr,
        momentum=cfg.outer_momentum,
        nesterov=cfg.outer_nesterov and cfg.outer_momentum > 0,
    )


class RunningSyncer:
    """What the trainer holds while a decoupled run is on: a channel per learner, the syncer's state (for a
    checkpoint: :meth:`~diloco.decoupled.syncer.Syncer.state_dict` of each shard, in shard order, read safely
    while it runs) and, after, the merges."""

    def __init__(
        self,
        channel: Callable[[int], Channel],
        records: Callable[[], list[MergeRecord]],
        global_parameters: Callable[[], dict[str, torch.Tensor]],
        abort: Callable[[str], None] = lambda reason: None,
        states: Callable[[], list[dict[str, Any]]] | None = None,
    ) -> None:
        self.channel, self.records, self.global_parameters = channel, records, global_parameters
        self.abort = abort  # the run stops (a learner diverged): learners waiting for replies stop too
        self.states = states


def make_syncer(
    cfg: Any,
    template: nn.Module,
    fragments: list[list[str]] | None = None,
    *,
    state: dict[str, Any] | None = None,
    num_fragments: int | None = None,
) -> Syncer:
    """The config's syncer, holding ``template``'s parameters as the initial global ones; ``state``: a resumed
    run's (:meth:`~diloco.decoupled.syncer.Syncer.state_dict` of a checkpoint), restored, every learner expected
    to join again (:meth:`~diloco.decoupled.syncer.Syncer.expect_rejoins`). ``num_fragments``: a shard's
    (:func:`make_syncers`), in place of the config's."""
    syncer = Syncer(
        template,
        num_learners=cfg.replicas,
        quorum=cfg.quorum or cfg.replicas,
        num_fragments=cfg.num_fragments if num_fragments is None else num_fragments,
        fragment_pattern=cfg.fragment_pattern,
        fragments=fragments,
        merge=cfg.merge,
        outer_scale=cfg.outer_scale,
        outer_gradient=cfg.outer_gradient,
        codec=cfg.make_codec(),
        outer_optimizer=_outer(cfg),
        overlap_steps=cfg.overlap_steps,
        grace_gamma=cfg.grace_gamma,
        grace_ema_decay=cfg.grace_ema_decay,
        guard=cfg.guard,
        guard_ratio=cfg.guard_ratio,
        late_reports=cfg.late_reports,
        device=cfg.syncer_device,
        learner_lease=cfg.learner_lease,
    )
    if state is not None:
        restore_syncer(cfg, syncer, state)
    return syncer


def restore_syncer(cfg: Any, syncer: Syncer, state: dict[str, Any]) -> None:
    """``syncer`` (a shard) restored from a resumed run's ``state``, every learner of the config expected to join
    again."""
    learners = sorted(int(m) for m in state["joins"])
    if learners != list(range(cfg.replicas)):
        raise ConfigError(
            f"the syncer's saved state is of learners {learners}, this run has replicas={cfg.replicas}: "
            f"resume a decoupled run with the replicas it was written with"
        )
    syncer.load_state_dict(state)
    syncer.expect_rejoins()


def make_syncers(
    cfg: Any,
    template: nn.Module,
    fragments: list[list[str]] | None = None,
    *,
    states: list[dict[str, Any]] | None = None,
    only: int | None = None,
) -> list[Syncer]:
    """The config's ``syncer_shards`` syncers (:mod:`diloco.decoupled.shards`; one: :func:`make_syncer` itself),
    each restored from its entry of ``states`` (a resumed run's, in shard order) if given; ``only``: shard ``only``
    alone (a list of one, never restored here)."""
    from diloco.decoupled.shards import build_shards

    S = cfg.syncer_shards
    assert only is None or states is None, "a shard built alone restores itself"
    if states is not None and len(states) != S:
        raise ConfigError(
            f"the checkpoint holds {len(states)} syncer shards, this run has syncer_shards={S}: resume a "
            f"decoupled run with the syncer_shards it was written with"
        )
    if S == 1:
        return [make_syncer(cfg, template, fragments, state=None if states is None else states[0])]
    shards = build_shards(
        template,
        num_shards=S,
        num_fragments=cfg.num_fragments,
        fragment_pattern=cfg.fragment_pattern,
        fragments=fragments,
        build=lambda model, n, groups: make_syncer(cfg, model, groups, num_fragments=n),
        only=only,
    )
    for syncer, state in zip(shards, states or [None] * len(shards), strict=True):
        if state is not None:
            restore_syncer(cfg, syncer, state)
    return shards


@contextlib.contextmanager
def decoupled_syncer(
    cfg: Any, template: nn.Module, fragments: list[list[str]] | None, *, states: list[dict[str, Any]] | None = None
) -> Iterator[RunningSyncer]:
    """The config's syncer shards (from the run's initial model, or restored from ``states``:
    :func:`make_syncers`) for the ``with`` block: each on a thread of this process (``decoupled_transport=
    'threads'``) or as a named Ray actor (``'ray'``, on the cluster at ``ray_address``, else a local Ray
    instance), which is stopped at the end."""
    from diloco.decoupled.shards import combine_records, sharded, union

    if cfg.decoupled_transport == "ray":
        try:
            import ray

            from diloco.decoupled.ray_shards import RayShards
        except ImportError:
            raise ConfigError(
                "decoupled_transport='ray' needs Ray: pip install -e .[ray] (or ray>=2.9), "
                "or use decoupled_transport='threads'"
            ) from None
        from diloco.decoupled.ray_syncers import syncers_for_ray

        built, gpus = syncers_for_ray(cfg, template, fragments, states=states)
        shards = RayShards.start(
            built, name=f"diloco-syncer-{uuid.uuid4().hex[:12]}", address=cfg.ray_address or None, num_gpus=gpus
        )
        try:
            yield RunningSyncer(
                shards.channel,
                shards.records,
                shards.global_named_parameters,
                states=lambda: ray.get([h.state_dict.remote() for h in shards.handles]),
            )
        finally:
            shards.kill()
        return
    syncers = make_syncers(cfg, template, fragments, states=states)
    with contextlib.ExitStack() as stack:
        transports = [stack.enter_context(LocalTransport(s, timeout=600.0)) for s in syncers]

        def abort(reason: str) -> None:
            for t in transports:
                t.abort(reason)

        yield RunningSyncer(
            lambda m: sharded([t.channel(m) for t in transports]),
            lambda: combine_records([list(t.syncer.records) for t in transports]),
            lambda: union([t.syncer.global_named_parameters() for t in transports]),
            abort,
            states=lambda: [t.state_dict() for t in transports],
        )


def decoupled_learner(
    cfg: Any, model: nn.Module, channel: Channel, *, learner: int, fragments: list[list[str]] | None, stats: Any
) -> Learner:
    """Replica ``learner``'s side: joins the syncer (taking its parameters) and reports on the config's schedule."""
    return Learner(
        model,
        channel=channel,
        learner=learner,
        sync_every=cfg.sync_every,
        num_fragments=cfg.num_fragments,
        fragment_pattern=cfg.fragment_pattern,
        fragments=fragments,
        overlap_steps=cfg.overlap_steps,
        merge_alpha=cfg.merge_alpha,
        codec=cfg.make_codec(),
        schedule=cfg.schedule_spec,
        tokens_per_step=cfg.batch_per_replica * cfg.seq_len,
        stats=stats,
        overwrite_after=cfg.overwrite_after,
        ride_out_steps=cfg.ride_out_steps,
        error_feedback_decay=cfg.ef_decay,
        # learner_budget=tokens: the learners together train the synchronous run's tokens, steps x M learner-steps
        budget_steps=cfg.total_steps * cfg.replicas if cfg.learner_budget == "tokens" else 0,
        own_steps=cfg.total_steps,
    )


def chaos_run(
    cfg: Any,
    out: Path | str,
    *,
    chaos: Any,
    cache_dir: Path | str,
    step_time_s: float = 0.0,
    max_seconds: float = 3600.0,
) -> dict[str, Any]:
    """``diloco chaos``: the config's learners as Ray actor processes, each running the trainer as a site job,
    and its syncer as a checkpointed actor (:func:`diloco.decoupled.ray_learners.run_on_ray`), under ``chaos``;
    returns the run's summary. ``step_time_s`` > 0 sets the config's ``step_time`` (it must not set another).

    Everything is checked before ``out`` is touched; ``out`` must be new or empty. Writes ``config.json``
    beside what :func:`~diloco.decoupled.ray_learners.run_on_ray` writes."""
    from dataclasses import replace

    from diloco.files import write_json

    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"--out {out} is not a new or empty folder: give a new one (nothing is overwritten)")
    chaos.check(cfg.replicas)
    if cfg.learner >= 0 or cfg.syncer:
        raise ConfigError(
            f"learner={cfg.learner}, syncer={cfg.syncer!r}: diloco chaos runs every learner against a syncer of its "
            f"own; leave both unset"
        )
    if step_time_s > 0:
        if cfg.step_time not in (0, step_time_s):
            raise ConfigError(
                f"--step-time {step_time_s} and step_time={cfg.step_time}: give the step time once (either one)"
            )
        cfg = replace(cfg, step_time=step_time_s)
    try:
        import ray

        from diloco.decoupled.ray_learners import learner_configs, run_on_ray
        from diloco.decoupled.ray_transport import check_address
    except ImportError:
        raise ConfigError("diloco chaos needs Ray: pip install -e .[ray] (or ray>=2.9)") from None
    learner_configs(cfg, chaos=chaos, name="check", address="check")  # the slow-downs, before anything starts
    if not ray.is_initialized():
        check_address(cfg.ray_address or None)  # before anything is prepared or written
    started_ray = not ray.is_initialized()
    if started_ray:
        from diloco.decoupled.ray_start import start_ray

        start_ray(cfg.ray_address or None, include_dashboard=False, log_to_driver=False)
    try:
        result = run_on_ray(cfg, out_dir=out, cache_dir=cache_dir, chaos=chaos, max_seconds=max_seconds)
    finally:
        if started_ray:
            ray.shutdown()
    write_json(out / "config.json", cfg.to_dict())
    return result.summary


class LearnerLog:
    """``learner-<m>.jsonl`` of a ``diloco train`` run: one row per step of learner ``m``
    (:func:`diloco.decoupled.chaos_logs.step_row`: wall time ``t``, tokens, loss, staleness, seconds waited, fragments
    received) and a ``joined`` row each time a process of the learner starts training (:meth:`start`: wall time,
    incarnation, pid, the step it starts after), written by its lead rank; the weight each merge gave it is in
    ``merges.jsonl``. A learner that joins its syncer again (a restarted process: incarnation > 0) or resumes a
    checkpoint appends to the rows of its earlier lives; a new run starts the file afresh. A job that lost its
    index to another job (:mod:`diloco.decoupled.claim_lost`) ends its rows with a ``claim lost`` row (``why``)."""

    def __init__(self, out_dir: Path, learner: int, *, append: bool) -> None:
        self.learner, self.append = learner, append
        self.path = Path(out_dir) / f"learner-{learner}.jsonl"
        self._file: Any = None
        self._algo: Any = None
        self._waited = self._blocked = 0.0
        self._cpu = 0.0

    def start(self, algo: Learner, step: int) -> None:
        import time

        append = self.append or algo.incarnation > 0
        if append and self.path.exists() and self.path.stat().st_size > 0:
            with open(self.path, "rb") as fh:  # a predecessor killed mid-line left no newline: end its line
                fh.seek(-1, os.SEEK_END)
                cut = fh.read(1) != b"\n"
        else:
            cut = False
        self._file = open(self.path, "a" if append else "w", buffering=1)
        self._algo = algo
        self._waited, self._blocked, self._cpu = algo.wait_seconds, algo.blocked_seconds, time.process_time()
        self._write(
            {
                "learner": self.learner,
                "incarnation": algo.incarnation,
                "event": "joined",
                "t": time.time(),
                "pid": os.getpid(),
                "start_step": step,
            },
            cut=cut,
        )

    def _write(self, row: dict[str, Any], *, cut: bool = False) -> None:
        assert self._file is not None, "LearnerLog.start comes before the first row"
        self._file.write(("\n" if cut else "") + json.dumps(row, allow_nan=False) + "\n")

    def add(self, algo: Learner, step: int, out: Any) -> None:
        import time

        from diloco.decoupled.chaos_logs import step_row

        wait, self._waited = algo.wait_seconds - self._waited, algo.wait_seconds
        blocked, self._blocked = algo.blocked_seconds - self._blocked, algo.blocked_seconds
        cpu, self._cpu = time.process_time() - self._cpu, time.process_time()
        self._write(
            step_row(
                learner=self.learner,
                incarnation=algo.incarnation,
                step=step,
                dt=out.step_time,
                compute_s=out.compute_time,
                wait_s=wait,
                blocked_s=blocked,
                cpu_s=cpu,
                loss=out.loss,
                tokens=out.tokens,
                staleness=max(algo.steps),
                synced=out.synced_fragments,
            )
        )

    def close(self) -> None:
        import time

        from diloco.decoupled.claim_lost import claim_lost_of

        lost = None if self._algo is None else claim_lost_of(self._algo.channel)
        if lost is not None and self._file is not None:  # why this job stopped: another job holds its index
            row = {"learner": self.learner, "incarnation": self._algo.incarnation, "event": "claim lost"}
            self._write({**row, "t": time.time(), "why": lost})
        if self._file is not None:
            self._file.close()
            self._file = None


def learner_goodput(results: Sequence[dict[str, Any]]) -> float | None:
    """The learners' share of training time not spent waiting for replies: 1 - sum(waited) / sum(train time)
    (``diloco train``'s learners never fail, so nothing else is lost)."""
    total = sum(r["train_time_s"] for r in results)
    if total <= 0 or any(r.get("waited_s") is None for r in results):
        return None
    return max(0.0, 1.0 - sum(r["waited_s"] for r in results) / total)


def learner_wait_shares(results: Sequence[dict[str, Any]]) -> list[float] | None:
    """Each learner's share of its training time spent waiting for the syncer's replies, in learner order."""
    if any(r.get("waited_s") is None for r in results):
        return None
    return [r["waited_s"] / r["train_time_s"] if r["train_time_s"] > 0 else 0.0 for r in results]


def write_merges(path: Path, records: Sequence[MergeRecord]) -> None:
    """One JSON row per merge, in the order they happened."""
    atomic_write_bytes(Path(path), "".join(json.dumps(r.as_row()) + "\n" for r in records).encode("utf-8"))


__all__ = [
    "LearnerLog",
    "RunningSyncer",
    "chaos_run",
    "decoupled_learner",
    "decoupled_syncer",
    "learner_goodput",
    "learner_wait_shares",
    "make_syncer",
    "write_merges",
]
