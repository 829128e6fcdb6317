"""How much of an outer step a partial merge applies: a pure function of k, M and the merge rule.

With quorum K < M the syncer merges k of its M members' reports at a time (k >= K), so a round of
learner work (every learner reporting once) becomes about M / k merges. If each merge applied a whole
outer step (the paper's reading), the outer step per round of work would grow with M / k: at K = 1,
M = 3, the default outer Nesterov step (lr 0.7, momentum 0.9) is taken three times per round from one
learner's outer gradient each, and the tiny preset diverges (loss 1e9 within 400 steps).

The rules (``outer_scale=``), the factor s(k, M) applied to the merged outer gradient:

* ``"share"``: s = k / M. Each learner's outer gradient enters the global parameters with weight 1 / M
  per round whatever the quorum: M / k merges of the mean of k reports sum to the mean of all M, the
  K = M mean. Exact for the mean merge; for RDA (whose merge keeps the mean norm of the k reports) it
  is smaller than RDA at K = M by about sqrt(M) when the outer gradients are nearly orthogonal.
* ``"sqrt-share"``: s = sqrt(k / M): M / k nearly orthogonal steps of norm s |Delta| sum to a norm
  |Delta|, RDA's at K = M.
* ``"auto"`` (the default): the rule the study in ``studies/decoupled-quorum`` found best for each merge
  rule (:data:`AUTO`): ``"share"`` for the mean (equal to ``"sqrt-share"`` within the noise, and the one
  that keeps the step along the learners' common direction equal to K = M's at every M), ``"sqrt-share"``
  for RDA (lower than ``"share"`` at K = 1 in all four cells, M = 2-8, by up to 3 %; within about a
  standard error of it at K = M/2).
* ``"none"``: s = 1, every merge a whole outer step (the paper's wording; diverges at K = 1, above).

A merge of every member (k = M) is never scaled, so K = M is unchanged (and, with the mean merge,
bit-identical to synchronous Streaming DiLoCo).
"""

from __future__ import annotations

import math

from diloco.decoupled_choices import OUTER_SCALES, OuterScale
from diloco.errors import ConfigError

#: The rules ``outer_scale=`` accepts.

#: ``outer_scale="auto"``: merge rule -> the rule used (see studies/decoupled-quorum/README.md).
AUTO = {"mean": "share", "rda": "sqrt-share"}


def check_outer_scale(name: str) -> str:
    """``name`` if it is a rule, else a ValueError naming the choices."""
    if name not in OUTER_SCALES:
        raise ConfigError(
            f"outer_scale={name!r} is not a rule: choose 'auto' (the measured best per merge rule), "
            f"'share' (a merge of k of M learners applies k/M of an outer step), 'sqrt-share' "
            f"(sqrt(k/M)) or 'none' (every merge a whole outer step; diverges at small quorums)"
        )
    return name


def outer_step_share(*, merged: int, members: int, rule: str, merge: str) -> float:
    """s(k, M): the factor on the merged outer gradient of ``merged`` = k of ``members`` = M learners."""
    check_outer_scale(rule)
    assert 0 < merged and 0 < members, f"a merge of {merged} of {members} learners"
    if merged >= members:
        return 1.0
    if rule == "auto":
        rule = AUTO[merge]
    if rule == "share":
        return merged / members
    if rule == "sqrt-share":
        return math.sqrt(merged / members)
    return 1.0


__all__ = ["AUTO", "OUTER_SCALES", "OuterScale", "check_outer_scale", "outer_step_share"]
