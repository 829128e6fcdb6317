"""The trainer's checkpoints, a mixin of :class:`~diloco.train.trainer.Trainer`: a replica's checkpoint of a step
(:mod:`diloco.train.replica_checkpoint`), what a method's session finishes before it, the restore of a resized
run, and, for learners that end at steps of their own (``learner_budget=tokens``), the gate of their periodic
checkpoints and the run's final checkpoint (:mod:`diloco.train.budget_checkpoints`). Methods, so that a subclass
can wrap them."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch

from diloco.files import atomic_write_with
from diloco.train import checkpoint as ckpt
from diloco.train import replica_checkpoint
from diloco.train.budget_checkpoints import FINAL_GLOBAL, CheckpointGate, final_record
from diloco.train.config import TrainConfig
from diloco.train.replica import Replica, Run
from diloco.train.run_folders import Folder
from diloco.train.runtime import Session


class TrainerCheckpoints:
    """Checkpoint hooks for :class:`~diloco.train.trainer.Trainer` (which provides ``cfg``, ``out_dir``,
    ``_session`` and ``_gate``)."""

    cfg: TrainConfig
    out_dir: Path
    _session: Session | None
    _gate: CheckpointGate | None = None  # learner_budget=tokens: the learners' periodic checkpoints
    _folder: Folder | None = None  # torchrun: out_dir as the job found it (None: one folder every replica shares)

    def _checkpoint_due(self, rep: Replica, step: int, out: Any) -> bool:
        """Whether the replica writes a checkpoint after ``step`` (``out``: its outcome): every ``checkpoint_every``
        steps and at its last; a learner of a token budget, at a periodic step every learner reaches, none having
        ended (its final state is written with the others' once all have ended: :meth:`_save_final`)."""
        interval = self.cfg.checkpoint_interval
        periodic = bool(interval and step % interval == 0)
        if self._gate is None:
            return periodic or out.last
        return self._gate.due(rep.index, step, periodic=periodic, last=out.last)

    def _checkpoint(self, rep: Replica, run: Run, step: int) -> None:
        """Write this replica's state of ``step``; it is committed now or, written in the background, after the
        next step (:func:`~diloco.train.replica_checkpoint.save`). A method's session writes its own state beside
        the replicas' (:meth:`~diloco.train.runtime.Session.save`)."""
        cfg = self.cfg
        session = self._session
        replica_checkpoint.save(
            rep,
            step,
            run_dir=self.out_dir,
            record=replica_checkpoint.run_record(cfg, run),
            keep=cfg.keep_checkpoints,
            last=step >= cfg.total_steps,
            extra=partial(session.save, self.out_dir, step) if session is not None else None,
            folder=self._folder,
        )

    def _prepare_checkpoint(self, rep: Replica, out: Any) -> None:
        """At a checkpoint step, before the step is logged: what the method's session finishes before the replica's
        state is saved (:meth:`~diloco.train.runtime.Session.prepare_checkpoint`; decoupled: the replies in
        flight, applied now), counted in the step's row as the step's own syncs."""
        assert self._session is not None
        reports = self._session.prepare_checkpoint(rep.algo)
        out.synced_fragments += [r.fragment for r in reports]
        rep.dropped += sum(len(r.dropped_replicas) for r in reports)

    def _restore_resized(self, rep: Replica, step: int, saved_replicas: int) -> None:
        """Resume a checkpoint written by another number of workers or ranks per worker
        (:func:`~diloco.train.replica_checkpoint.restore_resized`)."""
        replica_checkpoint.restore_resized(
            rep, step, run_dir=self.out_dir, saved_replicas=saved_replicas, replicas=self.cfg.replicas
        )

    # -- a token budget's final checkpoint (every learner has ended) -----------------------------------------------
    def _save_final(self, results: Sequence[dict[str, Any]], session: Session | None) -> tuple[int, list[str]]:
        """While the session still runs, every learner having ended: each learner's state at its own last step (in
        its loop result, ``final_state``) into the folder of the furthest learner's step, and the session's own
        state beside them. Returns that step and the session's files (:meth:`_commit_final` records them)."""
        step = max(int(r["steps"]) for r in results)
        for rank, result in enumerate(results):
            ckpt.save_replica(self.out_dir, step, rank, result.pop("final_state"))
        names = session.save(self.out_dir, step) if session is not None else []
        return step, list(names)

    def _commit_final(
        self, run: Run, results: Sequence[dict[str, Any]], step: int, names: list[str], session: Session | None
    ) -> None:
        """Once the session has ended: the run's final global parameters (:data:`FINAL_GLOBAL`, where the session
        holds them) beside the learners' files, then the final record (:func:`final_record`), the latest step."""
        final = session.final_parameters() if session is not None else None
        if final:
            state = {k: v.detach().cpu() for k, v in final.items()}
            atomic_write_with(ckpt.step_dir(self.out_dir, step) / FINAL_GLOBAL, lambda f: torch.save(state, f))
            names = [*names, FINAL_GLOBAL]
        record = final_record(replica_checkpoint.run_record(self.cfg, run), [int(r["steps"]) for r in results])
        ckpt.commit(self.out_dir, step, record, keep=self.cfg.keep_checkpoints, extra=names)


__all__ = ["TrainerCheckpoints"]
