/* edgetrain C runtime: int8 pooling and concatenation (ops/qpool.py), split from et_int8.h,
 * which includes it. Header-only. */
#ifndef ET_INT8_POOL_H
#define ET_INT8_POOL_H
#include <stdint.h>
#include <string.h>
#include "et_int8_core.h" /* et_mbqm, et_clampi */

/* ---- int8 pooling and concatenation (ops/qpool.py) ---------------------------------------
 * NCHW planes; a window's taps run in (i, j) order; a padded tap is skipped (a max pool's
 * padding never wins, an average's adds a real zero). */
typedef struct {
    int32_t planes, h, w, ho, wo, kh, kw, sh, sw, ph, pw, dh, dw;
    int32_t div; /* average: the divisor, or 0 for the count of real taps */
} et_pool_p;

/* the max level of window (oh, ow) of one plane, -129 when every tap is padding; *arg: the
 * first tap (i * kw + j) holding it, -1 when none */
static inline int32_t et_qmaxpool_win(const et_pool_p *P, const int8_t *x, int32_t oh, int32_t ow, int32_t *arg) {
    int32_t best = -129, at = -1;
    for (int32_t i = 0; i < P->kh; i++) {
        int32_t r = oh * P->sh + i * P->dh - P->ph;
        if (r < 0 || r >= P->h) continue;
        for (int32_t j = 0; j < P->kw; j++) {
            int32_t c = ow * P->sw + j * P->dw - P->pw;
            if (c < 0 || c >= P->w) continue;
            int32_t v = x[r * P->w + c];
            if (v > best) {
                best = v;
                at = i * P->kw + j;
            }
        }
    }
    *arg = at;
    return best;
}

static inline void et_qmax_pool2d(const et_pool_p *P, const int8_t *x, int8_t *y) {
    for (int32_t p = 0; p < P->planes; p++)
        for (int32_t oh = 0; oh < P->ho; oh++)
            for (int32_t ow = 0; ow < P->wo; ow++) {
                int32_t arg;
                int32_t v = et_qmaxpool_win(P, x + p * P->h * P->w, oh, ow, &arg);
                y[(p * P->ho + oh) * P->wo + ow] = (int8_t)et_clampi(v, -128, 127);
            }
}

/* each output gradient to the first max of its window; an input element adds its terms in
 * tap order from 0 (as ops/qpool.py _qmax_grad_ref) */
static inline void et_qmax_pool2d_grad(const et_pool_p *P, const float *g, const int8_t *x, float *gx) {
    memset(gx, 0, sizeof(float) * (size_t)P->planes * (size_t)P->h * (size_t)P->w);
    for (int32_t p = 0; p < P->planes; p++) {
        const int8_t *xp = x + p * P->h * P->w;
        float *gp = gx + p * P->h * P->w;
        for (int32_t i = 0; i < P->kh; i++)
            for (int32_t j = 0; j < P->kw; j++)
                for (int32_t oh = 0; oh < P->ho; oh++) {
                    int32_t r = oh * P->sh + i * P->dh - P->ph;
                    if (r < 0 || r >= P->h) continue;
                    for (int32_t ow = 0; ow < P->wo; ow++) {
                        int32_t c = ow * P->sw + j * P->dw - P->pw, arg;
                        if (c < 0 || c >= P->w) continue;
                        et_qmaxpool_win(P, xp, oh, ow, &arg);
                        gp[r * P->w + c] += arg == i * P->kw + j ? g[(p * P->ho + oh) * P->wo + ow] : 0.0f;
                    }
                }
    }
}

/* the divisor of window (oh, ow): P->div, or the number of its real taps */
static inline int32_t et_pool_count(const et_pool_p *P, int32_t oh, int32_t ow) {
    if (P->div > 0) return P->div;
    int32_t rows = 0, cols = 0;
    for (int32_t i = 0; i < P->kh; i++) {
        int32_t r = oh * P->sh + i * P->dh - P->ph;
        rows += r >= 0 && r < P->h;
    }
    for (int32_t j = 0; j < P->kw; j++) {
        int32_t c = ow * P->sw + j * P->dw - P->pw;
        cols += c >= 0 && c < P->w;
    }
    return rows * cols;
}

static inline void et_qavg_pool2d(const et_pool_p *P, const int8_t *x, int8_t *y, int32_t zero) {
    for (int32_t p = 0; p < P->planes; p++)
        for (int32_t oh = 0; oh < P->ho; oh++)
            for (int32_t ow = 0; ow < P->wo; ow++) {
                int32_t total = 0;
                for (int32_t i = 0; i < P->kh; i++) {
                    int32_t r = oh * P->sh + i * P->dh - P->ph;
                    if (r < 0 || r >= P->h) continue;
                    for (int32_t j = 0; j < P->kw; j++) {
                        int32_t c = ow * P->sw + j * P->dw - P->pw;
                        if (c >= 0 && c < P->w) total += (int32_t)x[(p * P->h + r) * P->w + c] - zero;
                    }
                }
                int32_t count = et_pool_count(P, oh, ow);
                int32_t mag = ((total < 0 ? -total : total) + count / 2) / count;
                y[(p * P->ho + oh) * P->wo + ow] = (int8_t)et_clampi((total < 0 ? -mag : mag) + zero, -128, 127);
            }
}

/* g / count spread over each window, added in tap order from 0 */
static inline void et_qavg_pool2d_grad(const et_pool_p *P, const float *g, float *gx) {
    memset(gx, 0, sizeof(float) * (size_t)P->planes * (size_t)P->h * (size_t)P->w);
    for (int32_t p = 0; p < P->planes; p++)
        for (int32_t i = 0; i < P->kh; i++)
            for (int32_t j = 0; j < P->kw; j++)
                for (int32_t oh = 0; oh < P->ho; oh++) {
                    int32_t r = oh * P->sh + i * P->dh - P->ph;
                    if (r < 0 || r >= P->h) continue;
                    for (int32_t ow = 0; ow < P->wo; ow++) {
                        int32_t c = ow * P->sw + j * P->dw - P->pw;
                        if (c < 0 || c >= P->w) continue;
                        gx[(p * P->h + r) * P->w + c] +=
                            g[(p * P->ho + oh) * P->wo + ow] / (float)et_pool_count(P, oh, ow);
                    }
                }
}

/* TFLite's int8 -> int8 requantization (a qcat input); multiplier 1.0 (2^30, shift 1) with
 * equal zero points is the identity, copied */
static inline void et_qrequant(const int8_t *x, int8_t *y, int32_t count, int32_t x_zero, int32_t mult,
                               int32_t shift, int32_t y_zero) {
    if (mult == (1 << 30) && shift == 1 && x_zero == y_zero) {
        memcpy(y, x, (size_t)count);
        return;
    }
    for (int32_t k = 0; k < count; k++)
        y[k] = (int8_t)et_clampi(et_mbqm((int32_t)x[k] - x_zero, mult, shift) + y_zero, -128, 127);
}

#endif /* ET_INT8_POOL_H */
