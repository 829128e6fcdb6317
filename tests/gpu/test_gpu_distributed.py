"""What nccl allows on one GPU, and what needs more.

One GPU: the communicator over nccl (every codec's mean, a broadcast, a barrier), FSDP2 on one CUDA rank
(StreamingDiLoCo on the ``fully_shard``'ed model's DTensor shards equals the unsharded model), and
``torchrun --nproc-per-node 1 -m diloco train`` on nccl. Two GPUs (skipped with fewer): two replicas
exchanging over nccl equal the same two replicas as threads of one process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
import torch
from _gpu import nccl_exchange_rank, nccl_fsdp_rank, nccl_streaming_rank, requires_cuda, requires_gpus, train_streaming
from torch.testing import assert_close

from diloco.comm.local import run_replicas
from diloco.distributed import run_processes
from diloco.wire.registry import CODEC_NAMES

pytestmark = [
    requires_cuda,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not torch.distributed.is_nccl_available(), reason="this torch has no nccl"),
]


def test_nccl_communicator_on_one_gpu():
    out = run_processes(nccl_exchange_rank, 1, args=({},), backend="nccl", timeout_s=180)[0]
    for name in CODEC_NAMES:  # one replica: the mean is its own decoded contribution, on its GPU
        assert out[name]["payload_device"].startswith("cuda"), name
        assert torch.equal(out[name]["mean"], out[name]["own"]), name
        assert out[name]["dropped"] == []
    assert torch.equal(out["broadcast"], torch.zeros(3))


def test_fsdp_on_one_cuda_rank_equals_the_unsharded_model():
    cfg = {"codec": "fp32", "steps": 12}
    sharded = run_processes(nccl_fsdp_rank, 1, args=(cfg,), backend="nccl", timeout_s=180)[0]
    plain = run_replicas(partial(train_streaming, device="cuda", steps=12), 1)[0]
    assert sharded["sharded"]  # the parameters really were DTensors
    assert set(sharded["global"]) == set(plain["global"])
    for name, value in plain["global"].items():
        assert_close(sharded["global"][name], value, rtol=1e-5, atol=1e-6, msg=name)


def test_torchrun_train_on_one_gpu_with_nccl(token_cache, tmp_path):
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "1",
        "-m",
        "diloco",
        "train",
        "--preset",
        "tiny",
        "--method",
        "streaming",
        "--out",
        str(out),
        "--cache-dir",
        str(token_cache),
        "--no-progress",
        "--set",
        "replicas=1",
        "--set",
        "steps=8",
        "--set",
        "sync_every=4",
        "--set",
        "eval_every=8",
        "--set",
        "num_fragments=2",
    ]
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(Path(__file__).parents[2] / "src"), os.environ.get("PYTHONPATH", "")]),
    )
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (out / "summary.json").is_file()


@requires_gpus(2)
@pytest.mark.parametrize("codec", ["fp32", "fp4_e3m0"])
def test_two_gpus_over_nccl_equal_two_threads(codec):
    cfg = {"codec": codec, "steps": 12}
    procs = run_processes(nccl_streaming_rank, 2, args=(cfg,), backend="nccl", timeout_s=240)
    threads = run_replicas(partial(train_streaming, device="cuda", codec=codec, steps=12), 2)
    for p, t in zip(procs, threads, strict=True):
        for name, value in t["global"].items():
            assert_close(p["global"][name], value, rtol=1e-5, atol=1e-6, msg=name)
