"""The trainer: data-parallel, DiLoCo and Streaming DiLoCo on one model, data set and token budget.

M replicas run as M threads of this process through the in-process
communicator (see :mod:`diloco.comm.local`), each executing :func:`_replica_loop`,
the same per-replica code a torch.distributed worker runs. The global batch is
split B/M per replica, so every method sees the same number of tokens.

Under torchrun a replica may be a *worker* of R = ``ranks_per_worker`` processes
(:meth:`Trainer.run_replica` with ``intra``): each rank computes the gradient of
its 1/R slice of the replica's batch, the R gradients are averaged inside the
worker every step, and the algorithm runs across workers. A worker thus trains
on exactly the batches the in-process replica would, and its R ranks hold one
state, checkpointed once (by local rank 0) in the same format. With
``worker_sharding = "fsdp"`` the worker's R ranks instead hold one model
``fully_shard``'ed between them (:mod:`diloco.train.sharding`; ``mesh`` given to
:meth:`Trainer.run_replica`): FSDP averages the gradients, the algorithm runs on
each rank's shard between the same-index ranks of the workers, and every rank
writes its shard of the checkpoint (:mod:`diloco.train.sharded_checkpoint`).

Outputs in ``out_dir``: ``config.json`` (resolved), ``tokenizer.json`` (text data),
``metrics.jsonl`` (one row per step, eval rows too), ``summary.json`` and
``checkpoints/`` (see :mod:`diloco.train.checkpoint`; ``diloco export`` turns one
into a model folder).
"""

from __future__ import annotations

import contextlib
import copy
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from diloco.algorithm.base import ReplicaAlgorithm, SyncReport
from diloco.algorithm.codecs import get_codec
from diloco.algorithm.data_parallel import DataParallel
from diloco.algorithm.inner import build_inner_optimizer
from diloco.algorithm.streaming import StreamingDiLoCo
from diloco.comm.base import CommError, Communicator
from diloco.comm.local import run_replicas
from diloco.train import checkpoint as ckpt
from diloco.train import sharded_checkpoint
from diloco.files import atomic_write_bytes, write_json
from diloco.train.config import TrainConfig
from diloco.train.device import check_device
from diloco.train.evaluation import autocast, evaluate
from diloco.train.lr import lr_at
from diloco.train.result import RunResult
from diloco.train.metrics import JSONLSink, MetricLogger, MultiLogger, TensorBoardSink
from diloco.train.rundir import RunDirPlan, check_same_data, clear_run, plan_run_dir
from diloco.train.sharding import full_tensors, scalar, shard_worker_model
from diloco.train.speed import compile_in_place, tcmalloc_notice
from diloco.train.step_log import StepTable, progress_bar, update_bar
from diloco.train.threads import default_threads


def build_model(cfg: TrainConfig, vocab_size: int) -> torch.nn.Module:
    """The config's model (``cfg.model``: the project's Transformer, ``hf:PATH`` or a factory), seeded."""
    from diloco.models.factory import build_model as build

    return build(cfg.model, size=cfg.size, vocab_size=vocab_size, seq_len=cfg.seq_len, seed=cfg.seed,
                 z_loss=cfg.z_loss)


# The replicas of one process are threads: their first step (where torch.compile compiles the model) runs
# under this lock, one replica at a time. Concurrent compilation made compiled runs irreproducible (the
# same config ending 5.430 or 5.461 on the tiny preset in bf16); serialized, they are bit for bit.
_COMPILE_LOCK = threading.Lock()


class TrainerCallback:
    """Hooks into every replica's loop; the defaults do nothing. Subclass and pass ``callbacks=[...]``.

    Called in every replica (thread or process), in order; an exception raised
    here stops that replica as any training error would (tests use this to
    simulate a crash after a given step).
    """

    def on_step_end(self, step: int, *, rank: int) -> None:
        """After step ``step`` is complete: trained, logged, evaluated and checkpointed as due."""


@dataclass
class _Run:
    """What every replica of one run shares: data, validation batches, the initial model, the clock."""

    data: Any  # diloco.data.TokenData
    val: list[tuple[torch.Tensor, torch.Tensor]]
    template: torch.nn.Module  # built once and seeded; every replica starts from a copy
    fragments: list[list[str]] | None  # explicit fragments (cfg.fragments), or None: the fragmenter's split
    start_step: int
    wall_before: float  # wall time of the run before this resume
    t0: float  # perf_counter when this process started the run
    threads: int | None = None  # torch intra-op threads per replica (in-process runs), kept across resumes
    data_sha256: str | None = None  # TokenData.digest(): kept in every checkpoint, checked on resume
    saved_replicas: int | None = None  # M of the checkpoint resumed from (differs after an elastic restart)
    saved_ranks: int | None = None  # R of the checkpoint resumed from (an FSDP run may resume with another)
    vocab_size: int | None = None  # the data's: the model's embedding rows (kept in checkpoints, for diloco export)

    def wall_time(self) -> float:
        return time.perf_counter() - self.t0 + self.wall_before


@dataclass
class _Replica:
    """One replica's (or one rank of a worker's) training state."""

    comm: Communicator
    intra: Communicator | None  # the worker's R ranks (torchrun, ranks_per_worker > 1), else None
    model: torch.nn.Module
    eval_model: torch.nn.Module | None  # only where this replica evaluates
    opt: torch.optim.Optimizer
    algo: ReplicaAlgorithm
    in_worker: DataParallel | None  # gradient average over the worker's ranks
    sampler: Any  # diloco.data.ShardSampler
    rows: slice  # the rows of each replica batch this rank computes
    params: list[torch.nn.Parameter]
    mesh: Any = None  # the worker's DeviceMesh when its model is fully_shard'ed over its ranks (fsdp), else None
    saved_ranks: int = 1  # R of the checkpoint this replica resumes from
    async_group: Any = None  # checkpoint_async: the worker's ranks, for the background checkpoint writes only
    writing: tuple[int, Any, dict[str, Any]] | None = None  # checkpoint_async: (step, Future, record) not committed
    dropped: int = 0
    compiled: bool = False  # the compiled model has run once (its compilation is behind us)
    train_time: float = 0.0

    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def local(self) -> int:
        """This process's rank inside its worker (0 without workers)."""
        return 0 if self.intra is None else self.intra.rank

    @property
    def evaluates(self) -> bool:
        return self.rank == 0 and self.local == 0

    @property
    def sharded(self) -> bool:
        return self.mesh is not None

    def barrier(self) -> None:
        """Every process of the run (``comm`` alone spans only this rank's column when the workers are sharded)."""
        _Everyone(self.comm, self.intra if self.sharded else None).barrier()


@dataclass
class _StepOutcome:
    loss: float
    lr: float
    tokens: int
    grad_norm: float | None
    synced_fragments: list[int]  # outer syncs finished after this step
    step_time: float
    compute_time: float


class Trainer:
    """Runs one configured training job; see the module docstring."""

    def __init__(
        self,
        cfg: TrainConfig,
        out_dir: Path,
        *,
        cache_dir: Path,
        progress: bool = True,
        device: str = "cpu",
        callbacks: Sequence[TrainerCallback] = (),
    ) -> None:
        self.cfg = cfg
        self.out_dir = Path(out_dir)
        self.cache_dir = Path(cache_dir)
        self.progress = progress
        self.device = check_device(device)  # a ValueError now, before the run directory is touched
        self.callbacks = tuple(callbacks)
        self._transport: Any = None  # method=decoupled: the running syncer (see diloco.decoupled.trainer)

    # -- setup ---------------------------------------------------------------
    def plan(self, *, resume: bool = False, overwrite: bool = False, reuse: bool = False,
             elastic: bool = False, replace_flag: str = "--overwrite") -> RunDirPlan:
        """Check every setting and decide what to do with ``out_dir`` (see :func:`~diloco.train.rundir.plan_run_dir`).

        Reads only: a mistake found here leaves the run directory exactly as it was.
        """
        self._validate()
        return plan_run_dir(self.out_dir, self.cfg, resume=resume, overwrite=overwrite, reuse=reuse, elastic=elastic,
                            replace_flag=replace_flag)

    def _validate(self) -> None:
        """What the config cannot check alone (it is validated when built): that the data sources exist,
        the model (its form, HF config or factory import), optional packages. The data and model are
        then built and checked in full by :meth:`_prepare`, still before the run directory is touched."""
        from diloco.data.sources import check_sources
        from diloco.models.factory import check_model

        cfg = self.cfg
        check_sources(cfg.sources)
        check_model(cfg.model)
        if cfg.tensorboard:
            TensorBoardSink.check_available()

    def _prepare(self, plan: RunDirPlan, comm: Any = None, lead: bool = True) -> _Run:
        """Data, validation batches, the initial model; then (lead) the run directory is set up.

        Under torch.distributed (``comm`` given: its ``barrier()`` spans every process) the ``lead`` process
        builds the tokenizer and token cache first and the others then read it, instead of all of
        them racing to build it.
        """
        from diloco.train.inputs import prepare_inputs

        cfg = self.cfg
        if comm is not None and not lead:
            comm.barrier()
        # Data, validation batches, the seeded model and its fragments, each checked (diloco.train.inputs).
        inputs = prepare_inputs(cfg, self.cache_dir)
        digest = inputs.data.digest()
        check_same_data(plan, digest, self.out_dir)  # every process, before the lead touches the run directory
        if lead:  # everything is validated and the data is ready: only now is the run directory touched
            if plan.action == "overwrite":
                clear_run(self.out_dir)
            if plan.action == "resume" and (plan.meta or {}).get("format") == sharded_checkpoint.FORMAT:
                ckpt.discard_uncommitted(self.out_dir, plan.start_step)  # before any rank writes one again
            self.out_dir.mkdir(parents=True, exist_ok=True)
            write_json(self.out_dir / "config.json", cfg.to_dict())
            if inputs.data.tokenizer is not None:  # the run's vocabulary travels with it (diloco export)
                atomic_write_bytes(self.out_dir / "tokenizer.json", inputs.data.tokenizer.to_json().encode("utf-8"))
        if comm is not None and lead:
            comm.barrier()
        # The template was built once and seeded (threads share torch's global RNG); replica 0's copy is
        # broadcast anyway.
        meta = plan.meta or {}
        return _Run(data=inputs.data, val=inputs.val_batches, template=inputs.model, fragments=inputs.fragments,
                    start_step=plan.start_step, vocab_size=inputs.data.vocab_size,
                    wall_before=float(meta.get("wall_time_s", 0.0)), t0=time.perf_counter(),
                    saved_replicas=int(meta.get("num_replicas", cfg.replicas)), data_sha256=digest,
                    saved_ranks=int(meta.get("config", {}).get("ranks_per_worker", cfg.ranks_per_worker)))

    def _logger(self, start_step: int, resume: bool) -> MultiLogger:
        sinks: list[MetricLogger] = [JSONLSink(self.out_dir / "metrics.jsonl",
                                               truncate_after_step=start_step if resume else None)]
        if self.cfg.tensorboard:
            sinks.append(TensorBoardSink(self.out_dir / "tb"))
        return MultiLogger(*sinks)

    def run(self, *, resume: bool = False, overwrite: bool = False, reuse: bool = False) -> RunResult:
        """M replicas as M threads of this process (the in-process communicator).

        ``resume``: continue from the newest readable checkpoint in ``out_dir``; ``overwrite``: replace
        the run ``out_dir`` holds; ``reuse``: take a finished run of this config as it is, resume an
        interrupted one. Without any, an ``out_dir`` holding a run is an error.
        """
        cfg = self.cfg
        if cfg.worker_sharding == "fsdp":
            raise ValueError(f"worker_sharding='fsdp' shards each worker over its ranks, one process each: launch "
                             f"replicas x ranks_per_worker = {cfg.replicas * cfg.ranks_per_worker} processes with "
                             f"torchrun (torchrun --nproc-per-node {cfg.replicas * cfg.ranks_per_worker} -m diloco "
                             f"train ...), or set worker_sharding=replicate to train in one process")
        if cfg.ranks_per_worker != 1:
            raise ValueError(f"ranks_per_worker={cfg.ranks_per_worker} needs one process per rank: launch "
                             f"{cfg.replicas * cfg.ranks_per_worker} processes with torchrun, "
                             f"or set ranks_per_worker=1")
        plan = self.plan(resume=resume, overwrite=overwrite, reuse=reuse)
        _tell([*plan.notices, *_speed_notices(self.device)])
        if plan.action == "finished":
            return RunResult.from_dict(plan.summary)
        run = self._prepare(plan)
        logger = self._logger(run.start_step, plan.action == "resume")
        bar = progress_bar(self.progress, cfg.total_steps, run.start_step, cfg.method)
        table = StepTable(cfg.replicas, logger, lambda row: update_bar(bar, row))
        # Chosen once per run and kept on resume: the thread count can change float reduction order.
        run.threads = cfg.threads or int((plan.meta or {}).get("threads") or default_threads(cfg.replicas))
        torch.set_num_threads(run.threads)
        try:
            with self._decoupled(run) as syncer_global:  # method=decoupled: the syncer (else nothing)
                results = run_replicas(partial(self._replica_loop, run=run, table=table, logger=logger), cfg.replicas)
            if syncer_global:  # the final loss is the syncer's global parameters', not a learner's copy of them
                from diloco.decoupled.trainer import evaluate_global

                results[0]["final_eval_loss"] = evaluate_global(run.template, syncer_global, run.val,
                                                                bf16=cfg.bf16, device=self.device)
        finally:
            logger.close()
            if bar is not None:
                bar.close()
        return self._finish(run, results[0])

    @contextlib.contextmanager
    def _decoupled(self, run: _Run):
        """method=decoupled: run a syncer for the learners (a thread, or a Ray actor); then write ``merges.jsonl``.

        Yields a dict that holds the syncer's final global parameters once the block has ended (empty otherwise).
        """
        final: dict[str, torch.Tensor] = {}
        if self.cfg.method != "decoupled":
            yield final
            return
        from diloco.decoupled.trainer import decoupled_syncer, write_merges

        with decoupled_syncer(self.cfg, run.template, run.fragments) as syncer:
            self._transport = syncer
            try:
                yield final
            finally:
                self._transport = None
            write_merges(self.out_dir / "merges.jsonl", syncer.records())
            final.update(syncer.global_parameters())

    def run_replica(self, comm: Communicator, *, resume: bool = False, overwrite: bool = False, reuse: bool = False,
                    intra: Communicator | None = None, elastic: bool = False, mesh: Any = None) -> RunResult | None:
        """This process is one replica of ``comm``'s group (torchrun). Replica 0 logs and returns the result.

        With ``cfg.ranks_per_worker`` = R > 1, ``comm`` connects the workers (rank = worker index, e.g.
        :class:`~diloco.comm.mesh.WorkerCommunicator`, whose ``barrier`` spans every process) and
        ``intra`` the R ranks of this worker, over which gradients are averaged every step.
        Logged losses are those of replica 0's first rank (no extra collective per step to average them).

        ``elastic`` (a restart under TorchElastic, the config's ``replicas`` set to the launch's): resume
        from the newest checkpoint if there is one, even one written by another number of workers
        (see :meth:`_restore_resized`), else start; no ``resume`` / ``overwrite``. ``resume``, ``overwrite``
        and ``reuse`` as in :meth:`run`.

        ``mesh`` (``worker_sharding = "fsdp"``, from :func:`~diloco.distributed.setup_communicators`): the
        worker's DeviceMesh; ``comm`` then connects this rank's column (the same-index ranks of every worker)
        and ``intra`` the worker's ranks.
        """
        cfg = self.cfg
        R = cfg.ranks_per_worker
        if (cfg.worker_sharding == "fsdp") != (mesh is not None) or (mesh is not None and intra is None):
            raise ValueError(f"worker_sharding={cfg.worker_sharding!r} but this process was set up for "
                             f"{'sharded' if mesh is not None else 'replicated'} workers: pass "
                             f"setup_communicators(worker_sharding={cfg.worker_sharding!r}) and its mesh and intra")
        if comm.world_size != cfg.replicas:
            raise ValueError(f"config replicas={cfg.replicas} but {comm.world_size} replicas were launched; "
                             f"pass --set replicas={comm.world_size} or launch {cfg.replicas * R} processes")
        if (1 if intra is None else intra.world_size) != R:
            raise ValueError(f"config ranks_per_worker={R} but this worker has "
                             f"{1 if intra is None else intra.world_size} ranks; launch replicas x ranks_per_worker "
                             f"= {cfg.replicas * R} processes")
        if cfg.method == "decoupled":
            raise ValueError("method='decoupled' runs its learners as threads of one process (diloco train "
                             "without torchrun); learners as separate processes are not built yet")
        lead = comm.rank == 0 and (intra is None or intra.rank == 0)
        plan = self.plan(resume=resume, overwrite=overwrite, reuse=reuse, elastic=elastic)  # every process alike
        everyone = _Everyone(comm, intra if mesh is not None else None)
        everyone.barrier()  # ... before the lead writes anything
        if lead:
            _tell([*plan.notices, *_speed_notices(self.device)])
            if elastic and plan.action == "resume":
                _tell([f"elastic restart: resuming from step {plan.start_step} (written by "
                       f"{(plan.meta or {}).get('num_replicas')} workers) with {cfg.replicas} workers"])
        if plan.action == "finished":
            return RunResult.from_dict(plan.summary) if lead else None
        run = self._prepare(plan, everyone, lead)
        logger = self._logger(run.start_step, plan.action == "resume") if lead else MultiLogger()
        bar = progress_bar(self.progress and lead, cfg.total_steps, run.start_step, cfg.method)
        table = StepTable(1, logger, lambda row: update_bar(bar, row))
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        try:
            out = self._replica_loop(comm, run=run, table=table, logger=logger, intra=intra, mesh=mesh)
        finally:
            logger.close()
            if bar is not None:
                bar.close()
        return self._finish(run, out) if lead else None

    def _finish(self, run: _Run, rank0: dict[str, Any]) -> RunResult:
        cfg = self.cfg
        result = RunResult(
            out_dir=self.out_dir,
            final_eval_loss=rank0["final_eval_loss"],
            steps=cfg.total_steps,
            tokens=cfg.total_steps * cfg.tokens_per_step,
            bytes_sent_per_replica=rank0["stats"]["bytes_sent"],
            bytes_received_per_replica=rank0["stats"]["bytes_received"],
            peak_bytes_per_sync=rank0["stats"]["peak_exchange"],
            peak_bytes_in_flight=rank0["stats"]["peak_in_flight"],
            wall_time_s=run.wall_time(),
            train_time_s=rank0["train_time_s"],
            num_params=rank0["num_params"],
            dropped_contributions=rank0["dropped"],
            data_sha256=run.data_sha256,
        )
        write_json(self.out_dir / "summary.json", result.to_dict())
        return result

    # -- one replica ---------------------------------------------------------
    def _replica_loop(self, comm: Communicator, *, run: _Run, table: StepTable, logger: MetricLogger,
                      intra: Communicator | None = None, mesh: Any = None) -> dict[str, Any]:
        """Every replica (thread or process) runs this: build, restore, then train step by step."""
        cfg = self.cfg
        rep = self._build_replica(comm, intra, run, mesh)
        resized = run.saved_replicas not in (None, cfg.replicas) or \
            (rep.sharded and run.saved_ranks not in (None, cfg.ranks_per_worker))
        rep.saved_ranks = run.saved_ranks or cfg.ranks_per_worker
        if run.start_step > 0 and resized:
            self._restore_resized(rep, run.start_step, run.saved_replicas)
        elif run.start_step > 0:
            self._restore(rep, run.start_step)
        final_eval = float("nan")
        if rep.rank == 0 and run.start_step == cfg.total_steps:  # resumed at the end, before the summary
            final_eval = self._evaluate(rep, run, None, None)
        step = run.start_step
        try:
            for step in range(run.start_step + 1, cfg.total_steps + 1):
                out = self._train_step(rep, step)
                table.add(rep.rank, step, self._step_record(rep, step, out))
                if rep.rank == 0 and (step % cfg.eval_every == 0 or step == cfg.total_steps):
                    final_eval = self._evaluate(rep, run, step, logger)
                if rep.writing is not None:  # the checkpoint written in the background since the last step
                    self._commit(rep, *rep.writing)
                if (cfg.checkpoint_interval and step % cfg.checkpoint_interval == 0) or step == cfg.total_steps:
                    self._checkpoint(rep, run, step)
                for callback in self.callbacks:
                    callback.on_step_end(step, rank=rep.rank)
        except CommError as exc:
            where = f"replica {rep.rank}" if intra is None else \
                f"replica {rep.rank} (rank {rep.local} of its {intra.world_size})"
            raise CommError(f"{where} at step {step}: {exc}") from exc
        stats = comm.stats.totals()
        if rep.sharded:  # each rank counted its own column (its shard): the worker's bytes are their sum
            stats = _worker_totals(stats, rep.mesh)
        return {"final_eval_loss": final_eval, "stats": stats, "train_time_s": rep.train_time,
                "num_params": sum(p.numel() for p in rep.params), "dropped": rep.dropped}

    def _build_replica(self, comm: Communicator, intra: Communicator | None, run: _Run, mesh: Any = None) -> _Replica:
        """This replica's model, inner optimizer, algorithm and data sampler (the algorithm equalises inits)."""
        from diloco.data import ShardSampler

        cfg, dev = self.cfg, self.device
        local = 0 if intra is None else intra.rank
        model = copy.deepcopy(run.template).to(dev)
        eval_model = copy.deepcopy(model) if comm.rank == 0 and local == 0 else None
        async_group = None
        if mesh is not None:  # the worker's ranks shard one model (every rank built the same seeded template)
            shard_worker_model(model, mesh, mixed_precision=cfg.fsdp_mixed_precision)
            if cfg.checkpoint_async:
                async_group = _worker_groups(mesh, cfg.replicas, cfg.ranks_per_worker)
        if cfg.compile:  # in place: parameter names (fragments, checkpoints, global state) stay the same
            compile_in_place(model)
        opt = build_inner_optimizer(model, name=cfg.inner_optimizer, lr=cfg.inner_lr, betas=(cfg.beta1, cfg.beta2),
                                    weight_decay=cfg.weight_decay)
        algo = self._algorithm(model, comm, run.fragments)
        # Inside a worker of R replicated ranks: gradients averaged every step (fp32, exact up to the summation
        # order). Sharded workers: FSDP's reduce-scatter averages them.
        in_worker = DataParallel(model, comm=intra, codec="fp32") if intra is not None and mesh is None else None
        # The replica's sampler on every rank of the worker; rank `local` computes `rows` of each batch.
        sampler = ShardSampler(run.data.train, rank=comm.rank, world_size=cfg.replicas,
                               batch_size=cfg.batch_per_replica, seq_len=cfg.seq_len, seed=cfg.seed)
        rows = slice(local * cfg.batch_per_rank, (local + 1) * cfg.batch_per_rank)
        params = [p for p in model.parameters() if p.requires_grad]
        return _Replica(comm=comm, intra=intra, model=model, eval_model=eval_model, opt=opt, algo=algo,
                        in_worker=in_worker, sampler=sampler, rows=rows, params=params, mesh=mesh,
                        async_group=async_group)

    def _algorithm(self, model: torch.nn.Module, comm: Communicator,
                   fragments: list[list[str]] | None = None) -> ReplicaAlgorithm:
        cfg = self.cfg
        if cfg.method == "dp":
            return DataParallel(model, comm=comm, codec=cfg.dp_codec)
        if cfg.method == "decoupled":
            from diloco.decoupled.trainer import decoupled_learner

            return decoupled_learner(cfg, model, self._transport.channel(comm.rank), learner=comm.rank,
                                     fragments=fragments, stats=comm.stats)
        return StreamingDiLoCo(
            model, comm=comm, sync_every=cfg.sync_every, num_fragments=cfg.num_fragments,
            fragment_pattern=cfg.fragment_pattern, fragments=fragments, schedule=cfg.schedule_spec,
            overlap_steps=cfg.overlap_steps,
            merge_alpha=cfg.merge_alpha, codec=get_codec(cfg.codec, topk_density=cfg.topk_density),
            eager=cfg.eager, error_feedback_decay=cfg.ef_decay,
            outer_optimizer=partial(torch.optim.SGD, lr=cfg.outer_lr, momentum=cfg.outer_momentum,
                                    nesterov=cfg.outer_nesterov and cfg.outer_momentum > 0),
        )

    def _load(self, rep: _Replica, step: int, worker: int, rank: int = 0) -> dict[str, Any]:
        """Worker ``worker``'s saved state of ``step`` (sharded workers: onto this rank's shards, with rank
        ``rank``'s non-tensor state)."""
        if not rep.sharded:
            return ckpt.load_replica(self.out_dir, worker, step)
        return sharded_checkpoint.load_worker(self.out_dir, step, worker=worker, rank=rank, model=rep.model,
                                              opt=rep.opt, algo=rep.algo, process_group=rep.mesh.get_group())

    def _restore(self, rep: _Replica, step: int) -> None:
        mine = self._load(rep, step, rep.rank, rep.local)
        rep.model.load_state_dict(mine["model"])
        rep.opt.load_state_dict(mine["optimizer"])
        rep.algo.load_state_dict(mine["algorithm"])
        rep.sampler.load_state_dict(mine["sampler"])
        rep.dropped, rep.train_time = int(mine["dropped"]), float(mine["train_time_s"])

    def _restore_resized(self, rep: _Replica, step: int, saved_replicas: int) -> None:
        """Resume a checkpoint of ``saved_replicas`` workers with ``cfg.replicas`` (an elastic restart), or of
        sharded workers of ``rep.saved_ranks`` ranks with ``cfg.ranks_per_worker`` (DCP reshards every tensor).

        Global parameters and outer-optimizer state are the same in every file: each worker takes
        them from its own. Worker r < saved_replicas keeps file r's local parameters and inner
        optimizer; a worker beyond them starts from the global parameters with a copy of worker 0's
        inner optimizer (AdamW moments and step count). In-flight exchanges are dropped on every
        worker (their contributions were encoded for the old peers): each such fragment's next sync
        starts from the saved global copy. The sampler re-cuts the rest of the epoch
        (:meth:`~diloco.data.ShardSampler.recut_from`).
        """
        own = rep.rank < saved_replicas
        rank = rep.local if rep.local < rep.saved_ranks else 0  # whose counters and sampler position
        saved = self._load(rep, step, rep.rank if own else 0, rank)
        algo_state = dict(saved["algorithm"])
        if algo_state.get("pending"):
            started = {int(p): int(e["started_at"]) for p, e in algo_state["pending"].items()}
            algo_state["dropped_in_flight"] = {**algo_state.get("dropped_in_flight", {}), **started}
            algo_state["pending"] = {}
        rep.model.load_state_dict(saved["model"])
        rep.opt.load_state_dict(saved["optimizer"])
        rep.algo.load_state_dict(algo_state)
        if not own:
            rep.model.load_state_dict(rep.algo.global_state_dict())
        if saved_replicas != self.cfg.replicas:
            rep.sampler.recut_from(saved["sampler"])
        else:  # only the ranks per worker changed: the workers read on as they were
            rep.sampler.load_state_dict(saved["sampler"])
        rep.dropped, rep.train_time = int(saved["dropped"]), float(saved["train_time_s"])

    def _train_step(self, rep: _Replica, step: int) -> _StepOutcome:
        """One inner step: batch, forward/backward, gradient syncs, optimizer step, then the algorithm's syncs."""
        cfg, dev = self.cfg, self.device
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
        reports = rep.algo.after_optimizer_step()
        if step == cfg.total_steps:
            reports += rep.algo.flush()
        rep.dropped += _dropped(reports)
        step_time = time.perf_counter() - t_start
        rep.train_time += step_time
        return _StepOutcome(loss=loss.item(), lr=lr, tokens=tokens,
                            grad_norm=grad_norm,
                            synced_fragments=[r.fragment for r in reports], step_time=step_time,
                            compute_time=compute)

    @staticmethod
    def _step_record(rep: _Replica, step: int, out: _StepOutcome) -> dict[str, Any]:
        stats = rep.comm.stats
        return {
            "step": step, "loss": out.loss, "lr": out.lr, "tokens": out.tokens, "grad_norm": out.grad_norm,
            "bytes_sent": stats.bytes_sent, "bytes_received": stats.bytes_received,
            "peak_in_flight": stats.peak_in_flight, "peak_bytes_per_sync": stats.peak_exchange,
            "synced_fragments": out.synced_fragments, "dropped": rep.dropped,
            "step_time_s": out.step_time, "compute_time_s": out.compute_time,
        }

    def _evaluate(self, rep: _Replica, run: _Run, step: int | None, logger: MetricLogger | None) -> float:
        """Eval loss of the global parameters (replica 0; its first rank evaluates and logs an eval row).

        Sharded workers: every rank of worker 0 calls this, to gather the global parameters' shards.
        """
        if not (rep.evaluates or rep.sharded):
            return float("nan")
        state = rep.algo.global_state_dict()
        if rep.sharded:
            state = full_tensors(state)
        if not rep.evaluates:
            return float("nan")
        assert rep.eval_model is not None
        rep.eval_model.load_state_dict(state)
        loss = evaluate(rep.eval_model, run.val, self.cfg.bf16)
        if logger is not None and step is not None:
            logger.log({"step": step, "eval_loss": loss, "tokens_seen": step * self.cfg.tokens_per_step})
        return loss

    def _checkpoint(self, rep: _Replica, run: _Run, step: int) -> None:
        """Every replica writes its file (sharded workers: every rank its shards); after a barrier replica 0
        makes ``step`` the latest."""
        state = {"model": rep.model.state_dict(), "optimizer": rep.opt.state_dict(),
                 "algorithm": rep.algo.state_dict(), "sampler": rep.sampler.state_dict(), "dropped": rep.dropped,
                 "train_time_s": rep.train_time} if rep.sharded or rep.local == 0 else None
        record = {"config": self.cfg.to_dict(), "num_replicas": self.cfg.replicas, "wall_time_s": run.wall_time(),
                  "threads": run.threads, "data_sha256": run.data_sha256, "vocab_size": run.vocab_size}
        writing = None
        if rep.sharded:
            record["format"] = sharded_checkpoint.FORMAT
            writing = sharded_checkpoint.save_worker(
                self.out_dir, step, worker=rep.rank, rank=rep.local, state=state, model=rep.model, opt=rep.opt,
                algo=rep.algo, process_group=rep.mesh.get_group(), async_group=rep.async_group)
        elif state is not None:  # a worker's replicated ranks hold one state: its first rank writes it
            ckpt.save_replica(self.out_dir, step, rep.rank, state)
        if writing is not None and step < self.cfg.total_steps:
            rep.writing = (step, writing, record)  # committed after the next step (the writes overlap it)
        else:
            self._commit(rep, step, writing, record)

    def _commit(self, rep: _Replica, step: int, writing: Any, record: dict[str, Any]) -> None:
        """Once every rank's files of ``step`` are written (a background write: its Future), replica 0 records
        the step and makes it the latest."""
        if writing is not None:
            writing.result()
        rep.writing = None
        rep.barrier()  # every replica's file is on disk before the step becomes "latest"
        if rep.evaluates:
            ckpt.commit(self.out_dir, step, record, keep=self.cfg.keep_checkpoints)


class _Everyone:
    """A barrier over every process: ``comm``'s, then (sharded workers, whose ``comm`` is one column) ``intra``'s."""

    def __init__(self, comm: Communicator, intra: Communicator | None) -> None:
        self.comm, self.intra = comm, intra

    def barrier(self) -> None:
        self.comm.barrier()
        if self.intra is not None:
            self.intra.barrier()


def _worker_groups(mesh: Any, num_workers: int, ranks_per_worker: int) -> Any:
    """A second process group over this worker's ranks (every process creates every worker's, in one order)."""
    import torch.distributed as dist

    layout = [[w * ranks_per_worker + r for r in range(ranks_per_worker)] for w in range(num_workers)]
    mine, _ = dist.new_subgroups_by_enumeration(layout, backend="gloo")
    assert dist.get_process_group_ranks(mine) == dist.get_process_group_ranks(mesh.get_group())
    return mine


def _worker_totals(stats: dict[str, int], mesh: Any) -> dict[str, int]:
    """Byte counters summed over a sharded worker's ranks (one collective; exchanges counted once)."""
    import torch.distributed as dist

    keys = [k for k in stats if k != "num_exchanges"]
    summed = torch.tensor([stats[k] for k in keys], dtype=torch.int64)
    dist.all_reduce(summed, group=mesh.get_group())
    return {**stats, **dict(zip(keys, summed.tolist(), strict=True))}


def _tell(notices: Sequence[str]) -> None:
    """What the user must know about their run directory (a skipped checkpoint, a finished run)."""
    for line in notices:
        print(f"diloco: {line}", file=sys.stderr, flush=True)


def _speed_notices(device: torch.device) -> list[str]:
    notice = tcmalloc_notice(device)
    return [notice] if notice else []


def _dropped(reports: list[SyncReport]) -> int:
    return sum(len(r.dropped_replicas) for r in reports)


def train_model(cfg: TrainConfig, out_dir: Path, *, cache_dir: Path, resume: bool = False,
                overwrite: bool = False, reuse: bool = False, progress: bool = True, device: str = "cpu") -> RunResult:
    """Train one configuration; see :class:`Trainer` and :meth:`Trainer.run`."""
    return Trainer(cfg, out_dir, cache_dir=cache_dir, progress=progress, device=device).run(
        resume=resume, overwrite=overwrite, reuse=reuse)

