"""A ``diloco syncer`` monitor SIGKILLed mid-run and started again with the same command, on this machine's loopback:
what the test of a monitor restart and ``benchmarks/monitor_restart.py`` run.

::

    got = run_monitor_restart(preset="tiny", sets={"replicas": 2, ...}, out=Path("runs/monitor"), cache_dir=...)

Every process is a real one: ``python -m diloco syncer`` (a local Ray instance, the syncer a detached checkpointed
actor, its gRPC gateway on a free port of 127.0.0.1, the status page on 127.0.0.1), and per learner the training run
of the command it printed (``python -m diloco train ... --set learner=m --set syncer=NAME@127.0.0.1:PORT --resume
auto`` with its token; one process, torchrun's agent left out: a site's rank, over gRPC, no Ray). Once the syncer
has merged ``kill_after`` times the monitor's process is SIGKILLed (its Ray instance, and the actor, end with it:
:mod:`diloco.decoupled.monitor_ledger`), and the same command is run again. The run ends when the second monitor
does (every learner finished). Returned: the files' paths, the summary, the merges, and what the learners felt
(:func:`analyse`).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from statistics import median
from typing import Any

from diloco.decoupled.chaos_logs import final_steps, read_learner_log
from diloco.decoupled.site_faults import site_command
from diloco.distributed.launch import child_environment
from diloco.errors import ConfigError


def _wait(what: str, check, procs: list[subprocess.Popen], timeout: float) -> Any:
    end = time.monotonic() + timeout
    while not (got := check()):
        for p in procs:
            if p.poll() not in (None, 0):
                raise RuntimeError(f"{p.args[:4]} exited {p.returncode} while waiting for {what}")
        if time.monotonic() > end:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.05)
    return got


def run_monitor_restart(
    *,
    preset: str,
    sets: dict[str, Any],
    out: Path,
    cache_dir: Path,
    kill_after: int = 2,
    timeout_s: float = 300.0,
) -> dict[str, Any]:
    """The run (module docstring) in the new folder ``out``: the service's folder ``out/svc``, the learners'
    ``out/site-<m>``, each process's output ``out/<name>.log``."""
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"out={out} is not empty: give a new folder (nothing in it is overwritten)")
    out.mkdir(parents=True, exist_ok=True)
    svc = out / "svc"
    argv = [sys.executable, "-m", "diloco", "syncer", "--preset", preset, "--cache-dir", str(cache_dir)]
    argv += [x for k, v in sets.items() for x in ("--set", f"{k}={v}")]
    argv += ["--out", str(svc), "--poll", "0.5", "--host", "127.0.0.1", "--advertise", "127.0.0.1", "--port", "0"]
    argv += ["--status-host", "127.0.0.1"]
    logs, procs = [], []

    def start(args: list[str], name: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        log = open(out / f"{name}.log", "wb")
        logs.append(log)
        proc = subprocess.Popen(args, env=child_environment(**(env or {})), stdout=log, stderr=subprocess.STDOUT)
        procs.append(proc)
        return proc

    began = time.monotonic()
    try:
        service = start(argv, "service")
        _wait("the service's syncer.json", (svc / "syncer.json").is_file, [service], timeout_s)
        info = json.loads((svc / "syncer.json").read_text())
        sites = []
        for m in range(len(info["learners"])):
            env, command = site_command(info["learners"][m], ranks=1)
            command = [sys.executable, *command[command.index("-m", 3) :]]  # the training run, without its agent
            command += ["--out", str(out / f"site-{m}"), "--cache-dir", str(cache_dir), "--no-progress"]
            sites.append(start(command, f"site-{m}", env))
        records = svc / "syncer" / "records.jsonl"
        _wait(f"{kill_after} merges", lambda: len(read_learner_log(records)) >= kill_after, procs, timeout_s)
        os.kill(service.pid, signal.SIGKILL)
        killed_at = time.time()
        service.wait()
        merges_at_kill = len(read_learner_log(records))
        again = start(argv, "service-again")  # the same command
        end = time.monotonic() + timeout_s
        for p in [*sites, again]:
            p.wait(timeout=max(1.0, end - time.monotonic()))
        codes = [p.returncode for p in [*sites, again]]
        if any(codes):
            tails = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}" for p in out.glob("*.log"))
            raise RuntimeError(f"exit codes {codes} (sites, then the monitor started again)\n{tails}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for log in logs:
            log.close()
    return {
        **analyse(out, killed_at=killed_at, merges_at_kill=merges_at_kill),
        "info": info,
        "wall_s": time.monotonic() - began,
    }


def analyse(out: Path, *, killed_at: float, merges_at_kill: int) -> dict[str, Any]:
    """What the run left: the summary and merges, the merges the syncer was restored with (from the second
    monitor's output) against those on disk at the kill, the seconds from the kill to the restored syncer's start
    and to its first merge, and per learner its steps (each once?) and its worst step after the kill over its
    typical step."""
    svc = out / "svc"
    text = (out / "service-again.log").read_text(errors="replace")
    restored = re.search(r"resumed from (\d+) merges", text)
    merges = read_learner_log(svc / "merges.jsonl")
    events = read_learner_log(svc / "syncer" / "events.jsonl")
    started = [r["t"] for r in events if r["event"] == "started" and r["t"] > killed_at]
    after = [r["at"] for r in merges if r["at"] > killed_at]
    learners = {}
    for m in range(len(json.loads((svc / "syncer.json").read_text())["learners"])):
        steps, superseded = final_steps(read_learner_log(out / f"site-{m}" / f"learner-{m}.jsonl"))
        typical = median(r["dt"] for r in steps) if steps else 0.0
        later = [r["dt"] for r in steps if r["t"] > killed_at]
        learners[m] = {
            "steps": [r["step"] for r in steps],
            "superseded": superseded,
            "typical_step_s": typical,
            "worst_step_after_kill": max(later) / typical if later and typical else None,
        }
    return {
        "summary": json.loads((svc / "summary.json").read_text()),
        "merges": merges,
        "merges_at_kill": merges_at_kill,
        "restored_merges": None if restored is None else int(restored.group(1)),
        "resumed_text": text,
        "syncer_back_s": started[0] - killed_at if started else None,
        "first_merge_after_kill_s": after[0] - killed_at if after else None,
        "learners": learners,
    }


__all__ = ["analyse", "run_monitor_restart"]
