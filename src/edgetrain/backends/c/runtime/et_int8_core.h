/* edgetrain int8 kernels, the definitions the others share: fixed point (ops/fixed_point.py),
 * the counter hash of ops/qoptim.py, the operands (rows of an int8 tensor, a weight whole or
 * split), a qconv2d layer's geometry and quantization (et_qconv_p) and one output row's store
 * (et_qrow). Included by et_int8.h and by its kernel headers (et_int8_dsp.h, et_int8_gemm.h,
 * et_int8_dw.h, et_int8_pool.h). Header-only. */
#ifndef ET_INT8_CORE_H
#define ET_INT8_CORE_H

#include <stdint.h>
#include <string.h>

#ifndef ET_RESTRICT
#define ET_RESTRICT __restrict__
#endif

/* attributes of the int8 kernels' general paths, which the DSP kernels leave to a few layers or
 * channels (the requantization off the fast path, the addition, the convolution and the input
 * gradient of shapes the fast kernels do not take): none by default; the Cortex-M firmware
 * optimises them for size (runtime/cortexm/Makefile). Without the DSP kernels they are the hot
 * paths: then none. */
#if defined(ET_SMALL_ATTR) && !defined(__ARM_FEATURE_DSP)
#undef ET_SMALL_ATTR
#endif
#ifndef ET_SMALL_ATTR
#define ET_SMALL_ATTR
#endif

/* int32 accumulators held on the stack per output-row segment (1 KB at 256) */
#define ET_ACC_BLOCK 64

/* ---- fixed point (ops/fixed_point.py) --------------------------------------------------
 * 32-bit integer arithmetic with one 32x32->64 multiply (SMULL/SMLAL on a Cortex-M), equal to
 * the reference for every input: gemmlowp's nudged, truncating high multiply
 * trunc((ab + (ab >= 0 ? 2^30 : 1 - 2^30)) / 2^31) is floor((ab + 2^30) / 2^31) for every
 * ab (for ab < 0, trunc(s / 2^31) = floor((s + 2^31 - 1) / 2^31)); the multiplier is >= 0
 * (quantize_multiplier), so the result fits int32. */
static inline int32_t et_mbqm(int32_t x, int32_t mult, int32_t shift) {
    if (shift > 0) { /* saturating x * 2^shift */
        if (x > (INT32_MAX >> shift)) x = INT32_MAX;
        else if (x < (INT32_MIN >> shift)) x = INT32_MIN;
        else x = (int32_t)((uint32_t)x << shift);
    }
    const int32_t hi = (int32_t)(((int64_t)x * mult + ((int64_t)1 << 30)) >> 31);
    if (shift >= 0) return hi;
    const int32_t right = -shift;
    const int32_t mask = (int32_t)((1u << right) - 1u);
    const int32_t thr = (mask >> 1) + (hi < 0);
    return (hi >> right) + ((hi & mask) > thr);
}

/* saturating int32 addition (the reference's int64 sum clipped to int32) */
static inline int32_t et_addsat32(int32_t a, int32_t b) {
    int32_t s;
    if (__builtin_add_overflow(a, b, &s)) return a < 0 ? INT32_MIN : INT32_MAX;
    return s;
}

static inline int32_t et_clampi(int32_t v, int32_t lo, int32_t hi) {
    return v < lo ? lo : (v > hi ? hi : v);
}

/* floor of a float32 without libm (exact for every float) */
static inline float et_floorf_(float x) {
    if (!(x > -8388608.0f && x < 8388608.0f)) return x; /* already an integer (or nan/inf) */
    int32_t i = (int32_t)x;
    if ((float)i > x) i -= 1;
    return (float)i;
}

/* round half to even (np.round) of a float32 without libm */
static inline float et_rintf_(float x) {
    if (!(x > -4194304.0f && x < 4194304.0f)) return x; /* |x| >= 2**22: integral enough */
    volatile float t = x + 12582912.0f;                   /* 1.5 * 2**23 */
    return t - 12582912.0f;
}

/* ---- the counter hash of ops/qoptim.py ----------------------------------------------- */
static inline uint32_t et_hash_key(uint32_t seed, uint32_t param_id, int32_t step) {
    return seed + (uint32_t)step * 0x85EBCA77u + param_id * 0xC2B2AE3Du;
}

/* the hash's 32 bits (murmur3's finaliser of index * golden + key) */
static inline uint32_t et_hash32(uint32_t key, uint32_t index) {
    uint32_t h = index * 0x9E3779B1u + key;
    h ^= h >> 16;
    h *= 0x85EBCA6Bu;
    h ^= h >> 13;
    h *= 0xC2B2AE35u;
    h ^= h >> 16;
    return h;
}

static inline float et_uniform(uint32_t key, uint32_t index) {
    return (float)(et_hash32(key, index) >> 8) * 0x1p-24f;
}

/* ---- operands ------------------------------------------------------------------------- */
/* Rows of an int8 NCHW tensor, whole or a ring buffer of `cap` rows per channel:
 * row k of channel c of image n is at p + n*nstride + c*cstride + (k % cap) * width. */
typedef struct { int8_t *p; int32_t nstride, cstride, cap; } et_rows8;

/* k % cap for a row k >= 0: no divide for a whole tensor's rows (k < cap), a ring's otherwise */
static inline int32_t et_ring(int32_t k, int32_t cap) { return k < cap ? k : k % cap; }

/* whether rows a..b (a <= b) lie one after another in a ring of cap rows (no wrap among them) */
static inline int et_ring_run(int32_t a, int32_t b, int32_t cap) { return et_ring(b, cap) - et_ring(a, cap) == b - a; }

/* An int8 OIHW weight, whole (map == 0) or split in two arrays along `dim` (0 or 1):
 * map[k] >= 0: channel k is row map[k] of `sel`; else row -map[k]-1 of `rest`. */
typedef struct {
    const int8_t *w; const int8_t *sel; const int8_t *rest; const int16_t *map;
    int32_t dim, nsel, nrest;
} et_w8;

/* the KH*KW taps of w[o, c] (c within the group) for a weight of CG channels per group */
static inline const int8_t *et_w8_taps(const et_w8 *w, int32_t o, int32_t c, int32_t cg, int32_t khkw) {
    if (!w->map) return w->w + ((int32_t)o * cg + c) * khkw;
    if (w->dim == 1) {
        int32_t m = w->map[c];
        return m >= 0 ? w->sel + (o * w->nsel + m) * khkw : w->rest + (o * w->nrest + (-m - 1)) * khkw;
    }
    int32_t m = w->map[o];
    return m >= 0 ? w->sel + (m * cg + c) * khkw : w->rest + ((-m - 1) * cg + c) * khkw;
}

/* ---- qconv2d: geometry and quantization of one layer ----------------------------------- */
/* The geometry and zero points as int16 (kernels/int8_params.py checks the range): 56 bytes of
 * flash a layer instead of 96; the kernels widen them as they read them. */
typedef struct {
    int16_t n, c, h, w;        /* input */
    int16_t o, cg, kh, kw;     /* weight (cg = c / groups) */
    int16_t ho, wo;            /* output */
    int16_t sh, sw, ph, pw, dh, dw;
    int16_t groups;
    int16_t x_zero, y_zero, qmin, qmax;
    int16_t shift0;              /* packed requantization (shift 0): the shift of top bits 0 (et_rq_shift_at) */
    const int32_t *mult;         /* per output channel (int8 output); packed where shift is 0 (et_rq_mult) */
    const int8_t *shift;         /* per output channel: -31..30; 0: packed into mult */
    const float *out_scale;      /* per output channel (float output: x_scale * w_scale[o]) */
} et_qconv_p;

/* A channel's requantization multiplier and shift. A layer whose multipliers all lie in [2^30, 2^31)
 * has them packed, a word a channel, where that takes fewer bytes (kernels/int8_params.py's
 * requant_decls): the multiplier's low 30 bits (its bit 30 is set, bit 31 clear) and, in the top two
 * bits, its shift less shift0 (0, 1 or 2), or 3: the shift is then in an escape word before the
 * first channel's, (channel << 8) | (shift & 0xFF). Its shift array is then 0. The same numbers in
 * 4 bytes a channel and 4 an escape instead of 5 a channel. (mult, shift, shift0: et_qconv_p's or
 * et_fscale's fields.) */
static inline int32_t et_rq_mult_at(const int32_t *mult, const int8_t *shift, int32_t o) {
    return shift ? mult[o] : (int32_t)(((uint32_t)mult[o] & 0x3FFFFFFFu) | 0x40000000u);
}
/* an escaped channel's shift: the compiler wrote an escape word for every channel marked 3 */
__attribute__((noinline, cold, unused)) static int32_t et_rq_escape(const int32_t *mult, int32_t o) {
    const int32_t *e = mult - 1;
    while ((*e >> 8) != o) --e;
    return (int32_t)((*e & 0xFF) ^ 0x80) - 0x80;
}
static inline int32_t et_rq_shift_at(const int32_t *mult, const int8_t *shift, int32_t shift0, int32_t o) {
    if (shift) return shift[o];
    const int32_t d = (int32_t)((uint32_t)mult[o] >> 30);
    return d == 3 ? et_rq_escape(mult, o) : shift0 + d;
}
#define et_rq_mult(P, o) et_rq_mult_at((P)->mult, (P)->shift, (o))
#define et_rq_shift(P, o) et_rq_shift_at((P)->mult, (P)->shift, (P)->shift0, (o))

/* outputs [lo, hi) of `out` whose input index (output * stride + off) lies in [0, in) */
static inline void et_tap_range(int32_t off, int32_t stride, int32_t in, int32_t out, int32_t *lo, int32_t *hi) {
    int32_t a = off >= 0 ? 0 : (-off + stride - 1) / stride;
    int32_t b = (in - 1 - off) >= 0 ? (in - 1 - off) / stride + 1 : 0;
    if (b > out) b = out;
    *lo = a; *hi = b < a ? a : b;
}

/* output columns [lo, hi) whose tap j reads an in-range input column */
static inline void et_col_range(const et_qconv_p *P, int32_t j, int32_t *lo, int32_t *hi) {
    et_tap_range(j * P->dw - P->pw, P->sw, P->w, P->wo, lo, hi);
}

/* One output row (n, o, ho) of a qconv2d: where it goes and how it is quantized, looked up
 * once per row; et_qrow_put stores the accumulator of column q plus the bias, saturated, to
 * y (requantized int8) or yf (float). */
typedef struct {
    int8_t *y;
    float *yf;
    int32_t bias, mult, shift, y_zero, qmin, qmax;
    int32_t right, mask, half; /* shift <= 0: et_mbqm's rounding right shift, set up once */
    float scale;
} et_qrow;

static inline et_qrow et_qconv_row(const et_qconv_p *P, et_rows8 y, float *yf, int32_t yo_off, int32_t n, int32_t o,
                                   int32_t ho, const int32_t *bias) {
    const int32_t at = n * y.nstride + (o - yo_off) * y.cstride + (ho % y.cap) * P->wo;
    et_qrow r = {0, 0, bias[o], 0, 0, P->y_zero, P->qmin, P->qmax, 0, 0, 0, 0.0f};
    if (yf) {
        r.yf = yf + at;
        r.scale = P->out_scale[o];
    } else {
        r.y = y.p + at;
        r.mult = et_rq_mult(P, o);
        r.shift = et_rq_shift(P, o);
        r.right = r.shift > 0 ? 0 : -r.shift;
        r.mask = (int32_t)((1u << r.right) - 1u);
        r.half = r.mask >> 1;
    }
    return r;
}

/* et_mbqm(acc, mult, shift) with the row's shift set up (equal for every input) */
static inline int32_t et_qrow_mbqm(const et_qrow *r, int32_t acc) {
    if (r->shift > 0) return et_mbqm(acc, r->mult, r->shift);
    const int32_t hi = (int32_t)(((int64_t)acc * r->mult + ((int64_t)1 << 30)) >> 31);
    return (hi >> r->right) + ((hi & r->mask) > r->half + (hi < 0));
}

static inline void et_qrow_put(const et_qrow *r, int32_t q, int32_t acc) {
    acc = et_addsat32(acc, r->bias);
#ifndef ET_INTEGER_ONLY /* model.h defines it for a step without float values: no float instruction linked */
    if (r->yf) r->yf[q] = (float)acc * r->scale;
    else
#endif
        r->y[q] = (int8_t)et_clampi(et_qrow_mbqm(r, acc) + r->y_zero, r->qmin, r->qmax);
}

/* et_qrow_put of the n accumulators acc[0..n) at columns q0.. of the row. On a host-class CPU (x86,
 * aarch64) an int8 row whose shift is a right shift (every layer of the paper's models) takes a loop
 * without branches, which the compiler vectorizes (et_qrow_put's loop is not: its saturating add,
 * rounding and clamp branch): the same integers, the bias added in 64 bits and clamped to int32 as
 * et_addsat32 saturates. Other targets, and float or left-shifted rows, keep et_qrow_put's loop. */
static inline __attribute__((always_inline)) void et_qrow_put_n(const et_qrow *r, int32_t q0, const int32_t *acc,
                                                          int32_t n) {
#if defined(__x86_64__) || defined(__i386__) || defined(__aarch64__)
    if (r->y && r->shift <= 0) {
        int8_t *y = r->y + q0;
        const int64_t bias = r->bias, mult = r->mult;
        const int32_t right = r->right, mask = r->mask, half = r->half, yz = r->y_zero, lo = r->qmin,
                      hi = r->qmax;
        for (int32_t t = 0; t < n; t++) {
            int64_t s = (int64_t)acc[t] + bias;
            s = s > INT32_MAX ? INT32_MAX : (s < INT32_MIN ? INT32_MIN : s);
            const int32_t h = (int32_t)((s * mult + ((int64_t)1 << 30)) >> 31);
            const int32_t v = (h >> right) + ((h & mask) > half + (h < 0)) + yz;
            y[t] = (int8_t)(v < lo ? lo : (v > hi ? hi : v));
        }
        return;
    }
#endif
    for (int32_t t = 0; t < n; t++) et_qrow_put(r, q0 + t, acc[t]);
}

#endif /* ET_INT8_CORE_H */
