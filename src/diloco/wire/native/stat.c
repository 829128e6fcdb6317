/* Fused CPU loops of the statistical codecs (stat2, stat4: diloco/wire/compress.py), which repeat the torch
 * reference operation for operation, as blocks.c does for the block-scaled codecs. */
#include "common.h"

/* halves_sum (diloco.wire.codec) of w values, in place in e (destroyed). */
static float halves_sum_inplace(float *e, int64_t w) {
    while (w > 1) {
        if (w & 1) { e[0] = e[0] + e[w - 1]; w -= 1; }
        int64_t h = w / 2;
        for (int64_t j = 0; j < h; j++) e[j] = e[j] + e[j + h];
        w = h;
    }
    return e[0];
}

/* StatisticalCodec (stat_quantize in compress.py) for one row of w values: its codes (as small integers) into
 * q, its 2^BITS bin means into tr. e: w floats of scratch. BITS is a constant where the caller passes one. */
static inline __attribute__((always_inline)) void stat_row(
        const float *restrict xr, int64_t w, const int BITS, float r, float coef, int32_t *restrict q,
        float *restrict tr, float *restrict e) {
    const int L = 1 << BITS;
    const float fw = (float)w, top = (float)(L - 1);
    memcpy(e, xr, sizeof(float) * w);
    float mu = halves_sum_inplace(e, w) / fw;
    for (int64_t i = 0; i < w; i++) { float d = xr[i] - mu; e[i] = d * d; }
    float sigma = sqrtf(halves_sum_inplace(e, w) / fw);
    float lo = mu - r * sigma;
    float width = coef * sigma;
    float safe = width > 0.0f ? width : 1.0f;
    for (int64_t i = 0; i < w; i++) {
        float c = floorf((xr[i] - lo) / safe);
        c = c != c ? 0.0f : c;  /* nan_to_num, then clamp (which takes +-inf to the ends) */
        c = c < 0.0f ? 0.0f : c;
        c = c > top ? top : c;
        q[i] = (int32_t)c;
    }
    const int64_t h = w / 2;
    for (int level = 0; level < L; level++) {
        int32_t count = 0;
        float total;
        if (w % 2 == 0) {  /* the first level of the halves sum done with the masking: the same additions */
            for (int64_t i = 0; i < h; i++) {
                int32_t a = q[i] == level, b = q[i + h] == level;
                count += a + b;
                e[i] = (a ? xr[i] : 0.0f) + (b ? xr[i + h] : 0.0f);
            }
            total = halves_sum_inplace(e, h);
        } else {
            for (int64_t i = 0; i < w; i++) {
                int32_t hit = q[i] == level;
                count += hit;
                e[i] = hit ? xr[i] : 0.0f;
            }
            total = halves_sum_inplace(e, w);
        }
        float centre = lo + ((float)level + 0.5f) * width;
        tr[level] = count > 0 ? total / (float)count : centre;
    }
}

/* Codes (small integers) -> w * BITS / 8 bytes (rounded up), LSB first. */
static inline __attribute__((always_inline)) void pack_codes(const int32_t *restrict q, int64_t w, const int BITS,
                                                            uint8_t *restrict out) {
    const int per = 8 / BITS;
    int64_t whole = w / per;
    for (int64_t b = 0; b < whole; b++) {
        uint32_t byte = 0;
        for (int k = 0; k < per; k++) byte |= (uint32_t)q[b * per + k] << (BITS * k);
        out[b] = (uint8_t)byte;
    }
    if (whole * per < w) {
        uint32_t byte = 0;
        for (int64_t i = whole * per; i < w; i++) byte |= (uint32_t)q[i] << (BITS * (i - whole * per));
        out[whole] = (uint8_t)byte;
    }
}

#define STAT_ROWS(BITS)                                                                                    \
    for (int64_t row = r0; row < r1; row++) {                                                              \
        int64_t w = n - row * B < B ? n - row * B : B;                                                     \
        for (int64_t i = 0; i < w; i++) {                                                                  \
            int32_t a = (int32_t)(f2u(x[row * B + i]) & 0x7FFFFFFF);                                       \
            top = a > top ? a : top;                                                                       \
        }                                                                                                  \
        stat_row(x + row * B, w, (BITS), r, coef, q, table + row * (1 << (BITS)), e);                      \
        pack_codes(q, w, (BITS), codes + row * B * (BITS) / 8);                                            \
    }

/* StatisticalCodec for rows [r0, r1) of B values (the last may be shorter): codes packed LSB first into codes
 * (bits in 1, 2, 4, 8; B * bits a multiple of 8), the rows' tables of 2^bits bin means into table.
 * coef = 2 * r / 2^bits. scratch: 2 * B floats. Returns the largest |x| bits seen (>= 0x7F800000: a non-finite
 * value, and the caller fills the tables with NaN). */
int32_t stat_encode_rows(const float *x, int64_t n, int64_t B, int64_t r0, int64_t r1, int bits, float r,
                         float coef, uint8_t *codes, float *table, float *scratch) {
    int32_t top = 0;
    float *e = scratch;
    int32_t *q = (int32_t *)(scratch + B);
    switch (bits) {
        case 1: STAT_ROWS(1) break;
        case 2: STAT_ROWS(2) break;
        case 4: STAT_ROWS(4) break;
        default: STAT_ROWS(8) break;
    }
    return top;
}

#define STAT_DECODE(BITS)                                                                                  \
    for (int64_t row = r0; row < r1; row++) {                                                              \
        const int per = 8 / (BITS), mask = (1 << (BITS)) - 1;                                              \
        int64_t i0 = row * B, w = (i0 + B < n ? i0 + B : n) - i0, whole = w / per;                          \
        const float *tr = table + row * (1 << (BITS));                                                     \
        const uint8_t *cr = codes + i0 * (BITS) / 8;                                                       \
        float *o = out + i0;                                                                               \
        for (int64_t b = 0; b < whole; b++) {                                                              \
            uint32_t c = cr[b];                                                                            \
            for (int k = 0; k < per; k++) o[b * per + k] = tr[(c >> ((BITS) * k)) & mask];                  \
        }                                                                                                  \
        for (int64_t i = whole * per; i < w; i++) o[i] = tr[(cr[whole] >> ((BITS) * (i - whole * per))) & mask]; \
    }

/* StatisticalCodec decode for rows [r0, r1): out[i] = table[row][code], a byte of codes at a time. */
void stat_decode_rows(const uint8_t *codes, const float *table, int64_t n, int64_t B, int64_t r0, int64_t r1,
                      int bits, float *out) {
    switch (bits) {
        case 1: STAT_DECODE(1) break;
        case 2: STAT_DECODE(2) break;
        case 4: STAT_DECODE(4) break;
        default: STAT_DECODE(8) break;
    }
}

/* scratch: nt * 2 * B floats (one share a thread). */
int32_t stat_encode_mt(const float *x, int64_t n, int64_t B, int bits, float r, float coef, uint8_t *codes,
                       float *table, float *scratch, int nt) {
    int32_t tops[256] = {0};
    int64_t rows = (n + B - 1) / B;
    nt = nt < 1 ? 1 : (nt > 256 ? 256 : nt);
    SPLIT(rows, nt, tops[t] = stat_encode_rows(x, n, B, lo_, hi_, bits, r, coef, codes, table, scratch + 2 * B * t))
    int32_t top = 0;
    for (int t = 0; t < nt; t++) top = tops[t] > top ? tops[t] : top;
    return top;
}

void stat_decode_mt(const uint8_t *codes, const float *table, int64_t n, int64_t B, int bits, float *out, int nt) {
    int64_t rows = (n + B - 1) / B;
    nt = nt < 1 ? 1 : nt;
    SPLIT(rows, nt, stat_decode_rows(codes, table, n, B, lo_, hi_, bits, out))
}
