/* Fused CPU loops of the block-scaled and bf16 codecs (diloco.wire.native builds and loads them).
 *
 * Each function repeats, element by element, the arithmetic of the codec's torch reference
 * (diloco/wire/scaled.py, floats.py): the same fp32 operations in the same order, so the bytes
 * are the reference's. It is built with -ffp-contract=off (no fused multiply-add: torch's
 * reference rounds every product) and without -ffast-math. A function handles a range of
 * blocks; its *_mt entry point splits a tensor across threads (common.h, SPLIT).
 */
#include "common.h"

/* c10's fp32 -> float8_e4m3fn conversion (round to nearest even; >= 480 gives NaN). */
static inline uint8_t e4m3_from_f32(float f) {
    const uint32_t fp8_max = UINT32_C(1087) << 20;
    const uint32_t denorm_mask = UINT32_C(141) << 23;
    uint32_t f_bits = f2u(f);
    uint8_t result;
    const uint32_t sign = f_bits & UINT32_C(0x80000000);
    f_bits ^= sign;
    if (f_bits >= fp8_max) {
        result = 0x7f;
    } else if (f_bits < (UINT32_C(121) << 23)) {
        float g = u2f(f_bits) + u2f(denorm_mask);
        result = (uint8_t)(f2u(g) - denorm_mask);
    } else {
        uint8_t mant_odd = (f_bits >> 20) & 1;
        f_bits += ((uint32_t)(7 - 127) << 23) + 0x7FFFF;
        f_bits += mant_odd;
        result = (uint8_t)(f_bits >> 20);
    }
    return result | (uint8_t)(sign >> 24);
}

/* FP4Codec._round_into (E2M1: fmt 0, E3M0: fmt 1); y >= 0 and finite. */
static inline float round_fp4(float y, int fmt) {
    int32_t bits = (int32_t)f2u(y);
    if (fmt == 0) {
        int32_t r = ((bits >> 22) & 1) + 0x1FFFFF + bits;
        r &= -(1 << 22);
        if (r < 0x3F800000) r = 0x3F800000;       /* 1.0 */
        if (r > 0x40C00000) r = 0x40C00000;       /* 6.0 */
        float hi = u2f((uint32_t)r);
        float lo = nearbyintf(y * 2.0f);
        if (lo > 2.0f) lo = 2.0f;
        return (hi + lo * 0.5f) - 1.0f;
    }
    int32_t r = ((bits >> 23) & 1) + 0x3FFFFF + bits;
    r &= 0x7F800000;
    if (r < 0x3E800000) r = 0x3E800000;           /* 0.25 */
    if (r > 0x41800000) r = 0x41800000;           /* 16.0 */
    float v = u2f((uint32_t)r);
    float t = (y <= 0.125f ? 0.0f : y) * 128.0f;
    return t < v ? t : v;
}

/* FP4Codec._codes_into: a magnitude -> its 3-bit code. */
static inline int32_t fp4_code(float v, int fmt) {
    int32_t bits = (int32_t)f2u(v);
    if (fmt == 0) {
        int32_t c = (bits >> 22) - 252;
        return (c < 0 ? 0 : c) + (v == 0.5f);
    }
    int32_t c = (bits >> 23) - 124;
    return c < 0 ? 0 : c;
}

/* The block error: squares summed pairwise, halves first (halves_sum in diloco/wire/codec.py). */
static inline __attribute__((always_inline)) float tree_sum(float *e, int64_t B) {
    int64_t w = B;
    while (w > 1) {
        if (w & 1) { e[0] = e[0] + e[w - 1]; w -= 1; }
        int64_t h = w / 2;
        for (int64_t j = 0; j < h; j++) e[j] = e[j] + e[j + h];
        w = h;
    }
    return e[0];
}

typedef float v16f __attribute__((vector_size(64)));
typedef float v8f __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));
typedef float v2f __attribute__((vector_size(8)));

/* tree_sum for B = 16 in registers (the same additions: halves first). */
static inline __attribute__((always_inline)) float tree_sum16(const float *e) {
    v16f a;
    memcpy(&a, e, sizeof a);
    v8f b = __builtin_shufflevector(a, a, 0, 1, 2, 3, 4, 5, 6, 7) + __builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15);
    v4f c = __builtin_shufflevector(b, b, 0, 1, 2, 3) + __builtin_shufflevector(b, b, 4, 5, 6, 7);
    v2f d = __builtin_shufflevector(c, c, 0, 1) + __builtin_shufflevector(c, c, 2, 3);
    return d[0] + d[1];
}

/* Per-block absmax bits of |x| (blocks [b0, b1) of B values, the last padded with zeros):
 * amax_bits[b] and the largest over the range (returned). */
int32_t block_amax(const float *x, int64_t n, int64_t B, int64_t b0, int64_t b1, int32_t *amax_bits) {
    int32_t top = 0;
    for (int64_t b = b0; b < b1; b++) {
        int64_t i0 = b * B, i1 = i0 + B < n ? i0 + B : n;
        int32_t m = 0;
        for (int64_t i = i0; i < i1; i++) {
            int32_t a = (int32_t)(f2u(x[i]) & 0x7FFFFFFF);
            m = a > m ? a : m;
        }
        amax_bits[b] = m;
        top = m > top ? m : top;
    }
    return top;
}

/* One block of B values (mag: |x| * 2^-k, x: the signed values, both B long, zero-padded): the
 * candidate search of BlockScaledCodec._quantize_blocks; writes the element codes (one byte each
 * for int8, fmt 2; two nibbles a byte for FP4) and returns the E4M3 scale code. B is a constant
 * where the caller passes one; the loops over a block are kept whole (unroll 1) so that the compiler
 * vectorizes them (unrolled first, they are left scalar). */
static inline __attribute__((always_inline)) uint8_t quantize_block(
        const float *mag, const float *x, const int64_t B, int fmt, int cands, float elem_max, float amax,
        const float *e4m3, uint8_t *codes) {
    /* Every candidate is quantized apart (independent work the CPU overlaps), then the least error wins, the
     * first on ties: what the reference's running "err < best_err" keeps. */
    float v[8][256], e[256], err[8];
    uint8_t s = e4m3_from_f32(amax / elem_max);
    int up = (int)s + (e4m3[s] * elem_max < amax);
    int lowest = up < 1 ? up : 1;
    for (int c = 0; c < cands; c++) {
        int sc = up - c > lowest ? up - c : lowest;
        float sf = e4m3[sc & 0xFF];
        float d = sf > 0.0f ? sf : 1.0f;
        float *vc = v[c];
        if (fmt == 2) {
            #pragma GCC unroll 1
            for (int64_t j = 0; j < B; j++) {
                float y = mag[j] / d;
                vc[j] = nearbyintf(y < elem_max ? y : elem_max);
            }
        } else {
            #pragma GCC unroll 1
            for (int64_t j = 0; j < B; j++) vc[j] = round_fp4(mag[j] / d, fmt);
        }
        if (cands == 1) break;
        #pragma GCC unroll 1
        for (int64_t j = 0; j < B; j++) {
            float t = vc[j] * sf - mag[j];
            e[j] = t * t;
        }
        err[c] = B == 16 ? tree_sum16(e) : tree_sum(e, B);
    }
    int win = 0;
    for (int c = 1; c < cands; c++) win = err[c] < err[win] ? c : win;
    int best_sc = up - win > lowest ? up - win : lowest;
    const float *best = v[win];
    if (fmt == 2) {
        #pragma GCC unroll 1
        for (int64_t j = 0; j < B; j++) {
            int32_t q = (int32_t)best[j];
            codes[j] = (uint8_t)(int8_t)((int32_t)f2u(x[j]) < 0 ? -q : q);
        }
    } else {
        #pragma GCC unroll 1
        for (int64_t j = 0; j < B / 2; j++) {
            int32_t lo = fp4_code(best[2 * j], fmt), hi = fp4_code(best[2 * j + 1], fmt);
            lo += (lo > 0) * (int32_t)((f2u(x[2 * j]) >> 28) & 8);
            hi += (hi > 0) * (int32_t)((f2u(x[2 * j + 1]) >> 28) & 8);
            codes[j] = (uint8_t)(lo | (hi << 4));
        }
    }
    return (uint8_t)best_sc;
}

/* The FP4 search sixteen blocks at a time, one block a vector lane (GCC / Clang vector extensions; AVX-512
 * holds a lane set in one register, narrower machines split it). The same operations as quantize_block,
 * lane by lane, so the same bits: where quantize_block reduces across a register (the block error) and
 * branches per block, this adds registers and selects. It measured 2-2.5x faster. */
#define LANES 16
typedef float vf __attribute__((vector_size(64)));
typedef int32_t vi __attribute__((vector_size(64)));
static inline __attribute__((always_inline)) vf vsel(vi m, vf a, vf b) {  /* m ? a : b, lane by lane */
    return (vf)((m & (vi)a) | (~m & (vi)b));
}
static inline __attribute__((always_inline)) vi vclampi(vi r, int32_t lo, int32_t hi) {
    vi m = r < lo;
    r = (m & lo) | (~m & r);
    m = r > hi;
    return (m & hi) | (~m & r);
}
/* round_fp4 on a vector. E2M1's min(round(2y), 2) as round(min(2y, 2.5)) (2.5 rounds to even 2, and every 2y
 * above it to 2 or more), by the 1.5 * 2^23 trick (nearest even, exact for |t| <= 2^22). */
static inline __attribute__((always_inline)) vf vround_fp4(vf y, int fmt) {
    vi bits = (vi)y;
    if (fmt == 0) {
        vi r = ((bits >> 22) & 1) + 0x1FFFFF + bits;
        r &= -(1 << 22);
        r = vclampi(r, 0x3F800000, 0x40C00000);
        vf hi = (vf)r;
        vf t = y * 2.0f;
        t = vsel(t > 2.5f, (vf){} + 2.5f, t);  /* round(2.5) = 2: the clamp at 2 comes with the rounding */
        vf lo = (t + 12582912.0f) - 12582912.0f;
        return (hi + lo * 0.5f) - 1.0f;
    }
    vi r = ((bits >> 23) & 1) + 0x3FFFFF + bits;
    r &= 0x7F800000;
    r = vclampi(r, 0x3E800000, 0x41800000);
    vf v = (vf)r;
    vf t = vsel(y <= 0.125f, (vf){}, y) * 128.0f;
    return vsel(t < v, t, v);
}

/* quantize_block for the 16 blocks of 16 values at x (absmax bits at amax_bits): 128 code bytes, 16 scales. */
static inline __attribute__((always_inline)) void quantize_16_blocks(
        const float *x, const int32_t *amax_bits, int fmt, float elem_max, float scale, const float *e4m3,
        uint8_t *codes, uint8_t *scales) {
    vf mag[16], v[4][16], err[4];
    float sfa[4][LANES], da[4][LANES];
    int up[LANES], lowest[LANES];
    float tmp[16][LANES];
    for (int l = 0; l < LANES; l++)
        for (int j = 0; j < 16; j++) tmp[j][l] = x[l * 16 + j];
    for (int j = 0; j < 16; j++) {
        vf a; memcpy(&a, tmp[j], 64);
        mag[j] = (vf)((vi)a & 0x7FFFFFFF) * scale;
    }
    for (int l = 0; l < LANES; l++) {
        float amax = u2f((uint32_t)amax_bits[l]) * scale;
        uint8_t s = e4m3_from_f32(amax / elem_max);
        up[l] = (int)s + (e4m3[s] * elem_max < amax);
        lowest[l] = up[l] < 1 ? up[l] : 1;
        for (int c = 0; c < 4; c++) {
            int sc = up[l] - c > lowest[l] ? up[l] - c : lowest[l];
            sfa[c][l] = e4m3[sc & 0xFF];
            da[c][l] = sfa[c][l] > 0.0f ? sfa[c][l] : 1.0f;
        }
    }
    for (int c = 0; c < 4; c++) {
        vf sf, d, e[16];
        memcpy(&sf, sfa[c], 64); memcpy(&d, da[c], 64);
        for (int j = 0; j < 16; j++) {
            vf q = vround_fp4(mag[j] / d, fmt);
            vf t = q * sf - mag[j];
            v[c][j] = q;
            e[j] = t * t;
        }
        for (int h = 8; h >= 1; h /= 2)
            for (int j = 0; j < h; j++) e[j] = e[j] + e[j + h];
        err[c] = e[0];
    }
    vi win = (vi){};
    vf best_err = err[0];
    for (int c = 1; c < 4; c++) {
        vi better = err[c] < best_err;
        best_err = vsel(better, err[c], best_err);
        win = (better & c) | (~better & win);
    }
    int32_t wa[LANES];
    memcpy(wa, &win, 64);
    for (int l = 0; l < LANES; l++) scales[l] = (uint8_t)(up[l] - wa[l] > lowest[l] ? up[l] - wa[l] : lowest[l]);
    int32_t code[16][LANES];
    for (int j = 0; j < 16; j++) {
        vf b = v[0][j];
        b = vsel(win == 1, v[1][j], b);
        b = vsel(win == 2, v[2][j], b);
        b = vsel(win == 3, v[3][j], b);
        vi bits = (vi)b, k;
        if (fmt == 0) {
            k = (bits >> 22) - 252;
            k = k & ~(k < 0);
            k -= (b == 0.5f);   /* a true lane is -1 */
        } else {
            k = (bits >> 23) - 124;
            k = k & ~(k < 0);
        }
        vf a; memcpy(&a, tmp[j], 64);
        vi sign = ((vi)a >> 28) & 8;
        k += (k > 0) & sign;
        memcpy(code[j], &k, 64);
    }
    for (int l = 0; l < LANES; l++)
        for (int j = 0; j < 8; j++) codes[l * 8 + j] = (uint8_t)(code[2 * j][l] | (code[2 * j + 1][l] << 4));
}

#define FULL_BLOCKS(BLOCK, FMT, CANDS)                                                                             \
    for (; b < b_full; b++) {                                                                            \
        const float *xb = x + b * (BLOCK);                                                               \
        float mag[BLOCK];                                                                                \
        for (int64_t j = 0; j < (BLOCK); j++) mag[j] = fabsf(xb[j]) * scale;                              \
        float amax = u2f((uint32_t)amax_bits[b]) * scale;                                                \
        scales[b] = quantize_block(mag, xb, (BLOCK), (FMT), (CANDS), elem_max, amax, e4m3,                 \
                                   codes + ((FMT) == 2 ? b * (BLOCK) : b * (BLOCK) / 2));              \
    }

/* BlockScaledCodec._quantize_blocks for blocks [b0, b1): element codes into codes (n_code bytes in
 * all), E4M3 scale codes into scales. fmt: 0 E2M1, 1 E3M0, 2 int8. scale = 2^-k; e4m3 = the 256
 * E4M3 values. B <= 256 and even. */
void encode_blocks(const float *x, int64_t n, int64_t B, int64_t b0, int64_t b1, int fmt, int cands,
                   float elem_max, float scale, const int32_t *amax_bits, const float *e4m3,
                   uint8_t *codes, uint8_t *scales) {
    int64_t b = b0, b_full = n / B < b1 ? n / B : b1;
    if (B == 16 && fmt == 0 && cands == 4) {
        for (; b + LANES <= b_full; b += LANES)
            quantize_16_blocks(x + b * 16, amax_bits + b, 0, elem_max, scale, e4m3, codes + b * 8, scales + b);
        FULL_BLOCKS(16, 0, 4)
    } else if (B == 16 && fmt == 1 && cands == 4) {
        for (; b + LANES <= b_full; b += LANES)
            quantize_16_blocks(x + b * 16, amax_bits + b, 1, elem_max, scale, e4m3, codes + b * 8, scales + b);
        FULL_BLOCKS(16, 1, 4)
    } else if (B == 32 && fmt == 2 && cands == 1) {
        FULL_BLOCKS(32, 2, 1)
    } else {
        for (; b < b_full; b++) {
            float mag[256];
            for (int64_t j = 0; j < B; j++) mag[j] = fabsf(x[b * B + j]) * scale;
            float amax = u2f((uint32_t)amax_bits[b]) * scale;
            scales[b] = quantize_block(mag, x + b * B, B, fmt, cands, elem_max, amax, e4m3,
                                       codes + (fmt == 2 ? b * B : b * B / 2));
        }
    }
    for (; b < b1; b++) {  /* the last, partial block: zero-padded copies */
        float mag[256], xp[256];
        uint8_t out[256];
        int64_t i0 = b * B, m = n - i0;
        for (int64_t j = 0; j < B; j++) {
            xp[j] = j < m ? x[i0 + j] : 0.0f;
            mag[j] = fabsf(xp[j]) * scale;
        }
        float amax = u2f((uint32_t)amax_bits[b]) * scale;
        scales[b] = quantize_block(mag, xp, B, fmt, cands, elem_max, amax, e4m3, out);
        int64_t bytes = fmt == 2 ? m : (m + 1) / 2;
        memcpy(codes + (fmt == 2 ? i0 : i0 / 2), out, bytes);
    }
}

/* BlockScaledCodec.decode_reference for blocks [b0, b1): out[i] = clamp(value * s_b * factor).
 * values: the 16 FP4 values (fmt 0, 1) or NULL for int8 (fmt 2). */
typedef uint8_t vb16 __attribute__((vector_size(16)));
typedef float vf16 __attribute__((vector_size(64)));
typedef int32_t vi16 __attribute__((vector_size(64)));

/* decode_blocks' arithmetic on 16 FP4 values (8 code bytes), lane by lane: a table lookup (one permute on
 * AVX-512), the two products and the clamp as selects. */
static inline __attribute__((always_inline)) void decode_16_fp4(const uint8_t *codes, vf16 table, float sb,
                                                                 float factor, float *out) {
    const float fmax = 3.40282346638528859812e+38F;
    vb16 bytes = {0};
    memcpy(&bytes, codes, 8);
    vb16 pairs = __builtin_shuffle(bytes, (vb16){0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7});
    vi16 idx = __builtin_convertvector(pairs, vi16);
    idx = (idx >> (vi16){0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4}) & 0x0F;
    vf16 y = (__builtin_shuffle(table, idx) * sb) * factor;
    vi16 m = y > fmax;
    y = (vf16)((m & (vi16)((vf16){} + fmax)) | (~m & (vi16)y));
    m = y < -fmax;
    y = (vf16)((m & (vi16)((vf16){} - fmax)) | (~m & (vi16)y));
    memcpy(out, &y, 64);
}

void decode_blocks(const uint8_t *codes, const uint8_t *scales, int64_t n, int64_t B, int64_t b0, int64_t b1,
                   int fmt, const float *values, const float *e4m3, float factor, float *out) {
    const float fmax = 3.40282346638528859812e+38F;
    if (fmt != 2 && B % 16 == 0) {  /* FP4, whole blocks: 16 values at a time */
        vf16 table;
        memcpy(&table, values, 64);
        int64_t b_full = n / B < b1 ? n / B : b1;
        for (; b0 < b_full; b0++) {
            float sb = e4m3[scales[b0]];
            for (int64_t i = b0 * B; i < (b0 + 1) * B; i += 16)
                decode_16_fp4(codes + i / 2, table, sb, factor, out + i);
        }
    }
    for (int64_t b = b0; b < b1; b++) {
        float sb = e4m3[scales[b]];
        int64_t i0 = b * B, i1 = i0 + B < n ? i0 + B : n;
        for (int64_t i = i0; i < i1; i++) {
            float q;
            if (fmt == 2) q = (float)(int8_t)codes[i];
            else q = values[(codes[i >> 1] >> ((i & 1) * 4)) & 0x0F];
            float y = (q * sb) * factor;
            out[i] = y > fmax ? fmax : (y < -fmax ? -fmax : y);
        }
    }
}

/* BF16Codec: clamp to +-bf16 max, round to nearest even; returns the largest |x| bits seen
 * (>= 0x7F800000: a non-finite value, and the caller writes the all-NaN payload instead). */
int32_t bf16_encode(const float *x, int64_t i0, int64_t i1, uint16_t *out) {
    int32_t top = 0;
    for (int64_t i = i0; i < i1; i++) {
        uint32_t u = f2u(x[i]);
        int32_t a = (int32_t)(u & 0x7FFFFFFF);
        top = a > top ? a : top;
        if (a > 0x7F7F0000 && a < 0x7F800000) u = (u & 0x80000000) | 0x7F7F0000;  /* beyond bf16 max */
        out[i] = (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
    }
    return top;
}

void bf16_decode(const uint16_t *in, int64_t i0, int64_t i1, float *out) {
    for (int64_t i = i0; i < i1; i++) out[i] = u2f((uint32_t)in[i] << 16);
}

int32_t block_amax_mt(const float *x, int64_t n, int64_t B, int32_t *amax_bits, int nt) {
    int32_t tops[256] = {0};
    int64_t rows = (n + B - 1) / B;
    nt = nt < 1 ? 1 : (nt > 256 ? 256 : nt);
    SPLIT(rows, nt, tops[t] = block_amax(x, n, B, lo_, hi_, amax_bits))
    int32_t top = 0;
    for (int t = 0; t < nt; t++) top = tops[t] > top ? tops[t] : top;
    return top;
}

void encode_blocks_mt(const float *x, int64_t n, int64_t B, int fmt, int cands, float elem_max, float scale,
                      const int32_t *amax_bits, const float *e4m3, uint8_t *codes, uint8_t *scales, int nt) {
    int64_t rows = (n + B - 1) / B;
    nt = nt < 1 ? 1 : nt;
    SPLIT(rows, nt, encode_blocks(x, n, B, lo_, hi_, fmt, cands, elem_max, scale, amax_bits, e4m3, codes, scales))
}

void decode_blocks_mt(const uint8_t *codes, const uint8_t *scales, int64_t n, int64_t B, int fmt,
                      const float *values, const float *e4m3, float factor, float *out, int nt) {
    int64_t rows = (n + B - 1) / B;
    nt = nt < 1 ? 1 : nt;
    SPLIT(rows, nt, decode_blocks(codes, scales, n, B, lo_, hi_, fmt, values, e4m3, factor, out))
}

int32_t bf16_encode_mt(const float *x, int64_t n, uint16_t *out, int nt) {
    int32_t tops[256] = {0};
    nt = nt < 1 ? 1 : (nt > 256 ? 256 : nt);
    SPLIT(n, nt, tops[t] = bf16_encode(x, lo_, hi_, out))
    int32_t top = 0;
    for (int t = 0; t < nt; t++) top = tops[t] > top ? tops[t] : top;
    return top;
}

/* The largest |x| bits of x[i0:i1] (>= 0x7F800000: a NaN or inf among them); diloco.wire.codec.all_finite. */
int32_t abs_bits_max(const float *x, int64_t i0, int64_t i1) {
    uint32_t top = 0;
    for (int64_t i = i0; i < i1; i++) {
        uint32_t a = f2u(x[i]) & 0x7FFFFFFF;
        top = a > top ? a : top;
    }
    return (int32_t)top;
}

int32_t abs_bits_max_mt(const float *x, int64_t n, int nt) {
    int32_t tops[256] = {0};
    nt = nt < 1 ? 1 : (nt > 256 ? 256 : nt);
    SPLIT(n, nt, tops[t] = abs_bits_max(x, lo_, hi_))
    int32_t top = 0;
    for (int t = 0; t < nt; t++) top = tops[t] > top ? tops[t] : top;
    return top;
}

void bf16_decode_mt(const uint16_t *in, int64_t n, float *out, int nt) {
    nt = nt < 1 ? 1 : nt;
    SPLIT(n, nt, bf16_decode(in, lo_, hi_, out))
}
