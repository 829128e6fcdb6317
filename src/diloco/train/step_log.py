"""Per-step rows of a run: each replica's record merged into one logged row, and the progress bar.

Replicas (threads or processes) report each step on their own; :class:`StepTable` logs a step
once all M have reported it, as one row (:func:`merge_step_records`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from diloco.train.metrics import MetricLogger


class StepTable:
    """Collects each replica's per-step record; logs one merged row once all M have reported."""

    def __init__(self, num_replicas: int, logger: MetricLogger, on_row: Callable[[dict], None]) -> None:
        self.m = num_replicas
        self.logger = logger
        self.on_row = on_row
        self._rows: dict[int, list[dict]] = {}
        self._lock = threading.Lock()

    def add(self, rank: int, step: int, record: dict[str, Any]) -> None:
        with self._lock:
            parts = self._rows.setdefault(step, [])
            parts.append(record | {"rank": rank})
            if len(parts) < self.m:
                return
            del self._rows[step]
            self._log(parts)

    def flush(self) -> None:
        """Log the steps not every replica reached, in step order, each merged from the replicas that did (decoupled
        learners with a shared budget end at different steps); nothing when every replica ended at the same step."""
        with self._lock:
            rows, self._rows = self._rows, {}
            for step in sorted(rows):
                self._log(rows[step])

    def _log(self, parts: list[dict]) -> None:
        row = merge_step_records(parts)
        self.logger.log(row)
        self.on_row(row)


def merge_step_records(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One row per step: mean loss over replicas, global tokens, replica 0's byte counters."""
    parts = sorted(parts, key=lambda r: r["rank"])
    first = parts[0]
    row = {k: v for k, v in first.items() if k not in ("rank", "loss", "step_time_s", "compute_time_s", "tokens")}
    row["loss"] = sum(p["loss"] for p in parts) / len(parts)
    row["tokens"] = sum(p["tokens"] for p in parts)
    row["step_time_s"] = max(p["step_time_s"] for p in parts)
    row["compute_time_s"] = max(p["compute_time_s"] for p in parts)
    row["tokens_per_s"] = row["tokens"] / row["step_time_s"] if row["step_time_s"] > 0 else None
    return row


def progress_bar(enabled: bool, total: int, initial: int, desc: str):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit="step", dynamic_ncols=True, leave=True)


def update_bar(bar, row: dict) -> None:
    if bar is not None:
        bar.update(1)
        bar.set_postfix(loss=f"{row['loss']:.3f}", tok_s=f"{row['tokens_per_s'] or 0:.0f}", refresh=False)
