/* edgetrain int8 qconv2d forward on Helium (MVE, Armv8.1-M: the Cortex-M55; included by
 * et_int8_gemm.h where __ARM_FEATURE_MVE is defined, which the M55 defines with the DSP
 * extension, so every other DSP kernel still runs there; gives the reference's integers bit
 * for bit, as et_int8_gemm.h's DSP version of the same kernel does).
 *
 * et_gemm_row_mve: one output row of a pointwise (1x1) conv of a multiple of 4 inputs, at most
 * ET_COL_K / 2 (et_gemm_wide_k), for a chunk of channel pairs whose requantization is all on
 * the fast path and whose sums start from the bias alone (the DSP kernel it replaces,
 * et_gemm_row_wide, takes x_zero out in its column). Four pixels at a time are transposed into
 * four columns of k int8 inputs (4 k bytes of col, as the DSP kernel's wide column); every
 * output channel then runs VMLADAVA.S8 (16 int8 products summed into an int32) over its weight
 * row and the four columns, 16 inputs a step with the tail predicated (VCTP: the weights of the
 * inactive lanes load as 0), and sums its weights in the same pass (VADDVA.S8). The sum is
 *     bias + sum(w * x) - x_zero * sum(w) = bias + sum(w * (x - x_zero)),
 * exact in int32 like every partial sum, so it equals the DSP kernel's (and the reference's)
 * whatever the order; 2 * sum feeds et_level2, the DSP kernels' requantization. */
#ifndef ET_INT8_MVE_H
#define ET_INT8_MVE_H
#if defined(__ARM_FEATURE_MVE) && defined(__ARM_FEATURE_DSP)
#include <arm_mve.h>
#include <stdint.h>
#include <string.h>

#include "et_int8_dsp.h" /* et_gemm_oc, et_level2, ET_DSP_NOINLINE */

/* pixels x .. x + n - 1 (n <= 4) of the k planes (plane q at x + q * xs) as four columns of k
 * bytes, c[j * k + q] = x[j + q * xs]; when n < 4 the missing columns repeat pixel 0 (their
 * levels are computed and not stored) */
static inline void et_mve_cols(const int8_t *x, int32_t xs, int32_t k, int32_t n, int8_t *c) {
    int8_t *c1 = c + k, *c2 = c + 2 * k, *c3 = c + 3 * k;
    if (n == 4) {
        for (int32_t q = 0; q < k; q++, x += xs) {
            uint32_t v;
            memcpy(&v, x, 4);
            c[q] = (int8_t)v;
            c1[q] = (int8_t)(v >> 8);
            c2[q] = (int8_t)(v >> 16);
            c3[q] = (int8_t)(v >> 24);
        }
    } else {
        const int32_t o1 = n > 1, o2 = n > 2 ? 2 : 0;
        for (int32_t q = 0; q < k; q++, x += xs) {
            c[q] = x[0];
            c1[q] = x[o1];
            c2[q] = x[o2];
            c3[q] = x[0];
        }
    }
}

/* the four sums of one output channel (weight row w) over the four columns c0..c3, and the sum
 * of its weights: whole vectors of 16 inputs, then the tail under a VCTP predicate (the weights
 * of its inactive lanes load as 0, so the columns' bytes there do not count) */
static inline __attribute__((always_inline)) void et_mve_dot4(const int8_t *w, const int8_t *c0, const int8_t *c1,
                                                              const int8_t *c2, const int8_t *c3, int32_t k,
                                                              int32_t s[4], int32_t *wsum) {
    int32_t s0 = 0, s1 = 0, s2 = 0, s3 = 0, ws = 0;
    for (int32_t n = k >> 4; n > 0; n--, w += 16, c0 += 16, c1 += 16, c2 += 16, c3 += 16) {
        const int8x16_t wv = vld1q_s8(w);
        ws = vaddvaq_s8(ws, wv);
        s0 = vmladavaq_s8(s0, wv, vld1q_s8(c0));
        s1 = vmladavaq_s8(s1, wv, vld1q_s8(c1));
        s2 = vmladavaq_s8(s2, wv, vld1q_s8(c2));
        s3 = vmladavaq_s8(s3, wv, vld1q_s8(c3));
    }
    if (k & 15) {
        const mve_pred16_t m = vctp8q((uint32_t)(k & 15));
        const int8x16_t wv = vldrbq_z_s8(w, m);
        ws = vaddvaq_s8(ws, wv);
        s0 = vmladavaq_s8(s0, wv, vldrbq_z_s8(c0, m));
        s1 = vmladavaq_s8(s1, wv, vldrbq_z_s8(c1, m));
        s2 = vmladavaq_s8(s2, wv, vldrbq_z_s8(c2, m));
        s3 = vmladavaq_s8(s3, wv, vldrbq_z_s8(c3, m));
    }
    s[0] = s0;
    s[1] = s1;
    s[2] = s2;
    s[3] = s3;
    *wsum = ws;
}

/* the levels of channel t at the n pixels of the columns, stored at y[0 .. n-1] */
static inline __attribute__((always_inline)) void et_mve_channel(const et_gemm_oc *t, const int8_t *c, int32_t k,
                                                                 int32_t x_zero, int32_t n, int8_t *y) {
    int32_t s[4], ws;
    et_mve_dot4(t->w, c, c + k, c + 2 * k, c + 3 * k, k, s, &ws);
    const int32_t base = t->init - x_zero * ws, mult = t->mult, add = t->add, right = t->right;
    const int8_t y0 = (int8_t)et_level2(2 * (base + s[0]), mult, add, right);
    const int8_t y1 = (int8_t)et_level2(2 * (base + s[1]), mult, add, right);
    const int8_t y2 = (int8_t)et_level2(2 * (base + s[2]), mult, add, right);
    const int8_t y3 = (int8_t)et_level2(2 * (base + s[3]), mult, add, right);
    y[0] = y0;
    if (n > 1) y[1] = y1;
    if (n > 2) y[2] = y2;
    if (n > 3) y[3] = y3;
}

/* et_gemm_row_wide's contract: `pairs` channel pairs t (channel 2 i + j stored at y + (2 i + j)
 * * cs), px pixels of the k planes at x (plane stride xs), col: 4 k bytes of scratch */
static ET_DSP_NOINLINE void et_gemm_row_mve(const et_gemm_oc *t, int32_t pairs, const int8_t *x, int32_t xs,
                                            int32_t k, int32_t x_zero, int8_t *col, int32_t px, int8_t *y,
                                            int32_t cs) {
    for (int32_t p = 0; p < px; p += 4) {
        const int32_t n = px - p < 4 ? px - p : 4;
        et_mve_cols(x + p, xs, k, n, col);
        int8_t *yo = y + p;
        for (int32_t o = 0; o < 2 * pairs; o++, yo += cs) et_mve_channel(t + o, col, k, x_zero, n, yo);
    }
}

#endif /* __ARM_FEATURE_MVE && __ARM_FEATURE_DSP */
#endif /* ET_INT8_MVE_H */
