"""torchrun's environment: parsing, and a real ``torchrun --nproc-per-node 2`` job equal to the in-process run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
import torch
from _replicas import single_thread, streaming_replica

from diloco.comm.local import run_replicas
from diloco.distributed import read_env
from diloco.distributed.launch import is_loopback

pytestmark = pytest.mark.timeout(120)

TORCHRUN_ENV = {
    "RANK": "3",
    "WORLD_SIZE": "4",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29400",
}


def test_read_env_parses_torchrun_variables():
    env = read_env(TORCHRUN_ENV)
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (3, 4, 1, 2)
    assert (env.master_addr, env.master_port, env.node_rank) == ("127.0.0.1", 29400, 1)


def test_read_env_outside_torchrun_says_how_to_launch():
    with pytest.raises(ValueError, match=r"WORLD_SIZE is not set.*torchrun --nproc-per-node"):
        read_env({})


@pytest.mark.parametrize(
    "override, message",
    [
        ({"RANK": "4"}, r"RANK=4 must lie in 0..WORLD_SIZE-1"),
        ({"LOCAL_RANK": "2"}, r"LOCAL_RANK=2 must lie in"),
        ({"MASTER_PORT": "http"}, r"MASTER_PORT='http' is not an integer"),
    ],
)
def test_read_env_rejects_inconsistent_values(override, message):
    with pytest.raises(ValueError, match=message):
        read_env(TORCHRUN_ENV | override)


def test_loopback_detection():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("10.1.2.3") and not is_loopback("192.168.0.1")


def test_torchrun_two_processes_equal_the_in_process_run(tmp_path: Path):
    cfg = {"H": 4, "P": 2, "tau": 1, "codec": "fp4_e3m0", "steps": 10}
    job = Path(__file__).with_name("_torchrun_job.py")
    env = {k: v for k, v in os.environ.items() if k not in ("GLOO_SOCKET_IFNAME", "RANK", "WORLD_SIZE")}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(job),
        str(tmp_path),
        json.dumps(cfg),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stderr[-3000:]
    gloo = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    with single_thread():
        local = run_replicas(partial(streaming_replica, cfg=cfg), 2, timeout=60)
    for r in range(2):
        assert gloo[r]["env"] == {"rank": r, "world_size": 2, "local_rank": r, "gloo_ifname": "lo", "device": "cpu"}
        for a, b in zip(local[r]["global"], gloo[r]["global"], strict=True):
            assert torch.equal(a, b)
        assert local[r]["stats"] == gloo[r]["stats"]


def _torchrun(tmp_path: Path, cfg: dict, nproc: int = 2) -> subprocess.CompletedProcess:
    job = Path(__file__).with_name("_torchrun_job.py")
    env = {k: v for k, v in os.environ.items() if k not in ("GLOO_SOCKET_IFNAME", "RANK", "WORLD_SIZE")}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        str(job),
        str(tmp_path),
        json.dumps(cfg),
    ]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=100)


def test_setup_communicators_one_worker_of_two_ranks(tmp_path: Path):
    """M = 1 worker x R = 2 ranks: the replica group has one member, the worker's group two."""
    proc = _torchrun(tmp_path, {"R": 2})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    for r in range(2):
        assert out[r]["replica"] == (0, 1) and out[r]["intra"] == (r, 2)
        assert out[r]["lead"] == (r == 0)
        assert torch.equal(out[r]["mean"], torch.full((3,), 0.5))


def test_setup_communicators_checks_the_world_size_before_joining(monkeypatch):
    import torch.distributed as dist

    from diloco import setup_communicators

    for k, v in TORCHRUN_ENV.items():
        monkeypatch.setenv(k, v)  # a job of 4 processes
    with pytest.raises(
        ValueError,
        match=r"4 processes were launched but replicas x ranks_per_worker = 3 x 1 = 3; "
        r"launch 3 processes.*or set replicas=4",
    ):
        setup_communicators(replicas=3)
    with pytest.raises(ValueError, match=r"ranks_per_worker=0: need an integer >= 1"):
        setup_communicators(ranks_per_worker=0)
    with pytest.raises(ValueError, match=r"= 1 x 3 = 3.*launch 3 processes"):
        setup_communicators(ranks_per_worker=3)
    assert not dist.is_initialized()  # nothing was joined
