"""``learner_budget=tokens``: decoupled learners together train a synchronous run's tokens (``steps`` x
``global_batch`` sequences), counted by the syncer from their reports; a fast learner trains past ``steps``, a
straggler stops before it (threads transport, tiny preset)."""

from __future__ import annotations

import json

import pytest

from diloco.train.config import TrainConfig, load_preset
from diloco.train.trainer import train_model


def tiny(**kw) -> TrainConfig:
    base = {**load_preset("tiny")["base"], "method": "decoupled", "threads": 1, "eval_every": 100}
    return TrainConfig.from_dict({**base, **kw})


def _losses(path) -> list[float]:
    return [r["loss"] for r in map(json.loads, (path / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


@pytest.mark.timeout(60)
def test_a_token_budget_in_step_is_the_step_budget_bit_for_bit(tmp_path, token_cache):
    """K = M, no straggler: the learners stay in step, a report falls on step `steps` (16 = 4 H), its merge counts
    M x steps learner-steps, and every learner ends there: the same losses, final loss and tokens as `steps`."""
    kw = dict(replicas=2, quorum=0, steps=16, sync_every=4, num_fragments=2, overlap_steps=1, checkpoint_every=0)
    a = train_model(tiny(**kw), tmp_path / "steps", cache_dir=token_cache, progress=False)
    b = train_model(tiny(**kw, learner_budget="tokens"), tmp_path / "tokens", cache_dir=token_cache, progress=False)
    assert a.learner_steps == b.learner_steps == [16, 16]
    assert b.final_eval_loss == a.final_eval_loss and b.tokens == a.tokens == 16 * tiny(**kw).tokens_per_step
    assert _losses(tmp_path / "tokens") == _losses(tmp_path / "steps")


@pytest.mark.timeout(60)
def test_with_a_straggler_the_fast_learner_trains_its_share(tmp_path, token_cache):
    """K = 1, learner 1 three times slower: learner 0 trains past `steps`, learner 1 stops before it, and together
    they train the budget (M x steps learner-steps) to within one report interval (H steps) per learner."""
    H, steps = 4, 16
    cfg = tiny(replicas=2, quorum=1, steps=steps, sync_every=H, step_time=0.02, slowdown="1,3", learner_budget="tokens")
    result = train_model(cfg, tmp_path, cache_dir=token_cache, progress=False)
    fast, slow = result.learner_steps
    assert fast > steps > slow, result.learner_steps
    assert abs(fast + slow - 2 * steps) <= 2 * H, result.learner_steps
    assert result.tokens == (fast + slow) * cfg.batch_per_replica * cfg.seq_len
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["learner_steps"] == [fast, slow] and summary["tokens"] == result.tokens
    learner_rows = [r for r in map(json.loads, (tmp_path / "learner-0.jsonl").read_text().splitlines()) if "step" in r]
    assert [r["step"] for r in learner_rows] == list(range(1, fast + 1))


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(learner_budget="tokenz"), "learner_budget='tokenz': choose steps"),
        (dict(learner_budget="tokens", method="streaming"), "learner_budget=tokens with method='streaming'"),
        (dict(learner_budget="tokens", checkpoint_every=8), "checkpoint_every=8: learners end at different steps"),
        (dict(learner_budget="tokens", learner=0, syncer="s@127.0.0.1:1"), "not for site jobs"),
    ],
)
def test_bad_learner_budgets_are_refused_naming_the_value(kw, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        tiny(replicas=2, steps=16, **kw)


def test_a_token_budget_under_torchrun_is_refused_before_anything_runs():
    from diloco.decoupled.runtime import RUNTIME

    cfg = tiny(replicas=2, steps=16, learner_budget="tokens")
    RUNTIME.check_launch(cfg, torchrun=False, sharded=False)
    with pytest.raises(ValueError, match="learner_budget=tokens is built for learners on threads"):
        RUNTIME.check_launch(cfg, torchrun=True, sharded=False)
