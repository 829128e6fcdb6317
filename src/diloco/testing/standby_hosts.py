"""An active syncer's host lost mid-run, its standby taking over, on emulated hosts (:mod:`diloco.testing.hosts`,
root only): what tests/hosts/test_deploy_standby.py asserts and benchmarks/site_faults.py times.

Host 0 runs ``diloco syncer ... --standby HOST1:7171`` (the active), host 1 ``diloco syncer --standby-of
NAME@HOST0:7171`` (with the token the active wrote in its syncer.json), hosts 2.. each a site's printed command
(``syncer=NAME@HOST0:7171,HOST1:7171``). Once every learner passed ``kill_at_step``, host 0 is killed whole (every
process of it, Ray included, at once). :func:`run_standby_deploy` returns what the run left: the merges the standby
ended with (and whether their versions run without a gap), the merges the active made, the ones the standby held
when it took over and the ones it had not (made by the active but told to no learner), each learner's final
trajectory, its worst step after the kill (its last step apart: the run's end waits for the last replies) over its
typical step, and the seconds from the kill to the standby's
takeover and to its first merge.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from statistics import median
from typing import Any

from diloco.decoupled.chaos_logs import final_steps, read_learner_log
from diloco.testing.deploy_env import contiguous, host_env
from diloco.testing.hosts import Hosts
from diloco.testing.waiting import wait

PORT = 7171
#: The fields of a learner's step row kept for its worst and its last step (:func:`~diloco.decoupled.chaos_logs.step_row`).
WORST_KEYS = ("step", "dt", "compute_s", "cpu_s", "wait_s", "blocked_s", "other_s")
ACTIVE_OUT, STANDBY_OUT = "/tmp/svc", "/tmp/standby"
#: The run tests/hosts/test_deploy_standby.py and the benchmarks deploy (with a ``quorum``): M = 3 one-rank sites,
#: ``tiny``, 64 steps padded to 0.4 s (an accelerator's step), ride-out for 32 of them (12.8 s: more than the
#: takeover and the standby's first merge take), two fragments.
STANDBY_SETS: dict[str, Any] = {
    "replicas": 3,
    "global_batch": 12,
    "sync_every": 8,
    "num_fragments": 2,
    "overlap_steps": 1,
    "steps": 64,
    "eval_every": 64,
    "checkpoint_every": 8,
    "step_time": 0.4,
    "ride_out_steps": 32,
    "threads": 1,
}


#: What Ray says when its own startup timed out on an overloaded machine (its GCS, its node info): the process is
#: started again, once, as tests/hosts/_deploy.py does for the service.
RAY_STARTUP = ("timed out during startup", "gcs_server_port", "Failed to get node info", "Timed out waiting for file")


def _started(host, argv, env, name: str, what, *, procs=()) -> Any:
    """``argv`` run on ``host`` until ``what(proc)`` is truthy; started again once where Ray's startup failed."""
    proc = host.run(argv, env=env, name=name)
    try:
        return proc, wait(name, lambda: what(proc), timeout=240, procs=[*procs, proc])
    except AssertionError as exc:
        if not any(s in str(exc) for s in RAY_STARTUP):
            raise
    proc = host.run(argv, env=env, name=f"{name}-again")
    return proc, wait(name, lambda: what(proc), timeout=240, procs=[*procs, proc])


def _printed(proc) -> list[str] | None:
    text = proc.stdout_path.read_text(errors="replace").splitlines()
    at = next((i for i, line in enumerate(text) if line.startswith("learner commands, one per site")), None)
    if at is None:
        return None
    got = [line.strip() for line in text[at + 1 :] if line.startswith("  ")]
    return got if got and "--resume auto" in got[-1] else None


def _json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _parts(row: dict[str, Any] | None) -> dict[str, Any] | None:
    """A learner step row's :data:`WORST_KEYS` (None for no row)."""
    return {k: row.get(k) for k in WORST_KEYS} if row else None


def _site_out(line: str) -> str:
    import shlex

    words = shlex.split(line)
    return str(Path("/tmp") / words[words.index("--out") + 1])


def run_standby_deploy(
    *,
    token_cache: Path,
    sets: dict[str, Any],
    kill_at_step: int | None,
    takeover_s: float = 5.0,
    sites: int | None = None,
    after_takeover: Callable[[dict[str, Any]], Any] | None = None,
) -> dict[str, Any]:
    """The scenario of the module docstring; returns its figures (raises AssertionError naming what did not come).
    ``kill_at_step`` None: no kill (the same deployment without the fault; its final loss, merges and wall time
    only). ``sites``: default ``sets["replicas"]`` (a host per site). ``after_takeover``: called once the standby took
    over, with the run as it stands (``hosts``, the printed ``lines``, the ``jobs``, ``standby``, ``spare``: one more
    host that runs nothing, and ``env()``); what it returns is the result's ``after_takeover``."""
    sites = int(sets.get("replicas", 2)) if sites is None else sites
    args = [x for k, v in sets.items() for x in ("--set", f"{k}={v}")]
    spares = 1 if after_takeover is not None else 0
    with Hosts(2 + sites + spares) as hosts:
        h0, h1, site_hosts = hosts[0], hosts[1], hosts[2 : 2 + sites]
        for h in hosts:
            h.tmp.mkdir(parents=True, exist_ok=True)
            shutil.copytree(token_cache, h.path("/tmp/cache"), dirs_exist_ok=True)
        argv = [sys.executable, "-m", "diloco", "syncer", "--preset", "tiny", *args, "--poll", "1"]
        argv += ["--host", "0.0.0.0", "--advertise", h0.address, "--port", str(PORT), "--out", ACTIVE_OUT]
        active, lines = _started(h0, [*argv, "--standby", f"{h1.address}:{PORT}"], host_env(), "active", _printed)
        info = json.loads(h0.path(f"{ACTIVE_OUT}/syncer.json").read_text())
        assert f"syncer={info['name']}@{h0.address}:{PORT},{h1.address}:{PORT}" in lines[0], lines[0]
        # the standby once the active's Ray is up (two Ray instances starting at once on 2 loaded cores: one timed
        # out waiting for its GCS), and the sites once the standby follows
        argv = [sys.executable, "-m", "diloco", "syncer", "--standby-of", f"{info['name']}@{h0.address}:{PORT}"]
        argv += ["--out", STANDBY_OUT, "--port", str(PORT), "--host", "0.0.0.0", "--advertise", h1.address]
        argv += ["--poll", "1", "--takeover-after", str(takeover_s)]
        standby, _ = _started(
            h1,
            argv,
            host_env(info["token"]),
            "standby",
            lambda p: "diloco syncer: standby of" in p.stdout_path.read_text(errors="replace"),
            procs=[active],
        )
        began = time.time()
        jobs = [
            h.run(["sh", "-c", f"cd /tmp && {lines[m]}"], env=host_env(), name=f"site-{m}")
            for m, h in enumerate(site_hosts)
        ]
        logs = [h.path(_site_out(lines[m])) / f"learner-{m}.jsonl" for m, h in enumerate(site_hosts)]
        procs = [active, standby, *jobs]

        def reached(step: int) -> bool:
            return all(any(r.get("step", 0) >= step for r in read_learner_log(log)) for log in logs)

        if kill_at_step is None:  # the same run without the fault: the active's results
            for job in jobs:
                assert job.wait(timeout=300) == 0, job.stderr_path.read_text(errors="replace")[-3000:]
            assert active.wait(timeout=120) == 0, active.stderr_path.read_text(errors="replace")[-3000:]
            summary = json.loads(h0.path(f"{ACTIVE_OUT}/summary.json").read_text())
            ends = []  # each learner's typical and last step (its finish: the wait for the last replies)
            for log in logs:
                steps = final_steps(read_learner_log(log))[0]
                ends.append({"typical_step_s": median(r["dt"] for r in steps), "last_step": _parts(steps[-1])})
            return {
                "finished": "every learner finished" in active.stdout_path.read_text(),
                "epoch": summary.get("epoch"),
                "final_eval_loss": summary.get("final_eval_loss"),
                "merges": read_learner_log(h0.path(f"{ACTIVE_OUT}/merges.jsonl")),
                "learners": ends,
                "wall_s": time.time() - began,
            }
        wait(f"every learner at step {kill_at_step}", lambda: reached(kill_at_step), timeout=240, procs=procs)
        h0.kill()
        killed_at = time.time()
        active_rows = read_learner_log(h0.path(f"{ACTIVE_OUT}/syncer/records.jsonl"))
        procs = [standby, *jobs]
        wait(
            "the standby's takeover",
            lambda: "taking over as epoch" in standby.stdout_path.read_text(),
            timeout=120,
            procs=procs,
        )
        took_over_at = time.time()
        hooked = None
        if after_takeover is not None:
            run = {
                "hosts": hosts,
                "lines": lines,
                "jobs": jobs,
                "standby": standby,
                "spare": hosts[-1],
                "env": host_env,
            }
            hooked = after_takeover(run)
        for job in jobs:
            assert job.wait(timeout=300) == 0, job.stderr_path.read_text(errors="replace")[-3000:]
        assert standby.wait(timeout=120) == 0, standby.stderr_path.read_text(errors="replace")[-3000:]
        out = h1.path(STANDBY_OUT)
        summary = json.loads((out / "summary.json").read_text())
        merges = read_learner_log(out / "merges.jsonl")
        events = read_learner_log(out / "syncer" / "events.jsonl")
        started = next(e for e in events if e.get("event") == "started")
        restored = started["restored_merges"]
        after = [r["at"] for r in merges if r["at"] > killed_at]
        learners = []
        for log in logs:
            steps, superseded = final_steps(read_learner_log(log))
            dts = [r["dt"] for r in steps]
            typical = median(dts) if dts else 0.0
            # the last step is left out: the learner's finish waits there for its last replies, and at K >= 2 for
            # the other learners' last reports (a wait of every run's end, fault or not; "last_step" has it)
            during = [r for r in steps[:-1] if r["t"] > killed_at]
            worst = max(during, key=lambda r: r["dt"], default=None)
            worst_dt = worst["dt"] if worst else 0.0
            learners.append(
                {
                    "steps": [r["step"] for r in steps],
                    "superseded": superseded,
                    "typical_step_s": typical,
                    "worst_over_typical_after_kill": worst_dt / typical if typical else None,
                    # where the worst step's seconds went (compute and its CPU seconds, waiting, blocked, other)
                    "worst_step": _parts(worst),
                    "last_step": _parts(steps[-1] if steps else None),
                }
            )
        return {
            "finished": "every learner finished" in standby.stdout_path.read_text(),
            "epoch": summary.get("epoch"),
            "final_eval_loss": summary.get("final_eval_loss"),
            "merges": merges,
            "active_rows": active_rows,
            "restored_merges": restored,
            "lost_merges": len(active_rows) - (restored or 0),  # made by the active, told to no learner
            "learners": learners,
            "takeover_s": took_over_at - killed_at,
            "actor_started_after_kill_s": started["t"] - killed_at,
            "first_merge_after_kill_s": (after[0] - killed_at) if after else None,
            "replication": summary.get("replication"),
            "standby": summary.get("standby"),
            "wall_s": time.time() - began,
            "after_takeover": hooked,
        }


__all__ = ["ACTIVE_OUT", "PORT", "STANDBY_OUT", "STANDBY_SETS", "contiguous", "run_standby_deploy"]
