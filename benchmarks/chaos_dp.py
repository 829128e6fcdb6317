"""Data-parallel under chaos.py's fault schedule: ``diloco train --method dp --elastic`` under TorchElastic.

One torchrun agent (``--standalone --nproc-per-node M --max-restarts 5``) runs M worker processes, one per
worker, each ``benchmarks/_padded_train.py`` (the CLI with the inner step padded to the step time and logged
per step). The clock starts when every worker has begun its first step (as chaos.py's Ray learners start
together once built). ``kill``: worker 1's process is SIGKILLed at 10 s and 25 s; the agent sees it fail,
stops the others and restarts all M from the newest committed checkpoint (``checkpoint_every``; the trainer's
default for data-parallel is every 100 steps); the killed worker's new process is held down 3 s from the
kill before it imports anything (a machine's reboot, as for the Ray learners). Everything is in one
machine's process tree: a node's death on several machines adds the rendezvous noticing it (docs/guides/
elastic.md: 14-15 s with 2 s x 5 keep-alives).

Figures (:func:`diloco.decoupled.chaos_logs.summarize_restarts`): wall from the start to the last step's end,
goodput (the compute of the final trajectory: a step trained again after a restart counts once), per kill
the survivors' longest step (the time between their step ends, so the restart is one step) ÷ their typical
step, the share of steps kept in 10 s, the kill to the killed worker's first step starting (restart_s) and
from there to that step's end (rejoin_s), steps redone and seconds until the run trains past where it was.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from diloco.decoupled.chaos_logs import read_learner_log, summarize_restarts

HERE = Path(__file__).resolve().parent
KILLS = ((10.0, 1), (25.0, 1))
DOWNTIME_S = 3.0


def _config(args: Any, checkpoint_every: int | None) -> list[str]:
    """chaos.py's dp_row settings, as ``--set`` overrides of the tiny preset (dp)."""
    sets = {
        "size": args.size,
        "seq_len": args.seq_len,
        "global_batch": args.global_batch,
        "inner_lr": args.inner_lr,
        "steps": args.steps,
        "tokens": 0,
        "warmup_steps": args.steps // 10,
        "min_lr_ratio": 0.1,
        "eval_every": args.steps,
        "eval_batches": 16,
        "threads": 1,
    }
    if checkpoint_every is not None:
        sets["checkpoint_every"] = checkpoint_every
    return [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]


def _rows(log_dir: Path, M: int) -> list[dict[str, Any]]:
    return [r for m in range(M) for r in read_learner_log(log_dir / f"worker-{m}.jsonl")]


def _kill(log_dir: Path, worker: int, deadline: float) -> int | None:
    """SIGKILL the worker's live process (if it is being restarted, the new one as soon as it is there)."""
    while time.time() < deadline:
        try:
            pid = int((log_dir / f"worker-{worker}.pid").read_text())
            os.kill(pid, signal.SIGKILL)
            return pid
        except (FileNotFoundError, ValueError, ProcessLookupError):
            time.sleep(0.02)
    return None


def dp_run(
    *, M: int, fault: str, args: Any, work: Path, cache: Path, checkpoint_every: int | None = None, method: str = "dp"
) -> dict[str, Any]:
    """One data-parallel run of M workers under ``fault`` (``kill``, ``straggler``: worker M-1's steps padded
    to 3x the step time, or ``none``); chaos.py's row."""
    out = work / f"{method}-m{M}-{fault}"
    log_dir, run_dir = out / "logs", out / "run"
    log_dir.mkdir(parents=True)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "GLOO_SOCKET_IFNAME")
    }
    # each round's store hosted by its rank 0 worker: with the agent's shared store a restarted worker read the
    # killed round's gloo addresses (a held-down peer's) and every restart failed
    env.update(
        OMP_NUM_THREADS="1",
        TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
        PYTHONPATH=os.pathsep.join([str(HERE.parent / "src"), env.get("PYTHONPATH", "")]),
    )
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(M),
        "--max-restarts",
        "5",
        "--monitor-interval",
        "0.1",
        "--local-addr",
        "127.0.0.1",
        str(HERE / "_padded_train.py"),
        "--log-dir",
        str(log_dir),
        "--step-time",
        str(args.step_time),
        *(("--slow-rank", str(M - 1), "--slowdown", "3") if fault == "straggler" else ()),
        "--",
        "train",
        "--preset",
        "tiny",
        "--method",
        "dp",
        "--elastic",
        "--no-progress",
        "--out",
        str(run_dir),
        "--cache-dir",
        str(cache),
        "--timeout",
        "30",
        *_config(args, checkpoint_every),
    ]
    faults: list[dict[str, Any]] = []
    with open(out / "torchrun.log", "wb") as agent_log:
        agent = subprocess.Popen(cmd, env=env, stdout=agent_log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 300
        while True:  # the clock starts when all M have begun their first step
            joined = [r["t"] for r in _rows(log_dir, M) if r.get("event") == "joined"]
            if len(joined) >= M:
                started = max(joined)
                break
            if agent.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"the workers did not start; see {out / 'torchrun.log'}")
            time.sleep(0.05)
        events = list(KILLS if fault == "kill" else ())
        while agent.poll() is None:
            if events and time.time() >= started + events[0][0]:
                _, worker = events.pop(0)
                at = time.time()
                (log_dir / f"hold-{worker}").write_text(repr(at + DOWNTIME_S))
                pid = _kill(log_dir, worker, at + 30)
                faults.append({"at": at, "target": "learner", "index": worker, "pid": pid})
            if time.time() > started + args.steps * args.step_time * 10 + 300:
                raise TimeoutError(f"data-parallel run still going; see {out / 'torchrun.log'}")
            time.sleep(0.01)
        if agent.returncode != 0:
            raise RuntimeError(f"torchrun exited with {agent.returncode}; see {out / 'torchrun.log'}")
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGTERM)
            agent.wait(timeout=60)
    rows = _rows(log_dir, M)
    wall = max(r["t"] for r in rows if "step" in r) - started
    summary = summarize_restarts(rows, faults, num_workers=M, wall_s=wall)
    summary_file = json.loads((run_dir / "summary.json").read_text())
    for k, f in zip(summary["learner_kills"], faults, strict=True):  # kill -> the agent's new process for it
        later = [
            r["t"] for r in rows if r.get("event") == "spawned" and r["learner"] == f["index"] and r["t"] > f["at"]
        ]
        k["spawned_s"] = min(later) - f["at"] if later else None
    restarts = max(r["incarnation"] for r in rows)
    return {
        "method": method,
        "M": M,
        "fault": fault,
        "eval_loss": summary_file["final_eval_loss"],
        "wall_s": wall,
        "goodput": summary["goodput"],
        "lost_steps": summary["lost_steps"],
        "merges": None,
        "steps": {str(m): sum(1 for r in rows if r["learner"] == m and "step" in r) for m in range(M)},
        "kills": summary["learner_kills"],
        "restarts": restarts,
        "checkpoint_every": checkpoint_every or "auto",
        "launcher": "torchrun --standalone, one agent, --max-restarts 5",
    }
