"""The ``diloco syncer`` monitor SIGKILLed mid-run and started again with the same arguments (one host, loopback):
the service (a local Ray instance, the syncer a detached actor, the gRPC gateway) and two site jobs running the
training run of the commands it printed (one process each, over gRPC, no Ray at the site; torchrun's agent left out
for time: the printed commands as they are run across emulated hosts, tests/hosts/test_deploy_monitor_restart.py).
Skipped when Ray is not installed."""

from __future__ import annotations

import pytest

pytest.importorskip("ray")

from diloco.decoupled.monitor_faults import run_monitor_restart

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


@pytest.mark.slow  # 68-110 s on 2 cores (load 8-15): two starts of the service (Ray each), two learner processes
@pytest.mark.timeout(400)
def test_a_killed_monitor_started_again_ends_the_run_as_the_threads_run(tmp_path, token_cache):
    """Once the syncer merged twice, the monitor's process is SIGKILLed: its Ray instance (GCS server, raylet) and
    with it the syncer actor end too, and the sites' calls are refused. The same command is run again (``--port 0``
    included: a resumed run serves on its sites' port): it restores the syncer from its checkpoint and the learners,
    which waited for their replies, go on. The run ends with both learners finished (every step once), every merge
    (versions without a gap, each of both learners) and the final loss of the threads run to the bit; the summary
    counts the monitor's restart (and no syncer restart: the syncer was started again by the monitor)."""
    from diloco.train.config import TrainConfig, load_preset
    from diloco.train.trainer import train_model

    got = run_monitor_restart(preset="tiny", sets=SETS, out=tmp_path / "run", cache_dir=token_cache, kill_after=2)
    assert got["merges_at_kill"] < MERGES  # mid-run
    name = got["info"]["name"]
    assert f"resuming {name}: its actors are gone" in got["resumed_text"]
    assert "every learner finished" in got["resumed_text"]
    # restored from its newest checkpoint: every merge whose replies left the syncer (a record logged without its
    # state, its replies never sent, is dropped and merged again)
    before, restored = got["merges_at_kill"], got["restored_merges"]
    assert restored is not None and before - 1 <= restored <= before and restored >= 1, (restored, before)
    summary, merges = got["summary"], got["merges"]
    assert summary["address"] == got["info"]["syncer"]  # the same name, address and port
    assert summary["merges"] == len(merges) == MERGES
    assert summary["learners"] == 2 and summary["monitor_restarts"] == 1 and summary["syncer_restarts"] == 0
    for p in (0, 1):
        assert [r["version"] for r in merges if r["fragment"] == p] == list(range(1, MERGES // 2 + 1))
    assert all(r["learners"] == [0, 1] for r in merges)
    for m in (0, 1):
        assert got["learners"][m]["steps"] == list(range(1, STEPS + 1))

    sets = {k: v for k, v in SETS.items() if k != "step_time"}  # (a pause per step: the same bits)
    ref_cfg = TrainConfig.from_dict({**load_preset("tiny")["base"], "method": "decoupled", **sets})
    ref = train_model(ref_cfg, tmp_path / "threads", cache_dir=token_cache, progress=False)
    assert summary["final_eval_loss"] == ref.final_eval_loss  # to the bit
    assert (tmp_path / "run" / "svc" / "checkpoints").is_dir() and (tmp_path / "run" / "svc" / "monitor.json").is_file()
