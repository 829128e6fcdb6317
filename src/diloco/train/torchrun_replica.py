"""The trainer's torchrun path: this process is one replica (or one rank of a worker) of a run launched with
torchrun (:meth:`TorchrunReplica.run_replica`, what ``diloco train`` calls under torchrun).

A mixin of :class:`~diloco.train.trainer.Trainer`: it checks that the launch matches the config (replicas, ranks
per worker, sharding), plans the run directory on every process alike, lets the lead process write it, and runs
the trainer's one replica loop in this process; the in-process path (threads) is :meth:`Trainer.run
<diloco.train.trainer.Trainer.run>`.
"""

from __future__ import annotations

from typing import Any

import torch

from diloco.comm.base import Communicator
from diloco.errors import ConfigError
from diloco.train.budget_checkpoints import CheckpointGate
from diloco.train.metrics import MultiLogger
from diloco.train.notices import speed_notices, tell, warning_notices
from diloco.train.replica import Everyone
from diloco.train.result import RunResult
from diloco.train.run_folders import agree_plan, find_folders, where
from diloco.train.step_log import StepTable, progress_bar, update_bar


class TorchrunReplica:
    """:meth:`run_replica` for :class:`~diloco.train.trainer.Trainer` (which provides the rest: ``plan``,
    ``_prepare``, ``_open_session``, ``_replica_loop``, ``_service_result``, ``_finish``)."""

    def run_replica(
        self,
        comm: Communicator,
        *,
        resume: bool = False,
        overwrite: bool = False,
        reuse: bool = False,
        intra: Communicator | None = None,
        elastic: bool = False,
        mesh: Any = None,
    ) -> RunResult | None:
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

        The lead process (worker 0's rank 0, the one that writes the run's files) holds the folder's
        :class:`~diloco.train.rundir.RunDirLock` while it trains. Machines whose ``--out`` is a folder of their own
        (no shared file system; found by :func:`~diloco.train.run_folders.find_folders`) each keep their workers'
        checkpoints there, the first worker of each holding its lock, and resume from it
        (:func:`~diloco.train.run_folders.agree_plan`).
        """
        try:
            if comm.rank == 0 and (intra is None or intra.rank == 0):
                self._lock.acquire()
            return self._run_replica(
                comm, resume=resume, overwrite=overwrite, reuse=reuse, intra=intra, elastic=elastic, mesh=mesh
            )
        finally:
            self._lock.release()

    def _run_replica(
        self,
        comm: Communicator,
        *,
        resume: bool,
        overwrite: bool,
        reuse: bool,
        intra: Communicator | None,
        elastic: bool,
        mesh: Any,
    ) -> RunResult | None:
        cfg = self.cfg
        R = cfg.ranks_per_worker
        if (cfg.worker_sharding == "fsdp") != (mesh is not None) or (mesh is not None and intra is None):
            raise ConfigError(
                f"worker_sharding={cfg.worker_sharding!r} but this process was set up for "
                f"{'sharded' if mesh is not None else 'replicated'} workers: pass "
                f"setup_communicators(worker_sharding={cfg.worker_sharding!r}) and its mesh and intra"
            )
        if comm.world_size != self.here:
            raise ConfigError(
                f"config replicas={cfg.replicas} but {comm.world_size} replicas were launched; "
                f"pass --set replicas={comm.world_size} or launch {cfg.replicas * R} processes"
                if self.here == cfg.replicas
                else f"a site job (learner={cfg.learner}) runs one learner but {comm.world_size} were launched: "
                f"launch ranks_per_worker = {R} processes (torchrun --nproc-per-node {R})"
            )
        if (1 if intra is None else intra.world_size) != R:
            raise ConfigError(
                f"config ranks_per_worker={R} but this worker has "
                f"{1 if intra is None else intra.world_size} ranks; launch replicas x ranks_per_worker "
                f"= {cfg.replicas * R} processes"
            )
        self.runtime.check_reachable(cfg)
        self.runtime.check_launch(cfg, torchrun=True, sharded=mesh is not None)
        lead = comm.rank == 0 and (intra is None or intra.rank == 0)
        # every process reads its --out (each machine may have its own), and all settle on one plan
        plan = agree_plan(
            lambda upto: self.plan(resume=resume, overwrite=overwrite, reuse=reuse, elastic=elastic, upto=upto),
            comm,
            intra,
            self.out_dir,
        )
        everyone = Everyone(comm, intra if mesh is not None else None)
        everyone.barrier()  # ... before the lead writes anything
        if lead:
            tell([*plan.notices, *speed_notices(self.device), *warning_notices(cfg)])
            if elastic and plan.action == "resume":
                tell(
                    [
                        f"elastic restart: resuming from step {plan.start_step} (written by "
                        f"{(plan.meta or {}).get('num_replicas')} workers) with {cfg.replicas} workers"
                    ]
                )
        if plan.action == "finished":
            return RunResult.from_dict(plan.summary) if lead else None
        run = self._prepare(plan, everyone, lead)
        self._folder = folder = find_folders(comm, intra, self.out_dir, everyone.barrier)
        if not folder.shared and elastic:
            raise ConfigError(
                f"--elastic needs one --out that every machine shares (a worker that joins reads worker 0's "
                f"checkpoint), but {where(self.out_dir)} holds the files of workers {list(folder.workers)} only: "
                f"put --out on a shared file system, or drop --elastic (torchrun --max-restarts with --resume auto "
                f"restarts the same machines, each from its own folder)"
            )
        if folder.lead and not lead:  # a folder of this machine's own: what the lead writes into its folder
            self._set_up_folder(plan, run.data)
        logger = self._logger(run.start_step, plan.action == "resume") if lead else MultiLogger()
        bar = progress_bar(self.progress and lead, cfg.total_steps, run.start_step, cfg.method)
        table = StepTable(1, logger, lambda row: update_bar(bar, row))
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        # a site job of one rank with a token budget (check_launch refuses the others): it ends at a step of its own
        self._gate = CheckpointGate(1) if cfg.learner_budget == "tokens" else None
        try:
            with self._open_session(run, comm, intra) as session:  # the method's service, if it has one
                out = self._replica_loop(comm, run=run, table=table, logger=logger, intra=intra, mesh=mesh)
                final = self._save_final([out], session) if self._gate is not None else None
            if final is not None:  # its final checkpoint: this learner's state at its last step
                self._commit_final(run, [out], *final, session)
            times = session.learner_times(out) if session is not None else None  # a collective of every process
            if lead and session is not None:
                self._service_result(out, run, session, times or [])
        finally:
            logger.close()
            if bar is not None:
                bar.close()
        return self._finish(run, out) if lead else None


__all__ = ["TorchrunReplica"]
