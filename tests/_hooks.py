"""Trainer callbacks the tests use (see :class:`diloco.train.trainer.TrainerCallback`), and a real kill -9 of a run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from diloco.train import checkpoint as ckpt
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


def sigkill_after_checkpoint(args: list[str], run: Path, *, step: int, log: Path, timeout: float = 120.0) -> int:
    """Start ``python -m diloco ARGS`` (training into ``run``), SIGKILL it once its checkpoint of ``step`` (or a
    later one) is committed; returns the newest committed step. Fails with the run's log if it ends first."""
    with open(log, "wb") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "diloco", *args], stdout=f, stderr=subprocess.STDOUT, env=os.environ.copy()
        )
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if ckpt.latest_meta(run)["step"] >= step:
                    break
            except ValueError:
                pass
            assert proc.poll() is None, f"the run ended before step {step}:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"no checkpoint of step {step} in {timeout:g} s:\n{log.read_text()}"
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    return ckpt.latest_meta(run)["step"]


class SigkillBeside(threading.Thread):
    """:func:`sigkill_after_checkpoint` in a thread of its own, beside what this thread runs meanwhile (the
    uninterrupted reference, trained in this process with one torch thread: the run to kill takes the other core);
    :meth:`stopped_at` waits for it and gives its result (or raises its error)."""

    def __init__(self, args: list[str], run: Path, *, step: int, log: Path) -> None:
        super().__init__(daemon=True)
        self._call = lambda: sigkill_after_checkpoint(args, run, step=step, log=log)
        self._result: int | None = None
        self._error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self._result = self._call()
        except BaseException as exc:  # raised again by stopped_at, in the test's thread
            self._error = exc

    def stopped_at(self) -> int:
        self.join()
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result
