"""What learners and the syncer send each other: plain data, the same over any transport."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Report:
    """Learner -> syncer, when fragment p is due: its values and its counters for p.

    ``payload``: ``codec.encode(base_p - theta_p)``, the learner's fragment as the difference from the
    global copy it last received (so a low-bit codec quantizes a small difference, not the parameters).
    ``steps`` / ``tokens``: counters since the learner last received fragment p. ``step_time``: the
    learner's mean seconds of work per step since its previous report (the grace window's xi_step).
    """

    learner: int
    fragment: int
    payload: torch.Tensor
    steps: int
    tokens: float
    step_time: float
    sent_after_step: int
    base_version: int = 0  # the version of fragment p the learner held when it sent this (see Syncer.receive)


@dataclass
class Reply:
    """Syncer -> learner, after a merge its report took part in: the new global fragment, encoded.

    ``payload``: the new values themselves with the lossless ``fp32`` codec (bit-exact), else
    ``codec.encode(Theta_p - base_p)``, the difference from the copy the learner holds. ``trained``: the steps of
    every learner together that the syncer had counted when it merged (each learner's latest reported step,
    summed): what a learner with a shared budget (``learner_budget=tokens``) compares with it.
    """

    learner: int
    fragment: int
    payload: torch.Tensor
    version: int
    trained: int = 0


@dataclass
class Welcome:
    """Syncer -> learner, on joining: the global fragments (FP32 copies), their versions, how many times this
    learner had joined before (0 the first time; more after a restart) and the step to start counting from."""

    fragments: list[torch.Tensor]
    versions: list[int]
    incarnation: int
    step: int = 0  # the step the other learners have reached: a learner joining late starts its schedule there


@dataclass
class MergeRecord:
    """One merge of one fragment: who took part, their weights, and how long the round waited (seconds)."""

    fragment: int
    version: int
    learners: tuple[int, ...]
    weights: tuple[float, ...]
    dropped: tuple[int, ...]  # learners whose contribution was not finite
    quorum_wait: float  # first report -> quorum
    grace_wait: float  # quorum -> merge
    grace_window: float  # the window that was allowed
    sync_time: float  # merge + outer step + encoding the replies
    bytes_received: int
    bytes_sent: int
    at: float = 0.0  # wall time of the merge (time.time(), comparable with the learners' logs)
    guard: tuple[dict, ...] = ()  # contributions the guard dropped or clipped: learner, fragment, norm, ratio, action
    ratios: tuple[float | None, ...] = ()  # per merged learner, its norm / the guard's reference (None: not judged)

    def as_row(self) -> dict[str, object]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}

    @classmethod
    def from_row(cls, row: dict[str, object]) -> MergeRecord:
        return cls(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in row.items()})


#: How many times a learner's channel sends one report again before it gives up with an error.
MAX_RESENDS = 5


def resend(channel: Any, fragment: int) -> None:
    """Send ``channel``'s last report of ``fragment`` again (a channel of either transport: Ray's or the sites'
    gRPC one, each with ``learner``, ``resent``, ``_tries``, ``_sent`` and ``send``); past :data:`MAX_RESENDS`
    tries, an error that says what to do."""
    channel.resent += 1
    channel._tries += 1
    if channel._tries > MAX_RESENDS:
        raise RuntimeError(
            f"learner {channel.learner}: the syncer answered none of {MAX_RESENDS} sendings of its report of "
            f"fragment {fragment} (made against version {channel._sent[fragment].base_version}): its state and "
            f"this learner's disagree. Restart this learner (it joins again with the current global parameters)"
        )
    channel.send(channel._sent[fragment])


def taken(channel: Any, fragment: int, reply: Reply | None) -> Reply | None:
    """A reply to ``channel``'s report of ``fragment`` as it came: None (the syncer holds no such report) sends the
    report again (:func:`resend`) and stays None; a reply ends the report's wait (forgotten, its tries reset)."""
    if reply is None:
        resend(channel, fragment)
        return None
    del channel._sent[fragment]
    channel._tries = 0
    return reply


__all__ = ["MAX_RESENDS", "MergeRecord", "Reply", "Report", "Welcome", "resend", "taken"]
