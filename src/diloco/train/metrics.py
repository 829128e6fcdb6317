"""Metrics go through one logger interface; the JSONL sink is what every report, plot and fit reads.

Read a metrics file with :func:`diloco.files.read_jsonl` (re-exported here).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Protocol

from diloco.errors import ConfigError
from diloco.files import atomic_write_bytes, dumps_strict, read_jsonl


class MetricLogger(Protocol):
    def log(self, record: dict[str, Any]) -> None: ...
    def close(self) -> None: ...


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


class JSONLSink:
    """Appends one strict-JSON object per line, flushed per line so a crash loses at most the line being written.

    ``truncate_after_step`` (a resume): rows after that step are dropped first (they are trained again).
    Otherwise an existing file is replaced: the caller has checked it may be (:mod:`diloco.train.rundir`).
    Lines are flushed to the OS, not fsync'ed: a killed process loses nothing, and a step pays no disk sync.
    """

    def __init__(self, path: Path, *, truncate_after_step: int | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if truncate_after_step is not None and self.path.exists():
            keep = [r for r in read_jsonl(self.path) if r.get("step", 0) <= truncate_after_step]
            atomic_write_bytes(self.path, "".join(dumps_strict(r, indent=None) + "\n" for r in keep).encode("utf-8"))
        elif truncate_after_step is None and self.path.exists():
            self.path.unlink()
        self._file = self.path.open("a", encoding="utf-8")

    def log(self, record: dict[str, Any]) -> None:
        self._file.write(dumps_strict({k: _clean(v) for k, v in record.items()}, indent=None) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class TensorBoardSink:
    """Optional: scalars to TensorBoard (needs the `tensorboard` package)."""

    def __init__(self, log_dir: Path) -> None:
        self.check_available()
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(str(log_dir))

    @staticmethod
    def check_available() -> None:
        try:
            import torch.utils.tensorboard  # noqa: F401
        except ImportError as exc:  # pragma: no cover - depends on an optional package
            raise ConfigError(
                "tensorboard=true needs the tensorboard package: pip install tensorboard, or set tensorboard=false"
            ) from exc

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


__all__ = ["JSONLSink", "MetricLogger", "MultiLogger", "TensorBoardSink", "read_jsonl"]
