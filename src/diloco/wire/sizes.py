"""Exact payload sizes of every codec, without torch: the one place the byte counts are computed.

The codecs (:mod:`diloco.wire.floats`, :mod:`diloco.wire.scaled`, :mod:`diloco.wire.compress`) answer
``num_bytes(numel)`` with these functions, and the planner (:mod:`diloco.sim.planner`, which must
not import torch) reads its bits per parameter from :func:`payload_bytes`, so the two cannot drift.
The default format parameters (block sizes, top-k density) live here too; the codecs' constructors
default to them.
"""

from __future__ import annotations

import math
from typing import Literal, get_args

from diloco.errors import ConfigError

#: Block size of the 4-bit scaled formats (fp4_e3m0, fp4_e2m1) and of the 8-bit ones (fp8_e4m3, int8).
FP4_BLOCK = 16
BLOCK8 = 32
#: Block size of the statistical quantizer (stat2, stat4): one table of 2^bits FP32 bin means per block.
STAT_BLOCK = 1024
#: Top-k defaults: share of each chunk sent (SparseLoCo's 1/64), chunk size (64 x 64 tiles), value bits.
TOPK_DENSITY = 1 / 64
TOPK_CHUNK = 4096
TOPK_VALUE_BITS = 2
#: Where top-k's 2-bit values take their table of bin means: one for the whole payload, or one per chunk.
TopkTables = Literal["payload", "chunk"]
TOPK_TABLES: tuple[TopkTables, ...] = get_args(TopkTables)
TOPK_TABLE: TopkTables = "payload"
#: Codecs whose payloads cannot be summed in place (sparse): the communicator all-gathers them at every M.
SPARSE_CODECS: tuple[str, ...] = ("topk",)


def check_numel(numel: int) -> int:
    if isinstance(numel, bool) or not isinstance(numel, int) or numel < 0:
        raise ConfigError(f"numel must be a non-negative int, got {numel!r}")
    return numel


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def dense_bytes(numel: int, bytes_per_value: int) -> int:
    """fp32 (4) or bf16 (2): no scales."""
    return bytes_per_value * check_numel(numel)


def block_scaled_bytes(numel: int, *, element_bits: int, block_size: int) -> int:
    """``[element codes][one E4M3 scale per block][one E8M0 tensor scale]``."""
    n = check_numel(numel)
    return _ceil_div(n * element_bits, 8) + _ceil_div(n, block_size) + 1


def stat_bytes(numel: int, *, bits: int, block_size: int = STAT_BLOCK) -> int:
    """``[bits-bit codes][a table of 2^bits FP32 bin means per block]``."""
    n = check_numel(numel)
    return _ceil_div(n * bits, 8) + _ceil_div(n, block_size) * (1 << bits) * 4


def topk_index_bits(chunk_size: int) -> int:
    return max(1, math.ceil(math.log2(chunk_size)))


def topk_k(chunk: int, density: float) -> int:
    """Values sent from a chunk of ``chunk`` values: ``ceil(density * chunk)``, at least 1, at most all."""
    return min(chunk, max(1, math.ceil(round(density * chunk, 9))))


def topk_selected(numel: int, *, density: float = TOPK_DENSITY, chunk_size: int = TOPK_CHUNK) -> int:
    """Values sent from ``numel``: full chunks of ``chunk_size`` and one shorter last chunk."""
    full, rest = divmod(check_numel(numel), chunk_size)
    return full * topk_k(chunk_size, density) + (topk_k(rest, density) if rest else 0)


def check_topk_tables(tables: str) -> str:
    if tables not in TOPK_TABLES:
        raise ConfigError(
            f"topk tables={tables!r}: use 'payload' (one table of bin means for the whole payload) "
            f"or 'chunk' (one per chunk, 16 more bytes per chunk)"
        )
    return tables


def topk_num_tables(numel: int, *, chunk_size: int = TOPK_CHUNK, tables: str = TOPK_TABLE) -> int:
    """Tables of bin means a top-k payload carries: 1 (``payload``), or one per chunk (``chunk``)."""
    check_topk_tables(tables)
    return 1 if tables == "payload" else _ceil_div(check_numel(numel), chunk_size)


def topk_bytes(
    numel: int,
    *,
    density: float = TOPK_DENSITY,
    chunk_size: int = TOPK_CHUNK,
    value_bits: int = TOPK_VALUE_BITS,
    tables: str = TOPK_TABLE,
) -> int:
    """``[value codes][chunk-local indices][tables of 2^value_bits FP32 bin means]`` (one, or one per chunk)."""
    k = topk_selected(numel, density=density, chunk_size=chunk_size)
    n_tables = topk_num_tables(numel, chunk_size=chunk_size, tables=tables)
    return (
        _ceil_div(k * value_bits, 8) + _ceil_div(k * topk_index_bits(chunk_size), 8) + n_tables * (1 << value_bits) * 4
    )


def payload_bytes(name: str, numel: int, *, topk_density: float | None = None, topk_tables: str | None = None) -> int:
    """Exact bytes of codec ``name`` (at its default parameters) for ``numel`` values."""
    if name == "fp32":
        return dense_bytes(numel, 4)
    if name == "bf16":
        return dense_bytes(numel, 2)
    if name in ("fp8_e4m3", "int8"):
        return block_scaled_bytes(numel, element_bits=8, block_size=BLOCK8)
    if name in ("fp4_e3m0", "fp4_e2m1"):
        return block_scaled_bytes(numel, element_bits=4, block_size=FP4_BLOCK)
    if name in ("stat2", "stat4"):
        return stat_bytes(numel, bits=int(name[4:]))
    if name == "topk":
        return topk_bytes(
            numel,
            density=TOPK_DENSITY if topk_density is None else topk_density,
            tables=TOPK_TABLE if topk_tables is None else topk_tables,
        )
    raise ConfigError(f"unknown codec {name!r}; valid names: {', '.join(NAMES)}")


#: The wire formats' names (every guarantee of :mod:`diloco.wire.codec` holds for them), defined once here: the
#: registry (:mod:`diloco.wire.registry`) checks its codecs against them, the config, help and docs list them.
WireFormatName = Literal["fp32", "bf16", "fp8_e4m3", "int8", "fp4_e3m0", "fp4_e2m1"]
#: The compressing codecs' names (for error feedback; :mod:`diloco.wire.compress`).
CompressingCodecName = Literal["stat2", "stat4", "topk"]
#: Any codec's name.
CodecName = WireFormatName | CompressingCodecName
WIRE_FORMAT_NAMES: tuple[str, ...] = get_args(WireFormatName)
COMPRESSING_NAMES: tuple[str, ...] = get_args(CompressingCodecName)
#: Every codec name :func:`payload_bytes` knows (``diloco.wire.registry.ALL_CODEC_NAMES``).
NAMES: tuple[str, ...] = WIRE_FORMAT_NAMES + COMPRESSING_NAMES


def bits_per_value(
    name: str, numel: int, *, topk_density: float | None = None, topk_tables: str | None = None
) -> float:
    """Exact bits on the wire per value for a payload of ``numel`` values: ``payload_bytes * 8 / numel``."""
    if check_numel(numel) == 0:
        raise ConfigError("numel must be >= 1 for bits per value")
    return payload_bytes(name, numel, topk_density=topk_density, topk_tables=topk_tables) * 8 / numel


__all__ = [
    "BLOCK8",
    "COMPRESSING_NAMES",
    "CodecName",
    "WIRE_FORMAT_NAMES",
    "CompressingCodecName",
    "WireFormatName",
    "FP4_BLOCK",
    "NAMES",
    "SPARSE_CODECS",
    "STAT_BLOCK",
    "TOPK_CHUNK",
    "TOPK_DENSITY",
    "TOPK_TABLE",
    "TOPK_TABLES",
    "TOPK_VALUE_BITS",
    "TopkTables",
    "bits_per_value",
    "check_topk_tables",
    "block_scaled_bytes",
    "check_numel",
    "dense_bytes",
    "payload_bytes",
    "stat_bytes",
    "topk_bytes",
    "topk_index_bits",
    "topk_k",
    "topk_num_tables",
    "topk_selected",
]
