"""StreamingDiLoCo on CUDA: the global copy and outer state offloaded to the CPU (``offload_device="cpu"``)
give the parameters of the all-GPU run, and with FP32 exchanges both those of the CPU run (two replicas as threads, P = 2,
tau = 1, alpha = 0.5)."""

from __future__ import annotations

from functools import partial

import pytest
from _gpu import requires_cuda, train_streaming
from torch.testing import assert_close

from diloco.comm.local import run_replicas

pytestmark = [requires_cuda, pytest.mark.timeout(180)]


@pytest.mark.parametrize("codec", ["fp32", "fp4_e3m0"])
def test_offload_to_cpu_equals_the_all_gpu_run_and_the_cpu_run(codec):
    gpu = run_replicas(partial(train_streaming, device="cuda", codec=codec), 2)
    offloaded = run_replicas(partial(train_streaming, device="cuda", offload="cpu", codec=codec), 2)
    cpu = run_replicas(partial(train_streaming, device="cpu", codec=codec), 2)
    assert gpu[0]["global_device"].startswith("cuda") and offloaded[0]["global_device"] == "cpu"
    for name, value in gpu[0]["global"].items():
        assert_close(offloaded[0]["global"][name], value, rtol=1e-5, atol=1e-6, msg=name)
        if codec == "fp32":  # FP4 rounds to steps of 2x: a last-bit difference between devices can move a value
            assert_close(cpu[0]["global"][name], value, rtol=1e-3, atol=1e-4, msg=name)
    for a, b in zip(gpu, offloaded, strict=True):  # every replica holds the same global copy
        for name in a["global"]:
            assert_close(b["global"][name], gpu[0]["global"][name], rtol=1e-5, atol=1e-6, msg=name)
