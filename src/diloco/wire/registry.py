"""The registry of codecs: every format by its name, built here, in the one module that imports them all.

=========  ============  ==========================================================
name       bits/value    format
=========  ============  ==========================================================
fp32       32            IEEE binary32, bit-exact
bf16       16            bfloat16 (8 significand bits), no scale
fp8_e4m3   8.25          OCP E4M3 ("fn": max 448, subnormals), block 32, two-level scale
int8       8.25          symmetric integers -127..127, block 32, two-level scale
fp4_e3m0   4.5           1 sign, 3 exponent, 0 mantissa bits (exmy E3M0), block 16
fp4_e2m1   4.5           OCP MX / NVFP4 element (0, .5, 1, 1.5, 2, 3, 4, 6), block 16
=========  ============  ==========================================================

Three compressing codecs meant for error feedback, ``stat2`` / ``stat4`` (a
statistical quantizer, 2.125 / 4.5 bits) and ``topk`` (chunked top-k, 0.22
bits at density 1/64), live in :mod:`diloco.wire.compress`; the
guarantees below are the wire formats' (:data:`CODEC_NAMES`), not theirs.
"""

from __future__ import annotations

from diloco.errors import ConfigError
from diloco.wire import sizes
from diloco.wire.codec import Codec
from diloco.wire.compress import StatisticalCodec, TopKCodec
from diloco.wire.floats import BF16Codec, FP32Codec
from diloco.wire.scaled import FP4E2M1Codec, FP4E3M0Codec, FP8E4M3Codec, Int8Codec

_WIRE_FORMATS = (FP32Codec(), BF16Codec(), FP8E4M3Codec(), Int8Codec(), FP4E3M0Codec(), FP4E2M1Codec())
#: The wire formats: every guarantee of :mod:`diloco.wire.codec` and :mod:`diloco.wire.scaled` holds for them.
CODEC_NAMES: tuple[str, ...] = sizes.WIRE_FORMAT_NAMES
#: The compressing codecs meant for error feedback (:mod:`diloco.wire.compress`). Lossier by design; see that
#: module for what they guarantee.
COMPRESSING_CODECS: tuple[str, ...] = sizes.COMPRESSING_NAMES
#: Every name :func:`get_codec` knows.
ALL_CODEC_NAMES: tuple[str, ...] = CODEC_NAMES + COMPRESSING_CODECS
_REGISTRY: dict[str, Codec] = {
    c.name: c for c in (*_WIRE_FORMATS, StatisticalCodec(bits=2), StatisticalCodec(bits=4), TopKCodec())
}
assert tuple(_REGISTRY) == ALL_CODEC_NAMES and tuple(c.name for c in _WIRE_FORMATS) == CODEC_NAMES


def get_codec(name: str | Codec, *, topk_density: float | None = None, topk_tables: str | None = None) -> Codec:
    """The registered codec called ``name``; a :class:`Codec` instance is passed through.

    ``topk_density``: for ``"topk"``, the share of each chunk's values sent (default 1/64);
    ``topk_tables``: where its values' bin means are kept, ``"payload"`` (default) or ``"chunk"``.
    """
    if isinstance(name, Codec):
        return name
    if name == "topk" and (topk_density is not None or topk_tables is not None):
        return TopKCodec(
            density=sizes.TOPK_DENSITY if topk_density is None else topk_density,
            tables=sizes.TOPK_TABLE if topk_tables is None else topk_tables,
        )
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ConfigError(f"unknown codec {name!r}; valid names: {', '.join(ALL_CODEC_NAMES)}") from None
