"""The block-scaled codecs (:mod:`diloco.wire.scaled`) and bf16 through the C loops of :mod:`diloco.wire.native`.

Each function takes the codec for its parameters and returns what the codec's torch code returns, the same
bytes (encode) or the same fp32 bits (decode). The callers check :func:`diloco.wire.native.usable` first.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

import torch

from diloco.wire.native import library, ptr, threads

if TYPE_CHECKING:
    from diloco.wire.scaled import BlockScaledCodec

_E8M0_BIAS, _E8M0_NAN, _E4M3_NAN = 127, 0xFF, 0x7F
_INF_BITS = 0x7F800000
#: Largest block the C loops take (their per-block buffers); larger blocks run the torch code.
MAX_BLOCK = 256


@functools.cache
def _e4m3_values() -> torch.Tensor:
    """The 256 E4M3 ("fn") codes' fp32 values, by code."""
    return torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).to(torch.float32)


def element_format(codec: BlockScaledCodec) -> int | None:
    """The C loops' number for the codec's element format (0 E2M1, 1 E3M0, 2 int8), None if they lack it."""
    from diloco.wire.scaled import FP4E2M1Codec, FP4E3M0Codec, Int8Codec

    if codec.block_size > MAX_BLOCK:
        return None
    for fmt, cls in enumerate((FP4E2M1Codec, FP4E3M0Codec, Int8Codec)):
        if type(codec) is cls:
            return fmt
    return None


def encode_block_scaled(codec: BlockScaledCodec, x32: torch.Tensor, fmt: int) -> torch.Tensor:
    """``codec.encode_reference(x32)`` for contiguous fp32 ``x32`` with at least one value."""
    lib = library()
    assert lib is not None and x32.dtype == torch.float32 and x32.is_contiguous() and x32.numel() > 0
    n, B = x32.numel(), codec.block_size
    n_code = -(-n * codec.element_bits // 8)
    payload = torch.empty(codec.num_bytes(n), dtype=torch.uint8)
    xp = ptr(x32)
    top = lib.abs_bits_max_mt(xp, n, threads(n))  # the blocks' own absmax: the encode loop finds it again
    if top >= _INF_BITS:  # a NaN or inf: the reference's defined all-NaN payload
        payload[:n_code] = 0
        payload[n_code:-1] = _E4M3_NAN
        payload[-1] = _E8M0_NAN
        return payload
    k = int(codec._tensor_exponent(torch.tensor(top, dtype=torch.int32).view(torch.float32)))
    scale = math.ldexp(1.0, -k)  # 2^-k, a normal fp32 (|k| <= 126)
    pp, tp, nt = ptr(payload), ptr(_e4m3_values()), threads(n * codec.scale_candidates)
    lib.encode_blocks_mt(xp, n, B, fmt, codec.scale_candidates, codec.element_max, scale, tp, pp, pp + n_code, nt)
    payload[-1] = k + _E8M0_BIAS
    return payload


def decode_block_scaled(
    codec: BlockScaledCodec, payload: torch.Tensor, numel: int, fmt: int, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``codec.decode_reference(payload, numel)``, written into ``out`` (contiguous fp32) if given."""
    lib = library()
    assert lib is not None and numel > 0
    n, B = numel, codec.block_size
    n_code = -(-n * codec.element_bits // 8)
    payload = payload.contiguous()
    out = torch.empty(n, dtype=torch.float32) if out is None else out
    t = int(payload[-1])
    factor = math.nan if t == _E8M0_NAN else math.ldexp(1.0, min(max(t - _E8M0_BIAS, -126), 127))
    values = codec._values if fmt < 2 else None  # the 16 FP4 values by code
    pp, op, tp = ptr(payload), ptr(out), ptr(_e4m3_values())
    vp = None if values is None else ptr(values)
    lib.decode_blocks_mt(pp, pp + n_code, n, B, fmt, vp, tp, factor, op, threads(n))
    return out


def encode_bf16(x32: torch.Tensor) -> torch.Tensor:
    """``BF16Codec().encode_reference(x32)`` for contiguous fp32 ``x32`` with at least one value."""
    lib = library()
    assert lib is not None and x32.dtype == torch.float32 and x32.is_contiguous() and x32.numel() > 0
    n = x32.numel()
    out = torch.empty(n, dtype=torch.int16)
    top = lib.bf16_encode_mt(ptr(x32), n, ptr(out), threads(n))
    if top >= _INF_BITS:  # a NaN or inf: every value NaN, as the reference
        out.view(torch.bfloat16).fill_(math.nan)
    return out.view(torch.uint8)


def decode_bf16(payload: torch.Tensor, numel: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """``BF16Codec().decode_reference(payload, numel)``, written into ``out`` if given."""
    lib = library()
    assert lib is not None and numel > 0
    aligned = payload if payload.is_contiguous() and payload.data_ptr() % 2 == 0 else payload.clone()
    out = torch.empty(numel, dtype=torch.float32) if out is None else out
    lib.bf16_decode_mt(ptr(aligned), numel, ptr(out), threads(numel))
    return out


__all__ = ["MAX_BLOCK", "decode_bf16", "decode_block_scaled", "element_format", "encode_bf16", "encode_block_scaled"]
