"""The ``diloco syncer`` monitor SIGKILLed mid-run and started again with the same arguments (one host, loopback):
the service (a local Ray instance, the syncer a detached actor, the gRPC gateway) and two site jobs running the
training run of the commands it printed (one process each, over gRPC, no Ray at the site; torchrun's agent left out
for time: the printed commands as they are run across emulated hosts, tests/hosts/test_deploy_monitor_restart.py).
Skipped when Ray is not installed."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("ray")

from diloco.decoupled.chaos_logs import read_learner_log
from diloco.decoupled.site_faults import site_command
from diloco.distributed.launch import child_environment

STEPS = 32
#: K = M, mean merge, no grace window: every round merges both learners' reports in learner order, so the run is
#: deterministic (the threads run's bits); steps padded to 0.1 s so that the run outlasts the kill's detection.
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
    "step_time": 0.1,
}
MERGES = STEPS // SETS["sync_every"] * SETS["num_fragments"]  # one merge per fragment per round, both learners in it


def _wait(what: str, check, procs, timeout: float = 240.0):
    end = time.monotonic() + timeout
    while not (got := check()):
        for p in procs:
            assert p.poll() in (None, 0), f"{p.args[:4]} exited {p.returncode} waiting for {what}"
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.05)
    return got


@pytest.mark.slow  # ~40-60 s on 2 loaded cores: two starts of the service (Ray each), two torchrun site jobs
@pytest.mark.timeout(400)
def test_a_killed_monitor_started_again_ends_the_run_as_the_threads_run(tmp_path, token_cache):
    """Once the syncer merged twice, the monitor's process is SIGKILLed: its Ray instance (GCS server, raylet) and
    with it the syncer actor end too, and the sites' calls are refused. The same command is run again (``--port 0``
    included: a resumed run serves on its sites' port): it restores the syncer from its checkpoint and the sites,
    which waited for their replies, go on. The run ends with both learners finished, every merge (versions without a
    gap, each of both learners) and the final loss of the threads run to the bit; the summary counts the monitor's
    restart (and no syncer restart: the syncer was started again by the monitor)."""
    from diloco.train.config import TrainConfig, load_preset
    from diloco.train.trainer import train_model

    out = tmp_path / "svc"
    argv = [sys.executable, "-m", "diloco", "syncer", "--preset", "tiny", "--cache-dir", str(token_cache)]
    argv += [x for k, v in SETS.items() for x in ("--set", f"{k}={v}")]
    argv += ["--out", str(out), "--poll", "0.5", "--host", "127.0.0.1", "--advertise", "127.0.0.1", "--port", "0"]
    argv += ["--status-host", "127.0.0.1"]
    logs, procs = [], []

    def start(args: list[str], name: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        log = open(tmp_path / f"{name}.log", "wb")
        logs.append(log)
        proc = subprocess.Popen(args, env=child_environment(**(env or {})), stdout=log, stderr=subprocess.STDOUT)
        procs.append(proc)
        return proc

    try:
        service = start(argv, "service")
        _wait("the service's syncer.json", (out / "syncer.json").is_file, [service])
        info = json.loads((out / "syncer.json").read_text())
        sites = []
        for m in (0, 1):  # the printed command's training run, as one process (torchrun's agent left out)
            env, command = site_command(info["learners"][m], ranks=1)
            command = [sys.executable, *command[command.index("-m", 3) :]]
            command += ["--out", str(tmp_path / f"site-{m}"), "--cache-dir", str(token_cache), "--no-progress"]
            sites.append(start(command, f"site-{m}", env))
        records = out / "syncer" / "records.jsonl"
        _wait("two merges", lambda: len(read_learner_log(records)) >= 2, [service, *sites])
        os.kill(service.pid, signal.SIGKILL)
        service.wait()
        before = len(read_learner_log(records))
        assert before < MERGES  # mid-run

        again = start(argv, "service-again")  # the same command
        for p in sites:
            assert p.wait(timeout=300) == 0, (tmp_path / f"site-{sites.index(p)}.log").read_text()[-3000:]
        assert again.wait(timeout=120) == 0, (tmp_path / "service-again.log").read_text()[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for log in logs:
            log.close()

    text = (tmp_path / "service-again.log").read_text()
    assert f"resuming {info['name']}: its actors are gone" in text and "every learner finished" in text
    # restored from its newest checkpoint: every merge whose replies left the syncer (a record logged without its
    # state, its replies never sent, is dropped and merged again)
    restored = int(re.search(r"resumed from (\d+) merges", text).group(1))
    assert before - 1 <= restored <= before and restored >= 1, (restored, before)
    assert json.loads((out / "syncer.json").read_text())["syncer"] == info["syncer"]  # same name, address, port
    summary = json.loads((out / "summary.json").read_text())
    merges = read_learner_log(out / "merges.jsonl")
    assert summary["merges"] == len(merges) == MERGES
    assert summary["learners"] == 2 and summary["monitor_restarts"] == 1 and summary["syncer_restarts"] == 0
    for p in (0, 1):
        assert [r["version"] for r in merges if r["fragment"] == p] == list(range(1, MERGES // 2 + 1))
    assert all(r["learners"] == [0, 1] for r in merges)
    events = [r["event"] for r in read_learner_log(out / "syncer" / "events.jsonl")]
    assert events.count("started") == 2 and events.count("left") == 2

    sets = {k: v for k, v in SETS.items() if k != "step_time"}  # (a pause per step: the same bits)
    ref_cfg = TrainConfig.from_dict({**load_preset("tiny")["base"], "method": "decoupled", **sets})
    ref = train_model(ref_cfg, tmp_path / "threads", cache_dir=token_cache, progress=False)
    assert summary["final_eval_loss"] == ref.final_eval_loss  # to the bit
    assert (out / "checkpoints").is_dir() and (out / "monitor.json").is_file()
