"""A site lost for good at K = M, deployed as site jobs on this machine's loopback (as
:mod:`diloco.decoupled.site_faults`): the syncer service and one torchrun job per site, every merge waiting for every
learner alive. Once each learner has logged ``at_step``, site ``m``'s whole job (its torchrun agent and ranks, one
process group) is SIGKILLed and not restarted by torchrun; the learner lease (:mod:`diloco.decoupled.learner_lease`)
lets the others merge without it. Once they have, the site's printed command is run again (its operator brought the
machine back): it resumes from its checkpoint, joins again and counts again; the run then ends as usual.

What :func:`run_site_lost` measures, from the syncer's ``events.jsonl`` and merge log (wall times of one machine):
the seconds from the kill to the lease's leave and to the first merge without the lost learner, the lease then, a
round (the median seconds between merges before the kill), and the seconds from the site's new job joining to its
first merge with weight > 0."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from statistics import median
from typing import Any

from diloco.decoupled.site_faults import _rows, _tails, _wait, site_command
from diloco.distributed.launch import child_environment
from diloco.errors import ConfigError

#: K = M = 3, one fragment synced every 4 steps, steps padded to 0.1 s, a checkpoint every 8 steps; the lease: auto.
LOST_SETS: dict[str, Any] = {
    "replicas": 3,
    "quorum": 3,
    "global_batch": 6,
    "sync_every": 4,
    "num_fragments": 1,
    "steps": 64,
    "eval_every": 64,
    "checkpoint_every": 8,
    "step_time": 0.1,
    "threads": 1,
}


def run_site_lost(
    *,
    preset: str,
    sets: dict[str, Any],
    out: Path,
    cache_dir: Path,
    lose: int = 2,
    at_step: int = 12,
    timeout_s: float = 300.0,
) -> dict[str, Any]:
    """Run the service and ``sets["replicas"]`` one-rank sites, lose site ``lose`` after ``at_step`` and bring it back
    (module docstring); returns the figures and the service's summary. ``out`` must be new or empty."""
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"out={out} is not empty: give a new folder (nothing in it is overwritten)")
    out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    items = [x for k, v in sets.items() for x in ("--set", f"{k}={v}")]
    common = ["--preset", preset, *items, "--cache-dir", str(cache_dir)]
    logs: list[Any] = []

    def start(args: list[str], log_name: str, extra_env: dict[str, str] | None = None) -> subprocess.Popen:
        log = open(out / log_name, "ab")
        logs.append(log)
        env = child_environment(**(extra_env or {}))
        return subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    service = start(
        [sys.executable, "-m", "diloco", "syncer", *common, "--out", str(out / "syncer"), "--poll", "1"]
        + ["--host", "127.0.0.1", "--advertise", "127.0.0.1", "--port", "0"],
        "syncer.log",
    )
    procs, sites = [service], []
    events, merge_log = out / "syncer" / "syncer" / "events.jsonl", out / "syncer" / "syncer" / "records.jsonl"

    def site(m: int, info: dict[str, Any]) -> subprocess.Popen:
        env, command = site_command(info["learners"][m], ranks=1)
        command += ["--out", str(out / f"site-{m}"), "--cache-dir", str(cache_dir), "--no-progress"]
        return start(command, f"site-{m}.log", env)

    def lease(event: str, after: float) -> dict[str, Any] | None:
        return next((e for e in _rows(events) if e["event"] == event and e["learner"] == lose and e["t"] > after), None)

    try:
        info_path = out / "syncer" / "syncer.json"
        _wait("the syncer's syncer.json", info_path.is_file, timeout=180, procs=procs)
        info = json.loads(info_path.read_text())
        sites = [site(m, info) for m in range(int(sets["replicas"]))]
        procs += sites
        learner_logs = [out / f"site-{m}" / f"learner-{m}.jsonl" for m in range(len(sites))]
        _wait(
            f"every learner at step {at_step}",
            lambda: all(any(r.get("step", 0) >= at_step for r in _rows(log)) for log in learner_logs),
            timeout=timeout_s,
            procs=procs,
        )
        os.killpg(sites[lose].pid, signal.SIGKILL)  # the site's agent and its ranks: lost for good
        killed_at = time.time()
        sites[lose].wait()
        procs.remove(sites[lose])
        left = _wait("the lease's leave", lambda: lease("lease left", killed_at), timeout=timeout_s, procs=procs)

        def without() -> dict[str, Any] | None:
            return next((r for r in _rows(merge_log) if r["at"] > killed_at and lose not in r["learners"]), None)

        first = _wait("a merge without the lost learner", without, timeout=timeout_s, procs=procs)
        again = site(lose, info)  # the machine is back: its command run again, resuming its checkpoint
        procs.append(again)
        joined = _wait("the lease's join", lambda: lease("lease joined", left["t"]), timeout=timeout_s, procs=procs)

        def counted() -> dict[str, Any] | None:
            return next(
                (
                    r
                    for r in _rows(merge_log)
                    if r["at"] > joined["t"] and lose in r["learners"] and r["weights"][r["learners"].index(lose)] > 0
                ),
                None,
            )

        back = _wait("a merge of the rejoined learner", counted, timeout=timeout_s, procs=procs)
        for p in procs:
            p.wait(timeout=timeout_s)
        if any(p.returncode for p in procs):
            raise RuntimeError(f"exit codes {[p.returncode for p in procs]}")
    except (RuntimeError, TimeoutError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"{exc}\n{_tails(out)}") from exc
    finally:
        for p in [service, *sites, *procs]:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for f in logs:
            f.close()
    before = [r["at"] for r in _rows(merge_log) if r["at"] < killed_at]
    summary = json.loads((out / "syncer" / "summary.json").read_text())
    return {
        "kill_to_leave_s": left["t"] - killed_at,
        "kill_to_merge_without_s": first["at"] - killed_at,
        "lease_s": left["lease_s"],
        "round_s": median(b - a for a, b in zip(before, before[1:], strict=False)) if len(before) > 1 else None,
        "join_to_counted_s": back["at"] - joined["t"],
        "merges": summary["merges"],
        "learner_lease": summary["learner_lease"],
        "final_eval_loss": summary["final_eval_loss"],
        "wall_s": time.monotonic() - began,
    }


__all__ = ["LOST_SETS", "run_site_lost"]
