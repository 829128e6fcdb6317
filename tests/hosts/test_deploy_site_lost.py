"""A deployed run at K = M = 3 (:mod:`_deploy`: the service on host 0, sites on hosts 1-3 running the printed
commands) that loses one site host for good: the learner lease (:mod:`diloco.decoupled.learner_lease`) lets the
other two merge without it, and the site's command run again joins and counts again. Root only."""

from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("ray")

from _deploy import (
    SERVICE_OUT,
    give_cache,
    learner_log,
    printed_commands,
    records,
    rows,
    run_site,
    start_service,
    wait,
    weighted_after,
)

from diloco.testing.deploy_env import contiguous
from diloco.testing.hosts import Hosts, unavailable

pytestmark = [pytest.mark.hosts, pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))]

STEPS = 48
#: K = M = 3 (every merge waits for every learner alive), one fragment, steps padded to 0.05 s, a checkpoint every 8
#: steps; the learner lease is the default (auto: 5 s above the slowest step).
SETS = {
    "replicas": 3,
    "quorum": 3,
    "global_batch": 6,
    "sync_every": 4,
    "num_fragments": 1,
    "steps": STEPS,
    "eval_every": STEPS,
    "checkpoint_every": 8,
    "step_time": 0.05,
    "threads": 1,
}


def _events(h0) -> list[dict]:
    return rows(h0.path(f"{SERVICE_OUT}/syncer/events.jsonl"))


def _lease(h0, event: str, m: int, after: float = 0.0) -> dict | None:
    return next((e for e in _events(h0) if e["event"] == event and e["learner"] == m and e["t"] > after), None)


@pytest.mark.slow  # 48-84 s on 2 cores at load 6-12: Ray on host 0, three sites, a host lost and its command run again
@pytest.mark.timeout(420)
def test_a_site_lost_for_good_leaves_at_k_equals_m_and_its_command_run_again_counts_again(token_cache):
    """Once every learner passed step 12, host 3 (learner 2's site) is killed whole. The syncer's events show, in
    order: merges of all three until learner 2 leaves by its lease (none of the other two alone before: K = M waits
    for it until then), then merges of learners 0 and 1 alone (the run goes on without it). Its printed command,
    run again on the host, joins again (the lease's join event) and has a merge with weight > 0 after it. Every
    learner finishes; the service's summary.json counts the leave and the join and names learner 2."""
    with Hosts(4) as (h0, *sites_h):
        service = start_service(h0, token_cache, SETS)
        lines, service = printed_commands(h0, service, token_cache=token_cache, sets=SETS)
        for h in sites_h:
            give_cache(h, token_cache)
        sites = [run_site(h, line, f"site-{m}") for m, (h, line) in enumerate(zip(sites_h, lines, strict=True))]
        procs = [service, *sites]
        logs = [learner_log(h, line, m) for m, (h, line) in enumerate(zip(sites_h, lines, strict=True))]
        wait(
            "every learner at step 12",
            lambda: all(any(r.get("step", 0) >= 12 for r in rows(log)) for log in logs),
            timeout=240,
            procs=procs,
        )
        killed_at = time.time()
        sites_h[2].kill()  # every process of learner 2's site at once, for good
        procs = [service, *sites[:2]]
        try:
            left = wait("learner 2's leave", lambda: _lease(h0, "lease left", 2, killed_at), timeout=120, procs=procs)
        except AssertionError as exc:  # what the syncer saw, to tell a lease that never lapsed from one not written
            seen = [e for e in _events(h0) if e.get("t", 0) > killed_at - 5]
            raise AssertionError(f"{exc}\nthe syncer's events from 5 s before the kill: {seen[-20:]}") from None

        def after_leave() -> list[dict]:
            return [e for e in _events(h0) if e["event"] == "merged" and e["t"] > left["t"]]

        merged = wait(
            "two merges after the leave", lambda: len(after_leave()) >= 2 and after_leave(), timeout=120, procs=procs
        )
        assert all(e["learners"] == [0, 1] for e in merged), merged  # the others merge without it
        during = [e for e in _events(h0) if e["event"] == "merged" and killed_at < e["t"] < left["t"]]
        assert all(2 in e["learners"] for e in during), during  # until it left, every merge was all three's

        again = run_site(sites_h[2], lines[2], "site-2-again")  # the host is back: its command run again
        procs = [service, *sites[:2], again]
        joined = wait("learner 2's join", lambda: _lease(h0, "lease joined", 2, left["t"]), timeout=180, procs=procs)
        wait(
            "a merge of learner 2 with weight > 0 after it joined",
            lambda: weighted_after(records(h0), 2, joined["t"]),
            timeout=180,
            procs=procs,
        )
        for p in (*sites[:2], again):
            assert p.wait(timeout=240) == 0, p.stderr_path.read_text()[-3000:]
        assert service.wait(timeout=120) == 0, service.stderr_path.read_text()[-3000:]
        merges = rows(h0.path(SERVICE_OUT) / "merges.jsonl")
        assert contiguous(merges), [(r["fragment"], r["version"]) for r in merges]
        summary = json.loads((h0.path(SERVICE_OUT) / "summary.json").read_text())
        lease = summary["learner_lease"]
        assert lease["setting"] == "auto" and lease["leaves"] >= 1 and lease["joins"] >= 1, lease
        assert {"event": "lease left", "learner": 2} in [
            {k: e[k] for k in ("event", "learner")} for e in lease["events"]
        ]
        figures = {
            "kill_to_leave_s": left["t"] - killed_at,
            "leave_to_merge_s": merged[0]["t"] - left["t"],
            "lease_s": left["lease_s"],
            "silent_s": left["silent_s"],
            "leaves": lease["leaves"],
            "joins": lease["joins"],
        }
    print(f"site lost at K = M: {figures}")
