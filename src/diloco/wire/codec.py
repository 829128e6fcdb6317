"""The codec interface: what goes on the wire between replicas, encoded to bytes and decoded to FP32.

Every codec maps a 1-D floating tensor to a 1-D ``torch.uint8`` payload whose
size depends on ``numel`` only (replicas all-gather fixed-size byte buffers),
and back to FP32. All work is vectorised torch on the input's device and is
deterministic (no randomness, no atomics).

The formats are :mod:`diloco.wire.floats` (fp32, bf16), :mod:`diloco.wire.scaled` (the block-scaled
fp8_e4m3, int8, fp4_e3m0, fp4_e2m1) and :mod:`diloco.wire.compress` (the compressing codecs); the registry
:mod:`diloco.wire.registry` names them. The guarantees below are the wire formats' (``CODEC_NAMES``), not
the compressing codecs'.

Rounding. Every codec rounds to nearest, ties to even (the IEEE default and
what torch's own casts do): a value exactly halfway between two representable
values takes the one whose code is even. For int8 that is the even integer;
for E4M3 and bf16 the even mantissa; for the 4-bit formats the even 3-bit
magnitude code, e.g. E2M1 2.5 -> 2 and 3.5 -> 4, E3M0 1.5 -> 2 and 3 -> 2.

Non-finite input. If x holds any NaN or +-inf, the payload decodes to all NaN
(scaled codecs: the tensor scale byte is 0xFF, E8M0's NaN, and every block
scale E4M3's NaN; fp32/bf16: every value NaN), so the reducer can drop that
replica instead of averaging garbage.

Speed. On CPU, ``bf16``, ``int8``, ``fp4_e2m1``, ``fp4_e3m0``, ``stat2`` and ``stat4`` encode and decode
through fused C loops (:mod:`diloco.wire.native`: one pass, a block at a time in registers) that repeat
the reference's arithmetic operation for operation, so the payload is bit for bit that of the
whole-tensor reference (:meth:`Codec.encode_reference` / :meth:`Codec.decode_reference`, kept: they
define the formats, and other devices run them). On CUDA the FP4 codecs do the same through Triton kernels
(:mod:`diloco.wire.triton_codecs`) where triton imports. Sums inside a block (the FP4 block error, the
statistical codecs' moments and bin totals) are :func:`halves_sum`, a fixed order any implementation
can repeat. Without the C loops (no compiler, ``DILOCO_NATIVE_CODECS=0``), or with ``chunk`` given,
inputs above :data:`CHUNK` values (256K) run the torch code a chunk at a time, so the dozen
temporaries of the block-scale search stay in cache: the same operations on the same values, every
reduction over one block, which a chunk never splits. ``tests/unit/test_codec_native.py`` and
``tests/unit/test_codec_chunks.py`` check both against the reference; ``benchmarks/codec_speed.py``
times all three against a memcpy.
"""

from __future__ import annotations

import abc

import torch

from diloco.errors import ConfigError
from diloco.wire import native

_F32_MAX = torch.finfo(torch.float32).max
#: Values per chunk of the CPU encode / decode paths (see "Speed" in the module docstring). 256K: on the
#: 2-core machine this was tuned on, 16K-64K chunks lose more to per-op overhead (each chunk runs a few
#: dozen torch ops) than they gain in cache; int8 encode measured 6 % of a memcpy at 64K, 11 % at 256K.
CHUNK = 1 << 18


def row_chunks(rows: int, rows_per: int) -> list[tuple[int, int]]:
    """[start, end) row ranges of about ``rows_per`` rows covering ``rows``, none of a single row unless
    ``rows`` is 1: torch reduces a one-row tensor along its row by another kernel than a many-row one (a
    different summation order), while every row of a many-row tensor is reduced alike."""
    rows_per = max(2, rows_per)
    bounds = [(r0, min(rows, r0 + rows_per)) for r0 in range(0, rows, rows_per)]
    if len(bounds) > 1 and bounds[-1][1] - bounds[-1][0] == 1:
        bounds[-2:] = [(bounds[-2][0], rows)]
    return bounds


def halves_sum(e: torch.Tensor) -> torch.Tensor:
    """Row sums of ``e`` (shape (rows, width)) in a fixed order: the halves added, ``e[:, :w/2] + e[:, w/2:]``, until
    one column is left (an odd width first adds its last column to its first). torch's ``sum`` adds in an order of
    its own that differs between kernels, shapes and devices; this one every implementation can repeat (the C loops
    of :mod:`diloco.wire.native` do), so the codecs' block errors and statistics use it."""
    while e.shape[1] > 1:
        w = e.shape[1]
        if w % 2:
            e = torch.cat([e[:, :1] + e[:, w - 1 :], e[:, 1 : w - 1]], dim=1)
            w -= 1
        e = e[:, : w // 2] + e[:, w // 2 :]
    return e[:, 0]


def use_chunks(x: torch.Tensor, chunk: int | None) -> bool:
    """Whether an encode / decode of ``x`` takes the chunked path: on CPU above one chunk, or when a test
    forces it by passing ``chunk``."""
    return chunk is not None or (x.device.type == "cpu" and x.numel() > CHUNK)


class Codec(abc.ABC):
    """Encode a 1-D floating tensor to a fixed-size byte payload and decode it back to FP32."""

    name: str
    bits_per_value: float  # nominal bits per element, scales included, for large numel
    #: False for sparse payloads (top-k): the sum of two of them is not one of them, so the reduce-scatter
    #: exchange (which re-encodes each shard's mean) cannot carry them: the communicator all-gathers them.
    reduces_in_place: bool = True
    #: Whether :meth:`decode` takes the chunked path (:meth:`_decode_chunked`) on CPU.
    chunked_decode: bool = False

    @abc.abstractmethod
    def num_bytes(self, numel: int) -> int:
        """Exact payload size for ``numel`` elements (a function of numel only)."""

    def encode(self, x: torch.Tensor, *, chunk: int | None = None) -> torch.Tensor:
        """1-D floating ``x`` -> 1-D uint8 payload of ``num_bytes(x.numel())`` bytes on ``x.device``.

        ``chunk``: values per chunk of the chunked path (default :data:`CHUNK` on CPU above one chunk,
        else the reference); the payload is the same bits either way.
        """
        if use_chunks(x, chunk) and type(self)._encode_chunked is not Codec._encode_chunked:
            return self._encode_chunked(x, chunk or CHUNK)
        return self.encode_reference(x)

    def decode(self, payload: torch.Tensor, numel: int, *, chunk: int | None = None) -> torch.Tensor:
        """Payload -> new 1-D float32 tensor of ``numel`` elements on ``payload.device`` (``chunk`` as
        :meth:`encode`)."""
        if use_chunks(payload, chunk) and numel > 0 and self.chunked_decode:
            return self._decode_chunked(payload, numel, chunk or CHUNK)
        return self.decode_reference(payload, numel)

    def decode_into(self, payload: torch.Tensor, numel: int, out: torch.Tensor) -> torch.Tensor:
        """:meth:`decode`, written into ``out`` (contiguous FP32, ``numel`` values) where the codec can: the same
        bits. Returns the decoded tensor: ``out``, or a new one from a codec without an in-place path. A caller that
        decodes many payloads into one buffer saves an allocation each, whose page faults on CPU cost as much as
        a fast decode (the decoupled syncer's merge)."""
        assert out.dtype == torch.float32 and out.numel() == numel and out.is_contiguous()
        return self.decode(payload, numel)

    def encode_reference(self, x: torch.Tensor) -> torch.Tensor:
        """The whole-tensor encode: what the chunked path must match bit for bit. (A codec may instead
        override :meth:`encode` and :meth:`decode` themselves.)"""
        raise NotImplementedError(f"{type(self).__name__} implements neither encode nor encode_reference")

    def decode_reference(self, payload: torch.Tensor, numel: int) -> torch.Tensor:
        """The whole-tensor decode: what the chunked path must match bit for bit."""
        raise NotImplementedError(f"{type(self).__name__} implements neither decode nor decode_reference")

    def _encode_chunked(self, x: torch.Tensor, chunk: int) -> torch.Tensor:
        raise NotImplementedError  # codecs without a chunked path run the reference

    def _decode_chunked(self, payload: torch.Tensor, numel: int, chunk: int) -> torch.Tensor:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, bits_per_value={self.bits_per_value})"

    # -- shared argument checks --------------------------------------------
    def _as_float32(self, x: torch.Tensor) -> torch.Tensor:
        """Validate ``x`` and return it as contiguous fp32 (a view when it already is)."""
        if not isinstance(x, torch.Tensor) or x.dim() != 1 or not x.is_floating_point():
            got = f"{x.dtype} tensor of shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else type(x).__name__
            raise ConfigError(f"{self.name}.encode expects a 1-D floating tensor, got {got}; flatten it first")
        x = x.detach()
        if torch.finfo(x.dtype).max > _F32_MAX:  # fp64: finite values beyond fp32 saturate, not inf
            x = x.clamp(-_F32_MAX, _F32_MAX)
        return x.to(torch.float32).contiguous()

    def _prepare(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (x as contiguous fp32, 0-d bool "x holds a non-finite value") without a host sync."""
        x32 = self._as_float32(x)
        return x32, ~all_finite(x32)

    def _check_payload(self, payload: torch.Tensor, numel: int) -> None:
        expected = self.num_bytes(numel)  # validates numel
        if not isinstance(payload, torch.Tensor) or payload.dtype != torch.uint8 or payload.shape != (expected,):
            got = f"{payload.dtype} of shape {tuple(payload.shape)}" if isinstance(payload, torch.Tensor) else payload
            raise ConfigError(
                f"{self.name}.decode: payload must be a 1-D uint8 tensor of num_bytes({numel}) = {expected} "
                f"bytes, got {got}; pass the numel that was encoded"
            )


def all_finite(x: torch.Tensor) -> torch.Tensor:
    """0-d bool tensor: every value of ``x`` is finite (no host sync on a GPU).

    For fp32, from the bits: a value is non-finite exactly when its exponent field is all
    ones, i.e. when its magnitude bits reach those of inf. On CPU, in one pass of the C loops
    (:mod:`diloco.wire.native`), or without them a chunk of :data:`CHUNK` values at a time into a
    kept buffer: no temporary of ``x``'s size (the fp32 codec and the decoupled syncer check
    every payload and merge). Elsewhere two passes and no boolean tensor of x's size, several
    times faster than ``torch.isfinite(x).all()``.
    """
    if x.dtype != torch.float32 or x.numel() == 0:
        return torch.isfinite(x).all()
    flat = x.reshape(-1) if x.is_contiguous() else x.reshape(-1).contiguous()
    if flat.device.type == "cpu":
        if native.usable(flat):
            return torch.tensor(native.abs_bits_max(flat) < _INF_BITS)
        return torch.tensor(_abs_bits_max_chunked(flat.view(torch.int32)) < _INF_BITS)
    return flat.view(torch.int32).bitwise_and(0x7FFFFFFF).amax() < _INF_BITS


_INF_BITS = 0x7F800000


def _abs_bits_max_chunked(bits: torch.Tensor, chunk: int = CHUNK) -> int:
    """``bits.bitwise_and(0x7FFFFFFF).amax()`` of 1-D int32 CPU ``bits``, a chunk at a time into one kept buffer."""
    buf = torch.empty(min(chunk, bits.numel()), dtype=torch.int32)
    top = 0
    for i in range(0, bits.numel(), chunk):
        part = buf[: min(chunk, bits.numel() - i)]
        torch.bitwise_and(bits[i : i + chunk], 0x7FFFFFFF, out=part)
        top = max(top, int(part.amax()))
    return top
