"""A deployed run (:mod:`_deploy`: the service on host 0, sites on hosts 1 and 2 running the printed commands) whose
monitor, ``diloco syncer`` on host 0, is SIGKILLed mid-run and started again with the same command. Root only."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("ray")

from _deploy import (
    SERVICE_OUT,
    give_cache,
    host_env,
    learner_log,
    printed_commands,
    ray_processes,
    records,
    rows,
    run_site,
    start_service,
    wait,
)

from diloco.decoupled.chaos_logs import final_steps
from diloco.testing.deploy_env import contiguous
from diloco.testing.hosts import Hosts, unavailable

pytestmark = [pytest.mark.hosts, pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))]

STEPS = 64
#: K = M, mean merge, no grace window (test_deploy_equivalence.py's run: the threads run's bits), steps padded to
#: 0.15 s so that the learners still train a while after the monitor is back (a second job's claim is refused
#: while they do).
SETS = {
    "replicas": 2,
    "global_batch": 8,
    "sync_every": 4,
    "num_fragments": 2,
    "overlap_steps": 1,
    "quorum": 0,
    "merge": "mean",
    "grace_gamma": 0.0,
    "steps": STEPS,
    "eval_every": STEPS,
    "threads": 1,
    "step_time": 0.15,
}
#: A second job claiming learner 0's index (on host 2, over gRPC, as a site's learner does): what it was told.
SECOND_JOB = """
import sys
from diloco.cli._common import load_preset
from diloco.cli.syncer import service_config
from diloco.decoupled.service import connect_learner
from diloco.errors import ConfigError
cfg = service_config(load_preset("tiny"), {sets!r})
try:
    connect_learner(cfg, learner=0, syncer={syncer!r}, token={token!r})
except ConfigError as exc:
    print("refused:", exc, flush=True)
else:
    print("granted", flush=True)
"""


def _monitor_pid(h0) -> int:
    """The host-side pid of host 0's ``diloco syncer`` process."""
    for pid in h0.pids():
        try:
            words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if words[:1] == [sys.executable.encode()] and b"syncer" in words and b"diloco" in words:
            return pid
    raise LookupError("no diloco syncer process in host 0")


def _head(h0) -> list[str]:
    """Host 0's Ray head processes (its GCS server and raylet)."""
    return [c for c in ray_processes(h0) if "gcs_server" in c or "raylet" in c]


@pytest.mark.slow  # 66-88 s on 2 cores (load 9-13): two starts of the service (Ray each), two sites, a threads run
@pytest.mark.timeout(420)
def test_a_killed_monitor_started_again_ends_the_run_as_an_uninterrupted_one(tmp_path, token_cache):
    """Once the syncer merged 4 times, host 0's monitor process is SIGKILLed: its Ray head (GCS server, raylet)
    ends with it, and the syncer actor with that. Its command is run again on host 0: the sites (which waited for
    their replies meanwhile) go on, and a second job claiming learner 0's index from host 2 just after the restart
    is refused (the claims came back with the syncer's state; learner 0 beats on). The run ends with both learners
    finished (every step of each once), the merge versions without a gap, and the summary of an uninterrupted
    run: the threads run's merges and final loss to the bit, with one monitor restart counted."""
    from diloco.train.config import TrainConfig, load_preset
    from diloco.train.trainer import train_model

    with Hosts(3) as (h0, h1, h2):
        began = time.monotonic()
        service = start_service(h0, token_cache, SETS)
        lines, service = printed_commands(h0, service, token_cache=token_cache, sets=SETS)
        for h in (h1, h2):
            give_cache(h, token_cache)
        sites = [run_site(h1, lines[0], "site-0"), run_site(h2, lines[1], "site-1")]
        logs = [learner_log(h1, lines[0], 0), learner_log(h2, lines[1], 1)]
        wait("4 merges", lambda: len(records(h0)) >= 4, timeout=180, procs=[service, *sites])

        assert _head(h0), "no Ray head seen on host 0: the check below would prove nothing"
        os.kill(_monitor_pid(h0), signal.SIGKILL)
        killed_at = time.time()
        service.wait(timeout=30)
        wait("host 0's Ray head to end with its monitor", lambda: not _head(h0), timeout=60)
        merges_at_kill = len(records(h0))
        assert merges_at_kill < STEPS // 4 * 2  # mid-run

        again = start_service(h0, token_cache, SETS, name="service-again")  # the same command
        info = json.loads(h0.path(f"{SERVICE_OUT}/syncer.json").read_text())
        code = SECOND_JOB.format(sets=SETS, syncer=info["syncer"], token=info["token"])
        second = h2.run([sys.executable, "-c", code], env=host_env(), name="second-job")
        assert second.wait(timeout=300) == 0, second.stderr_path.read_text()[-3000:]
        told = second.stdout_path.read_text()
        assert "refused: learner 0 is taken" in told, told

        for p in sites:
            assert p.wait(timeout=300) == 0, p.stderr_path.read_text()[-3000:]
        assert again.wait(timeout=120) == 0, again.stderr_path.read_text()[-3000:]
        seconds = time.monotonic() - began
        text = again.stdout_path.read_text()
        assert "its actors are gone" in text and "every learner finished" in text
        svc = h0.path(SERVICE_OUT)
        summary = json.loads((svc / "summary.json").read_text())
        merges = rows(svc / "merges.jsonl")
        assert contiguous(merges) and all(r["learners"] == [0, 1] for r in merges)
        assert summary["merges"] == len(merges) and summary["learners"] == 2
        assert summary["monitor_restarts"] == 1 and summary["syncer_restarts"] == 0
        assert any(r["at"] > killed_at for r in merges)  # it went on counting after the restart
        for m, log in enumerate(logs):
            steps, _ = final_steps(rows(log))
            assert [r["step"] for r in steps] == list(range(1, STEPS + 1)), m

    sets = {k: v for k, v in SETS.items() if k != "step_time"}  # (a pause per step: the same bits)
    ref_cfg = TrainConfig.from_dict({**load_preset("tiny")["base"], "method": "decoupled", **sets})
    ref = train_model(ref_cfg, tmp_path / "threads", cache_dir=token_cache, progress=False)
    assert len((tmp_path / "threads" / "merges.jsonl").read_text().splitlines()) == summary["merges"]
    assert summary["final_eval_loss"] == ref.final_eval_loss  # to the bit
    print(f"monitor restart across hosts: {seconds:.1f} s, {merges_at_kill} merges at the kill, {summary}")
