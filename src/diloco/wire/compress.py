"""Compressing codecs for outer gradients sent with error feedback: a statistical quantizer and chunked top-k.

Both are meant to run with an error-feedback accumulator
(:mod:`diloco.wire.error_feedback`): what they drop is kept by the replica
and sent later, so their loss is delayed rather than lost (MuLoCo, arXiv
2505.23725; SparseLoCo, arXiv 2508.15706). Like every codec they are stateless,
deterministic and map ``numel`` values to a payload whose size depends on
``numel`` only.

Statistical quantizer (``stat2``, ``stat4``): the values are cut into blocks of
``block_size`` (1024); in each block, with mean ``mu`` and standard deviation
``sigma`` (population), the range ``mu +- r * sigma`` is cut into ``L = 2^bits``
equal bins (values outside fall into the end bins). Each value sends its bin's
code; each block sends a table of ``L`` FP32 values, the mean of the block's
values that fell into each bin (the bin's centre when none did). Decoding looks
the code up in its block's table. r = 2 for 2 bits and 2.5 for 4 bits, the
best of r in {1.5, 2, 2.5, 3, 4, 6} on 1M N(0, 1) values: relative L2 errors
0.34 and 0.10 (the best any 4-level quantizer does on Gaussian data is 0.34);
``benchmarks/compress_codecs.py`` measures them. Layout: ``[codes][tables]``, codes
packed LSB first (``ceil(numel * bits / 8)`` bytes), then ``ceil(numel /
block_size) * L * 4`` bytes of tables.

Chunked top-k (``topk``): the values are cut into chunks of ``chunk_size``
(4096, the size of SparseLoCo's 64 x 64 tiles); each chunk sends its ``k`` values
of largest magnitude, ``k = ceil(density * chunk)`` (at least 1; density 1/64
by default: 64 of 4096). Indices are chunk-local, sorted, ``ceil(log2
chunk_size)`` bits each (12); values are 2-bit, quantized as above with r = 6 (SparseLoCo's 4 bins over
+-6 sigma of the selected values) and a table of 4 FP32 bin means: one for the
whole payload (``tables="payload"``), or one per chunk (``tables="chunk"``,
0.03 more bits per value), so that chunks of tensors of different scales keep
their own magnitudes (SparseLoCo takes its statistics per tensor).
Layout: ``[value codes][indices][tables]``, each packed LSB first. About
``density * (2 + 12)`` bits per value: 0.22 at 1/64 (0.25 with a table per
chunk). Sparse payloads cannot be summed in place (the sum of two top-k vectors is
not one), so the communicator all-gathers them at every M
(:attr:`Codec.reduces_in_place` is False): ``(M - 1) * n`` bytes each way per
replica instead of the reduce-scatter's ``2 (M - 1) / M * n``.

Non-finite input decodes to NaN (the tables are NaN), so the exchange drops
that replica, as with the other codecs. The statistics are FP32: values beyond
about 1e37 overflow them and that contribution decodes to NaN too (dropped),
where the wire formats of :mod:`diloco.wire.scaled` would scale them.
"""

from __future__ import annotations

import torch

from diloco.errors import ConfigError
from diloco.wire import native, sizes
from diloco.wire.codec import Codec, halves_sum, row_chunks
from diloco.wire.native import stat as native_stat


def pack_bits(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Non-negative integers below ``2^bits`` -> a uint8 bit stream, value i in bits [i*bits, (i+1)*bits), LSB first."""
    n = codes.numel()
    shifts = torch.arange(bits, device=codes.device, dtype=torch.int64)
    stream = ((codes.reshape(-1, 1).to(torch.int64) >> shifts) & 1).to(torch.uint8).reshape(-1)
    pad = -stream.numel() % 8
    if pad:
        stream = torch.cat([stream, stream.new_zeros(pad)])
    weights = 1 << torch.arange(8, device=codes.device, dtype=torch.int32)
    out = (stream.reshape(-1, 8).to(torch.int32) * weights).sum(1).to(torch.uint8)
    assert out.numel() == -(-n * bits // 8)
    return out


def unpack_bits(payload: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """Inverse of :func:`pack_bits`: the first ``count`` values (int64)."""
    shifts = torch.arange(8, device=payload.device, dtype=torch.int32)
    stream = ((payload.reshape(-1, 1).to(torch.int32) >> shifts) & 1).reshape(-1)[: count * bits]
    weights = 1 << torch.arange(bits, device=payload.device, dtype=torch.int64)
    return (stream.reshape(count, bits).to(torch.int64) * weights).sum(1)


def pack_small(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """:func:`pack_bits` for ``bits`` in (1, 2, 4, 8), the same bytes: ``8 / bits`` codes OR-ed into a byte."""
    assert 8 % bits == 0
    per = 8 // bits
    c = codes.reshape(-1).to(torch.uint8)
    if c.numel() % per:
        c = torch.cat([c, c.new_zeros(per - c.numel() % per)])
    c = c.view(-1, per)
    out = c[:, 0].clone()
    for j in range(1, per):
        out.bitwise_or_(c[:, j] << (bits * j))
    return out


def unpack_small(payload: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """:func:`unpack_bits` for ``bits`` in (1, 2, 4, 8): the first ``count`` codes (uint8)."""
    assert 8 % bits == 0
    shifts = torch.arange(0, 8, bits, device=payload.device, dtype=torch.uint8)
    return ((payload.reshape(-1, 1) >> shifts) & ((1 << bits) - 1)).reshape(-1)[:count]


def stat_quantize(xb: torch.Tensor, *, bits: int, range_sigmas: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of fp32 ``xb`` (shape (rows, n)) -> (codes int64 of xb's shape, tables fp32 of shape (rows, 2^bits)).

    Per row: ``2^bits`` equal bins over ``mean +- range_sigmas * std``; a row's table holds the mean
    of its values in each bin (the bin's centre if empty). Every sum is :func:`~diloco.wire.codec.halves_sum`
    (a fixed order, so each row's result is the same whatever rows it is computed with, and the C loops of
    :mod:`diloco.wire.native` repeat it): mean = sum / n, std = sqrt(sum((x - mean)^2) / n) (correctly rounded),
    a bin's total the sum of the row with the other bins' values replaced by 0.
    """
    levels, n = 1 << bits, xb.shape[1]
    mu = halves_sum(xb).unsqueeze(1) / n
    dev = xb - mu
    # the root in float64, rounded to float32: the correctly rounded float32 root, which C's sqrtf gives too
    # (torch's float32 sqrt on CPU may be an ulp off, and differently in its vectorised and scalar loops)
    sigma = (halves_sum(dev * dev) / n).double().sqrt_().float().unsqueeze(1)
    lo = mu - range_sigmas * sigma
    width = (2.0 * range_sigmas / levels) * sigma
    safe = torch.where(width > 0, width, torch.ones_like(width))
    codes = torch.floor((xb - lo) / safe).nan_to_num_(0.0).clamp_(0, levels - 1).to(torch.int64)
    table = torch.empty(xb.shape[0], levels, dtype=torch.float32, device=xb.device)
    for level in range(levels):
        mask = codes == level
        count = mask.sum(1)
        total = halves_sum(torch.where(mask, xb, 0.0))
        centre = (lo + (level + 0.5) * width).squeeze(1)
        table[:, level] = torch.where(count > 0, total / count.clamp(min=1), centre)
    return codes, table


class StatisticalCodec(Codec):
    """``bits``-bit codes over ``mean +- r sigma`` per block, with a table of bin means per block (see module)."""

    def __init__(self, *, bits: int, block_size: int = sizes.STAT_BLOCK, range_sigmas: float | None = None) -> None:
        if bits not in (1, 2, 4, 8):
            raise ConfigError(f"bits must be 1, 2, 4 or 8, got {bits}")
        if block_size < 1:
            raise ConfigError(f"block_size must be >= 1, got {block_size}")
        self.bits, self.block_size = bits, block_size
        self.range_sigmas = float(range_sigmas if range_sigmas is not None else (2.0 if bits <= 2 else 2.5))
        self.name = f"stat{bits}"
        self.bits_per_value = bits + (1 << bits) * 32 / block_size

    def __repr__(self) -> str:
        return f"StatisticalCodec(bits={self.bits}, block_size={self.block_size}, range_sigmas={self.range_sigmas})"

    def num_bytes(self, numel: int) -> int:
        return sizes.stat_bytes(numel, bits=self.bits, block_size=self.block_size)

    def encode_reference(self, x: torch.Tensor) -> torch.Tensor:
        x32, bad = self._prepare(x)
        n, B = x32.numel(), self.block_size
        full = (n // B) * B
        parts = [x32[:full].reshape(-1, B)] if full else []
        if full < n:
            parts.append(x32[full:].reshape(1, -1))
        codes, tables = [], []
        for xb in parts:
            c, t = stat_quantize(xb, bits=self.bits, range_sigmas=self.range_sigmas)
            codes.append(c.reshape(-1))
            tables.append(t)
        code = torch.cat(codes) if codes else x32.new_zeros(0, dtype=torch.int64)
        table = torch.cat(tables) if tables else x32.new_zeros(0, 1 << self.bits)
        table = torch.where(bad, torch.nan, table).contiguous()
        return torch.cat([pack_bits(code, self.bits), table.reshape(-1).view(torch.uint8)])

    def decode_reference(self, payload: torch.Tensor, numel: int) -> torch.Tensor:
        self._check_payload(payload, numel)
        n, B, L = numel, self.block_size, 1 << self.bits
        code_bytes = -(-n * self.bits // 8)
        codes = unpack_bits(payload[:code_bytes], self.bits, n)
        table = payload[code_bytes:].clone().view(torch.float32).reshape(-1, L)
        block = torch.arange(n, device=payload.device) // B
        return table[block, codes]

    def encode(self, x: torch.Tensor, *, chunk: int | None = None) -> torch.Tensor:
        """As :meth:`Codec.encode`; on CPU, without ``chunk``, through the C loops (:mod:`diloco.wire.native`): the
        same bytes."""
        if chunk is None and isinstance(x, torch.Tensor) and x.numel() and native_stat.supported(self):
            if native.usable(x):
                return native_stat.encode_stat(self, self._as_float32(x))
        return super().encode(x, chunk=chunk)

    def decode(self, payload: torch.Tensor, numel: int, *, chunk: int | None = None) -> torch.Tensor:
        if chunk is None and numel > 0 and native_stat.supported(self) and native.usable(payload):
            self._check_payload(payload, numel)
            return native_stat.decode_stat(self, payload, numel)
        return super().decode(payload, numel, chunk=chunk)

    def _encode_chunked(self, x: torch.Tensor, chunk: int) -> torch.Tensor:
        """:meth:`encode_reference`'s arithmetic on whole blocks, ``chunk`` values at a time (module docstring of
        :mod:`diloco.wire.codec`, "Speed"): :func:`stat_quantize` on a chunk of rows gives each row what it
        gives on all of them (its sums are :func:`~diloco.wire.codec.halves_sum`, row by row). Codes are packed
        a byte at a time."""
        x32 = self._as_float32(x)
        n, B, L = x32.numel(), self.block_size, 1 << self.bits
        if 8 % self.bits or B % 8:
            return self.encode_reference(x32)
        chunk = min(chunk, (1 << 20) // L)  # the masked sums hold L values per value of a chunk
        full = (n // B) * B
        n_code = -(-n * self.bits // 8)
        rows = -(-n // B)
        codes_out = torch.empty(n_code, dtype=torch.uint8, device=x32.device)
        table = torch.empty(rows, L, device=x32.device)
        bits = x32.view(torch.int32)
        top = torch.zeros((), dtype=torch.int32, device=x32.device)
        full_rows = full // B
        bounds = row_chunks(full_rows, chunk // B) if full_rows else []
        parts = [(r0 * B, x32[r0 * B : r1 * B].view(-1, B)) for r0, r1 in bounds]
        if full < n:
            parts.append((full, x32[full:].view(1, -1)))  # the last, partial block: its own row, as the reference
        for start, xb in parts:
            top = torch.maximum(top, bits[start : start + xb.numel()].bitwise_and(0x7FFFFFFF).amax())
            codes, table[start // B : start // B + xb.shape[0]] = stat_quantize(
                xb, bits=self.bits, range_sigmas=self.range_sigmas
            )
            b0 = start * self.bits // 8
            packed = pack_small(codes, self.bits)
            codes_out[b0 : b0 + packed.numel()] = packed[: n_code - b0]
        if bool(top >= 0x7F800000):  # a non-finite value: NaN tables, as the reference
            table.fill_(torch.nan)
        return torch.cat([codes_out, table.reshape(-1).view(torch.uint8)])

    chunked_decode = True

    def _decode_chunked(self, payload: torch.Tensor, numel: int, chunk: int) -> torch.Tensor:
        self._check_payload(payload, numel)
        n, B, L = numel, self.block_size, 1 << self.bits
        if 8 % self.bits or B % 8:
            return self.decode_reference(payload, numel)
        code_bytes = -(-n * self.bits // 8)
        table = payload[code_bytes:].clone().view(torch.float32).reshape(-1, L)
        out = torch.empty(n, device=payload.device)
        rows_per = max(1, chunk // B)
        for r0 in range(0, table.shape[0], rows_per):
            r1 = min(table.shape[0], r0 + rows_per)
            lo, hi = r0 * B, min(n, r1 * B)
            codes = unpack_small(payload[lo * self.bits // 8 : -(-hi * self.bits // 8)], self.bits, hi - lo).long()
            full_rows = (hi - lo) // B
            if full_rows:
                torch.gather(
                    table[r0 : r0 + full_rows],
                    1,
                    codes[: full_rows * B].view(-1, B),
                    out=out[lo : lo + full_rows * B].view(-1, B),
                )
            if lo + full_rows * B < hi:
                out[lo + full_rows * B : hi] = table[r0 + full_rows][codes[full_rows * B :]]
        return out


def _chunk_sizes(numel: int, chunk: int) -> list[int]:
    full, rest = divmod(numel, chunk)
    return [chunk] * full + ([rest] if rest else [])


class TopKCodec(Codec):
    """Chunked top-k by magnitude: packed chunk-local indices and 2-bit statistical values (see module)."""

    name = "topk"
    reduces_in_place = False

    def __init__(
        self,
        *,
        density: float = sizes.TOPK_DENSITY,
        chunk_size: int = sizes.TOPK_CHUNK,
        value_bits: int = sizes.TOPK_VALUE_BITS,
        range_sigmas: float = 6.0,
        tables: str = sizes.TOPK_TABLE,
    ) -> None:
        if not (isinstance(density, (int, float)) and 0.0 < density <= 1.0):
            raise ConfigError(
                f"topk density must lie in (0, 1] (the share of each chunk's values sent), "
                f"got {density!r}; e.g. 1/64 = 0.015625"
            )
        if chunk_size < 2:
            raise ConfigError(f"chunk_size must be >= 2, got {chunk_size}")
        self.density, self.chunk_size = float(density), chunk_size
        self.value_bits, self.range_sigmas = value_bits, float(range_sigmas)
        self.index_bits = sizes.topk_index_bits(chunk_size)
        self.tables = sizes.check_topk_tables(tables)
        table_bits = (1 << value_bits) * 32 / chunk_size if tables == "chunk" else 0.0
        self.bits_per_value = self.density * (value_bits + self.index_bits) + table_bits

    def __repr__(self) -> str:
        return (
            f"TopKCodec(density={self.density}, chunk_size={self.chunk_size}, value_bits={self.value_bits}, "
            f"tables={self.tables!r})"
        )

    def k_of(self, chunk: int) -> int:
        """Values sent from a chunk of ``chunk`` values: ``ceil(density * chunk)``, at least 1, at most all."""
        return sizes.topk_k(chunk, self.density)

    def num_selected(self, numel: int) -> int:
        return sizes.topk_selected(numel, density=self.density, chunk_size=self.chunk_size)

    def num_bytes(self, numel: int) -> int:
        return sizes.topk_bytes(
            numel, density=self.density, chunk_size=self.chunk_size, value_bits=self.value_bits, tables=self.tables
        )

    def select(self, x32: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(chunk-local indices, global positions) of the values sent, chunk by chunk, sorted within each."""
        n, C = x32.numel(), self.chunk_size
        full = (n // C) * C
        local, start = [], []
        if full:
            k = self.k_of(C)
            idx = x32[:full].reshape(-1, C).abs().topk(k, dim=1, sorted=False).indices.sort(dim=1).values
            local.append(idx.reshape(-1))
            start.append((torch.arange(full // C, device=x32.device) * C).repeat_interleave(k))
        if full < n:
            idx = x32[full:].abs().topk(self.k_of(n - full), sorted=False).indices.sort().values
            local.append(idx)
            start.append(torch.full_like(idx, full))
        if not local:
            empty = torch.zeros(0, dtype=torch.int64, device=x32.device)
            return empty, empty
        local_idx = torch.cat(local)
        return local_idx, local_idx + torch.cat(start)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        x32, bad = self._prepare(x)
        local, pos = self.select(x32)
        values = x32[pos]
        codes, tables = [values.new_zeros(0, dtype=torch.int64)], []
        start = 0
        for rows, width in self._table_groups(x32.numel()):
            c, t = stat_quantize(
                values[start : start + rows * width].reshape(rows, width),
                bits=self.value_bits,
                range_sigmas=self.range_sigmas,
            )
            codes.append(c.reshape(-1))
            tables.append(t)
            start += rows * width
        if not tables and self.tables == "payload":
            tables.append(torch.zeros(1, 1 << self.value_bits, device=x32.device))
        table = torch.cat(tables) if tables else x32.new_zeros(0, 1 << self.value_bits)
        table = torch.where(bad, torch.nan, table).contiguous()
        return torch.cat(
            [
                pack_bits(torch.cat(codes), self.value_bits),
                pack_bits(local, self.index_bits),
                table.reshape(-1).view(torch.uint8),
            ]
        )

    def _table_groups(self, numel: int) -> list[tuple[int, int]]:
        """(tables, selected values each) in payload order: one table for all, or one per chunk."""
        if numel == 0:
            return []
        if self.tables == "payload":
            return [(1, self.num_selected(numel))]
        full, rest = divmod(numel, self.chunk_size)
        return [(full, self.k_of(self.chunk_size))] * bool(full) + [(1, self.k_of(rest))] * bool(rest)

    def decode(self, payload: torch.Tensor, numel: int) -> torch.Tensor:
        self._check_payload(payload, numel)
        k = self.num_selected(numel)
        vb = -(-k * self.value_bits // 8)
        ib = -(-k * self.index_bits // 8)
        codes = unpack_bits(payload[:vb], self.value_bits, k)
        local = unpack_bits(payload[vb : vb + ib], self.index_bits, k)
        table = payload[vb + ib :].clone().view(torch.float32).reshape(-1, 1 << self.value_bits)
        starts = [0]
        for c in _chunk_sizes(numel, self.chunk_size)[:-1]:
            starts.append(starts[-1] + c)
        ks = [self.k_of(c) for c in _chunk_sizes(numel, self.chunk_size)]
        offsets = (
            torch.tensor(starts, dtype=torch.int64, device=payload.device).repeat_interleave(
                torch.tensor(ks, dtype=torch.int64, device=payload.device)
            )
            if ks
            else local
        )
        widths = [width for rows, width in self._table_groups(numel) for _ in range(rows)]
        row = (
            torch.arange(len(widths), device=payload.device).repeat_interleave(
                torch.tensor(widths, dtype=torch.int64, device=payload.device)
            )
            if widths
            else codes
        )
        out = torch.zeros(numel, dtype=torch.float32, device=payload.device)
        out[local + offsets] = table[row, codes]
        return out


__all__ = ["StatisticalCodec", "TopKCodec", "pack_bits", "stat_quantize", "unpack_bits"]
