"""``diloco train`` with ``syncer_shards=2`` (learners and the two shards as threads): the run of one syncer, bit
for bit, with K = M; each shard checkpoints its own state (``syncer-<s>.pt``) and a crashed run resumes from them
to the uninterrupted run's bits."""

from __future__ import annotations

import math

import pytest
import torch
from _hooks import CrashAfter, SimulatedCrash
from test_decoupled_resume import config, learner_steps, merges

from diloco.decoupled.runtime import load_syncer_states
from diloco.errors import ConfigError
from diloco.train import checkpoint as ckpt
from diloco.train.metrics import read_jsonl
from diloco.train.trainer import Trainer

STEPS = 32


def run(out, token_cache, *, shards, crash_after=None, resume=False):
    cfg = config(steps=STEPS, syncer_shards=shards, eval_every=16)
    callbacks = [] if crash_after is None else [CrashAfter(crash_after, replicas=cfg.replicas)]
    return Trainer(cfg, out, cache_dir=token_cache, progress=False, callbacks=callbacks).run(resume=resume)


def global_parameters(out):
    """The global parameters the run's last checkpoint holds (every shard's, fragment by fragment)."""
    step = ckpt.latest_meta(out)["step"]
    files = ckpt.latest_meta(out)["files"]
    shards = sum(name.startswith("syncer") for name in files)
    return [g for state in load_syncer_states(out, step, shards) for g in state["global"]], sorted(files)


def assert_same_run(a, b):
    loss = [r["loss"] for r in read_jsonl(a / "metrics.jsonl") if "loss" in r]
    assert [r["loss"] for r in read_jsonl(b / "metrics.jsonl") if "loss" in r] == loss
    assert sorted((r["fragment"], r["version"], r["learners"]) for r in merges(a)) == sorted(
        (r["fragment"], r["version"], r["learners"]) for r in merges(b)
    )
    la, lb = ckpt.load_latest(a), ckpt.load_latest(b)
    for ra, rb in zip(la["replicas"], lb["replicas"], strict=True):
        for k in ra["model"]:
            assert torch.equal(ra["model"][k], rb["model"][k]), k


def test_two_shards_train_as_one_syncer_and_resume_from_their_own_checkpoints(tmp_path, token_cache):
    one = run(tmp_path / "one", token_cache, shards=1)
    two = run(tmp_path / "two", token_cache, shards=2)
    assert math.isfinite(one.final_eval_loss) and two.final_eval_loss == one.final_eval_loss
    assert_same_run(tmp_path / "one", tmp_path / "two")
    g1, files1 = global_parameters(tmp_path / "one")
    g2, files2 = global_parameters(tmp_path / "two")
    assert "syncer.pt" in files1 and {"syncer-0.pt", "syncer-1.pt"} <= set(files2) and "syncer.pt" not in files2
    # fragments 0, 1 of one syncer are shard 0's fragment 0 and shard 1's fragment 0
    assert len(g1) == len(g2) == 2 and all(torch.equal(a, b) for a, b in zip(g1, g2, strict=True))
    assert {r["fragment"] for r in merges(tmp_path / "two")} == {0, 1}

    cut = tmp_path / "cut"
    with pytest.raises(SimulatedCrash):
        run(cut, token_cache, shards=2, crash_after=20)
    assert ckpt.latest_meta(cut)["step"] == 16
    resumed = run(cut, token_cache, shards=2, resume=True)
    assert resumed.final_eval_loss == two.final_eval_loss
    assert learner_steps(cut, 0) == list(range(1, STEPS + 1))
    assert_same_run(tmp_path / "two", cut)
    with pytest.raises(ConfigError, match="syncer_shards: 2 -> 1"):  # a run resumes with the shards it was written with
        run(cut, token_cache, shards=1, resume=True)
