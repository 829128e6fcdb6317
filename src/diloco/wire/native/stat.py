"""The statistical codecs (``stat2``, ``stat4``: :class:`diloco.wire.compress.StatisticalCodec`) through the C
loops of :mod:`diloco.wire.native`: the reference's bytes and fp32 bits. Callers check :func:`supported` and
:func:`diloco.wire.native.usable` first."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from diloco.wire.native import library, ptr, threads

if TYPE_CHECKING:
    from diloco.wire.compress import StatisticalCodec

_INF_BITS = 0x7F800000
#: Largest block the C loops take (their per-thread scratch); larger blocks run the torch code.
MAX_BLOCK = 1 << 16


def supported(codec: StatisticalCodec) -> bool:
    """Whether the C loops take this codec's parameters: ``bits`` in (1, 2, 4, 8) and whole bytes a block."""
    return 8 % codec.bits == 0 and (codec.block_size * codec.bits) % 8 == 0 and codec.block_size <= MAX_BLOCK


def encode_stat(codec: StatisticalCodec, x32: torch.Tensor) -> torch.Tensor:
    """``codec.encode_reference(x32)`` for contiguous fp32 ``x32`` with at least one value."""
    lib = library()
    assert lib is not None and x32.dtype == torch.float32 and x32.is_contiguous() and x32.numel() > 0
    n, B, bits = x32.numel(), codec.block_size, codec.bits
    L, rows, n_code = 1 << bits, -(-n // B), -(-n * bits // 8)
    payload = torch.empty(codec.num_bytes(n), dtype=torch.uint8)
    table = torch.empty(rows, L)
    coef = 2.0 * codec.range_sigmas / L
    nt = threads(n * L)
    scratch = torch.empty(nt, 2 * B)
    top = lib.stat_encode_mt(ptr(x32), n, B, bits, codec.range_sigmas, coef, ptr(payload), ptr(table), ptr(scratch), nt)
    if top >= _INF_BITS:  # a NaN or inf: NaN tables, as the reference
        table.fill_(math.nan)
    payload[n_code:] = table.view(-1).view(torch.uint8)
    return payload


def decode_stat(codec: StatisticalCodec, payload: torch.Tensor, numel: int) -> torch.Tensor:
    """``codec.decode_reference(payload, numel)`` (a checked payload, ``numel`` > 0)."""
    lib = library()
    assert lib is not None and numel > 0
    n, B, bits = numel, codec.block_size, codec.bits
    n_code = -(-n * bits // 8)
    codes = payload[:n_code].contiguous()
    table = payload[n_code:].clone().view(torch.float32)
    out = torch.empty(n)
    lib.stat_decode_mt(ptr(codes), ptr(table), n, B, bits, ptr(out), threads(n))
    return out


__all__ = ["MAX_BLOCK", "decode_stat", "encode_stat", "supported"]
