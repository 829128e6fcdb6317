"""The divergence guard: a run whose loss is no longer finite, or climbs far above its first evaluation, stops.

Every method, every runtime. The trainer asks :func:`check_training_loss` after each step of every replica
(its own training loss) and :meth:`DivergenceGuard.check_eval` after each evaluation (replica 0); either
raises :class:`DivergenceError` *before* that step's checkpoint is written, and every replica passes a
barrier before it writes one, so a diverged state never reaches the run's checkpoints: the ones already
there stay as they were (to change a setting that caused it, start a new run from scratch or from them by
hand; ``diverge_factor`` itself may change on ``--resume``). The
CLI exits with status 3 and the message, which names the step, the loss and the settings that usually
cause a divergence.

The threshold is ``diverge_factor`` (default 3): an evaluation loss above 3 x the reference, the smaller of
the run's first evaluation (the first of this process: a resumed run takes its first evaluation after the
resume) and ln(vocab_size), the loss of a model that has learnt nothing. A healthy run's evaluation
loss falls after its first evaluation: in studies/decoupled-quorum the 141 runs of data-parallel, K = M and
the scaled outer steps reached at most 1.005 x that reference, and all 11 runs that diverged passed 3
(the worst run that did not diverge, with a whole outer step per merge, reached 1.69 x). 0 turns the
guard off.
"""

from __future__ import annotations

import math
from typing import Any


class DivergenceError(RuntimeError):
    """A run diverged (its loss is not finite or far above its first evaluation); the message says where and why."""


def likely_causes(cfg: Any) -> str:
    """The settings that usually make a run diverge, with this run's values."""
    parts = [f"inner_lr={cfg.inner_lr:g} (try a third of it)"]
    if cfg.method != "dp":
        parts.append(f"outer_lr={cfg.outer_lr:g} with outer_momentum={cfg.outer_momentum:g}")
    if cfg.method == "decoupled":
        k = cfg.quorum or cfg.replicas
        parts.append(
            f"quorum K={k} of replicas M={cfg.replicas} with outer_scale={cfg.outer_scale!r} "
            f"(a merge of k < M learners must apply only a share of an outer step: outer_scale=auto, "
            f"the default)"
        )
    return "; ".join(parts)


def check_training_loss(loss: float, *, step: int, replica: int, cfg: Any) -> None:
    """Raise :class:`DivergenceError` if replica ``replica``'s training loss of ``step`` is not finite
    (the guard on: ``cfg.diverge_factor`` > 0)."""
    if cfg.diverge_factor and not math.isfinite(loss):
        raise DivergenceError(
            f"the run diverged at step {step}: replica {replica}'s training loss is {loss} (not finite). "
            f"Usual causes: {likely_causes(cfg)}. No checkpoint of this state was written; the earlier ones "
            f"are as they were. diverge_factor=0 turns this guard off."
        )


class DivergenceGuard:
    """Replica 0's evaluations. The reference is the smaller of the first evaluation and ln(vocab_size) (the loss
    of a model that predicts every token alike, about where training starts): a run already far off at its
    first evaluation is not its own reference. A later evaluation above ``factor`` x the reference, or any that
    is not finite, raises :class:`DivergenceError`. ``factor`` 0: off."""

    def __init__(self, cfg: Any, *, vocab_size: int | None = None) -> None:
        self.cfg = cfg
        self.factor = float(cfg.diverge_factor)
        self.uniform = math.log(vocab_size) if vocab_size and vocab_size > 1 else math.inf
        self.first: float | None = None
        self.first_step: int | None = None

    def reference(self) -> float:
        assert self.first is not None, "no evaluation yet"
        return min(self.first, self.uniform)

    def check_eval(self, loss: float, *, step: int) -> None:
        if not self.factor:
            return
        if math.isfinite(loss) and self.first is None:
            self.first, self.first_step = loss, step
        if math.isfinite(loss) and loss <= self.factor * self.reference():
            return
        if math.isfinite(loss):
            ref = self.reference()
            what = (
                f"the evaluation loss is {loss:.4g}, {loss / ref:.1f} x the reference {ref:.4g} (diverge_factor="
                f"{self.factor:g}; the reference is the smaller of the first evaluation, {self.first:.4g} at step "
                f"{self.first_step}, and ln(vocab_size) = {self.uniform:.4g}, the loss before training)"
            )
        else:
            what = f"the evaluation loss is {loss} (not finite)"
        raise DivergenceError(
            f"the run diverged at step {step}: {what}. Usual causes: {likely_causes(self.cfg)}. No checkpoint "
            f"of this state was written; the earlier ones are as they were. A larger diverge_factor (or 0: off, "
            f"which a --resume may change) lets such a run go on."
        )


def evaluation_errors(cfg: Any) -> list[str]:
    """What is wrong with a training config's evaluations and its divergence guard (each message names the value
    and the fix)."""
    errors = []
    if not (cfg.eval_every >= 1 and cfg.eval_batches >= 1):
        errors.append(f"eval_every={cfg.eval_every}, eval_batches={cfg.eval_batches}: both must be >= 1")
    if cfg.eval_sequences < 0:
        errors.append(
            f"eval_sequences={cfg.eval_sequences}: give the number of validation windows per evaluation "
            f"(e.g. 2048), or 0 for eval_batches x global_batch"
        )
    if not (cfg.diverge_factor == 0 or cfg.diverge_factor > 1):
        errors.append(
            f"diverge_factor={cfg.diverge_factor}: give a factor > 1 (default 3: stop when an evaluation loss "
            f"exceeds 3 x min(first evaluation, ln vocab_size)) or 0 to turn the divergence guard off"
        )
    return errors


__all__ = ["DivergenceError", "DivergenceGuard", "check_training_loss", "evaluation_errors", "likely_causes"]
