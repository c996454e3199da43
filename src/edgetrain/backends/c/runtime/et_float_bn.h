/* edgetrain C runtime: batch norm in training mode (float32), as torch's train-mode
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
    for (int c = 0; c < C; ++c) {
        double m, v;
        et_bn_batch_moments(X, N, C, HW, c, &m, &v);
        const float unbiased = (float)(v * (count / (count - 1.0)));
        RM[c] = f * (float)m + (1.f - f) * RM[c];
        RV[c] = f * unbiased + (1.f - f) * RV[c];
    }
}

#endif /* ET_FLOAT_BN_H */
