"""Metrics go through one logger interface; the JSONL sink is what every report, plot and fit reads."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Protocol


class MetricLogger(Protocol):
    def log(self, record: dict[str, Any]) -> None: ...
    def close(self) -> None: ...


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


class JSONLSink:
    """Appends one JSON object per line, flushed per line so a crash loses at most the line being written."""

    def __init__(self, path: Path, *, truncate_after_step: int | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if truncate_after_step is not None and self.path.exists():
            keep = [r for r in read_jsonl(self.path) if r.get("step", 0) <= truncate_after_step]
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text("".join(json.dumps(r) + "\n" for r in keep))
            tmp.replace(self.path)
        elif truncate_after_step is None and self.path.exists():
            self.path.unlink()
        self._file = self.path.open("a")

    def log(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps({k: _clean(v) for k, v in record.items()}) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class TensorBoardSink:
    """Optional: scalars to TensorBoard (needs the `tensorboard` package)."""

    def __init__(self, log_dir: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:  # pragma: no cover - depends on an optional package
            raise ValueError("tensorboard=true needs the tensorboard package: pip install tensorboard") from exc
        self._writer = SummaryWriter(str(log_dir))

    def log(self, record: dict[str, Any]) -> None:
        step = int(record.get("step", 0))
        for k, v in record.items():
            if isinstance(v, (int, float)) and k != "step" and v is not None:
                self._writer.add_scalar(k, v, step)

    def close(self) -> None:
        self._writer.close()


class MultiLogger:
    def __init__(self, *sinks: MetricLogger) -> None:
        self.sinks = sinks

    def log(self, record: dict[str, Any]) -> None:
        for s in self.sinks:
            s.log(record)

    def close(self) -> None:
        for s in self.sinks:
            s.close()


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Read a JSONL file, tolerating a truncated last line (a crash mid-write)."""
    out = []
    lines = Path(path).read_text().splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break
            raise ValueError(f"{path}: line {i + 1} is not valid JSON") from None
    return out
