"""The block-scaled wire formats: fp8_e4m3, int8 and the 4-bit fp4_e3m0, fp4_e2m1.

E3M0 magnitudes. With an IEEE-style bias of 3 and no codes reserved for
inf/NaN (as in Agrawal et al.'s exmy family), the eight magnitude codes are
0, 2^-2, 2^-1, 1, 2, 4, 8, 16: a zero and seven powers of two.

Two-level scaling (the scaled codecs: fp8_e4m3, int8, fp4_*). Let ``m`` be the
element format's largest magnitude (448, 127, 16, 6):

* one power-of-two tensor scale ``2^k``, stored as an E8M0 byte (k + 127), the
  smallest k with ``absmax(x) <= 448 * m * 2^k``: the largest block scale then
  lies in (224, 448], the top binade of E4M3;
* one E4M3 scale ``s_b`` per block of B elements (B = 16 for 4-bit, 32 for
  8-bit). Its candidates are ``s_up``, the smallest E4M3 value with
  ``s_up * m * 2^k >= absmax(block)`` (the block absmax maps to at most ``m``:
  nothing clipped), and the next ``c - 1`` E4M3 values below it (these saturate
  the block's largest elements to ``+-m`` but may round the rest better); the
  block keeps the candidate with the least squared error, the larger on ties.
  c = 4 for the 4-bit formats, 2 for fp8, 1 for int8 (where it gains nothing);
* element ``q = round(clamp(x / (s_b * 2^k), -m, m))``; decode ``q * s_b * 2^k``.

Power-of-two tensor scaling is exact, so a block of values representable at
``s_up`` round-trips bit-exactly, and scaling x by a power of two scales the
decoded values by exactly the same power. Why this scaling (measured by
``benchmarks/codecs.py``, relative L2 error on 1M N(0, 1) values): an E4M3
block scale (as in NVFP4) maps each block's absmax near the top of the element
range where OCP MX's power-of-two E8M0 scale wastes up to a binade, and the
candidate search picks the scale that rounds the block best. fp4_e2m1: 0.087
here against 0.115 for OCP MXFP4 (block 32, E8M0, 4.25 bits); fp4_e3m0: 0.150
against 0.222. At block 32 (4.25 bits) the same scheme gives 0.094 / 0.164;
block 16 spends the rest of the 4.5-bit budget. docs/explanations/codecs.md has the tables.

Range. The tensor scale spans fp32's whole exponent range, so huge finite
values (up to fp32's max) are scaled, not saturated; decoded values are
clamped to +-fp32 max (a rounded-up block absmax can otherwise overshoot it).
bf16 saturates at +-(2 - 2^-7) * 2^127 instead of rounding to inf. Tiny
values: an element below half the smallest nonzero magnitude at its block's
scale decodes to 0 (E2M1: 0.25 * scale, E3M0: 0.125 * scale, int8: 0.5 *
scale, E4M3: 2^-10 * scale). Block scales are relative to the tensor's: a
block whose absmax is below about 2^-14 of the tensor absmax gets a subnormal
E4M3 scale (coarser, still never clipping), and one below about 2^-22 (E2M1),
2^-25 (E3M0, int8) or 2^-36 (E4M3) of it decodes to zero. A tensor whose absmax
is below about 2^-110 gets the smallest tensor scale 2^-126 and degrades the
same way.

Payload layout of the scaled codecs: ``[element codes][block scales][tensor
scale]`` with ``ceil(numel * bits / 8)``, ``ceil(numel / B)`` and 1 bytes.
4-bit codes are packed two per byte, element ``2i`` in the low nibble; a code
is ``sign << 3 | magnitude_code``.
"""

from __future__ import annotations

import abc
import math

import torch

from diloco.errors import ConfigError
from diloco.wire import native, sizes, triton_codecs
from diloco.wire.codec import CHUNK, Codec, halves_sum, row_chunks, use_chunks
from diloco.wire.native import blocks as native_blocks

_F32_MAX = torch.finfo(torch.float32).max
_E4M3 = torch.float8_e4m3fn
_E4M3_MAX = torch.finfo(_E4M3).max  # 448
_E4M3_NAN = 0x7F  # positive NaN code of E4M3 "fn"
_E8M0_BIAS, _E8M0_NAN = 127, 0xFF
_K_MIN, _K_MAX = -126, 126  # tensor exponents for which 2^k and 2^-k are normal fp32


def _pow2(k: torch.Tensor) -> torch.Tensor:
    """2^k as fp32, built from its bits (exact); k is an int tensor in [-126, 127]."""
    return ((k.to(torch.int32) + 127) << 23).view(torch.float32)


class BlockScaledCodec(Codec):
    """Elements in a small format, two-level scaled: an E8M0 power-of-two per tensor, an E4M3 per block.

    Subclasses give the element format: its bit width, its largest magnitude
    and the (vectorised) maps between scaled values and codes.
    """

    element_bits: int  # 4 or 8
    element_max: float  # largest magnitude of the element format (m in the module docstring)

    def __init__(self, *, block_size: int, scale_candidates: int) -> None:
        if block_size < 2 or block_size % 2:
            raise ConfigError(f"block_size must be an even integer >= 2, got {block_size}")
        if not 1 <= scale_candidates <= 8:
            raise ConfigError(f"scale_candidates must lie in 1..8 (one E4M3 binade), got {scale_candidates}")
        self.block_size = block_size
        self.scale_candidates = scale_candidates
        self.bits_per_value = self.element_bits + 8 / block_size
        # 2^(j0 - 1) <= L < 2^j0 for the top of the scale range L = 448 * m (see _tensor_exponent).
        self._top = _E4M3_MAX * self.element_max
        self._j0 = math.frexp(self._top)[1]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(block_size={self.block_size}, scale_candidates={self.scale_candidates})"

    def quantize_elements(self, y: torch.Tensor) -> torch.Tensor:
        """fp32 values with |y| <= element_max -> uint8 codes (one per element), nearest, ties to even.

        The encoder's own rounding (:meth:`_round_into`, :meth:`_signed_codes`) on unscaled values:
        what tests and the codec benchmark check the element formats with.
        """
        x = y.to(torch.float32).reshape(1, -1)
        v = self._round_into(x.abs(), torch.empty_like(x, dtype=torch.int32))
        scratch = (torch.empty_like(x, dtype=torch.int32), torch.empty_like(x, dtype=torch.int32))
        return self._signed_codes(v, x, *scratch).reshape(y.shape)

    @abc.abstractmethod
    def dequantize_elements(self, codes: torch.Tensor) -> torch.Tensor:
        """uint8 codes -> their fp32 element values."""

    def num_bytes(self, numel: int) -> int:
        return sizes.block_scaled_bytes(numel, element_bits=self.element_bits, block_size=self.block_size)

    def _tensor_exponent(self, amax: torch.Tensor) -> torch.Tensor:
        """Smallest k with amax <= 448 * m * 2^k, clamped to [-126, 126]; exact (no log2 rounding).

        With amax = f * 2^e (f in [0.5, 1)) the condition is f * 2^(e - k) <= L, and the largest
        j = e - k allowed is j0 or j0 - 1 since f * 2^j0 lies in [2^(j0-1), 2^j0).
        """
        frac, exp = torch.frexp(amax)
        j = self._j0 - (frac * 2.0**self._j0 > self._top).to(torch.int32)
        return (exp - j).clamp(_K_MIN, _K_MAX)

    def _block_scales(self, amax_b: torch.Tensor) -> torch.Tensor:
        """Smallest E4M3 value s with s * m >= amax_b (amax_b <= 448 * m): round to nearest, then up."""
        s = (amax_b / self.element_max).to(_E4M3)
        low = s.to(torch.float32) * self.element_max < amax_b  # exact: s and m have few significant bits
        return (s.view(torch.uint8) + low.to(torch.uint8)).view(_E4M3)  # next code up is the next value

    @abc.abstractmethod
    def _round_into(self, y: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Magnitudes ``y >= 0`` (fp32; overwritten, it is scratch) -> the nearest element magnitudes
        (ties to the even code, saturating at ``m``), written into ``out`` (an int32 buffer of y's
        shape) and returned as its fp32 view. Values of a NaN ``y`` are unspecified."""

    @abc.abstractmethod
    def _signed_codes(self, v: torch.Tensor, xb: torch.Tensor, s1: torch.Tensor, s2: torch.Tensor) -> torch.Tensor:
        """Element magnitudes ``v`` (overwritten) with the signs of ``xb`` -> uint8 element codes.

        ``s1`` and ``s2`` are int32 scratch buffers of ``v``'s shape.
        """

    def _quantize_blocks(
        self, xb: torch.Tensor, mag: torch.Tensor, k: torch.Tensor, amax_b: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Blocks ``xb`` (shape (blocks, B)) -> (element codes, E4M3 block scales as uint8).

        ``mag`` is ``|xb|`` (a fresh tensor this overwrites), ``k`` the tensor exponent and
        ``amax_b`` the blocks' absmax, both of the unscaled ``xb``. The elements are quantized at
        ``a = xb / 2^k``. Candidates: the smallest scale that clips nothing and the next
        ``scale_candidates - 1`` E4M3 values below it (which saturate the block's largest elements
        but may round the rest better); each block keeps the one with the least squared error, the
        first (larger) on ties.

        The search runs on magnitudes and the sign is applied once, to the winning codes: the
        squared error ``(v * s - |a|)^2`` equals the signed ``(q * s - a)^2`` bit for bit (rounding
        is symmetric and negation commutes with fp32 rounding). It works in three buffers of the
        input's size, so an encode of millions of values allocates a handful of large tensors
        instead of dozens (each fresh one costs page faults with the default glibc allocator).
        """
        scale = _pow2(-k)
        mag = mag.mul_(scale)  # |a|, exact: a power-of-two scaling
        # max commutes with a monotone rounding: the scaled absmax is the absmax of the scaled blocks
        up = self._block_scales(amax_b * scale).view(torch.uint8).to(torch.int16)
        lowest = up.clamp(max=1)  # a nonzero block never steps down to the zero scale
        y, r, t = torch.empty_like(mag), torch.empty_like(mag, dtype=torch.int32), torch.empty_like(mag)
        best_v = best_scales = best_err = None
        for i in range(self.scale_candidates):
            scales = torch.maximum(up - i, lowest).to(torch.uint8)
            s = scales.view(_E4M3).to(torch.float32).unsqueeze(1)
            v = self._round_into(torch.div(mag, torch.where(s > 0, s, 1.0), out=y), r)  # s = 0: the block is 0
            if self.scale_candidates == 1:
                best_v, best_scales = v, scales
                break
            err = halves_sum(torch.mul(v, s, out=t).sub_(mag).square_())
            if best_err is None:
                best_v, best_scales, best_err = v.clone(), scales, err
            else:
                better = err < best_err
                best_v.lerp_(v, better.unsqueeze(1).to(torch.float32))  # weight 0 or 1: exact
                best_scales = torch.where(better, scales, best_scales)
                best_err = torch.where(better, err, best_err)
        return self._signed_codes(best_v, xb, y.view(torch.int32), t.view(torch.int32)), best_scales

    def encode_reference(self, x: torch.Tensor) -> torch.Tensor:
        x32 = self._as_float32(x)
        n, B = x32.numel(), self.block_size
        xb = (x32 if n % B == 0 else torch.nn.functional.pad(x32, (0, -n % B))).view(-1, B)
        mag = xb.abs()
        # Non-negative floats order like their bits, and the int reduction is ~2.5x faster (and
        # still propagates NaN: its bits exceed inf's).
        amax_b = mag.view(torch.int32).amax(dim=1).view(torch.float32)
        amax = amax_b.max() if n else mag.new_zeros(())
        bad = ~torch.isfinite(amax)  # max and amax propagate NaN; no host sync
        amax_b = torch.where(bad, 0.0, amax_b)  # the codes of a non-finite input are never read
        k = self._tensor_exponent(torch.where(bad, 0.0, amax))
        codes, scales = self._quantize_blocks(xb, mag, k, amax_b)
        codes = codes.flatten()
        if self.element_bits == 4:
            codes = codes[0::2] | (codes[1::2] << 4)
        codes = torch.where(bad, 0, codes[: -(-n * self.element_bits // 8)])  # a defined payload
        scales = torch.where(bad, _E4M3_NAN, scales)
        tensor_scale = torch.where(bad, _E8M0_NAN, k + _E8M0_BIAS).to(torch.uint8).reshape(1)
        return torch.cat([codes, scales, tensor_scale])

    def decode_reference(self, payload: torch.Tensor, numel: int) -> torch.Tensor:
        self._check_payload(payload, numel)
        n, B = numel, self.block_size
        n_code_bytes, n_blocks = -(-n * self.element_bits // 8), -(-n // B)
        values = self._decode_elements(payload[:n_code_bytes], n)
        if n_blocks * B != n:
            values = torch.nn.functional.pad(values, (0, n_blocks * B - n))
        s8 = payload[n_code_bytes : n_code_bytes + n_blocks].view(_E4M3).to(torch.float32)
        t = payload[-1].to(torch.int32)
        factor = torch.where(t == _E8M0_NAN, torch.nan, _pow2((t - _E8M0_BIAS).clamp(-126, 127)))
        out = values.view(-1, B).mul_(s8.unsqueeze(1)).view(-1)[:n].mul_(factor)  # a NaN scale: all NaN
        return out.clamp_(-_F32_MAX, _F32_MAX)  # a rounded-up absmax near fp32's max must not become inf

    def encode(self, x: torch.Tensor, *, chunk: int | None = None) -> torch.Tensor:
        """As :meth:`Codec.encode`; without ``chunk``, on CPU through the C loops where this format has them
        (:mod:`diloco.wire.native`), on CUDA through the Triton kernels where it has them
        (:mod:`diloco.wire.triton_codecs`): the same bytes."""
        fmt = native_blocks.element_format(self)
        if chunk is None and isinstance(x, torch.Tensor) and x.numel():
            if fmt is not None and native.usable(x):
                return native_blocks.encode_block_scaled(self, self._as_float32(x), fmt)
            if triton_codecs.usable(self, x):
                return triton_codecs.encode(self, self._as_float32(x))
        return super().encode(x, chunk=chunk)

    def decode(self, payload: torch.Tensor, numel: int, *, chunk: int | None = None) -> torch.Tensor:
        fmt = native_blocks.element_format(self)
        if chunk is None and numel > 0 and isinstance(payload, torch.Tensor):
            if fmt is not None and native.usable(payload):
                self._check_payload(payload, numel)
                return native_blocks.decode_block_scaled(self, payload, numel, fmt)
            if triton_codecs.usable(self, payload):
                self._check_payload(payload, numel)
                return triton_codecs.decode(self, payload, numel)
        return super().decode(payload, numel, chunk=chunk)

    def _encode_chunked(self, x: torch.Tensor, chunk: int) -> torch.Tensor:
        """:meth:`encode_reference`'s operations on ``chunk`` values (whole blocks) at a time.

        Two passes over x: the block absmaxes (for the tensor scale, which every block needs), then the
        candidate search and the codes chunk by chunk, written straight into the payload.
        """
        x32 = self._as_float32(x)
        n, B = x32.numel(), self.block_size
        rows, rows_per = -(-n // B), max(1, chunk // B)
        n_code = -(-n * self.element_bits // 8)
        payload = torch.empty(self.num_bytes(n), dtype=torch.uint8, device=x32.device)
        amax_b = torch.empty(rows, device=x32.device)

        def blocks(r0: int, r1: int) -> torch.Tensor:
            if r1 * B <= n:
                return x32[r0 * B : r1 * B].view(-1, B)
            return torch.nn.functional.pad(x32[r0 * B :], (0, r1 * B - n)).view(-1, B)  # the last, partial block

        bounds = row_chunks(rows, rows_per)
        mag_buf = torch.empty(max(r1 - r0 for r0, r1 in bounds), B, device=x32.device)
        for r0, r1 in bounds:
            mag = torch.abs(blocks(r0, r1), out=mag_buf[: r1 - r0])
            torch.amax(mag.view(torch.int32), dim=1, out=amax_b[r0:r1].view(torch.int32))
        amax = amax_b.max()
        if not bool(torch.isfinite(amax)):  # a NaN or inf: the reference's defined all-NaN payload
            payload[:n_code] = 0
            payload[n_code:-1] = _E4M3_NAN
            payload[-1] = _E8M0_NAN
            return payload
        k = self._tensor_exponent(amax)
        for r0, r1 in bounds:
            xb = blocks(r0, r1)
            codes, scales = self._quantize_blocks(xb, torch.abs(xb, out=mag_buf[: r1 - r0]), k, amax_b[r0:r1])
            codes = codes.view(-1)
            if self.element_bits == 4:
                lo, hi = r0 * B // 2, min(n_code, r1 * B // 2)
                torch.bitwise_or(codes[0::2][: hi - lo], codes[1::2][: hi - lo] << 4, out=payload[lo:hi])
            else:
                lo, hi = r0 * B, min(n_code, r1 * B)
                payload[lo:hi] = codes[: hi - lo]
            payload[n_code + r0 : n_code + r1] = scales
        payload[-1] = (k + _E8M0_BIAS).to(torch.uint8)
        return payload

    def _decode_chunked(self, payload: torch.Tensor, numel: int, chunk: int) -> torch.Tensor:
        """:meth:`decode_reference`'s operations on ``chunk`` values (whole blocks) at a time, in place in
        the output. Only the 4-bit formats take it (:meth:`decode`): for the 8-bit ones, whose element decode
        is one cast, it measured slower than the reference (their ``chunked_decode`` is False)."""
        self._check_payload(payload, numel)
        out = torch.empty(-(-numel // self.block_size) * self.block_size, device=payload.device)
        return self._decode_chunked_into(payload, numel, chunk, out)

    def decode_into(self, payload: torch.Tensor, numel: int, out: torch.Tensor) -> torch.Tensor:
        assert out.dtype == torch.float32 and out.numel() == numel and out.is_contiguous()
        fmt = native_blocks.element_format(self)
        if fmt is not None and numel > 0 and native.usable(payload) and out.device.type == "cpu":
            self._check_payload(payload, numel)
            return native_blocks.decode_block_scaled(self, payload, numel, fmt, out)
        if numel > 0 and out.device == payload.device and triton_codecs.usable(self, payload):
            self._check_payload(payload, numel)
            return triton_codecs.decode(self, payload, numel, out)
        if not (use_chunks(payload, None) and numel > 0 and self.chunked_decode and numel % self.block_size == 0):
            return self.decode(payload, numel)  # the chunked path pads the last block: it needs whole blocks here
        self._check_payload(payload, numel)
        return self._decode_chunked_into(payload, numel, CHUNK, out)

    def _decode_chunked_into(self, payload: torch.Tensor, numel: int, chunk: int, out: torch.Tensor) -> torch.Tensor:
        """The chunked decode into ``out`` (whole blocks: ``ceil(numel / block) * block`` values); returns
        ``out[:numel]``."""
        n, B = numel, self.block_size
        n_code, rows = -(-n * self.element_bits // 8), -(-n // B)
        rows_per = max(1, chunk // B)
        assert out.numel() == rows * B
        t = payload[-1].to(torch.int32)
        factor = torch.where(t == _E8M0_NAN, torch.nan, _pow2((t - _E8M0_BIAS).clamp(-126, 127)))
        for r0 in range(0, rows, rows_per):
            r1 = min(rows, r0 + rows_per)
            count = min(n, r1 * B) - r0 * B
            per_byte = 8 // self.element_bits
            lo, hi = r0 * B // per_byte, -(-(r0 * B + count) // per_byte)
            part = out[r0 * B : r1 * B]
            self._decode_elements_into(payload[lo:hi], count, part)
            part[count:].zero_()  # the reference pads the last block with zeros
            s8 = payload[n_code + r0 : n_code + r1].view(_E4M3).to(torch.float32)
            part.view(-1, B).mul_(s8.unsqueeze(1))
            part[:count].mul_(factor).clamp_(-_F32_MAX, _F32_MAX)
        return out if out.numel() == n else out[:n]

    def _decode_elements_into(self, code_bytes: torch.Tensor, n: int, out: torch.Tensor) -> None:
        """Write the first ``n`` element values of ``code_bytes`` into ``out[:n]``."""
        out[:n].copy_(self._decode_elements(code_bytes, n))

    def _decode_elements(self, code_bytes: torch.Tensor, n: int) -> torch.Tensor:
        """The payload's element code bytes -> the first ``n`` element values (a new fp32 tensor)."""
        return self.dequantize_elements(code_bytes[:n])


class FP8E4M3Codec(BlockScaledCodec):
    """OCP FP8 E4M3 ("fn": max 448, subnormals down to 2^-9), via torch's round-to-nearest-even cast."""

    name = "fp8_e4m3"
    element_bits = 8
    element_max = _E4M3_MAX

    def __init__(self, *, block_size: int = sizes.BLOCK8, scale_candidates: int = 2) -> None:
        super().__init__(block_size=block_size, scale_candidates=scale_candidates)

    def dequantize_elements(self, codes: torch.Tensor) -> torch.Tensor:
        return codes.view(_E4M3).to(torch.float32)

    def _round_into(self, y: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return out.view(torch.float32).copy_(y.clamp_(max=self.element_max).to(_E4M3))

    def _signed_codes(self, v: torch.Tensor, xb: torch.Tensor, s1: torch.Tensor, s2: torch.Tensor) -> torch.Tensor:
        sign = torch.bitwise_right_shift(xb.view(torch.int32), 24, out=s1).bitwise_and_(0x80)  # bit 31 -> 7
        return s2.copy_(v.to(_E4M3).view(torch.uint8)).bitwise_or_(sign).to(torch.uint8)  # -0 keeps its sign


class Int8Codec(BlockScaledCodec):
    """Symmetric int8 (-127..127; -128 unused) with round half to even."""

    name = "int8"
    element_bits = 8
    element_max = 127.0

    def __init__(self, *, block_size: int = sizes.BLOCK8, scale_candidates: int = 1) -> None:
        super().__init__(block_size=block_size, scale_candidates=scale_candidates)

    def dequantize_elements(self, codes: torch.Tensor) -> torch.Tensor:
        return codes.view(torch.int8).to(torch.float32)

    def _round_into(self, y: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return torch.round(y.clamp_(max=self.element_max), out=out.view(torch.float32))

    def _signed_codes(self, v: torch.Tensor, xb: torch.Tensor, s1: torch.Tensor, s2: torch.Tensor) -> torch.Tensor:
        sign = torch.bitwise_right_shift(xb.view(torch.int32), 31, out=s1)  # 0, or -1 where negative
        return s2.copy_(v).bitwise_xor_(sign).sub_(sign).to(torch.int8).view(torch.uint8)  # two's complement


class FP4Codec(BlockScaledCodec):
    """A 4-bit sign-magnitude float given by its eight magnitudes (code order, ascending).

    Subclasses round magnitudes with integer operations on the fp32 bit pattern
    (:meth:`round_magnitudes`), which is what makes the four-candidate block-scale
    search affordable: a few passes per candidate instead of one compare per
    midpoint and a table lookup (``benchmarks/codec_versions.py`` times both).
    """

    element_bits = 4
    magnitudes: tuple[float, ...]

    def __init__(self, *, block_size: int = sizes.FP4_BLOCK, scale_candidates: int = 4) -> None:
        assert len(self.magnitudes) == 8 and list(self.magnitudes) == sorted(self.magnitudes)
        self.element_max = self.magnitudes[-1]
        super().__init__(block_size=block_size, scale_candidates=scale_candidates)
        mags = torch.tensor(self.magnitudes, dtype=torch.float32)
        self._values = torch.cat([mags, -mags])  # code = sign << 3 | magnitude code
        byte = torch.arange(256)
        pairs = self._values[torch.stack([byte & 0x0F, byte >> 4], dim=1)]  # (256, 2): low nibble, high
        self._byte_values = pairs.view(torch.int64).flatten()  # both values of a byte as one 8-byte word

    def round_magnitudes(self, y: torch.Tensor) -> torch.Tensor:
        """fp32 ``y >= 0`` -> the nearest magnitude (ties to the even code), saturating at ``m``.

        Returns a new tensor; ``y`` is left unchanged. Values of a NaN ``y`` are unspecified.
        """
        return self._round_into(y.clone(), torch.empty_like(y, dtype=torch.int32))

    def magnitude_codes(self, v: torch.Tensor) -> torch.Tensor:
        """Magnitudes (values of :attr:`magnitudes`) -> their 3-bit codes as uint8."""
        return self._codes_into(v.clone()).to(torch.uint8)

    @abc.abstractmethod
    def _codes_into(self, v: torch.Tensor) -> torch.Tensor:
        """As :meth:`magnitude_codes`, in ``v``'s own storage: returns it viewed as int32 codes."""

    def dequantize_elements(self, codes: torch.Tensor) -> torch.Tensor:
        return self._values.to(codes.device)[codes.long()]

    def _decode_elements(self, code_bytes: torch.Tensor, n: int) -> torch.Tensor:
        table = self._byte_values.to(code_bytes.device)
        return torch.gather(table, 0, code_bytes.long()).view(torch.float32)[:n]  # both nibbles at once

    chunked_decode = True

    def _decode_elements_into(self, code_bytes: torch.Tensor, n: int, out: torch.Tensor) -> None:
        table = self._byte_values.to(code_bytes.device)
        m = code_bytes.numel()
        if 2 * m <= out.numel() and out.storage_offset() % 2 == 0:  # both nibbles of a byte: one 8-byte word
            torch.gather(table, 0, code_bytes.long(), out=out[: 2 * m].view(torch.int64))
        else:
            out[:n].copy_(self._decode_elements(code_bytes, n))

    def _signed_codes(self, v: torch.Tensor, xb: torch.Tensor, s1: torch.Tensor, s2: torch.Tensor) -> torch.Tensor:
        codes = self._codes_into(v)
        sign = torch.bitwise_right_shift(xb.view(torch.int32), 28, out=s1).bitwise_and_(8)  # bit 31 -> 3
        return codes.add_(sign.mul_(torch.clamp(codes, max=1, out=s2))).to(torch.uint8)  # zero is always +0


def _f32_bits(v: float) -> int:
    return int(torch.tensor(v, dtype=torch.float32).view(torch.int32))


class FP4E3M0Codec(FP4Codec):
    """E3M0: 1 sign, 3 exponent (bias 3), 0 mantissa bits; Streaming DiLoCo's outer-gradient format."""

    name = "fp4_e3m0"
    magnitudes = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0)

    def _round_into(self, y: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        # Round the fp32 significand away (round to nearest, ties to an even exponent field, the
        # classic bias trick), then clamp to [0.25, 16]. Code = exponent field - 124, so an even
        # exponent field is an even code. Below 0.25 only 0 is representable: y <= 0.125 -> 0.
        bits = y.view(torch.int32)
        r = torch.bitwise_right_shift(bits, 23, out=out)
        r.bitwise_and_(1).add_(0x3FFFFF).add_(bits).bitwise_and_(0x7F800000)
        v = r.clamp_(_f32_bits(0.25), _f32_bits(16.0)).view(torch.float32)
        # 0 where y <= 0.125; elsewhere 128 * y > 16 >= v leaves v.
        return torch.minimum(v, torch.nn.functional.threshold_(y, 0.125, 0.0).mul_(128.0), out=v)

    def _codes_into(self, v: torch.Tensor) -> torch.Tensor:
        return v.view(torch.int32).bitwise_right_shift_(23).sub_(124).clamp_(min=0)


class FP4E2M1Codec(FP4Codec):
    """E2M1: 1 sign, 2 exponent (bias 1), 1 mantissa bit; the OCP MX / NVFP4 element format."""

    name = "fp4_e2m1"
    magnitudes = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)

    def _round_into(self, y: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        # From 1 up, E2M1 is fp32 with one significand bit: round to it (nearest, ties to an even
        # last bit = an even code) and clamp to [1, 6]. Below 0.75 the subnormal 0.5 and 0 remain
        # (0.25 is a tie to 0, 0.75 one to 1).
        bits = y.view(torch.int32)
        r = torch.bitwise_right_shift(bits, 22, out=out)
        r.bitwise_and_(1).add_(0x1FFFFF).add_(bits).bitwise_and_(-(1 << 22))
        hi = r.clamp_(_f32_bits(1.0), _f32_bits(6.0)).view(torch.float32)
        # Below 1 the step is 0.5: lo = round(2y) in {0, 1, 2} (ties to even), 2 from y >= 0.75 up.
        # y < 1: hi = 1 and v = lo / 2; y >= 1: lo = 2 and v = hi. Every sum is exact.
        lo = y.mul_(2.0).round_().clamp_(max=2.0)
        return hi.add_(lo, alpha=0.5).sub_(1.0)

    def _codes_into(self, v: torch.Tensor) -> torch.Tensor:
        # 1 -> 2, 1.5 -> 3, ..., 6 -> 7 from (exponent, significand bit); 0.5 -> 1; 0 -> 0.
        half = v == 0.5
        codes = v.view(torch.int32).bitwise_right_shift_(22).sub_(252).clamp_(min=0)
        return codes.add_(half)
