/* edgetrain C runtime: float kernels of 3-D pooling, adaptive 2-D pooling and upsampling, and
 * their gradients (see kernels/float32_resample.py, ops/pool_nd.py, ops/resample.py).
 *
 * Written once and instantiated for float (suffix _f) and double (suffix _d): this header
 * includes itself once per element type with ET_RS_T / ET_RS defined, as et_float_nn.h does.
 * Layout: row-major; pools over NC planes (3-D: D x H x W; adaptive: H x W). A 3-D pool's
 * geometry is an int array ET_P3_* (the kernel emits it as a static table). Averages sum in
 * double. Gradients go output by output (row-major), each output's terms in tap order; a max
 * pool's gradient goes to the first maximal tap of its window. Upsampling reads the source
 * indices and weights of each output row and column from tables the emitter computes with
 * torch's arithmetic (ops/resample.py): no libm. Header-only. */
#ifndef ET_FLOAT_RESAMPLE_H
#define ET_FLOAT_RESAMPLE_H
#include "et_common.h"

/* the entries of a 3-D pool's geometry array */
enum { ET_P3_D, ET_P3_H, ET_P3_W, ET_P3_DO, ET_P3_HO, ET_P3_WO, ET_P3_KD, ET_P3_KH, ET_P3_KW, ET_P3_SD, ET_P3_SH,
       ET_P3_SW, ET_P3_PD, ET_P3_PH, ET_P3_PW, ET_P3_DD, ET_P3_DH, ET_P3_DW, ET_P3_LEN };

/* the input index of tap t of output o along one dim (may be outside [0, n)) */
ET_INLINE int et_p3_in(int o, int t, int s, int p, int d) { return o * s - p + t * d; }

/* the start and end (exclusive) of torch's adaptive window i of `size` cut into `out` */
ET_INLINE void et_adaptive_window(int i, int size, int out, int *start, int *end) {
    *start = (i * size) / out;
    *end = ((i + 1) * size + out - 1) / out;
}

#define ET_RS_T float
#define ET_RS(name) name##_f
#include "et_float_resample.h"
#undef ET_RS_T
#undef ET_RS
#define ET_RS_T double
#define ET_RS(name) name##_d
#include "et_float_resample.h"
#undef ET_RS_T
#undef ET_RS

#elif defined(ET_RS_T) /* ---- the array kernels, for element type ET_RS_T --------------------- */

/* 3-D max pooling: padding counts as -inf; NaN propagates; taps in (kd, kh, kw) order */
static inline void ET_RS(et_max_pool3d)(const ET_RS_T *X, ET_RS_T *Y, int NC, const int *P) {
    const int D = P[ET_P3_D], H = P[ET_P3_H], W = P[ET_P3_W], DO = P[ET_P3_DO], HO = P[ET_P3_HO], WO = P[ET_P3_WO];
    for (int c = 0; c < NC; ++c) {
        const ET_RS_T *x = X + (size_t)c * D * H * W;
        ET_RS_T *y = Y + (size_t)c * DO * HO * WO;
        for (int od = 0; od < DO; ++od)
            for (int oh = 0; oh < HO; ++oh)
                for (int ow = 0; ow < WO; ++ow) {
                    ET_RS_T m = (ET_RS_T)(-1.0 / 0.0);
                    for (int kd = 0; kd < P[ET_P3_KD]; ++kd) {
                        const int id = et_p3_in(od, kd, P[ET_P3_SD], P[ET_P3_PD], P[ET_P3_DD]);
                        if (id < 0 || id >= D) continue;
                        for (int kh = 0; kh < P[ET_P3_KH]; ++kh) {
                            const int ih = et_p3_in(oh, kh, P[ET_P3_SH], P[ET_P3_PH], P[ET_P3_DH]);
                            if (ih < 0 || ih >= H) continue;
                            for (int kw = 0; kw < P[ET_P3_KW]; ++kw) {
                                const int iw = et_p3_in(ow, kw, P[ET_P3_SW], P[ET_P3_PW], P[ET_P3_DW]);
                                if (iw < 0 || iw >= W) continue;
                                const ET_RS_T v = x[((size_t)id * H + ih) * W + iw];
                                if (v > m || v != v) m = v;
                            }
                        }
                    }
                    y[((size_t)od * HO + oh) * WO + ow] = m;
                }
    }
}

/* GX of 3-D max pooling: each output's gradient to the first tap holding its window's maximum
 * (a padding tap, -inf, that wins drops the gradient) */
static inline void ET_RS(et_max_pool3d_grad)(const ET_RS_T *G, const ET_RS_T *X, ET_RS_T *GX, int NC, const int *P) {
    const int D = P[ET_P3_D], H = P[ET_P3_H], W = P[ET_P3_W], DO = P[ET_P3_DO], HO = P[ET_P3_HO], WO = P[ET_P3_WO];
    const int KD = P[ET_P3_KD], KH = P[ET_P3_KH], KW = P[ET_P3_KW];
    const ET_RS_T ninf = (ET_RS_T)(-1.0 / 0.0);
    for (size_t i = 0; i < (size_t)NC * D * H * W; ++i) GX[i] = 0;
    for (int c = 0; c < NC; ++c) {
        const ET_RS_T *x = X + (size_t)c * D * H * W, *g = G + (size_t)c * DO * HO * WO;
        ET_RS_T *gx = GX + (size_t)c * D * H * W;
        for (int od = 0; od < DO; ++od)
            for (int oh = 0; oh < HO; ++oh)
                for (int ow = 0; ow < WO; ++ow) {
                    ET_RS_T m = ninf;
                    long hit = -1;
                    for (int pass = 0; pass < 2 && hit < 0; ++pass) /* pass 0: the max; pass 1: where */
                        for (int k = 0; k < KD * KH * KW && (pass == 0 || hit < 0); ++k) {
                            const int id = et_p3_in(od, k / (KH * KW), P[ET_P3_SD], P[ET_P3_PD], P[ET_P3_DD]);
                            const int ih = et_p3_in(oh, (k / KW) % KH, P[ET_P3_SH], P[ET_P3_PH], P[ET_P3_DH]);
                            const int iw = et_p3_in(ow, k % KW, P[ET_P3_SW], P[ET_P3_PW], P[ET_P3_DW]);
                            const int inside = id >= 0 && id < D && ih >= 0 && ih < H && iw >= 0 && iw < W;
                            const long at = ((long)id * H + ih) * W + iw;
                            const ET_RS_T v = inside ? x[at] : ninf;
                            if (pass == 0 && (v > m || v != v)) m = v;
                            if (pass == 1 && v == m) hit = inside ? at : -2;
                        }
                    if (hit >= 0) gx[hit] += g[((size_t)od * HO + oh) * WO + ow];
                }
    }
}

/* the divisor of 3-D average window (od, oh, ow): `divisor` when > 0, else its count of real voxels */
static inline double ET_RS(et_pool3d_divisor)(int od, int oh, int ow, const int *P, double divisor) {
    if (divisor > 0) return divisor;
    const int o[3] = {od, oh, ow};
    double count = 1;
    for (int a = 0; a < 3; ++a) {
        int n = 0;
        for (int t = 0; t < P[ET_P3_KD + a]; ++t) {
            const int i = et_p3_in(o[a], t, P[ET_P3_SD + a], P[ET_P3_PD + a], P[ET_P3_DD + a]);
            n += i >= 0 && i < P[ET_P3_D + a];
        }
        count *= n;
    }
    return count;
}

/* 3-D average pooling (window sums in double, taps in (kd, kh, kw) order) / et_pool3d_divisor;
 * GX (grad != 0): each output's gradient / its divisor added to every real voxel of its window */
static inline void ET_RS(et_avg_pool3d)(const ET_RS_T *X, ET_RS_T *Y, int NC, const int *P, double divisor, int grad) {
    const int D = P[ET_P3_D], H = P[ET_P3_H], W = P[ET_P3_W], DO = P[ET_P3_DO], HO = P[ET_P3_HO], WO = P[ET_P3_WO];
    if (grad)
        for (size_t i = 0; i < (size_t)NC * D * H * W; ++i) Y[i] = 0;
    for (int c = 0; c < NC; ++c) {
        const size_t in0 = (size_t)c * D * H * W, out0 = (size_t)c * DO * HO * WO;
        for (int od = 0; od < DO; ++od)
            for (int oh = 0; oh < HO; ++oh)
                for (int ow = 0; ow < WO; ++ow) {
                    const size_t o = out0 + ((size_t)od * HO + oh) * WO + ow;
                    const double dv = ET_RS(et_pool3d_divisor)(od, oh, ow, P, divisor);
                    const ET_RS_T gs = grad ? (ET_RS_T)(X[o] / dv) : 0;
                    double s = 0;
                    for (int kd = 0; kd < P[ET_P3_KD]; ++kd) {
                        const int id = et_p3_in(od, kd, P[ET_P3_SD], P[ET_P3_PD], P[ET_P3_DD]);
                        if (id < 0 || id >= D) continue;
                        for (int kh = 0; kh < P[ET_P3_KH]; ++kh) {
                            const int ih = et_p3_in(oh, kh, P[ET_P3_SH], P[ET_P3_PH], P[ET_P3_DH]);
                            if (ih < 0 || ih >= H) continue;
                            for (int kw = 0; kw < P[ET_P3_KW]; ++kw) {
                                const int iw = et_p3_in(ow, kw, P[ET_P3_SW], P[ET_P3_PW], P[ET_P3_DW]);
                                if (iw < 0 || iw >= W) continue;
                                const size_t i = in0 + ((size_t)id * H + ih) * W + iw;
                                if (grad) Y[i] += gs; else s += X[i];
                            }
                        }
                    }
                    if (!grad) Y[o] = (ET_RS_T)(s / dv);
                }
    }
}

/* adaptive average pooling of NC planes H x W into OH x OW (torch's windows; sums in double,
 * (h, w) order); GX (grad != 0, X the gradient of the OH x OW output): each output's gradient
 * / its window's size added to the window */
static inline void ET_RS(et_adaptive_avg_pool2d)(const ET_RS_T *X, ET_RS_T *Y, long NC, int H, int W, int OH, int OW,
                                                  int grad) {
    if (grad)
        for (size_t i = 0; i < (size_t)NC * H * W; ++i) Y[i] = 0;
    for (long c = 0; c < NC; ++c)
        for (int oh = 0; oh < OH; ++oh) {
            int h0, h1;
            et_adaptive_window(oh, H, OH, &h0, &h1);
            for (int ow = 0; ow < OW; ++ow) {
                int w0, w1;
                et_adaptive_window(ow, W, OW, &w0, &w1);
                const size_t o = ((size_t)c * OH + oh) * OW + ow;
                const double n = (double)(h1 - h0) * (w1 - w0);
                const ET_RS_T gs = grad ? (ET_RS_T)(X[o] / n) : 0;
                double s = 0;
                for (int h = h0; h < h1; ++h)
                    for (int w = w0; w < w1; ++w) {
                        const size_t i = ((size_t)c * H + h) * W + w;
                        if (grad) Y[i] += gs; else s += X[i];
                    }
                if (!grad) Y[o] = (ET_RS_T)(s / n);
            }
        }
}

/* adaptive max pooling (torch's windows, first maximum in (h, w) order, NaN propagates);
 * with G (not null): GX, each output's gradient added (in output order) to its window's first maximum */
static inline void ET_RS(et_adaptive_max_pool2d)(const ET_RS_T *X, ET_RS_T *Y, const ET_RS_T *G, long NC, int H,
                                                  int W, int OH, int OW) {
    if (G)
        for (size_t i = 0; i < (size_t)NC * H * W; ++i) Y[i] = 0;
    for (long c = 0; c < NC; ++c) {
        const ET_RS_T *x = X + (size_t)c * H * W;
        for (int oh = 0; oh < OH; ++oh) {
            int h0, h1;
            et_adaptive_window(oh, H, OH, &h0, &h1);
            for (int ow = 0; ow < OW; ++ow) {
                int w0, w1;
                et_adaptive_window(ow, W, OW, &w0, &w1);
                int at = h0 * W + w0;
                for (int h = h0; h < h1; ++h)
                    for (int w = w0; w < w1; ++w) {
                        const ET_RS_T v = x[h * W + w];
                        if (v > x[at] || (v != v && x[at] == x[at])) at = h * W + w;
                    }
                const size_t o = ((size_t)c * OH + oh) * OW + ow;
                if (G) Y[(size_t)c * H * W + at] += G[o]; else Y[o] = x[at];
            }
        }
    }
}

/* upsampling of NC planes H x W to HO x WO: output (i, j) reads rows RI0[i], RI1[i] with
 * weights RL0[i], RL1[i] and columns CI0[j], CI1[j] with CL0[j], CL1[j]:
 * y = (x[RI0, CI0] CL0 + x[RI0, CI1] CL1) RL0 + (x[RI1, CI0] CL0 + x[RI1, CI1] CL1) RL1,
 * in ET_RS_T; nearest != 0: y = x[RI0, CI0] (a copy) */
static inline void ET_RS(et_upsample)(const ET_RS_T *X, ET_RS_T *Y, long NC, int H, int W, int HO, int WO,
                                      const int *RI0, const int *RI1, const ET_RS_T *RL0, const ET_RS_T *RL1,
                                      const int *CI0, const int *CI1, const ET_RS_T *CL0, const ET_RS_T *CL1,
                                      int nearest) {
    for (long c = 0; c < NC; ++c) {
        const ET_RS_T *x = X + (size_t)c * H * W;
        ET_RS_T *y = Y + (size_t)c * HO * WO;
        for (int i = 0; i < HO; ++i) {
            const ET_RS_T *r0 = x + (size_t)RI0[i] * W, *r1 = x + (size_t)RI1[i] * W;
            for (int j = 0; j < WO; ++j) {
                if (nearest) {
                    y[(size_t)i * WO + j] = r0[CI0[j]];
                    continue;
                }
                const ET_RS_T t0 = r0[CI0[j]] * CL0[j] + r0[CI1[j]] * CL1[j];
                const ET_RS_T t1 = r1[CI0[j]] * CL0[j] + r1[CI1[j]] * CL1[j];
                y[(size_t)i * WO + j] = t0 * RL0[i] + t1 * RL1[i];
            }
        }
    }
}

/* GX of upsampling: outputs in row-major order, each adding its gradient times (row weight
 * times column weight) to its four sources in (RI0 CI0, RI0 CI1, RI1 CI0, RI1 CI1) order;
 * nearest != 0: its gradient to x[RI0, CI0] */
static inline void ET_RS(et_upsample_grad)(const ET_RS_T *G, ET_RS_T *GX, long NC, int H, int W, int HO, int WO,
                                           const int *RI0, const int *RI1, const ET_RS_T *RL0, const ET_RS_T *RL1,
                                           const int *CI0, const int *CI1, const ET_RS_T *CL0, const ET_RS_T *CL1,
                                           int nearest) {
    for (size_t i = 0; i < (size_t)NC * H * W; ++i) GX[i] = 0;
    for (long c = 0; c < NC; ++c) {
        const ET_RS_T *g = G + (size_t)c * HO * WO;
        ET_RS_T *gx = GX + (size_t)c * H * W;
        for (int i = 0; i < HO; ++i)
            for (int j = 0; j < WO; ++j) {
                const ET_RS_T v = g[(size_t)i * WO + j];
                if (nearest) {
                    gx[(size_t)RI0[i] * W + CI0[j]] += v;
                    continue;
                }
                gx[(size_t)RI0[i] * W + CI0[j]] += v * (RL0[i] * CL0[j]);
                gx[(size_t)RI0[i] * W + CI1[j]] += v * (RL0[i] * CL1[j]);
                gx[(size_t)RI1[i] * W + CI0[j]] += v * (RL1[i] * CL0[j]);
                gx[(size_t)RI1[i] * W + CI1[j]] += v * (RL1[i] * CL1[j]);
            }
    }
}

#endif /* ET_FLOAT_RESAMPLE_H */
