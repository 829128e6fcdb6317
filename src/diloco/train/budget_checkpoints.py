"""Checkpoints of a run whose replicas end at steps of their own (decoupled learners, ``learner_budget=tokens``).

Such learners share no last step, and a checkpoint is written by every learner at one step. So:

* a *periodic* checkpoint at step k is taken only if every learner of the process reaches k with none having
  ended (:class:`CheckpointGate`: the learners wait at k for each other, as a checkpoint's barrier makes them do
  anyway; once the first learner has ended, no learner takes another). A resume from one starts every learner at
  k, as for ``learner_budget=steps``;
* once every learner has ended, the run's *final* checkpoint (:func:`final_record`) holds each learner's state at
  its own last step, the syncer's state and the run's final global parameters (:data:`FINAL_GLOBAL`, what
  ``diloco export`` takes from it); its folder is named after the furthest learner's step and its record says
  ``"final": true`` with every learner's last step (``learner_steps``). A resume of that run says it is
  finished (:func:`final_plan_error`): it is not trained further.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

#: The final checkpoint's file of the run's final global parameters (name -> tensor, the syncer's, FP32).
FINAL_GLOBAL = "global.pt"


class CheckpointGate:
    """Whether the ``replicas`` learners of this process take a periodic checkpoint at a step: only if every one
    reaches it, none having ended before (:meth:`due`). Thread-safe; one per run."""

    def __init__(self, replicas: int, *, timeout: float = 600.0) -> None:
        assert replicas >= 1, replicas
        self.replicas, self.timeout = replicas, timeout
        self._cond = threading.Condition()
        self._arrived: dict[int, set[int]] = {}  # step -> the learners waiting there
        self._open: set[int] = set()  # steps every learner reached
        self.ended = False  # a learner has ended (or failed): no checkpoint from now on

    def due(self, replica: int, step: int, *, periodic: bool, last: bool) -> bool:
        """After learner ``replica``'s ``step``: True if it is a ``periodic`` checkpoint step that every learner
        reaches without any having ended (waiting for the others here); False otherwise, at once where it can be
        told. ``last``: the learner's last step (it ends here: no checkpoint, and none from now on)."""
        if last:
            self.leave()
            return False
        if not periodic:
            return False
        with self._cond:
            if self.ended:
                return False
            here = self._arrived.setdefault(step, set())
            here.add(replica)
            if len(here) == self.replicas:
                self._open.add(step)
                self._cond.notify_all()
            if not self._cond.wait_for(lambda: self.ended or step in self._open, timeout=self.timeout):
                raise RuntimeError(
                    f"learner {replica} waited {self.timeout:.0f} s at the checkpoint of step {step} for the other "
                    f"learners ({sorted(here)} arrived)"
                )
            return step in self._open

    def leave(self) -> None:
        """A learner has ended (or failed): no more checkpoints; those waiting at one go on without it."""
        with self._cond:
            self.ended = True
            self._cond.notify_all()


def final_record(record: dict[str, Any], learner_steps: list[int]) -> dict[str, Any]:
    """The final checkpoint's record: the run's (``record``) marked final, with every learner's last step."""
    return {**record, "final": True, "learner_steps": [int(s) for s in learner_steps]}


def final_plan_error(meta: dict[str, Any], out_dir: Path, *, changed: list[str], finished: bool) -> str | None:
    """Why a resume of a run whose newest checkpoint is final (``meta``) is refused: None when the run is
    ``finished`` (its summary written) and its budget not ``changed`` (the plan then says it is finished)."""
    steps = meta.get("learner_steps")
    if changed:
        return (
            f"--resume: the run in {out_dir} has ended (learner_budget=tokens: its final checkpoint holds learners "
            f"at steps {steps}) and is not trained further ({'; '.join(changed)}); train a new run in another --out"
        )
    if finished:
        return None
    return (
        f"--resume: the run in {out_dir} has ended (learner_budget=tokens: its final checkpoint holds learners at "
        f"steps {steps}) but its summary.json was not written; diloco export takes the final checkpoint as it "
        f"is, or --overwrite trains the run again"
    )


__all__ = ["FINAL_GLOBAL", "CheckpointGate", "final_plan_error", "final_record"]
