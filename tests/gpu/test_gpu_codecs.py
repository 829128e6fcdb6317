"""Every codec encodes a CUDA tensor to the very bytes it encodes the same values to on the CPU, and
decodes them to the same values (the payload stays on the GPU)."""

from __future__ import annotations

import pytest
import torch
from _gpu import requires_cuda

from diloco.wire.registry import CODEC_NAMES, get_codec

pytestmark = [requires_cuda, pytest.mark.timeout(120)]


def _values() -> torch.Tensor:
    """Gaussian values over five decades, a zero block, a block of one huge value, a ragged tail."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1 << 16, generator=g) * torch.logspace(-3, 2, 1 << 16)
    x[64:96] = 0.0
    x[96:128] = 0.0
    x[100] = 3.0e4
    return torch.cat([x, torch.randn(37, generator=g)])


@pytest.mark.parametrize("name", CODEC_NAMES)
def test_codec_on_cuda_equals_the_cpu_encoding(name):
    codec = get_codec(name)
    x = _values()
    cpu = codec.encode(x)
    gpu = codec.encode(x.cuda())
    assert gpu.device.type == "cuda" and gpu.dtype == cpu.dtype and gpu.shape == cpu.shape
    differ = (gpu.cpu() != cpu).sum().item()
    assert differ == 0, f"{name}: {differ} of {cpu.numel()} payload bytes differ between CUDA and CPU"
    assert torch.equal(codec.decode(gpu, x.numel()).cpu(), codec.decode(cpu, x.numel()))


@pytest.mark.parametrize("name", CODEC_NAMES)
def test_non_finite_input_on_cuda_is_flagged_as_on_cpu(name):
    codec = get_codec(name)
    x = _values()
    x[5] = float("nan")
    assert torch.equal(codec.encode(x.cuda()).cpu(), codec.encode(x))
