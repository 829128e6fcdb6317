"""``learner_budget=tokens``: decoupled learners together train a synchronous run's tokens (``steps`` x
``global_batch`` sequences), counted by the syncer from their reports; a fast learner trains past ``steps``, a
straggler stops before it (threads transport, tiny preset)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from _hooks import CrashAfter, SimulatedCrash

from diloco.algorithm.fragments import flatten, split_fragments
from diloco.train import checkpoint as ckpt
from diloco.train.config import TrainConfig, load_preset
from diloco.train.export import global_model
from diloco.train.trainer import Trainer, train_model


def tiny(**kw) -> TrainConfig:
    base = {**load_preset("tiny")["base"], "method": "decoupled", "threads": 1, "eval_every": 100}
    return TrainConfig.from_dict({**base, **kw})


def _losses(path) -> list[float]:
    return [r["loss"] for r in map(json.loads, (path / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


@pytest.mark.timeout(90)
def test_a_token_budget_in_step_is_the_step_budget_bit_for_bit_and_resumes_so(tmp_path, token_cache):
    """K = M, no straggler: the learners stay in step, a report falls on step `steps` (16 = 4 H), its merge counts
    M x steps learner-steps, and every learner ends there: the same losses, final loss and tokens as `steps`. Its
    checkpoints every 4 steps are those of `steps`, the last one marked final; a run stopped after step 10 and
    resumed from step 8 ends on the same final checkpoint, bit for bit."""
    kw = dict(replicas=2, quorum=0, steps=16, sync_every=4, num_fragments=2, overlap_steps=1, checkpoint_every=4)
    a = train_model(tiny(**kw), tmp_path / "steps", cache_dir=token_cache, progress=False)
    cfg = tiny(**kw, learner_budget="tokens")
    b = train_model(cfg, tmp_path / "tokens", cache_dir=token_cache, progress=False)
    assert a.learner_steps == b.learner_steps == [16, 16]
    assert b.final_eval_loss == a.final_eval_loss and b.tokens == a.tokens == 16 * tiny(**kw).tokens_per_step
    assert _losses(tmp_path / "tokens") == _losses(tmp_path / "steps")
    final = ckpt.latest_meta(tmp_path / "tokens")
    assert final["step"] == 16 and final["final"] and final["learner_steps"] == [16, 16]
    assert sorted(final["files"]) == ["global.pt", "replica-0.pt", "replica-1.pt", "syncer.pt"]
    assert ckpt.saved_steps(tmp_path / "tokens") == ckpt.saved_steps(tmp_path / "steps") == [12, 16]

    cut = tmp_path / "cut"
    with pytest.raises(SimulatedCrash):
        Trainer(cfg, cut, cache_dir=token_cache, progress=False, callbacks=[CrashAfter(10, replicas=2)]).run()
    assert ckpt.latest_meta(cut)["step"] == 8 and not ckpt.latest_meta(cut).get("final")
    c = Trainer(cfg, cut, cache_dir=token_cache, progress=False).run(resume=True)
    assert c.learner_steps == [16, 16] and c.final_eval_loss == b.final_eval_loss
    assert _losses(cut) == _losses(tmp_path / "tokens")
    ended, resumed = ckpt.load_latest(tmp_path / "tokens"), ckpt.load_latest(cut)
    assert resumed["final"] and resumed["learner_steps"] == [16, 16]
    for rb, rc in zip(ended["replicas"], resumed["replicas"], strict=True):
        assert all(torch.equal(rb["model"][k], rc["model"][k]) for k in rb["model"])
        assert rb["algorithm"]["trained"] == rc["algorithm"]["trained"] == 32  # the budget, restored and counted
    for name in ("syncer.pt", "global.pt"):
        gb, gc = (torch.load(ckpt.step_dir(run, 16) / name, weights_only=True) for run in (tmp_path / "tokens", cut))
        gb, gc = (g["global"] if name == "syncer.pt" else list(g.values()) for g in (gb, gc))
        assert all(torch.equal(x, y) for x, y in zip(gb, gc, strict=True))


@pytest.mark.timeout(60)
def test_with_a_straggler_the_fast_learner_trains_its_share(tmp_path, token_cache):
    """K = 1, learner 1 three times slower: learner 0 trains past `steps`, learner 1 stops before it, and together
    they train the budget (M x steps learner-steps) to within one report interval (H steps) per learner. No
    periodic checkpoint falls in 16 steps (auto: every 100); the final one holds each learner at its last step."""
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
    final = ckpt.latest_meta(tmp_path)
    assert ckpt.saved_steps(tmp_path) == [fast] and final["final"] and final["learner_steps"] == [fast, slow]


@pytest.mark.timeout(60)
def test_a_straggler_with_checkpoints_ends_on_a_final_one_that_resumes_as_finished_and_exports(tmp_path, token_cache):
    """Learner 1 four times slower, a checkpoint every 8 steps: both learners meet at step 8 (checkpointed); learner
    0 waits at 16 for learner 1, which ends there (the budget spent): no checkpoint at 16, no hang; learner 0 ends
    at 20. The final checkpoint holds each learner at its last step and the syncer's final global parameters."""
    cfg = tiny(
        replicas=2,
        quorum=1,
        steps=16,
        sync_every=4,
        step_time=0.02,
        slowdown="1,4",
        learner_budget="tokens",
        checkpoint_every=8,
    )
    result = train_model(cfg, tmp_path, cache_dir=token_cache, progress=False)
    assert result.learner_steps == [20, 16]
    final = ckpt.latest_meta(tmp_path)
    assert ckpt.saved_steps(tmp_path) == [8, 20] and final["final"] and final["learner_steps"] == [20, 16]
    saved = ckpt.load_latest(tmp_path)["replicas"]
    assert [r["algorithm"]["step"] for r in saved] == [20, 16]
    # a resume says the run is finished; the export is the syncer's final global parameters (not learner 1's copy)
    again = Trainer(cfg, tmp_path, cache_dir=token_cache, progress=False).run(resume=True)
    assert again.learner_steps == [20, 16] and again.final_eval_loss == result.final_eval_loss
    model, _, _ = global_model(tmp_path, cache_dir=token_cache)
    syncer = torch.load(ckpt.step_dir(tmp_path, 20) / "syncer.pt", weights_only=True)["global"]
    flats = [flatten(f.params) for f in split_fragments(model, cfg.num_fragments, pattern=cfg.fragment_pattern)]
    assert all(torch.equal(x, y) for x, y in zip(flats, syncer, strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(saved[1]["algorithm"]["global"], syncer, strict=True))
    with pytest.raises(ValueError, match=r"has ended \(learner_budget=tokens.*not trained further"):
        Trainer(replace(cfg, steps=20), tmp_path, cache_dir=token_cache, progress=False).run(resume=True)
    (tmp_path / "summary.json").unlink()  # stopped between the final checkpoint and the summary: said so, not rerun
    with pytest.raises(ValueError, match=r"at steps \[20, 16\]\) but its summary.json was not written"):
        Trainer(cfg, tmp_path, cache_dir=token_cache, progress=False).run(resume=True)


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(learner_budget="tokenz"), "learner_budget='tokenz': choose steps"),
        (dict(learner_budget="tokens", method="streaming"), "learner_budget=tokens with method='streaming'"),
        (dict(learner_budget="tokens", ranks_per_worker=2), "with ranks_per_worker=2: the budget is built"),
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
    # a site job of one rank is one learner per torchrun job (the service counts the budget: test_site_budget.py)
    RUNTIME.check_launch(tiny(replicas=2, steps=16, learner_budget="tokens", learner=0, syncer="s@127.0.0.1:1"),
                         torchrun=True, sharded=False)  # fmt: skip
