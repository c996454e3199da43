/* edgetrain int8 qconv2d forward on the Cortex-M DSP extension (M4, M7: included by et_int8.h
 * where __ARM_FEATURE_DSP is defined; the host build runs et_int8.h's portable loop, and both
 * give the reference's integers bit for bit).
 *
 * Two int8 operands per 32-bit register as int16 pairs: __sxtb16 takes bytes 0 and 2 of a
 * word, of the word rotated by 8 bytes 1 and 3; one __smlad adds two products. A word of 4
 * weights w[k..k+3] gives the pairs (w[k], w[k+2]) and (w[k+1], w[k+3]), so the inputs are
 * packed in that order too. Three parts:
 * - pointwise (1x1) and dense KxK convs: a GEMM over columns. The K = cg*kh*kw inputs of two
 *   pixels are packed once into one column of interleaved bytes (a 1x1's channels read across
 *   the NCHW planes, a KxK's window gathered: im2col) and every pair of output channels runs
 *   over it in a small out-of-line loop (et_gemm_pairs): 2 output channels x 2 pixels of
 *   accumulators in registers, 8 __smlad per 4 inputs; a chunk of at most 4 output channels
 *   of a 1x1 reads the planes directly (et_gemm_pairs_planes);
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

static inline et_rq et_rq_make(const et_qconv_p *P, const int32_t *bias, int32_t o, int32_t taps, int32_t wsum,
                               const float *yf) {
    et_rq r = {-P->x_zero * wsum, 0, 0, 0, 0};
    if (yf) return r;
    const int32_t b = bias[o], sh = P->shift[o];
    /* |sum w * (x - x_zero)| <= taps * 128 * 255; partial sums of w * x, taps * 128 * 128 more */
    const int64_t bound = (int64_t)(b < 0 ? -(int64_t)b : b) + (int64_t)taps * 32768 * 2;
    r.mult = P->mult[o];
    if (sh <= -1 && sh >= -ET_RQ_MAX_RIGHT && r.mult > (1 << 30) && P->qmin == -128 && P->qmax == 127 &&
        bound < ET_RQ_BOUND) {
        r.fast = 1;
        r.init += b;
        r.right = -sh;
        r.add = (1 << (r.right - 1)) + P->y_zero * (1 << r.right);
    }
    return r;
}

/* the general path: et_qrow_put's arithmetic (saturating bias, et_mbqm, clamp, or float) */
static ET_DSP_NOINLINE void et_rq_slow(const et_qconv_p *P, const int32_t *bias, int32_t o, int32_t acc, int8_t *y,
                                   float *yf) {
    acc = et_addsat32(acc, bias[o]);
    if (yf) *yf = (float)acc * P->out_scale[o];
    else *y = (int8_t)et_clampi(et_mbqm(acc, P->mult[o], P->shift[o]) + P->y_zero, P->qmin, P->qmax);
}

/* output element `at` (of y or yf) of channel o from its sum */
static inline void et_rq_put(const et_qconv_p *P, const int32_t *bias, const et_rq *r, int32_t o, int32_t acc,
                             int8_t *y, float *yf, int32_t at) {
    if (__builtin_expect(r->fast, 1)) y[at] = (int8_t)et_rq_fast(r, acc);
    else et_rq_slow(P, bias, o, acc, y ? y + at : 0, yf ? yf + at : 0);
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

/* byte of input j (< 4) of pixel t in a group of the column */
static inline int32_t et_col_at(int32_t j, int32_t t) { return (j & 1) * 4 + (j & 2) + t; }

/* a loop over groups of 4 inputs, unrolled completely when the input count k is a constant of
 * at most 32 (et_gemm_row_wide's instantiations for k = 8, 16, 24, 32, and et_gemm_pairs' for 28):
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
    if (k == 28 && k2 == 0) et_gemm_pairs_body(t, pairs, col, 28, y, cs, 0, 0); /* a 3x3 conv of 3 channels, padded */
    else et_gemm_pairs_body(t, pairs, col, k, y, cs, col2, k2);
}

/* the first `px` (even) pixels of one output row of a 1x1 (k planes, plane q at x + q * xs),
 * two at a time packed into col and run through `pairs` fast output channel pairs: one call
 * per row, not per pixel pair */
/* sxtab16 of v rotated by 8: a + the sign-extended bytes 1 and 3 of v, per halfword */
static inline int32_t et_sxtab16_ror8(int32_t a, uint32_t v) {
    int32_t r;
    __asm__("sxtab16 %0, %1, %2, ror #8" : "=r"(r) : "r"(a), "r"(v));
    return r;
}

/* The wide column of pixels x, x + 1 of a 1x1 (input q at x + q * cs; pixel x twice when
 * !two): per 4 inputs k..k+3 the int16 pairs (v0[k], v0[k+2]), (v0[k+1], v0[k+3]), (v1[k],
 * v1[k+2]), (v1[k+1], v1[k+3]) of v = 2 * (x - x_zero) (|v| <= 510), nz = (-x_zero, -x_zero):
 * the dot products below need no __sxtb16 of the column, start from 2 * bias (no sum of the
 * weights per call) and end with 2 * sum, et_level2's operand. k a multiple of 4. */
static inline __attribute__((always_inline)) void et_col_planes16(const int8_t *x, int32_t cs, int32_t k, int32_t nz,
                                                                  int32_t two, int32_t *c) {
    int32_t q = 0;
    ET_GROUPS(k, {
        const int8_t *p = x + q * cs;
        uint32_t u02, u13;
        if (two) {
            u02 = et_ld16u(p) | (et_ld16u(p + 2 * cs) << 16);
            u13 = et_ld16u(p + cs) | (et_ld16u(p + 3 * cs) << 16);
        } else {
            u02 = ((uint32_t)(uint8_t)p[0] | ((uint32_t)(uint8_t)p[2 * cs] << 16)) * 0x101u;
            u13 = ((uint32_t)(uint8_t)p[cs] | ((uint32_t)(uint8_t)p[3 * cs] << 16)) * 0x101u;
        }
        const int32_t x0e = __sxtab16(nz, (int32_t)u02), x0o = __sxtab16(nz, (int32_t)u13);
        const int32_t x1e = et_sxtab16_ror8(nz, u02), x1o = et_sxtab16_ror8(nz, u13);
        c[q] = __sadd16(x0e, x0e);
        c[q + 1] = __sadd16(x0o, x0o);
        c[q + 2] = __sadd16(x1e, x1e);
        c[q + 3] = __sadd16(x1o, x1o);
    });
}

/* the output channel pairs of a fast chunk over a wide column (et_col_planes16): 2 x 2 sums
 * from 2 * init (init: the bias), stored as et_gemm_store's, the second pixel only when two */
static inline __attribute__((always_inline)) void et_gemm_pairs16(const et_gemm_oc *t, int32_t pairs, const int32_t *c,
                                                                  int32_t k, int8_t *y, int32_t cs, const int two) {
    for (; pairs > 0; pairs--, t += 2, y += 2 * cs) {
        const int8_t *wa = t[0].w, *wb = t[1].w;
        int32_t s00 = 2 * t[0].init, s01 = s00, s10 = 2 * t[1].init, s11 = s10;
        int32_t q = 0;
        ET_GROUPS(k, {
            const int32_t va = et_ld32s(wa + q), vb = et_ld32s(wb + q);
            const int32_t a02 = __sxtb16(va), a13 = et_sxtb16_ror8((uint32_t)va);
            const int32_t b02 = __sxtb16(vb), b13 = et_sxtb16_ror8((uint32_t)vb);
            const int32_t x0e = c[q], x0o = c[q + 1], x1e = c[q + 2], x1o = c[q + 3];
            s00 = __smlad(a02, x0e, s00);
            s00 = __smlad(a13, x0o, s00);
            s01 = __smlad(a02, x1e, s01);
            s01 = __smlad(a13, x1o, s01);
            s10 = __smlad(b02, x0e, s10);
            s10 = __smlad(b13, x0o, s10);
            s11 = __smlad(b02, x1e, s11);
            s11 = __smlad(b13, x1o, s11);
        });
        const int32_t ma = t[0].mult, aa = t[0].add, ra = t[0].right, mb = t[1].mult, ab = t[1].add, rb = t[1].right;
        const int8_t y00 = et_level2(s00, ma, aa, ra), y01 = et_level2(s01, ma, aa, ra);
        const int8_t y10 = et_level2(s10, mb, ab, rb), y11 = et_level2(s11, mb, ab, rb);
        y[0] = y00;
        y[cs] = y10;
        if (two) {
            y[1] = y01;
            y[cs + 1] = y11;
        }
    }
}

/* one output row of `px` pixels of a 1x1 over wide columns, two pixels at a time (the last
 * alone when px is odd), for a chunk of fast channel pairs whose init is the bias alone
 * (k a small constant: the column is 4 k bytes of col) */
static inline __attribute__((always_inline)) void et_gemm_row_wide_k(const et_gemm_oc *t, int32_t pairs,
                                                                     const int8_t *x, int32_t xs, int32_t k, int32_t nz,
                                                                     int8_t *col, int32_t px, int8_t *y, int32_t cs) {
    int32_t *c = (int32_t *)(void *)col; /* 4-byte aligned */
    int32_t q = 0;
    for (; q + 2 <= px; q += 2) {
        et_col_planes16(x + q, xs, k, nz, 1, c);
        et_gemm_pairs16(t, pairs, c, k, y + q, cs, 1);
    }
    if (q < px) {
        et_col_planes16(x + q, xs, k, nz, 0, c);
        et_gemm_pairs16(t, pairs, c, k, y + q, cs, 0);
    }
}

/* the input counts of the wide path (the paper's models' small 1x1s: the expansions of the
 * first blocks, where a loop's set-up cost as much as its products), each compiled with its
 * dot-product loops unrolled completely */
static inline int et_gemm_wide_k(int32_t k) { return k == 8 || k == 16 || k == 24 || k == 32; }

static ET_DSP_NOINLINE void et_gemm_row_wide(const et_gemm_oc *t, int32_t pairs, const int8_t *x, int32_t xs,
                                             int32_t k, int32_t x_zero, int8_t *col, int32_t px, int8_t *y,
                                             int32_t cs) {
    const int32_t nz = et_pack16(-x_zero, -x_zero);
    if (k == 8) et_gemm_row_wide_k(t, pairs, x, xs, 8, nz, col, px, y, cs);
    else if (k == 16) et_gemm_row_wide_k(t, pairs, x, xs, 16, nz, col, px, y, cs);
    else if (k == 24) et_gemm_row_wide_k(t, pairs, x, xs, 24, nz, col, px, y, cs);
    else et_gemm_row_wide_k(t, pairs, x, xs, 32, nz, col, px, y, cs);
}

static inline __attribute__((always_inline)) void et_gemm_row_planes_k(const et_gemm_oc *t, int32_t pairs,
                                                                       const int8_t *x, int32_t xs, int32_t k,
                                                                       int8_t *col, int32_t px, int8_t *y, int32_t cs) {
    for (int32_t q = 0; q < px; q += 2) {
        et_col_planes(x + q, xs, k, 1, col);
        et_gemm_pairs_body(t, pairs, col, k, y + q, cs, 0, 0);
    }
}

static ET_DSP_NOINLINE void et_gemm_row_planes(const et_gemm_oc *t, int32_t pairs, const int8_t *x, int32_t xs,
                                               int32_t k, int8_t *col, int32_t px, int8_t *y, int32_t cs) {
    et_gemm_row_planes_k(t, pairs, x, xs, k, col, px, y, cs);
}

/* et_gemm_pairs reading pixels x, x + 1 of the k planes (plane q at x + q * cs) directly:
 * for a chunk of at most 4 output channels the packing would cost as much as it saves */
static inline __attribute__((always_inline)) void et_gemm_planes_px(const et_gemm_oc *t, int32_t pairs, int32_t odd,
                                                                    const int8_t *x, int32_t xs, int32_t k, int8_t *y,
                                                                    int32_t cs) {
    for (; pairs > 0; pairs--, t += 2, y += 2 * cs) {
        int32_t s00 = t[0].init, s01 = t[0].init, s10 = t[1].init, s11 = t[1].init;
        const int8_t *wa = t[0].w, *wb = t[1].w, *p = x;
        int32_t q = 0;
        for (; q + 4 <= k; q += 4, p += 4 * xs) {
            const uint32_t u02 = et_ld16u(p) | (et_ld16u(p + 2 * xs) << 16);
            const uint32_t u13 = et_ld16u(p + xs) | (et_ld16u(p + 3 * xs) << 16);
            const int32_t va = et_ld32s(wa + q), vb = et_ld32s(wb + q);
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
        }
        for (; q < k; q++, p += xs) {
            s00 += wa[q] * p[0];
            s01 += wa[q] * p[1];
            s10 += wb[q] * p[0];
            s11 += wb[q] * p[1];
        }
        const int32_t s[2][2] = {{s00, s01}, {s10, s11}};
        et_gemm_store(t, s, y, cs);
    }
    if (odd) { /* one more channel: (x[q], x[q+2]) and (x[q+1], x[q+3]) of each pixel */
        int32_t s0 = t[0].init, s1 = t[0].init;
        const int8_t *wa = t[0].w, *p = x;
        int32_t q = 0;
        for (; q + 4 <= k; q += 4, p += 4 * xs) {
            const uint32_t u02 = et_ld16u(p) | (et_ld16u(p + 2 * xs) << 16);
            const uint32_t u13 = et_ld16u(p + xs) | (et_ld16u(p + 3 * xs) << 16);
            const int32_t va = et_ld32s(wa + q);
            const int32_t a02 = __sxtb16(va), a13 = et_sxtb16_ror8((uint32_t)va);
            s0 = __smlad(a02, __sxtb16((int32_t)u02), s0);
            s0 = __smlad(a13, __sxtb16((int32_t)u13), s0);
            s1 = __smlad(a02, et_sxtb16_ror8(u02), s1);
            s1 = __smlad(a13, et_sxtb16_ror8(u13), s1);
        }
        for (; q < k; q++, p += xs) {
            s0 += wa[q] * p[0];
            s1 += wa[q] * p[1];
        }
        const int32_t m = t[0].mult, a = t[0].add, r = t[0].right;
        const int8_t y0 = et_level(s0, m, a, r), y1 = et_level(s1, m, a, r);
        y[0] = y0;
        y[1] = y1;
    }
}

/* the first `px` (even) pixels of one output row, two at a time (et_gemm_planes_px) */
static ET_DSP_NOINLINE void et_gemm_pairs_planes(const et_gemm_oc *t, int32_t pairs, int32_t odd, const int8_t *x,
                                                 int32_t xs, int32_t k, int32_t px, int8_t *y, int32_t cs) {
    if (k == 8)
        for (int32_t q = 0; q < px; q += 2) et_gemm_planes_px(t, pairs, odd, x + q, xs, 8, y + q, cs);
    else if (k == 16)
        for (int32_t q = 0; q < px; q += 2) et_gemm_planes_px(t, pairs, odd, x + q, xs, 16, y + q, cs);
    else
        for (int32_t q = 0; q < px; q += 2) et_gemm_planes_px(t, pairs, odd, x + q, xs, k, y + q, cs);
}

/* et_qconv_rows for an ungrouped conv whose weight rows lie side by side: per output row,
 * pixel pairs packed into a column (a 1x1 unpadded column-stride-1 conv reads the planes,
 * any other gathers its windows), then the output channels two by two (ET_RQ_CHUNK at a
 * time, their requantization set up once per call and chunk) */
static ET_DSP_NOINLINE void et_qconv_gemm_rows(const et_qconv_p *P, et_rows8 x, int32_t xc_off, const et_w8 *w,
                                           const int32_t *bias, et_rows8 y, float *yf, int32_t yo_off, int32_t r0,
                                           int32_t r1, int32_t o0, int32_t o1) {
    const int32_t kh = P->kh, cg = P->cg, khkw = kh * P->kw, k = cg * khkw, wo = P->wo;
    const int planes = khkw == 1 && P->ph == 0 && P->pw == 0 && P->sw == 1;
    const int split = w->map && w->dim == 1; /* by input channel: two dot products per pair */
    const int32_t k2 = split ? w->nrest : 0, base2 = ((split ? w->nsel : k) + 3) & ~3;
    /* k not a multiple of 4: a chunk's rows copied with zero weights up to base2, when they fit,
     * so no product runs on the scalar remainder path */
    const int pad = !split && k != base2 && ET_WPAD / base2 >= 2;
    const int32_t chunk = pad && ET_WPAD / base2 < ET_RQ_CHUNK ? ET_WPAD / base2 : ET_RQ_CHUNK;
    const int32_t k1 = split ? w->nsel : pad ? base2 : k;
    /* a small 1x1 whose column takes x_zero out (et_gemm_row_wide): its chunks' init is the bias
     * alone, x_zero * sum(w) added only to a chunk that cannot take that path */
    const int wide = planes && !split && !pad && !yf && et_gemm_wide_k(k);
    int8_t wpad[ET_WPAD] __attribute__((aligned(4)));
    int8_t col[2 * ET_COL_K] __attribute__((aligned(4)));
    int8_t win[2][ET_GATHER_K] __attribute__((aligned(4)));
    const int8_t *rows[ET_GATHER_ROWS];
    et_gemm_oc fast[ET_RQ_CHUNK];
    for (int32_t n = 0; n < P->n; n++)
        for (int32_t oc = o0; oc < o1; oc += chunk) {
            const int32_t oe = oc + chunk < o1 ? oc + chunk : o1;
            if (pad) memset(col + 2 * (base2 - 4), 0, 8); /* the last group's unused inputs: 0 */
            for (int32_t o = oc; o < oe; o++) {
                const int8_t *r1 = split ? w->sel + o * k1 : et_w8_taps(w, o, 0, cg, khkw);
                const int8_t *r2 = split ? w->rest + o * k2 : 0;
                if (pad) {
                    int8_t *row = wpad + (o - oc) * base2;
                    memcpy(row, r1, (size_t)k);
                    memset(row + k, 0, (size_t)(base2 - k));
                    r1 = row;
                }
                const et_rq r = et_rq_make(P, bias, o, k, wide ? 0 : et_wsum(r1, k1) + et_wsum(r2, k2), yf);
                const et_gemm_oc f = {r1, r2, r.init, r.mult, r.add, r.right, r.fast};
                fast[o - oc] = f;
            }
            /* the output channel pairs from oc on whose requantization is all on the fast path */
            int32_t fast_end = oc;
            while (fast_end + 1 < oe && fast[fast_end - oc].fast && fast[fast_end + 1 - oc].fast) fast_end += 2;
            /* a chunk of at most 4 channels of a plain 1x1 reads the planes in its dot products */
            int all_fast = 1;
            for (int32_t o = oc; o < oe; o++) all_fast &= fast[o - oc].fast;
            const int wide_rows = wide && all_fast && ((oe - oc) & 1) == 0;
            const int direct = planes && !split && !pad && oe - oc <= 4 && !wide_rows;
            if (wide && !wide_rows)
                for (int32_t o = oc; o < oe; o++) fast[o - oc].init -= P->x_zero * et_wsum(fast[o - oc].w, k);
            for (int32_t ho = r0; ho < r1; ho++) {
                const int8_t *xn = x.p + n * x.nstride - xc_off * x.cstride, *xr = 0;
                if (planes) xr = xn + ((ho * P->sh) % x.cap) * P->w;
                else
                    for (int32_t c = 0; c < cg; c++)
                        for (int32_t i = 0; i < kh; i++) {
                            const int32_t hi = ho * P->sh - P->ph + i * P->dh;
                            rows[c * kh + i] = hi >= 0 && hi < P->h ? xn + c * x.cstride + (hi % x.cap) * P->w : 0;
                        }
                const int32_t at = n * y.nstride + (ho % y.cap) * wo - yo_off * y.cstride;
                int8_t *yp = yf ? 0 : y.p + at;
                float *yfp = yf ? yf + at : 0;
                int32_t q0 = 0; /* pixels done by et_gemm_row_wide, et_gemm_row_planes or et_gemm_pairs_planes */
                if (wide_rows) {
                    q0 = wo;
                    et_gemm_row_wide(fast, (oe - oc) / 2, xr, x.cstride, k, P->x_zero, col, wo, yp + oc * y.cstride,
                                     y.cstride);
                } else if (direct && all_fast && wo >= 2) {
                    q0 = wo & ~1;
                    et_gemm_pairs_planes(fast, (oe - oc) / 2, (oe - oc) & 1, xr, x.cstride, k, q0,
                                         yp + oc * y.cstride, y.cstride);
                } else if (planes && !split && !pad && !direct && fast_end == oe && wo >= 2) {
                    q0 = wo & ~1;
                    et_gemm_row_planes(fast, (oe - oc) / 2, xr, x.cstride, k, col, q0, yp + oc * y.cstride,
                                       y.cstride);
                }
                for (int32_t q = q0; q < wo; q += 2) {
                    const int32_t two = q + 1 < wo;
                    if (split) et_col_planes_map(xr + q, x.cstride, k, two, w->map, base2, col);
                    else if (planes) et_col_planes(xr + q, x.cstride, k, two, col);
                    else {
                        et_gather(P, rows, q, win[0]);
                        if (two) et_gather(P, rows, q + 1, win[1]);
                        et_col_windows(win[0], two ? win[1] : win[0], k, col);
                    }
                    int32_t o = oc;
                    if (two && fast_end > oc) {
                        et_gemm_pairs(fast, (fast_end - oc) / 2, col, k1, yp + oc * y.cstride + q, y.cstride,
                                      col + 2 * base2, k2);
                        o = fast_end;
                    }
                    for (; o < oe; o += 2) {
                        const et_gemm_oc *fa = &fast[o - oc];
                        const et_rq ra_ = et_gemm_rq(fa), *ra = &ra_;
                        const int32_t ya = o * y.cstride + q;
                        if (o + 1 < oe) {
                            const et_rq rb_ = et_gemm_rq(fa + 1), *rb = &rb_;
                            int32_t s[2][2] = {{ra->init, ra->init}, {rb->init, rb->init}};
                            et_dot22(fa[0].w, fa[1].w, col, k1, s);
                            if (split) et_dot22(fa[0].w2, fa[1].w2, col + 2 * base2, k2, s);
                            et_rq_put(P, bias, ra, o, s[0][0], yp, yfp, ya);
                            et_rq_put(P, bias, rb, o + 1, s[1][0], yp, yfp, ya + y.cstride);
                            if (two) {
                                et_rq_put(P, bias, ra, o, s[0][1], yp, yfp, ya + 1);
                                et_rq_put(P, bias, rb, o + 1, s[1][1], yp, yfp, ya + y.cstride + 1);
                            }
                        } else {
                            int32_t s[2] = {ra->init, ra->init};
                            et_dot12(fa->w, col, k1, s);
                            if (split) et_dot12(fa->w2, col + 2 * base2, k2, s);
                            et_rq_put(P, bias, ra, o, s[0], yp, yfp, ya);
                            if (two) et_rq_put(P, bias, ra, o, s[1], yp, yfp, ya + 1);
                        }
                    }
                }
            }
        }
}

#endif /* __ARM_FEATURE_DSP */
#endif /* ET_INT8_DSP_H */
