"""Decoupled DiLoCo's settings' choices, each spelled once: a ``Literal`` type and its tuple of values.

Torch-free and outside both packages that read them: the training config (:mod:`diloco.train.config`, its
checks, ``diloco train --help`` and the documentation's reference) and :mod:`diloco.decoupled` (the syncer, the
learner), which plugs into the trainer and is never imported by it.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from diloco.errors import ConfigError

#: How the syncer merges the reports it holds (:mod:`diloco.decoupled.merge`).
MergeName = Literal["rda", "mean"]
MERGE_NAMES: tuple[MergeName, ...] = get_args(MergeName)

#: The share of an outer step a merge of k of M learners applies (:mod:`diloco.decoupled.outer_scale`).
OuterScale = Literal["auto", "share", "sqrt-share", "none"]
OUTER_SCALES: tuple[OuterScale, ...] = get_args(OuterScale)

#: How the syncer forms a learner's outer gradient (:class:`~diloco.decoupled.syncer.Syncer`).
OuterGradient = Literal["global", "own"]
OUTER_GRADIENTS: tuple[OuterGradient, ...] = get_args(OuterGradient)

#: What the syncer does with a report that misses the merge of its slot (K < M).
LateReports = Literal["next", "alone"]
LATE_REPORTS: tuple[LateReports, ...] = get_args(LateReports)

#: When a learner overwrites a fragment (:class:`~diloco.decoupled.learner.Learner`).
OverwriteAfter = Literal["send", "arrival"]
OVERWRITE_AFTER: tuple[OverwriteAfter, ...] = get_args(OverwriteAfter)

#: Where the syncer runs: a thread of this process, or a named Ray actor.
Transport = Literal["threads", "ray"]
TRANSPORTS: tuple[Transport, ...] = get_args(Transport)

#: What ends a learner's training: its own ``steps``, or the learners' shared token budget (``steps`` x
#: ``global_batch`` sequences, the tokens of a synchronous run), counted by the syncer.
LearnerBudget = Literal["steps", "tokens"]
LEARNER_BUDGETS: tuple[LearnerBudget, ...] = get_args(LearnerBudget)


def check_outer_gradient(value: str) -> str:
    """``value`` if it is one of :data:`OUTER_GRADIENTS`, else a ValueError naming the choices."""
    if value not in OUTER_GRADIENTS:
        raise ConfigError(f"outer_gradient={value!r}: choose 'global' (Theta - theta_m) or 'own' (base_m - theta_m)")
    return value


def check_overwrite_after(value: str) -> str:
    """``value`` if it is one of :data:`OVERWRITE_AFTER`, else a ValueError naming the choices."""
    if value not in OVERWRITE_AFTER:
        raise ConfigError(
            f"overwrite_after={value!r}: choose 'send' (tau steps after sending, the "
            f"Streaming DiLoCo timing) or 'arrival' (tau steps after the reply arrives)"
        )
    return value


def check_transport(value: str) -> str:
    """``value`` if it is one of :data:`TRANSPORTS`, else a ValueError naming the choices."""
    if value not in TRANSPORTS:
        raise ConfigError(f"decoupled_transport={value!r}: choose threads or ray")
    return value


def learner_budget_errors(cfg: Any) -> list[str]:
    """What is wrong with a training config's ``learner_budget`` (each message names the value and the fix)."""
    value = cfg.learner_budget
    if value not in LEARNER_BUDGETS:
        return [
            f"learner_budget={value!r}: choose steps (each learner trains `steps`) or tokens (the learners together "
            f"train steps x global_batch sequences; a fast learner more steps, a slow one fewer)"
        ]
    if value == "steps":
        return []
    if cfg.method != "decoupled":
        return [
            f"learner_budget=tokens with method={cfg.method!r}: only decoupled learners run on their own clocks; a "
            f"synchronous method's replicas all train `steps`. Set method=decoupled or learner_budget=steps"
        ]
    if cfg.ranks_per_worker != 1:
        return [
            f"learner_budget=tokens with ranks_per_worker={cfg.ranks_per_worker}: the budget is built for learners "
            f"of one rank (threads, decoupled_transport=ray, or site jobs of one rank each), not for learners of "
            f"several ranks; set ranks_per_worker=1 or learner_budget=steps"
        ]
    return []


__all__ = [
    "LATE_REPORTS",
    "LEARNER_BUDGETS",
    "MERGE_NAMES",
    "OUTER_GRADIENTS",
    "OVERWRITE_AFTER",
    "TRANSPORTS",
    "LateReports",
    "LearnerBudget",
    "MergeName",
    "OuterGradient",
    "OverwriteAfter",
    "Transport",
    "check_outer_gradient",
    "check_overwrite_after",
    "check_transport",
    "learner_budget_errors",
]
