"""The trainer's hooks a fault harness uses, in a threads run (no Ray): step padding and stragglers (the config's
``step_time`` and ``slowdown``, :mod:`diloco.train.pace`) and a learner that stops early
(:meth:`~diloco.train.trainer.TrainerCallback.should_stop`)."""

from __future__ import annotations

import json
import statistics

import pytest

from diloco.train.config import TrainConfig, load_preset
from diloco.train.trainer import Trainer, TrainerCallback, train_model


def tiny(**kw) -> TrainConfig:
    base = {**load_preset("tiny")["base"], "method": "decoupled", "threads": 1, "eval_every": 100}
    return TrainConfig.from_dict({**base, **kw})


def _rows(path) -> list[dict]:
    return [r for r in map(json.loads, path.read_text().splitlines()) if "step" in r]


def test_a_straggler_in_a_threads_run_steps_slower_by_its_factor(tmp_path, token_cache):
    """step_time=0.05, slowdown=1,3: learner 0's steps are padded to 0.05 s, learner 1's to 3 x that; the logged
    compute is the padded time (what the learner's reports say it worked)."""
    cfg = tiny(replicas=2, quorum=1, steps=8, step_time=0.05, slowdown="1,3")
    train_model(cfg, tmp_path, cache_dir=token_cache, progress=False)
    compute = [statistics.median(r["compute_s"] for r in _rows(tmp_path / f"learner-{m}.jsonl")) for m in (0, 1)]
    assert compute[0] == pytest.approx(0.05, rel=0.2) and compute[1] == pytest.approx(0.15, rel=0.2), compute
    assert all(r["dt"] >= r["compute_s"] for m in (0, 1) for r in _rows(tmp_path / f"learner-{m}.jsonl"))


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(slowdown="1,3,1"), "one factor >= 1 per replica (2 replicas), e.g. 1,3"),
        (dict(slowdown="1,0.5"), "one factor >= 1 per replica"),
        (dict(slowdown="1,x"), "numbers separated by commas"),
        (dict(step_time=-1.0), "step_time=-1.0: give seconds >= 0"),
    ],
)
def test_bad_pace_settings_are_refused_naming_the_value(kw, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        tiny(replicas=2, steps=8, **kw)


class _StopAfter(TrainerCallback):
    def __init__(self, step: int) -> None:
        self.step = step

    def should_stop(self, step: int, *, replica: int) -> bool:
        return step >= self.step


@pytest.mark.timeout(60)
def test_learners_that_stop_early_flush_leave_and_record_the_step_reached(tmp_path, token_cache):
    """K = M: every learner of the job stops after step 6 of 16 (a chaos run's clock): each flushes the report it
    has in flight and leaves its syncer (the job ends instead of waiting for rounds no one sends), no checkpoint
    is written for the stop, and the summary says how far it trained, not the config's steps. (In a job of several
    replicas they stop together: the job's collectives span them all; a site job's learner stops alone.)"""
    cfg = tiny(replicas=2, quorum=0, steps=16, sync_every=4, num_fragments=2, overlap_steps=1)
    result = Trainer(cfg, tmp_path, cache_dir=token_cache, progress=False, callbacks=[_StopAfter(6)]).run()
    for m in (0, 1):
        assert [r["step"] for r in _rows(tmp_path / f"learner-{m}.jsonl")] == list(range(1, 7))
    merges = [json.loads(line) for line in (tmp_path / "merges.jsonl").read_text().splitlines()]
    # every round of the 6 steps merged both learners' reports: none waited for a report that was not sent
    assert {r["fragment"] for r in merges} == {0, 1} and all(r["learners"] == [0, 1] for r in merges)
    assert result.steps == 6 and result.tokens == 6 * cfg.tokens_per_step
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == 6
    assert not (tmp_path / "checkpoints").exists() or not any((tmp_path / "checkpoints").iterdir())
