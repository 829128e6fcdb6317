"""The chaos benchmark's table columns and its paired loss difference, on rows written out by hand."""

from __future__ import annotations

import math

import pytest

from diloco.bench.chaos_table import (
    columns_for,
    loop_text,
    mean_wait,
    paired_difference,
    syncer_kill_text,
    wait_text,
)


def _row(method, fault, seed, loss, M=4, **kw):
    return {"method": method, "M": M, "fault": fault, "seed": seed, "eval_loss": loss, "kills": [], **kw}


def test_paired_difference_pairs_by_seed_with_its_standard_error():
    rows = [
        _row("a", "none", 0, 4.0),
        _row("a", "none", 1, 4.5),
        _row("a", "none", 2, 9.0),  # no partner: left out
        _row("b", "kill", 1, 4.8),
        _row("b", "kill", 0, 4.1),
        _row("b", "kill", 0, 7.0, M=2),  # another M: left out
    ]
    mean, se, n = paired_difference(rows, base=("a", "none"), other=("b", "kill"), M=4)
    assert n == 2 and mean == pytest.approx(0.2)  # differences 0.1 and 0.3
    assert se == pytest.approx(math.sqrt(0.02) / math.sqrt(2))  # stdev of (0.1, 0.3) / sqrt(2)
    one = paired_difference(rows, base=("a", "none"), other=("b", "kill"), M=2)
    assert one is None  # M = 2 has no base row
    assert paired_difference(rows[:1] + rows[4:5], base=("a", "none"), other=("b", "kill"), M=4) == (
        pytest.approx(0.1),
        None,
        1,
    )


def test_waiting_share_columns_and_loop_label():
    r = _row("decoupled-default", "none", 0, 4.0, wait_share=[0.1, 0.3, None, 0.2], loop="trainer")
    assert mean_wait(r) == pytest.approx(0.2)  # a learner without a step is left out
    assert wait_text(r) == "20.0% (10.0% 30.0% - 20.0%)"
    assert loop_text(r) == "trainer"
    old = {"method": "decoupled", "M": 2, "fault": "none", "eval_loss": 4.1, "kills": []}
    assert loop_text(old) == "plain" and wait_text(old) is None and mean_wait(old) is None
    assert loop_text({"method": "torchft"}) is None
    names = [c[0] for c in columns_for([r, old])]
    assert names[:3] == ["loop", "method", "seed"] and "waiting: mean (per learner)" in names
    assert "seed" not in [c[0] for c in columns_for([old])]


def test_syncer_kill_text_says_whether_a_merge_was_lost():
    kill = {"worst_step_ratio": 1.25, "down_s": 2.04, "restored_merges": 30, "merges_before": 30}
    r = _row("decoupled-rideout", "syncer-kill", 0, 4.0, syncer_kills=[kill], versions_contiguous=True)
    assert syncer_kill_text(r) == "1.2x, 2.0 s down, 30 of 30 merges kept, versions without a gap"
    assert syncer_kill_text({**r, "versions_contiguous": False}).endswith("a version missing")
    assert syncer_kill_text(_row("decoupled-default", "none", 0, 4.0)) is None
