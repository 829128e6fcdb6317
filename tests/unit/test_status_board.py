"""The status page's board (:mod:`diloco.decoupled.status.board`): what it folds from the syncer's events and polls,
checked against closed forms; its metrics parsed back with prometheus-client's own parser; its page rendered."""

from __future__ import annotations

import math

import pytest

from diloco.decoupled.status.board import WINDOW_S, Board
from diloco.decoupled.status.page import render
from diloco.decoupled.status.plots import step_rates


def _report(t, m, step, *, steps=4, tokens=512.0, step_time=0.2, staleness=0, fragment=0):
    return dict(
        t=t, event="report", learner=m, fragment=fragment, step=step, steps=steps, tokens=tokens,
        step_time=step_time, staleness=staleness, ignored=False,
    )  # fmt: skip


def _board() -> Board:
    b = Board(num_learners=2, name="run")
    b.observe({"t": 0.0, "event": "started", "pid": 11, "restored_merges": None})
    for m in (0, 1):
        b.observe({"t": 0.5, "event": "hello", "learner": m, "session": "s", "host": f"host{m} pid 9"})
        b.observe({"t": 1.0, "event": "joined", "learner": m, "incarnation": 0})
    return b


def test_waiting_share_tokens_and_step_rate_are_their_closed_forms():
    """A learner that makes 4 steps of 0.2 s work every 1.25 s waited 1 - 0.8 / 1.25 = 36 % of the time; its tokens
    are its step x the report's tokens per step (512 / 4); its rate 4 / 1.25 = 3.2 steps/s."""
    b = _board()
    for i in range(1, 11):
        b.observe(_report(1.0 + 1.25 * i, 0, 4 * i))
    b.poll({"live": [0, 1], "finished": []}, now=14.0, checkpoint_age_s=2.0)
    row = b.snapshot()["learners"][0]
    assert row["waiting_share"] == pytest.approx(1 - 0.8 / 1.25, abs=1e-12)
    assert row["tokens"] == 40 * 128.0 and row["step"] == 40
    assert row["step_rate"] == pytest.approx(3.2, abs=1e-12)
    assert row["host"] == "host0 pid 9" and row["state"] == "live"
    assert b.snapshot()["learners"][1]["waiting_share"] is None  # no report yet: unknown, not 0
    assert b.snapshot()["syncer"]["checkpoint_age_s"] == 2.0
    # the window keeps only the last WINDOW_S seconds: a learner that slows down shows its new share
    for i in range(1, 100):
        b.observe(_report(13.5 + 2.0 * i, 0, 40 + 4 * i))
    assert b.snapshot()["learners"][0]["waiting_share"] == pytest.approx(1 - 0.8 / 2.0, abs=1e-12)
    assert b.learners[0].window[0][0] >= b.learners[0].window[-1][0] - WINDOW_S


def test_a_killed_learner_is_lost_then_live_again_with_a_restart():
    b = _board()
    b.observe(_report(2.0, 1, 8))
    b.poll({"live": [0, 1], "finished": []}, now=3.0)
    assert [r["state"] for r in b.snapshot()["learners"]] == ["live", "live"]
    b.poll({"live": [0], "finished": []}, now=9.0)  # its heartbeat's lease ran out
    row = b.snapshot()["learners"][1]
    assert row["state"] == "lost" and row["silent_s"] == 6.0 and row["step"] == 8
    b.observe({"t": 10.0, "event": "hello", "learner": 1, "host": "host1 pid 10"})
    b.observe({"t": 10.5, "event": "joined", "learner": 1, "incarnation": 1})
    row = b.snapshot()["learners"][1]  # its join was heard after the last poll: live, before the next poll says so
    assert (row["state"], row["restarts"], row["silent_s"]) == ("live", 1, None)
    b.observe(_report(11.0, 1, 4))  # resumed from its checkpoint of step 4
    b.poll({"live": [0, 1], "finished": []}, now=11.5)
    row = b.snapshot()["learners"][1]
    assert (row["state"], row["restarts"], row["step"], row["host"]) == ("live", 1, 4, "host1 pid 10")
    b.observe({"t": 12.0, "event": "left", "learner": 1, "finished": False})
    b.poll({"live": [0], "finished": []}, now=12.5)
    assert b.snapshot()["learners"][1]["state"] == "left"
    b.poll({"live": [0], "finished": []}, now=12.8)
    b.observe({"t": 12.6, "event": "joined", "learner": 1, "incarnation": 2})  # read late: the poll after it rules
    assert b.snapshot()["learners"][1]["state"] == "lost"
    b.poll({"live": [], "finished": [0, 1]}, now=13.0)
    snap = b.snapshot()
    assert [r["state"] for r in snap["learners"]] == ["finished", "finished"] and snap["finished"]
    b.poll(None, now=14.0)
    assert b.snapshot()["syncer"]["state"] == "not answering"


def test_merges_quorum_sizes_last_merge_and_guard_events():
    b = _board()
    b.merged({"at": 5.0, "fragment": 0, "version": 1, "learners": [0, 1], "guard": [], "sync_time": 0.01})
    guard = [{"learner": 1, "fragment": 1, "action": "drop"}]
    b.merged({"at": 50.0, "fragment": 1, "version": 1, "learners": [0], "guard": guard, "sync_time": 0.02})
    b.merged({"at": 70.0, "fragment": 0, "version": 2, "learners": [0], "guard": [], "sync_time": 0.03})
    b.observe({"t": 70.5, "event": "refused", "learner": 1, "why": "claimed"})
    b.observe({"t": 71.0, "event": "started", "pid": 12, "restored_merges": 3})
    snap = b.snapshot()
    assert snap["merges"]["total"] == 3 and snap["merges"]["quorum_sizes"] == {"1": 2, "2": 1}
    assert snap["merges"]["mean_sync_s"] == pytest.approx(0.02, abs=1e-15)
    assert snap["merges"]["per_minute"] == 2.0  # the merges of the last 60 s before t = 71
    assert snap["learners"][0]["last_merge"] == {"fragment": 0, "version": 2, "at": 70.0}
    assert snap["learners"][1]["last_merge"] == {"fragment": 0, "version": 1, "at": 5.0}
    assert snap["learners"][1]["guard"] == {"drop": 1} and snap["learners"][0]["guard_events"] == 0
    assert snap["syncer"]["epoch"] == 2 and snap["syncer"]["restarts"] == 1
    assert snap["syncer"]["refused"] == 1 and snap["syncer"]["restored_merges"] == 3


def test_metrics_parse_back_with_a_series_per_learner():
    from prometheus_client.parser import text_string_to_metric_families

    from diloco.decoupled.status.metrics import exposition

    b = _board()
    b.observe(_report(2.0, 0, 8))
    b.observe(_report(2.5, 1, 12))
    b.poll({"live": [0, 1], "finished": []}, now=3.0, checkpoint_age_s=1.0)
    b.loss(t=3.0, loss=4.5)
    body, kind = exposition(b.snapshot)
    assert kind.startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    steps = {s.labels["learner"]: s.value for s in families["diloco_learner_step"].samples}
    assert steps == {"0": 8.0, "1": 12.0}
    assert {s.labels["learner"] for s in families["diloco_learner_up"].samples} == {"0", "1"}
    assert families["diloco_global_loss"].samples[0].value == 4.5
    assert families["diloco_syncer_epoch"].samples[0].value == 1.0
    assert families["diloco_learner_guard_events"].type == "counter"


def test_the_page_has_a_row_per_learner_with_its_state_and_step():
    b = _board()
    b.observe(_report(2.0, 0, 8))
    b.poll({"live": [0], "finished": []}, now=3.0)
    page = render(b.snapshot(), refresh_s=2)
    assert '<tr id="learner-0" data-state="live" data-step="8"\ndata-restarts="0">' in page
    assert '<tr id="learner-1" data-state="lost" data-step=""\ndata-restarts="0">' in page
    assert '<meta http-equiv="refresh" content="2">' in page and page.count("<svg") == 2
    assert "refresh" not in render(b.snapshot())  # the page of a finished run does not reload


def test_step_rates_span_at_least_their_span_and_restart_after_a_resume():
    series = [[0.0, 0], [2.0, 10], [5.0, 25], [6.0, 30], [11.0, 55], [12.0, 5], [20.0, 45]]
    assert step_rates(series, span_s=5.0) == [(5.0, 5.0), (11.0, 5.0), (20.0, 5.0)]
    assert all(math.isfinite(r) for _, r in step_rates(series))


def test_the_page_of_a_finished_run_folds_its_folder_as_the_live_page_folded_the_feed(tmp_path, capsys):
    """``diloco status DIR`` (:func:`board_of_run`) reads the events and merges the service left and gives the
    figures the live board gave from the same rows."""
    import json

    from diloco.cli import main
    from diloco.decoupled.status.offline import board_of_run

    events = [
        {"t": 0.0, "event": "started", "pid": 11, "restored_merges": None},
        {"t": 0.5, "event": "hello", "learner": 0, "session": "s", "host": "h0 pid 1"},
        {"t": 1.0, "event": "joined", "learner": 0, "incarnation": 0},
        *[_report(1.0 + 1.25 * i, 0, 4 * i, staleness=i % 2) for i in range(1, 9)],
        {"t": 12.0, "event": "left", "learner": 0, "finished": True},
    ]
    merges = [{"at": 3.0 + i, "fragment": i % 2, "version": 1 + i // 2, "learners": [0], "guard": []} for i in range(4)]
    live = Board(num_learners=2, name="run")
    for row in events:
        live.observe(row)
    for record in merges:
        live.merged(record)
    (tmp_path / "syncer").mkdir()
    (tmp_path / "syncer" / "events.jsonl").write_text("".join(json.dumps(r) + "\n" for r in events))
    (tmp_path / "merges.jsonl").write_text("".join(json.dumps(r) + "\n" for r in merges))
    (tmp_path / "status-loss.jsonl").write_text(json.dumps({"t": 12.0, "tokens": 4096.0, "loss": 4.25}) + "\n")
    (tmp_path / "config.json").write_text(json.dumps({"replicas": 2, "syncer_shards": 1}))
    (tmp_path / "syncer.json").write_text(json.dumps({"name": "run"}))
    (tmp_path / "summary.json").write_text("{}")
    offline = board_of_run(tmp_path).snapshot()
    expected = live.snapshot()
    assert offline["learners"] == expected["learners"] and offline["merges"] == expected["merges"]
    assert offline["learners"][0]["state"] == "finished" and offline["learners"][1]["state"] == "not joined"
    assert offline["loss"] == [{"t": 12.0, "tokens": 4096.0, "loss": 4.25}] and offline["syncer"]["state"] == "stopped"
    assert main(["status", str(tmp_path)]) == 0
    assert '<tr id="learner-0" data-state="finished" data-step="32"' in (tmp_path / "status.html").read_text()
    (tmp_path / "notes.html").write_text("mine")
    assert main(["status", str(tmp_path), "--out", str(tmp_path / "notes.html")]) == 2
    assert "is not a status page" in capsys.readouterr().err
    assert (tmp_path / "notes.html").read_text() == "mine"  # a user's file is never overwritten
    from diloco.errors import ConfigError

    with pytest.raises(ConfigError, match="holds no `diloco syncer` run"):
        board_of_run(tmp_path / "syncer")


def test_the_metrics_reference_names_every_metric_served():
    """docs/reference/metrics.md lists each family a scrape holds (a counter under its ``_total`` name)."""
    from pathlib import Path

    from prometheus_client.parser import text_string_to_metric_families

    from diloco.decoupled.status.metrics import exposition

    b = _board()
    b.observe(_report(2.0, 0, 8))
    b.merged({"at": 3.0, "fragment": 0, "version": 1, "learners": [0], "guard": [], "sync_time": 0.01})
    b.poll({"live": [0], "finished": []}, now=3.0, checkpoint_age_s=1.0)
    b.loss(t=3.0, loss=4.5)
    reference = (Path(__file__).resolve().parents[2] / "docs" / "reference" / "metrics.md").read_text()
    families = list(text_string_to_metric_families(exposition(b.snapshot)[0].decode()))
    assert len(families) >= 20
    for family in families:
        name = family.name + ("_total" if family.type == "counter" else "")
        assert f"`{name}`" in reference, name
