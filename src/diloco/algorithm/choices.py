"""The algorithm settings' choices that torch-importing modules use, each spelled once: a ``Literal`` type and
its tuple of values.

Torch-free, so the training config, ``diloco train --help`` and the documentation's reference read the same
values as :mod:`diloco.algorithm.inner` (which imports torch). The guard's actions are
:data:`diloco.algorithm.guard.GUARD_ACTIONS` and the named schedules
:data:`diloco.algorithm.schedule.SCHEDULE_NAMES` (those modules are torch-free).
"""

from __future__ import annotations

from typing import Literal, get_args

#: Inner optimizers by name (``TrainConfig.inner_optimizer``; :func:`~diloco.algorithm.inner.build_inner_optimizer`).
InnerOptimizer = Literal["adamw", "muon"]
INNER_OPTIMIZERS: tuple[InnerOptimizer, ...] = get_args(InnerOptimizer)

__all__ = ["INNER_OPTIMIZERS", "InnerOptimizer"]
