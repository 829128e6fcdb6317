"""The FP4 codecs' Triton kernels (diloco.wire.triton_fp4) on a CUDA GPU: the reference's bytes and bits on large
tensors, and the compiled code free of what would change them (an approximate division, a fused multiply-add, a
flush of subnormals to zero). tests/unit/test_codec_triton.py checks the same kernels in Triton's interpreter on
the CPU; what only a GPU can check is here."""

from __future__ import annotations

import re

import pytest
import torch
from _gpu import requires_cuda

from diloco.wire import triton_codecs
from diloco.wire.registry import get_codec

pytestmark = [requires_cuda, pytest.mark.timeout(300)]
triton = pytest.importorskip("triton")

FP4 = ("fp4_e2m1", "fp4_e3m0")


def _cases() -> list[tuple[str, torch.Tensor]]:
    """Large tensors (CPU): five decades, every scale from 1e-38 to 1e36 (subnormal scaled values at both ends),
    the dispatch's awkward values repeated (rounding ties at every block scale), a ragged tail, non-finite."""
    g = torch.Generator().manual_seed(0)
    n = (1 << 22) + 37
    cases = [("five decades", torch.randn(n, generator=g) * torch.logspace(-3, 2, n))]
    for scale in (1e-38, 1e-6, 1e36):
        x = torch.randn(n, generator=g) * scale
        x[::1001] *= 1e-6  # blocks far below the tensor's absmax: subnormal block scales
        cases.append((f"scale {scale}", x))
    cases.append(("tiny and huge blocks", torch.randn(n, generator=g) * torch.logspace(-30, 30, n)))
    cases.append(("check values", triton_codecs.check_values().repeat(257)))
    cases.append(("subnormals", torch.randn(1 << 16, generator=g) * 1e-42))
    for bad in (float("nan"), float("inf")):
        x = torch.randn(n, generator=g)
        x[n // 3] = bad
        cases.append((f"non-finite {bad}", x))
    return cases


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype == torch.uint8:
        return torch.equal(a, b)
    return bool(((a.view(torch.int32) == b.view(torch.int32)) | (a.isnan() & b.isnan())).all())


@pytest.mark.parametrize("name", FP4)
def test_the_kernels_give_the_reference_bytes_on_large_tensors(name):
    codec = get_codec(name)
    for label, x in _cases():
        xc = x.cuda()
        ref = codec.encode_reference(xc)
        got = triton_codecs.encode(codec, xc)
        differ = (got != ref).sum().item()
        assert differ == 0, f"{name} {label}: {differ} of {ref.numel()} payload bytes differ from the reference"
        if x.numel() < (1 << 20):  # the CUDA reference is the CPU's too (test_gpu_codecs checks the rest)
            assert torch.equal(got.cpu(), codec.encode_reference(x)), f"{name} {label}: not the CPU's bytes"
        n = x.numel()
        want = codec.decode_reference(ref, n)
        assert _same(triton_codecs.decode(codec, ref, n), want), f"{name} {label}: decode"
        out = torch.full((n,), 7.0, device="cuda")
        assert _same(triton_codecs.decode(codec, ref, n, out), want), f"{name} {label}: decode into"


@pytest.mark.parametrize("name", FP4)
def test_any_payload_decodes_to_the_reference_bits_on_cuda(name):
    codec = get_codec(name)
    g = torch.Generator().manual_seed(5)
    for n in (16, 17, (1 << 20) + 33):
        for t in (0, 100, 127, 200, 254, 255):
            payload = torch.randint(0, 256, (codec.num_bytes(n),), dtype=torch.uint8, generator=g).cuda()
            payload[-1] = t
            assert _same(triton_codecs.decode(codec, payload, n), codec.decode_reference(payload, n)), f"n={n} t={t}"


@pytest.mark.parametrize("name", FP4)
def test_the_codecs_take_the_kernels_on_cuda(name):
    codec = get_codec(name)
    x = torch.randn(4099, device="cuda")
    assert triton_codecs.usable(codec, x), "the kernels failed their check against the reference (see the log)"
    payload = codec.encode(x)
    assert torch.equal(payload, codec.encode_reference(x))
    want = codec.decode_reference(payload, x.numel())
    assert _same(codec.decode(payload, x.numel()), want)
    assert _same(codec.decode_into(payload, x.numel(), torch.empty_like(x)), want)


def test_the_compiled_kernels_divide_exactly_and_fuse_nothing():
    # IEEE division (div.rn, not div.approx / div.full), no fma on floats, no flush to zero anywhere
    from diloco.wire import triton_fp4

    codec = get_codec("fp4_e2m1")
    x = torch.randn(1 << 16, device="cuda")
    payload = torch.empty(codec.num_bytes(x.numel()), dtype=torch.uint8, device="cuda")
    first, second = triton_fp4.encode(x, payload, fmt=0, elem_max=6.0, top=codec._top, j0=codec._j0)
    third = triton_fp4.decode(payload, x.numel(), torch.empty_like(x), fmt=0)
    for kernel in (first, second, third):
        ptx = kernel.asm["ptx"]
        bad = [line.strip() for line in ptx.splitlines() if re.search(r"\bfma\.|\bdiv\.(approx|full)|\.ftz\b", line)]
        assert not bad, f"{getattr(kernel, 'name', kernel)}: {bad[:5]}"
    assert "div.rn.f32" in second.asm["ptx"]
