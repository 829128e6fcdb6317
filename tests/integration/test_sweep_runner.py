"""The real trainer behind `diloco sweep --runner train`, on a three-point grid of the tiny model.

Each run is its own process (the default local executor; two at a time in the first test). The grid's base holds Streaming DiLoCo's
fragments: the streaming run trains Streaming DiLoCo with them, and the DP and DiLoCo runs of the
same grid are not broken by them.
"""

import json

import pytest

from diloco.cli import main as cli_main
from diloco.scaling.sweep import read_results


def test_sweep_with_the_real_trainer_records_losses(tmp_path, token_cache):
    grid = {
        "sizes": ["tiny"],
        "methods": ["dp", "diloco", "streaming"],
        "replicas": [2],
        "inner_lr": [3e-3],
        "global_batch": [8],
        "outer_lr": [0.7],
        "sync_every": [8],
        # 36 steps a run (0.5 until the suite was cut to time: 72): eval losses 5.32-5.50, 5.15-5.26 at 72
        "tokens_per_param": 0.25,
        "runner": "train",
        "base": {
            "vocab_size": 512,
            "seq_len": 32,
            "warmup_steps": 4,
            "eval_every": 1000,
            "eval_batches": 2,
            "num_fragments": 2,
            "overlap_steps": 1,
            "runs_dir": str(tmp_path / "runs"),
            "cache_dir": str(token_cache),
            "threads": 1,
        },
    }
    (tmp_path / "grid.json").write_text(json.dumps(grid))
    out = tmp_path / "results.jsonl"
    # the runs in this process, one after another (a process each, as `--executor local` runs them, costs ~2.5 s
    # of CPU a start; the process executors have tests of their own in test_sweep_executors.py)
    sweep = ["sweep", "--grid", str(tmp_path / "grid.json"), "--out", str(out), "--no-progress", "--executor", "inline"]
    assert cli_main(sweep) == 0
    records = read_results(out)
    assert sorted(r["method"] for r in records) == ["diloco", "dp", "streaming"]
    assert len({r["data_sha256"] for r in records}) == 1 and len(records[0]["data_sha256"]) == 64  # the same data
    for r in records:
        assert r["status"] == "ok", r
        assert r["eval_loss"] < 5.9  # learned something: ln(512) = 6.24 at init
        assert r["num_params"] == 37184
        run_dir = tmp_path / "runs" / r["run_id"]
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["data_sha256"] == r["data_sha256"]
        # the record alone tells what the run cost, so a report needs no run folder
        assert {k: r[k] for k in ("total_params", "steps", "bytes_sent_per_replica")} == {
            "total_params": summary["num_params"],
            "steps": summary["steps"],
            "bytes_sent_per_replica": summary["bytes_sent_per_replica"],
        }
        assert r["total_params"] > r["num_params"] and (r["method"] == "dp" or r["bytes_sent_per_replica"] > 0)
        trained = json.loads((run_dir / "config.json").read_text())
        trained = trained.get("config", trained)
        assert trained["method"] == r["method"]
        expected = (2, 1) if r["method"] == "streaming" else (1, 0)
        assert (trained["num_fragments"], trained["overlap_steps"]) == expected


def test_a_run_killed_mid_sweep_resumes_when_the_sweep_restarts(tmp_path, token_cache):
    """The sweep was killed while this run trained: its folder holds a checkpoint. Rerunning the record
    resumes it (metrics continue from the checkpoint, one line per step) instead of failing on the folder."""
    import pytest
    from _hooks import CrashAfter, SimulatedCrash

    from diloco.scaling.sweep import GridSpec, expand
    from diloco.train.sweep_runner import config_from_record, run_config
    from diloco.train.trainer import Trainer

    grid = {
        "sizes": ["tiny"],
        "methods": ["diloco"],
        "replicas": [2],
        "inner_lr": [3e-3],
        "global_batch": [8],
        "outer_lr": [0.7],
        "sync_every": [4],
        "tokens_per_param": 0.1,
        "runner": "train",
        "base": {
            "vocab_size": 512,
            "seq_len": 32,
            "warmup_steps": 2,
            "eval_every": 1000,
            "eval_batches": 2,
            "checkpoint_every": 4,
            "runs_dir": str(tmp_path / "runs"),
            "cache_dir": str(token_cache),
        },
    }
    (tmp_path / "grid.json").write_text(json.dumps(grid))
    (record,) = expand(GridSpec.from_dict(grid))
    cfg, run_dir, cache_dir = config_from_record(record)
    assert cfg.total_steps > 6
    with pytest.raises(SimulatedCrash):
        Trainer(
            cfg, run_dir, cache_dir=cache_dir, progress=False, callbacks=[CrashAfter(6, replicas=cfg.replicas)]
        ).run()
    result = run_config(record)
    assert result["eval_loss"] < 6.0 and (run_dir / "summary.json").exists()
    steps = [r["step"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    assert steps == list(range(1, cfg.total_steps + 1))  # resumed at step 4: 5 and 6 redone, none twice
    assert run_config(record)["eval_loss"] == result["eval_loss"]  # finished: taken as it is


def test_the_grids_device_is_the_runs_and_the_token_files_train_as_their_text(tmp_path, token_cache):
    """``base.device`` picks the device (a runner key: not a TrainConfig field, but part of the run_id), a device
    this machine lacks fails that run before its folder exists, and a grid on the corpus's token files
    (``train.bin`` / ``val.bin``, as studies/frontier/token_files.py writes them) trains on the very ids of the
    text corpus: the same data_sha256 and the same loss. The frontier's GPU runs rely on both."""
    import torch

    from diloco.data.sources import prepare_data
    from diloco.scaling.sweep import GridSpec, expand
    from diloco.train.config import TrainConfig, load_preset
    from diloco.train.sweep_runner import config_from_record, device_of, run_config

    sources = TrainConfig.from_dict(load_preset("tiny")["base"]).sources
    data = prepare_data(list(sources), vocab_size=512, cache_dir=token_cache)
    (tmp_path / "tok").mkdir()
    for name, arr in (("train.bin", data.train), ("val.bin", data.val)):
        (tmp_path / "tok" / name).write_bytes(arr.astype("<u2").tobytes())
    base = {
        "vocab_size": 512,
        "seq_len": 32,
        "warmup_steps": 2,
        "eval_every": 1000,
        "eval_batches": 2,
        "sources": list(sources),
        "runs_dir": str(tmp_path / "runs"),
        "cache_dir": str(token_cache),
    }
    grid = {
        "sizes": ["tiny"],
        "methods": ["streaming"],
        "replicas": [2],
        "inner_lr": [3e-3],
        "global_batch": [8],
        "outer_lr": [0.7],
        "sync_every": [4],
        "tokens_per_param": 0.1,
        "runner": "train",
        "base": base,
    }

    def record(**changes):
        (rec,) = expand(GridSpec.from_dict({**grid, "base": {**base, **changes}}))
        return rec

    text, on_cpu = record(), record(device="cpu")
    files = record(device="cpu", sources=[str(tmp_path / "tok" / "train.bin"), str(tmp_path / "tok" / "val.bin")])
    assert len({text["run_id"], on_cpu["run_id"], files["run_id"]}) == 3
    assert device_of(text) == "cpu" and device_of(on_cpu) == "cpu"
    cfg, _, _ = config_from_record(on_cpu)
    assert cfg == config_from_record(text)[0]  # the device is the runner's, not the model's settings
    a, b = run_config(text), run_config(files)
    assert a["data_sha256"] == b["data_sha256"] == data.digest()
    assert a["eval_loss"] == b["eval_loss"]
    if not torch.cuda.is_available():
        cuda = record(device="cuda")
        with pytest.raises(ValueError, match="--device cuda"):
            run_config(cuda)
        assert not (tmp_path / "runs" / cuda["run_id"]).exists()
    with pytest.raises(ValueError, match="base.device=3"):
        device_of(record(device=3))
