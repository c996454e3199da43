/* edgetrain C runtime: float kernels of the neural-network ops that et_float.h lacks:
 * activations (tanh, sigmoid, GELU, pow, erf as deterministic double functions), softmax and
 * log-softmax, layer norm, 2-D max / average pooling, embedding lookups, and their gradients.
 *
 * The scalar functions work in double without libm (as et_exp / et_log of et_common.h), so a
 * host build and a Cortex-M build compute the same values. The array kernels are written once
 * and instantiated for float (suffix _f) and double (suffix _d): this header includes itself
 * once per element type with ET_NN_T / ET_NN defined. Reductions (softmax sums, layer-norm
 * moments) accumulate in double. Layout: row-major, NCHW for pooling. Header-only. */
#ifndef ET_FLOAT_NN_H
#define ET_FLOAT_NN_H
#include "et_common.h"

/* |x| below which et_tanh uses its continued fraction (no cancellation in e^2x - 1) */
#define ET_TANH_SMALL 1.0
/* |x| above which tanh(x) is +-1 in double */
#define ET_TANH_ONE 22.0
/* terms of the continued fraction of tanh for |x| < ET_TANH_SMALL (error < 1e-17) */
#define ET_TANH_TERMS 14
/* |x| below which et_erf sums its series; above, erfc's continued fraction */
#define ET_ERF_SERIES 2.0
/* |x| above which erf(x) is +-1 in double (erfc(6) < 2.2e-17) */
#define ET_ERF_ONE 6.0
/* terms of the series (at most) and of the continued fraction of et_erf */
#define ET_ERF_MAX_TERMS 120
#define ET_ERFC_TERMS 80
/* sqrt(2 / pi) and the cubic coefficient of GELU's tanh approximation; 1 / sqrt(2 pi); 1 / sqrt(2) */
#define ET_GELU_C 0.79788456080286535588
#define ET_GELU_K 0.044715
#define ET_INV_SQRT_2PI 0.39894228040143267794
#define ET_INV_SQRT2 0.70710678118654752440
#define ET_INV_SQRT_PI 0.56418958354775628695
/* integer exponents of et_pow up to this magnitude are done by repeated squaring */
#define ET_POW_INT_MAX 1073741824.0

static inline double et_tanh(double x) {
    if (x != x) return x;
    const double a = x < 0 ? -x : x;
    if (a > ET_TANH_ONE) return x < 0 ? -1.0 : 1.0;
    if (a < ET_TANH_SMALL) { /* Lambert: tanh x = x / (1 + x^2 / (3 + x^2 / (5 + ...))) */
        const double x2 = x * x;
        double k = 2 * ET_TANH_TERMS + 1;
        for (int i = ET_TANH_TERMS - 1; i >= 0; --i) k = (2 * i + 1) + x2 / k;
        return x / k;
    }
    const double t = 1.0 - 2.0 / (et_exp(2.0 * a) + 1.0);
    return x < 0 ? -t : t;
}

/* the logistic function as 0.5 (1 + tanh(x / 2)): no overflow for any x */
static inline double et_sigmoid(double x) { return 0.5 * (1.0 + et_tanh(0.5 * x)); }

static inline double et_erf(double x) {
    if (x != x) return x;
    const double a = x < 0 ? -x : x;
    double r;
    if (a >= ET_ERF_ONE) {
        r = 1.0;
    } else if (a < ET_ERF_SERIES) { /* erf a = 2/sqrt(pi) e^-a^2 sum_n (2a^2)^n a / (1*3*...*(2n+1)): positive terms */
        const double q = 2.0 * a * a;
        double term = a, s = a;
        for (int n = 1; n < ET_ERF_MAX_TERMS && term > 1e-17 * s; ++n) {
            term *= q / (2 * n + 1);
            s += term;
        }
        r = 2.0 * ET_INV_SQRT_PI * et_exp(-a * a) * s;
    } else { /* erfc a = e^-a^2 / sqrt(pi) / (a + (1/2) / (a + 1 / (a + (3/2) / (a + ...)))) */
        double k = a;
        for (int n = ET_ERFC_TERMS; n >= 1; --n) k = a + 0.5 * n / k;
        r = 1.0 - et_exp(-a * a) * ET_INV_SQRT_PI / k;
    }
    return x < 0 ? -r : r;
}

/* x^p as numpy's power: integer p by repeated squaring (any sign of x), else e^(p log x) (NaN for x < 0) */
static inline double et_pow(double x, double p) {
    const double ap = p < 0 ? -p : p;
    if (ap <= ET_POW_INT_MAX && ap == (double)(long)ap) {
        long n = (long)ap;
        double r = 1.0, b = x;
        while (n) {
            if (n & 1) r *= b;
            b *= b;
            n >>= 1;
        }
        return p < 0 ? 1.0 / r : r;
    }
    if (p == 0.5) return ET_SQRT(x);
    if (x != x || x < 0) return 0.0 / 0.0;
    if (x == 0) return p > 0 ? 0.0 : 1.0 / 0.0;
    return et_exp(p * et_log(x));
}

/* GELU and its derivative; tanh_approx: 0 exact (erf), 1 the tanh approximation */
static inline double et_gelu(double x, int tanh_approx) {
    if (tanh_approx) return 0.5 * x * (1.0 + et_tanh(ET_GELU_C * (x + ET_GELU_K * x * x * x)));
    return 0.5 * x * (1.0 + et_erf(x * ET_INV_SQRT2));
}

static inline double et_gelu_grad(double x, int tanh_approx) {
    if (tanh_approx) {
        const double t = et_tanh(ET_GELU_C * (x + ET_GELU_K * x * x * x));
        return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * ET_GELU_C * (1.0 + 3.0 * ET_GELU_K * x * x);
    }
    return 0.5 * (1.0 + et_erf(x * ET_INV_SQRT2)) + x * et_exp(-0.5 * x * x) * ET_INV_SQRT_2PI;
}

/* an index operand: int64 (idx64 != 0) or int32 */
ET_INLINE int64_t et_index_at(const void *idx, int idx64, long i) {
    return idx64 ? ((const int64_t *)idx)[i] : (int64_t)((const int32_t *)idx)[i];
}

#define ET_NN_T float
#define ET_NN(name) name##_f
#include "et_float_nn.h"
#undef ET_NN_T
#undef ET_NN
#define ET_NN_T double
#define ET_NN(name) name##_d
#include "et_float_nn.h"
#undef ET_NN_T
#undef ET_NN

#elif defined(ET_NN_T) /* ---- the array kernels, for element type ET_NN_T ----------------------- */

/* softmax (logsm 0) or log-softmax (logsm 1) of X along a dim of size D, viewed as
 * [outer][D][inner]; max-subtracted, the sum of exponentials in double */
static inline void
ET_NN(et_softmax)(const ET_NN_T *X, ET_NN_T *Y, int outer, int D, int inner, int logsm) {
    for (int o = 0; o < outer; ++o)
        for (int t = 0; t < inner; ++t) {
            const ET_NN_T *x = X + (size_t)o * D * inner + t;
            ET_NN_T *y = Y + (size_t)o * D * inner + t;
            double m = x[0];
            for (int d = 1; d < D; ++d)
                if (x[(size_t)d * inner] > m || x[(size_t)d * inner] != x[(size_t)d * inner]) m = x[(size_t)d * inner];
            double s = 0.0;
            for (int d = 0; d < D; ++d) {
                const double e = et_exp((double)x[(size_t)d * inner] - m);
                s += e;
                if (!logsm) y[(size_t)d * inner] = (ET_NN_T)e; /* y is not x: no in-place softmax */
            }
            if (logsm) {
                const double ls = et_log(s);
                for (int d = 0; d < D; ++d) y[(size_t)d * inner] = (ET_NN_T)(((double)x[(size_t)d * inner] - m) - ls);
            } else {
                for (int d = 0; d < D; ++d) y[(size_t)d * inner] = (ET_NN_T)(y[(size_t)d * inner] / s);
            }
        }
}

/* the input gradient of softmax (logsm 0: GX = Y (G - sum G Y)) or log-softmax (logsm 1:
 * GX = G - exp(Y) sum G), from the saved output Y */
static inline void
ET_NN(et_softmax_grad)(const ET_NN_T *G, const ET_NN_T *Y, ET_NN_T *GX, int outer, int D, int inner, int logsm) {
    for (int o = 0; o < outer; ++o)
        for (int t = 0; t < inner; ++t) {
            const size_t base = (size_t)o * D * inner + t;
            const ET_NN_T *g = G + base, *y = Y + base;
            ET_NN_T *gx = GX + base;
            double s = 0.0;
            for (int d = 0; d < D; ++d) s += logsm ? (double)g[(size_t)d * inner]
                                                   : (double)g[(size_t)d * inner] * y[(size_t)d * inner];
            for (int d = 0; d < D; ++d) {
                const size_t i = (size_t)d * inner;
                gx[i] = logsm ? (ET_NN_T)(g[i] - et_exp((double)y[i]) * s) : (ET_NN_T)(y[i] * (g[i] - s));
            }
        }
}

/* mean and 1 / sqrt(variance + eps) of one row of n (two passes, double) */
ET_INLINE void ET_NN(et_row_moments)(const ET_NN_T *x, int n, double eps, double *mu, double *rstd) {
    double s = 0.0;
    for (int i = 0; i < n; ++i) s += x[i];
    const double m = s / n;
    double v = 0.0;
    for (int i = 0; i < n; ++i) v += ((double)x[i] - m) * ((double)x[i] - m);
    *mu = m;
    *rstd = 1.0 / ET_SQRT(v / n + eps);
}

/* layer norm of `rows` rows of n: Y = (X - mean) / sqrt(var + eps) [* W] [+ B] (W, B may be 0) */
static inline void
ET_NN(et_layer_norm)(const ET_NN_T *X, const ET_NN_T *W, const ET_NN_T *B, ET_NN_T *Y, int rows, int n, double eps) {
    for (int r = 0; r < rows; ++r) {
        const ET_NN_T *x = X + (size_t)r * n;
        ET_NN_T *y = Y + (size_t)r * n;
        double mu, rstd;
        ET_NN(et_row_moments)(x, n, eps, &mu, &rstd);
        for (int i = 0; i < n; ++i) {
            double v = ((double)x[i] - mu) * rstd;
            if (W) v *= W[i];
            if (B) v += B[i];
            y[i] = (ET_NN_T)v;
        }
    }
}

/* GX of layer norm: rstd (gh - mean gh - xhat mean(gh xhat)), gh = G [* W] */
static inline void
ET_NN(et_layer_norm_grad_input)(const ET_NN_T *G, const ET_NN_T *X, const ET_NN_T *W, ET_NN_T *GX, int rows, int n,
                                double eps) {
    for (int r = 0; r < rows; ++r) {
        const ET_NN_T *x = X + (size_t)r * n, *g = G + (size_t)r * n;
        ET_NN_T *gx = GX + (size_t)r * n;
        double mu, rstd, sg = 0.0, sgx = 0.0;
        ET_NN(et_row_moments)(x, n, eps, &mu, &rstd);
        for (int i = 0; i < n; ++i) {
            const double gh = W ? (double)g[i] * W[i] : (double)g[i];
            sg += gh;
            sgx += gh * (((double)x[i] - mu) * rstd);
        }
        sg /= n;
        sgx /= n;
        for (int i = 0; i < n; ++i) {
            const double gh = W ? (double)g[i] * W[i] : (double)g[i];
            gx[i] = (ET_NN_T)(rstd * (gh - sg - ((double)x[i] - mu) * rstd * sgx));
        }
    }
}

/* GW of layer norm: sum over the rows of G xhat */
static inline void
ET_NN(et_layer_norm_grad_weight)(const ET_NN_T *G, const ET_NN_T *X, ET_NN_T *GW, int rows, int n, double eps) {
    for (int i = 0; i < n; ++i) GW[i] = 0;
    for (int r = 0; r < rows; ++r) {
        const ET_NN_T *x = X + (size_t)r * n, *g = G + (size_t)r * n;
        double mu, rstd;
        ET_NN(et_row_moments)(x, n, eps, &mu, &rstd);
        for (int i = 0; i < n; ++i) GW[i] = (ET_NN_T)(GW[i] + (double)g[i] * (((double)x[i] - mu) * rstd));
    }
}

/* ---- 2-D pooling over NC planes of H x Wd, output HO x WO; window KH x KW, stride, padding,
 * dilation. Input pixel of output (oh, ow) at tap (ki, kj): (oh SH - PH + ki DH, ow SW - PW + kj DW). */

/* max over the window; padding counts as -inf; NaN propagates */
static inline void
ET_NN(et_max_pool2d)(const ET_NN_T *X, ET_NN_T *Y, int NC, int H, int Wd, int HO, int WO, int KH, int KW, int SH,
                     int SW, int PH, int PW, int DH, int DW) {
    ET_PARALLEL_FOR((double)NC * HO * WO * KH * KW) /* a plane per iteration */
    for (int c = 0; c < NC; ++c) {
        const ET_NN_T *x = X + (size_t)c * H * Wd;
        ET_NN_T *y = Y + (size_t)c * HO * WO;
        for (int oh = 0; oh < HO; ++oh)
            for (int ow = 0; ow < WO; ++ow) {
                ET_NN_T m = (ET_NN_T)(-1.0 / 0.0);
                for (int ki = 0; ki < KH; ++ki) {
                    const int ih = oh * SH - PH + ki * DH;
                    if (ih < 0 || ih >= H) continue;
                    for (int kj = 0; kj < KW; ++kj) {
                        const int iw = ow * SW - PW + kj * DW;
                        if (iw < 0 || iw >= Wd) continue;
                        const ET_NN_T v = x[ih * Wd + iw];
                        if (v > m || v != v) m = v;
                    }
                }
                y[oh * WO + ow] = m;
            }
    }
}

/* GX of max pooling: each output's gradient to the first tap (ki, then kj) holding the
 * window's maximum, padding taps included (as -inf: a gradient routed there is dropped) */
static inline void
ET_NN(et_max_pool2d_grad)(const ET_NN_T *G, const ET_NN_T *X, ET_NN_T *GX, int NC, int H, int Wd, int HO, int WO,
                          int KH, int KW, int SH, int SW, int PH, int PW, int DH, int DW) {
    const ET_NN_T ninf = (ET_NN_T)(-1.0 / 0.0);
    for (size_t i = 0; i < (size_t)NC * H * Wd; ++i) GX[i] = 0;
    ET_PARALLEL_FOR((double)NC * HO * WO * KH * KW) /* a plane per iteration */
    for (int c = 0; c < NC; ++c) {
        const ET_NN_T *x = X + (size_t)c * H * Wd, *g = G + (size_t)c * HO * WO;
        ET_NN_T *gx = GX + (size_t)c * H * Wd;
        for (int oh = 0; oh < HO; ++oh)
            for (int ow = 0; ow < WO; ++ow) {
                ET_NN_T m = ninf;
                for (int ki = 0; ki < KH; ++ki)
                    for (int kj = 0; kj < KW; ++kj) {
                        const int ih = oh * SH - PH + ki * DH, iw = ow * SW - PW + kj * DW;
                        if (ih < 0 || ih >= H || iw < 0 || iw >= Wd) continue;
                        const ET_NN_T v = x[ih * Wd + iw];
                        if (v > m || v != v) m = v;
                    }
                int hit = -1;
                for (int k = 0; k < KH * KW && hit < 0; ++k) {
                    const int ih = oh * SH - PH + (k / KW) * DH, iw = ow * SW - PW + (k % KW) * DW;
                    const int inside = ih >= 0 && ih < H && iw >= 0 && iw < Wd;
                    const ET_NN_T v = inside ? x[ih * Wd + iw] : ninf;
                    if (v == m) hit = inside ? ih * Wd + iw : -2;
                }
                if (hit >= 0) gx[hit] += g[oh * WO + ow];
            }
    }
}

/* the divisor of the window at (oh, ow): `divisor` when > 0, else the count of its taps on real pixels */
ET_INLINE double ET_NN(et_pool_divisor)(int oh, int ow, int H, int Wd, int KH, int KW, int SH, int SW, int PH,
                                        int PW, int DH, int DW, double divisor) {
    if (divisor > 0) return divisor;
    int rows = 0, cols = 0;
    for (int ki = 0; ki < KH; ++ki) {
        const int ih = oh * SH - PH + ki * DH;
        rows += ih >= 0 && ih < H;
    }
    for (int kj = 0; kj < KW; ++kj) {
        const int iw = ow * SW - PW + kj * DW;
        cols += iw >= 0 && iw < Wd;
    }
    return (double)rows * cols;
}

/* average over the window (taps summed in order ki, kj) divided by et_pool_divisor */
static inline void
ET_NN(et_avg_pool2d)(const ET_NN_T *X, ET_NN_T *Y, int NC, int H, int Wd, int HO, int WO, int KH, int KW, int SH,
                     int SW, int PH, int PW, int DH, int DW, double divisor) {
    ET_PARALLEL_FOR((double)NC * HO * WO * KH * KW) /* a plane per iteration */
    for (int c = 0; c < NC; ++c) {
        const ET_NN_T *x = X + (size_t)c * H * Wd;
        ET_NN_T *y = Y + (size_t)c * HO * WO;
        for (int oh = 0; oh < HO; ++oh)
            for (int ow = 0; ow < WO; ++ow) {
                ET_NN_T s = 0;
                for (int ki = 0; ki < KH; ++ki) {
                    const int ih = oh * SH - PH + ki * DH;
                    if (ih < 0 || ih >= H) continue;
                    for (int kj = 0; kj < KW; ++kj) {
                        const int iw = ow * SW - PW + kj * DW;
                        if (iw >= 0 && iw < Wd) s += x[ih * Wd + iw];
                    }
                }
                const double dv = ET_NN(et_pool_divisor)(oh, ow, H, Wd, KH, KW, SH, SW, PH, PW, DH, DW, divisor);
                y[oh * WO + ow] = (ET_NN_T)(s / dv);
            }
    }
}

/* GX of average pooling: each output's gradient / its divisor added to every real pixel of its window */
static inline void
ET_NN(et_avg_pool2d_grad)(const ET_NN_T *G, ET_NN_T *GX, int NC, int H, int Wd, int HO, int WO, int KH, int KW, int SH,
                          int SW, int PH, int PW, int DH, int DW, double divisor) {
    for (size_t i = 0; i < (size_t)NC * H * Wd; ++i) GX[i] = 0;
    ET_PARALLEL_FOR((double)NC * HO * WO * KH * KW) /* a plane per iteration */
    for (int c = 0; c < NC; ++c) {
        const ET_NN_T *g = G + (size_t)c * HO * WO;
        ET_NN_T *gx = GX + (size_t)c * H * Wd;
        for (int oh = 0; oh < HO; ++oh)
            for (int ow = 0; ow < WO; ++ow) {
                const double dv = ET_NN(et_pool_divisor)(oh, ow, H, Wd, KH, KW, SH, SW, PH, PW, DH, DW, divisor);
                const ET_NN_T gs = (ET_NN_T)(g[oh * WO + ow] / dv);
                for (int ki = 0; ki < KH; ++ki) {
                    const int ih = oh * SH - PH + ki * DH;
                    if (ih < 0 || ih >= H) continue;
                    for (int kj = 0; kj < KW; ++kj) {
                        const int iw = ow * SW - PW + kj * DW;
                        if (iw >= 0 && iw < Wd) gx[ih * Wd + iw] += gs;
                    }
                }
            }
    }
}

/* ---- embedding: rows of W (num x width) picked by `count` indices (int64 when idx64, else
 * int32); an index out of [0, num) is reported through ET_ERROR_HOOK and gives a zero row */
static inline void
ET_NN(et_embedding)(const ET_NN_T *W, const void *idx, int idx64, ET_NN_T *Y, long count, long num, int width) {
    for (long i = 0; i < count; ++i) {
        const int64_t k = et_index_at(idx, idx64, i);
        ET_NN_T *y = Y + (size_t)i * width;
        if (k < 0 || k >= num) {
            ET_ERROR_HOOK("embedding: index out of range");
            for (int j = 0; j < width; ++j) y[j] = 0;
            continue;
        }
        memcpy(y, W + (size_t)k * width, (size_t)width * sizeof(ET_NN_T));
    }
}

/* GW of embedding: the gradient rows summed into the rows they were read from (in index
 * order); row padding_idx (when >= 0) zero */
static inline void
ET_NN(et_embedding_grad)(const ET_NN_T *G, const void *idx, int idx64, ET_NN_T *GW, long count, long num, int width,
                         long padding_idx) {
    for (size_t i = 0; i < (size_t)num * width; ++i) GW[i] = 0;
    for (long i = 0; i < count; ++i) {
        const int64_t k = et_index_at(idx, idx64, i);
        if (k < 0 || k >= num) {
            ET_ERROR_HOOK("embedding_grad: index out of range");
            continue;
        }
        const ET_NN_T *g = G + (size_t)i * width;
        ET_NN_T *gw = GW + (size_t)k * width;
        for (int j = 0; j < width; ++j) gw[j] += g[j];
    }
    if (padding_idx >= 0 && padding_idx < num)
        for (int j = 0; j < width; ++j) GW[(size_t)padding_idx * width + j] = 0;
}

#endif /* ET_FLOAT_NN_H */
