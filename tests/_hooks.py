"""Trainer callbacks the tests use (see :class:`diloco.train.trainer.TrainerCallback`)."""

from __future__ import annotations

import threading

from diloco.train.trainer import TrainerCallback


class SimulatedCrash(RuntimeError):
    """Raised by :class:`CrashAfter`: a replica 'dies' between two steps."""


class CrashAfter(TrainerCallback):
    """Stop every replica right after step ``step`` (trained, logged and checkpointed as due).

    The ``replicas`` replica threads first wait for each other, so that every one has finished
    the step, replica 0's checkpoint record included, before any stops: otherwise the first to
    stop aborts the group while another may still be finishing a checkpoint.
    """

    def __init__(self, step: int, *, replicas: int) -> None:
        self.step = step
        self._together = threading.Barrier(replicas)

    def on_step_end(self, step: int, *, rank: int) -> None:
        if step >= self.step:
            self._together.wait(timeout=120)
            raise SimulatedCrash(f"stopped after step {self.step}")
