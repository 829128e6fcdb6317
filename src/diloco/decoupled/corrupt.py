"""A corrupted learner for the fault harness: its reports carry a finite, wrong outer gradient for a while.

Wraps a learner's :class:`~diloco.decoupled.learner.Channel`; inside a window of wall time its reports'
differences ``base_p - theta_p`` are replaced before they leave: multiplied by ``scale`` (a mistyped inner lr,
a bad memory cell) or, with no scale, drawn from N(0, 1) (the difference to an unrelated model, e.g. a freshly
initialised one). The learner itself trains on undisturbed; what the syncer does with the reports is the
contribution guard's business (:mod:`diloco.algorithm.guard`). ``diloco chaos --corrupt S:M[:SCALE[:DURATION]]``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch

from diloco.decoupled.messages import Report
from diloco.wire.codec import Codec
from diloco.wire.registry import get_codec


def corrupt_difference(diff: torch.Tensor, *, scale: float | None, generator: torch.Generator) -> torch.Tensor:
    """The corrupted difference (a new FP32 tensor): ``scale * diff``, or N(0, 1) values when ``scale`` is None."""
    if scale is None:
        return torch.randn(diff.shape, generator=generator, dtype=torch.float32)
    return diff.float() * scale


class CorruptingChannel:
    """``channel`` with reports sent inside ``windows`` corrupted (everything else passes through).

    Args:
        channel: the learner's channel.
        windows: ``(from, until, scale)`` in seconds after ``start_at`` (``Chaos.corrupt_windows``).
        start_at: wall time (``time.time()``) of the run's second 0.
        sizes: values in each fragment (to decode a report).
        codec: the wire format of the reports (as the learner's).
        seed: for the random values.
    """

    def __init__(
        self,
        channel: Any,
        *,
        windows: Sequence[tuple[float, float, float | None]],
        start_at: float,
        sizes: Sequence[int],
        codec: str | Codec = "fp32",
        seed: int = 0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.channel, self.windows, self.start_at, self.sizes = channel, tuple(windows), start_at, list(sizes)
        self.codec, self.clock = get_codec(codec), clock
        self.generator = torch.Generator().manual_seed(seed)
        self.corrupted = 0  # reports sent corrupted

    def _scale(self) -> tuple[bool, float | None]:
        now = self.clock() - self.start_at
        for lo, hi, scale in self.windows:
            if lo <= now < hi:
                return True, scale
        return False, None

    def send(self, report: Report) -> None:
        active, scale = self._scale()
        if active:
            diff = self.codec.decode(report.payload, self.sizes[report.fragment])
            bad = corrupt_difference(diff, scale=scale, generator=self.generator)
            report = replace(report, payload=self.codec.encode(bad))
            self.corrupted += 1
        self.channel.send(report)

    def __getattr__(self, name: str) -> Any:  # join, wait_reply, poll_reply, leave, resent, ...
        return getattr(self.channel, name)


__all__ = ["CorruptingChannel", "corrupt_difference"]
