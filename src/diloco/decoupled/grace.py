"""The adaptive grace window: how long the syncer waits for more learners once the quorum is in.

After K learners have reported fragment p, waiting longer brings more learners into the merge (better
quality) but the reply must still reach the learners within the tau steps they train before they need
it. The window spends a share gamma of what is left of those tau steps:

    window = max(0, gamma * (tau * xi_step - xi_quorum - xi_sync))

xi_step: exponential moving average (EMA) of the learners' step time; xi_quorum: EMA of the time from a
round's first report to its quorum; xi_sync: EMA of the time the syncer spends merging, stepping and
encoding the reply. Each EMA is ``x <- decay * x + (1 - decay) * sample`` and starts at its first sample;
before every EMA has a sample the window is 0. With tau = 0 there is no time to wait: the window is 0.

Defaults (settings of :class:`GraceWindow`): gamma = 0.2 (the paper does not publish its value; 0.2 is
one implementation's, and "about one step at most" in practice), decay = 0.9.
"""

from __future__ import annotations

from dataclasses import dataclass

from diloco.errors import ConfigError

#: Defaults of the grace-window settings.
DEFAULT_GRACE_GAMMA = 0.2
DEFAULT_EMA_DECAY = 0.9


def ema(previous: float | None, sample: float, *, decay: float) -> float:
    """One EMA update; the first sample (``previous`` None) is taken as it is."""
    return sample if previous is None else decay * previous + (1.0 - decay) * sample


def grace_seconds(*, gamma: float, overlap_steps: int, step_time: float, quorum_time: float, sync_time: float) -> float:
    """gamma * (tau * xi_step - xi_quorum - xi_sync), never below 0."""
    return max(0.0, gamma * (overlap_steps * step_time - quorum_time - sync_time))


def check_grace(*, gamma: float, decay: float, overlap_steps: int) -> None:
    """ValueError for settings with which no grace window can fit."""
    if not 0.0 <= gamma < 1.0:
        raise ConfigError(
            f"grace_gamma={gamma} is outside [0, 1): the window is a share of the time left within "
            f"tau steps; use 0 (no window) up to e.g. {DEFAULT_GRACE_GAMMA} (the default)"
        )
    if overlap_steps < 0:
        raise ConfigError(
            f"overlap_steps (tau) = {overlap_steps}: the window must fit within tau steps; use tau >= 0 "
            f"(tau = 0 leaves no time for a window: it is then 0)"
        )
    if not 0.0 <= decay < 1.0:
        raise ConfigError(f"grace_ema_decay={decay} is outside [0, 1): use e.g. {DEFAULT_EMA_DECAY} (the default)")


@dataclass
class GraceWindow:
    """The EMAs and the window they give (seconds). ``gamma`` = 0 turns the window off."""

    gamma: float = DEFAULT_GRACE_GAMMA
    overlap_steps: int = 1
    decay: float = DEFAULT_EMA_DECAY
    step_time: float | None = None
    quorum_time: float | None = None
    sync_time: float | None = None

    def __post_init__(self) -> None:
        check_grace(gamma=self.gamma, decay=self.decay, overlap_steps=self.overlap_steps)

    def observe(
        self, *, step_time: float | None = None, quorum_time: float | None = None, sync_time: float | None = None
    ) -> None:
        if step_time is not None:
            self.step_time = ema(self.step_time, step_time, decay=self.decay)
        if quorum_time is not None:
            self.quorum_time = ema(self.quorum_time, quorum_time, decay=self.decay)
        if sync_time is not None:
            self.sync_time = ema(self.sync_time, sync_time, decay=self.decay)

    def seconds(self) -> float:
        if self.gamma == 0 or None in (self.step_time, self.quorum_time, self.sync_time):
            return 0.0
        return grace_seconds(
            gamma=self.gamma,
            overlap_steps=self.overlap_steps,
            step_time=self.step_time,
            quorum_time=self.quorum_time,
            sync_time=self.sync_time,
        )

    def state_dict(self) -> dict[str, float | None]:
        return {"step_time": self.step_time, "quorum_time": self.quorum_time, "sync_time": self.sync_time}

    def load_state_dict(self, state: dict[str, float | None]) -> None:
        self.step_time, self.quorum_time, self.sync_time = (
            state["step_time"],
            state["quorum_time"],
            state["sync_time"],
        )


__all__ = ["DEFAULT_EMA_DECAY", "DEFAULT_GRACE_GAMMA", "GraceWindow", "check_grace", "ema", "grace_seconds"]
