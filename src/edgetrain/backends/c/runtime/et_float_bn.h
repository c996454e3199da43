/* edgetrain C runtime: batch norm (float32). On running statistics (et_bn_fwd, fused with its
 * residual add and ReLU / clamp in et_bn_act_fwd, and its gradients and fused backward);
 * in training mode, as torch's train-mode
 * BatchNorm: each channel normalised with the batch's mean and biased variance; its input
 * gradient through those statistics; the running statistics moved towards the batch's mean
 * and unbiased variance (in place, as the optimizer's update writes a weight).
 *
 * Layout: the channel is dim 1 of X, N the product of the dims before it (the batch) and HW
 * the product of the dims after it. The moments of a channel are computed in two passes and
 * accumulated in double, so the float32 result does not depend on N * HW's summation order
 * more than rounding once. Header-only. */
#ifndef ET_FLOAT_BN_H
#define ET_FLOAT_BN_H
#include "et_common.h"

/* mean and biased variance of channel c of X (two passes, double) */
ET_INLINE void et_bn_batch_moments(const float *ET_RESTRICT X, int N, int C, int HW, int c,
                                   double *mean, double *var) {
    const double count = (double)N * (double)HW;
    double s = 0.0, q = 0.0;
    for (int n = 0; n < N; ++n) {
        const float *x = X + ((size_t)n * C + c) * HW;
        for (int i = 0; i < HW; ++i) s += x[i];
    }
    const double m = s / count;
    for (int n = 0; n < N; ++n) {
        const float *x = X + ((size_t)n * C + c) * HW;
        for (int i = 0; i < HW; ++i) { const double d = (double)x[i] - m; q += d * d; }
    }
    *mean = m;
    *var = q / count;
}

/* Y = (X - mean) / sqrt(var + eps) [* w + b], batch statistics (w, b may both be 0) */
ET_INLINE void et_bn_train_fwd(const float *ET_RESTRICT X, const float *ET_RESTRICT w, const float *ET_RESTRICT b,
                               float *ET_RESTRICT Y, int N, int C, int HW, double eps) {
    ET_PARALLEL_FOR((double)N * C * HW)
    for (int c = 0; c < C; ++c) {
        double m, v;
        et_bn_batch_moments(X, N, C, HW, c, &m, &v);
        const double rstd = 1.0 / ET_SQRT(v + eps);
        const double a = w ? (double)w[c] * rstd : rstd, sh = b ? (double)b[c] : 0.0;
        for (int n = 0; n < N; ++n) {
            const float *x = X + ((size_t)n * C + c) * HW;
            float *y = Y + ((size_t)n * C + c) * HW;
            for (int i = 0; i < HW; ++i) y[i] = (float)(((double)x[i] - m) * a + sh);
        }
    }
}

/* GX = rstd * (gh - mean(gh) - xhat * mean(gh * xhat)), gh = G [* w]: the input gradient
 * through the batch statistics (w may be 0) */
ET_INLINE void et_bn_train_grad_input(const float *ET_RESTRICT G, const float *ET_RESTRICT X,
                                      const float *ET_RESTRICT w, float *ET_RESTRICT GX,
                                      int N, int C, int HW, double eps) {
    const double count = (double)N * (double)HW;
    ET_PARALLEL_FOR((double)N * C * HW)
    for (int c = 0; c < C; ++c) {
        double m, v;
        et_bn_batch_moments(X, N, C, HW, c, &m, &v);
        const double rstd = 1.0 / ET_SQRT(v + eps), wc = w ? (double)w[c] : 1.0;
        double sg = 0.0, sgx = 0.0;
        for (int n = 0; n < N; ++n) {
            const float *g = G + ((size_t)n * C + c) * HW, *x = X + ((size_t)n * C + c) * HW;
            for (int i = 0; i < HW; ++i) {
                sg += g[i];
                sgx += (double)g[i] * (((double)x[i] - m) * rstd);
            }
        }
        const double mg = wc * sg / count, mgx = wc * sgx / count;
        for (int n = 0; n < N; ++n) {
            const float *g = G + ((size_t)n * C + c) * HW, *x = X + ((size_t)n * C + c) * HW;
            float *gx = GX + ((size_t)n * C + c) * HW;
            for (int i = 0; i < HW; ++i) {
                const double xhat = ((double)x[i] - m) * rstd;
                gx[i] = (float)(rstd * (wc * (double)g[i] - mg - xhat * mgx));
            }
        }
    }
}

/* GW[c] = sum(G * xhat) over channel c, batch statistics */
ET_INLINE void et_bn_train_grad_weight(const float *ET_RESTRICT G, const float *ET_RESTRICT X,
                                       float *ET_RESTRICT GW, int N, int C, int HW, double eps) {
    ET_PARALLEL_FOR((double)N * C * HW)
    for (int c = 0; c < C; ++c) {
        double m, v, s = 0.0;
        et_bn_batch_moments(X, N, C, HW, c, &m, &v);
        const double rstd = 1.0 / ET_SQRT(v + eps);
        for (int n = 0; n < N; ++n) {
            const float *g = G + ((size_t)n * C + c) * HW, *x = X + ((size_t)n * C + c) * HW;
            for (int i = 0; i < HW; ++i) s += (double)g[i] * (((double)x[i] - m) * rstd);
        }
        GW[c] = (float)s;
    }
}

/* running statistics, in place: RM = f * mean + (1 - f) * RM, RV = f * unbiased var + (1 - f) * RV
 * with f = momentum, or 1 / (*tracked + 1) when momentum < 0 (torch's momentum=None: a
 * cumulative average); *tracked (num_batches_tracked, may be 0 when not kept) counts the batch */
ET_INLINE void et_bn_update_stats(float *ET_RESTRICT RM, float *ET_RESTRICT RV, const float *ET_RESTRICT X,
                                  int64_t *tracked, int N, int C, int HW, double momentum) {
    const double count = (double)N * (double)HW;
    if (tracked) *tracked += 1;
    const float f = (float)(momentum < 0.0 ? 1.0 / (double)*tracked : momentum);
    ET_PARALLEL_FOR((double)N * C * HW)
    for (int c = 0; c < C; ++c) {
        double m, v;
        et_bn_batch_moments(X, N, C, HW, c, &m, &v);
        const float unbiased = (float)(v * (count / (count - 1.0)));
        RM[c] = f * (float)m + (1.f - f) * RM[c];
        RV[c] = f * unbiased + (1.f - f) * RV[c];
    }
}

/* ---- batch norm on running statistics (channel dim 1; HW: product of the dims after it) */
ET_INLINE void et_bn_fwd(const float *ET_RESTRICT X, const float *ET_RESTRICT mean, const float *ET_RESTRICT var,
                         const float *ET_RESTRICT w, const float *ET_RESTRICT b, float *ET_RESTRICT Y,
                         int N, int C, int HW, float eps) {
    ET_PARALLEL_FOR2((double)N * C * HW)
    for (int n = 0; n < N; ++n)
        for (int c = 0; c < C; ++c) {
            const float inv = 1.f / ET_SQRTF(var[c] + eps), m = mean[c];
            const float a = w ? w[c] * inv : inv, sh = b ? b[c] : 0.f;
            const float *x = X + ((size_t)n * C + c) * HW;
            float *y = Y + ((size_t)n * C + c) * HW;
            for (int i = 0; i < HW; ++i) y[i] = (x[i] - m) * a + sh;
        }
}

/* act(batch norm [+ R]) in one pass (ops/bnact.py): each element as et_bn_fwd computes it, plus
 * R's element when R is not 0, then ReLU (act 0: v > 0 ? v : 0, as the relu kernel) or clamp
 * to [lo, hi] (act 1, as the clamp kernel; an absent bound is an infinity). Y may be X (the op's
 * in-place effect: each element is read before it is written), so X, R and Y are not restrict */
ET_INLINE void et_bn_act_fwd(const float *X, const float *ET_RESTRICT mean, const float *ET_RESTRICT var,
                             const float *ET_RESTRICT w, const float *ET_RESTRICT b, const float *R, float *Y, int N, int C, int HW, float eps, int act, float lo, float hi) {
    ET_PARALLEL_FOR2((double)N * C * HW)
    for (int n = 0; n < N; ++n)
        for (int c = 0; c < C; ++c) {
            const float inv = 1.f / ET_SQRTF(var[c] + eps), m = mean[c];
            const float a = w ? w[c] * inv : inv, sh = b ? b[c] : 0.f;
            const size_t off = ((size_t)n * C + c) * HW;
            const float *x = X + off;
            float *y = Y + off;
            if (R) {
                const float *r = R + off;
                if (act == 0) {
                    ET_SIMD
                    for (int i = 0; i < HW; ++i) { const float v = (x[i] - m) * a + sh + r[i]; y[i] = v > 0.f ? v : 0.f; }
                } else {
                    ET_SIMD
                    for (int i = 0; i < HW; ++i) {
                        float v = (x[i] - m) * a + sh + r[i];
                        v = v < lo ? lo : v; y[i] = v > hi ? hi : v;
                    }
                }
            } else if (act == 0) {
                ET_SIMD
                for (int i = 0; i < HW; ++i) { const float v = (x[i] - m) * a + sh; y[i] = v > 0.f ? v : 0.f; }
            } else {
                ET_SIMD
                for (int i = 0; i < HW; ++i) {
                    float v = (x[i] - m) * a + sh;
                    v = v < lo ? lo : v; y[i] = v > hi ? hi : v;
                }
            }
        }
}

ET_INLINE void et_bn_grad_input(const float *ET_RESTRICT G, const float *ET_RESTRICT var,
                                const float *ET_RESTRICT w, float *ET_RESTRICT GX, int N, int C, int HW, float eps) {
    ET_PARALLEL_FOR2((double)N * C * HW)
    for (int n = 0; n < N; ++n)
        for (int c = 0; c < C; ++c) {
            float a = 1.f / ET_SQRTF(var[c] + eps);
            if (w) a *= w[c];
            const float *g = G + ((size_t)n * C + c) * HW;
            float *gx = GX + ((size_t)n * C + c) * HW;
            for (int i = 0; i < HW; ++i) gx[i] = g[i] * a;
        }
}

ET_INLINE void et_bn_grad_weight(const float *ET_RESTRICT G, const float *ET_RESTRICT X,
                                 const float *ET_RESTRICT mean, const float *ET_RESTRICT var,
                                 float *ET_RESTRICT GW, int N, int C, int HW, float eps) {
    ET_PARALLEL_FOR((double)N * C * HW)
    for (int c = 0; c < C; ++c) {
        const float m = mean[c];
        float s = 0.f;
        for (int n = 0; n < N; ++n) {
            const float *g = G + ((size_t)n * C + c) * HW, *x = X + ((size_t)n * C + c) * HW;
            ET_SIMD_SUM(s)
            for (int i = 0; i < HW; ++i) s += g[i] * (x[i] - m);
        }
        GW[c] = s / ET_SQRTF(var[c] + eps);
    }
}

/* one image's pass over one channel of et_bn_backward_fused, summing into *sw and *sb: MASK and
 * WANT_W are literals at every call, so that each combination is its own branch-free loop */
ET_INLINE void et_bn_backward_pass(const float *g, const float *ET_RESTRICT xc, const float *ET_RESTRICT x, float *gx,
                                   int HW, int MASK, int WANT_W, float lo, float hi, float m, float a, float *sw,
                                   float *sb) {
    float s_w = *sw, s_b = *sb;
    ET_SIMD_SUM2(s_w, s_b)
    for (int i = 0; i < HW; ++i) {
        float gv = g[i];
        if (MASK == 1) gv = (xc[i] > lo && xc[i] < hi) ? gv : 0.f;
        if (MASK == 2) gv = xc[i] > 0.f ? gv : 0.f;
        if (WANT_W) s_w += gv * (x[i] - m);
        s_b += gv;
        gx[i] = gv * a;
    }
    *sw = s_w;
    *sb = s_b;
}

/* The backward of batch norm (+ ReLU/ReLU6) in one pass per channel: g = G masked by the
 * activation's derivative (mask 1: lo < XC < hi on the saved activation input XC; mask 2:
 * XC > 0 on the saved ReLU output; 0: none), GW = sum g * xhat, GB = sum g, GX = g * w / std.
 * GW, GB may be 0 (not wanted). GX may be G itself (read before written, same index). */
ET_INLINE void et_bn_backward_fused(const float *G, const float *ET_RESTRICT XC, int mask, float lo, float hi,
                                    const float *ET_RESTRICT X, const float *ET_RESTRICT mean,
                                    const float *ET_RESTRICT var, const float *ET_RESTRICT w,
                                    float *ET_RESTRICT GW, float *ET_RESTRICT GB, float *GX,
                                    int N, int C, int HW, float eps) {
    ET_PARALLEL_FOR((double)N * C * HW)
    for (int c = 0; c < C; ++c) {
        const float inv = 1.f / ET_SQRTF(var[c] + eps), m = mean ? mean[c] : 0.f;
        const float a = w ? w[c] * inv : inv;
        float sw = 0.f, sb = 0.f;
        for (int n = 0; n < N; ++n) {
            const size_t base = ((size_t)n * C + c) * HW;
            const float *g = G + base, *xc = XC ? XC + base : 0, *x = X ? X + base : 0;
            float *gx = GX + base;
#define ET_BN_PASS(MASK) do {                                                                          \
        if (GW) et_bn_backward_pass(g, xc, x, gx, HW, MASK, 1, lo, hi, m, a, &sw, &sb);                  \
        else et_bn_backward_pass(g, xc, x, gx, HW, MASK, 0, lo, hi, m, a, &sw, &sb);                     \
    } while (0)
            if (mask == 1) ET_BN_PASS(1);
            else if (mask == 2) ET_BN_PASS(2);
            else ET_BN_PASS(0);
#undef ET_BN_PASS
        }
        if (GW) GW[c] = sw * inv;
        if (GB) GB[c] = sb;
    }
}

#endif /* ET_FLOAT_BN_H */
