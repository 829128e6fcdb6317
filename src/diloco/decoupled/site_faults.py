"""A Decoupled DiLoCo run deployed as site jobs, under faults: the syncer service and one torchrun job per site,
as a team runs them (the commands ``diloco syncer`` prints), with a rank of one site and the syncer SIGKILLed
mid-run. What the test of site jobs under faults and ``benchmarks/site_faults.py`` run.

::

    result = run_sites(preset="tiny", sets={"replicas": 2, ...}, out=Path("runs/sites"), cache_dir=...,
                       sites=[Site(0, ranks=2, sharding="fsdp"), Site(1, ranks=2)],
                       kill_learner=(1, 20), kill_syncer=True)

Every process is a real one on this machine (loopback): ``python -m diloco syncer`` (a local Ray instance, the
syncer a detached checkpointed actor, its gRPC endpoint on a free port of 127.0.0.1), and per site the command it
printed (``DILOCO_SYNCER_TOKEN=... torchrun --standalone --nproc-per-node R --max-restarts 3 -m diloco train ...
--set learner=m --set syncer=NAME@127.0.0.1:PORT --resume auto``; no Ray at the site) with the site's ranks, its
folder and the shared token cache (gloo ranks; ``sharding="fsdp"``: the site's ranks shard one model). ``kill_learner=(m, step)``: once learner m has logged ``step``, its lead rank
(the pid in its newest ``joined`` row) is SIGKILLed; torchrun's agent restarts the site's job, which resumes
from its newest checkpoint. ``kill_syncer``: once the restarted learner has contributed again (or, without a
learner kill, after a few merges), the syncer actor's process (the pid of its newest ``started`` event) is
SIGKILLed; Ray restarts it from its checkpoint. The run ends when the service does (every learner finished).
``while_up(info)`` (optional): called in a thread of its own once the sites are started, with the service's
syncer.json (the test checks the service's refusals on the live run with it); the syncer is killed only after
it returned, and what it raises is raised.

:func:`analyse` reads what the run left: per learner its step rows, the faults and when each was felt, and the
checks the test makes (the survivor's worst step over its typical step, seconds from the restart to the
restarted learner's first merge with weight > 0, the merge versions, the restarted learner's lr against its
schedule, the final loss of the syncer's parameters).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

from diloco.decoupled.chaos_logs import final_steps, read_learner_log
from diloco.distributed.launch import child_environment
from diloco.errors import ConfigError

#: The run the test and the benchmark deploy: K = 1, two fragments, steps padded to an accelerator's 0.15 s (four
#: learner processes share two cores), a checkpoint every 8 steps, and ride-out through a syncer restart.
DEFAULT_SETS: dict[str, Any] = {
    "replicas": 2,
    "global_batch": 8,
    "quorum": 1,
    "sync_every": 8,
    "num_fragments": 2,
    "overlap_steps": 1,
    "steps": 120,
    "eval_every": 120,
    "checkpoint_every": 8,
    "step_time": 0.15,
    "ride_out_steps": 16,
    "threads": 1,
}


@dataclass(frozen=True)
class Site:
    """One site's job: learner ``learner`` on ``ranks`` processes (``sharding``: replicate or fsdp)."""

    learner: int
    ranks: int = 1
    sharding: str = "replicate"


#: Whole rows of a JSONL file another process appends to (a line cut mid-write is skipped).
_rows = read_learner_log


def _learner_log(out: Path, m: int) -> Path:
    return out / f"site-{m}" / f"learner-{m}.jsonl"


def _wait(what: str, check, *, timeout: float, procs: list[subprocess.Popen]) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = check()
        if got:
            return got
        for p in procs:
            if p.poll() not in (None, 0):
                raise RuntimeError(f"a process exited with {p.returncode} while waiting for {what}: {p.args}")
        time.sleep(0.1)
    raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")


class _Beside(threading.Thread):
    """``fn(arg)`` in a thread; :meth:`result` joins it and raises what it raised."""

    def __init__(self, fn: Callable[[Any], None], arg: Any) -> None:
        super().__init__(daemon=True)
        self.fn, self.arg, self.error = fn, arg, None

    def run(self) -> None:
        try:
            self.fn(self.arg)
        except BaseException as exc:  # raised again in the caller's thread
            self.error = exc

    def result(self) -> None:
        self.join()
        if self.error is not None:
            raise self.error


def _tails(out: Path) -> str:
    """The last lines of every process's log, for an error message."""
    return "\n".join(f"--- {p.name}\n" + p.read_text(errors="replace")[-1500:] for p in sorted(out.glob("*.log")))


def site_command(line: str, *, ranks: int) -> tuple[dict[str, str], list[str]]:
    """A learner command ``diloco syncer`` printed, to run here: its environment (the token) and its words, with
    ``torchrun`` this Python's (``python -m torch.distributed.run``) and ``--nproc-per-node ranks``."""
    words = shlex.split(line)
    env = {}
    while words and "=" in words[0] and not words[0].startswith("-"):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    assert words[0] == "torchrun", line
    words[words.index("--nproc-per-node") + 1] = str(ranks)
    return env, [sys.executable, "-m", "torch.distributed.run", *words[1:]]


def run_sites(
    *,
    preset: str,
    sets: dict[str, Any],
    out: Path,
    cache_dir: Path,
    sites: list[Site],
    kill_learner: tuple[int, int] | None = None,
    kill_syncer: bool = False,
    while_up: Callable[[dict[str, Any]], None] | None = None,
    timeout_s: float = 600.0,
) -> dict[str, Any]:
    """Run the service and the sites (module docstring); returns :func:`analyse`'s result. ``out`` must be new."""
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"out={out} is not empty: give a new folder (nothing in it is overwritten)")
    out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    python = sys.executable
    items = [x for k, v in sets.items() for x in ("--set", f"{k}={v}")]
    common = ["--preset", preset, *items, "--cache-dir", str(cache_dir)]
    logs = []

    def start(args: list[str], log_name: str, extra_env: dict[str, str] | None = None) -> subprocess.Popen:
        log = open(out / log_name, "wb")
        logs.append(log)
        return subprocess.Popen(args, env=child_environment(**(extra_env or {})), stdout=log, stderr=subprocess.STDOUT)

    service = start(
        [python, "-m", "diloco", "syncer", *common, "--out", str(out / "syncer"), "--poll", "1"]
        + ["--host", "127.0.0.1", "--advertise", "127.0.0.1", "--port", "0"],
        "syncer.log",
    )
    procs = [service]
    faults: dict[str, Any] = {}
    beside = None
    try:
        info_path = out / "syncer" / "syncer.json"
        _wait("the syncer's syncer.json", info_path.is_file, timeout=180, procs=procs)
        info = json.loads(info_path.read_text())
        for site in sites:  # the command the service printed for this site, as it is, on this site's ranks
            env, command = site_command(info["learners"][site.learner], ranks=site.ranks)
            command += ["--set", f"ranks_per_worker={site.ranks}", "--set", f"worker_sharding={site.sharding}"]
            command += ["--out", str(out / f"site-{site.learner}"), "--cache-dir", str(cache_dir), "--no-progress"]
            procs.append(start(command, f"site-{site.learner}.log", env))
        if while_up is not None:
            beside = _Beside(while_up, info)
            beside.start()
        if kill_learner is not None:
            m, at_step = kill_learner
            log = _learner_log(out, m)
            _wait(
                f"learner {m} at step {at_step}",
                lambda: any(r.get("step", 0) >= at_step for r in _rows(log)),
                timeout=timeout_s,
                procs=procs,
            )
            joined = [r for r in _rows(log) if r.get("event") == "joined"][-1]
            faults["learner_kill"] = {"learner": m, "pid": joined["pid"], "at": time.time()}
            os.kill(int(joined["pid"]), signal.SIGKILL)
            restart = _wait(
                f"learner {m}'s restart",
                lambda: next((r for r in _rows(log) if r.get("event") == "joined" and r["pid"] != joined["pid"]), None),
                timeout=timeout_s,
                procs=procs,
            )
            faults["learner_kill"] |= {"restarted_at": restart["t"], "start_step": restart["start_step"]}
            records = out / "syncer" / "syncer" / "records.jsonl"

            def contributed() -> bool:
                return any(
                    r["at"] > restart["t"] and m in r["learners"] and r["weights"][r["learners"].index(m)] > 0
                    for r in _rows(records)
                )

            _wait(f"learner {m}'s first merge after its restart", contributed, timeout=timeout_s, procs=procs)
        if beside is not None:
            beside.result()
        if kill_syncer:
            events = out / "syncer" / "syncer" / "events.jsonl"
            _wait(
                "a few merges",
                lambda: sum(r["event"] == "merged" for r in _rows(events)) >= 4,
                timeout=timeout_s,
                procs=procs,
            )
            started = [r for r in _rows(events) if r["event"] == "started"][-1]
            faults["syncer_kill"] = {"pid": started["pid"], "at": time.time()}
            os.kill(int(started["pid"]), signal.SIGKILL)
            back = _wait(
                "the syncer's restart",
                lambda: next(
                    (r for r in _rows(events) if r["event"] == "started" and r["pid"] != started["pid"]), None
                ),
                timeout=timeout_s,
                procs=procs,
            )
            faults["syncer_kill"] |= {"back_at": back["t"], "restored_merges": back.get("restored_merges")}
        end = time.monotonic() + timeout_s
        for p in procs:
            p.wait(timeout=max(1.0, end - time.monotonic()))
        codes = [p.returncode for p in procs]
        if any(codes):
            raise RuntimeError(f"exit codes {codes}")
    except (RuntimeError, TimeoutError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"{exc}\n{_tails(out)}") from exc
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for f in logs:
            f.close()
    return {**analyse(out, sites=sites, faults=faults), "wall_s": time.monotonic() - began}


def analyse(out: Path, *, sites: list[Site], faults: dict[str, Any]) -> dict[str, Any]:
    """What the run left, checked (module docstring)."""
    from diloco.train.config import TrainConfig
    from diloco.train.lr import lr_at

    summary = json.loads((out / "syncer" / "summary.json").read_text())
    merges = _rows(out / "syncer" / "merges.jsonl")
    result: dict[str, Any] = {"faults": faults, "final_eval_loss": summary["final_eval_loss"]}
    result["merges"] = len(merges)
    result["versions_contiguous"] = all(
        [r["version"] for r in merges if r["fragment"] == p]
        == list(range(1, 1 + sum(r["fragment"] == p for r in merges)))
        for p in {r["fragment"] for r in merges}
    )
    learners: dict[int, Any] = {}
    for site in sites:
        m = site.learner
        rows = _rows(_learner_log(out, m))
        steps, superseded = final_steps(rows)
        dts = [r["dt"] for r in steps]
        typical = median(dts) if dts else 0.0
        site_summary = json.loads((out / f"site-{m}" / "summary.json").read_text())
        learners[m] = {
            "steps": len(steps),
            "superseded": superseded,
            "typical_step_s": typical,
            "wait_share": (site_summary.get("wait_share") or [None])[0],
        }
        for name, fault in faults.items():
            if name == "learner_kill" and fault["learner"] == m:
                continue
            after = [r["dt"] for r in steps if r["t"] > fault["at"]]
            learners[m][f"worst_step_after_{name}"] = max(after) / typical if after and typical else None
    kill = faults.get("learner_kill")
    if kill is not None:
        m = kill["learner"]
        first = min(
            (
                r["at"]
                for r in merges
                if r["at"] > kill["restarted_at"] and m in r["learners"] and r["weights"][r["learners"].index(m)] > 0
            ),
            default=None,
        )
        kill["first_merge_s"] = None if first is None else first - kill["restarted_at"]
        cfg = TrainConfig.from_dict(json.loads((out / f"site-{m}" / "config.json").read_text()))
        rows = [r for r in _rows(out / f"site-{m}" / "metrics.jsonl") if "lr" in r]
        resumed = [r for r in rows if r["step"] > kill["start_step"]][:5]
        kill["lr_matches_schedule"] = bool(resumed) and all(
            abs(r["lr"] - lr_at(r["step"], cfg)) <= 1e-12 * max(1.0, abs(r["lr"])) for r in resumed
        )
    result["learners"] = learners
    return result


__all__ = ["DEFAULT_SETS", "Site", "analyse", "run_sites"]
