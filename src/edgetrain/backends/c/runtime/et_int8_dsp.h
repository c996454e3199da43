/* edgetrain int8 qconv2d forward on the Cortex-M DSP extension (M4, M7: included by et_int8.h
 * where __ARM_FEATURE_DSP is defined; the host build runs et_int8.h's portable loop, and both
 * give the reference's integers bit for bit).
 *
 * Two int8 operands per 32-bit register as int16 pairs: __sxtb16 takes bytes 0 and 2 of a
 * word, of the word rotated by 8 bytes 1 and 3; one __smlad adds two products. A word of 4
 * weights w[k..k+3] gives the pairs (w[k], w[k+2]) and (w[k+1], w[k+3]), so the inputs are
 * packed in that order too. The parts:
 * - pointwise (1x1) and dense KxK convs: a GEMM over columns. The K = cg*kh*kw inputs of two
 *   pixels are packed once into one column of interleaved bytes (a 1x1's channels read across
 *   the NCHW planes, a KxK's window gathered: im2col) and every pair of output channels runs
 *   over it in a small out-of-line loop (et_gemm_pairs): 2 output channels x 2 pixels of
 *   accumulators in registers, 8 __smlad per 4 inputs. This header: the words, the columns,
 *   the dot products and the requantization; et_int8_gemm.h: the rows of a 1x1 over the planes
 *   (et_gemm_row_wide, et_gemm_row_planes, et_gemm_pairs_planes) and the driver,
 *   et_qconv_gemm_rows;
 * - depthwise KxK (K <= 8): et_int8_dw.h;
 * - requantization in 32 bits (et_rq): when the sum provably stays within 2^29, the shift
 *   is a right shift and the multiplier is above 2^30, (acc * mult + 2^30) >> 31 plus the
 *   rounding and zero-point term is one SMMLAR of 2 * acc, and the rounding right shift's
 *   correction for a negative value, the shift and the int8 saturation are a subtract, a
 *   shift and an SSAT (equal to ops/fixed_point.py there: et_level); otherwise the exact
 *   general path of et_int8.h.
 * Accumulators start at bias - x_zero * sum(w) (the input zero point taken out once per
 * output channel); all sums are exact integers, so the order does not matter. */
#ifndef ET_INT8_DSP_H
#define ET_INT8_DSP_H
#include <stdint.h>
#include <string.h>
#include "et_int8_core.h" /* et_qconv_p, et_w8, et_mbqm, et_qrow_put's arithmetic */
#if defined(__ARM_FEATURE_DSP)
#include <arm_acle.h>

#define ET_DSP_NOINLINE __attribute__((noinline))

/* ---- words ----------------------------------------------------------------------------- */
static inline uint32_t et_ld16u(const int8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

static inline int32_t et_ld32s(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* __sxtb16 of v rotated by 8 in one instruction (gcc does not fold the rotation itself) */
static inline int32_t et_sxtb16_ror8(uint32_t v) {
    int32_t r;
    __asm__("sxtb16 %0, %1, ror #8" : "=r"(r) : "r"(v));
    return r;
}

/* (bottom half of lo, top half of hi): PKHBT, which gcc does not form from the masks and the or */
static inline int32_t et_pkhbt(int32_t lo, int32_t hi) {
    int32_t r;
    __asm__("pkhbt %0, %1, %2" : "=r"(r) : "r"(lo), "r"(hi));
    return r;
}

/* the bottom halves of lo and hi in one word, (lo[15:0], hi[15:0]); et_pkh_high the top ones */
static inline int32_t et_pkh_low(uint32_t lo, uint32_t hi) {
    int32_t r;
    __asm__("pkhbt %0, %1, %2, lsl #16" : "=r"(r) : "r"(lo), "r"(hi));
    return r;
}

static inline int32_t et_pkh_high(uint32_t lo, uint32_t hi) {
    int32_t r;
    __asm__("pkhtb %0, %1, %2, asr #16" : "=r"(r) : "r"(hi), "r"(lo));
    return r;
}

/* two int16 halves in one word */
static inline int32_t et_pack16(int32_t lo, int32_t hi) { return (int32_t)(((uint32_t)lo & 0xFFFFu) | ((uint32_t)hi << 16)); }

/* sum of n int8 weights: usada8 sums four bytes w + 128 */
static inline int32_t et_wsum(const int8_t *w, int32_t n) {
    uint32_t s = 0;
    int32_t k = 0;
    for (; k + 4 <= n; k += 4) s = __usada8((uint32_t)et_ld32s(w + k) ^ 0x80808080u, 0u, s);
    int32_t t = (int32_t)s - 128 * k;
    for (; k < n; k++) t += w[k];
    return t;
}

/* ---- requantization of one output channel ------------------------------------------------- */
typedef struct {
    int32_t init;  /* the sum's start: bias - x_zero * sum(w) (fast), -x_zero * sum(w) (general) */
    int32_t mult, add, right, fast;
} et_rq;

#define ET_RQ_BOUND (1 << 29) /* |sum| below this: 2 * sum and the shifted sum fit int32 */
#define ET_RQ_MAX_RIGHT 21    /* add = 2^(right-1) + y_zero * 2^right stays below 2^29 */

/* The int8 level of a sum on the fast path: et_mbqm(acc, mult, -right) + y_zero saturated to
 * int8. hi = (2*acc*mult + 2^31) >> 32 is et_mbqm's high multiply, and SMMLAR adds `add`
 * (2^(right-1) + y_zero * 2^right) in the same instruction; the rounding right shift takes
 * one off a negative hi. hi < 0 exactly when acc < 0, because mult > 2^30 (acc <= -1 gives
 * 2*acc*mult + 2^31 < 0; acc >= 0 gives hi >= 0), and 2*acc has acc's sign (|acc| < 2^29). */
static inline int32_t et_level2(int32_t a2, int32_t mult, int32_t add, int32_t right) { /* a2 = 2 * acc */
    int32_t v;
    __asm__("smmlar %0, %1, %2, %3" : "=r"(v) : "r"(a2), "r"(mult), "r"(add)); /* add + hi */
    return __ssat((v - (int32_t)((uint32_t)a2 >> 31)) >> right, 8);
}

static inline int32_t et_level(int32_t acc, int32_t mult, int32_t add, int32_t right) {
    return et_level2(acc * 2, mult, add, right);
}

static inline int32_t et_rq_fast(const et_rq *r, int32_t acc) { return et_level(acc, r->mult, r->add, r->right); }

/* the general path's level of a sum (et_rq_slow's integer arithmetic) */
static inline ET_SMALL_ATTR int32_t et_rq_level(const et_qconv_p *P, int32_t b, int32_t o, int32_t acc) {
    return et_clampi(et_mbqm(et_addsat32(acc, b), et_rq_mult(P, o), et_rq_shift(P, o)) + P->y_zero, P->qmin, P->qmax);
}

/* A channel off the fast path whose level is the same for every input (the paper's models have a
 * few: a bias saturated at an end of int32 and a right shift of 24 to 29): the general path's
 * arithmetic is monotone in the sum, and the sum lies within +-taps * 65536 (|w| <= 128, |x -
 * x_zero| <= 255), so equal levels at both ends mean one level throughout. It runs on the fast
 * path with mult 0, right 1 and add 1 + 2 level: (add - sign) >> 1 is the level whatever the sum
 * (init 0: |2 sum| < 2^31). Out of line: et_rq_make's common path stays small where it inlines. */
static __attribute__((noinline, cold)) void et_rq_constant(const et_qconv_p *P, int32_t b, int32_t o, int32_t taps,
                                                            et_rq *r) {
    if ((int64_t)taps * 65536 >= ((int64_t)1 << 30)) return;
    const int32_t lo = et_rq_level(P, b, o, -taps * 65536);
    if (lo != et_rq_level(P, b, o, taps * 65536)) return;
    r->fast = 1;
    r->init = 0;
    r->mult = 0;
    r->right = 1;
    r->add = 1 + 2 * lo;
}

/* inlined where it is called (gcc put it out of line once it decoded packed multipliers: 1 % more of
 * mbv2-w0.35's step) */
static inline __attribute__((always_inline)) et_rq et_rq_make(const et_qconv_p *P, const int32_t *bias, int32_t o,
                                                              int32_t taps, int32_t wsum, const float *yf) {
    et_rq r = {-P->x_zero * wsum, 0, 0, 0, 0};
    if (yf) return r;
    const int32_t b = bias[o], sh = et_rq_shift(P, o);
    /* |sum w * (x - x_zero)| <= taps * 128 * 255; partial sums of w * x, taps * 128 * 128 more */
    const int64_t bound = (int64_t)(b < 0 ? -(int64_t)b : b) + (int64_t)taps * 32768 * 2;
    r.mult = et_rq_mult(P, o);
    if (sh <= -1 && sh >= -ET_RQ_MAX_RIGHT && r.mult > (1 << 30) && P->qmin == -128 && P->qmax == 127 &&
        bound < ET_RQ_BOUND) {
        r.fast = 1;
        r.init += b;
        r.right = -sh;
        r.add = (1 << (r.right - 1)) + P->y_zero * (1 << r.right);
    } else {
        et_rq_constant(P, b, o, taps, &r);
    }
    return r;
}

/* the general path: et_qrow_put's arithmetic (saturating bias, et_mbqm, clamp, or float) */
static ET_DSP_NOINLINE ET_SMALL_ATTR void et_rq_slow(const et_qconv_p *P, const int32_t *bias, int32_t o,
                                                 int32_t acc, int8_t *y, float *yf) {
    acc = et_addsat32(acc, bias[o]);
#ifndef ET_INTEGER_ONLY /* model.h defines it for a step without float values: no float instruction linked */
    if (yf) *yf = (float)acc * P->out_scale[o];
    else
#endif
        *y = (int8_t)et_clampi(et_mbqm(acc, et_rq_mult(P, o), et_rq_shift(P, o)) + P->y_zero, P->qmin, P->qmax);
}

/* output element `at` (of y or yf) of channel o from its sum */
static inline void et_rq_put(const et_qconv_p *P, const int32_t *bias, const et_rq *r, int32_t o, int32_t acc,
                             int8_t *y, float *yf, int32_t at) {
    if (__builtin_expect(r->fast, 1)) y[at] = (int8_t)et_rq_fast(r, acc);
    else et_rq_slow(P, bias, o, acc, y ? y + at : 0, yf ? yf + at : 0);
}

/* ---- qadd (et_int8.h's et_qadd on its fast path) ------------------------------------------
 * Each input: et_mbqm((x - zero) * 2^20, mult, -r) is SRDHM = SMMULR of 2 * (x - zero) * 2^20
 * (|.| < 2^29), then for r >= 1 the rounding right shift (hi + 2^(r-1) - (hi < 0)) >> r; their
 * sum (|.| < 2^29, no saturation) requantized as et_level2 (y_mult > 2^30). Compiled once for
 * each of r_a, r_b zero or not. */
static inline int32_t et_srdhm_shift(int32_t v2, int32_t mult, int32_t half, int32_t r, const int shifted) {
    int32_t hi;
    __asm__("smmulr %0, %1, %2" : "=r"(hi) : "r"(v2), "r"(mult));
    return shifted ? (hi + half - (int32_t)((uint32_t)hi >> 31)) >> r : hi;
}

static inline __attribute__((always_inline)) void et_qadd_fast_k(int32_t az, int32_t am, int32_t ar, int32_t bz,
                                                                 int32_t bm, int32_t br, int32_t yadd, int32_t ym,
                                                                 int32_t yr, const int8_t *a, const int8_t *b,
                                                                 int8_t *y, int32_t count, const int sa, const int sb) {
    const int32_t az21 = az * (1 << 21), bz21 = bz * (1 << 21);
    const int32_t ah = sa ? 1 << (ar - 1) : 0, bh = sb ? 1 << (br - 1) : 0;
    for (int32_t k = 0; k < count; k++) {
        const int32_t xa = et_srdhm_shift((int32_t)a[k] * (1 << 21) - az21, am, ah, ar, sa);
        const int32_t xb = et_srdhm_shift((int32_t)b[k] * (1 << 21) - bz21, bm, bh, br, sb);
        y[k] = (int8_t)et_level2((xa + xb) * 2, ym, yadd, yr);
    }
}

static ET_DSP_NOINLINE void et_qadd_fast(int32_t az, int32_t am, int32_t ar, int32_t bz, int32_t bm, int32_t br,
                                         int32_t yz, int32_t ym, int32_t yr, const int8_t *a, const int8_t *b,
                                         int8_t *y, int32_t count) {
    const int32_t yadd = (1 << (yr - 1)) + yz * (1 << yr);
    if (ar && br) et_qadd_fast_k(az, am, ar, bz, bm, br, yadd, ym, yr, a, b, y, count, 1, 1);
    else if (ar) et_qadd_fast_k(az, am, ar, bz, bm, br, yadd, ym, yr, a, b, y, count, 1, 0);
    else if (br) et_qadd_fast_k(az, am, ar, bz, bm, br, yadd, ym, yr, a, b, y, count, 0, 1);
    else et_qadd_fast_k(az, am, ar, bz, bm, br, yadd, ym, yr, a, b, y, count, 0, 0);
}

/* ---- saturation masks (et_int8.h's et_qmask_pack) -------------------------------------------
 * Four levels a word: SSUB8 against lo + 1 and from hi - 1 set the GE bits of the bytes inside
 * (lo, hi), SEL turns them into 0xFF bytes, and a multiply gathers the four bytes' low bits:
 * (b0 + b1 2^8 + b2 2^16 + b3 2^24) * 0x10204080 has b0..b3 at bits 28..31 with no carries.
 * Returns the mask bytes written (count / 8); the rest are et_qmask_pack's. */
static ET_DSP_NOINLINE int32_t et_qmask_pack_dsp(const int8_t *y, uint8_t *m, int32_t count, int32_t lo, int32_t hi) {
    if (lo >= 127 || hi <= -128) return 0; /* lo + 1 or hi - 1 not an int8 */
    const uint32_t lo1 = (uint32_t)(uint8_t)(lo + 1) * 0x01010101u, hi1 = (uint32_t)(uint8_t)(hi - 1) * 0x01010101u;
    const int32_t bytes = count / 8;
    for (int32_t b = 0; b < bytes; b++, y += 8) {
        uint32_t nib[2];
        for (int32_t h = 0; h < 2; h++) {
            const uint32_t v = (uint32_t)et_ld32s(y + 4 * h);
            (void)__ssub8(v, lo1);
            const uint32_t above = __sel(0xFFFFFFFFu, 0u);
            (void)__ssub8(hi1, v);
            const uint32_t below = __sel(0x01010101u, 0u);
            nib[h] = ((above & below) * 0x10204080u) >> 28;
        }
        m[b] = (uint8_t)(nib[0] | (nib[1] << 4));
    }
    return bytes;
}

/* ---- GEMM over packed columns --------------------------------------------------------------
 * Two pixels' K inputs interleaved as bytes: per 4 inputs k = 4m.. two words, (v0[k], v1[k],
 * v0[k+2], v1[k+2]) and (v0[k+1], v1[k+1], v0[k+3], v1[k+3]), so __sxtb16 of a word gives
 * pixel 0's pair and of the word rotated by 8 pixel 1's (the weight word's pairs). The K % 4
 * last inputs keep the same places in one more group. */
#define ET_COL_K 640        /* the most inputs per column (2 * ET_COL_K bytes of stack) */
#define ET_GATHER_K 160     /* the most inputs of a gathered (KxK) window */
#define ET_GATHER_ROWS 48   /* the most input rows (cg * kh) of a gathered window */
#define ET_RQ_CHUNK 32      /* output channels whose weight rows and requantization are held at once */
#define ET_WPAD 512         /* stack bytes for a chunk's weight rows padded to whole words */
#define ET_K_RGB3 28        /* the inputs of a 3x3 over 3 channels padded to words: an image model's first conv */

/* byte of input j (< 4) of pixel t in a group of the column */
static inline int32_t et_col_at(int32_t j, int32_t t) { return (j & 1) * 4 + (j & 2) + t; }

/* a loop over groups of 4 inputs, unrolled completely when the input count k is a constant of
 * at most 32 (et_gemm_row_wide's four-pixel loops for k = 8 and 16, et_gemm_windows_quads'
 * and et_gemm_pairs' for ET_K_RGB3):
 * no loop counter, no set-up, the weight offsets immediates */
#define ET_GROUPS(k, ...)                                                                  \
    do {                                                                                   \
        if (__builtin_constant_p(k) && (k) <= 32) {                                        \
            _Pragma("GCC unroll 8") for (; q + 4 <= (k); q += 4) { __VA_ARGS__ }           \
        } else {                                                                           \
            for (; q + 4 <= (k); q += 4) { __VA_ARGS__ }                                   \
        }                                                                                  \
    } while (0)

/* s[i][t] (start values in s) + w_i . column t, for the weight rows wa, wb */
static inline __attribute__((always_inline)) void et_dot22(const int8_t *wa, const int8_t *wb, const int8_t *c,
                                                           int32_t k, int32_t s[2][2]) {
    int32_t s00 = s[0][0], s01 = s[0][1], s10 = s[1][0], s11 = s[1][1];
    int32_t q = 0;
    ET_GROUPS(k, {
        const int32_t va = et_ld32s(wa + q), vb = et_ld32s(wb + q);
        const uint32_t u02 = (uint32_t)et_ld32s(c + 2 * q), u13 = (uint32_t)et_ld32s(c + 2 * q + 4);
        const int32_t a02 = __sxtb16(va), a13 = et_sxtb16_ror8((uint32_t)va);
        const int32_t b02 = __sxtb16(vb), b13 = et_sxtb16_ror8((uint32_t)vb);
        const int32_t x0e = __sxtb16((int32_t)u02), x1e = et_sxtb16_ror8(u02);
        const int32_t x0o = __sxtb16((int32_t)u13), x1o = et_sxtb16_ror8(u13);
        s00 = __smlad(a02, x0e, s00);
        s00 = __smlad(a13, x0o, s00);
        s01 = __smlad(a02, x1e, s01);
        s01 = __smlad(a13, x1o, s01);
        s10 = __smlad(b02, x0e, s10);
        s10 = __smlad(b13, x0o, s10);
        s11 = __smlad(b02, x1e, s11);
        s11 = __smlad(b13, x1o, s11);
    });
    c += 2 * q;
    for (int32_t j = 0; q < k; q++, j++) {
        const int32_t x0 = c[et_col_at(j, 0)], x1 = c[et_col_at(j, 1)];
        s00 += wa[q] * x0;
        s01 += wa[q] * x1;
        s10 += wb[q] * x0;
        s11 += wb[q] * x1;
    }
    s[0][0] = s00;
    s[0][1] = s01;
    s[1][0] = s10;
    s[1][1] = s11;
}

/* s[t] (start values in s) + wa . column t */
static inline void et_dot12(const int8_t *wa, const int8_t *c, int32_t k, int32_t s[2]) {
    int32_t s0 = s[0], s1 = s[1];
    int32_t q = 0;
    for (; q + 4 <= k; q += 4, c += 8) {
        const int32_t va = et_ld32s(wa + q);
        const uint32_t u02 = (uint32_t)et_ld32s(c), u13 = (uint32_t)et_ld32s(c + 4);
        const int32_t a02 = __sxtb16(va), a13 = et_sxtb16_ror8((uint32_t)va);
        s0 = __smlad(a02, __sxtb16((int32_t)u02), s0);
        s0 = __smlad(a13, __sxtb16((int32_t)u13), s0);
        s1 = __smlad(a02, et_sxtb16_ror8(u02), s1);
        s1 = __smlad(a13, et_sxtb16_ror8(u13), s1);
    }
    for (int32_t j = 0; q < k; q++, j++) {
        s0 += wa[q] * c[et_col_at(j, 0)];
        s1 += wa[q] * c[et_col_at(j, 1)];
    }
    s[0] = s0;
    s[1] = s1;
}

/* the column of pixels x and x + 1 (two) or of x twice; input k's pixel at x + k * cs */
static inline void et_col_planes(const int8_t *x, int32_t cs, int32_t k, int32_t two, int8_t *c) {
    int32_t q = 0;
    for (; q + 4 <= k; q += 4, c += 8) {
        const int8_t *p = x + q * cs;
        uint32_t u02, u13;
        if (two) {
            u02 = et_ld16u(p) | (et_ld16u(p + 2 * cs) << 16);
            u13 = et_ld16u(p + cs) | (et_ld16u(p + 3 * cs) << 16);
        } else {
            u02 = ((uint32_t)(uint8_t)p[0] | ((uint32_t)(uint8_t)p[2 * cs] << 16)) * 0x101u;
            u13 = ((uint32_t)(uint8_t)p[cs] | ((uint32_t)(uint8_t)p[3 * cs] << 16)) * 0x101u;
        }
        memcpy(c, &u02, 4);
        memcpy(c + 4, &u13, 4);
    }
    for (int32_t j = 0; q < k; q++, j++) {
        c[et_col_at(j, 0)] = x[q * cs];
        c[et_col_at(j, 1)] = x[q * cs + two];
    }
}

/* the column of two gathered windows v0, v1 of k bytes */
static inline void et_col_windows(const int8_t *v0, const int8_t *v1, int32_t k, int8_t *c) {
    int32_t q = 0;
    for (; q + 4 <= k; q += 4, c += 8) {
        const uint32_t a = (uint32_t)et_ld32s(v0 + q), b = (uint32_t)et_ld32s(v1 + q);
        const uint32_t u02 = (a & 0x00FF00FFu) | ((b & 0x00FF00FFu) << 8);
        const uint32_t u13 = ((a >> 8) & 0x00FF00FFu) | (b & 0xFF00FF00u);
        memcpy(c, &u02, 4);
        memcpy(c + 4, &u13, 4);
    }
    for (int32_t j = 0; q < k; q++, j++) {
        c[et_col_at(j, 0)] = v0[q];
        c[et_col_at(j, 1)] = v1[q];
    }
}

/* the k = cg*kh*kw inputs of pixel q's window in (c, i, j) order, a padded tap as x_zero;
 * rows[c*kh + i] is the input row or 0 (outside the image) */
static inline void et_gather(const et_qconv_p *P, const int8_t *const *rows, int32_t q, int8_t *v) {
    const int32_t c0 = q * P->sw - P->pw, kw = P->kw, nr = P->cg * P->kh;
    const int8_t xz = (int8_t)P->x_zero;
    if (kw == 3 && P->dw == 1 && c0 >= 0 && c0 + 3 < P->w) { /* 3 taps and the byte after them in the row */
        for (int32_t r = 0; r < nr; r++, v += 3) { /* a word each, its 4th byte overwritten next (or unread) */
            const int8_t *p = rows[r];
            uint32_t t = (uint32_t)(uint8_t)xz * 0x01010101u;
            if (p) memcpy(&t, p + c0, 4);
            memcpy(v, &t, 4);
        }
        return;
    }
    if (c0 >= 0 && c0 + (kw - 1) * P->dw < P->w) { /* every tap column inside the row */
        for (int32_t r = 0; r < nr; r++, v += kw) {
            const int8_t *p = rows[r];
            if (!p) memset(v, (uint8_t)xz, (size_t)kw);
            else for (int32_t j = 0; j < kw; j++) v[j] = p[c0 + j * P->dw];
        }
        return;
    }
    for (int32_t r = 0; r < nr; r++, v += kw) {
        const int8_t *p = rows[r];
        for (int32_t j = 0; j < kw; j++) {
            const int32_t col = c0 + j * P->dw;
            v[j] = p && col >= 0 && col < P->w ? p[col] : xz;
        }
    }
}

/* a weight's rows side by side (whole, or split by output channel) */
static inline int et_w8_rows(const et_w8 *w) { return !w->map || w->dim == 0; }

static inline int et_qconv_gemm_ok(const et_qconv_p *P, const et_w8 *w) {
    const int32_t k = P->cg * P->kh * P->kw;
    const int planes = k == P->cg && P->ph == 0 && P->pw == 0 && P->sw == 1;
    return P->groups == 1 && (planes ? k <= ET_COL_K - 4 : et_w8_rows(w) && k <= ET_GATHER_K &&
                                                           P->cg * P->kh <= ET_GATHER_ROWS);
}

/* the column of a 1x1 conv whose weight is split by input channel: channel q goes to input
 * map[q] (>= 0) of the first part, or -map[q] - 1 of the second, which starts at input base2
 * (a multiple of 4) */
static inline void et_col_planes_map(const int8_t *x, int32_t cs, int32_t k, int32_t two, const int16_t *map,
                                     int32_t base2, int8_t *c) {
    for (int32_t q = 0; q < k; q++) {
        const int32_t m = map[q], at = m >= 0 ? m : base2 - m - 1;
        int8_t *g = c + (at >> 2) * 8 + et_col_at(at & 3, 0);
        g[0] = x[q * cs];
        g[1] = x[q * cs + two];
    }
}

/* one output channel of a fast-path chunk: its weight row and requantization */
typedef struct {
    const int8_t *w, *w2; /* w2: the second part of a weight split by input channel */
    int32_t init, mult, add, right, fast;
} et_gemm_oc;

/* the et_rq of a chunk entry */
static inline et_rq et_gemm_rq(const et_gemm_oc *t) {
    const et_rq r = {t->init, t->mult, t->add, t->right, t->fast};
    return r;
}

/* the levels of two pixels of the channels t[0], t[1] stored at y[0], y[1], y[cs], y[cs + 1]
 * (the constants read before the first store: an int8 store may alias them) */
static inline void et_gemm_store(const et_gemm_oc *t, const int32_t s[2][2], int8_t *y, int32_t cs) {
    const int32_t ma = t[0].mult, aa = t[0].add, ra = t[0].right, mb = t[1].mult, ab = t[1].add, rb = t[1].right;
    const int8_t y00 = et_level(s[0][0], ma, aa, ra), y01 = et_level(s[0][1], ma, aa, ra);
    const int8_t y10 = et_level(s[1][0], mb, ab, rb), y11 = et_level(s[1][1], mb, ab, rb);
    y[0] = y00;
    y[1] = y01;
    y[cs] = y10;
    y[cs + 1] = y11;
}

/* `pairs` output channel pairs of a chunk whose requantization is all on the fast path, at
 * two pixels (column col): y[o * cs + t] for channel o of t, pixel t. Out of line and with few
 * live values, so the accumulators, weight rows and column stay in registers. */
static inline __attribute__((always_inline)) void et_gemm_pairs_body(const et_gemm_oc *t, int32_t pairs,
                                                                     const int8_t *col, int32_t k, int8_t *y, int32_t cs,
                                                                     const int8_t *col2, int32_t k2) {
    for (; pairs > 0; pairs--, t += 2, y += 2 * cs) {
        int32_t s[2][2] = {{t[0].init, t[0].init}, {t[1].init, t[1].init}};
        et_dot22(t[0].w, t[1].w, col, k, s);
        if (k2) et_dot22(t[0].w2, t[1].w2, col2, k2, s);
        et_gemm_store(t, (const int32_t(*)[2])s, y, cs);
    }
}

static ET_DSP_NOINLINE void et_gemm_pairs(const et_gemm_oc *t, int32_t pairs, const int8_t *col, int32_t k, int8_t *y,
                                          int32_t cs, const int8_t *col2, int32_t k2) {
    if (k == ET_K_RGB3 && k2 == 0) et_gemm_pairs_body(t, pairs, col, ET_K_RGB3, y, cs, 0, 0);
    else et_gemm_pairs_body(t, pairs, col, k, y, cs, col2, k2);
}

#endif /* __ARM_FEATURE_DSP */
#endif /* ET_INT8_DSP_H */
