"""What a finished run reports: :class:`RunResult`, written as the run's ``summary.json``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["RunResult"]


@dataclass
class RunResult:
    out_dir: Path
    final_eval_loss: float
    steps: int
    tokens: int
    bytes_sent_per_replica: int
    bytes_received_per_replica: int
    peak_bytes_per_sync: int
    peak_bytes_in_flight: int
    wall_time_s: float
    train_time_s: float
    num_params: int
    dropped_contributions: int
    data_sha256: str | None = None  # TokenData.digest() of what it trained on (None: written before runs kept it)
    # method=decoupled: the share of the learners' training time not spent waiting for the syncer's replies
    goodput: float | None = None
    # where it ran (diloco.train.environment): torch, CPU model and vector extensions, threads, device
    environment: dict[str, Any] | None = None
    # method=decoupled: each learner's share of its training time spent waiting for replies (learner order)
    wait_share: list[float] | None = None
    # method=decoupled: the steps each learner trained (learner order; they differ with learner_budget=tokens)
    learner_steps: list[int] | None = None

    def to_dict(self) -> dict[str, Any]:
        """Strict-JSON-ready: a non-finite loss (a diverged run) becomes None."""
        d = dict(self.__dict__)
        d["out_dir"] = str(self.out_dir)
        return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in d.items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunResult:
        """Read back :meth:`to_dict` (e.g. a finished run's summary.json)."""
        d = dict(data)
        d["out_dir"] = Path(d["out_dir"])
        d["final_eval_loss"] = float("nan") if d.get("final_eval_loss") is None else float(d["final_eval_loss"])
        d.setdefault("data_sha256", None)  # a summary written before runs kept it
        d.setdefault("goodput", None)
        d.setdefault("environment", None)  # a summary written before runs recorded it
        d.setdefault("wait_share", None)  # a summary written before runs kept it
        d.setdefault("learner_steps", None)  # a summary written before runs kept it
        return cls(**{f: d[f] for f in cls.__dataclass_fields__})
