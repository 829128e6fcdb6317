"""The chunked CPU paths of the codecs give the reference's payload bit for bit, and decode to the same bits.

Equality: the same bytes for payloads; for decoded values the same bit patterns, any NaN equal to any NaN
(torch's own NaN payloads depend on which values its vectorised loops leave to their scalar tails, so the
reference's differ with the thread split: only where the NaNs are is part of the format).
"""

from __future__ import annotations

import pytest
import torch

from diloco.wire import native
from diloco.wire.codec import CHUNK, Codec, use_chunks
from diloco.wire.registry import CODEC_NAMES, get_codec

CHUNKED = ("bf16", "fp8_e4m3", "int8", "fp4_e3m0", "fp4_e2m1", "stat2", "stat4")
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype == torch.uint8:
        return a.shape == b.shape and torch.equal(a, b)
    return a.shape == b.shape and bool(((a.view(torch.int32) == b.view(torch.int32)) | (a.isnan() & b.isnan())).all())


def inputs(n: int, seed: int, device: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    normal = torch.randn(n, generator=g)
    out = {
        "normal": normal,
        "heavy": torch.distributions.StudentT(torch.tensor(1.2)).sample((n,)),  # Cauchy-like tails
        "zeros": torch.zeros(n),
        "neg_zeros": -torch.zeros(n),
        "ties": (normal * 4).round() / 4,  # many exact ties between codes and between scale candidates
        "tiny": normal * 1e-42,  # fp32 subnormals
        "huge": normal * 3e38,
        "mixed_scales": normal * torch.logspace(-30, 30, n).flip(0),
        "constant": torch.full((n,), 0.3),
    }
    nan, inf = normal.clone(), normal.clone()
    nan[n // 3] = float("nan")
    inf[-1] = float("-inf")
    out.update(nan=nan, inf=inf)
    return {k: v.to(device) for k, v in out.items()}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", CHUNKED)
@pytest.mark.parametrize("n", [1, 33, 1023, 2 * 1024 + 7, 5001])
def test_chunked_encode_and_decode_are_bit_identical_to_the_reference(name, n, device):
    codec = get_codec(name)
    for seed in range(1):
        for kind, x in inputs(n, seed, device).items():
            ref = codec.encode_reference(x)
            decoded = codec.decode_reference(ref, n)
            for chunk in (64, 2048):  # several chunks, a partial last one, and the last block partial
                got = codec.encode(x, chunk=chunk)
                assert same_bits(got, ref), (name, n, kind, chunk, "encode")
                assert same_bits(codec.decode(ref, n, chunk=chunk), decoded), (name, n, kind, chunk, "decode")


@pytest.mark.parametrize("name", CHUNKED)
def test_default_path_above_one_chunk_is_chunked_and_identical(name):
    n = CHUNK + CHUNK // 2 + 5
    x = torch.randn(n, generator=torch.Generator().manual_seed(3)) * 1e-3
    codec = get_codec(name)
    assert use_chunks(x, None) and type(codec)._encode_chunked is not Codec._encode_chunked
    assert codec.chunked_decode == (name not in ("int8", "fp8_e4m3"))  # one cast: the reference is faster
    payload = codec.encode(x)
    assert same_bits(payload, codec.encode_reference(x))
    assert same_bits(codec.decode(payload, n), codec.decode_reference(payload, n))


def test_small_tensors_and_other_devices_take_the_reference():
    assert not use_chunks(torch.zeros(CHUNK), None)
    assert use_chunks(torch.zeros(CHUNK + 1), None)
    assert use_chunks(torch.zeros(3), 64)
    assert not use_chunks(torch.zeros(CHUNK + 1, device="meta"), None)


@pytest.mark.parametrize("name", CHUNKED)
def test_the_comparison_can_fail(name):
    # the equality above is not vacuous: one changed value changes the payload and the decoded values
    codec = get_codec(name)
    x = torch.randn(3000, generator=torch.Generator().manual_seed(2))
    y = x.clone()
    y[1500] = -4 * y[1500]
    assert not same_bits(codec.encode(x, chunk=64), codec.encode_reference(y))
    px, py = codec.encode_reference(x), codec.encode_reference(y)
    assert not same_bits(codec.decode(px, 3000, chunk=64), codec.decode_reference(py, 3000))


@pytest.mark.parametrize("name", CODEC_NAMES + ("stat2", "stat4", "topk"))
def test_every_codec_still_round_trips_through_encode_and_decode(name):
    codec = get_codec(name)
    x = torch.randn(CHUNK + 100, generator=torch.Generator().manual_seed(1))
    y = codec.decode(codec.encode(x), x.numel())
    assert y.shape == x.shape and y.dtype == torch.float32 and bool(torch.isfinite(y).all())


@pytest.mark.parametrize("name", [*CODEC_NAMES, "stat2", "topk"])
@pytest.mark.parametrize("numel", [2 * CHUNK + 16 * 37, 2 * CHUNK + 5, 1000])
def test_decode_into_a_buffer_gives_the_bits_of_decode(name, numel):
    codec = get_codec(name)
    x = torch.randn(numel, generator=torch.Generator().manual_seed(numel)).mul_(1e-2)
    x[7] = 40.0  # a large value: the block scales are not all equal
    payload = codec.encode(x)
    buffer = torch.full((numel,), 123.0)
    got = codec.decode_into(payload, numel, buffer)
    assert torch.equal(got.view(torch.int32), codec.decode(payload, numel).view(torch.int32))
    # the codecs with an in-place path write into the buffer (int8 and the 4-bit ones through the C loops; without
    # them, the 4-bit ones on their chunked path with whole blocks)
    in_native = native.usable(payload) and name in ("int8", "fp4_e2m1", "fp4_e3m0")
    in_place = (
        name in ("fp32", "bf16")
        or in_native
        or (name.startswith("fp4") and numel % 16 == 0 and use_chunks(payload, None))
    )
    assert (got is buffer) == in_place, name
    # a payload at an odd offset of a larger buffer decodes the same
    shifted = torch.cat([torch.zeros(1, dtype=torch.uint8), payload])[1:]
    assert torch.equal(codec.decode_into(shifted, numel, torch.empty(numel)).view(torch.int32), got.view(torch.int32))
