/* edgetrain int8 qconv2d forward for RV32 cores (rv32imafc, rv32imc; on rv32imafcv, with the
 * vector extension, what et_int8_rvv.h does not vectorise: the dense rows, a weight split by
 * input channel, and the depthwise border pixels): the pointwise (1x1, stride 1, no padding,
 * ungrouped), depthwise and dense 3x3 / 5x5 / 7x7 rows of et_qconv_rows with their
 * accumulators in registers.
 *
 * The portable loop of et_qconv_rows keeps ET_ACC_BLOCK accumulators in memory and walks the
 * input channels outermost: every multiply-accumulate loads and stores its accumulator (about
 * 12 instructions a MAC on RV32, which has no SIMD and no indexed addressing). Here a block of
 * 4 output channels x 2 pixels keeps its 8 sums in registers over all input channels, and each
 * input channel's 4 weights and 2 pixels are loaded once for its 8 products (about 3
 * instructions a MAC). Integer sums are exact in any order, so the outputs are the portable
 * loop's bit for bit (the same et_qrow_put: bias added with saturation, then requantized). */
#ifndef ET_INT8_RV32_H
#define ET_INT8_RV32_H
#include <stdint.h>
#include "et_int8_core.h" /* et_qconv_p, et_rows8, et_w8, et_qconv_row, et_qrow_put */

#if defined(__riscv)
/* the sum of n int8 weights (x_zero times it is a row's zero-point term: exact in int32) */
static inline int32_t et_tap_sum(const int8_t *t, int32_t n) {
    int32_t sum = 0;
    for (int32_t k = 0; k < n; k++) sum += t[k];
    return sum;
}

/* input channels up to which a weight split by input channel (a partly trained layer's) is
 * gathered into 4 stack rows (ET_PW_GATHER bytes each) for et_qconv_pw_rows */
#define ET_PW_GATHER 256
/* whether et_qconv_pw_rows runs this conv */
static inline int et_qconv_pw_ok(const et_qconv_p *P, const et_w8 *w) {
    return P->kh == 1 && P->kw == 1 && P->sh == 1 && P->sw == 1 && P->ph == 0 && P->pw == 0 && P->groups == 1 &&
           P->wo == P->w && (!w->map || w->dim == 0 || P->cg <= ET_PW_GATHER);
}

/* The raw sums sum_c w_k[c] * x[c] of 4 weight rows w0..w3 at pixels xp (s[k]) and xp + D
 * (s[4 + k]) over cg input channels (plane stride cs), two channels a step: the weight bytes at
 * immediate offsets, one pointer add per row and step. D is a constant (1: two pixels; 0: one). */
#define ET_PW_MAC(k, c, xa, xb) s##k##0 += (int32_t)w##k[c] * xa; s##k##1 += (int32_t)w##k[c] * xb;
static inline __attribute__((always_inline)) void et_pw_sums(const int8_t *xp, int32_t cs, int32_t cg,
                                                             const int8_t *w0, const int8_t *w1, const int8_t *w2,
                                                             const int8_t *w3, const int32_t D, int32_t *s) {
    int32_t s00 = 0, s01 = 0, s10 = 0, s11 = 0, s20 = 0, s21 = 0, s30 = 0, s31 = 0;
    int32_t c = 0;
    for (; c + 2 <= cg; c += 2, xp += 2 * cs, w0 += 2, w1 += 2, w2 += 2, w3 += 2) {
        const int32_t a0 = xp[0], a1 = xp[D], b0 = xp[cs], b1 = xp[cs + D];
        ET_PW_MAC(0, 0, a0, a1) ET_PW_MAC(1, 0, a0, a1) ET_PW_MAC(2, 0, a0, a1) ET_PW_MAC(3, 0, a0, a1)
        ET_PW_MAC(0, 1, b0, b1) ET_PW_MAC(1, 1, b0, b1) ET_PW_MAC(2, 1, b0, b1) ET_PW_MAC(3, 1, b0, b1)
    }
    if (c < cg) {
        const int32_t a0 = xp[0], a1 = xp[D];
        ET_PW_MAC(0, 0, a0, a1) ET_PW_MAC(1, 0, a0, a1) ET_PW_MAC(2, 0, a0, a1) ET_PW_MAC(3, 0, a0, a1)
    }
    s[0] = s00; s[1] = s10; s[2] = s20; s[3] = s30;
    s[4] = s01; s[5] = s11; s[6] = s21; s[7] = s31;
}
#undef ET_PW_MAC

/* output rows [r0, r1) of channels [o0, o1): blocks of 4 channels x 2 pixels; the zero point
 * taken out once per channel (x_zero times its weights' sum: exact in int32) */
__attribute__((noinline, unused)) static void et_qconv_pw_rows(const et_qconv_p *P, et_rows8 x, int32_t xc_off,
                                                               const et_w8 *w, const int32_t *bias, et_rows8 y,
                                                               float *yf, int32_t yo_off, int32_t r0, int32_t r1,
                                                               int32_t o0, int32_t o1) {
    const int32_t cg = P->cg, wo = P->wo, cs = x.cstride;
    for (int32_t o = o0; o < o1; o += 4) {
        const int32_t no = o1 - o < 4 ? o1 - o : 4;
        /* a block of fewer than 4 channels repeats its last row (computed, not stored) */
        const int8_t *wr[4];
        int32_t zs[4];
        int8_t gathered[4][ET_PW_GATHER]; /* a weight split by input channel: its rows gathered */
        const int split = w->map && w->dim == 1;
        for (int32_t k = 0; k < 4; k++) {
            const int32_t ok = o + (k < no ? k : no - 1);
            if (split) {
                for (int32_t c = 0; c < cg; c++) gathered[k][c] = *et_w8_taps(w, ok, c, cg, 1);
                wr[k] = gathered[k];
            } else {
                wr[k] = et_w8_taps(w, ok, 0, cg, 1);
            }
            zs[k] = P->x_zero * et_tap_sum(wr[k], cg);
        }
        for (int32_t n = 0; n < P->n; n++)
            for (int32_t ho = r0; ho < r1; ho++) {
                /* input channel c of this row at xr + c * cs */
                const int8_t *xr = x.p + n * x.nstride - xc_off * cs + (ho % x.cap) * P->w;
                et_qrow out[4];
                for (int32_t k = 0; k < no; k++) out[k] = et_qconv_row(P, y, yf, yo_off, n, o + k, ho, bias);
                int32_t q = 0, s[8];
                for (; q + 2 <= wo; q += 2) {
                    et_pw_sums(xr + q, cs, cg, wr[0], wr[1], wr[2], wr[3], 1, s);
                    for (int32_t k = 0; k < no; k++) {
                        et_qrow_put(&out[k], q, s[k] - zs[k]);
                        et_qrow_put(&out[k], q + 1, s[4 + k] - zs[k]);
                    }
                }
                if (q < wo) { /* an odd last pixel */
                    et_pw_sums(xr + q, cs, cg, wr[0], wr[1], wr[2], wr[3], 0, s);
                    for (int32_t k = 0; k < no; k++) et_qrow_put(&out[k], q, s[k] - zs[k]);
                }
            }
    }
}

/* ---- depthwise (one input channel per output channel, no dilation): the taps of one output
 * pixel summed in registers. An output row whose tap rows all lie in the image runs its
 * interior columns (every tap column in the image) through et_dwp_interior_k<K> for square
 * kernels of 3, 5 and 7 taps: the weights copied into locals, each pixel's K x K products
 * unrolled, the zero point taken out once per row (x_zero times the sum of the weights); the
 * border rows and columns, and other kernel sizes, take et_dwp_pixel, which skips the taps
 * outside the image (a padded tap adds w * (x_zero - x_zero) = 0). */
#define ET_DWP_MAX 8
/* the input row pointers of output row ho of one channel (channel base xc, rows of width P->w in a
 * ring of `cap`): rp[i] for tap row i, 0 where it lies outside the image; returns how many are in */
static inline int32_t et_dwp_row_ptrs(const et_qconv_p *P, const int8_t *xc, int32_t cap, int32_t ho,
                                      const int8_t **rp) {
    int32_t rows = 0;
    for (int32_t i = 0; i < P->kh; i++) {
        const int32_t hi = ho * P->sh - P->ph + i;
        rp[i] = hi >= 0 && hi < P->h ? xc + (hi % cap) * P->w : 0;
        rows += rp[i] != 0;
    }
    return rows;
}

/* the interior output columns [qa, qb) of a row: every tap column in the image
 * (q * sw - pw >= 0 and q * sw - pw + kw <= w); qa == qb when there are none */
static inline void et_interior_cols(const et_qconv_p *P, int32_t *qa, int32_t *qb) {
    const int32_t qa0 = (P->pw + P->sw - 1) / P->sw, lim = P->w - P->kw + P->pw;
    int32_t a = qa0 < P->wo ? qa0 : P->wo, b = lim < 0 ? a : lim / P->sw + 1;
    if (b > P->wo) b = P->wo;
    *qa = a;
    *qb = b < a ? a : b;
}
static inline int et_qconv_dwp_ok(const et_qconv_p *P) {
    return P->cg == 1 && P->dh == 1 && P->dw == 1 && P->kh <= ET_DWP_MAX && P->kw <= ET_DWP_MAX;
}

/* the sum over the taps of pixel q whose row pointer rp[i] is set and whose column is in the image */
static inline int32_t et_dwp_pixel(const et_qconv_p *P, const int8_t *const *rp, const int8_t *t, int32_t q) {
    const int32_t c = q * P->sw - P->pw, z = P->x_zero;
    int32_t s = 0;
    for (int32_t i = 0; i < P->kh; i++) {
        if (!rp[i]) continue;
        for (int32_t j = 0; j < P->kw; j++) {
            const int32_t col = c + j;
            if (col >= 0 && col < P->w) s += (int32_t)t[i * P->kw + j] * ((int32_t)rp[i][col] - z);
        }
    }
    return s;
}

#define ET_DWP_INTERIOR(K)                                                                                    \
    __attribute__((noinline, unused)) static void et_dwp_interior_k##K(                                      \
        const int8_t *const *rp, const int8_t *t, int32_t qa, int32_t qb, int32_t sw, int32_t pw,            \
        int32_t init, const et_qrow *out) {                                                                   \
        int32_t wl[K * K];                                                                                    \
        for (int32_t k = 0; k < K * K; k++) wl[k] = t[k];                                                     \
        const int8_t *r[K];                                                                                   \
        for (int32_t i = 0; i < K; i++) r[i] = rp[i] - pw;                                                    \
        for (int32_t q = qa; q < qb; q++) {                                                                   \
            const int32_t c = q * sw;                                                                         \
            int32_t s = init;                                                                                 \
            for (int32_t i = 0; i < K; i++)                                                                   \
                for (int32_t j = 0; j < K; j++) s += wl[i * K + j] * (int32_t)r[i][c + j];                    \
            et_qrow_put(out, q, s);                                                                           \
        }                                                                                                     \
    }
ET_DWP_INTERIOR(3)
ET_DWP_INTERIOR(5)
ET_DWP_INTERIOR(7)
#undef ET_DWP_INTERIOR

__attribute__((noinline, unused)) static void et_qconv_dwp_rows(const et_qconv_p *P, et_rows8 x, int32_t xc_off,
                                                                const et_w8 *w, const int32_t *bias, et_rows8 y,
                                                                float *yf, int32_t yo_off, int32_t r0, int32_t r1,
                                                                int32_t o0, int32_t o1) {
    const int32_t opg = P->o / P->groups, kh = P->kh, kw = P->kw, khkw = kh * kw, sw = P->sw, pw = P->pw;
    int32_t qa, qb;
    et_interior_cols(P, &qa, &qb);
    const int square = kh == kw && (kh == 3 || kh == 5 || kh == 7);
    for (int32_t n = 0; n < P->n; n++)
        for (int32_t o = o0; o < o1; o++) {
            const int8_t *t = et_w8_taps(w, o, 0, 1, khkw);
            const int32_t wsum = et_tap_sum(t, khkw);
            const int8_t *xc = x.p + n * x.nstride + (o / opg - xc_off) * x.cstride;
            for (int32_t ho = r0; ho < r1; ho++) {
                const int8_t *rp[ET_DWP_MAX];
                const int32_t rows = et_dwp_row_ptrs(P, xc, x.cap, ho, rp);
                const et_qrow out = et_qconv_row(P, y, yf, yo_off, n, o, ho, bias);
                const int fast = square && rows == kh;
                const int32_t a = fast ? qa : P->wo, b = fast ? qb : P->wo;
                for (int32_t q = 0; q < a; q++) et_qrow_put(&out, q, et_dwp_pixel(P, rp, t, q));
                if (fast) {
                    const int32_t init = -P->x_zero * wsum;
                    if (kh == 3) et_dwp_interior_k3(rp, t, a, b, sw, pw, init, &out);
                    else if (kh == 5) et_dwp_interior_k5(rp, t, a, b, sw, pw, init, &out);
                    else et_dwp_interior_k7(rp, t, a, b, sw, pw, init, &out);
                }
                for (int32_t q = b; q < P->wo; q++) et_qrow_put(&out, q, et_dwp_pixel(P, rp, t, q));
            }
        }
}

/* ---- dense KxK (3, 5, 7; no dilation; any groups with several input channels a group): as the
 * depthwise rows, each interior pixel's C_g x K x K products summed in one register, the K x K
 * taps of one input channel unrolled (the weights read from the weight row, too many for
 * registers); border pixels and rows through et_kxk_pixel; other sizes and weights split by
 * input channel take the portable loop. */
static inline int et_qconv_kxk_ok(const et_qconv_p *P, const et_w8 *w) {
    return P->cg > 1 && P->dh == 1 && P->dw == 1 && P->kh == P->kw && (P->kh == 3 || P->kh == 5 || P->kh == 7) &&
           (!w->map || w->dim == 0);
}

/* the sum over the in-image taps of pixel q, input channel c's row i at xb + c * cs + roff[i]
 * (roff[i] < 0: row i is outside the image) */
static inline int32_t et_kxk_pixel(const et_qconv_p *P, const int8_t *xb, int32_t cs, const int32_t *roff,
                                   const int8_t *t, int32_t q) {
    const int32_t c0 = q * P->sw - P->pw, z = P->x_zero, k = P->kh;
    int32_t s = 0;
    for (int32_t c = 0; c < P->cg; c++)
        for (int32_t i = 0; i < k; i++) {
            if (roff[i] < 0) continue;
            const int8_t *r = xb + c * cs + roff[i];
            for (int32_t j = 0; j < k; j++) {
                const int32_t col = c0 + j;
                if (col >= 0 && col < P->w) s += (int32_t)t[(c * k + i) * k + j] * ((int32_t)r[col] - z);
            }
        }
    return s;
}

#define ET_KXK_INTERIOR(K)                                                                                     \
    __attribute__((noinline, unused)) static void et_kxk_interior_k##K(                                       \
        const int8_t *xb, int32_t cs, int32_t cg, const int32_t *roff, const int8_t *t, int32_t qa, int32_t qb, \
        int32_t sw, int32_t pw, int32_t init, const et_qrow *out) {                                           \
        for (int32_t q = qa; q < qb; q++) {                                                                    \
            const int8_t *xc = xb + q * sw - pw;                                                               \
            const int8_t *w = t;                                                                               \
            int32_t s = init;                                                                                  \
            for (int32_t c = 0; c < cg; c++, xc += cs, w += K * K)                                             \
                for (int32_t i = 0; i < K; i++) {                                                              \
                    const int8_t *r = xc + roff[i];                                                            \
                    for (int32_t j = 0; j < K; j++) s += (int32_t)w[i * K + j] * (int32_t)r[j];                \
                }                                                                                              \
            et_qrow_put(out, q, s);                                                                            \
        }                                                                                                      \
    }
ET_KXK_INTERIOR(3)
ET_KXK_INTERIOR(5)
ET_KXK_INTERIOR(7)
#undef ET_KXK_INTERIOR

__attribute__((noinline, unused)) static void et_qconv_kxk_rows(const et_qconv_p *P, et_rows8 x, int32_t xc_off,
                                                                const et_w8 *w, const int32_t *bias, et_rows8 y,
                                                                float *yf, int32_t yo_off, int32_t r0, int32_t r1,
                                                                int32_t o0, int32_t o1) {
    const int32_t opg = P->o / P->groups, k = P->kh, cg = P->cg, sw = P->sw, pw = P->pw, cs = x.cstride;
    int32_t qa, qb;
    et_interior_cols(P, &qa, &qb);
    for (int32_t n = 0; n < P->n; n++)
        for (int32_t o = o0; o < o1; o++) {
            /* the weight row of o: cg x k x k taps side by side (not split by input channel: _ok) */
            const int8_t *t = et_w8_taps(w, o, 0, cg, k * k);
            const int32_t wsum = et_tap_sum(t, cg * k * k);
            const int8_t *xb = x.p + n * x.nstride + ((o / opg) * cg - xc_off) * cs;
            for (int32_t ho = r0; ho < r1; ho++) {
                int32_t roff[ET_DWP_MAX], rows = 0;
                for (int32_t i = 0; i < k; i++) {
                    const int32_t hi = ho * P->sh - P->ph + i;
                    roff[i] = hi >= 0 && hi < P->h ? (hi % x.cap) * P->w : -1;
                    rows += roff[i] >= 0;
                }
                const et_qrow out = et_qconv_row(P, y, yf, yo_off, n, o, ho, bias);
                const int fast = rows == k;
                const int32_t a = fast ? qa : P->wo, b = fast ? qb : P->wo;
                for (int32_t q = 0; q < a; q++) et_qrow_put(&out, q, et_kxk_pixel(P, xb, cs, roff, t, q));
                if (fast) {
                    const int32_t init = -P->x_zero * wsum;
                    if (k == 3) et_kxk_interior_k3(xb, cs, cg, roff, t, a, b, sw, pw, init, &out);
                    else if (k == 5) et_kxk_interior_k5(xb, cs, cg, roff, t, a, b, sw, pw, init, &out);
                    else et_kxk_interior_k7(xb, cs, cg, roff, t, a, b, sw, pw, init, &out);
                }
                for (int32_t q = b; q < P->wo; q++) et_qrow_put(&out, q, et_kxk_pixel(P, xb, cs, roff, t, q));
            }
        }
}
#endif

#endif /* ET_INT8_RV32_H */
