/* edgetrain int8 qconv2d forward on the Cortex-M DSP extension, part 2 (included by et_int8.h
 * after et_int8_dsp.h, whose words, columns, dot products and requantization it uses, where
 * __ARM_FEATURE_DSP is defined): the rows of a pointwise conv read across the NCHW planes, and
 * et_qconv_gemm_rows, which runs every ungrouped conv whose weight rows lie side by side.
 * - et_gemm_row_wide: a 1x1 of a multiple of 4 inputs, at most ET_COL_K / 2, over a column of
 *   int16 pairs with x_zero taken out and doubled, so the dot products widen only the weights,
 *   the sums start from 2 * bias and feed et_level2 directly. Four pixels at a time where
 *   their column fits col (each weight word widened once for 4 pixels, each channel's
 *   requantization read once), compiled once more for 8 and 16 inputs (the expansions of the
 *   first blocks, where a loop's set-up cost as much as its products) with its loops unrolled
 *   (24 and 32 too cost 4.3 KB of flash for 0.68 M of mbv2-w0.35's 56 M est. M7 cycles: they
 *   take the loop, whose dot products run two groups of 4 inputs an iteration where the count
 *   is a multiple of 8, ET_GROUPS_PAIRED, which wins part of those cycles back); two at a time
 *   for a row's last pixels and for more inputs;
 * - et_gemm_windows_quads / et_gemm_windows_wide: the same column built from four or two
 *   gathered KxK windows (the inputs padded to a multiple of 4 with weight 0), for a dense conv
 *   such as the models' first (four at a time for 28 inputs: a 3x3 over 3 channels);
 * - et_gemm_row_planes: any other 1x1, two pixels packed into a column per step;
 * - et_gemm_pairs_planes: a chunk of at most 4 output channels of a 1x1 reads the planes in its
 *   dot products (the packing would cost as much as it saves); one loop for every input count
 *   (the paper's three models never run it: its copies for 8 and 16 inputs were 1.1 KB). */
#ifndef ET_INT8_GEMM_H
#define ET_INT8_GEMM_H
#include <stdint.h>
#include "et_int8_core.h" /* et_qconv_p, et_rows8, et_w8 */
#include "et_int8_dsp.h"  /* the words, columns, dot products and requantization */
#include "et_int8_mve.h"  /* Helium (the Cortex-M55; else empty): et_gemm_row_mve */
#if defined(__ARM_FEATURE_DSP)
/* 0: model.c's convolutions (backends/c/kernel_select.py) never take et_gemm_windows_wide, which is then
 * left out (a layer that would have taken it takes the general path: the same bytes). Undefined: kept */
#ifndef ET_GEMM_WINDOWS_WIDE
#define ET_GEMM_WINDOWS_WIDE 1
#endif
/* ET_GROUPS, but a k not known here that is a multiple of 8 takes its groups two at a time
 * (half the loop's branches and counter updates) */
#define ET_GROUPS_PAIRED(k, ...)                                                                   \
    do {                                                                                           \
        if (!__builtin_constant_p(k) && ((k) & 7) == 0) {                                          \
            while (q + 8 <= (k)) {                                                                 \
                { __VA_ARGS__ }                                                                    \
                q += 4;                                                                            \
                { __VA_ARGS__ }                                                                    \
                q += 4;                                                                            \
            }                                                                                      \
        } else                                                                                     \
            ET_GROUPS(k, __VA_ARGS__);                                                             \
    } while (0)

/* sxtab16 of v rotated by 8: a + the sign-extended bytes 1 and 3 of v, per halfword */
static inline int32_t et_sxtab16_ror8(int32_t a, uint32_t v) {
    int32_t r;
    __asm__("sxtab16 %0, %1, %2, ror #8" : "=r"(r) : "r"(a), "r"(v));
    return r;
}

/* The wide column of pixels x, x + 1 of a 1x1 (input q at x + q * cs; pixel x twice when
 * !two): per 4 inputs k..k+3 the int16 pairs (v0[k], v0[k+2]), (v0[k+1], v0[k+3]), (v1[k],
 * v1[k+2]), (v1[k+1], v1[k+3]) of v = 2 * (x - x_zero) (|v| <= 510), nz = (-x_zero, -x_zero):
 * the dot products below need no __sxtb16 of the column, start from 2 * bias (no sum of the
 * weights per call) and end with 2 * sum, et_level2's operand. k a multiple of 4. */
static inline __attribute__((always_inline)) void et_col_planes16(const int8_t *x, int32_t cs, int32_t k, int32_t nz,
                                                                  int32_t two, int32_t *c) {
    int32_t q = 0;
    ET_GROUPS(k, {
        const int8_t *p = x + q * cs;
        uint32_t u02, u13;
        if (two) {
            u02 = et_ld16u(p) | (et_ld16u(p + 2 * cs) << 16);
            u13 = et_ld16u(p + cs) | (et_ld16u(p + 3 * cs) << 16);
        } else {
            u02 = ((uint32_t)(uint8_t)p[0] | ((uint32_t)(uint8_t)p[2 * cs] << 16)) * 0x101u;
            u13 = ((uint32_t)(uint8_t)p[cs] | ((uint32_t)(uint8_t)p[3 * cs] << 16)) * 0x101u;
        }
        const int32_t x0e = __sxtab16(nz, (int32_t)u02), x0o = __sxtab16(nz, (int32_t)u13);
        const int32_t x1e = et_sxtab16_ror8(nz, u02), x1o = et_sxtab16_ror8(nz, u13);
        c[q] = __sadd16(x0e, x0e);
        c[q + 1] = __sadd16(x0o, x0o);
        c[q + 2] = __sadd16(x1e, x1e);
        c[q + 3] = __sadd16(x1o, x1o);
    });
}

/* the output channel pairs of a fast chunk over a wide column (et_col_planes16): 2 x 2 sums
 * from 2 * init (init: the bias), stored as et_gemm_store's, the second pixel only when two */
static inline __attribute__((always_inline)) void et_gemm_pairs16(const et_gemm_oc *t, int32_t pairs, const int32_t *c,
                                                                  int32_t k, int8_t *y, int32_t cs, const int two) {
    for (; pairs > 0; pairs--, t += 2, y += 2 * cs) {
        const int8_t *wa = t[0].w, *wb = t[1].w;
        int32_t s00 = 2 * t[0].init, s01 = s00, s10 = 2 * t[1].init, s11 = s10;
        int32_t q = 0;
        ET_GROUPS(k, {
            const int32_t va = et_ld32s(wa + q), vb = et_ld32s(wb + q);
            const int32_t a02 = __sxtb16(va), a13 = et_sxtb16_ror8((uint32_t)va);
            const int32_t b02 = __sxtb16(vb), b13 = et_sxtb16_ror8((uint32_t)vb);
            const int32_t x0e = c[q], x0o = c[q + 1], x1e = c[q + 2], x1o = c[q + 3];
            s00 = __smlad(a02, x0e, s00);
            s00 = __smlad(a13, x0o, s00);
            s01 = __smlad(a02, x1e, s01);
            s01 = __smlad(a13, x1o, s01);
            s10 = __smlad(b02, x0e, s10);
            s10 = __smlad(b13, x0o, s10);
            s11 = __smlad(b02, x1e, s11);
            s11 = __smlad(b13, x1o, s11);
        });
        const int32_t ma = t[0].mult, aa = t[0].add, ra = t[0].right, mb = t[1].mult, ab = t[1].add, rb = t[1].right;
        const int8_t y00 = et_level2(s00, ma, aa, ra), y01 = et_level2(s01, ma, aa, ra);
        const int8_t y10 = et_level2(s10, mb, ab, rb), y11 = et_level2(s11, mb, ab, rb);
        y[0] = y00;
        y[cs] = y10;
        if (two) {
            y[1] = y01;
            y[cs + 1] = y11;
        }
    }
}

/* et_col_planes16 of four pixels x .. x + 3: per 4 inputs the 8 words (x0e, x0o, x1e, x1o,
 * x2e, x2o, x3e, x3o), one word read per input for the four pixels */
static inline __attribute__((always_inline)) void et_col_quads16(const int8_t *x, int32_t cs, int32_t k, int32_t nz,
                                                                 int32_t *c) {
    int32_t q = 0;
    ET_GROUPS(k, {
        const int8_t *p = x + q * cs;
        const uint32_t u0 = (uint32_t)et_ld32s(p), u1 = (uint32_t)et_ld32s(p + cs);
        const uint32_t u2 = (uint32_t)et_ld32s(p + 2 * cs), u3 = (uint32_t)et_ld32s(p + 3 * cs);
        const uint32_t l02 = (uint32_t)et_pkh_low(u0, u2), l13 = (uint32_t)et_pkh_low(u1, u3);
        const uint32_t h02 = (uint32_t)et_pkh_high(u0, u2), h13 = (uint32_t)et_pkh_high(u1, u3);
        const int32_t v[8] = {__sxtab16(nz, (int32_t)l02), __sxtab16(nz, (int32_t)l13), et_sxtab16_ror8(nz, l02),
                              et_sxtab16_ror8(nz, l13),    __sxtab16(nz, (int32_t)h02), __sxtab16(nz, (int32_t)h13),
                              et_sxtab16_ror8(nz, h02),    et_sxtab16_ror8(nz, h13)};
        _Pragma("GCC unroll 8") for (int i = 0; i < 8; i++) c[2 * q + i] = __sadd16(v[i], v[i]);
    });
}

/* et_gemm_pairs16 over four pixels (the column of et_col_quads16): each weight word read and
 * widened once for 4 pixels, each channel's requantization read once */
static inline __attribute__((always_inline)) void et_gemm_quads16(const et_gemm_oc *t, int32_t pairs, const int32_t *c,
                                                                  int32_t k, int8_t *y, int32_t cs) {
    for (; pairs > 0; pairs--, t += 2, y += 2 * cs) {
        const int8_t *wa = t[0].w, *wb = t[1].w;
        int32_t a0 = 2 * t[0].init, a1 = a0, a2 = a0, a3 = a0, b0 = 2 * t[1].init, b1 = b0, b2 = b0, b3 = b0;
        int32_t q = 0;
        ET_GROUPS_PAIRED(k, {
            const int32_t va = et_ld32s(wa + q), vb = et_ld32s(wb + q);
            const int32_t a02 = __sxtb16(va), a13 = et_sxtb16_ror8((uint32_t)va);
            const int32_t b02 = __sxtb16(vb), b13 = et_sxtb16_ror8((uint32_t)vb);
            const int32_t *g = c + 2 * q;
            a0 = __smlad(a02, g[0], a0), b0 = __smlad(b02, g[0], b0);
            a0 = __smlad(a13, g[1], a0), b0 = __smlad(b13, g[1], b0);
            a1 = __smlad(a02, g[2], a1), b1 = __smlad(b02, g[2], b1);
            a1 = __smlad(a13, g[3], a1), b1 = __smlad(b13, g[3], b1);
            a2 = __smlad(a02, g[4], a2), b2 = __smlad(b02, g[4], b2);
            a2 = __smlad(a13, g[5], a2), b2 = __smlad(b13, g[5], b2);
            a3 = __smlad(a02, g[6], a3), b3 = __smlad(b02, g[6], b3);
            a3 = __smlad(a13, g[7], a3), b3 = __smlad(b13, g[7], b3);
        });
        const int32_t ma = t[0].mult, aa = t[0].add, ra = t[0].right, mb = t[1].mult, ab = t[1].add, rb = t[1].right;
        y[0] = (int8_t)et_level2(a0, ma, aa, ra);
        y[1] = (int8_t)et_level2(a1, ma, aa, ra);
        y[2] = (int8_t)et_level2(a2, ma, aa, ra);
        y[3] = (int8_t)et_level2(a3, ma, aa, ra);
        y[cs] = (int8_t)et_level2(b0, mb, ab, rb);
        y[cs + 1] = (int8_t)et_level2(b1, mb, ab, rb);
        y[cs + 2] = (int8_t)et_level2(b2, mb, ab, rb);
        y[cs + 3] = (int8_t)et_level2(b3, mb, ab, rb);
    }
}

/* the first px & ~3 pixels of one output row of a 1x1 over wide columns, four at a time (the
 * column is 8 k bytes of col), for a chunk of fast channel pairs whose init is the bias alone;
 * returns the pixels done */
static inline __attribute__((always_inline)) int32_t et_gemm_row_quads_k(const et_gemm_oc *t, int32_t pairs,
                                                                         const int8_t *x, int32_t xs, int32_t k,
                                                                         int32_t nz, int32_t *c, int32_t px, int8_t *y,
                                                                         int32_t cs) {
    int32_t q = 0;
    for (; q + 4 <= px; q += 4) {
        et_col_quads16(x + q, xs, k, nz, c);
        et_gemm_quads16(t, pairs, c, k, y + q, cs);
    }
    return q;
}

/* the pixels of one output row of a 1x1 over wide columns two at a time (the last alone when
 * px is odd): a row whose column of four pixels does not fit col, and the others' last pixels */
static inline __attribute__((always_inline)) void et_gemm_row_wide_k(const et_gemm_oc *t, int32_t pairs,
                                                                     const int8_t *x, int32_t xs, int32_t k, int32_t nz,
                                                                     int32_t *c, int32_t px, int8_t *y, int32_t cs) {
    int32_t q = 0;
    for (; q + 2 <= px; q += 2) {
        et_col_planes16(x + q, xs, k, nz, 1, c);
        et_gemm_pairs16(t, pairs, c, k, y + q, cs, 1);
    }
    if (q < px) {
        et_col_planes16(x + q, xs, k, nz, 0, c);
        et_gemm_pairs16(t, pairs, c, k, y + q, cs, 0);
    }
}

/* one gathered window's word a (its inputs q..q+3) in a wide column: the doubled int16 pairs
 * (x[q] - x_zero, x[q+2] - x_zero), (x[q+1] - x_zero, x[q+3] - x_zero) at c[0], c[1] */
static inline __attribute__((always_inline)) void et_col_word16(uint32_t a, int32_t nz, int32_t *c) {
    const int32_t e = __sxtab16(nz, (int32_t)a), o = et_sxtab16_ror8(nz, a);
    c[0] = __sadd16(e, e);
    c[1] = __sadd16(o, o);
}

/* The wide column of two gathered windows v0, v1 (k a multiple of 4; pixel v0 twice when v1 is
 * v0): et_col_planes16's layout from the windows' words, then the fast channel pairs over it */
static inline __attribute__((always_inline)) void et_gemm_windows_wide_k(const et_gemm_oc *t, int32_t pairs,
                                                                         const int8_t *v0, const int8_t *v1,
                                                                         int32_t k, int32_t nz, int32_t *c,
                                                                         int8_t *y, int32_t cs, const int two) {
    int32_t q = 0;
    ET_GROUPS(k, {
        et_col_word16((uint32_t)et_ld32s(v0 + q), nz, c + q);
        et_col_word16((uint32_t)et_ld32s(v1 + q), nz, c + q + 2);
    });
    if (two) et_gemm_pairs16(t, pairs, c, k, y, cs, 1);
    else et_gemm_pairs16(t, pairs, c, k, y, cs, 0);
}

/* any k (ET_K_RGB3, the models' first conv, takes et_gemm_windows_quads but for a row's last pixels) */
static ET_DSP_NOINLINE void et_gemm_windows_wide(const et_gemm_oc *t, int32_t pairs, const int8_t *v0,
                                                 const int8_t *v1, int32_t k, int32_t x_zero, int8_t *col,
                                                 int8_t *y, int32_t cs, int32_t two) {
    et_gemm_windows_wide_k(t, pairs, v0, v1, k, et_pack16(-x_zero, -x_zero), (int32_t *)(void *)col, y, cs, two);
}

/* four gathered windows v, v + k, v + 2 k, v + 3 k (k a multiple of 4) as et_col_quads16's
 * column, then the fast channel pairs over it: each weight word widened once for 4 pixels */
static inline __attribute__((always_inline)) void et_gemm_windows_quads_k(const et_gemm_oc *t, int32_t pairs,
                                                                          const int8_t *v, int32_t k, int32_t nz,
                                                                          int32_t *c, int8_t *y, int32_t cs) {
    int32_t q = 0;
    ET_GROUPS(k, {
        _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++)
            et_col_word16((uint32_t)et_ld32s(v + i * k + q), nz, c + 2 * q + 2 * i);
    });
    et_gemm_quads16(t, pairs, c, k, y, cs);
}

/* compiled for ET_K_RGB3 inputs only (the first conv of an image model); the windows lie in col
 * after the column (its 8 k bytes), and et_gather may write a byte past the fourth */
_Static_assert(12 * ET_K_RGB3 + 1 <= 2 * ET_COL_K, "four ET_K_RGB3 windows after their column fit col");
static ET_DSP_NOINLINE void et_gemm_windows_quads(const et_gemm_oc *t, int32_t pairs, const int8_t *v,
                                                  int32_t x_zero, int8_t *col, int8_t *y, int32_t cs) {
    et_gemm_windows_quads_k(t, pairs, v, ET_K_RGB3, et_pack16(-x_zero, -x_zero), (int32_t *)(void *)col, y, cs);
}

/* the input counts of the wide path (its column of two pixels, 4 k bytes, fits col) */
static inline int et_gemm_wide_k(int32_t k) { return (k & 3) == 0 && k >= 8 && 4 * k <= 2 * ET_COL_K; }

static ET_DSP_NOINLINE void et_gemm_row_wide(const et_gemm_oc *t, int32_t pairs, const int8_t *x, int32_t xs,
                                             int32_t k, int32_t x_zero, int8_t *col, int32_t px, int8_t *y,
                                             int32_t cs) {
#if defined(__ARM_FEATURE_MVE)
    et_gemm_row_mve(t, pairs, x, xs, k, x_zero, col, px, y, cs);
    return;
#endif
    const int32_t nz = et_pack16(-x_zero, -x_zero);
    int32_t *c = (int32_t *)(void *)col; /* 4-byte aligned */
    int32_t q = 0;
    if (k == 8) q = et_gemm_row_quads_k(t, pairs, x, xs, 8, nz, c, px, y, cs);
    else if (k == 16) q = et_gemm_row_quads_k(t, pairs, x, xs, 16, nz, c, px, y, cs);
    else if (8 * k <= 2 * ET_COL_K) q = et_gemm_row_quads_k(t, pairs, x, xs, k, nz, c, px, y, cs);
    if (q < px) et_gemm_row_wide_k(t, pairs, x + q, xs, k, nz, c, px - q, y + q, cs);
}

/* the first `px` (even) pixels of one output row of a 1x1 (k planes, plane q at x + q * xs),
 * two at a time packed into col and run through `pairs` fast output channel pairs: one call
 * per row, not per pixel pair */
static inline __attribute__((always_inline)) void et_gemm_row_planes_k(const et_gemm_oc *t, int32_t pairs,
                                                                       const int8_t *x, int32_t xs, int32_t k,
                                                                       int8_t *col, int32_t px, int8_t *y, int32_t cs) {
    for (int32_t q = 0; q < px; q += 2) {
        et_col_planes(x + q, xs, k, 1, col);
        et_gemm_pairs_body(t, pairs, col, k, y + q, cs, 0, 0);
    }
}

static ET_DSP_NOINLINE void et_gemm_row_planes(const et_gemm_oc *t, int32_t pairs, const int8_t *x, int32_t xs,
                                               int32_t k, int8_t *col, int32_t px, int8_t *y, int32_t cs) {
    et_gemm_row_planes_k(t, pairs, x, xs, k, col, px, y, cs);
}

/* et_gemm_pairs reading pixels x, x + 1 of the k planes (plane q at x + q * cs) directly:
 * for a chunk of at most 4 output channels the packing would cost as much as it saves */
static inline __attribute__((always_inline)) void et_gemm_planes_px(const et_gemm_oc *t, int32_t pairs, int32_t odd,
                                                                    const int8_t *x, int32_t xs, int32_t k, int8_t *y,
                                                                    int32_t cs) {
    for (; pairs > 0; pairs--, t += 2, y += 2 * cs) {
        int32_t s00 = t[0].init, s01 = t[0].init, s10 = t[1].init, s11 = t[1].init;
        const int8_t *wa = t[0].w, *wb = t[1].w, *p = x;
        int32_t q = 0;
        for (; q + 4 <= k; q += 4, p += 4 * xs) {
            const uint32_t u02 = et_ld16u(p) | (et_ld16u(p + 2 * xs) << 16);
            const uint32_t u13 = et_ld16u(p + xs) | (et_ld16u(p + 3 * xs) << 16);
            const int32_t va = et_ld32s(wa + q), vb = et_ld32s(wb + q);
            const int32_t a02 = __sxtb16(va), a13 = et_sxtb16_ror8((uint32_t)va);
            const int32_t b02 = __sxtb16(vb), b13 = et_sxtb16_ror8((uint32_t)vb);
            const int32_t x0e = __sxtb16((int32_t)u02), x1e = et_sxtb16_ror8(u02);
            const int32_t x0o = __sxtb16((int32_t)u13), x1o = et_sxtb16_ror8(u13);
            s00 = __smlad(a02, x0e, s00);
            s00 = __smlad(a13, x0o, s00);
            s01 = __smlad(a02, x1e, s01);
            s01 = __smlad(a13, x1o, s01);
            s10 = __smlad(b02, x0e, s10);
            s10 = __smlad(b13, x0o, s10);
            s11 = __smlad(b02, x1e, s11);
            s11 = __smlad(b13, x1o, s11);
        }
        for (; q < k; q++, p += xs) {
            s00 += wa[q] * p[0];
            s01 += wa[q] * p[1];
            s10 += wb[q] * p[0];
            s11 += wb[q] * p[1];
        }
        const int32_t s[2][2] = {{s00, s01}, {s10, s11}};
        et_gemm_store(t, s, y, cs);
    }
    if (odd) { /* one more channel: (x[q], x[q+2]) and (x[q+1], x[q+3]) of each pixel */
        int32_t s0 = t[0].init, s1 = t[0].init;
        const int8_t *wa = t[0].w, *p = x;
        int32_t q = 0;
        for (; q + 4 <= k; q += 4, p += 4 * xs) {
            const uint32_t u02 = et_ld16u(p) | (et_ld16u(p + 2 * xs) << 16);
            const uint32_t u13 = et_ld16u(p + xs) | (et_ld16u(p + 3 * xs) << 16);
            const int32_t va = et_ld32s(wa + q);
            const int32_t a02 = __sxtb16(va), a13 = et_sxtb16_ror8((uint32_t)va);
            s0 = __smlad(a02, __sxtb16((int32_t)u02), s0);
            s0 = __smlad(a13, __sxtb16((int32_t)u13), s0);
            s1 = __smlad(a02, et_sxtb16_ror8(u02), s1);
            s1 = __smlad(a13, et_sxtb16_ror8(u13), s1);
        }
        for (; q < k; q++, p += xs) {
            s0 += wa[q] * p[0];
            s1 += wa[q] * p[1];
        }
        const int32_t m = t[0].mult, a = t[0].add, r = t[0].right;
        const int8_t y0 = et_level(s0, m, a, r), y1 = et_level(s1, m, a, r);
        y[0] = y0;
        y[1] = y1;
    }
}

/* the first `px` (even) pixels of one output row, two at a time (et_gemm_planes_px) */
static ET_DSP_NOINLINE void et_gemm_pairs_planes(const et_gemm_oc *t, int32_t pairs, int32_t odd, const int8_t *x,
                                                 int32_t xs, int32_t k, int32_t px, int8_t *y, int32_t cs) {
    for (int32_t q = 0; q < px; q += 2) et_gemm_planes_px(t, pairs, odd, x + q, xs, k, y + q, cs);
}

/* et_qconv_rows for an ungrouped conv whose weight rows lie side by side: per output row,
 * pixel pairs packed into a column (a 1x1 unpadded column-stride-1 conv reads the planes,
 * any other gathers its windows), then the output channels two by two (ET_RQ_CHUNK at a
 * time, their requantization set up once per call and chunk). Compiled for size on a Cortex-M
 * (ET_SMALL_ATTR): its set-up and general path are 2-4 % of the paper's models' steps, the rows it
 * hands to the functions above most of the rest (with ET_GROUPS_PAIRED, 6b3deb6: 0.8 KB less model
 * code and 0.09 M fewer est. M7 cycles on mbv2-w0.35, docs/benchmarks.md) */
static ET_DSP_NOINLINE ET_SMALL_ATTR void et_qconv_gemm_rows(const et_qconv_p *P, et_rows8 x, int32_t xc_off,
                                                         const et_w8 *w, const int32_t *bias, et_rows8 y, float *yf,
                                                         int32_t yo_off, int32_t r0, int32_t r1, int32_t o0,
                                                         int32_t o1) {
    const int32_t kh = P->kh, cg = P->cg, khkw = kh * P->kw, k = cg * khkw, wo = P->wo;
    const int planes = khkw == 1 && P->ph == 0 && P->pw == 0 && P->sw == 1;
    const int split = w->map && w->dim == 1; /* by input channel: two dot products per pair */
    const int32_t k2 = split ? w->nrest : 0, base2 = ((split ? w->nsel : k) + 3) & ~3;
    /* k not a multiple of 4: a chunk's rows copied with zero weights up to base2, when they fit,
     * so no product runs on the scalar remainder path */
    const int pad = !split && k != base2 && ET_WPAD / base2 >= 2;
    const int32_t chunk = pad && ET_WPAD / base2 < ET_RQ_CHUNK ? ET_WPAD / base2 : ET_RQ_CHUNK;
    const int32_t k1 = split ? w->nsel : pad ? base2 : k;
    /* a small 1x1 whose column takes x_zero out (et_gemm_row_wide): its chunks' init is the bias
     * alone, x_zero * sum(w) added only to a chunk that cannot take that path */
    const int wide = planes && !split && !pad && !yf && et_gemm_wide_k(k);
    /* and a gathered window's (et_gemm_windows_wide; padded weights' extra inputs have weight 0); where
     * model.c leaves et_gemm_windows_wide out (ET_GEMM_WINDOWS_WIDE 0), only a 3x3 over 3 channels whose row
     * is whole quads (et_gemm_windows_quads), the others the general path */
    const int wide_win = !planes && !split && !yf && et_gemm_wide_k(k1) &&
                         (ET_GEMM_WINDOWS_WIDE || (k1 == ET_K_RGB3 && (wo & 3) == 0));
    int8_t wpad[ET_WPAD] __attribute__((aligned(4)));
    int8_t col[2 * ET_COL_K] __attribute__((aligned(4)));
    int8_t win[2][ET_GATHER_K] __attribute__((aligned(4)));
    const int8_t *rows[ET_GATHER_ROWS];
    et_gemm_oc fast[ET_RQ_CHUNK];
    /* a 1x1 at stride 1 computes each pixel on its own: output rows whose input rows and
     * output rows follow each other (whole planes, or no ring wrap among them) run as one
     * row of all their pixels (the paper's 4x4 and 8x8 planes: one call, not 4 or 8) */
    const int32_t per =
        planes && P->sh == 1 && P->w == wo && r1 - r0 > 1 && et_ring_run(r0, r1 - 1, x.cap) &&
                et_ring_run(r0, r1 - 1, y.cap)
            ? r1 - r0
            : 1;
    const int32_t px = per * wo;
    for (int32_t n = 0; n < P->n; n++)
        for (int32_t oc = o0; oc < o1; oc += chunk) {
            const int32_t oe = oc + chunk < o1 ? oc + chunk : o1;
            if (pad) memset(col + 2 * (base2 - 4), 0, 8); /* the last group's unused inputs: 0 */
            for (int32_t o = oc; o < oe; o++) {
                const int8_t *r1 = split ? w->sel + o * k1 : et_w8_taps(w, o, 0, cg, khkw);
                const int8_t *r2 = split ? w->rest + o * k2 : 0;
                if (pad) {
                    int8_t *row = wpad + (o - oc) * base2;
                    memcpy(row, r1, (size_t)k);
                    memset(row + k, 0, (size_t)(base2 - k));
                    r1 = row;
                }
                const et_rq r = et_rq_make(P, bias, o, k, wide || wide_win ? 0 : et_wsum(r1, k1) + et_wsum(r2, k2), yf);
                const et_gemm_oc f = {r1, r2, r.init, r.mult, r.add, r.right, r.fast};
                fast[o - oc] = f;
            }
            /* the output channel pairs from oc on whose requantization is all on the fast path */
            int32_t fast_end = oc;
            while (fast_end + 1 < oe && fast[fast_end - oc].fast && fast[fast_end + 1 - oc].fast) fast_end += 2;
            /* a chunk of at most 4 channels of a plain 1x1 reads the planes in its dot products */
            int all_fast = 1;
            for (int32_t o = oc; o < oe; o++) all_fast &= fast[o - oc].fast;
            const int wide_rows = (wide || wide_win) && all_fast && ((oe - oc) & 1) == 0;
            const int direct = planes && !split && !pad && oe - oc <= 4 && !wide_rows;
            if ((wide || wide_win) && !wide_rows)
                for (int32_t o = oc; o < oe; o++) fast[o - oc].init -= P->x_zero * et_wsum(fast[o - oc].w, k1);
            for (int32_t ho = r0; ho < r1; ho += per) {
                const int8_t *xn = x.p + n * x.nstride - xc_off * x.cstride, *xr = 0;
                if (planes) xr = xn + et_ring(ho * P->sh, x.cap) * P->w;
                else
                    for (int32_t c = 0; c < cg; c++)
                        for (int32_t i = 0; i < kh; i++) {
                            const int32_t hi = ho * P->sh - P->ph + i * P->dh;
                            rows[c * kh + i] = hi >= 0 && hi < P->h ? xn + c * x.cstride + et_ring(hi, x.cap) * P->w : 0;
                        }
                const int32_t at = n * y.nstride + et_ring(ho, y.cap) * wo - yo_off * y.cstride;
                int8_t *yp = yf ? 0 : y.p + at;
                float *yfp = yf ? yf + at : 0;
                int32_t q0 = 0; /* pixels done by et_gemm_row_wide, et_gemm_row_planes or et_gemm_pairs_planes */
                if (wide_rows && wide_win) {
                    q0 = px;
                    int32_t q = 0;
                    /* four windows at a time, gathered after the column (et_gather may write a
                     * byte past a window: 12 k1 + 1 bytes of col) */
                    if (k1 == ET_K_RGB3)
                        for (int8_t *v = col + 8 * ET_K_RGB3; q + 4 <= px; q += 4) {
                            for (int32_t i = 0; i < 4; i++) et_gather(P, rows, q + i, v + i * ET_K_RGB3);
                            et_gemm_windows_quads(fast, (oe - oc) / 2, v, P->x_zero, col, yp + oc * y.cstride + q,
                                                  y.cstride);
                        }
                    for (; ET_GEMM_WINDOWS_WIDE && q < px; q += 2) {
                        const int32_t two = q + 1 < px;
                        et_gather(P, rows, q, win[0]);
                        if (two) et_gather(P, rows, q + 1, win[1]);
                        et_gemm_windows_wide(fast, (oe - oc) / 2, win[0], two ? win[1] : win[0], k1, P->x_zero, col,
                                             yp + oc * y.cstride + q, y.cstride, two);
                    }
                } else if (wide_rows) {
                    q0 = px;
                    et_gemm_row_wide(fast, (oe - oc) / 2, xr, x.cstride, k, P->x_zero, col, px, yp + oc * y.cstride,
                                     y.cstride);
                } else if (direct && all_fast && px >= 2) {
                    q0 = px & ~1;
                    et_gemm_pairs_planes(fast, (oe - oc) / 2, (oe - oc) & 1, xr, x.cstride, k, q0,
                                         yp + oc * y.cstride, y.cstride);
                } else if (planes && !split && !pad && !direct && fast_end == oe && px >= 2) {
                    q0 = px & ~1;
                    et_gemm_row_planes(fast, (oe - oc) / 2, xr, x.cstride, k, col, q0, yp + oc * y.cstride,
                                       y.cstride);
                }
                for (int32_t q = q0; q < px; q += 2) {
                    const int32_t two = q + 1 < px;
                    if (split) et_col_planes_map(xr + q, x.cstride, k, two, w->map, base2, col);
                    else if (planes) et_col_planes(xr + q, x.cstride, k, two, col);
                    else {
                        et_gather(P, rows, q, win[0]);
                        if (two) et_gather(P, rows, q + 1, win[1]);
                        et_col_windows(win[0], two ? win[1] : win[0], k, col);
                    }
                    int32_t o = oc;
                    if (two && fast_end > oc) {
                        et_gemm_pairs(fast, (fast_end - oc) / 2, col, k1, yp + oc * y.cstride + q, y.cstride,
                                      col + 2 * base2, k2);
                        o = fast_end;
                    }
                    for (; o < oe; o += 2) {
                        const et_gemm_oc *fa = &fast[o - oc];
                        const et_rq ra_ = et_gemm_rq(fa), *ra = &ra_;
                        const int32_t ya = o * y.cstride + q;
                        if (o + 1 < oe) {
                            const et_rq rb_ = et_gemm_rq(fa + 1), *rb = &rb_;
                            int32_t s[2][2] = {{ra->init, ra->init}, {rb->init, rb->init}};
                            et_dot22(fa[0].w, fa[1].w, col, k1, s);
                            if (split) et_dot22(fa[0].w2, fa[1].w2, col + 2 * base2, k2, s);
                            et_rq_put(P, bias, ra, o, s[0][0], yp, yfp, ya);
                            et_rq_put(P, bias, rb, o + 1, s[1][0], yp, yfp, ya + y.cstride);
                            if (two) {
                                et_rq_put(P, bias, ra, o, s[0][1], yp, yfp, ya + 1);
                                et_rq_put(P, bias, rb, o + 1, s[1][1], yp, yfp, ya + y.cstride + 1);
                            }
                        } else {
                            int32_t s[2] = {ra->init, ra->init};
                            et_dot12(fa->w, col, k1, s);
                            if (split) et_dot12(fa->w2, col + 2 * base2, k2, s);
                            et_rq_put(P, bias, ra, o, s[0], yp, yfp, ya);
                            if (two) et_rq_put(P, bias, ra, o, s[1], yp, yfp, ya + 1);
                        }
                    }
                }
            }
        }
}

#endif /* __ARM_FEATURE_DSP */
#endif /* ET_INT8_GEMM_H */
