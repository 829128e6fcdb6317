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

/* The FP4 search LANES blocks at a time, one block a vector lane (GCC / Clang vector extensions; LANES is the
 * CPU's vector width in floats: 16 with AVX-512, 8 with AVX, else 4). The same operations as quantize_block,
 * lane by lane, so the same bits: where quantize_block reduces across a register (the block error) and
 * branches per block, this adds registers and selects. Where the CPU has AVX-512, the min / max, the transpose
 * into lanes and the packing of the codes use its instructions; elsewhere plain vector code does the same. */
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif
#if defined(__AVX512F__)
#define LANES 16
#elif defined(__AVX__)
#define LANES 8
#else
#define LANES 4
#endif
/* A vector of LANES floats: as wide as the CPU's vector registers (wider ones, split by the compiler, measured
 * 10-20x slower: it turns their comparisons into scalar code). LANES blocks are searched at a time. */
typedef float vf __attribute__((vector_size(4 * LANES)));
typedef int32_t vi __attribute__((vector_size(4 * LANES)));
static inline __attribute__((always_inline)) vf vsel(vi m, vf a, vf b) {  /* m ? a : b, lane by lane */
    return (vf)((m & (vi)a) | (~m & (vi)b));
}
static inline __attribute__((always_inline)) vi visel(vi m, vi a, vi b) { return (m & a) | (~m & b); }
/* a < b ? a : b, lane by lane (vminps computes exactly that, NaN included) */
static inline __attribute__((always_inline)) vf vminf(vf a, vf b) {
#if defined(__AVX512F__)
    return (vf)_mm512_min_ps((__m512)a, (__m512)b);
#elif defined(__AVX2__)
    return (vf)_mm256_min_ps((__m256)a, (__m256)b);
#else
    return vsel(a < b, a, b);
#endif
}
/* a > b ? a : b, lane by lane */
static inline __attribute__((always_inline)) vf vmaxf(vf a, vf b) {
#if defined(__AVX512F__)
    return (vf)_mm512_max_ps((__m512)a, (__m512)b);
#elif defined(__AVX2__)
    return (vf)_mm256_max_ps((__m256)a, (__m256)b);
#else
    return vsel(a > b, a, b);
#endif
}
static inline __attribute__((always_inline)) vi vclampi(vi r, int32_t lo, int32_t hi) {
#if defined(__AVX512F__)
    return (vi)_mm512_min_epi32(_mm512_max_epi32((__m512i)r, _mm512_set1_epi32(lo)), _mm512_set1_epi32(hi));
#elif defined(__AVX2__)
    return (vi)_mm256_min_epi32(_mm256_max_epi32((__m256i)r, _mm256_set1_epi32(lo)), _mm256_set1_epi32(hi));
#else
    vi m = r < lo;
    r = (m & lo) | (~m & r);
    m = r > hi;
    return (m & hi) | (~m & r);
#endif
}
static inline __attribute__((always_inline)) vi vmaxi(vi a, int32_t b) {
#if defined(__AVX512F__)
    return (vi)_mm512_max_epi32((__m512i)a, _mm512_set1_epi32(b));
#elif defined(__AVX2__)
    return (vi)_mm256_max_epi32((__m256i)a, _mm256_set1_epi32(b));
#else
    return visel(a > b, a, (vi){} + b);
#endif
}
/* round_fp4 on a vector. E2M1's grid is spaced 0.5 up to 2, then 1 up to 4, then 2: y's spacing s is
 * max(0.5, 2^(e - 1)) for y in [2^e, 2^(e + 1)), and (y + C) - C with C = 2^23 s rounds y to a multiple of s,
 * ties to the even multiple (y < C, so the sum's last bit is worth s; C / s is even), exactly; then min(., 6).
 * The reference's two roundings (hi: y to one mantissa bit, clamped to [1, 6]; lo: min(round(2y), 2) for y < 1)
 * give the same values: the same ties at 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5 (to the even code). */
static inline __attribute__((always_inline)) vf vround_fp4(vf y, int fmt) {
    vi bits = (vi)y;
    if (fmt == 0) {
        vf c = (vf)(vmaxi(bits & 0x7F800000, 0x3F800000) + (22 << 23));  /* 2^23 s */
        return vminf((y + c) - c, (vf){} + 6.0f);
    }
    vi r = ((bits >> 23) & 1) + 0x3FFFFF + bits;
    r &= 0x7F800000;
    r = vclampi(r, 0x3E800000, 0x41800000);
    return (vf)(r & (vi)(y > 0.125f));  /* the reference's min((y <= 0.125 ? 0 : y) * 128, r): 0, or above 16 */
}

/* e4m3_from_f32 on a vector of finite f >= 0. */
static inline __attribute__((always_inline)) vi ve4m3_from_f32(vf f) {
    const int32_t fp8_max = 1087 << 20, denorm_mask = 141 << 23;
    vi bits = (vi)f;
    vi sub = (vi)(f + u2f((uint32_t)denorm_mask)) - denorm_mask;
    vi norm = ((bits + (((7 - 127) << 23) + 0x7FFFF)) + ((bits >> 20) & 1)) >> 20;
    vi r = visel(bits < (121 << 23), sub, norm);
    r = visel(bits >= fp8_max, (vi){} + 0x7f, r);
    return r & 0xFF;
}

/* The fp32 value of E4M3 codes c (0..255, one per lane): the e4m3 table, computed. */
static inline __attribute__((always_inline)) vf ve4m3_value(vi c) {
    vi e = (c >> 3) & 15, m = c & 7;
    vf normal = (vf)(((e + 120) << 23) | (m << 20));
    vf sub = __builtin_convertvector(m, vf) * 0.001953125f;  /* m * 2^-9 */
    vi v = visel(e == 0, (vi)sub, (vi)normal);
    v = visel((c & 0x7f) == 0x7f, (vi){} + 0x7FC00000, v);
    return (vf)(v | ((c & 0x80) << 24));
}

#if defined(__AVX2__) && !defined(__AVX512F__)
/* r[i] lane j -> r[j] lane i: eight rows of eight floats transposed in place (t: scratch). */
static inline __attribute__((always_inline)) void transpose8(__m256 r[8], __m256 t[8]) {
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
        r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int i = 0; i < 4; i++) {
        t[i] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x20);
        t[i + 4] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x31);
    }
    for (int i = 0; i < 8; i++) r[i] = t[i];
}
#endif

/* out[j] lane l = x[16 l + j]: LANES blocks of sixteen values, transposed. */
static inline __attribute__((always_inline)) void transpose16(const float *x, vf out[16]) {
#ifdef __AVX512F__
    __m512 r[16], t[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(x + 16 * i);
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
        r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
        r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
    }
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xDD);
        t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xDD);
    }
    for (int i = 0; i < 8; i++) {
        out[i] = (vf)_mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        out[i + 8] = (vf)_mm512_shuffle_f32x4(t[i], t[i + 8], 0xDD);
    }
#elif defined(__AVX2__)
    for (int h = 0; h < 2; h++) {  /* values 8 h .. 8 h + 7 of the 8 blocks: an 8 x 8 transpose */
        __m256 r[8], t[8];
        for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(x + 16 * i + 8 * h);
        transpose8(r, t);
        for (int i = 0; i < 8; i++) out[8 * h + i] = (vf)r[i];
    }
#else
    float tmp[16][LANES];
    for (int l = 0; l < LANES; l++)
        for (int j = 0; j < 16; j++) tmp[j][l] = x[l * 16 + j];
    for (int j = 0; j < 16; j++) memcpy(&out[j], tmp[j], sizeof(vf));
#endif
}

/* codes[8 l + j] = k[2 j] | k[2 j + 1] << 4 of lane l (k: element codes, 0..15): the LANES blocks' code bytes. */
static inline __attribute__((always_inline)) void pack_codes16(const vi k[16], uint8_t *codes) {
#if defined(__AVX512F__) && defined(__AVX512VBMI__)
    __m128i p[8];
    for (int j = 0; j < 8; j++) p[j] = _mm512_cvtepi32_epi8((__m512i)(k[2 * j] | (k[2 * j + 1] << 4)));
    __m512i a = _mm512_inserti32x4(_mm512_castsi128_si512(p[0]), p[1], 1);
    a = _mm512_inserti32x4(_mm512_inserti32x4(a, p[2], 2), p[3], 3);
    __m512i b = _mm512_inserti32x4(_mm512_castsi128_si512(p[4]), p[5], 1);
    b = _mm512_inserti32x4(_mm512_inserti32x4(b, p[6], 2), p[7], 3);
    uint8_t idx[2][64];  /* byte 8 l + j of half h: p[j] lane 8 h + l (bit 6 picks b) */
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 8; l++)
            for (int j = 0; j < 8; j++) idx[h][8 * l + j] = (uint8_t)((j < 4 ? 0 : 64) + 16 * (j & 3) + 8 * h + l);
    for (int h = 0; h < 2; h++)
        _mm512_storeu_si512(codes + 64 * h, _mm512_permutex2var_epi8(a, _mm512_loadu_si512(idx[h]), b));
#elif defined(__AVX2__)
    __m256 r[8], t[8];
    for (int j = 0; j < 8; j++) r[j] = (__m256)(k[2 * j] | (k[2 * j + 1] << 4));  /* byte j of every lane */
    transpose8(r, t);  /* r[l]: the 8 bytes of lane l, one an int32 */
    for (int l = 0; l < 8; l++) {
        __m256i v = (__m256i)r[l];
        __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        _mm_storel_epi64((__m128i *)(codes + 8 * l), _mm_packus_epi16(w, w));
    }
#else
    int32_t code[16][LANES];
    for (int j = 0; j < 16; j++) memcpy(code[j], &k[j], sizeof(vi));
    for (int l = 0; l < LANES; l++)
        for (int j = 0; j < 8; j++) codes[l * 8 + j] = (uint8_t)(code[2 * j][l] | (code[2 * j + 1][l] << 4));
#endif
}

/* quantize_block for the LANES blocks of 16 values at x: 8 LANES code bytes, LANES scales. */
static inline __attribute__((always_inline)) void quantize_lane_blocks(
        const float *x, int fmt, float elem_max, float scale, uint8_t *codes, uint8_t *scales) {
    vf xt[16], mag[16], v[4][16], err[4], sf[4];
    for (int i = 0; i < LANES; i++) __builtin_prefetch(x + 512 + 16 * i);  /* 2 KB ahead: see the speed notes */
    transpose16(x, xt);
    vf amax = (vf){};
    for (int j = 0; j < 16; j++) {
        mag[j] = (vf)((vi)xt[j] & 0x7FFFFFFF) * scale;
        amax = vmaxf(amax, mag[j]);  /* the block's absmax times 2^-k: scaling is monotone */
    }
    vi s = ve4m3_from_f32(amax / elem_max);
    vi up = s - (vi)(ve4m3_value(s) * elem_max < amax);  /* a true lane is -1 */
    vi lowest = visel(up < 1, up, (vi){} + 1);
    for (int c = 0; c < 4; c++) {
        vi sc = up - c;
        sc = visel(sc > lowest, sc, lowest);
        sf[c] = ve4m3_value(sc & 0xFF);
        vf d = vsel(sf[c] > 0.0f, sf[c], (vf){} + 1.0f);
        vf e[8];
        for (int j = 0; j < 8; j++) {  /* the first level of the block error's halves sum as it goes */
            vf q0 = vround_fp4(mag[j] / d, fmt), q1 = vround_fp4(mag[j + 8] / d, fmt);
            vf t0 = q0 * sf[c] - mag[j], t1 = q1 * sf[c] - mag[j + 8];
            v[c][j] = q0;
            v[c][j + 8] = q1;
            e[j] = t0 * t0 + t1 * t1;
        }
        for (int h = 4; h >= 1; h /= 2)
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
    vi best_sc = up - win;
    best_sc = visel(best_sc > lowest, best_sc, lowest);
    int32_t sa[LANES];
    memcpy(sa, &best_sc, sizeof(vi));
    for (int l = 0; l < LANES; l++) scales[l] = (uint8_t)sa[l];
    vi k[16];
    for (int j = 0; j < 16; j++) {
        vf b = v[0][j];
        b = vsel(win == 1, v[1][j], b);
        b = vsel(win == 2, v[2][j], b);
        b = vsel(win == 3, v[3][j], b);
        vi bits = (vi)b, kj;
        if (fmt == 0) {
            kj = (bits >> 22) - 252;
            kj = kj & ~(kj < 0);
            kj -= (b == 0.5f);   /* a true lane is -1 */
        } else {
            kj = (bits >> 23) - 124;
            kj = kj & ~(kj < 0);
        }
        vi sign = ((vi)xt[j] >> 28) & 8;
        k[j] = kj + ((kj > 0) & sign);
    }
    pack_codes16(k, codes);
}

/* |x| * 2^-k of a block and its largest (the block's absmax times 2^-k: scaling by 2^-k is monotone). */
static inline __attribute__((always_inline)) float block_mag(const float *xb, int64_t B, float scale, float *mag) {
    float amax = 0.0f;
    for (int64_t j = 0; j < B; j++) {
        mag[j] = fabsf(xb[j]) * scale;
        amax = mag[j] > amax ? mag[j] : amax;
    }
    return amax;
}

#define FULL_BLOCKS(BLOCK, FMT, CANDS)                                                                             \
    for (; b < b_full; b++) {                                                                            \
        const float *xb = x + b * (BLOCK);                                                               \
        float mag[BLOCK];                                                                                \
        float amax = block_mag(xb, (BLOCK), scale, mag);                                                 \
        scales[b] = quantize_block(mag, xb, (BLOCK), (FMT), (CANDS), elem_max, amax, e4m3,                 \
                                   codes + ((FMT) == 2 ? b * (BLOCK) : b * (BLOCK) / 2));              \
    }

/* BlockScaledCodec._quantize_blocks for blocks [b0, b1): element codes into codes (n_code bytes in
 * all), E4M3 scale codes into scales. fmt: 0 E2M1, 1 E3M0, 2 int8. scale = 2^-k; e4m3 = the 256
 * E4M3 values. B <= 256 and even. */
void encode_blocks(const float *x, int64_t n, int64_t B, int64_t b0, int64_t b1, int fmt, int cands,
                   float elem_max, float scale, const float *e4m3, uint8_t *codes, uint8_t *scales) {
    int64_t b = b0, b_full = n / B < b1 ? n / B : b1;
    if (B == 16 && fmt == 0 && cands == 4) {
        for (; b + LANES <= b_full; b += LANES)
            quantize_lane_blocks(x + b * 16, 0, elem_max, scale, codes + b * 8, scales + b);
        FULL_BLOCKS(16, 0, 4)
    } else if (B == 16 && fmt == 1 && cands == 4) {
        for (; b + LANES <= b_full; b += LANES)
            quantize_lane_blocks(x + b * 16, 1, elem_max, scale, codes + b * 8, scales + b);
        FULL_BLOCKS(16, 1, 4)
    } else if (B == 32 && fmt == 2 && cands == 1) {
        FULL_BLOCKS(32, 2, 1)
    } else {
        for (; b < b_full; b++) {
            float mag[256];
            float amax = block_mag(x + b * B, B, scale, mag);
            scales[b] = quantize_block(mag, x + b * B, B, fmt, cands, elem_max, amax, e4m3,
                                       codes + (fmt == 2 ? b * B : b * B / 2));
        }
    }
    for (; b < b1; b++) {  /* the last, partial block: zero-padded copies */
        float mag[256], xp[256];
        uint8_t out[256];
        int64_t i0 = b * B, m = n - i0;
        for (int64_t j = 0; j < B; j++) xp[j] = j < m ? x[i0 + j] : 0.0f;
        float amax = block_mag(xp, B, scale, mag);
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

/* The same on 8 FP4 values (4 code bytes) for CPUs with 8-float vectors (AVX): the 16-value table in two halves. */
typedef float vf8 __attribute__((vector_size(32)));
typedef int32_t vi8 __attribute__((vector_size(32)));
static inline __attribute__((always_inline)) void decode_8_fp4(const uint8_t *codes, vf8 t0, vf8 t1, float sb,
                                                                float factor, float *out) {
    const float fmax = 3.40282346638528859812e+38F;
    int32_t c;
    memcpy(&c, codes, 4);  /* value i is nibble i of the little-endian word */
    vi8 idx = (((vi8){} + c) >> (vi8){0, 4, 8, 12, 16, 20, 24, 28}) & 0x0F;
    vf8 y = (__builtin_shuffle(t0, t1, idx) * sb) * factor;
    vi8 m = y > fmax;
    y = (vf8)((m & (vi8)((vf8){} + fmax)) | (~m & (vi8)y));
    m = y < -fmax;
    y = (vf8)((m & (vi8)((vf8){} - fmax)) | (~m & (vi8)y));
    memcpy(out, &y, 32);
}

void decode_blocks(const uint8_t *codes, const uint8_t *scales, int64_t n, int64_t B, int64_t b0, int64_t b1,
                   int fmt, const float *values, const float *e4m3, float factor, float *out) {
    const float fmax = 3.40282346638528859812e+38F;
    if (LANES == 8 && fmt != 2 && B % 8 == 0) {  /* FP4, whole blocks, 8 values at a time */
        vf8 t0, t1;
        memcpy(&t0, values, 32);
        memcpy(&t1, values + 8, 32);
        int64_t b_full = n / B < b1 ? n / B : b1;
        for (; b0 < b_full; b0++) {
            float sb = e4m3[scales[b0]];
            for (int64_t i = b0 * B; i < (b0 + 1) * B; i += 8) decode_8_fp4(codes + i / 2, t0, t1, sb, factor, out + i);
        }
    }
    if (LANES == 16 && fmt != 2 && B % 16 == 0) {  /* FP4, whole blocks: 16 values at a time (on narrower CPUs the
                                                   * 16-lane vectors measured slower than the loop below) */
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

void encode_blocks_mt(const float *x, int64_t n, int64_t B, int fmt, int cands, float elem_max, float scale,
                      const float *e4m3, uint8_t *codes, uint8_t *scales, int nt) {
    int64_t rows = (n + B - 1) / B;
    nt = nt < 1 ? 1 : nt;
    SPLIT(rows, nt, encode_blocks(x, n, B, lo_, hi_, fmt, cands, elem_max, scale, e4m3, codes, scales))
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
