/* edgetrain C runtime: int8 upsampling (nearest, linear / bilinear), adaptive and 3-D max pooling (ops/qresample.py),
 * and their float32 gradients, in the order the references add (outputs in row-major order,
 * starting from zeros): bit-exact with them. Upsampling's source indices come from tables the
 * emitter computes with torch's arithmetic (ops/resample.py), linear ones with their Q(F) weights
 * (ops/qresample_linear.py); the gradient of upsampling is et_float_resample.h's et_upsample_grad_f.
 * Header-only. */
#ifndef ET_INT8_RESAMPLE_H
#define ET_INT8_RESAMPLE_H
#include "et_common.h"
#include "et_float_resample.h"

/* nearest upsampling of NC int8 planes H x W to HO x WO: output (i, j) copies x[RI[i], CI[j]] */
static inline void et_qupsample(const int8_t *X, int8_t *Y, long NC, int H, int W, int HO, int WO, const int *RI,
                                const int *CI) {
    for (long c = 0; c < NC; ++c) {
        const int8_t *x = X + (size_t)c * H * W;
        int8_t *y = Y + (size_t)c * HO * WO;
        for (int i = 0; i < HO; ++i)
            for (int j = 0; j < WO; ++j) y[(size_t)i * WO + j] = x[(size_t)RI[i] * W + CI[j]];
    }
}

/* linear / bilinear upsampling of NC int8 planes H x W to HO x WO with weights in Q(FB) (each
 * pair l0 + l1 = 2^FB, FB <= 11): acc = RL0 (CL0 x[RI0, CI0] + CL1 x[RI0, CI1]) + RL1 (...) in
 * int32 (|acc| <= 2^29), y = acc / 2^(2 FB) rounded half away from zero (a convex combination of
 * the taps: within [-128, 127]) */
static inline void et_qupsample_linear(const int8_t *X, int8_t *Y, long NC, int H, int W, int HO, int WO,
                                       const int *RI0, const int *RI1, const int *RL0, const int *RL1,
                                       const int *CI0, const int *CI1, const int *CL0, const int *CL1, int FB) {
    const int32_t half = (int32_t)1 << (2 * FB - 1);
    for (long c = 0; c < NC; ++c) {
        const int8_t *x = X + (size_t)c * H * W;
        int8_t *y = Y + (size_t)c * HO * WO;
        for (int i = 0; i < HO; ++i) {
            const int8_t *r0 = x + (size_t)RI0[i] * W, *r1 = x + (size_t)RI1[i] * W;
            for (int j = 0; j < WO; ++j) {
                const int32_t t0 = (int32_t)r0[CI0[j]] * CL0[j] + (int32_t)r0[CI1[j]] * CL1[j];
                const int32_t t1 = (int32_t)r1[CI0[j]] * CL0[j] + (int32_t)r1[CI1[j]] * CL1[j];
                const int32_t acc = t0 * RL0[i] + t1 * RL1[i];
                const int32_t mag = ((acc < 0 ? -acc : acc) + half) >> (2 * FB);
                y[(size_t)i * WO + j] = (int8_t)(acc < 0 ? -mag : mag);
            }
        }
    }
}

/* the first maximal level of torch's adaptive window (oh, ow) of one H x W plane: its index h * W + w */
static inline int et_qadaptive_argmax(const int8_t *x, int H, int W, int OH, int OW, int oh, int ow) {
    int h0, h1, w0, w1;
    et_adaptive_window(oh, H, OH, &h0, &h1);
    et_adaptive_window(ow, W, OW, &w0, &w1);
    int at = h0 * W + w0;
    for (int h = h0; h < h1; ++h)
        for (int w = w0; w < w1; ++w)
            if (x[h * W + w] > x[at]) at = h * W + w;
    return at;
}

/* adaptive max pooling of NC int8 planes H x W into OH x OW (the output keeps the input's scale) */
static inline void et_qadaptive_max_pool2d(const int8_t *X, int8_t *Y, long NC, int H, int W, int OH, int OW) {
    for (long c = 0; c < NC; ++c) {
        const int8_t *x = X + (size_t)c * H * W;
        for (int oh = 0; oh < OH; ++oh)
            for (int ow = 0; ow < OW; ++ow)
                Y[((size_t)c * OH + oh) * OW + ow] = x[et_qadaptive_argmax(x, H, W, OH, OW, oh, ow)];
    }
}

/* GX (float32) of int8 adaptive max pooling: each output gradient added, outputs in row-major
 * order, to its window's first maximal level */
static inline void et_qadaptive_max_pool2d_grad(const float *G, const int8_t *X, float *GX, long NC, int H, int W,
                                                int OH, int OW) {
    for (size_t i = 0; i < (size_t)NC * H * W; ++i) GX[i] = 0.0f;
    for (long c = 0; c < NC; ++c) {
        const int8_t *x = X + (size_t)c * H * W;
        for (int oh = 0; oh < OH; ++oh)
            for (int ow = 0; ow < OW; ++ow)
                GX[(size_t)c * H * W + et_qadaptive_argmax(x, H, W, OH, OW, oh, ow)] +=
                    G[((size_t)c * OH + oh) * OW + ow];
    }
}

/* the flat (d, h, w) index in its plane of the first maximal voxel of 3-D window (od, oh, ow)
 * (taps in (kd, kh, kw) order, padding skipped; geometry P as et_float_resample.h's ET_P3_*) */
static inline long et_qmax3_argmax(const int8_t *x, const int *P, int od, int oh, int ow) {
    long at = -1;
    int best = -129; /* below every level */
    for (int kd = 0; kd < P[ET_P3_KD]; ++kd) {
        const int id = et_p3_in(od, kd, P[ET_P3_SD], P[ET_P3_PD], P[ET_P3_DD]);
        if (id < 0 || id >= P[ET_P3_D]) continue;
        for (int kh = 0; kh < P[ET_P3_KH]; ++kh) {
            const int ih = et_p3_in(oh, kh, P[ET_P3_SH], P[ET_P3_PH], P[ET_P3_DH]);
            if (ih < 0 || ih >= P[ET_P3_H]) continue;
            for (int kw = 0; kw < P[ET_P3_KW]; ++kw) {
                const int iw = et_p3_in(ow, kw, P[ET_P3_SW], P[ET_P3_PW], P[ET_P3_DW]);
                if (iw < 0 || iw >= P[ET_P3_W]) continue;
                const long i = ((long)id * P[ET_P3_H] + ih) * P[ET_P3_W] + iw;
                if (x[i] > best) {
                    best = x[i];
                    at = i;
                }
            }
        }
    }
    return at;
}

/* 3-D max pooling of NC int8 volumes (the output keeps the input's scale); with G (not null):
 * GX (float32), each output gradient added, outputs in row-major order, to its window's first maximum */
static inline void et_qmax_pool3d(const int8_t *X, int8_t *Y, const float *G, float *GX, long NC, const int *P) {
    const long in = (long)P[ET_P3_D] * P[ET_P3_H] * P[ET_P3_W], out = (long)P[ET_P3_DO] * P[ET_P3_HO] * P[ET_P3_WO];
    if (G)
        for (long i = 0; i < NC * in; ++i) GX[i] = 0.0f;
    for (long c = 0; c < NC; ++c) {
        const int8_t *x = X + c * in;
        long o = c * out;
        for (int od = 0; od < P[ET_P3_DO]; ++od)
            for (int oh = 0; oh < P[ET_P3_HO]; ++oh)
                for (int ow = 0; ow < P[ET_P3_WO]; ++ow, ++o) {
                    const long at = et_qmax3_argmax(x, P, od, oh, ow);
                    if (G) {
                        if (at >= 0) GX[c * in + at] += G[o];
                    } else {
                        Y[o] = at >= 0 ? x[at] : (int8_t)-128;
                    }
                }
    }
}

#endif /* ET_INT8_RESAMPLE_H */
