"""The real trainer behind `diloco sweep --runner train`, on a three-point grid of the tiny model.

Each run is its own process (the default local executor). The grid's base holds Streaming DiLoCo's
fragments: the streaming run trains Streaming DiLoCo with them, and the DP and DiLoCo runs of the
same grid are not broken by them.
"""

import json

from diloco.cli import main as cli_main
from diloco.scaling.sweep import read_results


def test_sweep_with_the_real_trainer_records_losses(tmp_path, token_cache):
    grid = {
        "sizes": ["tiny"], "methods": ["dp", "diloco", "streaming"], "replicas": [2], "inner_lr": [3e-3],
        "global_batch": [8], "outer_lr": [0.7], "sync_every": [8], "tokens_per_param": 0.5,
        "runner": "train",
        "base": {"vocab_size": 512, "seq_len": 32, "warmup_steps": 4, "eval_every": 1000, "eval_batches": 2,
                 "num_fragments": 2, "overlap_steps": 1,
                 "runs_dir": str(tmp_path / "runs"), "cache_dir": str(token_cache)},
    }
    (tmp_path / "grid.json").write_text(json.dumps(grid))
    out = tmp_path / "results.jsonl"
    assert cli_main(["sweep", "--grid", str(tmp_path / "grid.json"), "--out", str(out), "--no-progress"]) == 0
    records = read_results(out)
    assert sorted(r["method"] for r in records) == ["diloco", "dp", "streaming"]
    for r in records:
        assert r["status"] == "ok", r
        assert r["eval_loss"] < 5.9  # learned something: ln(512) = 6.24 at init
        assert r["num_params"] == 37184
        run_dir = tmp_path / "runs" / r["run_id"]
        assert (run_dir / "summary.json").exists()
        trained = json.loads((run_dir / "config.json").read_text())
        trained = trained.get("config", trained)
        assert trained["method"] == r["method"]
        expected = (2, 1) if r["method"] == "streaming" else (1, 0)
        assert (trained["num_fragments"], trained["overlap_steps"]) == expected
