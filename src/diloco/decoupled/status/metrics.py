"""A board's snapshot in Prometheus' text format (prometheus-client), the same figures as the status page.

Per learner (labels ``learner``, ``site``): ``diloco_learner_up`` (1 while its heartbeat is heard),
``diloco_learner_finished``, ``diloco_learner_step``, ``diloco_learner_tokens``, ``diloco_learner_waiting_share``,
``diloco_learner_step_rate`` (steps per second), ``diloco_learner_staleness`` (versions behind at its latest
report), ``diloco_learner_last_merge_version``, ``diloco_learner_last_merge_age_seconds``,
``diloco_learner_guard_events_total``, ``diloco_learner_restarts``, and ``diloco_learner_info`` (1, with its
``host``). The run: ``diloco_merges_total``, ``diloco_merges_per_minute``, ``diloco_merges_by_quorum_total``
(label ``size``: the learners a merge took), ``diloco_tokens``, ``diloco_global_loss``, ``diloco_syncer_up``,
``diloco_syncer_epoch``, ``diloco_syncer_restarts``, ``diloco_syncer_checkpoint_age_seconds``. A figure not known
yet (no report, no evaluation) has no sample.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

#: (name, help, the learner row's key) of the per-learner gauges.
LEARNER_GAUGES = (
    ("diloco_learner_step", "the learner's latest step (its latest report)", "step"),
    ("diloco_learner_tokens", "tokens the learner has trained (its step x tokens per step)", "tokens"),
    (
        "diloco_learner_waiting_share",
        "share of the last minute the learner waited rather than trained",
        "waiting_share",
    ),
    ("diloco_learner_step_rate", "the learner's steps per second over the last minute", "step_rate"),
    ("diloco_learner_staleness", "versions the learner's latest report was behind", "staleness"),
    ("diloco_learner_restarts", "times the learner joined again (a restarted job)", "restarts"),
    (
        "diloco_learner_last_merge_age_seconds",
        "seconds since the last merge the learner counted in",
        "last_merge_age_s",
    ),
)


class BoardCollector:
    """A prometheus-client collector of ``snapshot()`` (a board's snapshot, taken at each scrape)."""

    def __init__(self, snapshot: Callable[[], dict[str, Any]]) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        snap = self.snapshot()
        rows = snap["learners"]
        labels = ["learner", "site"]

        def per_learner(name: str, doc: str, value: Callable[[dict[str, Any]], Any], kind: Any = GaugeMetricFamily):
            family = kind(name, doc, labels=labels)
            for row in rows:
                v = value(row)
                if v is not None:
                    family.add_metric([str(row["learner"]), row["site"]], float(v))
            return family

        yield per_learner(
            "diloco_learner_up", "1 while the learner's heartbeat is heard", lambda r: r["state"] == "live"
        )
        yield per_learner("diloco_learner_finished", "1 once the learner finished", lambda r: r["state"] == "finished")
        for name, doc, key in LEARNER_GAUGES:
            yield per_learner(name, doc, lambda r, key=key: r[key])
        yield per_learner(
            "diloco_learner_last_merge_version",
            "the version of the last merge the learner counted in",
            lambda r: None if r["last_merge"] is None else r["last_merge"]["version"],
        )
        yield per_learner(
            "diloco_learner_guard_events",
            "contributions of the learner the guard dropped or clipped",
            lambda r: r["guard_events"],
            CounterMetricFamily,
        )
        info = GaugeMetricFamily("diloco_learner_info", "where the learner runs", labels=[*labels, "host"])
        for row in rows:
            info.add_metric([str(row["learner"]), row["site"], row["host"] or ""], 1.0)
        yield info

        merges = snap["merges"]
        yield CounterMetricFamily("diloco_merges", "merges so far", value=merges["total"])
        yield GaugeMetricFamily("diloco_merges_per_minute", "merges in the last minute", value=merges["per_minute"])
        by_size = CounterMetricFamily(
            "diloco_merges_by_quorum", "merges by how many learners they took", labels=["size"]
        )
        for size, count in merges["quorum_sizes"].items():
            by_size.add_metric([size], count)
        yield by_size
        yield GaugeMetricFamily("diloco_tokens", "tokens all learners have trained", value=snap["tokens"])
        if snap["loss"]:
            yield GaugeMetricFamily(
                "diloco_global_loss",
                "validation loss of the global parameters (latest)",
                value=snap["loss"][-1]["loss"],
            )
        syncer = snap["syncer"]
        yield GaugeMetricFamily("diloco_syncer_up", "1 while the syncer answers", value=syncer["state"] == "active")
        yield GaugeMetricFamily("diloco_syncer_epoch", "the syncer's incarnation (1 + restarts)", value=syncer["epoch"])
        yield GaugeMetricFamily("diloco_syncer_restarts", "times the syncer restarted", value=syncer["restarts"])
        if syncer["checkpoint_age_s"] is not None:
            yield GaugeMetricFamily(
                "diloco_syncer_checkpoint_age_seconds",
                "seconds since the syncer's newest checkpoint",
                value=syncer["checkpoint_age_s"],
            )


def exposition(snapshot: Callable[[], dict[str, Any]]) -> tuple[bytes, str]:
    """The text a scrape gets, and its content type."""
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(BoardCollector(snapshot))
    return generate_latest(registry), CONTENT_TYPE_LATEST


__all__ = ["LEARNER_GAUGES", "BoardCollector", "exposition"]
