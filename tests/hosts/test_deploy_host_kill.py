"""A deployed run (:mod:`_deploy`: the service on host 0, sites on hosts 1 and 2 running the printed commands) that
loses a rank of one site and then the whole other site host. Root only."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

pytest.importorskip("ray")

from _deploy import (  # noqa: E402
    SERVICE_OUT,
    contiguous,
    give_cache,
    host_pid,
    learner_log,
    printed_commands,
    records,
    rows,
    run_site,
    site_out,
    start_service,
    wait,
    weighted_after,
)

from diloco.decoupled.chaos_logs import final_steps  # noqa: E402
from diloco.testing.hosts import Hosts, unavailable  # noqa: E402

pytestmark = [pytest.mark.hosts, pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))]

STEPS = 72
#: K = 1 < M = 2 (neither site waits for the other), steps padded to 0.15 s (site_faults.py's), a checkpoint every 8.
SETS = {
    "replicas": 2,
    "global_batch": 8,
    "quorum": 1,
    "sync_every": 8,
    "num_fragments": 2,
    "overlap_steps": 1,
    "steps": STEPS,
    "eval_every": STEPS,
    "checkpoint_every": 8,
    "step_time": 0.15,
    "ride_out_steps": 16,
    "threads": 1,
}


def _at_step(log, step: int):
    return lambda: any(r.get("step", 0) >= step for r in rows(log))


def _joined(log) -> list[dict]:
    return [r for r in rows(log) if r.get("event") == "joined"]


@pytest.mark.slow  # ~90-120 s on 2 cores: Ray on host 0, two sites, a job restart and a host's reboot
@pytest.mark.timeout(420)
def test_a_killed_rank_and_a_killed_site_host_rejoin_and_count_again(token_cache):
    """Learner 0's rank (host 1) is SIGKILLed after its step 12: torchrun's agent restarts the job, which resumes
    from its checkpoint of step 8 and contributes a merge of weight > 0 again. Then host 2 is killed whole after
    learner 1's step 12 (every process of it at once, its /tmp kept) and brought back by running its printed command
    again: the job resumes from its own --out (a checkpoint of step >= 8, not step 0) and contributes a merge of
    weight > 0 after it rejoined. The service ends with both learners finished, every step of each learner done
    once in the final trajectory, and the merge versions without a gap."""
    with Hosts(3) as (h0, h1, h2):
        service = start_service(h0, token_cache, SETS)
        lines, service = printed_commands(h0, service, token_cache=token_cache, sets=SETS)
        for h in (h1, h2):
            give_cache(h, token_cache)
        began = time.monotonic()
        sites = [run_site(h1, lines[0], "site-0"), run_site(h2, lines[1], "site-1")]
        logs = [learner_log(h1, lines[0], 0), learner_log(h2, lines[1], 1)]
        figures: dict[str, float] = {}

        # a rank of site 0: SIGKILLed inside host 1; torchrun restarts the job
        wait("learner 0 at step 12", _at_step(logs[0], 12), timeout=180, procs=[service, *sites])
        first = _joined(logs[0])[-1]
        os.kill(host_pid(h1, int(first["pid"])), signal.SIGKILL)
        again = wait(
            "learner 0's restart",
            lambda: next((r for r in _joined(logs[0]) if r["pid"] != first["pid"] or r["t"] > first["t"]), None),
            timeout=120,
            procs=[service, *sites],
        )
        assert again["start_step"] == 8, again  # its newest checkpoint, not step 0
        t = wait(
            "learner 0's merge after its restart",
            lambda: weighted_after(records(h0), 0, again["t"]),
            timeout=120,
            procs=[service, *sites],
        )
        figures["rank_restart_to_merge_s"] = t[0] - again["t"]

        # site 1's host: killed whole, then its printed command run again there
        wait("learner 1 at step 12", _at_step(logs[1], 12), timeout=180, procs=[service, sites[0]])
        killed_at = time.time()
        h2.kill()
        assert sites[1].returncode != 0
        reached = max(r.get("step", 0) for r in rows(logs[1]))
        sites[1] = run_site(h2, lines[1], "site-1-again")
        back = wait(
            "learner 1's new job",
            lambda: next((r for r in _joined(logs[1]) if r["t"] > killed_at), None),
            timeout=180,
            procs=[service, *sites],
        )
        assert 8 <= back["start_step"] <= reached, (back, reached)  # resumed from its own --out on host 2
        t = wait(
            "learner 1's merge after it rejoined",
            lambda: weighted_after(records(h0), 1, back["t"]),
            timeout=180,
            procs=[service, *sites],
        )
        figures["host_back_to_merge_s"] = t[0] - back["t"]

        for p in sites:
            assert p.wait(timeout=240) == 0, p.stderr_path.read_text()[-3000:]
        assert service.wait(timeout=120) == 0, service.stderr_path.read_text()[-3000:]
        figures["wall_s"] = time.monotonic() - began
        assert "every learner finished" in service.stdout_path.read_text()
        merges = rows(h0.path(SERVICE_OUT) / "merges.jsonl")
        assert contiguous(merges), [(r["fragment"], r["version"]) for r in merges]
        assert json.loads((h0.path(SERVICE_OUT) / "summary.json").read_text())["merges"] == len(merges)
        for m, log in enumerate(logs):
            steps, superseded = final_steps(rows(log))
            assert [r["step"] for r in steps] == list(range(1, STEPS + 1)), m
            assert superseded >= 1  # the killed job's steps past its checkpoint, done again
        assert h2.path(site_out(lines[1])).is_dir() and not h1.path(site_out(lines[1])).exists()
    print(f"host kill across hosts: {figures}")
