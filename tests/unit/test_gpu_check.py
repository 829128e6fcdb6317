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
