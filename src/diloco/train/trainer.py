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

This module holds the orchestration: checking the config and the run directory,
preparing the data and the run directory, running the replicas as threads, their loop
(restore, step, evaluate, checkpoint, callbacks) and the summary. This process as one
replica under torchrun is :mod:`diloco.train.torchrun_replica` (a mixin of :class:`Trainer`);
the callbacks' hooks, :mod:`diloco.train.callbacks`. What one replica holds and how it is built is
:mod:`diloco.train.replica`; its inner step, :mod:`diloco.train.inner_step`; its
checkpoints (save, commit, restore, elastic resize), :mod:`diloco.train.replica_checkpoint`; the trainer's
checkpoint hooks (a token budget's too: :mod:`diloco.train.budget_checkpoints`),
:mod:`diloco.train.trainer_checkpoints`.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch

from diloco.comm.base import CommError, Communicator
from diloco.comm.local import run_replicas
from diloco.errors import ConfigError
from diloco.files import atomic_write_bytes, write_json
from diloco.train import checkpoint as ckpt
from diloco.train import replica_checkpoint, sharded_checkpoint
from diloco.train.budget_checkpoints import CheckpointGate
from diloco.train.callbacks import TrainerCallback
from diloco.train.config import TrainConfig
from diloco.train.device import check_device
from diloco.train.divergence import DivergenceError, DivergenceGuard, check_training_loss
from diloco.train.environment import environment
from diloco.train.evaluation import evaluate, evaluate_parameters
from diloco.train.inner_step import step_record, train_step
from diloco.train.metrics import JSONLSink, MetricLogger, MultiLogger, TensorBoardSink
from diloco.train.notices import speed_notices, tell, warning_notices
from diloco.train.replica import Replica, Run, build_replica
from diloco.train.result import RunResult
from diloco.train.rundir import RunDirLock, RunDirPlan, check_same_data, clear_run, plan_run_dir
from diloco.train.runtime import Session, runtime_for
from diloco.train.sharding import full_tensors, worker_totals
from diloco.train.step_log import StepTable, progress_bar, update_bar
from diloco.train.threads import default_threads
from diloco.train.torchrun_replica import TorchrunReplica
from diloco.train.trainer_checkpoints import TrainerCheckpoints


class Trainer(TrainerCheckpoints, TorchrunReplica):
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
        from diloco.train.pace import pace_for

        pace = pace_for(cfg)  # the config's step padding and stragglers (step_time, slowdown)
        self.callbacks = (*(() if pace is None else (pace,)), *callbacks)
        # the replicas this job runs: every one, or (a decoupled site job, learner=m) learner m alone
        self.here = cfg.job_replicas
        self.runtime = runtime_for(cfg.method)  # what the method runs beside the replicas (diloco.train.runtime)
        self._session: Session | None = None  # the runtime's service while the replicas run (None: it has none)
        self._lock = RunDirLock(self.out_dir)  # held while this trainer's run trains in out_dir

    # -- setup ---------------------------------------------------------------
    def plan(
        self,
        *,
        resume: bool = False,
        overwrite: bool = False,
        reuse: bool = False,
        elastic: bool = False,
        replace_flag: str = "--overwrite",
        upto: int | None = None,
    ) -> RunDirPlan:
        """Check every setting and decide what to do with ``out_dir`` (see :func:`~diloco.train.rundir.plan_run_dir`).

        Reads only: a mistake found here leaves the run directory exactly as it was.
        """
        self._validate()
        return plan_run_dir(
            self.out_dir,
            self.cfg,
            resume=resume,
            overwrite=overwrite,
            reuse=reuse,
            elastic=elastic,
            replace_flag=replace_flag,
            upto=upto,
        )

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

    def _prepare(self, plan: RunDirPlan, comm: Any = None, lead: bool = True) -> Run:
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
        self.runtime.check_inputs(cfg, template=inputs.model, fragments=inputs.fragments)  # e.g. the syncer's memory
        if lead:  # everything is validated and the data is ready: only now is the run directory touched
            self._set_up_folder(plan, inputs.data)
        if comm is not None and lead:
            comm.barrier()
        # The template was built once and seeded (threads share torch's global RNG); replica 0's copy is
        # broadcast anyway.
        meta = plan.meta or {}
        return Run(
            data=inputs.data,
            val=inputs.val_batches,
            template=inputs.model,
            fragments=inputs.fragments,
            start_step=plan.start_step,
            vocab_size=inputs.data.vocab_size,
            wall_before=float(meta.get("wall_time_s", 0.0)),
            t0=time.perf_counter(),
            saved_replicas=int(meta.get("num_replicas", cfg.job_replicas)),
            data_sha256=digest,
            saved_ranks=int(meta.get("config", {}).get("ranks_per_worker", cfg.ranks_per_worker)),
            offset=max(cfg.learner, 0),
        )

    def _set_up_folder(self, plan: RunDirPlan, data: Any) -> None:
        """The lead's ``out_dir`` (or, under torchrun, a folder of a machine's own: :mod:`diloco.train.run_folders`):
        the old run replaced (``overwrite``) or its uncommitted sharded steps deleted, the folder locked, the config and
        the tokenizer written."""
        if plan.action == "overwrite":
            clear_run(self.out_dir)
        if plan.action == "resume" and (plan.meta or {}).get("format") == sharded_checkpoint.FORMAT:
            ckpt.discard_uncommitted(self.out_dir, plan.start_step)  # before any rank writes one again
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._lock.acquire()  # a new run's folder exists only now; nothing has been written into it yet
        write_json(self.out_dir / "config.json", self.cfg.to_dict())
        if data.tokenizer is not None:  # the run's vocabulary travels with it (diloco export)
            atomic_write_bytes(self.out_dir / "tokenizer.json", data.tokenizer.to_json().encode("utf-8"))

    def _logger(self, start_step: int, resume: bool) -> MultiLogger:
        sinks: list[MetricLogger] = [
            JSONLSink(self.out_dir / "metrics.jsonl", truncate_after_step=start_step if resume else None)
        ]
        if self.cfg.tensorboard:
            sinks.append(TensorBoardSink(self.out_dir / "tb"))
        if self.cfg.metrics_port >= 0:  # the per-step figures in Prometheus' format (diloco.train.prometheus)
            from diloco.train.prometheus import PrometheusSink

            sinks.append(PrometheusSink(self.out_dir, port=self.cfg.metrics_port))
        return MultiLogger(*sinks)

    def run(self, *, resume: bool = False, overwrite: bool = False, reuse: bool = False) -> RunResult:
        """M replicas as M threads of this process (the in-process communicator).

        ``resume``: continue from the newest readable checkpoint in ``out_dir``; ``overwrite``: replace
        the run ``out_dir`` holds; ``reuse``: take a finished run of this config as it is, resume an
        interrupted one. Without any, an ``out_dir`` holding a run is an error, and so is an ``out_dir``
        another process is training in (:class:`~diloco.train.rundir.RunDirLock`).
        """
        try:
            self._lock.acquire()  # before the plan reads the folder: another process's run may be writing it
            return self._run(resume=resume, overwrite=overwrite, reuse=reuse)
        finally:
            self._lock.release()

    def _run(self, *, resume: bool, overwrite: bool, reuse: bool) -> RunResult:
        cfg = self.cfg
        self.runtime.check_reachable(cfg)
        self.runtime.check_launch(cfg, torchrun=False, sharded=False)
        if cfg.worker_sharding == "fsdp":
            raise ConfigError(
                f"worker_sharding='fsdp' shards each worker over its ranks, one process each: launch "
                f"replicas x ranks_per_worker = {cfg.replicas * cfg.ranks_per_worker} processes with "
                f"torchrun (torchrun --nproc-per-node {cfg.replicas * cfg.ranks_per_worker} -m diloco "
                f"train ...), or set worker_sharding=replicate to train in one process"
            )
        if cfg.ranks_per_worker != 1:
            raise ConfigError(
                f"ranks_per_worker={cfg.ranks_per_worker} needs one process per rank: launch "
                f"{cfg.replicas * cfg.ranks_per_worker} processes with torchrun, "
                f"or set ranks_per_worker=1"
            )
        plan = self.plan(resume=resume, overwrite=overwrite, reuse=reuse)
        tell([*plan.notices, *speed_notices(self.device), *warning_notices(cfg)])
        if plan.action == "finished":
            return RunResult.from_dict(plan.summary)
        run = self._prepare(plan)
        logger = self._logger(run.start_step, plan.action == "resume")
        bar = progress_bar(self.progress, cfg.total_steps, run.start_step, cfg.method)
        table = StepTable(self.here, logger, lambda row: update_bar(bar, row))
        # Chosen once per run and kept on resume: the thread count can change float reduction order.
        run.threads = cfg.threads or int((plan.meta or {}).get("threads") or default_threads(self.here))
        torch.set_num_threads(run.threads)
        # learners ending at steps of their own: checkpoints where all are, then a final one (budget_checkpoints)
        budget = cfg.learner_budget == "tokens"
        self._gate = CheckpointGate(self.here) if budget else None
        try:
            with self._open_session(run) as session:  # the method's service (decoupled: the syncer), if it has one
                results = run_replicas(partial(self._replica_loop, run=run, table=table, logger=logger), self.here)
                final = self._save_final(results, session) if budget else None  # while the syncer runs
            table.flush()  # the steps some learners did not reach (learner_budget=tokens)
            if final is not None:
                self._commit_final(run, results, *final, session)
            if session is not None:
                self._service_result(results[0], run, session, results)
        finally:
            logger.close()
            if bar is not None:
                bar.close()
        return self._finish(run, results[0])

    @contextlib.contextmanager
    def _open_session(self, run: Run, comm: Communicator | None = None, intra: Communicator | None = None):
        """The runtime's session for the ``with`` block (:meth:`~diloco.train.runtime.MethodRuntime.session`),
        kept where the replicas' loops find it."""
        with self.runtime.session(
            self.cfg,
            template=run.template,
            fragments=run.fragments,
            out_dir=self.out_dir,
            data=run.data,
            comm=comm,
            intra=intra,
            start_step=run.start_step,
        ) as session:
            self._session = session
            try:
                yield session
            finally:
                self._session = None

    def _service_result(
        self,
        out: dict[str, Any],
        run: Run,
        session: Session,
        replicas: Sequence[dict[str, Any]],
    ) -> None:
        """Into the lead's result ``out``: the run's final loss from the session's global parameters where it holds
        them (not a replica's copy of them), and the session's summary fields from the ``replicas``' loop results
        (decoupled: goodput, waiting shares)."""
        final = session.final_parameters()
        if final:
            out["final_eval_loss"] = evaluate_parameters(
                run.template, final, run.val, bf16=self.cfg.bf16, device=self.device
            )
        out.update(session.result_fields(replicas))

    def _finish(self, run: Run, rank0: dict[str, Any]) -> RunResult:
        cfg = self.cfg
        result = RunResult(
            out_dir=self.out_dir,
            final_eval_loss=rank0["final_eval_loss"],
            steps=rank0.get("steps", cfg.total_steps),
            tokens=_tokens(cfg, rank0),
            bytes_sent_per_replica=rank0["stats"]["bytes_sent"],
            bytes_received_per_replica=rank0["stats"]["bytes_received"],
            peak_bytes_per_sync=rank0["stats"]["peak_exchange"],
            peak_bytes_in_flight=rank0["stats"]["peak_in_flight"],
            wall_time_s=run.wall_time(),
            train_time_s=rank0["train_time_s"],
            num_params=rank0["num_params"],
            dropped_contributions=rank0["dropped"],
            data_sha256=run.data_sha256,
            goodput=rank0.get("goodput"),
            environment=environment(device=str(self.device)),
            wait_share=rank0.get("wait_share"),
            learner_steps=rank0.get("learner_steps"),
        )
        write_json(self.out_dir / "summary.json", result.to_dict())
        return result

    # -- one replica ---------------------------------------------------------
    def _replica_loop(
        self,
        comm: Communicator,
        *,
        run: Run,
        table: StepTable,
        logger: MetricLogger,
        intra: Communicator | None = None,
        mesh: Any = None,
    ) -> dict[str, Any]:
        """Every replica (thread or process) runs this: build, restore, then train step by step."""
        cfg = self.cfg
        rep = build_replica(cfg, comm, intra, run, device=self.device, mesh=mesh, session=self._session)
        resized = run.saved_replicas not in (None, cfg.job_replicas) or (
            rep.sharded and run.saved_ranks not in (None, cfg.ranks_per_worker)
        )
        rep.saved_ranks = run.saved_ranks or cfg.ranks_per_worker
        if run.start_step > 0 and resized:
            self._restore_resized(rep, run.start_step, run.saved_replicas)
        elif run.start_step > 0:
            replica_checkpoint.restore(rep, run.start_step, run_dir=self.out_dir)
        learner_log = None  # the replica's own rows (decoupled: learner-<m>.jsonl), from its lead rank
        if self._session is not None and rep.local == 0:
            learner_log = self._session.replica_log(self.out_dir, rep.index, append=run.start_step > 0)
            if learner_log is not None:
                learner_log.start(rep.algo, run.start_step)
        for callback in self.callbacks:
            callback.on_replica_start(rep.algo, replica=rep.index, step=run.start_step)
        # the callbacks that change a step's compute time (Pace): none, and train_step is as it was
        paced = [c for c in self.callbacks if type(c).after_compute is not TrainerCallback.after_compute]
        after_compute = partial(_after_compute, paced, replica=rep.index) if paced else None
        final_eval = float("nan")
        guard = DivergenceGuard(cfg, vocab_size=run.vocab_size)  # replica 0's evaluations (diloco.train.divergence)
        if rep.rank == 0 and run.start_step == cfg.total_steps:  # resumed at the end, before the summary
            final_eval = self._evaluate(rep, run, None, None)
        step = run.start_step
        try:
            # learner_budget=tokens: a learner ends when its syncer counts the shared budget trained (out.last), its
            # step before or after `steps`; checkpoints only where every learner is (self._gate), a final one after
            budget = cfg.learner_budget == "tokens"
            assert not budget or self._gate is not None, "a token budget's learners: threads, or a site job's one"
            for step in (
                itertools.count(run.start_step + 1) if budget else range(run.start_step + 1, cfg.total_steps + 1)
            ):
                out = train_step(rep, step, cfg=cfg, device=self.device, after_compute=after_compute)
                checkpoint_due = self._checkpoint_due(rep, step, out)
                if checkpoint_due and self._session is not None:  # what the method finishes first is the step's
                    self._prepare_checkpoint(rep, out)
                table.add(rep.rank, step, step_record(rep, step, out))
                check_training_loss(out.loss, step=step, replica=rep.rank, cfg=cfg)  # before a log that refuses NaN
                if learner_log is not None:
                    learner_log.add(rep.algo, step, out)
                if rep.rank == 0 and (step % cfg.eval_every == 0 or out.last):
                    final_eval = self._evaluate(rep, run, step, logger)
                    if rep.evaluates:
                        guard.check_eval(final_eval, step=step)
                if rep.writing is not None:  # the checkpoint written in the background since the last step
                    replica_checkpoint.commit(
                        rep, *rep.writing, run_dir=self.out_dir, keep=cfg.keep_checkpoints, folder=self._folder
                    )
                if checkpoint_due:
                    if cfg.diverge_factor:  # every replica past the divergence checks before any writes this step
                        rep.barrier()
                    self._checkpoint(rep, run, step)
                for callback in self.callbacks:
                    callback.on_step_end(step, rank=rep.rank)
                if out.last:
                    break
                if any(c.should_stop(step, replica=rep.index) for c in self.callbacks):
                    rep.dropped += sum(len(r.dropped_replicas) for r in rep.algo.finish())  # leave, as at the end
                    if rep.rank == 0:
                        final_eval = self._evaluate(rep, run, step, logger)
                    break
        except DivergenceError as exc:
            if self._session is not None:  # replicas waiting on the method's service (a syncer) stop too
                self._session.abort(str(exc))
            raise
        except CommError as exc:
            where = (
                f"replica {rep.rank}"
                if intra is None
                else f"replica {rep.rank} (rank {rep.local} of its {intra.world_size})"
            )
            raise CommError(f"{where} at step {step}: {exc}") from exc
        finally:
            if self._gate is not None:  # ended, or failed: the others take no checkpoint waiting for this learner
                self._gate.leave()
            if learner_log is not None:
                learner_log.close()
        stats = comm.stats.totals()
        if rep.sharded:  # each rank counted its own column (its shard): the worker's bytes are their sum
            stats = worker_totals(stats, rep.mesh)
        return {
            "final_eval_loss": final_eval,
            "stats": stats,
            "train_time_s": rep.train_time,
            "num_params": sum(p.numel() for p in rep.params),
            "dropped": rep.dropped,
            "waited_s": getattr(rep.algo, "wait_seconds", None),
            "steps": step,
        } | ({"final_state": replica_checkpoint.replica_state(rep)} if self._gate is not None else {})

    def _evaluate(self, rep: Replica, run: Run, step: int | None, logger: MetricLogger | None) -> float:
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


def _after_compute(callbacks: Sequence[TrainerCallback], compute_s: float, *, step: int, replica: int) -> float:
    for callback in callbacks:
        compute_s = callback.after_compute(step, replica=replica, compute_s=compute_s)
    return compute_s


def _tokens(cfg: TrainConfig, rank0: dict[str, Any]) -> int:
    """The run's tokens: the steps of every learner of the run, each on its share of the batch (decoupled: they may
    differ; a site job's with a token budget, its own learner's: the run's are counted at the service), else
    replica 0's steps of the global batch."""
    learner_steps = rank0.get("learner_steps")
    if learner_steps is not None and (len(learner_steps) == cfg.replicas or cfg.learner_budget == "tokens"):
        return sum(learner_steps) * cfg.batch_per_replica * cfg.seq_len
    return rank0.get("steps", cfg.total_steps) * cfg.tokens_per_step


def train_model(
    cfg: TrainConfig,
    out_dir: Path,
    *,
    cache_dir: Path,
    resume: bool = False,
    overwrite: bool = False,
    reuse: bool = False,
    progress: bool = True,
    device: str = "cpu",
) -> RunResult:
    """Train one configuration; see :class:`Trainer` and :meth:`Trainer.run`."""
    return Trainer(cfg, out_dir, cache_dir=cache_dir, progress=progress, device=device).run(
        resume=resume, overwrite=overwrite, reuse=reuse
    )
