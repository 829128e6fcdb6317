"""The GPU check (benchmarks/gpu_check.py, diloco.bench.gpu_check) where there is no GPU: it says so and writes
nothing; its measurements run on the CPU at toy sizes (the memory of Streaming's state is the analytic 5/3 of DP's)."""

from __future__ import annotations

import json

import pytest
import torch

from diloco.bench import gpu_check


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_without_cuda_it_says_so_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "gpu_check.json"
    assert gpu_check.main(["--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "gpu_check: no CUDA GPU visible" in err and "--dry-run" in err
    assert not out.exists()


def test_measurements_run_on_the_cpu_and_streaming_state_is_five_thirds_of_dp():
    size = gpu_check.SIZES["dry-run"]
    mem = gpu_check.run_memory(torch.device("cpu"), size)
    assert mem["state_ratio"] == pytest.approx(5 / 3, rel=1e-3)  # global copy + outer momentum
    rows = mem["rows"]
    assert rows["streaming"]["algorithm_bytes_on_device"] == 2 * rows["dp"]["param_bytes"]
    codec = gpu_check.run_codec(torch.device("cpu"), size)
    assert codec["encode_GBps"] > 0 and codec["payload_bytes"] < codec["fp32_bytes"] / 7
    lines = gpu_check.summary_lines(
        {
            "device_name": "cpu",
            "device": "cpu",
            "torch": torch.__version__,
            "seconds": 1.0,
            "codec": codec,
            "memory": mem,
            "errors": {},
        }
    )
    assert any(line.startswith("memory: state on the device, Streaming / DP = 1.667") for line in lines)
    json.dumps(mem)  # what the script writes


def test_the_syncer_phase_sets_each_gpu_merge_beside_the_cpus():
    from diloco.bench.gpu_syncer import summarize, syncer_args, syncer_line

    assert "cpu,cuda" in syncer_args(dry_run=False) and "cuda" not in " ".join(syncer_args(dry_run=True))
    row = {"values": 16, "merge_over_memcpy": 10.0, "peak_growth_over_model": 4.0}
    rows = [
        {**row, "device": "cpu", "learners": 2, "merge_s_median": 0.6},
        {**row, "device": "cuda", "learners": 2, "merge_s_median": 0.2},
        {**row, "device": "cpu", "learners": 8, "merge_s_median": 1.0},
    ]
    phase = summarize(rows)
    assert phase["cpu_over_gpu"] == {"M=2, 16 values": pytest.approx(3.0)}  # M = 8 has no GPU row: no ratio
    assert [r["merge_s"] for r in phase["rows"]] == [0.6, 0.2, 1.0]
    assert "CPU / GPU 3.0x" in syncer_line(phase) and "cuda M=2 200 ms" in syncer_line(phase)
