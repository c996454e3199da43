/* edgetrain int8 kernels: the integer forward of TFLite Micro / CMSIS-NN and the float32
 * backward of the int8 training program, bit-identical to the numpy references in
 * src/edgetrain/ops (q*.py, fixed_point.py).
 *
 * Numerics contract (see the references' docstrings):
 * - forward: exact int32 accumulation, then MultiplyByQuantizedMultiplier exactly as
 *   ops/fixed_point.py (rounding-doubling high multiply, rounding right shift);
 * - backward: every float32 sum runs in one documented order (ops/qconv.py): weight and
 *   bias gradients sum sequentially over (n, ho, wo); an input gradient element adds its
 *   contributions in (o, i, j) order; compile with -ffp-contract=off;
 * - the update: elementwise float32 arithmetic of ops/qoptim.py with the counter hash.
 * No allocation: scratch comes from the op's scratch output; a small fixed stack block of
 * ET_ACC_BLOCK int32 accumulators per output row segment. NCHW everywhere.
 */
#ifndef ET_INT8_H
#define ET_INT8_H

#include <stdint.h>
#include <string.h>

#ifndef ET_RESTRICT
#define ET_RESTRICT __restrict__
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

static inline float et_uniform(uint32_t key, uint32_t index) {
    uint32_t h = index * 0x9E3779B1u + key;
    h ^= h >> 16;
    h *= 0x85EBCA6Bu;
    h ^= h >> 13;
    h *= 0xC2B2AE35u;
    h ^= h >> 16;
    return (float)(h >> 8) * 0x1p-24f;
}

/* ---- operands ------------------------------------------------------------------------- */
/* Rows of an int8 NCHW tensor, whole or a ring buffer of `cap` rows per channel:
 * row k of channel c of image n is at p + n*nstride + c*cstride + (k % cap) * width. */
typedef struct { int8_t *p; int32_t nstride, cstride, cap; } et_rows8;

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
typedef struct {
    int32_t n, c, h, w;        /* input */
    int32_t o, cg, kh, kw;     /* weight (cg = c / groups) */
    int32_t ho, wo;            /* output */
    int32_t sh, sw, ph, pw, dh, dw;
    int32_t groups;
    int32_t x_zero, y_zero, qmin, qmax;
    const int32_t *mult;         /* per output channel (int8 output) */
    const int8_t *shift;         /* per output channel: -31..30 */
    const float *out_scale;      /* per output channel (float output: x_scale * w_scale[o]) */
} et_qconv_p;

/* output columns [lo, hi) whose tap j reads an in-range input column */
static inline void et_col_range(const et_qconv_p *P, int32_t j, int32_t *lo, int32_t *hi) {
    int32_t off = j * P->dw - P->pw; /* input column = wo * sw + off */
    int32_t a = off >= 0 ? 0 : (-off + P->sw - 1) / P->sw;
    int32_t b = (P->w - 1 - off) >= 0 ? (P->w - 1 - off) / P->sw + 1 : 0;
    if (b > P->wo) b = P->wo;
    *lo = a; *hi = b < a ? a : b;
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
        r.mult = P->mult[o];
        r.shift = P->shift[o];
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
    if (r->yf) r->yf[q] = (float)acc * r->scale;
    else r->y[q] = (int8_t)et_clampi(et_qrow_mbqm(r, acc) + r->y_zero, r->qmin, r->qmax);
}

#if defined(__ARM_FEATURE_DSP)
#include <arm_acle.h>
/* ---- Cortex-M DSP pointwise qconv2d ------------------------------------------------------
 * Two int8 operands per 32-bit register as int16 pairs (__sxtb16 takes bytes 0 and 2, of the
 * word rotated by 8 bytes 1 and 3), one __smlad per two products. Per four input channels
 * c..c+3: a weight row's word gives the pairs (w[c], w[c+2]) and (w[c+1], w[c+3]); the two
 * pixels' halfwords of channels c and c+2 (c+1 and c+3) joined give, for each pixel, the
 * matching input pairs. The input zero point is taken out afterwards as x_zero * sum(w[o])
 * (exact integers, so the sums equal the host kernel's). */
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

static inline int32_t et_sxtb16_ror8(uint32_t v) { return __sxtb16((int32_t)((v >> 8) | (v << 24))); }

/* acc[k][t] = sum_c wk[c] * x[c][t] for the output channels of rows wa, wb (wb may be 0: one
 * channel) and the pixels x and x + 1 (two) or x alone (npx = 1); channel c's pixel at x + c*cs */
static inline void et_pw_dsp(const int8_t *x, int32_t cs, const int8_t *wa, const int8_t *wb, int32_t cg,
                             int32_t npx, int32_t acc[2][2]) {
    int32_t a00 = 0, a01 = 0, a10 = 0, a11 = 0;
    int32_t c = 0;
    if (npx == 2) {
        for (; c + 4 <= cg; c += 4) {
            const int8_t *p = x + c * cs;
            const uint32_t x02 = et_ld16u(p) | (et_ld16u(p + 2 * cs) << 16);
            const uint32_t x13 = et_ld16u(p + cs) | (et_ld16u(p + 3 * cs) << 16);
            const int32_t x02a = __sxtb16((int32_t)x02), x02b = et_sxtb16_ror8(x02);
            const int32_t x13a = __sxtb16((int32_t)x13), x13b = et_sxtb16_ror8(x13);
            const int32_t va = et_ld32s(wa + c);
            const int32_t wa02 = __sxtb16(va), wa13 = et_sxtb16_ror8((uint32_t)va);
            a00 = __smlad(wa02, x02a, a00);
            a00 = __smlad(wa13, x13a, a00);
            a01 = __smlad(wa02, x02b, a01);
            a01 = __smlad(wa13, x13b, a01);
            if (wb) {
                const int32_t vb = et_ld32s(wb + c);
                const int32_t wb02 = __sxtb16(vb), wb13 = et_sxtb16_ror8((uint32_t)vb);
                a10 = __smlad(wb02, x02a, a10);
                a10 = __smlad(wb13, x13a, a10);
                a11 = __smlad(wb02, x02b, a11);
                a11 = __smlad(wb13, x13b, a11);
            }
        }
    }
    for (; c < cg; c++) {
        const int32_t x0 = x[c * cs], x1 = npx == 2 ? x[c * cs + 1] : 0;
        a00 += wa[c] * x0;
        a01 += wa[c] * x1;
        if (wb) {
            a10 += wb[c] * x0;
            a11 += wb[c] * x1;
        }
    }
    acc[0][0] = a00;
    acc[0][1] = a01;
    acc[1][0] = a10;
    acc[1][1] = a11;
}

/* et_qconv_rows for a 1x1, unpadded, column-stride-1, ungrouped layer whose weight rows are
 * contiguous (whole, or split by output channel) */
#define ET_PW_GATHER 256 /* a weight split by input channel: rows of up to this many gathered */
static inline int et_qconv_pw_ok(const et_qconv_p *P, const et_w8 *w) {
    return P->kh == 1 && P->kw == 1 && P->ph == 0 && P->pw == 0 && P->sw == 1 && P->groups == 1 &&
           (!w->map || w->dim == 0 || P->cg <= ET_PW_GATHER);
}

/* row o of a 1x1 weight: in place, or (split by input channel) gathered into buf */
static inline const int8_t *et_pw_row(const et_w8 *w, int32_t o, int32_t cg, int8_t *buf) {
    if (!w->map || w->dim == 0) return et_w8_taps(w, o, 0, cg, 1);
    for (int32_t c = 0; c < cg; c++) buf[c] = *et_w8_taps(w, o, c, cg, 1);
    return buf;
}

static inline void et_qconv_pw_rows(const et_qconv_p *P, et_rows8 x, int32_t xc_off, const et_w8 *w,
                                    const int32_t *bias, et_rows8 y, float *yf, int32_t yo_off, int32_t r0,
                                    int32_t r1, int32_t o0, int32_t o1) {
    const int32_t cg = P->cg;
    int8_t ga[ET_PW_GATHER], gb[ET_PW_GATHER];
    for (int32_t n = 0; n < P->n; n++)
        for (int32_t o = o0; o < o1; o += 2) {
            const int32_t two = o + 1 < o1;
            const int8_t *wa = et_pw_row(w, o, cg, ga), *wb = two ? et_pw_row(w, o + 1, cg, gb) : 0;
            int32_t za = 0, zb = 0; /* x_zero * sum(w): the zero point's share */
            for (int32_t c = 0; c < cg; c++) {
                za += wa[c];
                zb += two ? wb[c] : 0;
            }
            za = -P->x_zero * za;
            zb = -P->x_zero * zb;
            for (int32_t ho = r0; ho < r1; ho++) {
                const int8_t *xr = x.p + n * x.nstride - xc_off * x.cstride + ((ho * P->sh) % x.cap) * P->w;
                const et_qrow ra = et_qconv_row(P, y, yf, yo_off, n, o, ho, bias);
                const et_qrow rb = et_qconv_row(P, y, yf, yo_off, n, two ? o + 1 : o, ho, bias);
                for (int32_t q = 0; q < P->wo; q += 2) {
                    const int32_t npx = q + 1 < P->wo ? 2 : 1;
                    int32_t acc[2][2];
                    et_pw_dsp(xr + q, x.cstride, wa, wb, cg, npx, acc);
                    for (int32_t t = 0; t < npx; t++) {
                        et_qrow_put(&ra, q + t, acc[0][t] + za);
                        if (two) et_qrow_put(&rb, q + t, acc[1][t] + zb);
                    }
                }
            }
        }
}

/* ---- Cortex-M DSP KxK qconv2d (depthwise, grouped or dense) ----------------------------------
 * One output pixel at a time; each tap row's KW (<= 8) inputs are read as words whose
 * __sxtb16 pairs (x[4k], x[4k+2]) and (x[4k+1], x[4k+3]) meet the weight pairs packed per
 * (output, input channel) (taps past KW are zero weights, so the bytes read past the window
 * count nothing). Pixels whose window, or whose last word, leaves the row take the scalar
 * path, which skips padded taps; the input zero point comes out as x_zero * (sum of the valid
 * rows' weights) on the word path. Several input channels (CG > 1) add up in ET_ACC_BLOCK
 * accumulators per row segment. Same integers as the host kernel. */
#define ET_DW_TAPS 8
static inline int et_qconv_taps_ok(const et_qconv_p *P) {
    return P->kh <= ET_DW_TAPS && P->kw <= ET_DW_TAPS && P->dh == 1 && P->dw == 1;
}

/* the int16 weight pairs of each tap row of one (output, input channel) and each row's sum */
static inline void et_taps_pack(const int8_t *taps, int32_t kh, int32_t kw, int32_t words,
                                int32_t wpk[ET_DW_TAPS][2][2], int32_t *wrow) {
    for (int32_t i = 0; i < kh; i++) {
        int32_t sum = 0;
        for (int32_t k = 0; k < words; k++) {
            int32_t t[4];
            for (int32_t e = 0; e < 4; e++) t[e] = 4 * k + e < kw ? taps[i * kw + 4 * k + e] : 0;
            wpk[i][k][0] = (int32_t)(((uint32_t)t[0] & 0xFFFFu) | ((uint32_t)t[2] << 16));
            wpk[i][k][1] = (int32_t)(((uint32_t)t[1] & 0xFFFFu) | ((uint32_t)t[3] << 16));
            sum += t[0] + t[1] + t[2] + t[3];
        }
        wrow[i] = sum;
    }
}

/* pixel q's sum over one input channel on the scalar path (padded taps skipped) */
static inline int32_t et_taps_edge(const et_qconv_p *P, const int8_t *const *rows, const int32_t *rowi, int32_t nr,
                                   const int8_t *taps, const int32_t *col_lo, const int32_t *col_hi, int32_t q) {
    int32_t acc = 0;
    for (int32_t r = 0; r < nr; r++) {
        const int8_t *xp = rows[r] + q * P->sw, *tr = taps + rowi[r] * P->kw;
        for (int32_t j = 0; j < P->kw; j++)
            if (q >= col_lo[j] && q < col_hi[j]) acc += tr[j] * ((int32_t)xp[j] - P->x_zero);
    }
    return acc;
}

/* v into pixel q's sum: the first input channel starts it, the last one stores it */
static inline void et_taps_add(int32_t *acc, int32_t t, int32_t v, int32_t first, int32_t last, const et_qrow *out,
                               int32_t q) {
    if (!first) v += acc[t];
    if (last) et_qrow_put(out, q, v);
    else acc[t] = v;
}

static inline void et_qconv_taps_rows(const et_qconv_p *P, et_rows8 x, int32_t xc_off, const et_w8 *w,
                                      const int32_t *bias, et_rows8 y, float *yf, int32_t yo_off, int32_t r0,
                                      int32_t r1, int32_t o0, int32_t o1) {
    const int32_t kh = P->kh, kw = P->kw, words = (kw + 3) / 4, cg = P->cg, opg = P->o / P->groups;
    int32_t col_lo[ET_DW_TAPS], col_hi[ET_DW_TAPS];
    int32_t qa = 0, qb = P->wo; /* pixels on the word path: every tap and every word byte in the row */
    for (int32_t j = 0; j < kw; j++) {
        et_col_range(P, j, &col_lo[j], &col_hi[j]);
        if (col_lo[j] > qa) qa = col_lo[j];
    }
    /* last byte read: q*sw - pw + 4*words - 1 <= w - 1 */
    const int32_t room = P->w - 4 * words + P->pw;
    if (room < 0) qb = 0;
    else if (room / P->sw + 1 < qb) qb = room / P->sw + 1;
    if (qa > P->wo) qa = P->wo;
    if (qb < qa) qb = qa;
    int32_t wpk[ET_DW_TAPS][2][2]; /* [row][word][even, odd] int16 pairs */
    int32_t wrow[ET_DW_TAPS];      /* sum of each row's weights */
    int32_t acc[ET_ACC_BLOCK];
    for (int32_t n = 0; n < P->n; n++)
        for (int32_t o = o0; o < o1; o++) {
            const int32_t c0 = (o / opg) * cg - xc_off;
            if (cg == 1) et_taps_pack(et_w8_taps(w, o, 0, 1, kh * kw), kh, kw, words, wpk, wrow);
            for (int32_t ho = r0; ho < r1; ho++) {
                int32_t rowoff[ET_DW_TAPS], rowi[ET_DW_TAPS], nr = 0;
                for (int32_t i = 0; i < kh; i++) {
                    const int32_t hi = ho * P->sh - P->ph + i;
                    if (hi < 0 || hi >= P->h) continue;
                    rowoff[nr] = (hi % x.cap) * P->w - P->pw;
                    rowi[nr++] = i;
                }
                const et_qrow out = et_qconv_row(P, y, yf, yo_off, n, o, ho, bias);
                for (int32_t b0 = 0; b0 < P->wo; b0 += ET_ACC_BLOCK) {
                    const int32_t b1 = b0 + ET_ACC_BLOCK < P->wo ? b0 + ET_ACC_BLOCK : P->wo;
                    const int32_t wa = qa > b0 ? (qa < b1 ? qa : b1) : b0, wb = qb < b1 ? (qb > wa ? qb : wa) : b1;
                    for (int32_t c = 0; c < cg; c++) {
                        const int8_t *taps = et_w8_taps(w, o, c, cg, kh * kw);
                        if (cg > 1) et_taps_pack(taps, kh, kw, words, wpk, wrow);
                        const int8_t *xc = x.p + n * x.nstride + (c0 + c) * x.cstride;
                        const int8_t *rows[ET_DW_TAPS];
                        int32_t wsum = 0;
                        for (int32_t r = 0; r < nr; r++) {
                            rows[r] = xc + rowoff[r];
                            wsum += wrow[rowi[r]];
                        }
                        const int32_t zc = -P->x_zero * wsum, first = c == 0, last = c == cg - 1;
                        for (int32_t q = b0; q < wa; q++)
                            et_taps_add(acc, q - b0, et_taps_edge(P, rows, rowi, nr, taps, col_lo, col_hi, q), first,
                                        last, &out, q);
                        for (int32_t q = wb; q < b1; q++)
                            et_taps_add(acc, q - b0, et_taps_edge(P, rows, rowi, nr, taps, col_lo, col_hi, q), first,
                                        last, &out, q);
                        if (words == 1 && nr == 3) { /* 3 tap rows of at most 4 taps: all in registers */
                            const int32_t e0 = wpk[rowi[0]][0][0], d0 = wpk[rowi[0]][0][1];
                            const int32_t e1 = wpk[rowi[1]][0][0], d1 = wpk[rowi[1]][0][1];
                            const int32_t e2 = wpk[rowi[2]][0][0], d2 = wpk[rowi[2]][0][1];
                            const int8_t *p0 = rows[0] + wa * P->sw, *p1 = rows[1] + wa * P->sw,
                                         *p2 = rows[2] + wa * P->sw;
                            for (int32_t q = wa; q < wb; q++, p0 += P->sw, p1 += P->sw, p2 += P->sw) {
                                const uint32_t v0 = (uint32_t)et_ld32s(p0), v1 = (uint32_t)et_ld32s(p1),
                                               v2 = (uint32_t)et_ld32s(p2);
                                int32_t v = __smlad(e0, __sxtb16((int32_t)v0), zc);
                                v = __smlad(d0, et_sxtb16_ror8(v0), v);
                                v = __smlad(e1, __sxtb16((int32_t)v1), v);
                                v = __smlad(d1, et_sxtb16_ror8(v1), v);
                                v = __smlad(e2, __sxtb16((int32_t)v2), v);
                                v = __smlad(d2, et_sxtb16_ror8(v2), v);
                                et_taps_add(acc, q - b0, v, first, last, &out, q);
                            }
                        } else {
                            for (int32_t q = wa; q < wb; q++) {
                                int32_t v = zc;
                                for (int32_t r = 0; r < nr; r++) {
                                    const int8_t *xp = rows[r] + q * P->sw;
                                    const int32_t i = rowi[r];
                                    for (int32_t k = 0; k < words; k++) {
                                        const uint32_t u = (uint32_t)et_ld32s(xp + 4 * k);
                                        v = __smlad(wpk[i][k][0], __sxtb16((int32_t)u), v);
                                        v = __smlad(wpk[i][k][1], et_sxtb16_ror8(u), v);
                                    }
                                }
                                et_taps_add(acc, q - b0, v, first, last, &out, q);
                            }
                        }
                    }
                }
            }
        }
}
#endif /* __ARM_FEATURE_DSP */

/* Output rows [r0, r1) of output channels [o0, o1) of a qconv2d. y (int8) or yf (float32,
 * float_out) is addressed like x: row ho of channel o of image n at
 * base + n*nstride + (o - yo_off)*cstride + (ho % cap)*wo; input channel k is channel
 * k - xc_off of x (a buffer holding some channels only); the weight, bias, mult, shift and
 * out_scale are indexed by the absolute output channel o. The output column range of each
 * tap column is computed once per call (ET_COL_TAPS columns at most, else per tap). */
#define ET_COL_TAPS 16
static inline void et_qconv_rows(const et_qconv_p *P, et_rows8 x, int32_t xc_off, const et_w8 *w,
                                 const int32_t *bias, et_rows8 y, float *yf, int32_t yo_off, int32_t r0, int32_t r1,
                                 int32_t o0, int32_t o1) {
#if defined(__ARM_FEATURE_DSP)
    if (et_qconv_pw_ok(P, w)) {
        et_qconv_pw_rows(P, x, xc_off, w, bias, y, yf, yo_off, r0, r1, o0, o1);
        return;
    }
    if (et_qconv_taps_ok(P)) {
        et_qconv_taps_rows(P, x, xc_off, w, bias, y, yf, yo_off, r0, r1, o0, o1);
        return;
    }
#endif
    const int32_t opg = P->o / P->groups, khkw = P->kh * P->kw;
    int32_t acc[ET_ACC_BLOCK];
    int32_t col_lo[ET_COL_TAPS], col_hi[ET_COL_TAPS];
    for (int32_t j = 0; j < P->kw && j < ET_COL_TAPS; j++) et_col_range(P, j, &col_lo[j], &col_hi[j]);
    for (int32_t n = 0; n < P->n; n++)
        for (int32_t o = o0; o < o1; o++) {
            const int32_t c0 = (o / opg) * P->cg - xc_off;
            for (int32_t ho = r0; ho < r1; ho++)
                for (int32_t b0 = 0; b0 < P->wo; b0 += ET_ACC_BLOCK) {
                    const int32_t b1 = b0 + ET_ACC_BLOCK < P->wo ? b0 + ET_ACC_BLOCK : P->wo;
                    for (int32_t t = 0; t < b1 - b0; t++) acc[t] = 0;
                    for (int32_t c = 0; c < P->cg; c++) {
                        const int8_t *taps = et_w8_taps(w, o, c, P->cg, khkw);
                        for (int32_t i = 0; i < P->kh; i++) {
                            const int32_t hi = ho * P->sh - P->ph + i * P->dh;
                            if (hi < 0 || hi >= P->h) continue;
                            const int8_t *xr = x.p + n * x.nstride + (c0 + c) * x.cstride + (hi % x.cap) * P->w;
                            for (int32_t j = 0; j < P->kw; j++) {
                                const int32_t wv = taps[i * P->kw + j];
                                if (wv == 0) continue;
                                int32_t lo, hi2;
                                if (j < ET_COL_TAPS) {
                                    lo = col_lo[j];
                                    hi2 = col_hi[j];
                                } else {
                                    et_col_range(P, j, &lo, &hi2);
                                }
                                if (lo < b0) lo = b0;
                                if (hi2 > b1) hi2 = b1;
                                const int8_t *xp = xr + j * P->dw - P->pw;
                                if (P->sw == 1)
                                    for (int32_t q = lo; q < hi2; q++) acc[q - b0] += wv * ((int32_t)xp[q] - P->x_zero);
                                else
                                    for (int32_t q = lo; q < hi2; q++)
                                        acc[q - b0] += wv * ((int32_t)xp[q * P->sw] - P->x_zero);
                            }
                        }
                    }
                    const et_qrow out = et_qconv_row(P, y, yf, yo_off, n, o, ho, bias);
                    for (int32_t t = 0; t < b1 - b0; t++) et_qrow_put(&out, b0 + t, acc[t]);
                }
        }
}

static inline et_rows8 et_whole8(const void *p, int32_t c, int32_t h, int32_t w) {
    et_rows8 r = {(int8_t *)p, c * h * w, h * w, h};
    return r;
}

/* ---- qadd (TFLite quantized add), one row of all channels or a whole tensor --------------- */
typedef struct {
    int32_t a_zero, b_zero, y_zero, a_mult, a_shift, b_mult, b_shift, y_mult, y_shift, qmin, qmax;
} et_qadd_p;

static inline void et_qadd(const et_qadd_p *P, const int8_t *a, const int8_t *b, int8_t *y, int32_t count) {
    for (int32_t k = 0; k < count; k++) {
        int32_t xa = et_mbqm(((int32_t)a[k] - P->a_zero) * (1 << 20), P->a_mult, P->a_shift);
        int32_t xb = et_mbqm(((int32_t)b[k] - P->b_zero) * (1 << 20), P->b_mult, P->b_shift);
        int32_t v = et_mbqm(et_addsat32(xa, xb), P->y_mult, P->y_shift) + P->y_zero;
        y[k] = (int8_t)et_clampi(v, P->qmin, P->qmax);
    }
}

/* row r of every channel of every image (a qstream step) */
static inline void et_qadd_row(const et_qadd_p *P, et_rows8 a, et_rows8 b, et_rows8 y, int32_t n, int32_t c,
                               int32_t w, int32_t r) {
    for (int32_t k = 0; k < n; k++)
        for (int32_t ch = 0; ch < c; ch++)
            et_qadd(P, a.p + k * a.nstride + ch * a.cstride + (r % a.cap) * w,
                    b.p + k * b.nstride + ch * b.cstride + (r % b.cap) * w,
                    y.p + k * y.nstride + ch * y.cstride + (r % y.cap) * w, w);
}

/* ---- qmean over the trailing `inner` elements of each of `outer` groups ------------------ */
static inline void et_qmean(const int8_t *x, int8_t *y, int32_t outer, int32_t inner, int32_t zero) {
    for (int32_t k = 0; k < outer; k++) {
        int32_t total = 0;
        for (int32_t t = 0; t < inner; t++) total += (int32_t)x[k * inner + t] - zero;
        int32_t mag = ((total < 0 ? -total : total) + inner / 2) / inner;
        y[k] = (int8_t)et_clampi((total < 0 ? -mag : mag) + zero, -128, 127);
    }
}

static inline void et_qclamp(const int8_t *x, int8_t *y, int32_t count, int32_t lo, int32_t hi) {
    for (int32_t k = 0; k < count; k++) y[k] = (int8_t)et_clampi(x[k], lo, hi);
}

/* ---- int8 pooling and concatenation (ops/qpool.py) ---------------------------------------
 * NCHW planes; a window's taps run in (i, j) order; a padded tap is skipped (a max pool's
 * padding never wins, an average's adds a real zero). */
typedef struct {
    int32_t planes, h, w, ho, wo, kh, kw, sh, sw, ph, pw, dh, dw;
    int32_t div; /* average: the divisor, or 0 for the count of real taps */
} et_pool_p;

/* the max level of window (oh, ow) of one plane, -129 when every tap is padding; *arg: the
 * first tap (i * kw + j) holding it, -1 when none */
static inline int32_t et_qmaxpool_win(const et_pool_p *P, const int8_t *x, int32_t oh, int32_t ow, int32_t *arg) {
    int32_t best = -129, at = -1;
    for (int32_t i = 0; i < P->kh; i++) {
        int32_t r = oh * P->sh + i * P->dh - P->ph;
        if (r < 0 || r >= P->h) continue;
        for (int32_t j = 0; j < P->kw; j++) {
            int32_t c = ow * P->sw + j * P->dw - P->pw;
            if (c < 0 || c >= P->w) continue;
            int32_t v = x[r * P->w + c];
            if (v > best) {
                best = v;
                at = i * P->kw + j;
            }
        }
    }
    *arg = at;
    return best;
}

static inline void et_qmax_pool2d(const et_pool_p *P, const int8_t *x, int8_t *y) {
    for (int32_t p = 0; p < P->planes; p++)
        for (int32_t oh = 0; oh < P->ho; oh++)
            for (int32_t ow = 0; ow < P->wo; ow++) {
                int32_t arg;
                int32_t v = et_qmaxpool_win(P, x + p * P->h * P->w, oh, ow, &arg);
                y[(p * P->ho + oh) * P->wo + ow] = (int8_t)et_clampi(v, -128, 127);
            }
}

/* each output gradient to the first max of its window; an input element adds its terms in
 * tap order from 0 (as ops/qpool.py _qmax_grad_ref) */
static inline void et_qmax_pool2d_grad(const et_pool_p *P, const float *g, const int8_t *x, float *gx) {
    memset(gx, 0, sizeof(float) * (size_t)P->planes * (size_t)P->h * (size_t)P->w);
    for (int32_t p = 0; p < P->planes; p++) {
        const int8_t *xp = x + p * P->h * P->w;
        float *gp = gx + p * P->h * P->w;
        for (int32_t i = 0; i < P->kh; i++)
            for (int32_t j = 0; j < P->kw; j++)
                for (int32_t oh = 0; oh < P->ho; oh++) {
                    int32_t r = oh * P->sh + i * P->dh - P->ph;
                    if (r < 0 || r >= P->h) continue;
                    for (int32_t ow = 0; ow < P->wo; ow++) {
                        int32_t c = ow * P->sw + j * P->dw - P->pw, arg;
                        if (c < 0 || c >= P->w) continue;
                        et_qmaxpool_win(P, xp, oh, ow, &arg);
                        gp[r * P->w + c] += arg == i * P->kw + j ? g[(p * P->ho + oh) * P->wo + ow] : 0.0f;
                    }
                }
    }
}

/* the divisor of window (oh, ow): P->div, or the number of its real taps */
static inline int32_t et_pool_count(const et_pool_p *P, int32_t oh, int32_t ow) {
    if (P->div > 0) return P->div;
    int32_t rows = 0, cols = 0;
    for (int32_t i = 0; i < P->kh; i++) {
        int32_t r = oh * P->sh + i * P->dh - P->ph;
        rows += r >= 0 && r < P->h;
    }
    for (int32_t j = 0; j < P->kw; j++) {
        int32_t c = ow * P->sw + j * P->dw - P->pw;
        cols += c >= 0 && c < P->w;
    }
    return rows * cols;
}

static inline void et_qavg_pool2d(const et_pool_p *P, const int8_t *x, int8_t *y, int32_t zero) {
    for (int32_t p = 0; p < P->planes; p++)
        for (int32_t oh = 0; oh < P->ho; oh++)
            for (int32_t ow = 0; ow < P->wo; ow++) {
                int32_t total = 0;
                for (int32_t i = 0; i < P->kh; i++) {
                    int32_t r = oh * P->sh + i * P->dh - P->ph;
                    if (r < 0 || r >= P->h) continue;
                    for (int32_t j = 0; j < P->kw; j++) {
                        int32_t c = ow * P->sw + j * P->dw - P->pw;
                        if (c >= 0 && c < P->w) total += (int32_t)x[(p * P->h + r) * P->w + c] - zero;
                    }
                }
                int32_t count = et_pool_count(P, oh, ow);
                int32_t mag = ((total < 0 ? -total : total) + count / 2) / count;
                y[(p * P->ho + oh) * P->wo + ow] = (int8_t)et_clampi((total < 0 ? -mag : mag) + zero, -128, 127);
            }
}

/* g / count spread over each window, added in tap order from 0 */
static inline void et_qavg_pool2d_grad(const et_pool_p *P, const float *g, float *gx) {
    memset(gx, 0, sizeof(float) * (size_t)P->planes * (size_t)P->h * (size_t)P->w);
    for (int32_t p = 0; p < P->planes; p++)
        for (int32_t i = 0; i < P->kh; i++)
            for (int32_t j = 0; j < P->kw; j++)
                for (int32_t oh = 0; oh < P->ho; oh++) {
                    int32_t r = oh * P->sh + i * P->dh - P->ph;
                    if (r < 0 || r >= P->h) continue;
                    for (int32_t ow = 0; ow < P->wo; ow++) {
                        int32_t c = ow * P->sw + j * P->dw - P->pw;
                        if (c < 0 || c >= P->w) continue;
                        gx[(p * P->h + r) * P->w + c] +=
                            g[(p * P->ho + oh) * P->wo + ow] / (float)et_pool_count(P, oh, ow);
                    }
                }
}

/* TFLite's int8 -> int8 requantization (a qcat input); multiplier 1.0 (2^30, shift 1) with
 * equal zero points is the identity, copied */
static inline void et_qrequant(const int8_t *x, int8_t *y, int32_t count, int32_t x_zero, int32_t mult,
                               int32_t shift, int32_t y_zero) {
    if (mult == (1 << 30) && shift == 1 && x_zero == y_zero) {
        memcpy(y, x, (size_t)count);
        return;
    }
    for (int32_t k = 0; k < count; k++)
        y[k] = (int8_t)et_clampi(et_mbqm((int32_t)x[k] - x_zero, mult, shift) + y_zero, -128, 127);
}

/* ---- quantize / dequantize --------------------------------------------------------------- */
static inline void et_quantize(const float *x, int8_t *y, int32_t count, float scale, int32_t zero,
                               int32_t qmin, int32_t qmax) {
    for (int32_t k = 0; k < count; k++) {
        float q = et_rintf_(x[k] / scale) + (float)zero;
        q = q < (float)qmin ? (float)qmin : (q > (float)qmax ? (float)qmax : q);
        y[k] = (int8_t)(int32_t)q;
    }
}

static inline void et_dequantize(const int8_t *q, float *y, int32_t count, float scale, int32_t zero) {
    for (int32_t k = 0; k < count; k++) y[k] = ((float)q[k] - (float)zero) * scale;
}

/* ---- saturation masks ------------------------------------------------------------------ */
static inline void et_qmask_pack(const int8_t *y, uint8_t *m, int32_t count, int32_t lo, int32_t hi) {
    for (int32_t b = 0; b < (count + 7) / 8; b++) {
        uint32_t byte = 0;
        for (int32_t k = 0; k < 8 && b * 8 + k < count; k++) {
            int32_t v = y[b * 8 + k];
            byte |= (uint32_t)(v > lo && v < hi) << k;
        }
        m[b] = (uint8_t)byte;
    }
}

static inline void et_qmask_grad(const float *g, const uint8_t *m, float *out, int32_t count) {
    for (int32_t k = 0; k < count; k++) out[k] = g[k] * (float)((m[k >> 3] >> (k & 7)) & 1u);
}

/* ---- index_select along one dim: outer x [len(index) of dim] x inner elements ------------ */
static inline void et_index_select(const void *x, void *y, int32_t outer, int32_t dim_size, int32_t inner,
                                   const uint16_t *index, int32_t count, int32_t elem_bytes) {
    const uint8_t *src = (const uint8_t *)x;
    uint8_t *dst = (uint8_t *)y;
    const int32_t row = inner * elem_bytes;
    for (int32_t k = 0; k < outer; k++)
        for (int32_t t = 0; t < count; t++)
            memcpy(dst + (k * count + t) * row, src + (k * dim_size + index[t]) * row, (size_t)row);
}

#endif /* ET_INT8_H */
