"""End-to-end runs of the trainer and CLI on the tiny preset (real corpus, real tokenizer)."""

from __future__ import annotations

import json

import pytest
import torch
from _hooks import CrashAfter, SimulatedCrash

from diloco.cli import main as cli_main
from diloco.train import checkpoint as ckpt
from diloco.train.config import TrainConfig, load_preset
from diloco.train.lr import lr_at
from diloco.train.metrics import read_jsonl
from diloco.train.trainer import Trainer, train_model
from diloco.wire.registry import get_codec


@pytest.fixture(scope="module")
def cache(token_cache):
    return token_cache


def tiny(**kw) -> TrainConfig:
    preset = load_preset("tiny")
    return TrainConfig.from_dict({**preset["base"], **kw})


def test_streaming_two_replicas_loss_falls_and_bytes_match(tmp_path, cache):
    cfg = tiny(
        method="streaming",
        replicas=2,
        sync_every=8,
        num_fragments=3,
        overlap_steps=1,
        merge_alpha=0.5,
        codec="fp4_e3m0",
        steps=48,
    )
    result = train_model(cfg, tmp_path, cache_dir=cache, progress=False)
    rows = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if "loss" in r]
    assert len(rows) == 48
    first, last = sum(r["loss"] for r in rows[:5]) / 5, sum(r["loss"] for r in rows[-5:]) / 5
    assert last < first - 0.3, (first, last)
    # bytes: each fragment's payload once per sync the schedule starts
    ckpt_state = ckpt.load_latest(tmp_path)
    sizes = [g.numel() for g in ckpt_state["replicas"][0]["algorithm"]["global"]]
    from diloco.algorithm.schedule import Schedule

    sched = Schedule(8, 3, 1)
    codec = get_codec("fp4_e3m0")
    expected = sum(codec.num_bytes(sizes[p]) for t in range(1, 49) for p in sched.starts(t))
    assert result.bytes_sent_per_replica == expected
    assert result.bytes_received_per_replica == expected
    assert result.peak_bytes_per_sync == max(codec.num_bytes(n) for n in sizes)
    assert result.final_eval_loss < rows[0]["loss"]


@pytest.mark.parametrize(
    "kw",
    [dict(method="dp"), dict(method="diloco", sync_every=8), dict(method="diloco", replicas=1, sync_every=8)],
    ids=["dp", "diloco", "diloco-m1"],
)
def test_every_mode_trains_the_tiny_model(tmp_path, cache, kw):
    cfg = tiny(**({"replicas": 2, "steps": 48} | kw))
    result = train_model(cfg, tmp_path, cache_dir=cache, progress=False)
    rows = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if "loss" in r]
    first, last = sum(r["loss"] for r in rows[:5]) / 5, sum(r["loss"] for r in rows[-5:]) / 5
    assert last < first - 0.3, (kw, first, last)
    assert result.final_eval_loss < rows[0]["loss"]


def test_tensorboard_sink_writes_the_logged_scalars(tmp_path, cache):
    from tensorboard.backend.event_processing import event_accumulator  # a dev dependency

    train_model(
        tiny(method="diloco", steps=12, eval_every=6, tensorboard=True), tmp_path, cache_dir=cache, progress=False
    )
    acc = event_accumulator.EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    losses = [e.value for e in acc.Scalars("loss")]
    logged = [r["loss"] for r in read_jsonl(tmp_path / "metrics.jsonl") if "loss" in r]
    assert losses == pytest.approx(logged, rel=1e-6) and len(losses) == 12
    assert {"eval_loss", "bytes_sent", "lr"} <= set(acc.Tags()["scalars"])


def test_lr_schedule_warmup_then_cosine_to_floor():
    cfg = tiny(steps=100, warmup_steps=10, inner_lr=1e-3, min_lr_ratio=0.05)
    assert lr_at(5, cfg) == pytest.approx(5e-4)
    assert lr_at(10, cfg) == pytest.approx(1e-3)
    assert lr_at(55, cfg) == pytest.approx(1e-3 * (0.05 + 0.95 * 0.5))
    assert lr_at(100, cfg) == pytest.approx(5e-5)


@pytest.mark.parametrize("method", ["dp", "streaming"])
def test_interrupted_and_resumed_run_ends_identical(tmp_path, cache, method):
    kw = dict(method=method, replicas=2, steps=24, checkpoint_every=8, eval_every=12)
    if method == "streaming":
        kw.update(sync_every=6, num_fragments=2, overlap_steps=2, merge_alpha=0.5, codec="int8")
    cfg = tiny(**kw)
    full = tmp_path / "full"
    train_model(cfg, full, cache_dir=cache, progress=False)
    cut = tmp_path / "cut"
    with pytest.raises(SimulatedCrash):
        crash = CrashAfter(13, replicas=cfg.replicas)
        Trainer(cfg, cut, cache_dir=cache, progress=False, callbacks=[crash]).run()
    assert ckpt.latest_meta(cut)["step"] == 8
    resumed = Trainer(cfg, cut, cache_dir=cache, progress=False).run(resume=True)
    a, b = ckpt.load_latest(full), ckpt.load_latest(cut)
    for ra, rb in zip(a["replicas"], b["replicas"]):
        for k in ra["model"]:
            assert torch.equal(ra["model"][k], rb["model"][k]), k
        if method == "streaming":
            for ga, gb in zip(ra["algorithm"]["global"], rb["algorithm"]["global"]):
                assert torch.equal(ga, gb)
    summary = json.loads((full / "summary.json").read_text())
    assert resumed.final_eval_loss == summary["final_eval_loss"]
    env = summary["environment"]  # what picks the kernels, to compare two runs' last digits
    assert env["torch"] == torch.__version__ and env["device"] == "cpu" and env["intra_op_threads"] >= 1
    assert env["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability() and env["cpu"]
    steps = [r["step"] for r in read_jsonl(cut / "metrics.jsonl") if "loss" in r]
    assert steps == list(range(1, 25))  # no duplicated or missing rows after the resume


def test_resume_refuses_a_different_config(tmp_path, cache):
    cfg = tiny(method="diloco", steps=8)
    train_model(cfg, tmp_path, cache_dir=cache, progress=False)
    with pytest.raises(ValueError, match="different config"):
        train_model(
            tiny(method="diloco", steps=8, inner_lr=1e-2), tmp_path, cache_dir=cache, progress=False, resume=True
        )


def test_config_validation_names_values_and_fix():
    with pytest.raises(ValueError, match="global_batch=9 must be a positive multiple of replicas=2"):
        tiny(global_batch=9, replicas=2)
    with pytest.raises(ValueError, match="use method='streaming'"):
        tiny(method="diloco", num_fragments=2)
    with pytest.raises(ValueError, match="method='sgd'"):
        tiny(method="sgd")
    with pytest.raises(ValueError, match="unknown config keys"):
        TrainConfig.from_dict({"sync_evry": 3})


def test_cli_compare_end_to_end(tmp_path, cache, capsys):
    out = tmp_path / "cmp"
    code = cli_main(
        [
            "compare",
            "--preset",
            "tiny",
            "--out",
            str(out),
            "--cache-dir",
            str(cache),
            "--no-progress",
            "--set",
            "steps=16",
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    rows = json.loads((out / "compare.json").read_text())
    names = [r["name"] for r in rows]
    for name in names:
        assert name in printed
    assert {"dp", "diloco", "streaming"} <= set(names)
    dp = next(r for r in rows if r["name"] == "dp")
    streaming = next(r for r in rows if r["name"] == "streaming")
    assert dp["loss_vs_dp_pct"] == 0.0
    assert streaming["bytes_fewer_than_dp"] > 10
    for f in ("loss_vs_tokens.png", "loss_vs_bytes.png", "compare.txt"):
        assert (out / f).stat().st_size > 1000 or f == "compare.txt"
    assert (out / "dp" / "config.json").exists()


def test_cli_set_rejects_bad_values(tmp_path, capsys):
    assert cli_main(["train", "--preset", "tiny", "--set", "sync_every=abc", "--out", str(tmp_path)]) == 2
    assert "sync_every='abc': expected a value of type int" in capsys.readouterr().err
    assert cli_main(["train", "--preset", "tiny", "--set", "foo=1", "--out", str(tmp_path)]) == 2
    assert "unknown config key 'foo'" in capsys.readouterr().err
    assert cli_main(["train", "--preset", "nope", "--out", str(tmp_path)]) == 2
    assert "unknown preset 'nope'" in capsys.readouterr().err
