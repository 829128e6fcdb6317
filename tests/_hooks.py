"""Trainer callbacks the tests use (see :class:`diloco.train.trainer.TrainerCallback`)."""

from __future__ import annotations

from diloco.train.trainer import TrainerCallback


class SimulatedCrash(RuntimeError):
    """Raised by :class:`CrashAfter`: a replica 'dies' between two steps."""


class CrashAfter(TrainerCallback):
    """Stop every replica right after step ``step`` (trained, logged and checkpointed as due)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, step: int, *, rank: int) -> None:
        if step >= self.step:
            raise SimulatedCrash(f"stopped after step {self.step}")
