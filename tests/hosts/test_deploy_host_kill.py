"""A deployed run (:mod:`_deploy`: the service on host 0, sites on hosts 1 and 2 running the printed commands) that
loses a rank of one site and then the whole other site host. Root only."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

pytest.importorskip("ray")

from _deploy import (
    SERVICE_OUT,
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

from diloco.decoupled.chaos_logs import final_steps
from diloco.testing.deploy_env import contiguous
from diloco.testing.hosts import Hosts, unavailable

pytestmark = [pytest.mark.hosts, pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))]

STEPS = 96
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


@pytest.mark.slow  # 44-51 s on 2 cores (load 4-12): Ray on host 0, two sites, a job restart and a host reboot
@pytest.mark.timeout(420)
def test_a_killed_rank_and_a_killed_site_host_rejoin_and_count_again(token_cache):
    """Once both learners passed step 12, learner 0's lead rank (host 1) is SIGKILLed, torchrun's agent restarts
    its job; and host 2 is killed whole (every process of it at once, its /tmp kept) and brought back by running its
    printed command again. Each job resumes from its own --out (its newest checkpoint, of step >= 8, not step 0)
    and contributes a merge of weight > 0 after it rejoined. The service ends with both learners finished, every
    step of each learner done once in the final trajectory, and the merge versions without a gap."""
    with Hosts(3) as (h0, h1, h2):
        service = start_service(h0, token_cache, SETS)
        lines, service = printed_commands(h0, service, token_cache=token_cache, sets=SETS)
        for h in (h1, h2):
            give_cache(h, token_cache)
        began = time.monotonic()
        sites = [run_site(h1, lines[0], "site-0"), run_site(h2, lines[1], "site-1")]
        procs = [service, *sites]
        logs = [learner_log(h1, lines[0], 0), learner_log(h2, lines[1], 1)]
        figures: dict[str, object] = {}

        # both at step 12: a rank of site 0 SIGKILLed inside host 1 (torchrun restarts its job), and host 2 killed
        # whole, then its printed command run there again (as its operator would, once the machine is back)
        wait("both learners at step 12", lambda: all(_at_step(log, 12)() for log in logs), timeout=180, procs=procs)
        first = _joined(logs[0])[-1]
        reached = [max(r.get("step", 0) for r in rows(log)) for log in logs]
        os.kill(host_pid(h1, int(first["pid"])), signal.SIGKILL)
        killed_at = time.time()
        h2.kill()
        assert sites[1].returncode != 0
        reached[1] = max(r.get("step", 0) for r in rows(logs[1]))
        sites[1] = run_site(h2, lines[1], "site-1-again")
        procs = [service, *sites]
        back = [
            wait(
                f"learner {m}'s new job",
                lambda log=log: next((r for r in _joined(log) if r["t"] > killed_at), None),
                timeout=180,
                procs=procs,
            )
            for m, log in enumerate(logs)
        ]
        for m in (0, 1):  # each resumed from its own --out's newest checkpoint (every 8 steps), not from step 0
            assert 8 <= back[m]["start_step"] <= reached[m] + 1 and back[m]["start_step"] % 8 == 0, (back, reached)
            t = wait(
                f"learner {m}'s merge after it rejoined",
                lambda m=m: weighted_after(records(h0), m, back[m]["t"]),
                timeout=180,
                procs=procs,
            )
            figures[f"learner{m}_back_to_merge_s"] = t[0] - back[m]["t"]
            figures[f"learner{m}_reached_resumed"] = (reached[m], back[m]["start_step"])

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
            assert superseded >= reached[m] - back[m]["start_step"]  # the killed job's steps past its checkpoint
        assert h2.path(site_out(lines[1])).is_dir() and not h1.path(site_out(lines[1])).exists()
    print(f"host kill across hosts: {figures}")
