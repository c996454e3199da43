/* edgetrain int8 qconv2d forward on Helium (MVE, Armv8.1-M: the Cortex-M55; included by
 * et_int8_gemm.h and et_int8_dw.h where __ARM_FEATURE_MVE is defined, which the M55 defines
 * with the DSP extension, so every other DSP kernel still runs there; gives the reference's
 * integers bit for bit, as the DSP versions of the same kernels do). Two kernels: the
 * pointwise rows below and the depthwise rows (et_mve_dw_row, further down).
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

/* ---- depthwise rows (et_int8_dw.h's et_qconv_dw_rows at stride 1 or 2) ---------------------
 * Four output pixels in the four int32 lanes of one accumulator, which starts at et_rq's init
 * (bias - x_zero * sum(w) on the fast path, -x_zero * sum(w) otherwise, as the DSP rows): per
 * tap one widening load of the four pixels' inputs (VLDRB.S32; at stride 2 eight bytes as
 * int16 lanes, VLDRB.S16, whose even and odd lanes, VMOVLB / VMOVLT, are two taps' inputs)
 * and one VMLA.S32 by the tap (a scalar register). The rows are et_qconv_dw_rows' padded
 * copies (a padded tap reads x_zero, taken back by init), so no tap tests a bound; the last
 * pixels of a row (wo % 4) load and store under a VCTP predicate. Every sum is the DSP rows'
 * exact int32 (in another order). Requantization on the fast path in the lanes:
 * et_level2(2 acc) = ssat8((add + hi - (acc < 0)) >> right) with hi = (2 acc mult + 2^31)
 * >> 32, which is VQRDMULH.S32 of acc by mult (no saturation: mult > 0); otherwise each lane
 * through et_rq_put, the DSP rows' general path (and float output). */

/* the levels (or et_rq_put's outputs) of the n <= 4 lanes of s at y[at..] / yf[at..] */
static inline __attribute__((always_inline)) void et_mve_dw_put(int32x4_t s, const et_rq *r, int32_t n,
                                                                const int fast, const et_qconv_p *P,
                                                                const int32_t *bias, int32_t o, int8_t *y,
                                                                float *yf, int32_t at) {
    if (fast) {
        int32x4_t v = vaddq_n_s32(vqrdmulhq_n_s32(s, r->mult), r->add);
        /* >> right and ssat8 as VQSHL by 24 - right (3..23), saturating to int32, then >> 24 */
        v = vshrq_n_s32(vqshlq_r_s32(vaddq_s32(v, vshrq_n_s32(s, 31)), 24 - r->right), 24);
        if (n >= 4) vstrbq_s32(y + at, v);
        else vstrbq_p_s32(y + at, v, vctp32q((uint32_t)n));
    } else {
        int32_t t[4];
        vst1q_s32(t, s);
        for (int32_t j = 0; j < n; j++) et_rq_put(P, bias, r, o, t[j], y, yf, at + j);
    }
}

/* an address gcc must take as it is: each tap's load is then an immediate offset from its
 * row's start (else gcc keeps one pointer per tap, the 7x7's 49 of them on the stack) */
#define ET_MVE_OPAQUE(p) __asm__ volatile("" : "+r"(p))

/* s[v] plus the kh x kw taps' products at output pixels q + 4 v .. q + 4 v + 3 for v < g (1, 2
 * or 4: each tap's scalar load serves g vectors) at stride sw (1 or 2); tail (g = 1): the loads
 * under the predicate of n < 4 pixels */
static inline __attribute__((always_inline)) void et_mve_dw_sums(const int8_t *const *rows, const int8_t *taps,
                                                                 int32x4_t s[4], const int g, int32_t kh, int32_t kw,
                                                                 int32_t sw, int32_t q, int32_t n, const int tail) {
    const int unroll = __builtin_constant_p(kh) && __builtin_constant_p(kw);
    int32x4_t s0 = s[0], s1 = s[1], s2 = s[2], s3 = s[3];
    if (sw == 1) {
        const mve_pred16_t m = tail ? vctp32q((uint32_t)n) : 0;
#define ET_MVE_DW1                                                                                          \
    for (int32_t j = 0; j < kw; j++) {                                                                      \
        const int32_t t = taps[i * kw + j];                                                                 \
        s0 = vmlaq_n_s32(s0, tail ? vldrbq_z_s32(p + j, m) : vldrbq_s32(p + j), t);                         \
        if (g > 1) s1 = vmlaq_n_s32(s1, vldrbq_s32(p + 4 + j), t);                                          \
        if (g > 2) s2 = vmlaq_n_s32(s2, vldrbq_s32(p + 8 + j), t);                                          \
        if (g > 2) s3 = vmlaq_n_s32(s3, vldrbq_s32(p + 12 + j), t);                                         \
    }
        if (unroll) {
            _Pragma("GCC unroll 8") for (int32_t i = 0; i < kh; i++) {
                const int8_t *p = rows[i] + q;
                ET_MVE_OPAQUE(p);
                _Pragma("GCC unroll 8") ET_MVE_DW1
            }
        } else {
            for (int32_t i = 0; i < kh; i++) {
                const int8_t *p = rows[i] + q;
                ET_MVE_OPAQUE(p);
                _Pragma("GCC unroll 1") ET_MVE_DW1
            }
        }
#undef ET_MVE_DW1
    } else { /* pixel q + l's tap j reads byte 2 (q + l) + j: lane 2 l (j even) or 2 l + 1 (j odd) of the
              * eight bytes at 2 q + (j & ~1) */
        const mve_pred16_t m = tail ? vctp16q((uint32_t)(2 * n)) : 0;
#define ET_MVE_DW2                                                                                          \
    for (int32_t j = 0; j < kw; j += 2) {                                                                   \
        const int32_t t0 = taps[i * kw + j], t1 = j + 1 < kw ? taps[i * kw + j + 1] : 0;                    \
        const int16x8_t v = tail ? vldrbq_z_s16(p + j, m) : vldrbq_s16(p + j);                              \
        s0 = vmlaq_n_s32(s0, vmovlbq_s16(v), t0);                                                           \
        if (j + 1 < kw) s0 = vmlaq_n_s32(s0, vmovltq_s16(v), t1);                                           \
        if (g > 1) {                                                                                        \
            const int16x8_t u = vldrbq_s16(p + 8 + j);                                                      \
            s1 = vmlaq_n_s32(s1, vmovlbq_s16(u), t0);                                                       \
            if (j + 1 < kw) s1 = vmlaq_n_s32(s1, vmovltq_s16(u), t1);                                       \
        }                                                                                                   \
        if (g > 2) {                                                                                        \
            const int16x8_t u2 = vldrbq_s16(p + 16 + j), u3 = vldrbq_s16(p + 24 + j);                       \
            s2 = vmlaq_n_s32(s2, vmovlbq_s16(u2), t0);                                                      \
            s3 = vmlaq_n_s32(s3, vmovlbq_s16(u3), t0);                                                      \
            if (j + 1 < kw) s2 = vmlaq_n_s32(s2, vmovltq_s16(u2), t1);                                      \
            if (j + 1 < kw) s3 = vmlaq_n_s32(s3, vmovltq_s16(u3), t1);                                      \
        }                                                                                                   \
    }
        if (unroll) {
            _Pragma("GCC unroll 8") for (int32_t i = 0; i < kh; i++) {
                const int8_t *p = rows[i] + 2 * q;
                ET_MVE_OPAQUE(p);
                _Pragma("GCC unroll 4") ET_MVE_DW2
            }
        } else {
            for (int32_t i = 0; i < kh; i++) {
                const int8_t *p = rows[i] + 2 * q;
                ET_MVE_OPAQUE(p);
                _Pragma("GCC unroll 1") ET_MVE_DW2
            }
        }
#undef ET_MVE_DW2
    }
    s[0] = s0;
    s[1] = s1;
    s[2] = s2;
    s[3] = s3;
}

/* pixels q.. of one output row of channel o at y[at + q..] (or yf), its kh rows' padded
 * copies: whole groups of 4 g, then of 4 (span 0; the sizes constants, the tap loops
 * unrolled), or groups of 4 up to wo, each one's loads and stores under a predicate (span 1);
 * returns the next q */
static inline __attribute__((always_inline)) int32_t et_mve_dw_run(const int8_t *const *rows, const int8_t *taps,
                                                                   const et_rq *r, int32_t kh, int32_t kw,
                                                                   int32_t q, int32_t wo, int32_t sw, const int fast,
                                                                   const int span, const int g, const et_qconv_p *P,
                                                                   const int32_t *bias, int32_t o, int8_t *y,
                                                                   float *yf, int32_t at) {
    const et_rq rq = *r; /* a local copy: the int8 stores cannot change it, so it stays in registers */
    const int32x4_t init = vdupq_n_s32(rq.init);
    int32x4_t s[4];
    for (; !span && q + 4 * g <= wo; q += 4 * g) {
        s[0] = s[1] = s[2] = s[3] = init;
        et_mve_dw_sums(rows, taps, s, g, kh, kw, sw, q, 4 * g, 0);
        for (int32_t v = 0; v < g; v++) et_mve_dw_put(s[v], &rq, 4, fast, P, bias, o, y, yf, at + q + 4 * v);
    }
    for (; span ? q < wo : q + 4 <= wo; q += 4) {
        const int32_t n = span && wo - q < 4 ? wo - q : 4;
        s[0] = init;
        et_mve_dw_sums(rows, taps, s, 1, kh, kw, sw, q, n, span);
        et_mve_dw_put(s[0], &rq, n, fast, P, bias, o, y, yf, at + q);
    }
    return q;
}

/* et_qconv_dw_rows' row at stride 1 or 2 (kh, kw <= 8): the fast 3x3, 5x5 and 7x7 rows' groups
 * of 4 pixels with their sizes and stride constants, the rest (other sizes, the general
 * requantization, a last group of 1..3 pixels) with them variable */
static inline int et_mve_dw_ok(int32_t sw) { return sw == 1 || sw == 2; }

/* no pre-allocation scheduling: it hoists the unrolled taps' loads ahead and spills the
 * vectors and pointers it holds (proxyless' 7x7 rows: a 284-byte frame, 68 without) */
static ET_DSP_NOINLINE __attribute__((optimize("no-schedule-insns"))) void et_mve_dw_row(const int8_t *const *rows, const int8_t *taps, const et_rq *r, int32_t kh,
                                          int32_t kw, int32_t wo, int32_t sw, const et_qconv_p *P,
                                          const int32_t *bias, int32_t o, int8_t *y, float *yf, int32_t at) {
#define ET_MVE_DW(KH, KW, SW, FAST, SPAN, G) \
    et_mve_dw_run(rows, taps, r, KH, KW, q, wo, SW, FAST, SPAN, G, P, bias, o, y, yf, at)
    int32_t q = 0;
    if (r->fast) { /* 3x3: 16 pixels a group, 5x5 and 7x7: 8 (their code four times the 3x3's a vector) */
        if (kh == 3 && kw == 3) q = sw == 1 ? ET_MVE_DW(3, 3, 1, 1, 0, 4) : ET_MVE_DW(3, 3, 2, 1, 0, 4);
        else if (kh == 5 && kw == 5) q = sw == 1 ? ET_MVE_DW(5, 5, 1, 1, 0, 2) : ET_MVE_DW(5, 5, 2, 1, 0, 2);
        else if (kh == 7 && kw == 7) q = sw == 1 ? ET_MVE_DW(7, 7, 1, 1, 0, 2) : ET_MVE_DW(7, 7, 2, 1, 0, 2);
        if (q < wo) ET_MVE_DW(kh, kw, sw, 1, 1, 1);
    } else {
        ET_MVE_DW(kh, kw, sw, 0, 1, 1);
    }
#undef ET_MVE_DW
}

#endif /* __ARM_FEATURE_MVE && __ARM_FEATURE_DSP */
#endif /* ET_INT8_MVE_H */
