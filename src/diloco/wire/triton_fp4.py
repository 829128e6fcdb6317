"""Triton kernels of the FP4 codecs (``fp4_e2m1``, ``fp4_e3m0`` at block 16, 4 scale candidates) on CUDA.

Each kernel repeats the arithmetic of the codec's torch reference (:meth:`BlockScaledCodec.encode_reference`,
:meth:`decode_reference` in :mod:`diloco.wire.scaled`) value by value, so the payload is the reference's byte for
byte and the decoded values its bits. The encode is three launches: :func:`_abs_max_kernel` and torch's ``amax``
of its parts give the tensor's largest magnitude bits (an integer max: exact, in any order); then
:func:`_encode_kernel` derives the tensor exponent from them and quantizes ``ROWS`` blocks per program, a block a
lane (one a thread): its absmax, the four candidate scales, the element rounding and the block error, then the
codes, the block scales and (program 0) the tensor scale. A non-finite input (its largest bits reach inf's) gets
the reference's defined payload (codes 0, E4M3 NaN scales, the E8M0 NaN tensor scale) from the same kernel: no
host synchronisation. The decode is one launch.

What keeps the bits:

* every division is ``tl.math.div_rn`` (IEEE round to nearest; Triton's ``/`` on fp32 lowers to an
  approximate division on NVIDIA GPUs), and the kernels are launched with ``enable_fp_fusion=False`` (no
  fused multiply-add: the reference rounds every product, and the E4M3 conversion's add must round too);
* the block error is summed halves first (:func:`diloco.wire.codec.halves_sum`) as explicit pairwise
  additions (:func:`_halves_sum16`; a block is a lane, its 16 values 16 tensors), never ``tl.sum``, whose
  order is unspecified;
* the rounding to FP4 is integer arithmetic on the fp32 bits and comparisons (no float rounding tricks to fold),
  the E4M3 conversion c10's bit arithmetic (its one float addition rounds the subnormal scales), and the E4M3
  and FP4 values are built from their bits: no library math calls (whose flush-to-zero variants differ);
* maxima are order-free; the candidate search keeps the first of equal errors, as the reference.

What the CPU tests cannot check. ``tests/unit/test_codec_triton.py`` runs these kernels in Triton's interpreter
(``TRITON_INTERPRET=1``, numpy on the CPU): that checks the algorithm (every operation, its order, the layout of
the payload) against the reference on ties at every scale, subnormals, extremes, zeros, odd lengths, non-finite
input and blocks whose winning scale depends on the summation order. It cannot check the GPU lowering: that
``div_rn`` compiles to an IEEE division, that no multiply and add fuse, that no operation flushes subnormals to
zero. ``tests/unit/test_codec_triton_ptx.py`` compiles the kernels for sm_90 without a GPU and checks their PTX
for exactly that (``div.rn.f32``, no ``fma``, no ``div.approx`` / ``div.full``, no ``.ftz``); what PTX cannot
show (ptxas and the hardware) ``tests/gpu/test_gpu_triton_codecs.py`` checks on a GPU, comparing kernel and
reference bytes on large tensors. :func:`diloco.wire.triton_codecs.usable` also checks the kernels against the
reference once per device before it lets the codecs use them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

#: Values per block, and blocks per program of the encode (one a thread at 4 warps) and decode.
BLOCK = 16
ROWS = 128
#: Values per tile of the absmax pass, and its largest grid (each program loops over tiles and writes TILE maxima).
TILE = 1024
MAX_PROGRAMS = 1024
_F32_MAX = tl.constexpr(3.4028234663852886e38)  # a global a kernel reads must be a constexpr
#: The compile options of every launch: no fused multiply-add (the reference rounds every product).
OPTIONS = {"enable_fp_fusion": False}
#: Warps per program of the encode and decode.
WARPS = 4


@triton.jit
def _abs_max_kernel(x_ptr, part_ptr, n, TILE: tl.constexpr):
    """``part[pid]``: the largest |x| bits (non-negative floats order like their bits; NaN's exceed inf's) at each
    of the ``TILE`` positions of this program's tiles, an elementwise integer max; torch's ``amax`` of the parts is
    then the tensor's, exactly, in any order."""
    pid = tl.program_id(0).to(tl.int64)
    acc = tl.full([TILE], 0, tl.int32)
    for start in range(pid * TILE, n, tl.num_programs(0) * TILE):
        offs = start + tl.arange(0, TILE)
        bits = tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.int32, bitcast=True)
        acc = tl.maximum(acc, bits & 0x7FFFFFFF)
    tl.store(part_ptr + pid * TILE + tl.arange(0, TILE), acc)


@triton.jit
def _tensor_exponent(top, TOP: tl.constexpr, POW_J0: tl.constexpr, J0: tl.constexpr):
    """``BlockScaledCodec._tensor_exponent`` of the finite absmax with bits ``top``: frexp from the bits.

    amax = frac * 2^e with frac in [0.5, 1); k = clamp(e - j, -126, 126) with j = J0 - (frac * 2^J0 > TOP). A
    subnormal amax has e <= -126 where the bits say -126 (exponent field 0): either way k = -126 after the clamp.
    Zero has frexp (0, 0), so k = -J0.
    """
    frac = ((top & 0x7FFFFF) | 0x3F000000).to(tl.float32, bitcast=True)
    j = J0 - (frac * POW_J0 > TOP).to(tl.int32)
    k = tl.minimum(tl.maximum((top >> 23) - 126 - j, -126), 126)
    return tl.where(top == 0, -J0, k)


@triton.jit
def _e4m3_code(f):
    """c10's fp32 -> float8_e4m3fn conversion (round to nearest even) of finite ``f >= 0``, as int32 codes."""
    bits = f.to(tl.int32, bitcast=True)
    sub = (f + 16384.0).to(tl.int32, bitcast=True) - (141 << 23)  # the float add rounds to E4M3's subnormal grid
    norm = (bits + (((7 - 127) << 23) + 0x7FFFF) + ((bits >> 20) & 1)) >> 20
    r = tl.where(bits < (121 << 23), sub, norm)
    r = tl.where(bits >= (1087 << 20), 0x7F, r)
    return r & 0xFF


@triton.jit
def _e4m3_value(c):
    """The fp32 value of E4M3 codes ``c`` (int32, 0..255), built from the bits (NaN for 0x7F and 0xFF)."""
    e = (c >> 3) & 15
    m = c & 7
    normal = ((e + 120) << 23) | (m << 20)
    sub = (m.to(tl.float32) * 0.001953125).to(tl.int32, bitcast=True)  # m * 2^-9, exact
    bits = tl.where(e == 0, sub, normal)
    bits = tl.where((c & 0x7F) == 0x7F, 0x7FC00000, bits)
    return (bits | ((c & 0x80) << 24)).to(tl.float32, bitcast=True)


@triton.jit
def _round_fp4(y, FMT: tl.constexpr):
    """``FP4Codec._round_into`` of finite ``y >= 0``: the nearest magnitude, ties to the even code, saturating.

    E2M1 (FMT 0): from 1 up, y rounded to one significand bit on its bits, clamped to [1, 6]; below 1 the
    reference's ``round(2y) / 2`` is 0 up to the tie 0.25, 0.5 below the tie 0.75, then 1. E3M0 (FMT 1): the
    significand rounded away on the bits (ties to an even exponent), clamped to [0.25, 16], 0 where y <= 0.125.
    """
    bits = y.to(tl.int32, bitcast=True)
    if FMT == 0:
        r = (((bits >> 22) & 1) + 0x1FFFFF + bits) & -(1 << 22)
        hi = tl.minimum(tl.maximum(r, 0x3F800000), 0x40C00000).to(tl.float32, bitcast=True)
        return tl.where(y >= 1.0, hi, tl.where(y >= 0.75, 1.0, tl.where(y > 0.25, 0.5, 0.0)))
    else:
        r = (((bits >> 23) & 1) + 0x3FFFFF + bits) & 0x7F800000
        v = tl.minimum(tl.maximum(r, 0x3E800000), 0x41800000).to(tl.float32, bitcast=True)
        return tl.where(y > 0.125, v, 0.0)


@triton.jit
def _fp4_code(v, FMT: tl.constexpr):
    """``FP4Codec._codes_into``: a magnitude -> its 3-bit code (int32)."""
    bits = v.to(tl.int32, bitcast=True)
    if FMT == 0:
        return tl.maximum((bits >> 22) - 252, 0) + (v == 0.5).to(tl.int32)
    else:
        return tl.maximum((bits >> 23) - 124, 0)


@triton.jit
def _signed_code(v, x, FMT: tl.constexpr):
    """``FP4Codec._signed_codes`` of one value: the magnitude code of ``v``, plus 8 where ``x`` is negative and the
    code is not 0 (zero is always +0)."""
    code = _fp4_code(v, FMT)
    return code + tl.where(code > 0, (x.to(tl.int32, bitcast=True) >> 28) & 8, 0)


@triton.jit
def _fp4_value(c, FMT: tl.constexpr):
    """The fp32 value of FP4 codes ``c`` (int32, 0..15: sign << 3 | magnitude code), from the bits; code 8 is -0."""
    mc = c & 7
    if FMT == 0:
        bits = tl.where(mc >= 2, (mc + 252) << 22, tl.where(mc == 1, 0x3F000000, 0))
    else:
        bits = tl.where(mc >= 1, (mc + 124) << 23, 0)
    return (bits | ((c & 8) << 28)).to(tl.float32, bitcast=True)


@triton.jit
def _halves_sum16(e):
    """The sum of a block's 16 values ``e`` (a tuple of 16 tensors, value j of each block) in :func:`halves_sum`'s
    order: e[j] + e[j + 8], then j + 4, j + 2, j + 1, every addition explicit (never ``tl.sum``: its order is
    unspecified; and ``triton.language``'s own ``@jit`` functions are built for the GPU or the interpreter when
    triton is imported, so a test could not load these kernels for the interpreter after something imported it)."""
    a = ()
    for j in tl.static_range(8):
        a = a + (e[j] + e[j + 8],)
    b = ()
    for j in tl.static_range(4):
        b = b + (a[j] + a[j + 4],)
    c = (b[0] + b[2], b[1] + b[3])
    return c[0] + c[1]


@triton.jit
def _candidate(mags, sf, FMT: tl.constexpr):
    """One candidate scale ``sf`` of the blocks: their 16 rounded magnitudes (a tuple) and the blocks' squared error."""
    d = tl.where(sf > 0.0, sf, 1.0)  # s = 0: the block is 0
    vs = ()
    es = ()
    for j in tl.static_range(16):
        v = _round_fp4(tl.math.div_rn(mags[j], d), FMT)
        t = v * sf - mags[j]
        vs = vs + (v,)
        es = es + (t * t,)
    return vs, _halves_sum16(es)


@triton.jit
def _encode_kernel(
    x_ptr,
    top_ptr,
    out_ptr,
    n,
    n_code,
    rows,
    FMT: tl.constexpr,
    ELEM_MAX: tl.constexpr,
    TOP: tl.constexpr,
    POW_J0: tl.constexpr,
    J0: tl.constexpr,
    R: tl.constexpr,
):
    """``BlockScaledCodec.encode_reference`` for ``R`` blocks of 16 values; the payload into ``out_ptr``.

    A block is one lane: value j of the ``R`` blocks is the j-th of 16 tensors of shape [R] (a tuple), so every
    operation over a block is elementwise over the lanes (no data moves between threads) and its order is the
    code's. With ``R`` = 32 x warps each thread holds one block.
    """
    pid = tl.program_id(0)
    top = tl.load(top_ptr)
    bad = top >= 0x7F800000  # a NaN or inf somewhere: the defined all-NaN payload
    k = _tensor_exponent(tl.where(bad, 0, top), TOP, POW_J0, J0)
    scale = ((127 - k) << 23).to(tl.float32, bitcast=True)  # 2^-k, a normal fp32
    row = pid.to(tl.int64) * R + tl.arange(0, R)
    xs = ()
    mags = ()
    amax = tl.full([R], 0.0, tl.float32)
    for j in tl.static_range(16):
        offs = row * 16 + j
        x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)  # the last block zero-padded, as the reference
        mag = tl.abs(x) * scale  # exact but where the product is subnormal: then rounded, as the reference
        xs = xs + (x,)
        mags = mags + (mag,)
        amax = tl.maximum(amax, mag)  # order-free; max commutes with the monotone scaling: the scaled block absmax
    s = _e4m3_code(tl.math.div_rn(amax, ELEM_MAX))
    up = s + (_e4m3_value(s) * ELEM_MAX < amax).to(tl.int32)  # the smallest scale that clips nothing
    lowest = tl.minimum(up, 1)  # a nonzero block never steps down to the zero scale
    best_sc = up
    best_v, best_err = _candidate(mags, _e4m3_value(up), FMT)
    for i in tl.static_range(1, 4):
        sc = tl.maximum(up - i, lowest)
        v, err = _candidate(mags, _e4m3_value(sc), FMT)
        better = err < best_err  # the first (larger) scale on ties
        chosen = ()
        for j in tl.static_range(16):
            chosen = chosen + (tl.where(better, v[j], best_v[j]),)
        best_v = chosen
        best_sc = tl.where(better, sc, best_sc)
        best_err = tl.where(better, err, best_err)
    for j in tl.static_range(8):  # element 2j in the low nibble of byte j
        lo = _signed_code(best_v[2 * j], xs[2 * j], FMT)
        hi = _signed_code(best_v[2 * j + 1], xs[2 * j + 1], FMT)
        boffs = row * 8 + j
        tl.store(out_ptr + boffs, tl.where(bad, 0, lo | (hi << 4)).to(tl.uint8), mask=boffs < n_code)
    tl.store(out_ptr + n_code + row, tl.where(bad, 0x7F, best_sc).to(tl.uint8), mask=row < rows)
    if pid == 0:
        tl.store(out_ptr + n_code + rows, tl.where(bad, 0xFF, k + 127).to(tl.uint8))


@triton.jit
def _decode_kernel(p_ptr, out_ptr, n, n_code, rows, FMT: tl.constexpr, R: tl.constexpr):
    """``BlockScaledCodec.decode_reference`` for ``R`` blocks: ``clamp((value * s_b) * 2^k)``, NaN for E8M0's NaN."""
    pid = tl.program_id(0)
    t = tl.load(p_ptr + n_code + rows).to(tl.int32)
    e = tl.minimum(tl.maximum(t - 127, -126), 127)
    factor = tl.where(t == 0xFF, 0x7FC00000, (e + 127) << 23).to(tl.float32, bitcast=True)
    row = pid.to(tl.int64) * R + tl.arange(0, R)
    boffs = row[:, None] * 8 + tl.arange(0, 8)[None, :]
    b = tl.load(p_ptr + boffs, mask=boffs < n_code, other=0).to(tl.int32)
    c = tl.reshape(tl.join(b & 15, b >> 4), [R, 16])  # element 2i from the low nibble
    sb = _e4m3_value(tl.load(p_ptr + n_code + row, mask=row < rows, other=0).to(tl.int32))
    y = (_fp4_value(c, FMT) * sb[:, None]) * factor
    y = tl.where(y > _F32_MAX, _F32_MAX, tl.where(y < -_F32_MAX, -_F32_MAX, y))  # selects: NaN stays NaN
    offs = row[:, None] * 16 + tl.arange(0, 16)[None, :]
    tl.store(out_ptr + offs, y, mask=offs < n)


def encode(
    x32: torch.Tensor,
    payload: torch.Tensor,
    *,
    fmt: int,
    elem_max: float,
    top: float,
    j0: int,
    rows: int | None = None,
    warps: int = WARPS,
    maxnreg: int | None = None,
) -> tuple:
    """Write the payload of contiguous fp32 ``x32`` (at least one value) into ``payload`` (uint8, on its device).

    ``fmt``: 0 E2M1, 1 E3M0; ``elem_max``, ``top`` (= 448 * elem_max) and ``j0`` the codec's (see
    ``BlockScaledCodec._tensor_exponent``). ``rows`` defaults to :data:`ROWS` (read at the call). Returns what the two launches return: on a GPU the compiled kernels
    (``.asm["ptx"]``: what the GPU tests inspect), in the interpreter None. ``rows`` (blocks per program, a power
    of two), ``warps`` and ``maxnreg`` (a cap on the encode's registers per thread) change the speed, never the
    bytes (``benchmarks/gpu_check.py`` times a few).
    """
    n, rows = x32.numel(), rows or ROWS
    n_rows = -(-n // BLOCK)
    n_code = -(-n // 2)
    assert payload.numel() == n_code + n_rows + 1 and n > 0
    programs = min(-(-n // TILE), MAX_PROGRAMS)
    parts = torch.empty(programs * TILE, dtype=torch.int32, device=x32.device)
    first = _abs_max_kernel[(programs,)](x32, parts, n, TILE=TILE, **OPTIONS)
    top_bits = parts.amax().reshape(1)  # an integer max: exact; on the device, no host synchronisation
    second = _encode_kernel[(-(-n_rows // rows),)](
        x32,
        top_bits,
        payload,
        n,
        n_code,
        n_rows,
        FMT=fmt,
        ELEM_MAX=elem_max,
        TOP=top,
        POW_J0=float(2**j0),
        J0=j0,
        R=rows,
        num_warps=warps,
        **OPTIONS,
        **({} if maxnreg is None else {"maxnreg": maxnreg}),
    )
    return first, second


def decode(
    payload: torch.Tensor, n: int, out: torch.Tensor, *, fmt: int, rows: int | None = None, warps: int = WARPS
) -> object:
    """Write the ``n`` values of an FP4 payload (contiguous uint8) into ``out`` (contiguous fp32, ``n`` values).
    Returns what the launch returns (as :func:`encode`)."""
    n_rows, rows = -(-n // BLOCK), rows or ROWS
    n_code = -(-n // 2)
    assert payload.numel() == n_code + n_rows + 1 and out.numel() == n and n > 0
    grid = (-(-n_rows // rows),)
    return _decode_kernel[grid](payload, out, n, n_code, n_rows, FMT=fmt, R=rows, num_warps=warps, **OPTIONS)
