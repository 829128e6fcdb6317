"""Codecs: exact formats and ties, an independent NumPy reference, error bounds, sizes, edge cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from diloco.wire.codec import Codec, all_finite
from diloco.wire.registry import CODEC_NAMES, get_codec
from diloco.wire.scaled import BlockScaledCodec, FP4E2M1Codec, FP4E3M0Codec, Int8Codec

SCALED = ("fp8_e4m3", "int8", "fp4_e3m0", "fp4_e2m1")
FP4 = ("fp4_e3m0", "fp4_e2m1")
F32_MAX = float(np.finfo(np.float32).max)


def roundtrip(codec: Codec, x: torch.Tensor) -> torch.Tensor:
    return codec.decode(codec.encode(x), x.numel())


# -- the element formats, from their definitions -----------------------------------------------------
def e4m3_values() -> np.ndarray:
    """The 127 non-negative finite E4M3 ("fn") values in code order: bias 7, subnormals at exponent 0."""
    codes = np.arange(127)
    e, f = codes >> 3, codes & 7
    return np.where(e == 0, f * 2.0**-9, (1 + f / 8) * 2.0 ** (e - 7))


MAGNITUDES = {  # element magnitudes in code order; code = sign << 3 | index (4-bit) or the value (int8)
    "fp4_e3m0": np.array([0, 0.25, 0.5, 1, 2, 4, 8, 16]),
    "fp4_e2m1": np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6]),
    "int8": np.arange(128.0),
    "fp8_e4m3": e4m3_values(),
}
BOUND = {  # max |round(y) - y| for |y| <= m: half the gap of the cell holding y
    "fp4_e3m0": lambda y: np.maximum(0.125, np.abs(y) / 3),  # [2^j, 2^j+1]: worst at 1.5 * 2^j
    "fp4_e2m1": lambda y: np.maximum(0.25, np.abs(y) / 4),  # gaps 0.5 up to 2, 1 up to 4, 2 up to 6
    "int8": lambda y: np.full_like(y, 0.5),
    "fp8_e4m3": lambda y: np.maximum(2.0**-10, np.abs(y) / 16),  # 3 mantissa bits; subnormal step 2^-9
}


def error_bound(x: np.ndarray, name: str) -> np.ndarray:
    """Per-element error bound at the no-clip scale (scaled codecs), or the bf16 / fp32 rounding bound."""
    if name in ("fp32", "bf16"):
        return np.abs(x.astype(np.float64)) * (2.0**-8 if name == "bf16" else 0.0)
    k, up = reference_scales(x, name)
    s = np.repeat(e4m3_values()[up], get_codec(name).block_size)[: x.size] * 2.0**k
    return BOUND[name](x / s) * s


def nearest_even(y: np.ndarray, mags: np.ndarray) -> np.ndarray:
    """Round |y| to the nearest magnitude, ties to the even code, keeping y's sign (float64, brute force)."""
    d = np.abs(np.abs(y)[:, None] - mags[None, :])
    tied = d == d.min(axis=1, keepdims=True)
    even = tied & (np.arange(len(mags)) % 2 == 0)
    idx = np.where(even.any(axis=1), even.argmax(axis=1), tied.argmax(axis=1))
    return np.sign(y) * mags[idx]


def reference_scales(x: np.ndarray, name: str) -> tuple[int, np.ndarray]:
    """(k, s_up per block) straight from the definitions: the smallest k and the smallest E4M3 value."""
    codec = get_codec(name)
    m, B = float(MAGNITUDES[name][-1]), codec.block_size
    amax = float(np.abs(x).max()) if x.size else 0.0
    k = math.ceil(math.log2(amax / (448 * m))) if amax > 0 else -126
    k += (amax > 448 * m * 2.0**k) - (amax <= 448 * m * 2.0 ** (k - 1))  # fix log2 rounding
    k = min(max(k, -126), 126)
    blocks = np.pad(x.astype(np.float64) * 2.0**-k, (0, -x.size % B)).reshape(-1, B)
    up = np.searchsorted(e4m3_values() * m, np.abs(blocks).max(axis=1), side="left")
    return k, up


def reference_decode(x: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    """The spec of a scaled codec in NumPy: (decoded values, per block sorted candidate errors)."""
    codec = get_codec(name)
    mags, B = MAGNITUDES[name], codec.block_size
    m = float(mags[-1])
    k, up = reference_scales(x, name)
    a = np.pad(x * np.float32(2.0**-k), (0, -x.size % B)).reshape(-1, B).astype(np.float32)
    best, errs = None, []
    for i in range(codec.scale_candidates):
        s = e4m3_values()[np.maximum(up - i, np.minimum(up, 1))].astype(np.float32)[:, None]
        y = np.clip(a / np.where(s > 0, s, np.float32(1)), -m, m)  # float32 division: RNE like torch
        q = nearest_even(y.ravel().astype(np.float64), mags).reshape(y.shape) * s
        err = ((q - a.astype(np.float64)) ** 2).sum(axis=1)
        errs.append(err)
        best = q if best is None else np.where((err < np.min(errs[:-1], axis=0))[:, None], q, best)
    return (best.ravel()[: x.size] * 2.0**k), np.sort(np.stack(errs), axis=0)


# -- registry and sizes ----------------------------------------------------------------------------------
def test_registry_names_and_passthrough():
    assert CODEC_NAMES == ("fp32", "bf16", "fp8_e4m3", "int8", "fp4_e3m0", "fp4_e2m1")
    for name in CODEC_NAMES:
        assert get_codec(name).name == name
    custom = FP4E2M1Codec(block_size=32)
    assert get_codec(custom) is custom
    with pytest.raises(ValueError, match="fp4_e3m0.*fp4_e2m1"):
        get_codec("fp5")
    with pytest.raises(ValueError, match="valid names"):
        get_codec(3)  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 10**7))
def test_num_bytes_analytic(n):
    expected = {
        "fp32": 4 * n,
        "bf16": 2 * n,
        "fp8_e4m3": n + math.ceil(n / 32) + 1,  # codes, one E4M3 per block, one E8M0 per tensor
        "int8": n + math.ceil(n / 32) + 1,
        "fp4_e3m0": math.ceil(n / 2) + math.ceil(n / 16) + 1,  # two codes per byte
        "fp4_e2m1": math.ceil(n / 2) + math.ceil(n / 16) + 1,
    }
    assert {name: get_codec(name).num_bytes(n) for name in CODEC_NAMES} == expected


@pytest.mark.parametrize("name", CODEC_NAMES)
def test_bits_per_value_is_the_large_n_limit(name):
    codec = get_codec(name)
    n = 1 << 24
    assert abs(8 * codec.num_bytes(n) / n - codec.bits_per_value) < 1e-5
    assert codec.bits_per_value <= {"fp32": 32, "bf16": 16, "fp8_e4m3": 8.25, "int8": 8.25}.get(name, 4.5)


def test_fp4_really_packs_two_per_byte():
    for name in FP4:
        assert get_codec(name).num_bytes(1000) == 500 + 63 + 1
        assert get_codec(name).num_bytes(1000) * 7 < get_codec("fp32").num_bytes(1000)


@settings(max_examples=80, deadline=None)
@given(
    name=st.sampled_from(CODEC_NAMES), n=st.integers(0, 2100), dtype=st.sampled_from([torch.float32, torch.bfloat16])
)
def test_payload_size_depends_on_numel_only(name, n, dtype):
    codec = get_codec(name)
    x = torch.randn(n, generator=torch.Generator().manual_seed(n)).to(dtype) * 10.0 ** (n % 7 - 3)
    payload = codec.encode(x)
    assert payload.dtype == torch.uint8 and payload.shape == (codec.num_bytes(n),)
    out = codec.decode(payload, n)
    assert out.dtype == torch.float32 and out.shape == (n,)


# -- element formats and ties ------------------------------------------------------------------------------
def test_fp4_code_tables():
    codes = torch.arange(16, dtype=torch.uint8)
    for name in FP4:
        mags = torch.tensor(MAGNITUDES[name], dtype=torch.float32)
        assert torch.equal(get_codec(name).dequantize_elements(codes), torch.cat([mags, -mags]))
        assert torch.equal(
            get_codec(name).quantize_elements(torch.cat([mags, -mags[1:]])), torch.cat([codes[:8], codes[9:]])
        )
        assert get_codec(name).quantize_elements(torch.tensor([-0.0, -0.01])).tolist() == [0, 0]  # zero is +0


def test_e4m3_table_matches_definition():
    codec = get_codec("fp8_e4m3")
    values = codec.dequantize_elements(torch.arange(256, dtype=torch.uint8)).numpy()
    assert np.isnan(values[[0x7F, 0xFF]]).all()
    np.testing.assert_array_equal(values[:127], e4m3_values())
    np.testing.assert_array_equal(values[128:255], -e4m3_values())


@pytest.mark.parametrize(
    "name, ties, expected",
    [
        # E2M1 midpoints between codes (0,1) (1,2) ... (6,7): the even code wins.
        ("fp4_e2m1", [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], [0, 1, 1, 2, 2, 4, 4]),
        ("fp4_e3m0", [0.125, 0.375, 0.75, 1.5, 3.0, 6.0, 12.0], [0, 0.5, 0.5, 2, 2, 8, 8]),
        ("int8", [0.5, 1.5, 2.5, 125.5, 126.5], [0, 2, 2, 126, 126]),
        # E4M3: 1 + 2^-4 between 1 and 1.125 (even: 1); 1.1875 -> 1.25; subnormals 2^-10 -> 0, 3 * 2^-10 -> 2^-8.
        ("fp8_e4m3", [1 + 2**-4, 1.1875, 2**-10, 3 * 2**-10, 432.0], [1, 1.25, 0, 2**-8, 448]),
    ],
)
def test_ties_round_to_even(name, ties, expected):
    codec = get_codec(name)
    y = torch.tensor(ties + [-t for t in ties])
    out = codec.dequantize_elements(codec.quantize_elements(y))
    assert out.tolist() == expected + [-e for e in expected]
    # Just off the midpoint, plain nearest.
    above = codec.dequantize_elements(codec.quantize_elements(torch.tensor(ties) * (1 + 2**-20)))
    below = codec.dequantize_elements(codec.quantize_elements(torch.tensor(ties) * (1 - 2**-20)))
    assert (above >= torch.tensor(expected)).all() and (below <= torch.tensor(expected)).all()
    assert (above > below).all()


@pytest.mark.parametrize("name", FP4)
def test_fp4_bit_rounding_matches_brute_force_nearest_even(name):
    """The bit-level rounding against a float64 brute force: every midpoint, its fp32 neighbours,
    every representable magnitude and its neighbours, and 200k values over 2^-12 .. 2^12."""
    codec, mags = get_codec(name), MAGNITUDES[name]
    g = np.random.default_rng(3)
    special = np.concatenate([mags, (mags[1:] + mags[:-1]) / 2, [0.0, 1e-45, 1e30, 3.4e38]]).astype(np.float32)
    neighbours = np.concatenate([np.nextafter(special, np.float32(0)), np.nextafter(special, np.float32(np.inf))])
    spread = (2.0 ** g.uniform(-12, 12, 200_000)).astype(np.float32)
    y = np.concatenate([special, neighbours, spread]).astype(np.float32)
    got = codec.round_magnitudes(torch.from_numpy(y)).numpy()
    expected = nearest_even(np.minimum(y.astype(np.float64), mags[-1]), mags)  # saturate at m, then round
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(codec.magnitude_codes(torch.from_numpy(got)).numpy(), np.searchsorted(mags, got))


@pytest.mark.parametrize("name", FP4)
def test_ties_through_the_codec(name):
    """With the no-clip scale only, a block whose absmax is m has scale 1 and the ties above hold."""
    codec = FP4E2M1Codec(scale_candidates=1) if name == "fp4_e2m1" else FP4E3M0Codec(scale_candidates=1)
    mags = MAGNITUDES[name]
    mids = ((mags[1:] + mags[:-1]) / 2).tolist()
    x = torch.tensor([mags[-1]] + mids + [0.0] * (16 - 1 - len(mids)), dtype=torch.float32)
    expected = torch.tensor(nearest_even(x.double().numpy(), mags), dtype=torch.float32)
    assert torch.equal(roundtrip(codec, x), expected)


def test_bf16_matches_bit_level_round_to_nearest_even():
    x = torch.randn(20000, generator=torch.Generator().manual_seed(1)) * 10.0 ** torch.randint(-30, 30, (20000,))
    x = torch.cat([x, torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 1e-40])])
    bits = x.numpy().view(np.uint32).astype(np.uint64)
    ref = (((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)
    out = roundtrip(get_codec("bf16"), x).numpy()
    np.testing.assert_array_equal(out, ref)
    assert out[-4:-1].tolist() == [1.0, 1 + 2**-6, -1.0]


# -- the scaled codecs against the NumPy reference ---------------------------------------------------------
def sample(seed: int, n: int = 4000) -> np.ndarray:
    g = np.random.default_rng(seed)
    x = np.concatenate(
        [
            g.standard_normal(n // 2),
            g.standard_t(2.0, n // 2) * 1e-3,
            np.zeros(40),  # an all-zero block
            g.standard_normal(33) * 1e-4,  # a small-magnitude block, and a ragged tail
        ]
    )
    return x.astype(np.float32)


@pytest.mark.parametrize("name", SCALED)
@pytest.mark.parametrize("seed", [0, 1])
def test_scaled_codecs_match_reference(name, seed):
    x = sample(seed)
    ref, errs = reference_decode(x, name)
    payload = get_codec(name).encode(torch.from_numpy(x))
    assert payload[-1] == reference_scales(x, name)[0] + 127  # the E8M0 tensor scale byte, last
    out = get_codec(name).decode(payload, x.size).numpy().astype(np.float64)
    B = get_codec(name).block_size
    differ = np.unique(np.flatnonzero(out != ref) // B)
    # A block may differ only where two candidate scales tie to float32 summation precision.
    assert len(differ) <= 2
    for b in differ:
        assert errs[1, b] - errs[0, b] <= 1e-5 * errs[0, b]


@pytest.mark.parametrize("name, value, expected", [("fp4_e3m0", 3968.0, 4096.0), ("fp4_e2m1", 1488.0, 1536.0)])
def test_equal_error_candidates_keep_the_larger_scale(name, value, expected):
    """Tensor scale 1 (k = 0). Block scales 256 and 240 (adjacent E4M3 values) give the lone value
    the same error: m * 256 - v = v - m * 240 (v = m/2 * 496; the smaller saturates). 256 wins."""
    x = torch.tensor([value] + [0.0] * 15)
    assert roundtrip(get_codec(name), x).tolist() == [expected] + [0.0] * 15


@pytest.mark.parametrize("name", SCALED)
def test_tensor_scale_is_the_smallest_power_of_two_that_fits(name):
    top = 448 * float(MAGNITUDES[name][-1])  # largest E4M3 block scale times the element maximum
    for amax, k in [
        (top * 2.0**-20, -20),
        (top * 2.0**-20 * (1 + 2**-23), -19),
        (top * 2.0**-21 * (1 - 2**-24), -21),
        (2.0**-40, -40 - math.floor(math.log2(top))),
        (0.0, None),
    ]:
        payload = get_codec(name).encode(torch.tensor([0.5 * amax, -amax], dtype=torch.float32))
        if k is not None:
            assert int(payload[-1]) - 127 == k


@pytest.mark.parametrize("name", SCALED)
@pytest.mark.parametrize("dist", ["normal", "student_t3"])
def test_block_error_within_the_no_clip_bound(name, dist):
    """Each block's squared error is at most that of the no-clip scale s_up, whose per-element
    error is at most half the gap of the element format: |x - x^| <= bound(x / (s_up 2^k)) s_up 2^k."""
    codec = get_codec(name)
    g = np.random.default_rng(7)
    x = (g.standard_normal(1 << 14) if dist == "normal" else g.standard_t(3.0, 1 << 14)).astype(np.float32)
    bound = error_bound(x, name)
    err = roundtrip(codec, torch.from_numpy(x)).numpy().astype(np.float64) - x
    B = codec.block_size
    sse = (err**2).reshape(-1, B).sum(axis=1)
    assert (sse <= (bound**2).reshape(-1, B).sum(axis=1) * (1 + 1e-6)).all()
    assert np.linalg.norm(err) <= np.linalg.norm(bound)
    if codec.scale_candidates == 1:  # no saturating candidates: the bound holds element by element
        assert (np.abs(err) <= bound * (1 + 1e-6)).all()


def test_bf16_relative_error_per_element():
    x = torch.randn(1 << 14, generator=torch.Generator().manual_seed(3))
    assert ((roundtrip(get_codec("bf16"), x) - x).abs() <= x.abs() * 2.0**-8).all()


@pytest.mark.parametrize("name", FP4)
@pytest.mark.parametrize("scale", [1.0, 2.0**-20 * 1.375, 2.0**40 * 0.8125, 2.0**-110 * 1.5])
def test_fp4_representable_blocks_round_trip_exactly(name, scale):
    mags = MAGNITUDES[name].astype(np.float32)
    block = np.concatenate([mags, -mags[::-1]])  # absmax m: the block scale is exactly `scale`
    x = np.concatenate([block * scale, np.roll(block, 5) * scale * 2.0**-3]).astype(np.float32)
    assert torch.equal(roundtrip(get_codec(name), torch.from_numpy(x)), torch.from_numpy(x))


@pytest.mark.parametrize("name", SCALED)
@settings(max_examples=15, deadline=None)
@given(j=st.integers(-90, 90), seed=st.integers(0, 2**16))
def test_power_of_two_and_sign_equivariance(name, j, seed):
    codec = get_codec(name)
    x = torch.randn(300, generator=torch.Generator().manual_seed(seed))
    base = roundtrip(codec, x)
    assert torch.equal(roundtrip(codec, x * 2.0**j), base * 2.0**j)
    assert torch.equal(roundtrip(codec, -x), -base)


@pytest.mark.parametrize("name", CODEC_NAMES)
def test_fp32_is_bit_exact_and_others_are_not(name):
    x = torch.randn(1000, generator=torch.Generator().manual_seed(5))
    assert torch.equal(roundtrip(get_codec(name), x), x) == (name == "fp32")


# -- zeros, huge, tiny, non-finite -----------------------------------------------------------------------
@pytest.mark.parametrize("name", CODEC_NAMES)
@pytest.mark.parametrize("n", [0, 1, 17, 1000])
def test_zeros_round_trip(name, n):
    out = roundtrip(get_codec(name), torch.zeros(n))
    assert torch.equal(out, torch.zeros(n))


@pytest.mark.parametrize("name", CODEC_NAMES)
@pytest.mark.parametrize("magnitude", [1e30, 1e-30])
def test_huge_and_tiny_values_keep_their_relative_error(name, magnitude):
    codec = get_codec(name)
    x = (torch.randn(100, generator=torch.Generator().manual_seed(2)) * magnitude).numpy()
    err = roundtrip(codec, torch.from_numpy(x)).numpy().astype(np.float64) - x
    assert np.isfinite(err).all()
    assert np.linalg.norm(err) <= np.linalg.norm(error_bound(x, name)) * (1 + 1e-6)


@pytest.mark.parametrize("name", CODEC_NAMES)
def test_values_near_the_float32_max_never_become_inf(name):
    codec = get_codec(name)
    out = roundtrip(codec, torch.tensor([F32_MAX, -F32_MAX, F32_MAX * 0.999, 1.0]))
    assert torch.isfinite(out).all() and (out[:3].abs() >= 0.6 * F32_MAX).all()
    assert roundtrip(codec, torch.tensor([1e300, -1e300], dtype=torch.float64)).isfinite().all()


@pytest.mark.parametrize("name", CODEC_NAMES)
def test_subnormal_inputs_stay_finite_and_tiny(name):
    out = roundtrip(get_codec(name), torch.tensor([1e-40, -3e-42, 0.0]))
    assert torch.isfinite(out).all() and (out.abs() <= 2e-40).all()


@pytest.mark.parametrize("name", SCALED)
def test_values_far_below_the_block_scale_flush_to_zero(name):
    x = torch.tensor([1.0] + [1e-7] * 15)  # 1e-7 is below half the smallest nonzero step of every format
    out = roundtrip(get_codec(name), x)
    assert torch.equal(out[1:], torch.zeros(15)) and out[0] > 0.8


@pytest.mark.parametrize("name", CODEC_NAMES)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("n, where", [(1, 0), (33, 32), (1000, 500), (1000, 0)])
def test_non_finite_input_decodes_all_nan(name, bad, n, where):
    codec = get_codec(name)
    x = torch.randn(n, generator=torch.Generator().manual_seed(n))
    x[where] = bad
    for xx in (x, x.to(torch.float16)):
        payload = codec.encode(xx)
        assert payload.shape == (codec.num_bytes(n),)
        assert codec.decode(payload, n).isnan().all()


# -- inputs, determinism, validation -------------------------------------------------------------------
@pytest.mark.parametrize("name", CODEC_NAMES)
def test_low_precision_inputs_are_accepted(name):
    codec = get_codec(name)
    x = torch.randn(999, generator=torch.Generator().manual_seed(6))
    for dtype in (torch.bfloat16, torch.float16, torch.float64):
        xd = x.to(dtype)
        assert torch.equal(codec.encode(xd), codec.encode(xd.float()))


@pytest.mark.parametrize("name", CODEC_NAMES)
def test_deterministic_and_layout_independent(name):
    codec = get_codec(name)
    x = torch.randn(2, 4001, generator=torch.Generator().manual_seed(8))
    strided = x.t()[:, 0]  # a non-contiguous 1-D view
    p1, p2, p3 = codec.encode(x[0]), codec.encode(x[0].clone()), codec.encode(strided)
    assert torch.equal(p1, p2) and torch.equal(p3, codec.encode(strided.contiguous()))


@pytest.mark.parametrize("name", CODEC_NAMES)
def test_outputs_never_alias_inputs(name):
    codec = get_codec(name)
    x = torch.randn(64)
    keep = x.clone()
    payload = codec.encode(x)
    payload.zero_()
    assert torch.equal(x, keep)
    payload = codec.encode(x)
    out = codec.decode(payload, 64)
    before = out.clone()
    out.add_(1.0)  # the reducer sums into the first decoded contribution in place
    assert torch.equal(codec.decode(payload, 64), before)


@pytest.mark.parametrize("name", CODEC_NAMES)
def test_user_errors_raise_value_error(name):
    codec = get_codec(name)
    with pytest.raises(ValueError, match="1-D floating"):
        codec.encode(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="1-D floating"):
        codec.encode(torch.zeros(3, dtype=torch.int64))
    payload = codec.encode(torch.randn(10))
    with pytest.raises(ValueError, match="num_bytes"):
        codec.decode(payload, 11)
    with pytest.raises(ValueError, match="num_bytes"):
        codec.decode(payload.to(torch.int16), 10)
    with pytest.raises(ValueError, match="non-negative"):
        codec.num_bytes(-1)


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match="block_size"):
        Int8Codec(block_size=7)
    with pytest.raises(ValueError, match="scale_candidates"):
        FP4E3M0Codec(scale_candidates=0)
    assert isinstance(FP4E3M0Codec(block_size=32), BlockScaledCodec)
    assert FP4E3M0Codec(block_size=32).bits_per_value == 4.25


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_all_finite_agrees_with_isfinite(dtype):
    g = torch.Generator().manual_seed(11)
    for trial in range(40):
        x = torch.randn(1 + trial * 97, generator=g) * 10.0 ** torch.randint(-40, 38, (1,), generator=g)
        x[::13] = torch.finfo(torch.float32).max * (trial % 2 * 2 - 1)  # the largest finite values
        x[1::17] = 1e-45  # subnormal
        if trial % 3:
            x[int(torch.randint(0, x.numel(), (1,), generator=g))] = [float("nan"), float("inf"), -float("inf")][
                trial % 3
            ]
        x = x.to(dtype)
        for view in (x, x[::2], x.view(-1, 1).expand(-1, 2).t()[0]):  # contiguous, strided, expanded
            assert bool(all_finite(view)) == bool(torch.isfinite(view).all()), (trial, dtype)
    assert bool(all_finite(torch.zeros(0)))


@pytest.mark.parametrize("native_on", ["1", "0"])
def test_all_finite_finds_a_non_finite_value_anywhere(native_on, monkeypatch):
    # CPU fp32: one pass of the C loops split across threads, or (C loops off) chunks into one kept buffer; a NaN or
    # inf at either end, on either side of a chunk or thread boundary, is found
    monkeypatch.setenv("DILOCO_NATIVE_CODECS", native_on)
    chunk = 1 << 18  # diloco.wire.codec.CHUNK
    n = 3 * chunk + 5
    x = torch.randn(n, generator=torch.Generator().manual_seed(3))
    x[7] = torch.finfo(torch.float32).max
    assert bool(all_finite(x))
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        for at in (0, 1, chunk - 1, chunk, 2 * chunk - 1, 2 * chunk, n // 3, n // 3 + 1, n - 2, n - 1):
            for bad in (float("nan"), float("inf"), -float("inf")):
                y = x.clone()
                y[at] = bad
                assert not bool(all_finite(y)), (at, bad)
                assert not bool(all_finite(y[at:])) and bool(all_finite(y[at + 1 :])), (at, bad)
    finally:
        torch.set_num_threads(before)
