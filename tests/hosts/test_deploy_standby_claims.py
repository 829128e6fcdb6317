"""Claims across a takeover (:mod:`diloco.testing.standby_hosts`, M = 3, K = 1): once the standby took over from the
lost active, site 0's printed command run again on another host (the spare) while learner 0 lives is refused
("learner 0 is taken"), and the claims the standby holds are the live learners' own sessions, the ones the active
granted: the standby granted none. Root only. The claim's copy before a job hears of it (no window between a hello
and the standby's copy): tests/integration/test_standby_replication.py."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("ray")

from diloco.decoupled.chaos_logs import read_learner_log
from diloco.decoupled.checkpoint import load_latest_state
from diloco.testing.hosts import unavailable
from diloco.testing.standby_hosts import ACTIVE_OUT, STANDBY_OUT, run_standby_deploy
from diloco.testing.waiting import wait

pytestmark = [pytest.mark.hosts, pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))]

STEPS = 128
SETS = {
    "replicas": 3,
    "quorum": 1,
    "global_batch": 12,
    "sync_every": 8,
    "num_fragments": 2,
    "overlap_steps": 1,
    "steps": STEPS,
    "eval_every": STEPS,
    "checkpoint_every": 16,
    "step_time": 0.3,  # 112 steps after the kill: 34 s, for the second job to start and be refused meanwhile
    "ride_out_steps": 32,
    "threads": 1,
}
TAKEN = "learner 0 is taken"


def _second_job(run: dict) -> dict:
    """Site 0's command, as printed, run on the spare host; its first refusal, the learners alive then, and the
    claims the standby holds at that moment (its newest state, written by its actor after the takeover)."""
    spare, jobs = run["spare"], run["jobs"]
    began = time.monotonic()
    job = spare.run(["sh", "-c", f"cd /tmp && {run['lines'][0]}"], env=run["env"](), name="second-job-0")

    def refused() -> bool:
        return any(TAKEN in p.read_text(errors="replace") for p in (job.stdout_path, job.stderr_path))

    wait("the second job's refusal", refused, timeout=150, procs=[run["standby"], *jobs])
    alive = [j.poll() is None for j in jobs]
    refused_s = time.monotonic() - began
    h0, h1 = run["hosts"][0], run["hosts"][1]
    held = load_latest_state(str(h1.path(STANDBY_OUT) / "syncer"))["claims"]
    spare.kill()  # (its torchrun would try again: 1 + --max-restarts times, each refused the same way)
    granted = [e for e in read_learner_log(h0.path(f"{ACTIVE_OUT}/syncer/events.jsonl")) if e["event"] == "hello"]
    events = read_learner_log(h1.path(f"{STANDBY_OUT}/syncer/events.jsonl"))
    return {
        "alive": alive,
        "refused_s": refused_s,
        "held": held,
        "granted_by_active": granted,
        "standby_events": events,
    }


@pytest.mark.slow  # 100-115 s on 2 cores at load 10-15: two Ray instances, six hosts, a second site job
@pytest.mark.timeout(480)
def test_after_a_takeover_a_live_learners_index_is_refused_to_a_second_job(token_cache):
    """After the standby took over, site 0's command run again (another host, the same token and index) is refused
    as taken while every learner lives; the standby's claims are exactly the sessions the active granted to the
    three site jobs (one each), the standby logged that refusal and granted no claim; the run then finishes (every
    learner every step once)."""
    got = run_standby_deploy(
        token_cache=token_cache, sets=SETS, kill_at_step=16, takeover_s=3.0, after_takeover=_second_job
    )
    assert got["finished"] and got["epoch"] == 1
    seen = got["after_takeover"]
    assert seen["alive"] == [True, True, True], "a learner ended before the second job was refused: not a live index"
    sessions = {str(e["learner"]): e["session"] for e in seen["granted_by_active"]}
    assert len(seen["granted_by_active"]) == 3 and sorted(sessions) == ["0", "1", "2"], seen["granted_by_active"]
    assert seen["held"] == sessions
    refusals = [e for e in seen["standby_events"] if e["event"] == "refused"]
    assert refusals and all(e["learner"] == 0 and e["why"] == "claimed" for e in refusals), refusals
    assert not [e for e in seen["standby_events"] if e["event"] == "hello"]
    for learner in got["learners"]:
        assert learner["steps"] == list(range(1, STEPS + 1)) and learner["superseded"] == 0
    print(
        f"claims across a takeover: the second job refused {seen['refused_s']:.1f} s after it started "
        f"(takeover {got['takeover_s']:.1f} s after the kill), wall {got['wall_s']:.0f} s"
    )
