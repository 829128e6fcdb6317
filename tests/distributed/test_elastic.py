"""Elastic restarts under TorchElastic: two torchrun agents on loopback, one node killed, one joining.

Each agent is ``torchrun --nnodes 1:2 --nproc-per-node 1 --max-restarts 3`` with the same
``--rdzv-id`` and a c10d rendezvous on 127.0.0.1, training with ``diloco train --elastic``:

1. agents A (hosts the rendezvous store) and B train together (M = 2);
2. B's node dies (SIGKILL to its agent and its worker): A's worker stops on the dead peer, A's
   agent restarts it, the rendezvous completes with A alone and training resumes by itself
   from the newest checkpoint with M = 1;
3. agent C joins: A's agent restarts its worker, A and C train with M = 2 to the end.

The test measures what docs/guides/elastic.md reports: inner steps redone per failure and seconds
from the kill to the next training step.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(420),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds torchrun's workers through /proc"),
]

CHECKPOINT_EVERY = 8
# Rendezvous: a dead node is noticed by its missing keep-alives (1 s x 4: a test setting, shorter than the
# guide's 2 s x 5); once the minimum is reached the rendezvous waits 1 s for more nodes.
RDZV_CONF = "join_timeout=180,last_call_timeout=1,close_timeout=30,keep_alive_interval=1,keep_alive_max_attempt=4"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _agent(out: Path, cache: Path, log: Path, *, port: int, host: bool, steps: int) -> subprocess.Popen:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "GLOO_SOCKET_IFNAME")
    }
    env["OMP_NUM_THREADS"] = "1"
    # torch 2.13's shared rendezvous store skips publishing the new round's MASTER_ADDR when the same
    # node stays rank 0, so a joining node waits for it until it times out: let rank 0's worker host
    # the workers' store, on the loopback address (--local-addr).
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        "1:2",
        "--nproc-per-node",
        "1",
        "--max-restarts",
        "3",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        "elastic-test",
        "--local-addr",
        "127.0.0.1",
        "--rdzv-conf",
        f"is_host={int(host)},{RDZV_CONF}",
        "-m",
        "diloco",
        "train",
        "--preset",
        "tiny",
        "--method",
        "streaming",
        "--elastic",
        "--no-progress",
        "--out",
        str(out),
        "--cache-dir",
        str(cache),
        "--timeout",
        "30",
        "--set",
        "threads=1",
        "--set",
        f"steps={steps}",
        "--set",
        f"checkpoint_every={CHECKPOINT_EVERY}",
    ]
    with open(log, "wb") as f:
        return subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


def _children(ppid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == ppid:
                kids.append(int(entry))
    return kids


def _kill_node(agent: subprocess.Popen) -> None:
    """A node dies: SIGKILL its agent and its worker (torchrun starts workers in their own sessions)."""
    workers = _children(agent.pid)
    agent.kill()
    for pid in workers:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    agent.wait()


class _Watch:
    """Polls the run directory: committed checkpoints and the metrics rows (with when they were seen)."""

    def __init__(self, out: Path, agents: dict[str, tuple[subprocess.Popen, Path]]) -> None:
        self.out, self.agents = out, agents
        self.max_step: dict[int, int] = {}  # inode of metrics.jsonl -> the highest step seen in it

    def latest(self) -> dict | None:
        try:
            return json.loads((self.out / "checkpoints" / "latest.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def rows(self) -> tuple[int | None, list[dict]]:
        """(inode, step rows) of metrics.jsonl; a resume replaces the file (a new inode)."""
        path = self.out / "metrics.jsonl"
        try:
            with open(path, encoding="utf-8") as f:
                inode, text = os.fstat(f.fileno()).st_ino, f.read()
        except FileNotFoundError:
            return None, []
        rows = []
        for line in text.splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # a line being written
                break
            if "loss" in row:
                rows.append(row)
        if rows:
            self.max_step[inode] = max(self.max_step.get(inode, 0), rows[-1]["step"])
        return inode, rows

    def until(self, what: str, check, timeout: float):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = check()
            if got:
                return got
            for name, (proc, log) in self.agents.items():
                if proc.poll() not in (None, 0):
                    raise AssertionError(
                        f"agent {name} exited with {proc.returncode} while waiting for {what}:\n"
                        f"{log.read_text()[-4000:]}"
                    )
            time.sleep(0.02)
        logs = "\n".join(f"--- {n}:\n{log.read_text()[-3000:]}" for n, (_, log) in self.agents.items())
        raise AssertionError(f"no {what} after {timeout}s\n{logs}")


def _resumed(watch: _Watch, log: Path, inode: int | None, *, old: int, new: int) -> tuple[int, float]:
    """Wait for the restarted run's first training step: (the step it resumed from, when that step was seen)."""
    pattern = re.compile(rf"elastic restart: resuming from step (\d+) \(written by {old} workers\) with {new} workers")

    def first_new_step():
        found = pattern.findall(log.read_text(errors="replace"))
        if not found:
            return None
        step = int(found[-1])
        now_inode, rows = watch.rows()
        return now_inode != inode and any(r["step"] == step + 1 for r in rows) and (step, time.monotonic())

    return watch.until(f"a training step with {new} workers", first_new_step, 150)


def test_a_node_killed_and_a_node_joining_resume_by_themselves(tmp_path: Path, token_cache: Path):
    steps = int(os.environ.get("DILOCO_ELASTIC_STEPS", "600"))
    out, port = tmp_path / "run", _free_port()
    logs = {n: tmp_path / f"agent-{n}.log" for n in "ABC"}
    agents: dict[str, tuple[subprocess.Popen, Path]] = {}
    watch = _Watch(out, agents)
    report: dict[str, float] = {}
    try:
        agents["A"] = (_agent(out, token_cache, logs["A"], port=port, host=True, steps=steps), logs["A"])
        time.sleep(1.0)  # A binds the store first
        agents["B"] = (_agent(out, token_cache, logs["B"], port=port, host=False, steps=steps), logs["B"])
        t0 = time.monotonic()
        watch.until(
            "a checkpoint of 2 workers",
            lambda: (m := watch.latest()) and m["num_replicas"] == 2 and m["step"] >= 2 * CHECKPOINT_EVERY,
            240,
        )
        report["startup_s"] = time.monotonic() - t0
        # 2. B's node dies mid-run
        before = watch.rows()
        _kill_node(agents.pop("B")[0])
        killed = time.monotonic()
        inode, rows = watch.rows()
        last_step = max(r["step"] for r in (rows if inode == before[0] else before[1]))
        resumed, seen = _resumed(watch, logs["A"], inode, old=2, new=1)
        report["kill_to_next_step_s"] = seen - killed
        report["steps_redone_after_kill"] = last_step - resumed
        report["resumed_from_after_kill"] = resumed
        watch.until(
            "a checkpoint of 1 worker",
            lambda: (m := watch.latest()) and m["num_replicas"] == 1 and m["step"] > resumed,
            120,
        )
        # 3. C joins
        inode, rows = watch.rows()
        agents["C"] = (_agent(out, token_cache, logs["C"], port=port, host=False, steps=steps), logs["C"])
        joined = time.monotonic()
        resumed2, seen2 = _resumed(watch, logs["A"], inode, old=1, new=2)
        report["join_to_next_step_s"] = seen2 - joined
        # seen by polling every 20 ms: steps trained in the last interval before the restart may be missed
        report["steps_redone_after_join_at_least"] = watch.max_step.get(inode, 0) - resumed2
        report["resumed_from_after_join"] = resumed2
        for name in ("A", "C"):
            proc, log = agents[name]
            watch.until(f"agent {name} to finish", lambda: proc.poll() is not None, 240)
            assert proc.returncode == 0, log.read_text()[-4000:]
    finally:
        for proc, _ in agents.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc, _ in agents.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                _kill_node(proc)  # the agent and its worker: nothing left running
    print("elastic:", json.dumps(report))
    (tmp_path / "report.json").write_text(json.dumps(report))

    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == steps and math.isfinite(summary["final_eval_loss"])
    meta = json.loads((out / "checkpoints" / "latest.json").read_text())
    assert (meta["step"], meta["num_replicas"]) == (steps, 2)
    _, rows = watch.rows()
    assert [r["step"] for r in rows] == list(range(1, steps + 1))  # none lost, none twice
    assert resumed2 > resumed
    assert 0 <= report["steps_redone_after_join_at_least"] <= CHECKPOINT_EVERY, report
    # The goals: at most one checkpoint interval of work redone, the next step within 60 s of the kill.
    assert 0 <= report["steps_redone_after_kill"] <= CHECKPOINT_EVERY, report
    assert report["kill_to_next_step_s"] < 60, report
