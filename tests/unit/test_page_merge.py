"""``diloco.bench.page_merge`` (``benchmarks/status_page_merge.py``'s syncer and figures): the syncer process writes
what the status page folds (its real actor class, K = M merges of the synthetic learners' reports), and the figures
are the closed forms of a run's phases and merges."""

from __future__ import annotations

import pytest

from diloco.bench.page_merge import figures, phase_rounds, run_syncer
from diloco.decoupled.chaos_logs import read_learner_log
from diloco.decoupled.checkpoint import saved_states
from diloco.decoupled.status.board import Board

CONFIG = {"method": "decoupled", "replicas": 3, "size": "tiny", "global_batch": 12, "steps": 100, "sync_every": 4}


def test_the_syncer_process_writes_what_the_page_folds(tmp_path):
    import torch

    folder = tmp_path / "syncer"
    threads = torch.get_num_threads()
    summary = run_syncer(
        {
            "folder": str(folder),
            "config": CONFIG,
            "vocab_size": 64,
            "every_s": 0.0,
            "max_merges": 3,
            "summary": str(tmp_path / "summary.json"),
        }
    )
    assert summary["merges"] == 3 and summary["learners"] == 3 and summary["codec"] == "fp32"
    assert torch.is_grad_enabled() and torch.get_num_threads() == threads  # this process' torch as it was
    assert summary["threads"] == 1 and summary["state_write_s"] > 0 and summary["state_bytes"] > 0
    assert [p.name for p in saved_states(folder)] == ["syncer-00000001.pt"]  # once, after the first merge
    records = read_learner_log(folder / "records.jsonl")
    assert [r["learners"] for r in records] == [[0, 1, 2]] * 3 and all(r["sync_time"] > 0 for r in records)
    board = Board(num_learners=3)
    for row in read_learner_log(folder / "events.jsonl"):
        board.observe(row)
    for record in records:
        board.merged(record)
    snap = board.snapshot()
    assert snap["merges"]["total"] == 3 and snap["merges"]["quorum_sizes"] == {"3": 3}
    assert [lr["step"] for lr in snap["learners"]] == [12, 12, 12]  # 3 reports of H = 4 steps each
    assert [lr["restarts"] for lr in snap["learners"]] == [0, 0, 0]  # each joined once
    assert snap["syncer"]["epoch"] == 1 and snap["syncer"]["pid"] == summary["pid"]


def _phases(rounds: int, phase_s: float = 10.0) -> list[dict]:
    out, t = [], 1000.0
    for r in range(rounds):
        for viewed in (True, False) if r % 2 == 0 else (False, True):
            out.append({"round": r, "viewed": viewed, "start": t, "end": t + phase_s,
                        "page_side_cpu_s": 0.05 if viewed else 0.01, "syncer_cpu_s": 4.0})  # fmt: skip
            t += phase_s
    return out


def test_the_figures_are_the_closed_forms_of_the_phases_and_merges():
    phases = _phases(4)
    merges = []
    for p in phases:  # 5 merges a phase, 2 s apart; viewed ones take 1.1 x as long; one round's idle phase thin
        thin = p["round"] == 3 and not p["viewed"]
        for i in range(2 if thin else 5):
            merges.append({"at": p["start"] + 1.0 + 2.0 * i, "sync_time": (0.44 if p["viewed"] else 0.40) + 1e-3 * i})
    rounds = phase_rounds(phases, merges)
    assert [r["round"] for r in rounds] == [0, 1, 2]  # round 3's idle phase holds 2 merges (< 3): left out
    assert all(r["viewed_ms"] == pytest.approx(442.0) and r["idle_ms"] == pytest.approx(402.0) for r in rounds)
    f = figures(phases=phases, merges=merges, page_cpu_s=0.04)
    assert f["wall_s"] == 80.0 and f["viewed_s"] == 40.0 and f["merges"] == len(merges) == 37
    assert f["median_round_ratio"] == pytest.approx(442 / 402) and not f["effect_under_1pct"]
    assert f["page_cpu_ms_per_viewed_s"] == pytest.approx(1.0)  # 0.04 s over 40 s viewed
    merge_ms_per_s = 1e3 * sum(m["sync_time"] for m in merges) / 80.0
    assert f["merge_ms_per_s"] == pytest.approx(merge_ms_per_s)
    assert f["page_of_merge_time"] == pytest.approx(1.0 / merge_ms_per_s) and f["cost_under_1pct"]
    mean = sum(m["sync_time"] for m in merges) / len(merges)
    assert f["interval_for_1pct_s"] == pytest.approx(0.01 * mean / 1e-3)  # 1 % of a merge = the page's CPU
    assert f["page_side_cpu_ms_per_s"] == {"viewed": pytest.approx(5.0), "not_viewed": pytest.approx(1.0)}
    assert f["page_side_cpu_ms_per_viewed_s_excess"] == pytest.approx(4.0)
    assert f["syncer_cpu_ms_per_s"]["not_viewed"] == pytest.approx(400.0)
    cpu = [{"at": m["at"], "cpu_s": m["sync_time"] / 2} for m in merges]  # the same merges at half the CPU time
    g = figures(phases=phases, merges=merges, page_cpu_s=0.04, merge_cpu=cpu)
    assert g["cpu_median_round_ratio"] == pytest.approx(442 / 402) and len(g["cpu_rounds"]) == 3
    assert g["page_of_cpu_merge_time"] == pytest.approx(2 * f["page_of_merge_time"])
    assert g["cpu_interval_for_1pct_s"] == pytest.approx(f["interval_for_1pct_s"] / 2)
