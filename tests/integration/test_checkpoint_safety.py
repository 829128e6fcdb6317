"""Checkpoints survive damage and are kept as asked: the last K kept, a damaged latest checkpoint falls back
and ends bit-identical, an unloadable one is named with its fix, `compare` reuses a finished run and resumes an
interrupted one (through the real CLI and trainer, tiny preset)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from _hooks import CrashAfter, SimulatedCrash
from _run_safety import STEPS, cli_train, snapshot, strict_json, tiny

from diloco.cli import main as cli_main
from diloco.train import checkpoint as ckpt
from diloco.train.config import TrainConfig, load_preset
from diloco.train.trainer import Trainer, train_model


def test_the_last_k_checkpoints_are_kept(tmp_path, token_cache):
    train_model(tiny(steps=12, checkpoint_every=2, keep_checkpoints=3), tmp_path, cache_dir=token_cache, progress=False)
    assert ckpt.saved_steps(tmp_path) == [8, 10, 12]
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("*.json")) == [
        "latest.json",
        "step-00000008.json",
        "step-00000010.json",
        "step-00000012.json",
    ]


def test_default_cadence_falls_on_sync_boundaries_and_is_named_in_help(capsys):
    assert TrainConfig(steps=1, sync_every=30).checkpoint_interval == 120  # first multiple of H >= 100
    assert TrainConfig(steps=1, sync_every=500).checkpoint_interval == 500
    assert TrainConfig(steps=1, method="dp").checkpoint_interval == 100
    assert TrainConfig(steps=1, checkpoint_every=0).checkpoint_interval == 0
    with pytest.raises(SystemExit):
        cli_main(["train", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "checkpoint_every" in help_text and "every 100 steps" in help_text and "keep_checkpoints" in help_text


@pytest.mark.parametrize("method", ["dp", "streaming"])
def test_a_damaged_latest_checkpoint_falls_back_and_ends_bit_identical(tmp_path, token_cache, capsys, method):
    kw = dict(method=method, steps=24, checkpoint_every=8, eval_every=12)
    if method == "streaming":
        kw.update(sync_every=6, num_fragments=2, overlap_steps=2, merge_alpha=0.5, codec="int8")
    cfg = tiny(**kw)
    full, cut = tmp_path / "full", tmp_path / "cut"
    train_model(cfg, full, cache_dir=token_cache, progress=False)
    with pytest.raises(SimulatedCrash):
        crash = CrashAfter(20, replicas=cfg.replicas)
        Trainer(cfg, cut, cache_dir=token_cache, progress=False, callbacks=[crash]).run()
    assert ckpt.saved_steps(cut) == [8, 16]
    damaged = cut / "checkpoints" / "step-00000016" / "replica-1.pt"
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte in the middle of the tensors
    damaged.write_bytes(bytes(data))
    capsys.readouterr()
    resumed = Trainer(cfg, cut, cache_dir=token_cache, progress=False).run(resume=True)
    err = capsys.readouterr().err
    assert "skipped a damaged checkpoint, step 16" in err and "resuming from step 8" in err
    assert "weights_only" not in err
    a, b = ckpt.load_latest(full), ckpt.load_latest(cut)
    assert a["step"] == b["step"] == 24
    for ra, rb in zip(a["replicas"], b["replicas"], strict=True):
        for k in ra["model"]:
            assert torch.equal(ra["model"][k], rb["model"][k]), k
        if method == "streaming":
            for ga, gb in zip(ra["algorithm"]["global"], rb["algorithm"]["global"], strict=True):
                assert torch.equal(ga, gb)
    assert resumed.final_eval_loss == strict_json(full / "summary.json")["final_eval_loss"]
    steps = [r["step"] for r in map(json.loads, (cut / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    assert steps == list(range(1, 25))


class _NotATensor:
    pass


def test_an_unloadable_checkpoint_is_named_without_torchs_unsafe_advice(tmp_path):
    path = tmp_path / "checkpoints" / "step-00000004" / "replica-0.pt"
    path.parent.mkdir(parents=True)
    torch.save({"model": _NotATensor()}, path)  # what weights_only=True refuses
    with pytest.raises(ckpt.CheckpointError) as info:
        ckpt.load_replica(tmp_path, 0, 4)
    assert str(path) in str(info.value) and "weights_only" not in str(info.value)
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_no_readable_checkpoint_says_what_to_do(tmp_path, token_cache, capsys):
    out = tmp_path / "run"
    assert cli_train(out, token_cache, "--set", "checkpoint_every=4") == 0
    for step in (4, 8):
        (out / "checkpoints" / f"step-{step:08d}" / "replica-0.pt").write_bytes(b"garbage")
    before = snapshot(out)
    assert cli_train(out, token_cache, "--set", "checkpoint_every=4", "--resume") == 2
    err = capsys.readouterr().err
    assert "no readable checkpoint" in err and "step 8:" in err and "step 4:" in err and "--overwrite" in err
    assert snapshot(out) == before


def test_compare_reuses_a_finished_run_and_resumes_an_interrupted_one(tmp_path, token_cache, capsys):
    preset = load_preset("tiny")
    preset_file = tmp_path / "p.json"
    preset_file.write_text(
        json.dumps(
            {
                "base": {**preset["base"], "checkpoint_every": 4},
                "methods": {"dp": {"method": "dp"}, "diloco": {"method": "diloco"}},
            }
        )
    )
    out = tmp_path / "cmp"
    args = [
        "compare",
        "--preset",
        str(preset_file),
        "--out",
        str(out),
        "--cache-dir",
        str(token_cache),
        "--no-progress",
        *STEPS,
    ]
    # diloco was killed after step 6: its checkpoint at step 4 is resumed, dp trains afresh
    cfg = TrainConfig.from_dict({**preset["base"], "checkpoint_every": 4, "steps": 8, "eval_every": 4})
    with pytest.raises(SimulatedCrash):
        crash = CrashAfter(6, replicas=cfg.replicas)
        Trainer(cfg, out / "diloco", cache_dir=token_cache, progress=False, callbacks=[crash]).run()
    assert cli_main(args) == 0
    first = {r["name"]: r for r in json.loads((out / "compare.json").read_text())}
    steps = [
        r["step"] for r in map(json.loads, (out / "diloco" / "metrics.jsonl").read_text().splitlines()) if "loss" in r
    ]
    assert steps == list(range(1, 9)) and not first["diloco"]["reused"]
    before = snapshot(out / "dp")
    assert cli_main(args) == 0  # everything finished: reused, nothing retrained
    again = {r["name"]: r for r in json.loads((out / "compare.json").read_text())}
    assert again["dp"]["reused"] and again["diloco"]["reused"]
    assert again["dp"]["final_eval_loss"] == first["dp"]["final_eval_loss"]
    assert snapshot(out / "dp") == before


def test_the_fix_an_unloadable_checkpoint_names_works(tmp_path, token_cache, capsys):
    """A file that matches its record but does not load (written by something else): the message names
    what to delete; after deleting it, --resume continues from the step before and ends as the full run."""
    cfg = tiny(steps=8, checkpoint_every=2, eval_every=4)
    full, cut = tmp_path / "full", tmp_path / "cut"
    train_model(cfg, full, cache_dir=token_cache, progress=False)
    with pytest.raises(SimulatedCrash):
        crash = CrashAfter(6, replicas=cfg.replicas)
        Trainer(cfg, cut, cache_dir=token_cache, progress=False, callbacks=[crash]).run()
    record_path = cut / "checkpoints" / "step-00000006.json"
    record = json.loads(record_path.read_text())
    for rank in range(cfg.replicas):
        path = cut / "checkpoints" / "step-00000006" / f"replica-{rank}.pt"
        torch.save({"model": _NotATensor()}, path)
        record["files"][path.name] = ckpt._digest(path)
    record_path.write_text(json.dumps(record))
    (cut / "checkpoints" / "latest.json").write_text(json.dumps(record))
    resume = ("--set", "checkpoint_every=2", "--resume")  # (cli_train: steps=8, eval_every=4)
    assert cli_train(cut, token_cache, *resume) == 2
    err = capsys.readouterr().err
    assert "weights_only" not in err
    step_dir, step_record = str(cut / "checkpoints" / "step-00000006"), str(record_path)
    assert f"delete {step_dir} and {step_record}" in err
    shutil.rmtree(step_dir)
    record_path.unlink()
    assert cli_train(cut, token_cache, *resume) == 0
    a, b = ckpt.load_latest(full), ckpt.load_latest(cut)
    for ra, rb in zip(a["replicas"], b["replicas"], strict=True):
        for k in ra["model"]:
            assert torch.equal(ra["model"][k], rb["model"][k]), k
