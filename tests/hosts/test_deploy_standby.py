"""An active syncer whose host is lost mid-run, and its standby taking over (:mod:`diloco.testing.standby_hosts`:
the active on host 0, the standby on host 1, a site on each of hosts 2, 3 and 4 running the printed command: M = 3,
a host per site). Root only. Events, counts and each learner's worst step over its typical one here; the seconds
(takeover, first merge) are benchmarks/site_faults.py's rows."""

from __future__ import annotations

import pytest

pytest.importorskip("ray")

from diloco.testing.hosts import unavailable
from diloco.testing.standby_hosts import STANDBY_SETS, contiguous, run_standby_deploy

pytestmark = [pytest.mark.hosts, pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))]

SETS = STANDBY_SETS  # M = 3, 64 steps padded to 0.4 s, ride_out_steps=32
STEPS = SETS["steps"]


@pytest.mark.slow  # 65-120 s each on 2 cores at load 8-15: two Ray instances (startup 40-60 s), five hosts
@pytest.mark.timeout(480)
@pytest.mark.parametrize("quorum", [1, 2])
def test_the_standby_takes_over_when_the_active_host_is_lost_and_the_run_finishes(token_cache, quorum):
    """K = 1 and K = 2 of M = 3. Host 0 (the active syncer, its Ray with it) is killed once every learner passed
    step 16. The standby takes over at epoch 1 from its copy; every site job finishes without a restart (every step
    of each learner done once), the standby's merge versions run without a gap, it had every merge the active made
    before the kill that a learner could have been told of (its copy's records are the active's first rows, bit for
    bit as JSON), and it merged again after the kill. Every learner rode the switch out: its worst step after the
    kill is within 2 x its typical one (ride_out_steps covers the takeover). The last step is not counted there:
    a learner's finish waits for its last replies, at K = 2 for another learner's last report, fault or not (counted,
    one learner's last step, 0.5 s of it waiting, made a K = 2 run's figure 2.28 x: benchmarks/standby_loss.py)."""
    got = run_standby_deploy(token_cache=token_cache, sets={**SETS, "quorum": quorum}, kill_at_step=16, takeover_s=3.0)
    assert got["finished"] and got["epoch"] == 1
    merges, active = got["merges"], got["active_rows"]
    assert contiguous(merges), [(r["fragment"], r["version"]) for r in merges]
    assert got["restored_merges"] >= 2 and merges[: got["restored_merges"]] == active[: got["restored_merges"]]
    # the active's merges the standby did not hold: at most one a fragment (made, its state written, the host lost
    # before the copy: no learner got its reply); each was made again by the standby under the same version
    assert 0 <= got["lost_merges"] <= SETS["num_fragments"], got["lost_merges"]
    assert got["first_merge_after_kill_s"] is not None
    assert len(merges) > len(active)
    for learner in got["learners"]:
        assert learner["steps"] == list(range(1, STEPS + 1)) and learner["superseded"] == 0
    assert got["replication"] is not None or got["standby"]["copies"] >= got["restored_merges"]
    worst = [x["worst_over_typical_after_kill"] for x in got["learners"]]
    assert all(w is not None and w <= 2.0 for w in worst), [
        (x["worst_step"], x["typical_step_s"]) for x in got["learners"]
    ]
    print(
        f"standby takeover (K = {quorum}): takeover {got['takeover_s']:.1f} s, actor up "
        f"{got['actor_started_after_kill_s']:.1f} s, first merge {got['first_merge_after_kill_s']:.1f} s "
        f"after the kill, lost {got['lost_merges']}, worst/typical "
        f"{[round(w, 2) for w in worst]}, last step/typical "
        f"{[round(x['last_step']['dt'] / x['typical_step_s'], 2) for x in got['learners']]}, wall {got['wall_s']:.0f} s"
    )
