/* edgetrain int8 qconv2d forward for RV32 cores without SIMD (rv32imafc, rv32imc: where
 * __riscv is defined and the V extension is not): the pointwise (1x1, stride 1, no padding,
 * ungrouped) and the depthwise rows of et_qconv_rows with their accumulators in registers.
 *
 * The portable loop of et_qconv_rows keeps ET_ACC_BLOCK accumulators in memory and walks the
 * input channels outermost: every multiply-accumulate loads and stores its accumulator (about
 * 12 instructions a MAC on RV32, which has no SIMD and no indexed addressing). Here a block of
 * 4 output channels x 2 pixels keeps its 8 sums in registers over all input channels, and each
 * input channel's 4 weights and 2 pixels are loaded once for its 8 products (about 3.5
 * instructions a MAC). Integer sums are exact in any order, so the outputs are the portable
 * loop's bit for bit (the same et_qrow_put: bias added with saturation, then requantized).
 * The weight rows must be whole over the input channels (no weight split by input channel). */
#ifndef ET_INT8_RV32_H
#define ET_INT8_RV32_H
#include <stdint.h>
#include "et_int8_core.h" /* et_qconv_p, et_rows8, et_w8, et_qconv_row, et_qrow_put */

#if defined(__riscv) && !defined(__riscv_vector)
/* whether et_qconv_pw_rows runs this conv */
static inline int et_qconv_pw_ok(const et_qconv_p *P, const et_w8 *w) {
    return P->kh == 1 && P->kw == 1 && P->sh == 1 && P->sw == 1 && P->ph == 0 && P->pw == 0 && P->groups == 1 &&
           P->wo == P->w && (!w->map || w->dim == 0);
}

/* the 2 x `no` sums (no <= 4 output channels, pixels q and q + 1 when two) of one output row */
#define ET_PW_SUM(k) s##k##0 += w##k[c] * x0; s##k##1 += w##k[c] * x1;
__attribute__((noinline, unused)) static void et_qconv_pw_rows(const et_qconv_p *P, et_rows8 x, int32_t xc_off,
                                                               const et_w8 *w, const int32_t *bias, et_rows8 y,
                                                               float *yf, int32_t yo_off, int32_t r0, int32_t r1,
                                                               int32_t o0, int32_t o1) {
    const int32_t cg = P->cg, wo = P->wo, z = P->x_zero, cs = x.cstride;
    for (int32_t n = 0; n < P->n; n++)
        for (int32_t ho = r0; ho < r1; ho++) {
            /* input channel c of this row at xr + c * cs */
            const int8_t *xr = x.p + n * x.nstride - xc_off * cs + (ho % x.cap) * P->w;
            for (int32_t o = o0; o < o1; o += 4) {
                const int32_t no = o1 - o < 4 ? o1 - o : 4;
                /* a block of fewer than 4 channels repeats its last row (computed, not stored) */
                const int8_t *w0 = et_w8_taps(w, o, 0, cg, 1);
                const int8_t *w1 = et_w8_taps(w, o + (no > 1), 0, cg, 1);
                const int8_t *w2 = et_w8_taps(w, o + (no > 2 ? 2 : no - 1), 0, cg, 1);
                const int8_t *w3 = et_w8_taps(w, o + no - 1, 0, cg, 1);
                et_qrow out[4];
                for (int32_t k = 0; k < no; k++) out[k] = et_qconv_row(P, y, yf, yo_off, n, o + k, ho, bias);
                for (int32_t q = 0; q < wo; q += 2) {
                    const int32_t two = q + 1 < wo;
                    const int8_t *xp = xr + q;
                    const int32_t d = two; /* a last single pixel is computed twice, stored once */
                    int32_t s00 = 0, s01 = 0, s10 = 0, s11 = 0, s20 = 0, s21 = 0, s30 = 0, s31 = 0;
                    for (int32_t c = 0; c < cg; c++, xp += cs) {
                        const int32_t x0 = (int32_t)xp[0] - z, x1 = (int32_t)xp[d] - z;
                        ET_PW_SUM(0) ET_PW_SUM(1) ET_PW_SUM(2) ET_PW_SUM(3)
                    }
                    const int32_t s0[4] = {s00, s10, s20, s30}, s1[4] = {s01, s11, s21, s31};
                    for (int32_t k = 0; k < no; k++) {
                        et_qrow_put(&out[k], q, s0[k]);
                        if (two) et_qrow_put(&out[k], q + 1, s1[k]);
                    }
                }
            }
        }
}
#undef ET_PW_SUM

/* ---- depthwise (one input channel per output channel, no dilation): the taps of one output
 * pixel summed in registers. An output row whose tap rows all lie in the image runs its
 * interior columns (every tap column in the image) through et_dwp_interior_k<K> for square
 * kernels of 3, 5 and 7 taps: the weights copied into locals, each pixel's K x K products
 * unrolled, the zero point taken out once per row (x_zero times the sum of the weights); the
 * border rows and columns, and other kernel sizes, take et_dwp_pixel, which skips the taps
 * outside the image (a padded tap adds w * (x_zero - x_zero) = 0). */
#define ET_DWP_MAX 8
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
    /* interior columns [qa, qb): q * sw - pw >= 0 and q * sw - pw + kw <= w */
    const int32_t qa0 = (pw + sw - 1) / sw, lim = P->w - kw + pw;
    int32_t qa = qa0 < P->wo ? qa0 : P->wo, qb = lim < 0 ? qa : lim / sw + 1;
    if (qb > P->wo) qb = P->wo;
    if (qb < qa) qb = qa;
    const int square = kh == kw && (kh == 3 || kh == 5 || kh == 7);
    for (int32_t n = 0; n < P->n; n++)
        for (int32_t o = o0; o < o1; o++) {
            const int8_t *t = et_w8_taps(w, o, 0, 1, khkw);
            int32_t wsum = 0;
            for (int32_t k = 0; k < khkw; k++) wsum += t[k];
            const int8_t *xc = x.p + n * x.nstride + (o / opg - xc_off) * x.cstride;
            for (int32_t ho = r0; ho < r1; ho++) {
                const int8_t *rp[ET_DWP_MAX];
                int32_t rows = 0;
                for (int32_t i = 0; i < kh; i++) {
                    const int32_t hi = ho * P->sh - P->ph + i;
                    rp[i] = hi >= 0 && hi < P->h ? xc + (hi % x.cap) * P->w : 0;
                    rows += rp[i] != 0;
                }
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
#endif

#endif /* ET_INT8_RV32_H */
