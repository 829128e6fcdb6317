"""The contribution guard: is this outer gradient the size honest ones are? (Decoupled and synchronous runs.)

A learner (or replica) can send an outer gradient that is finite and wrong: a bad memory cell, a
resume from the wrong checkpoint, a mistyped inner lr, a freshly initialised replica, an untrusted
peer. Non-finite contributions are dropped everywhere already; this module judges finite ones by
their norm::

    ratio = |Delta_m| / steps_m / reference           (the norm per step of work since its previous one)
    reference = max(median of the round's norms         (a round of >= ROUND_MEDIAN_MIN contributions)
                    | median of the last `history` accepted norms of this fragment (otherwise),
                    median of the sender's own last `history` accepted norms of this fragment)
              | none: accepted unjudged                (fewer than `min_history` accepted so far)
    ratio > max_ratio  ->  action: "drop" (leave it out of the merge / the sync)
                                 or "clip" (scale it down to max_ratio x reference)

Only too-large norms are judged: a small outer gradient (a learner that just rejoined, a decayed
lr) pulls the merge less, never more. Judged norms of contributions that pass join the history;
dropped or clipped ones do not, so a burst of garbage cannot raise the bar it is measured against.
Not judged: the direction (a wrong outer gradient of honest size, e.g. a sign flip; a cosine to the
others' mean would catch some of those) and anything before the history holds ``min_history`` values.

The default ratio, :data:`DEFAULT_GUARD_RATIO`, comes from healthy runs (``benchmarks/guard_ratios.py``;
the decoupled guide has the table): over about 5,200 values judged in diloco, streaming and decoupled
runs of the tiny preset (long inner warmups, K = M, 2 and 1 included) the largest was 2.83, so a bar of
10 leaves more than 3x of room and still catches an outer gradient more than 10x off, random
values (75x in a test) and the 1e4x of the probe.

The pure part is :func:`judge` and :func:`reference_norm`; :class:`NormGuard` keeps the running
history per fragment and the consecutive drops per sender, and is checkpointed with its owner.
"""

from __future__ import annotations

import statistics
import warnings
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

from diloco.errors import ConfigError

#: What a guard does with an outer gradient whose norm ratio exceeds the bar.
GuardAction = Literal["drop", "clip", "off"]
GUARD_ACTIONS: tuple[GuardAction, ...] = get_args(GuardAction)

#: The bar: norm / reference above this fires (see the module docstring and the decoupled guide for why 10).
DEFAULT_GUARD_RATIO = 10.0

#: Accepted norms per fragment the running median looks at.
DEFAULT_GUARD_HISTORY = 16

#: Accepted norms needed before the running median judges anything (until then, contributions pass unjudged).
DEFAULT_MIN_HISTORY = 2

#: A round of at least this many contributions is judged against its own median (robust to one outlier in 3).
ROUND_MEDIAN_MIN = 3

#: What pads a history in a checkpoint (a norm is never negative).
_PAD = -1.0

#: A sender dropped this many times in a row is named in a warning.
DEFAULT_WARN_AFTER = 3


def check_guard(action: str, max_ratio: float) -> None:
    """ValueError naming the bad value and the fix, if ``action`` / ``max_ratio`` cannot run."""
    if action not in GUARD_ACTIONS:
        raise ConfigError(
            f"guard={action!r}: choose 'drop' (leave an outsized outer gradient out), 'clip' (scale it "
            f"down to guard_ratio x the reference norm) or 'off' (accept every finite one)"
        )
    if not max_ratio > 1.0:
        raise ConfigError(
            f"guard_ratio={max_ratio}: the bar on norm / reference must be > 1 (default "
            f"{DEFAULT_GUARD_RATIO:g}); to turn the guard off use guard='off'"
        )


def guard_errors(cfg: Any) -> list[str]:
    """:func:`check_guard` on a training config's ``guard`` and ``guard_ratio``, as the config's messages."""
    try:
        check_guard(cfg.guard, cfg.guard_ratio)
    except ValueError as exc:
        return [str(exc)]
    return []


@dataclass(frozen=True)
class Verdict:
    """What the guard made of one outer gradient: ``action`` is ``"accept"``, ``"drop"`` or ``"clip"``;
    ``scale`` multiplies the outer gradient (1 unless clipped); ``ratio`` is None when it was not judged."""

    norm: float
    reference: float | None
    ratio: float | None
    action: str
    scale: float = 1.0


def reference_norm(
    history: Sequence[float],
    round_norms: Sequence[float] = (),
    *,
    own: Sequence[float] = (),
    min_history: int = DEFAULT_MIN_HISTORY,
) -> float | None:
    """The norm honest contributions have: the round's median (>= ROUND_MEDIAN_MIN norms), else the running
    median of ``history`` (>= ``min_history`` norms); the sender's own running median (``own``, its accepted
    norms) where that is larger. None when there is nothing to judge by.

    Why the sender's own: a healthy straggler of a decoupled run trains at an earlier, higher point of its lr
    schedule than the others; its norms per step were measured up to 10x theirs (tiny preset, K = 1), growing
    slowly, so its own history follows it, while a sender that turns bad is judged against what it sent before.
    """
    if len(round_norms) >= ROUND_MEDIAN_MIN:
        ref: float | None = float(statistics.median(round_norms))
    elif len(history) >= max(1, min_history):
        ref = float(statistics.median(history))
    else:
        ref = None
    if len(own) >= max(1, min_history):
        mine = float(statistics.median(own))
        ref = mine if ref is None else max(ref, mine)
    return ref


def judge(norm: float, reference: float | None, *, max_ratio: float, action: str) -> Verdict:
    """The verdict on one outer gradient of norm ``norm`` (finite) against ``reference`` (pure)."""
    assert action in GUARD_ACTIONS and norm >= 0.0
    if action == "off" or reference is None:
        return Verdict(norm, reference, None, "accept")
    # honest ones that did not move: anything that moved is hugely larger (finite, for the JSON logs)
    ratio = norm / max(reference, 1e-30) if norm > 0 else 0.0
    if ratio <= max_ratio:
        return Verdict(norm, reference, ratio, "accept")
    if action == "clip":
        return Verdict(norm, reference, ratio, "clip", scale=max_ratio * reference / norm)
    return Verdict(norm, reference, ratio, "drop", scale=0.0)


@dataclass(frozen=True)
class GuardEvent:
    """One contribution the guard dropped or clipped (a row in ``merges.jsonl``, a sync's report)."""

    sender: int
    fragment: int
    norm: float
    reference: float
    ratio: float
    action: str

    def as_row(self, *, who: str = "learner") -> dict[str, Any]:
        """A JSON row; the sender under ``who`` (``"learner"`` in ``merges.jsonl``, ``"replica"`` in a sync's report)."""
        return {
            who: self.sender,
            "fragment": self.fragment,
            "norm": self.norm,
            "reference": self.reference,
            "ratio": self.ratio,
            "action": self.action,
        }


class NormGuard:
    """The guard's state: accepted norms per fragment, consecutive drops per sender (module docstring).

    Args:
        action: ``"drop"``, ``"clip"`` or ``"off"`` (:data:`GUARD_ACTIONS`).
        max_ratio: the bar on norm / reference (> 1).
        history: accepted norms per fragment the running median looks at.
        min_history: accepted norms needed before the running median judges.
        warn_after: a sender dropped this many times in a row is named in a ``RuntimeWarning`` (and again at
            every further multiple); ``who`` names senders in it (e.g. ``"learner"``, ``"replica"``).
    """

    def __init__(
        self,
        *,
        action: str = "drop",
        max_ratio: float = DEFAULT_GUARD_RATIO,
        history: int = DEFAULT_GUARD_HISTORY,
        min_history: int = DEFAULT_MIN_HISTORY,
        warn_after: int = DEFAULT_WARN_AFTER,
        who: str = "learner",
    ) -> None:
        check_guard(action, max_ratio)
        if history < 1 or min_history < 1 or warn_after < 1:
            raise ConfigError(
                f"history={history}, min_history={min_history}, warn_after={warn_after}: each must be >= 1"
            )
        self.action, self.max_ratio, self.min_history = action, float(max_ratio), min_history
        self.warn_after, self.who, self.history = warn_after, who, history
        self._norms: dict[int, deque[float]] = {}  # fragment -> accepted norms
        self._own: dict[int, dict[int, deque[float]]] = {}  # sender -> fragment -> its accepted norms
        self.drops_in_a_row: dict[int, int] = {}

    @property
    def on(self) -> bool:
        return self.action != "off"

    def reference(self, fragment: int, round_norms: Sequence[float] = (), *, sender: int | None = None) -> float | None:
        own = self._own.get(sender, {}).get(fragment, ()) if sender is not None else ()
        return reference_norm(self._norms.get(fragment, ()), round_norms, own=own, min_history=self.min_history)

    def judge(
        self, fragment: int, norm: float, round_norms: Sequence[float] = (), *, sender: int | None = None
    ) -> Verdict:
        return judge(
            norm, self.reference(fragment, round_norms, sender=sender), max_ratio=self.max_ratio, action=self.action
        )

    def record(self, sender: int, fragment: int, verdict: Verdict) -> GuardEvent | None:
        """Note ``sender``'s verdict on ``fragment``: an accepted norm joins the history, a drop counts towards the
        warning. Returns the event to log when it was dropped or clipped."""
        if verdict.action == "accept":
            self._norms.setdefault(fragment, deque(maxlen=self.history)).append(verdict.norm)
            self._own.setdefault(sender, {}).setdefault(fragment, deque(maxlen=self.history)).append(verdict.norm)
            self.drops_in_a_row[sender] = 0
            return None
        assert verdict.ratio is not None and verdict.reference is not None
        if verdict.action == "drop":
            n = self.drops_in_a_row[sender] = self.drops_in_a_row.get(sender, 0) + 1
            if n % self.warn_after == 0:
                warnings.warn(
                    f"{self.who} {sender}: its outer gradient was dropped by the contribution guard {n} "
                    f"times in a row (latest: fragment {fragment}, norm {verdict.norm:.4g} = "
                    f"{verdict.ratio:.4g} x the reference {verdict.reference:.4g}, bar guard_ratio="
                    f"{self.max_ratio:g}); check that {self.who} (its inner lr, the checkpoint it resumed "
                    f"from, its hardware), or raise guard_ratio if its updates are honest",
                    RuntimeWarning,
                    stacklevel=3,
                )
        return GuardEvent(sender, fragment, verdict.norm, verdict.reference, verdict.ratio, verdict.action)

    def state_dict(self) -> dict[str, Any]:
        """Plain numbers; each history as a list of ``history`` values padded with -1 (norms are >= 0), so a
        checkpoint holding it stays one size however long the run, and two equal states compare equal (NaN
        padding would not)."""

        def padded(v: deque[float]) -> list[float]:
            return list(v) + [_PAD] * (self.history - len(v))

        return {
            "norms": {p: padded(v) for p, v in self._norms.items()},
            "own": {m: {p: padded(v) for p, v in h.items()} for m, h in self._own.items()},
            "drops_in_a_row": dict(self.drops_in_a_row),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        def unpadded(v: Sequence[float]) -> deque[float]:
            return deque((float(x) for x in v if float(x) >= 0.0), maxlen=self.history)  # drops the padding

        self._norms = {int(p): unpadded(v) for p, v in state["norms"].items()}
        self._own = {int(m): {int(p): unpadded(v) for p, v in h.items()} for m, h in state.get("own", {}).items()}
        self.drops_in_a_row = {int(m): int(n) for m, n in state["drops_in_a_row"].items()}


__all__ = [
    "DEFAULT_GUARD_RATIO",
    "GUARD_ACTIONS",
    "GuardAction",
    "ROUND_MEDIAN_MIN",
    "GuardEvent",
    "NormGuard",
    "Verdict",
    "check_guard",
    "guard_errors",
    "judge",
    "reference_norm",
]
