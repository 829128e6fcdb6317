"""Decoupled DiLoCo deployed as site jobs, under faults (:mod:`diloco.decoupled.site_faults`): the syncer service
and two site jobs of 2 gloo ranks each (site 0's ranks shard one model with FSDP), every one a real process on
loopback. A rank of learner 1 is SIGKILLed mid-run and torchrun's agent restarts its job, which resumes from its
checkpoint; then the syncer's process is SIGKILLed and Ray restarts it from its checkpoint. Skipped without Ray."""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("ray")

from diloco.decoupled.site_faults import DEFAULT_SETS, Site, run_sites


@pytest.mark.slow  # ~100 s on 2 cores: a Ray instance, 4 learner processes, a job restart and a syncer restart
@pytest.mark.timeout(600)
def test_site_jobs_ride_out_a_killed_rank_and_a_killed_syncer(tmp_path, token_cache):
    """K = 1: learner 0 never waits for learner 1. Learner 1's lead rank is SIGKILLed after step 12; its job
    restarts, resumes from its checkpoint of step 8 with the lr of its schedule there, and contributes a merge of
    weight > 0 within 10 s of the restart. The syncer is then SIGKILLed: every merge it had made survives (the
    versions run on without a gap) and, riding out the restart, no learner step takes more than 2x its typical
    step. The run ends with a finite loss of the syncer's parameters."""
    got = run_sites(
        preset="tiny",
        sets=DEFAULT_SETS,
        out=tmp_path / "run",
        cache_dir=token_cache,
        sites=[Site(0, ranks=2, sharding="fsdp"), Site(1, ranks=2)],
        kill_learner=(1, 12),
        kill_syncer=True,
    )
    kill, syncer = got["faults"]["learner_kill"], got["faults"]["syncer_kill"]
    assert kill["start_step"] == 8  # resumed from its newest checkpoint, not from step 0
    assert kill["lr_matches_schedule"]
    assert kill["first_merge_s"] is not None and kill["first_merge_s"] <= 10.0, kill
    assert got["learners"][0]["worst_step_after_syncer_kill"] <= 2.0, got["learners"]
    assert got["learners"][1]["worst_step_after_syncer_kill"] <= 2.0, got["learners"]
    assert syncer["restored_merges"] is not None and syncer["restored_merges"] > 0
    assert got["versions_contiguous"]
    assert got["learners"][0]["steps"] == got["learners"][1]["steps"] == 120
    assert got["learners"][1]["superseded"] >= 4  # steps 9..12 of the killed process, done again
    assert math.isfinite(got["final_eval_loss"])
    # the service saw the restart and says so, in its output and its summary
    assert "the syncer restarted" in (tmp_path / "run" / "syncer.log").read_text()
    assert json.loads((tmp_path / "run" / "syncer" / "summary.json").read_text())["syncer_restarts"] >= 1
