"""The real trainer behind `diloco sweep --runner train`, on a two-point grid of the tiny model."""

import json

from diloco.cli import main as cli_main
from diloco.scaling.sweep import read_results


def test_sweep_with_the_real_trainer_records_losses(tmp_path, token_cache):
    grid = {
        "sizes": ["tiny"], "methods": ["dp", "diloco"], "replicas": [2], "inner_lr": [3e-3],
        "global_batch": [8], "outer_lr": [0.7], "sync_every": [8], "tokens_per_param": 0.5,
        "runner": "train",
        "base": {"vocab_size": 512, "seq_len": 32, "warmup_steps": 4, "eval_every": 1000, "eval_batches": 2,
                 "runs_dir": str(tmp_path / "runs"), "cache_dir": str(token_cache)},
    }
    (tmp_path / "grid.json").write_text(json.dumps(grid))
    out = tmp_path / "results.jsonl"
    assert cli_main(["sweep", "--grid", str(tmp_path / "grid.json"), "--out", str(out)]) == 0
    records = read_results(out)
    assert [r["method"] for r in records] == ["dp", "diloco"]
    for r in records:
        assert r["status"] == "ok", r
        assert r["eval_loss"] < 5.9  # learned something: ln(512) = 6.24 at init
        assert r["num_params"] == 37184
        assert (tmp_path / "runs" / r["run_id"] / "summary.json").exists()
