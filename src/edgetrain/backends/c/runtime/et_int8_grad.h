/* edgetrain int8 training: the float32 backward of the int8 program (input, weight and bias
 * gradients of qconv2d) and the qsgd update, bit-identical to the numpy references in
 * src/edgetrain/ops (qconv.py, qoptim.py). Kept apart from et_int8.h (the integer forward)
 * so the two are tuned independently; the numerics contract is et_int8.h's: every float32
 * sum runs in the reference's documented order, compiled with -ffp-contract=off.
 */
#ifndef ET_INT8_GRAD_H
#define ET_INT8_GRAD_H

#include "et_int8.h"

/* ---- backward (float32) ---------------------------------------------------------------- */
/* qconv2d_grad_input: gx = conv-transpose(g, w * w_scale[o]); each gx element adds its
 * contributions in (o, i, j) order starting from 0 (ops/qconv.py: _grad_input_ref). */
static inline void et_qconv_grad_input(const et_qconv_p *P, const float *g, const et_w8 *w, const float *w_scale,
                                       float *ET_RESTRICT gx) {
    const int32_t opg = P->o / P->groups, khkw = P->kh * P->kw, hw = P->h * P->w, howo = P->ho * P->wo;
    memset(gx, 0, sizeof(float) * (size_t)(P->n * P->c * hw));
    for (int32_t n = 0; n < P->n; n++)
        for (int32_t o = 0; o < P->o; o++) {
            const int32_t c0 = (o / opg) * P->cg;
            const float *go = g + (n * P->o + o) * howo;
            for (int32_t i = 0; i < P->kh; i++)
                for (int32_t j = 0; j < P->kw; j++) {
                    int32_t lo, hi;
                    et_col_range(P, j, &lo, &hi);
                    for (int32_t c = 0; c < P->cg; c++) {
                        const float wr = (float)et_w8_taps(w, o, c, P->cg, khkw)[i * P->kw + j] * w_scale[o];
                        float *gxc = gx + (n * P->c + c0 + c) * hw + j * P->dw - P->pw;
                        for (int32_t ho = 0; ho < P->ho; ho++) {
                            const int32_t h = ho * P->sh - P->ph + i * P->dh;
                            if (h < 0 || h >= P->h) continue;
                            float *gr = gxc + h * P->w;
                            const float *gi = go + ho * P->wo;
                            for (int32_t q = lo; q < hi; q++) {
                                const float p = wr * gi[q];
                                gr[q * P->sw] = gr[q * P->sw] + p;
                            }
                        }
                    }
                }
        }
}

/* qconv2d_dw_grad_input: one channel at a time through `plane` (H*W floats), so gx may be
 * g's own storage (same shape); per element the contributions add in (i, j) order. */
static inline void et_qconv_dw_grad_input(const et_qconv_p *P, const float *g, const et_w8 *w, const float *w_scale,
                                          float *gx, float *ET_RESTRICT plane) {
    const int32_t khkw = P->kh * P->kw, hw = P->h * P->w, howo = P->ho * P->wo;
    for (int32_t n = 0; n < P->n; n++)
        for (int32_t c = 0; c < P->c; c++) {
            const float *gc = g + (n * P->c + c) * howo;
            const int8_t *taps = et_w8_taps(w, c, 0, 1, khkw);
            for (int32_t t = 0; t < hw; t++) plane[t] = 0.0f;
            for (int32_t i = 0; i < P->kh; i++)
                for (int32_t j = 0; j < P->kw; j++) {
                    const float wr = (float)taps[i * P->kw + j] * w_scale[c];
                    int32_t lo, hi;
                    et_col_range(P, j, &lo, &hi);
                    for (int32_t ho = 0; ho < P->ho; ho++) {
                        const int32_t h = ho * P->sh - P->ph + i * P->dh;
                        if (h < 0 || h >= P->h) continue;
                        float *pr = plane + h * P->w + j * P->dw - P->pw;
                        const float *gi = gc + ho * P->wo;
                        for (int32_t q = lo; q < hi; q++) {
                            const float p = wr * gi[q];
                            pr[q * P->sw] = pr[q * P->sw] + p;
                        }
                    }
                }
            memcpy(gx + (n * P->c + c) * hw, plane, sizeof(float) * (size_t)hw);
        }
}

/* Row o of qconv2d_grad_weight into gw_row (CG*KH*KW floats): each element is the
 * sequential float32 sum over (n, ho, wo) of g * (x - x_zero), times scale (the padded
 * taps, zero terms, are skipped). x holds the layer input (C channels; group of o). */
static inline void et_qconv_grad_weight_row(const et_qconv_p *P, const int8_t *x, const float *g, int32_t o,
                                            float scale, float *ET_RESTRICT gw_row) {
    const int32_t opg = P->o / P->groups, hw = P->h * P->w, howo = P->ho * P->wo;
    const int32_t c0 = (o / opg) * P->cg;
    for (int32_t c = 0; c < P->cg; c++)
        for (int32_t i = 0; i < P->kh; i++)
            for (int32_t j = 0; j < P->kw; j++) {
                int32_t lo, hi;
                et_col_range(P, j, &lo, &hi);
                float acc = 0.0f;
                for (int32_t n = 0; n < P->n; n++) {
                    const int8_t *xc = x + (n * P->c + c0 + c) * hw + j * P->dw - P->pw;
                    const float *go = g + (n * P->o + o) * howo;
                    for (int32_t ho = 0; ho < P->ho; ho++) {
                        const int32_t h = ho * P->sh - P->ph + i * P->dh;
                        if (h < 0 || h >= P->h) continue;
                        const int8_t *xr = xc + h * P->w;
                        const float *gr = go + ho * P->wo;
                        for (int32_t q = lo; q < hi; q++) {
                            const float p = gr[q] * (float)((int32_t)xr[q * P->sw] - P->x_zero);
                            acc = acc + p;
                        }
                    }
                }
                gw_row[(c * P->kh + i) * P->kw + j] = acc * scale;
            }
}

/* qconv2d_grad_bias: sequential float32 sum over (n, h, w), times scale[o] */
static inline void et_qconv_grad_bias(const float *g, float *gb, int32_t n, int32_t o, int32_t hw,
                                      const float *scale) {
    for (int32_t k = 0; k < o; k++) {
        float acc = 0.0f;
        for (int32_t b = 0; b < n; b++) {
            const float *r = g + (b * o + k) * hw;
            for (int32_t t = 0; t < hw; t++) acc = acc + r[t];
        }
        gb[k] = acc * scale[k];
    }
}

/* ---- qsgd_update: one row of the (selected) gradient ----------------------------------- */
typedef struct {
    float lr, momentum, weight_decay;
    int32_t qmin, qmax;
    uint32_t seed, param_id;
} et_qsgd_p;

/* Update one row of `len` gradient elements g (momentum row m, or 0). Element e is the
 * full tensor's flat element flat0 + e, or, with idx (dense weights trained on some input
 * channels), flat0 + idx[e / khkw] * khkw + e % khkw. It is stored at wq[flat] when
 * `full` (the whole tensor in one array), else at wq[pos0 + e] (a split weight's trained
 * part, or a whole row). wq is int8 when w8, else int32. */
static inline void et_qsgd_row(const et_qsgd_p *P, uint32_t key, void *wq, int32_t w8, int32_t full,
                               int32_t pos0, const float *g, float *m, float scale, int32_t len, uint32_t flat0,
                               const uint16_t *idx, int32_t khkw) {
    for (int32_t e = 0; e < len; e++) {
        const uint32_t flat = idx ? flat0 + (uint32_t)idx[e / khkw] * (uint32_t)khkw + (uint32_t)(e % khkw)
                                  : flat0 + (uint32_t)e;
        const int32_t at = full ? (int32_t)flat : pos0 + e;
        const int32_t wi = w8 ? (int32_t)((int8_t *)wq)[at] : ((int32_t *)wq)[at];
        const float wf = (float)wi;
        float d = g[e] * scale;
        if (P->weight_decay != 0.0f) d = d + P->weight_decay * wf;
        if (m) {
            d = P->momentum * m[e] + d;
            m[e] = d;
        }
        const float v = wf - P->lr * d;
        float r = et_floorf_(v + et_uniform(key, flat));
        if (r < (float)P->qmin) r = (float)P->qmin;
        if (r > (float)P->qmax) r = (float)P->qmax;
        const int32_t q = r >= 2147483648.0f ? INT32_MAX : (int32_t)r;
        if (w8) ((int8_t *)wq)[at] = (int8_t)q;
        else ((int32_t *)wq)[at] = q;
    }
}

#endif /* ET_INT8_GRAD_H */
