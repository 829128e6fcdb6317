"""A deployed run (:mod:`_deploy`: the service on host 0, sites on hosts 1 and 2 running the printed commands) that
loses a rank of one site and then the whole other site host, watched on the service's status page from host 1's
network (:mod:`_page`: scraped, and loaded in headless Chromium where it is installed). Root only."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time

import pytest

pytest.importorskip("ray")

from _chromium import dump_dom, find_chromium, screenshot
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
from _page import Page, in_network, page_rows

from diloco.decoupled.chaos_logs import final_steps
from diloco.decoupled.membership import LEASE_S
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


#: Seconds past the lease within which the page must say the lost host's learner is lost: the monitor's poll (1 s),
#: the claim's lapse seen twice a heartbeat apart, and slack for a loaded 2-core machine (as the status page's tests).
LOST_SLACK_S = 6.0


def _page_checks_while_both_train(page: Page, browser: str | None, viewer: list[str]) -> None:
    """Both learners live on the page with a step, no restart, and each on its own host (its row names the site
    machine's hostname); ``/metrics`` parses with prometheus-client's parser and holds a series per learner; the page,
    its metrics and its JSON refuse a request without the token or with another."""
    from prometheus_client.parser import text_string_to_metric_families

    for path in ("/", "/metrics", "/status.json"):
        assert page.get(path, token="")[0] == 401
        assert page.get(path, token="not-it")[0] == 401
        assert page.get(path, token="not-it", bearer=True)[0] == 401
    learners = page.snapshot()["learners"]
    assert [r["state"] for r in learners] == ["live", "live"], learners
    assert [r["host"].split()[0] for r in learners] == ["host1", "host2"], learners  # "HOSTNAME pid N"
    status, text = page.get("/metrics", bearer=True)  # what Prometheus sends with `authorization: credentials`
    assert status == 200
    families = {f.name: f for f in text_string_to_metric_families(text)}
    steps = {s.labels["learner"]: s.value for s in families["diloco_learner_step"].samples}
    assert set(steps) == {"0", "1"} and min(steps.values()) >= 8, steps
    assert {s.labels["learner"] for s in families["diloco_learner_up"].samples if s.value == 1} == {"0", "1"}
    if browser:
        rows_ = page_rows(dump_dom(browser, page.url, prefix=viewer))
        assert set(rows_) == {0, 1}, rows_
        assert all(s == "live" and (step or 0) >= 8 and r == 0 for s, step, r in rows_.values()), rows_


def _why(h0, learners: list[dict], logs) -> str:
    """What a failed check of the page's rows shows: each row's state and timing, and each learner's last events at
    the syncer and in its own log."""
    events = rows(h0.path(f"{SERVICE_OUT}/syncer/events.jsonl"))
    keys = ("state", "silent_s", "step", "restarts", "last_merge_age_s", "reports")
    out = [str([{k: r.get(k) for k in ("learner", *keys)} for r in learners])]
    for m, log in enumerate(logs):
        out.append(
            f"syncer, learner {m}: {[e for e in events if e.get('learner') == m and e.get('event') != 'report'][-6:]}"
        )
        out.append(f"log of learner {m}: {[r for r in rows(log) if 'event' in r][-6:]}")
    return "\n".join(out)


@pytest.mark.slow  # 42-43 s on 2 cores: Ray on host 0, two sites, a job restart, a host reboot and the page
@pytest.mark.timeout(420)
def test_a_killed_rank_and_a_killed_site_host_rejoin_and_count_again(token_cache, tmp_path):
    """Once both learners passed step 12, learner 0's lead rank (host 1) is SIGKILLed, torchrun's agent restarts
    its job; and host 2 is killed whole (every process of it at once, its /tmp kept); once the status page says its
    learner is ``lost`` (its heartbeat's lease out), host 2's printed command is run again there. Each job resumes
    from its own --out (its newest checkpoint, of step >= 8, not step 0) and contributes a merge of weight > 0 after
    it rejoined; the page has each learner ``live`` again with one restart. The service ends with both learners
    finished, every step of each learner done once in the final trajectory, and the merge versions without a gap;
    its folder holds the page as it ended, and ``diloco status`` renders it again from the folder.

    The page is read from host 1's network at host 0's address, as an operator's machine would (scraped; and
    loaded in headless Chromium when installed: apt-get install chromium). The screenshot is saved
    (``tmp_path/status-page.png``; also to ``$DILOCO_STATUS_SCREENSHOT`` when set: how the deploy guide's image is
    made)."""
    pytest.importorskip("prometheus_client")
    browser = find_chromium()
    with Hosts(3) as (h0, h1, h2):
        extra = ("--status-eval", "5")  # the page's loss plot: a point every 5 s
        service = start_service(h0, token_cache, SETS, extra=extra)
        lines, service = printed_commands(h0, service, token_cache=token_cache, sets=SETS, extra=extra)
        for h in (h1, h2):
            give_cache(h, token_cache)
        began = time.monotonic()
        sites = [run_site(h1, lines[0], "site-0"), run_site(h2, lines[1], "site-1")]
        procs = [service, *sites]
        logs = [learner_log(h1, lines[0], 0), learner_log(h2, lines[1], 1)]
        figures: dict[str, object] = {}
        page, viewer = Page(h0, h1), in_network(h1)

        # both at step 12: the page, then a rank of site 0 SIGKILLed inside host 1 (torchrun restarts its job), and
        # host 2 killed whole; once the page says learner 1 is lost, its printed command is run there again (as its
        # operator would, once the machine is back)
        wait("both learners at step 12", lambda: all(_at_step(log, 12)() for log in logs), timeout=180, procs=procs)
        _page_checks_while_both_train(page, browser, viewer)
        first = _joined(logs[0])[-1]
        reached = [max(r.get("step", 0) for r in rows(log)) for log in logs]
        os.kill(host_pid(h1, int(first["pid"])), signal.SIGKILL)
        killed_at = time.time()
        h2.kill()
        lost_from = time.monotonic()
        assert sites[1].returncode != 0
        reached[1] = max(r.get("step", 0) for r in rows(logs[1]))
        wait(
            "the page to say learner 1 is lost",
            lambda: page.snapshot()["learners"][1]["state"] == "lost",
            timeout=LEASE_S + LOST_SLACK_S + 30,
            procs=[service, sites[0]],
            every=0.5,
        )
        figures["lost_after_s"] = round(time.monotonic() - lost_from, 1)  # 5 s lease, 1 s poll
        if browser:
            assert page_rows(dump_dom(browser, page.url, prefix=viewer))[1][0] == "lost"
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
        learners = wait(
            "the page to count each learner's restart",
            lambda: (got := page.snapshot()["learners"]) and all(r["restarts"] == 1 for r in got) and got,
            timeout=30,
            procs=procs,
            every=0.5,
        )
        # (the rows can be read within a poll of a learner's join: one the page saw join after its last poll is live,
        # not lost; before, a fresh clone's run failed here once)
        assert all(r["state"] in ("live", "finished") for r in learners), _why(h0, learners, logs)
        if browser:
            assert all(r == 1 for _, _, r in page_rows(dump_dom(browser, page.url, prefix=viewer)).values())
            shot = tmp_path / "status-page.png"
            assert screenshot(browser, page.url, shot, prefix=viewer) >= 16  # not blank
            if os.environ.get("DILOCO_STATUS_SCREENSHOT"):
                shutil.copyfile(shot, os.environ["DILOCO_STATUS_SCREENSHOT"])

        for p in sites:
            assert p.wait(timeout=240) == 0, p.stderr_path.read_text()[-3000:]
        assert service.wait(timeout=120) == 0, service.stderr_path.read_text()[-3000:]
        figures["wall_s"] = time.monotonic() - began
        assert "every learner finished" in service.stdout_path.read_text()
        svc = h0.path(SERVICE_OUT)
        merges = rows(svc / "merges.jsonl")
        assert contiguous(merges), [(r["fragment"], r["version"]) for r in merges]
        summary = json.loads((svc / "summary.json").read_text())
        assert summary["merges"] == len(merges)
        for m, log in enumerate(logs):
            steps, superseded = final_steps(rows(log))
            assert [r["step"] for r in steps] == list(range(1, STEPS + 1)), m
            assert superseded >= reached[m] - back[m]["start_step"]  # the killed job's steps past its checkpoint
        assert h2.path(site_out(lines[1])).is_dir() and not h1.path(site_out(lines[1])).exists()

        # the page as the run ended, in the service's folder; `diloco status` renders it again from the folder
        final = json.loads((svc / "status.json").read_text())
        assert [(r["state"], r["step"], r["restarts"]) for r in final["learners"]] == [("finished", STEPS, 1)] * 2
        assert final["merges"]["total"] == len(merges)
        assert final["loss"] and final["loss"][-1]["loss"] == pytest.approx(summary["final_eval_loss"])
        from diloco.decoupled.status.offline import board_of_run

        again = board_of_run(svc).snapshot()
        keys = ("host", "state", "step", "tokens", "waiting_share", "staleness", "last_merge", "guard", "restarts")
        assert [{k: r[k] for k in keys} for r in again["learners"]] == [
            {k: r[k] for k in keys} for r in final["learners"]
        ]
        assert again["merges"]["quorum_sizes"] == final["merges"]["quorum_sizes"] and again["loss"] == final["loss"]
    print(f"host kill across hosts: {figures}")
