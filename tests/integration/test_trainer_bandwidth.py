"""The trainer with eager updates, error-feedback codecs and Muon: resume bit-identical, M = 1 eager = DiLoCo."""

from __future__ import annotations

import math

import pytest
import torch
from _hooks import CrashAfter, SimulatedCrash

from diloco.train import checkpoint as ckpt
from diloco.train.config import TrainConfig, load_preset
from diloco.train.trainer import Trainer, train_model


@pytest.fixture(scope="module")
def cache(token_cache):
    return token_cache


def tiny(**kw) -> TrainConfig:
    return TrainConfig.from_dict({**load_preset("tiny")["base"], **kw})


def test_eager_topk_error_feedback_muon_run_resumes_bit_identical(tmp_path, cache):
    cfg = tiny(
        method="streaming",
        replicas=2,
        steps=16,
        sync_every=4,
        num_fragments=2,
        overlap_steps=4,
        eager=True,
        codec="topk",
        topk_density=0.05,
        ef_decay=0.95,
        outer_momentum=0.0,
        outer_lr=1.0,
        inner_optimizer="muon",
        checkpoint_every=6,
        eval_every=16,
    )
    full = tmp_path / "full"
    train_model(cfg, full, cache_dir=cache, progress=False)
    cut = tmp_path / "cut"
    with pytest.raises(SimulatedCrash):
        Trainer(cfg, cut, cache_dir=cache, progress=False, callbacks=[CrashAfter(9, replicas=2)]).run()
    saved = ckpt.load_latest(cut)
    assert saved["step"] == 6
    algo = saved["replicas"][0]["algorithm"]
    assert algo["pending"] and all("share" in e for e in algo["pending"].values())  # eager shares in flight
    assert algo["error_feedback"]["accumulators"][0].abs().sum() > 0
    assert set(saved["replicas"][0]["optimizer"]) == {"muon", "adamw"}
    Trainer(cfg, cut, cache_dir=cache, progress=False).run(resume=True)
    a, b = ckpt.load_latest(full), ckpt.load_latest(cut)
    for ra, rb in zip(a["replicas"], b["replicas"], strict=True):
        for k in ra["model"]:
            assert torch.equal(ra["model"][k], rb["model"][k]), k
        for ga, gb in zip(ra["algorithm"]["global"], rb["algorithm"]["global"], strict=True):
            assert torch.equal(ga, gb)
        for ea, eb in zip(
            ra["algorithm"]["error_feedback"]["accumulators"],
            rb["algorithm"]["error_feedback"]["accumulators"],
            strict=True,
        ):
            assert torch.equal(ea, eb)


def test_eager_with_one_replica_trains_exactly_like_diloco(tmp_path, cache):
    # threads=1: the default (0) counts the cores other work leaves free when each run starts, and two thread
    # counts sum in two orders (under a load that changed between the two runs, this test failed so)
    base = dict(method="diloco", replicas=1, steps=12, sync_every=4, eval_every=12, codec="stat4", ef_decay=0.9)
    base["threads"] = 1
    train_model(tiny(**base), tmp_path / "diloco", cache_dir=cache, progress=False)
    train_model(tiny(**base, eager=True, overlap_steps=4), tmp_path / "eager", cache_dir=cache, progress=False)
    a, b = ckpt.load_latest(tmp_path / "diloco"), ckpt.load_latest(tmp_path / "eager")
    for k, v in a["replicas"][0]["model"].items():
        assert torch.equal(v, b["replicas"][0]["model"][k]), k
    assert torch.equal(a["replicas"][0]["algorithm"]["global"][0], b["replicas"][0]["algorithm"]["global"][0])


def test_topk_with_chunk_tables_sends_what_the_traffic_function_counts(tmp_path, cache):
    from diloco.algorithm.schedule import Schedule
    from diloco.wire.registry import get_codec

    kw = dict(
        method="streaming",
        replicas=2,
        steps=16,
        sync_every=4,
        num_fragments=2,
        overlap_steps=1,
        codec="topk",
        ef_decay=0.95,
        outer_momentum=0.0,
        outer_lr=1.0,
        eval_every=16,
    )
    result = train_model(tiny(**kw, topk_tables="chunk"), tmp_path, cache_dir=cache, progress=False)
    sizes = [g.numel() for g in ckpt.load_latest(tmp_path)["replicas"][0]["algorithm"]["global"]]
    codec = get_codec("topk", topk_tables="chunk")
    sched = Schedule(4, 2, 1)
    # M = 2: the all-gather of a sparse payload sends it once to the one peer
    expected = sum(codec.num_bytes(sizes[p]) for t in range(1, 17) for p in sched.starts(t))
    assert result.bytes_sent_per_replica == result.bytes_received_per_replica == expected
    one_table = sum(get_codec("topk").num_bytes(sizes[p]) for t in range(1, 17) for p in sched.starts(t))
    assert expected > one_table  # 16 bytes of bin means per 4096-value chunk more
    assert result.final_eval_loss < math.log(tiny().vocab_size)  # below chance: it trained


def test_decoupled_syncer_sends_the_configured_topk():
    from diloco.decoupled.trainer import make_syncer

    cfg = tiny(method="decoupled", replicas=2, codec="topk", topk_density=0.05, topk_tables="chunk")
    syncer = make_syncer(cfg, torch.nn.Linear(8, 8))
    assert (syncer.codec.density, syncer.codec.tables) == (0.05, "chunk")


def test_config_checks_the_new_keys():
    with pytest.raises(ValueError, match="overlap_steps=8"):
        tiny(method="streaming", eager=True, overlap_steps=1)
    with pytest.raises(ValueError, match="needs eager"):
        tiny(method="streaming", overlap_steps=8)
    with pytest.raises(ValueError, match="inner_optimizer='sgd'"):
        tiny(inner_optimizer="sgd")
    with pytest.raises(ValueError, match="ef_decay=1.5"):
        tiny(ef_decay=1.5)
    with pytest.raises(ValueError, match="topk_density=0"):
        tiny(topk_density=0.0)
    with pytest.raises(ValueError, match="topk_tables='tile'.*payload, chunk"):
        tiny(topk_tables="tile")
    codec = tiny(codec="topk", topk_density=0.05, topk_tables="chunk").make_codec()
    assert (codec.density, codec.tables) == (0.05, "chunk")
    with pytest.raises(ValueError, match="eager=true"):
        tiny(method="dp", eager=True)
    assert tiny(method="diloco", eager=True, overlap_steps=8).eager


def test_muon_is_the_inner_optimizer_the_trainer_builds(tmp_path, cache):
    result = train_model(tiny(steps=2, inner_optimizer="muon", eval_every=2), tmp_path, cache_dir=cache, progress=False)
    assert result.final_eval_loss > 0
    state = ckpt.load_latest(tmp_path)["replicas"][0]["optimizer"]
    assert set(state) == {"muon", "adamw"}  # one state per part of the combined optimizer
