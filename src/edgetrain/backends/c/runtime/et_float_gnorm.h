/* edgetrain C runtime: float kernels of group normalisation (kernels/float32_groupnorm.py):
 * the forward op, its input gradient and its weight gradient. x is (N, C, S) row-major
 * (S: the product of the spatial dims); the C channels form G groups of C / G consecutive
 * channels, so each (sample, group) block is one contiguous run of (C / G) S values, normalised
 * by its mean and biased variance (two passes, accumulated in double in a fixed order). The
 * kernels are written once and instantiated for float (_f) and double (_d): this header includes
 * itself once per element type with ET_GN_T / ET_GN defined. Header-only. */
#ifndef ET_FLOAT_GNORM_H
#define ET_FLOAT_GNORM_H
#include "et_common.h"

#define ET_GN_T float
#define ET_GN(name) name##_f
#include "et_float_gnorm.h"
#undef ET_GN_T
#undef ET_GN
#define ET_GN_T double
#define ET_GN(name) name##_d
#include "et_float_gnorm.h"
#undef ET_GN_T
#undef ET_GN

#elif defined(ET_GN_T) /* ---- the kernels, for element type ET_GN_T ---------------------------- */

/* mean and 1 / sqrt(biased variance + eps) of one block of n values */
static inline void ET_GN(et_gn_moments)(const ET_GN_T *x, long n, double eps, double *mu, double *rstd) {
    double s = 0.0, v = 0.0;
    for (long i = 0; i < n; ++i) s += x[i];
    const double m = s / (double)n;
    for (long i = 0; i < n; ++i) v += ((double)x[i] - m) * ((double)x[i] - m);
    *mu = m;
    *rstd = 1.0 / ET_SQRT(v / (double)n + eps);
}

/* Y = (X - mean) rstd [* W[c]] [+ B[c]] per (sample, group) block; W, B may be 0 */
static inline void
ET_GN(et_group_norm)(const ET_GN_T *X, const ET_GN_T *W, const ET_GN_T *B, ET_GN_T *Y, int N, int C, int G, long S,
                     double eps) {
    const int cg = C / G;
    for (int n = 0; n < N; ++n)
        for (int g = 0; g < G; ++g) {
            const size_t base = ((size_t)n * C + (size_t)g * cg) * S;
            double mu, rstd;
            ET_GN(et_gn_moments)(X + base, (long)cg * S, eps, &mu, &rstd);
            for (int k = 0; k < cg; ++k) {
                const int c = g * cg + k;
                const double w = W ? (double)W[c] : 1.0, b = B ? (double)B[c] : 0.0;
                const ET_GN_T *x = X + base + (size_t)k * S;
                ET_GN_T *y = Y + base + (size_t)k * S;
                for (long i = 0; i < S; ++i) y[i] = (ET_GN_T)(((double)x[i] - mu) * rstd * w + b);
            }
        }
}

/* GX = rstd (gh - mean gh - xhat mean(gh xhat)) over each block, gh = GY [* W[c]] */
static inline void
ET_GN(et_group_norm_grad_input)(const ET_GN_T *GY, const ET_GN_T *X, const ET_GN_T *W, ET_GN_T *GX, int N, int C,
                                int G, long S, double eps) {
    const int cg = C / G;
    const double count = (double)cg * (double)S;
    for (int n = 0; n < N; ++n)
        for (int g = 0; g < G; ++g) {
            const size_t base = ((size_t)n * C + (size_t)g * cg) * S;
            double mu, rstd, sg = 0.0, sgx = 0.0;
            ET_GN(et_gn_moments)(X + base, (long)cg * S, eps, &mu, &rstd);
            for (int k = 0; k < cg; ++k) {
                const double w = W ? (double)W[g * cg + k] : 1.0;
                const ET_GN_T *x = X + base + (size_t)k * S, *gy = GY + base + (size_t)k * S;
                for (long i = 0; i < S; ++i) {
                    const double gh = (double)gy[i] * w;
                    sg += gh;
                    sgx += gh * (((double)x[i] - mu) * rstd);
                }
            }
            sg /= count;
            sgx /= count;
            for (int k = 0; k < cg; ++k) {
                const double w = W ? (double)W[g * cg + k] : 1.0;
                const ET_GN_T *x = X + base + (size_t)k * S, *gy = GY + base + (size_t)k * S;
                ET_GN_T *gx = GX + base + (size_t)k * S;
                for (long i = 0; i < S; ++i) {
                    const double xhat = ((double)x[i] - mu) * rstd;
                    gx[i] = (ET_GN_T)(rstd * ((double)gy[i] * w - sg - xhat * sgx));
                }
            }
        }
}

/* GW[c] = sum over the samples and positions of GY xhat, in order n, then position */
static inline void
ET_GN(et_group_norm_grad_weight)(const ET_GN_T *GY, const ET_GN_T *X, ET_GN_T *GW, int N, int C, int G, long S,
                                 double eps) {
    const int cg = C / G;
    for (int c = 0; c < C; ++c) GW[c] = 0;
    for (int n = 0; n < N; ++n)
        for (int g = 0; g < G; ++g) {
            const size_t base = ((size_t)n * C + (size_t)g * cg) * S;
            double mu, rstd;
            ET_GN(et_gn_moments)(X + base, (long)cg * S, eps, &mu, &rstd);
            for (int k = 0; k < cg; ++k) {
                const ET_GN_T *x = X + base + (size_t)k * S, *gy = GY + base + (size_t)k * S;
                double s = 0.0;
                for (long i = 0; i < S; ++i) s += (double)gy[i] * (((double)x[i] - mu) * rstd);
                GW[g * cg + k] = (ET_GN_T)(GW[g * cg + k] + s);
            }
        }
}

#endif /* ET_FLOAT_GNORM_H */
