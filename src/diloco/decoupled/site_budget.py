"""A token budget (``learner_budget=tokens``) for a run whose learners are site jobs of the syncer service.

The semantics are those of learners in one job (:class:`~diloco.decoupled.learner.Learner`, ``budget_steps``): the
M learners together train the synchronous run's tokens, ``steps`` x M learner-steps of ``batch_per_replica`` x
``seq_len`` tokens each. The syncer counts what each learner's reports cover (its latest step a report was sent
after, :attr:`~diloco.decoupled.syncer.Syncer.trained`), every reply carries that count (``Reply.trained``, over
gRPC as over Ray or threads), and a learner ends once a reply says the budget is spent: a fast site trains more
steps, a slow one fewer, and each leaves the service *finished*, which then ends as for ``learner_budget=steps``.

What this module adds for the service: the budget in the config fingerprint (:func:`budget_fingerprint`; a site
whose budget differs from the syncer's, or that counts steps while the syncer counts tokens, is refused when it
joins) and the tokens of each learner in the service's summary (:func:`learner_counts`).
"""

from __future__ import annotations

from typing import Any

#: The fingerprint entry of a token budget (absent for ``learner_budget=steps``, so that those fingerprints are
#: unchanged): the budget in learner-steps of all learners together.
BUDGET_KEY = "learner_budget_steps"


def budget_steps(cfg: Any) -> int:
    """The learners' shared budget in learner-steps (``steps`` x M) for ``learner_budget=tokens``, else 0."""
    return cfg.total_steps * cfg.replicas if cfg.learner_budget == "tokens" else 0


def budget_fingerprint(cfg: Any) -> dict[str, Any]:
    """The fingerprint entry of ``cfg``'s token budget ({} without one): every site and the syncer must share it."""
    return {BUDGET_KEY: budget_steps(cfg)} if cfg.learner_budget == "tokens" else {}


def learner_counts(cfg: Any, reached: dict[int, int]) -> dict[str, Any]:
    """The service summary's counts from ``reached`` (learner -> the latest step its reports were sent after, at
    the syncer): each learner's steps and tokens as the syncer counted them, their sum and, with a token budget,
    the budget. A learner's steps after its last report (at most ``overlap_steps`` for a learner the budget ends
    before its share) are not counted here; its site's own summary has them (``learner_steps``)."""
    per_step = cfg.batch_per_replica * cfg.seq_len
    steps = [int(reached.get(m, 0)) for m in range(cfg.replicas)]
    out: dict[str, Any] = {
        "learner_budget": cfg.learner_budget,
        "learner_steps": steps,
        "learner_tokens": [s * per_step for s in steps],
        "tokens": sum(steps) * per_step,
    }
    if cfg.learner_budget == "tokens":
        out["budget_tokens"] = budget_steps(cfg) * per_step
    return out


__all__ = ["BUDGET_KEY", "budget_fingerprint", "budget_steps", "learner_counts"]
