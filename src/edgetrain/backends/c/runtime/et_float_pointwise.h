/* edgetrain C runtime: float kernels of pointwise (see kernels/float32_pointwise.py). Header-only.
 *
 * Deterministic double functions without libm (the Cortex-M firmware links none), the same bits
 * on every IEEE-754 machine that does not contract a*b+c (build with -ffp-contract=off):
 * - et_sin / et_cos: x = n pi/2 + r, the reduction exact to double-double (pi/2 in seven chunks
 *   of 24 bits, n split in two halves so every product n * chunk is exact), then fdlibm's
 *   polynomials on [-pi/4, pi/4] with the reduction's tail. Within 1e-15 relative (a few ulp,
 *   near the zeros too) for |x| < 2^29 pi/2 (~8.4e8), where the subtractions cancel exactly;
 *   up to 2^53 pi/2 (~1.4e16) the accumulated tail's roundings add an absolute error below
 *   1e-20 (tests/backends/c/test_pointwise_math.py); beyond, n is no longer exact: NaN.
 * - et_log1p: 2 atanh(x / (2 + x)) by its series where 1 + x is in [sqrt(1/2), sqrt(2)) (exact
 *   for tiny x, -0.0 kept), else log(1 + x) corrected by the rounding of 1 + x.
 * - et_expm1 (expm1, elu): its Taylor series near 0, else exp(x) - 1.
 */
#ifndef ET_FLOAT_POINTWISE_H
#define ET_FLOAT_POINTWISE_H
#include "et_common.h"
#include "et_float_nn.h" /* et_tanh */

/* 2/pi, and pi/2 as seven chunks of at most 24 significant bits (nearest each remainder; they
 * sum to pi/2 within 2^-180): a product with an integer of at most 29 bits is exact */
#define ET_INV_PIO2 6.36619772367581382433e-01
#define ET_PIO2_C1 1.5707963705062866
#define ET_PIO2_C2 (-4.371138828673793e-08)
#define ET_PIO2_C3 (-1.7151245100058819e-15)
#define ET_PIO2_C4 1.056299898220315e-23
#define ET_PIO2_C5 8.478427566216846e-32
#define ET_PIO2_C6 9.415205271428978e-40
#define ET_PIO2_C7 1.1687495018667348e-47
/* |x| at most pi/4 needs no reduction */
#define ET_PIO4 7.85398163397448278999e-01
/* |x| below 2^-27: sin x = x and cos x = 1 in double (the next terms are below half an ulp) */
#define ET_TRIG_TINY 7.450580596923828125e-09
/* n splits into a multiple of 2^24 and a remainder below it (each at most 29 bits for n < 2^53) */
#define ET_TRIG_SPLIT 16777216.0
/* |x| beyond 2^53 pi/2: n would pass 2^53, no longer exact in a double (and doubles there are
 * 2 or more apart, so no phase is meaningful): sin and cos are NaN there */
#define ET_TRIG_MAX 1.414847550405688e+16
/* |x| below which et_expm1 sums its Taylor series, and the series' terms (0.5^17 / 17! < 1e-19) */
#define ET_EXPM1_SERIES 0.5
#define ET_EXPM1_TERMS 17
/* 1 + x in [sqrt(1/2), sqrt(2)): et_log1p's direct series (|s| <= 0.1716, to s^23 as et_log) */
#define ET_LOG1P_LO (-0.29289321881345247560)
#define ET_LOG1P_HI 0.41421356237309504880
/* |x| below 2^-54: log1p x = x - x^2/2 rounds to x */
#define ET_LOG1P_TINY 5.5511151231257827e-17
/* x above 2^1000 is scaled by 2^-64 first (et_log is for x up to 1.79e308), adding 64 ln 2 */
#define ET_LOG1P_BIG 1.0715086071862673e+301
#define ET_LOG1P_DOWN 5.421010862427522e-20
#define ET_LOG1P_DOWN_LOG 44.3614195558364998

static inline double et_fabs(double x) {
    et_bits64 b;
    b.d = x;
    b.u &= 0x7fffffffffffffffULL;
    return b.d;
}

/* s + e = a - b exactly (Knuth's TwoSum of a and -b) */
static inline void et_two_diff(double a, double b, double *s, double *e) {
    const double d = a - b, bv = d - a, av = d - bv;
    *s = d;
    *e = (a - av) - (b + bv);
}

/* hi + lo = a - n pi/2 in double-double, for 0 <= n <= 2^53: every product of a chunk with a
 * half of n is exact, and so are the differences while they cancel */
static inline void et_sub_n_pio2(double a, int64_t n, double *hi_out, double *lo_out) {
    static const double C[7] = {ET_PIO2_C1, ET_PIO2_C2, ET_PIO2_C3, ET_PIO2_C4, ET_PIO2_C5, ET_PIO2_C6, ET_PIO2_C7};
    const int64_t nl_i = n & (int64_t)(ET_TRIG_SPLIT - 1);
    const double nl = (double)nl_i, nh = (double)(n - nl_i);
    double hi = a, lo = 0.0, s, e;
    for (int k = 0; k < 7; ++k) {
        et_two_diff(hi, nh * C[k], &s, &e);
        hi = s;
        lo += e;
        et_two_diff(hi, nl * C[k], &s, &e);
        hi = s;
        lo += e;
    }
    *hi_out = hi;
    *lo_out = lo;
}

/* x = n pi/2 + (*y0 + *y1), |*y0| <= pi/4 (|x| < ET_TRIG_MAX); returns n mod 4 */
static inline int et_rem_pio2(double x, double *y0, double *y1) {
    const double a = et_fabs(x); /* reduced as |x|: the split of n needs n >= 0 */
    int64_t n = (int64_t)(a * ET_INV_PIO2 + 0.5);
    double hi, lo, r;
    for (int pass = 0; pass < 3; ++pass) { /* the rounded product can miss n by one: step it */
        et_sub_n_pio2(a, n, &hi, &lo);
        r = hi + lo;
        if (r > ET_PIO4) n += 1;
        else if (r < -ET_PIO4 && n > 0) n -= 1;
        else break;
    }
    const double tail = lo - (r - hi);
    *y0 = x < 0 ? -r : r; /* sin(-x) = -sin x: -x = -n pi/2 - r */
    *y1 = x < 0 ? -tail : tail;
    return (int)((x < 0 ? -n : n) & 3);
}

/* fdlibm's __kernel_sin / __kernel_cos: sin and cos of y0 + y1, |y0 + y1| <= ~pi/4 */
static inline double et_sin_kernel(double x, double y) {
    const double S1 = -1.66666666666666324348e-01, S2 = 8.33333333332248946124e-03,
                 S3 = -1.98412698298579493134e-04, S4 = 2.75573137070700676789e-06,
                 S5 = -2.50507602534068634195e-08, S6 = 1.58969099521155010221e-10;
    const double z = x * x, v = z * x, r = S2 + z * (S3 + z * (S4 + z * (S5 + z * S6)));
    return x - ((z * (0.5 * y - v * r) - y) - v * S1);
}

static inline double et_cos_kernel(double x, double y) {
    const double C1 = 4.16666666666666019037e-02, C2 = -1.38888888888741095749e-03,
                 C3 = 2.48015872894767294178e-05, C4 = -2.75573143513906633035e-07,
                 C5 = 2.08757232129817482790e-09, C6 = -1.13596475577881948265e-11;
    const double z = x * x, w2 = z * z;
    const double r = z * (C1 + z * (C2 + z * C3)) + w2 * w2 * (C4 + z * (C5 + z * C6));
    const double hz = 0.5 * z, w = 1.0 - hz;
    return w + (((1.0 - w) - hz) + (z * r - x * y));
}

static inline double et_sin(double x) {
    if (x != x || !(et_fabs(x) < ET_TRIG_MAX)) return 0.0 / 0.0; /* NaN, +-inf, beyond the exact reduction */
    const double a = et_fabs(x);
    if (a < ET_TRIG_TINY) return x; /* keeps -0.0 */
    if (a <= ET_PIO4) return et_sin_kernel(x, 0.0);
    double y0, y1;
    switch (et_rem_pio2(x, &y0, &y1)) {
        case 0: return et_sin_kernel(y0, y1);
        case 1: return et_cos_kernel(y0, y1);
        case 2: return -et_sin_kernel(y0, y1);
        default: return -et_cos_kernel(y0, y1);
    }
}

static inline double et_cos(double x) {
    if (x != x || !(et_fabs(x) < ET_TRIG_MAX)) return 0.0 / 0.0; /* NaN, +-inf, beyond the exact reduction */
    const double a = et_fabs(x);
    if (a < ET_TRIG_TINY) return 1.0;
    if (a <= ET_PIO4) return et_cos_kernel(x, 0.0);
    double y0, y1;
    switch (et_rem_pio2(x, &y0, &y1)) {
        case 0: return et_cos_kernel(y0, y1);
        case 1: return -et_sin_kernel(y0, y1);
        case 2: return -et_cos_kernel(y0, y1);
        default: return et_sin_kernel(y0, y1);
    }
}

static inline double et_log1p(double x) {
    if (x != x) return x;
    if (x < -1.0) return 0.0 / 0.0;
    if (x == -1.0) return -1.0 / 0.0;
    if (et_fabs(x) < ET_LOG1P_TINY) return x; /* (keeps -0.0 and the subnormals x / (2 + x) would lose) */
    if (x > ET_LOG1P_LO && x < ET_LOG1P_HI) { /* log(1 + x) = 2 atanh(s), s = x / (2 + x) */
        const double s = x / (2.0 + x), s2 = s * s;
        double t = 1.0 / 23.0;
        for (int i = 21; i >= 1; i -= 2) t = 1.0 / i + s2 * t;
        return 2.0 * s * t;
    }
    if (x - x != 0.0) return x; /* +inf */
    if (x > ET_LOG1P_BIG) return et_log(x * ET_LOG1P_DOWN) + ET_LOG1P_DOWN_LOG; /* 1 / x is below an ulp */
    const double u = 1.0 + x; /* log(1 + x) = log(u) + (x - (u - 1)) / u to first order */
    return et_log(u) + (x - (u - 1.0)) / u;
}

static inline double et_expm1(double x) {
    if (x != x) return x;
    if (et_fabs(x) < ET_EXPM1_SERIES) { /* x (1 + x/2 (1 + x/3 (1 + ...))) */
        double p = 1.0 + x / ET_EXPM1_TERMS;
        for (int i = ET_EXPM1_TERMS - 1; i >= 2; --i) p = 1.0 + x / i * p;
        return x * p;
    }
    return et_exp(x) - 1.0;
}

/* elu and its derivative (torch's nn.ELU / SELU / CELU) */
static inline double et_elu(double x, double alpha, double scale, double input_scale) {
    return x > 0 ? scale * x : scale * (alpha * et_expm1(x * input_scale));
}

static inline double et_elu_grad(double x, double alpha, double scale, double input_scale) {
    return x > 0 ? scale : alpha * scale * input_scale * et_exp(x * input_scale);
}

/* softplus: x where beta x > threshold, else (max(bx, 0) + log1p(exp(-|bx|))) / beta */
static inline double et_softplus(double x, double beta, double threshold) {
    const double bx = x * beta;
    if (bx > threshold) return x;
    return ((bx > 0 ? bx : 0.0) + et_log1p(et_exp(-et_fabs(bx)))) / beta;
}

static inline double et_softplus_grad(double x, double beta, double threshold) {
    const double bx = x * beta;
    return bx > threshold ? 1.0 : 0.5 * (1.0 + et_tanh(0.5 * bx));
}

/* sign(x): -1, 0 or 1 (NaN stays NaN), abs's derivative as torch's */
static inline double et_sign(double x) { return x > 0 ? 1.0 : (x < 0 ? -1.0 : x); }

/* rounding to integers without libm. Every double of magnitude 2^52 or more is an integer (its own
 * rounding), as are NaN and +-inf; below it the value fits a long long. */
#define ET_INTEGRAL 4503599627370496.0
static inline int et_integral(double x) { return x != x || x >= ET_INTEGRAL || x <= -ET_INTEGRAL; }
/* toward -inf: truncate, one less for a negative non-integer */
static inline double et_floor(double x) {
    if (et_integral(x)) return x;
    const double t = (double)(long long)x;
    return t > x ? t - 1.0 : t;
}
static inline double et_ceil(double x) { return -et_floor(-x); }
static inline double et_trunc(double x) { return et_integral(x) ? x : (double)(long long)x; }
/* to the nearest integer, a half to the even one (torch.round, numpy's round); x - floor(x) is exact */
static inline double et_round_even(double x) {
    if (et_integral(x)) return x;
    const double f = et_floor(x), d = x - f;
    return (d > 0.5 || (d == 0.5 && et_floor(0.5 * f) * 2.0 != f)) ? f + 1.0 : f;
}

#endif
