"""The trainer's per-step figures in Prometheus' text format, when asked (``--set metrics_port=PORT``).

A :class:`PrometheusSink` is one more metrics sink beside the JSONL file (:mod:`diloco.train.metrics`): each logged
step row's numbers become gauges ``diloco_train_<key>`` (``diloco_train_step``, ``diloco_train_loss``,
``diloco_train_lr``, ``diloco_train_tokens``, ``diloco_train_step_time_s``, ``diloco_train_tokens_per_s``, the
byte counters, an evaluation's ``diloco_train_eval_loss``, ...), each the latest value logged, served at
``/metrics`` on ``metrics_port`` (0: a free port; printed) of every address, behind the same token as the
status page of a syncer service (:mod:`diloco.status.server`: ``$DILOCO_STATUS_TOKEN``, else the run folder's
``status-token``). Under torchrun the lead process serves it. ``metrics_port=-1`` (default): none.
"""

from __future__ import annotations

import re
import sys
import threading
from pathlib import Path
from typing import Any

#: The gauges' prefix.
PREFIX = "diloco_train_"


def metrics_port_errors(cfg: Any) -> list[str]:
    """What is wrong with ``metrics_port`` (the value and the fix)."""
    port = cfg.metrics_port
    if isinstance(port, bool) or not isinstance(port, int) or not -1 <= port <= 65535:
        return [f"metrics_port={port!r}: give a port 1..65535, 0 for a free one, or -1 for none"]
    return []


def metric_name(key: str) -> str:
    """A step row's key as a metric name (``step_time_s`` -> ``diloco_train_step_time_s``)."""
    return PREFIX + re.sub(r"[^a-zA-Z0-9_]", "_", key)


class PrometheusSink:
    """A :class:`~diloco.train.metrics.MetricLogger` that serves the latest step row (module docstring)."""

    def __init__(self, out_dir: Path, *, port: int, host: str = "0.0.0.0") -> None:
        from diloco.status.server import StatusServer, open_socket, status_token

        self._latest: dict[str, float] = {}
        self._lock = threading.Lock()
        sock = open_socket(host, port)
        self.server = StatusServer(sock, token=status_token(Path(out_dir)), routes={"/metrics": self._metrics})
        self.server.start()
        print(
            f"metrics (Prometheus): http://{host}:{self.server.port}/metrics, token in "
            f"{Path(out_dir) / 'status-token'} (or $DILOCO_STATUS_TOKEN)",
            file=sys.stderr,
            flush=True,
        )

    def log(self, record: dict[str, Any]) -> None:
        numbers = {k: float(v) for k, v in record.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        with self._lock:
            self._latest.update(numbers)

    def _metrics(self, query: dict[str, str]) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
        from prometheus_client.core import GaugeMetricFamily

        with self._lock:
            latest = dict(self._latest)

        class _Rows:
            def collect(self):
                for key, value in sorted(latest.items()):
                    yield GaugeMetricFamily(metric_name(key), f"the latest logged step row's {key}", value=value)

        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Rows())
        return generate_latest(registry), CONTENT_TYPE_LATEST

    def close(self) -> None:
        self.server.stop()


__all__ = ["PREFIX", "PrometheusSink", "metric_name", "metrics_port_errors"]
