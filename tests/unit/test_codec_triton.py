"""The FP4 codecs' Triton kernels (diloco.wire.triton_fp4) give the torch reference's bytes and bits, run in Triton's
interpreter on the CPU (numpy: IEEE fp32, no fused multiply-add). That checks the algorithm, not the GPU lowering
(the IEEE division, no FMA, no flush to zero): tests/gpu/test_gpu_triton_codecs.py does that on a GPU."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch
from test_codec_native import CASES, same_bits

from diloco.wire import triton_codecs
from diloco.wire.registry import get_codec

# numpy says so where a decoded value overflows before the clamp to fp32's max (as the reference's does)
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")

FP4 = ("fp4_e2m1", "fp4_e3m0")
#: The native tests' inputs at interpreter sizes (up to 16K values each; of their normals at five scales the
#: lengths 1, 16, 17 and 1001: one value, one whole block, a partial block, several), the order-sensitive blocks,
#: blocks of one tie and blocks of every scale among them (tests/_codec_cases.py).
SMALL = [
    (label, x)
    for label, x in CASES
    if x.numel() <= 16384 and not (label.startswith("normal n=") and x.numel() not in (1, 16, 17, 1001))
]
PARTS = 4


@pytest.fixture(scope="module")
def interpreted():
    """A fresh copy of diloco.wire.triton_fp4 whose kernels run in Triton's interpreter. TRITON_INTERPRET is read
    when ``@triton.jit`` runs, so the module is loaded anew with it set, whatever imported it before; and while the
    kernels run (the interpreter's patches of ``triton.language`` read it too), so it stays set for this module."""
    pytest.importorskip("triton")
    mp = pytest.MonkeyPatch()
    mp.setenv("TRITON_INTERPRET", "1")
    try:
        spec = importlib.util.find_spec("diloco.wire.triton_fp4")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        assert sys.modules.get("diloco.wire.triton_fp4") is not mod
        # the interpreter's time goes by program (about 0.1 s each, whatever its size): the blocks of a
        # few-thousand-value case in one program (the lanes are independent; the test of several programs stays)
        mod.ROWS = 1024
        yield mod
    finally:
        mp.undo()


@pytest.mark.parametrize("part", range(PARTS))
@pytest.mark.parametrize("name", FP4)
def test_the_kernels_give_the_reference_bytes_and_bits(name, part, interpreted):
    codec = get_codec(name)
    for i, (label, x) in enumerate(SMALL[part::PARTS]):
        n = x.numel()
        x32 = codec._as_float32(x)
        ref = codec.encode_reference(x)
        assert same_bits(triton_codecs.encode(codec, x32, mod=interpreted), ref), f"{name} encode: {label}"
        want = codec.decode_reference(ref, n)
        assert same_bits(triton_codecs.decode(codec, ref, n, mod=interpreted), want), f"{name} decode: {label}"
        if i % 3 == 0:  # decoding into a given tensor: the same kernel, so on every third case (each costs a program)
            out = torch.full((n,), 7.0)
            got = triton_codecs.decode(codec, ref, n, out, mod=interpreted)
            assert got is out and same_bits(out, want), f"{name} decode into: {label}"


@pytest.mark.parametrize("name", FP4)
def test_the_kernels_on_the_check_values_and_several_programs(name, interpreted):
    # the values the dispatch checks a GPU with, and a tensor of several programs' worth with a ragged tail
    codec = get_codec(name)
    g = torch.Generator().manual_seed(1)
    n = 2 * interpreted.ROWS * 16 + 21
    big = torch.randn(n, generator=g) * torch.logspace(-8, 8, n)
    for x in (triton_codecs.check_values(), big):
        ref = codec.encode_reference(x)
        assert same_bits(triton_codecs.encode(codec, x, mod=interpreted), ref)
        assert same_bits(
            triton_codecs.decode(codec, ref, x.numel(), mod=interpreted), codec.decode_reference(ref, x.numel())
        )


@pytest.mark.parametrize("name", FP4)
def test_any_payload_decodes_to_the_reference_bits(name, interpreted):
    # arbitrary bytes: every code (8 is -0), NaN and subnormal block scales, tensor scales up to E8M0's NaN
    codec = get_codec(name)
    g = torch.Generator().manual_seed(5)
    for n in (16, 17, 2048 + 33):
        for t in (0, 100, 127, 200, 254, 255):
            payload = torch.randint(0, 256, (codec.num_bytes(n),), dtype=torch.uint8, generator=g)
            payload[-1] = t
            want = codec.decode_reference(payload, n)
            assert same_bits(triton_codecs.decode(codec, payload, n, mod=interpreted), want), f"n={n} t={t}"


def test_the_tensor_exponent_from_the_bits(interpreted):
    # absmax over every binade (normal and subnormal), zero, and values on both sides of 448 * m * 2^k
    codec_e2m1, codec_e3m0 = get_codec("fp4_e2m1"), get_codec("fp4_e3m0")
    for codec in (codec_e2m1, codec_e3m0):
        for amax in (0.0, 1e-45, 1e-40, 1.17e-38, 2.0**-120, 1.0, codec._top, codec._top * (1 + 2**-23), 3.4e38):
            x = torch.tensor([amax, 0.5 * amax], dtype=torch.float32)
            payload = triton_codecs.encode(codec, x, mod=interpreted)
            assert int(payload[-1]) == int(codec.encode_reference(x)[-1]), f"{codec.name} amax={amax}"


def test_only_the_default_fp4_codecs_on_cuda_take_the_kernels(monkeypatch):
    from diloco.wire.scaled import FP4E2M1Codec, FP4E3M0Codec

    assert triton_codecs.element_format(FP4E2M1Codec()) == 0
    assert triton_codecs.element_format(FP4E3M0Codec()) == 1
    assert triton_codecs.element_format(FP4E2M1Codec(block_size=32)) is None
    assert triton_codecs.element_format(FP4E3M0Codec(scale_candidates=1)) is None
    assert triton_codecs.element_format(get_codec("int8")) is None
    assert not triton_codecs.usable(FP4E2M1Codec(), torch.zeros(4))  # a CPU tensor
    monkeypatch.delenv("DILOCO_NATIVE_CODECS", raising=False)  # (the suite may run with the C loops off)
    monkeypatch.delenv(triton_codecs.ENV_SWITCH, raising=False)
    assert triton_codecs.enabled()
    monkeypatch.setenv(triton_codecs.ENV_SWITCH, "0")
    assert not triton_codecs.enabled()
    monkeypatch.setenv(triton_codecs.ENV_SWITCH, "1")
    monkeypatch.setenv("DILOCO_NATIVE_CODECS", "0")
    assert not triton_codecs.enabled()


def test_the_codecs_call_the_kernels_where_usable(monkeypatch, interpreted):
    # the dispatch in scaled.py: with the C loops off and the kernels declared usable (as on CUDA), encode, decode
    # and decode_into go through them, with the reference's bytes and bits
    from diloco.wire import native

    calls = []
    monkeypatch.setattr(native, "usable", lambda t: False)
    monkeypatch.setattr(triton_codecs, "usable", lambda codec, t: triton_codecs.element_format(codec) is not None)
    monkeypatch.setattr(triton_codecs, "kernels", lambda: calls.append(1) or interpreted)
    x = torch.randn(1001, generator=torch.Generator().manual_seed(3))
    for name in FP4:
        codec = get_codec(name)
        payload = codec.encode(x)
        assert same_bits(payload, codec.encode_reference(x))
        want = codec.decode_reference(payload, 1001)
        assert same_bits(codec.decode(payload, 1001), want)
        assert same_bits(codec.decode_into(payload, 1001, torch.full((1001,), 7.0)), want)
    assert len(calls) == 6
    other = get_codec("int8")  # no kernels: the torch code
    assert same_bits(other.encode(x), other.encode_reference(x)) and len(calls) == 6


def test_without_triton_the_kernels_are_none_and_the_codecs_run_their_torch_code(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)  # import triton raises ImportError
    monkeypatch.delitem(sys.modules, "diloco.wire.triton_fp4", raising=False)
    triton_codecs.kernels.cache_clear()
    try:
        assert triton_codecs.kernels() is None
    finally:
        triton_codecs.kernels.cache_clear()
    x = torch.randn(100)
    codec = get_codec("fp4_e3m0")
    assert same_bits(codec.encode(x), codec.encode_reference(x))
