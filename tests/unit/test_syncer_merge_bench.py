"""benchmarks/syncer_merge.py runs end to end on a tiny fragment and writes strict JSON with its columns."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KEYS = {
    "values",
    "learners",
    "codec",
    "merge",
    "merge_s_median",
    "merge_s_first",
    "memcpy_s",
    "merge_over_memcpy",
    "merge_over_memcpy_cpu",
    "merge_cpu_s_median",
    "ns_per_learner_value",
    "peak_growth_bytes",
    "peak_growth_over_model",
    "model_fp32_bytes",
    "hwm_reset",
}


def _strict(text: str) -> dict:
    def refuse(name: str) -> None:
        raise ValueError(f"non-strict JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


def test_syncer_merge_benchmark_writes_strict_json(tmp_path):
    out = tmp_path / "syncer.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "syncer_merge.py"),
            "--sizes",
            "100K",
            "--learners",
            "2",
            "--codec",
            "fp4_e3m0",
            "--merge",
            "rda",
            "--no-grid",
            "--repeats",
            "2",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    doc = _strict(out.read_text())
    assert doc["skipped"] == [] and len(doc["rows"]) == 1
    row = doc["rows"][0]
    assert KEYS <= set(row)
    assert (row["learners"], row["codec"], row["merge"]) == (2, "fp4_e3m0", "rda")
    assert 50_000 < row["values"] < 200_000 and row["model_fp32_bytes"] == 4 * row["values"]
    assert row["merge_s_median"] > 0 and row["memcpy_s"] > 0
    assert row["merge_over_memcpy"] == row["merge_s_median"] / row["memcpy_s"]
    assert len(row["merge_s_all"]) == 2 and row["peak_growth_over_model"] is not None
    assert "x memcpy" in proc.stdout and "peak/model" in proc.stdout


def test_syncer_merge_benchmark_rejects_unknown_codec(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "syncer_merge.py"),
            "--codec",
            "fp5",
            "--no-grid",
            "--out",
            str(tmp_path / "x.json"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert proc.returncode != 0 and "codec 'fp5'" in proc.stderr and not (tmp_path / "x.json").exists()
