"""The trainer's hooks into every replica's loop: :class:`TrainerCallback` (its defaults do nothing)."""

from __future__ import annotations

from typing import Any


class TrainerCallback:
    """Hooks into every replica's loop; the defaults do nothing. Subclass and pass ``callbacks=[...]``.

    Called in every replica (thread or process), in order; an exception raised
    here stops that replica as any training error would (tests use this to
    simulate a crash after a given step). ``replica`` is the replica's number in
    the run (a decoupled site job's: its learner), ``rank`` its rank in this job.
    """

    def on_replica_start(self, algo: Any, *, replica: int, step: int) -> None:
        """The replica's algorithm is built (a decoupled learner: it has joined its syncer) and its checkpoint, if
        any, restored; its first step is ``step`` + 1. E.g. wrap ``algo.channel`` (a fault harness), or wait."""

    def after_compute(self, step: int, *, replica: int, compute_s: float) -> float:
        """Step ``step``'s compute (forward, backward, optimizer step) took ``compute_s`` seconds; the method's syncs
        come next. Returns the step's compute seconds, as recorded: :class:`~diloco.train.pace.Pace` sleeps to pad
        them (an emulated accelerator's step, a straggler)."""
        return compute_s

    def on_step_end(self, step: int, *, rank: int) -> None:
        """After step ``step`` is complete: trained, logged, evaluated and checkpointed as due."""

    def should_stop(self, step: int, *, replica: int) -> bool:
        """After :meth:`on_step_end`: True ends this replica's training after step ``step``, before ``steps``, as
        cleanly as at the end (a decoupled learner flushes and leaves its syncer, the summary records the step
        reached; no checkpoint is written for the stop). A decoupled site job's learner stops alone (its syncer
        and the other sites go on); the replicas of one job (threads, or the ranks of a torchrun job) must all
        stop after the same step: the job's collectives span them all."""
        return False


__all__ = ["TrainerCallback"]
