"""The unscaled wire formats: fp32 (IEEE binary32, bit-exact) and bf16 (bfloat16, no scale).

bf16 rounds to nearest even (:mod:`diloco.wire.codec`, "Rounding") and saturates at +-(2 - 2^-7) * 2^127
instead of rounding to inf; a non-finite input encodes every value as NaN.
"""

from __future__ import annotations

import math

import torch

from diloco.wire import native, sizes
from diloco.wire.codec import Codec
from diloco.wire.native import blocks as native_blocks

_BF16_MAX = torch.finfo(torch.bfloat16).max


class FP32Codec(Codec):
    """IEEE binary32 on the wire: bit-exact (the data-parallel baseline)."""

    name = "fp32"
    bits_per_value = 32.0

    def num_bytes(self, numel: int) -> int:
        return sizes.dense_bytes(numel, 4)

    def encode_reference(self, x: torch.Tensor) -> torch.Tensor:
        x32, bad = self._prepare(x)
        return torch.where(bad, torch.nan, x32).view(torch.uint8)  # where copies: no aliasing of x

    def decode_reference(self, payload: torch.Tensor, numel: int) -> torch.Tensor:
        self._check_payload(payload, numel)
        return payload.clone().view(torch.float32)  # clone: aligned, and the caller may add_ into it

    def decode_into(self, payload: torch.Tensor, numel: int, out: torch.Tensor) -> torch.Tensor:
        assert out.dtype == torch.float32 and out.numel() == numel and out.is_contiguous()
        self._check_payload(payload, numel)
        aligned = payload if payload.storage_offset() % 4 == 0 else payload.clone()
        return out.copy_(aligned.view(torch.float32))  # the bits as they are


class BF16Codec(Codec):
    """bfloat16, round to nearest even; saturates at bf16's max instead of rounding to inf."""

    name = "bf16"
    bits_per_value = 16.0

    def num_bytes(self, numel: int) -> int:
        return sizes.dense_bytes(numel, 2)

    def encode_reference(self, x: torch.Tensor) -> torch.Tensor:
        x32, bad = self._prepare(x)
        y = x32.clamp(-_BF16_MAX, _BF16_MAX).to(torch.bfloat16)
        return torch.where(bad, torch.nan, y).view(torch.uint8)

    def decode_reference(self, payload: torch.Tensor, numel: int) -> torch.Tensor:
        self._check_payload(payload, numel)
        return payload.clone().view(torch.bfloat16).to(torch.float32)

    def encode(self, x: torch.Tensor, *, chunk: int | None = None) -> torch.Tensor:
        """As :meth:`Codec.encode`; on CPU, without ``chunk``, through a C loop (:mod:`diloco.wire.native`): the
        same bytes."""
        if chunk is None and isinstance(x, torch.Tensor) and x.numel() and native.usable(x):
            return native_blocks.encode_bf16(self._as_float32(x))
        return super().encode(x, chunk=chunk)

    def decode(self, payload: torch.Tensor, numel: int, *, chunk: int | None = None) -> torch.Tensor:
        if chunk is None and numel > 0 and native.usable(payload):
            self._check_payload(payload, numel)
            return native_blocks.decode_bf16(payload, numel)
        return super().decode(payload, numel, chunk=chunk)

    def _encode_chunked(self, x: torch.Tensor, chunk: int) -> torch.Tensor:
        # Per chunk: the min and max (one read; they propagate NaN), the rounding cast, and the clamp only
        # where a value lies beyond bf16's max. Clamping after the cast gives the same bits as before it: a
        # finite value above bf16's max rounds to that max or to inf, and the clamp takes inf back to the max.
        x32 = self._as_float32(x)
        n = x32.numel()
        out = torch.empty(n, dtype=torch.bfloat16, device=x32.device)
        for i in range(0, n, chunk):
            j = min(n, i + chunk)
            lo, hi = (float(v) for v in torch.aminmax(x32[i:j]))
            if not (math.isfinite(lo) and math.isfinite(hi)):  # a NaN or inf: every value NaN, as the reference
                return out.fill_(torch.nan).view(torch.uint8)
            out[i:j].copy_(x32[i:j])
            if lo < -_BF16_MAX or hi > _BF16_MAX:
                out[i:j].clamp_(-_BF16_MAX, _BF16_MAX)
        return out.view(torch.uint8)

    def _decode_chunked(self, payload: torch.Tensor, numel: int, chunk: int) -> torch.Tensor:
        self._check_payload(payload, numel)
        aligned = payload if payload.storage_offset() % 2 == 0 else payload.clone()
        return aligned.view(torch.bfloat16).to(torch.float32)  # the cast is a copy: no clone needed

    def decode_into(self, payload: torch.Tensor, numel: int, out: torch.Tensor) -> torch.Tensor:
        assert out.dtype == torch.float32 and out.numel() == numel and out.is_contiguous()
        self._check_payload(payload, numel)
        if numel > 0 and native.usable(payload) and out.device.type == "cpu":
            return native_blocks.decode_bf16(payload, numel, out)
        aligned = payload if payload.storage_offset() % 2 == 0 else payload.clone()
        return out.copy_(aligned.view(torch.bfloat16))  # bf16 -> fp32 is exact, as .to(float32)

    chunked_decode = True
