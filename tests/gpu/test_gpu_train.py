"""The trainer on CUDA, in fp32 and under bf16 autocast: Streaming DiLoCo (M = 2, P = 2, tau = 1, FP4) on the
tiny preset learns, and tracks the same run on the CPU (the same data and initial weights)."""

from __future__ import annotations

import math

import pytest
from _gpu import requires_cuda

from diloco.train import checkpoint as ckpt
from diloco.train.config import TrainConfig, load_preset
from diloco.train.metrics import read_jsonl
from diloco.train.trainer import train_model

pytestmark = [requires_cuda, pytest.mark.timeout(300)]


def _cfg(**kw) -> TrainConfig:
    base = load_preset("tiny")
    return TrainConfig.from_dict(
        {
            **base["base"],
            **base["methods"]["streaming"],
            "num_fragments": 2,
            "steps": 16,
            "eval_every": 8,
            "threads": 1,
            **kw,
        }
    )


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_streaming_trains_on_cuda_like_on_cpu(token_cache, tmp_path, bf16):
    cfg = _cfg(bf16=bf16)
    gpu = train_model(cfg, tmp_path / "cuda", cache_dir=token_cache, progress=False, device="cuda")
    cpu = train_model(cfg, tmp_path / "cpu", cache_dir=token_cache, progress=False, device="cpu")
    rows = {
        name: [r["loss"] for r in read_jsonl(tmp_path / name / "metrics.jsonl") if "loss" in r]
        for name in ("cuda", "cpu")
    }
    assert all(math.isfinite(v) for v in rows["cuda"]) and len(rows["cuda"]) == cfg.total_steps
    assert rows["cuda"][-1] < rows["cuda"][0]  # it learns
    first, final = (2e-2, 5e-2) if bf16 else (1e-4, 1e-2)  # bf16 rounds differently on the two devices
    assert rows["cuda"][0] == pytest.approx(rows["cpu"][0], rel=first)
    assert gpu.final_eval_loss == pytest.approx(cpu.final_eval_loss, rel=final)
    assert gpu.bytes_sent_per_replica == cpu.bytes_sent_per_replica > 0
    # the checkpoint holds CPU tensors (loaded with weights_only), whatever device trained them
    state = ckpt.load_latest(tmp_path / "cuda")["replicas"][0]
    assert all(t.device.type == "cpu" for t in state["model"].values())
