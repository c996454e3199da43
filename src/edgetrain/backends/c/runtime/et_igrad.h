/* The integer-only backward (backward="integer"; ops/igrad.py, ops/icross_entropy.py and
 * ops/igrad_fixed.py are the spec): int16 gradients with static exponents, int32 / int64
 * accumulators, the Q16 SGD update with stochastic rounding. Integer instructions only: no
 * float arithmetic (the loss's float is assembled from its bits). Integer sums do not depend
 * on their order, so these loops are bit-exact with the numpy reference whatever they
 * traverse first. A weight trained on some channels is read through its et_w8 and its update
 * writes the selected channels' array (split) or the whole weight. */
#ifndef ET_IGRAD_H
#define ET_IGRAD_H

#include <stdint.h>
#include <string.h>

#include "et_int8_core.h"

/* v * 2^-s rounded half up (s > 0), or v * 2^-s exactly (s <= 0) */
static inline int64_t et_rshift_round(int64_t v, int32_t s) {
    if (s > 0) return (v + ((int64_t)1 << (s - 1))) >> s;
    return v * ((int64_t)1 << -s);
}

static inline int16_t et_sat16(int64_t v) {
    return (int16_t)(v < -32768 ? -32768 : v > 32767 ? 32767 : v);
}

/* the top 16 bits of ops/qoptim.py's counter hash: the update's uniform number in Q16 */
static inline int64_t et_uniform16(uint32_t key, uint32_t index) {
    return (int64_t)(et_hash32(key, index) >> 16);
}

/* ---- the classifier's int32 accumulators (qconv2d with acc_out) ------------------------ */
typedef struct {
    int32_t n, c, h, w, o, cg, kh, kw, ho, wo, sh, sw, ph, pw, dh, dw, groups, x_zero;
} et_iconv_p;

__attribute__((noinline, unused)) static void et_iacc_conv(const et_iconv_p *P, const int8_t *x, const et_w8 *W,
                                                           const int32_t *bias, int32_t *y) {
    const int32_t opg = P->o / P->groups;
    for (int32_t n = 0; n < P->n; ++n)
        for (int32_t o = 0; o < P->o; ++o)
            for (int32_t yo = 0; yo < P->ho; ++yo)
                for (int32_t xo = 0; xo < P->wo; ++xo) {
                    int64_t acc = bias[o];
                    for (int32_t cc = 0; cc < P->cg; ++cc) {
                        const int32_t c = (o / opg) * P->cg + cc;
                        const int8_t *w = et_w8_taps(W, o, cc, P->cg, P->kh * P->kw);
                        for (int32_t i = 0; i < P->kh; ++i) {
                            const int32_t yi = yo * P->sh - P->ph + i * P->dh;
                            if (yi < 0 || yi >= P->h) continue;
                            for (int32_t j = 0; j < P->kw; ++j) {
                                const int32_t xi = xo * P->sw - P->pw + j * P->dw;
                                if (xi < 0 || xi >= P->w) continue;
                                acc += (int32_t)w[i * P->kw + j] *
                                       ((int32_t)x[((n * P->c + c) * P->h + yi) * P->w + xi] - P->x_zero);
                            }
                        }
                    }
                    y[((n * P->o + o) * P->ho + yo) * P->wo + xo] =
                        (int32_t)(acc < INT32_MIN ? INT32_MIN : acc > INT32_MAX ? INT32_MAX : acc);
                }
}

/* ---- the loss ---------------------------------------------------------------------------- */
static inline int64_t et_interp_q(const int32_t *table, int64_t f) {
    const int64_t j = f >> 8, r = f & 0xFF;
    return table[j] + (((int64_t)(table[j + 1] - table[j]) * r) >> 8);
}

/* exp(d / 2^16) in Q16 for d <= 0; exp2 = 2^(-j/256) in Q30, j = 0..256 */
static inline int64_t et_exp_q16(int64_t d, const int32_t *exp2) {
    if (d < -((int64_t)24 << 16)) d = -((int64_t)24 << 16);
    const int64_t u = -((d * 94548) >> 16);
    const int64_t whole = u >> 16;
    const int64_t sh = whole + 14 < 62 ? whole + 14 : 62;
    return et_interp_q(exp2, u & 0xFFFF) >> sh;
}

/* log2(s) in Q16 of s >= 1; log2t = log2(1 + j/256) in Q16, j = 0..256 */
static inline int64_t et_log2_q16(int64_t s, const int32_t *log2t) {
    int64_t b = 0, t = s;
    for (int k = 32; k >= 1; k >>= 1)
        if (t >= ((int64_t)1 << k)) { b += k; t >>= k; }
    const int64_t mant = b <= 30 ? s << (30 - b) : s >> (b - 30);
    return (b << 16) + et_interp_q(log2t, (mant - ((int64_t)1 << 30)) >> 14);
}

/* the float32 of q / 2^16 (0 <= q < 2^24, exact) from integer operations, stored at out */
static inline void et_store_q16_float(int64_t q, void *out) {
    uint32_t bits = 0;
    if (q > 0) {
        int32_t b = 0;
        while ((q >> (b + 1)) != 0) ++b;
        bits = ((uint32_t)(b - 16 + 127) << 23) | (((uint32_t)q << (23 - b)) & 0x7FFFFFu);
    }
    memcpy(out, &bits, sizeof bits);
}

/* class c's logit in Q16 from element q of the int32 accumulators (bytes 4) or int8 logits (bytes 1) */
static inline int64_t et_logit_q16(const void *acc, int32_t bytes, int64_t q, int32_t zero, const int32_t *mult,
                                   const int32_t *shift, int32_t c) {
    const int64_t v = bytes == 1 ? (int64_t)((const int8_t *)acc)[q] : (int64_t)((const int32_t *)acc)[q];
    const int64_t z = et_rshift_round((v - zero) * mult[c], shift[c]);
    return z < -((int64_t)1 << 30) ? -((int64_t)1 << 30) : z > ((int64_t)1 << 30) ? ((int64_t)1 << 30) : z;
}

/* acc: (n, k, inner) int32 accumulators or int8 logits (`bytes` 4 or 1, `zero` their zero point);
 * label: (n, inner); grad: like acc, int16; *loss: a float32's bytes */
__attribute__((noinline, unused)) static void et_icross_entropy(
    const void *acc, int32_t bytes, const int64_t *label, int32_t n, int32_t k, int32_t inner, int32_t zero,
    const int32_t *mult,
    const int32_t *shift, int32_t grad_shift, int64_t ignore, const int32_t *exp2, const int32_t *log2t,
    void *loss, int16_t *grad) {
    int64_t count = 0, total_loss = 0;
    for (int32_t q = 0; q < n * inner; ++q) count += label[q] != ignore;
    for (int32_t ni = 0; ni < n; ++ni)
        for (int32_t j = 0; j < inner; ++j) {
            const int64_t a = (int64_t)ni * k * inner + j;
            int16_t *g = grad + a;
            const int64_t lab = label[ni * inner + j];
            const int valid = lab != ignore;
            int64_t m = et_logit_q16(acc, bytes, a, zero, mult, shift, 0);
            for (int32_t c = 1; c < k; ++c) {
                const int64_t z = et_logit_q16(acc, bytes, a + (int64_t)c * inner, zero, mult, shift, c);
                if (z > m) m = z;
            }
            int64_t s = 0;
            for (int32_t c = 0; c < k; ++c)
                s += et_exp_q16(et_logit_q16(acc, bytes, a + (int64_t)c * inner, zero, mult, shift, c) - m, exp2);
            for (int32_t c = 0; c < k; ++c) {
                const int64_t d = et_logit_q16(acc, bytes, a + (int64_t)c * inner, zero, mult, shift, c) - m;
                int64_t v = 0;
                if (valid) {
                    v = ((et_exp_q16(d, exp2) << 15) / s - (c == lab ? (1 << 15) : 0)) * ((int64_t)1 << grad_shift);
                    v /= count; /* C truncates toward zero: the reference does */
                }
                g[(int64_t)c * inner] = et_sat16(v);
                if (valid && c == lab) total_loss += ((et_log2_q16(s, log2t) - ((int64_t)16 << 16)) * 45426 >> 16) - d;
            }
        }
    int64_t l = count ? total_loss / count : 0;
    et_store_q16_float(l > 16777215 ? 16777215 : l, loss);
}

/* ---- gradients: rescale, add, saturation mask --------------------------------------------- */
__attribute__((noinline, unused)) static void et_igrad_scale(const int16_t *g, int16_t *y, int32_t count,
                                                             int32_t mult, int32_t shift) {
    for (int32_t i = 0; i < count; ++i) y[i] = et_sat16(et_rshift_round((int64_t)g[i] * mult, shift));
}

__attribute__((noinline, unused)) static void et_igrad_add(const int16_t *a, const int16_t *b, int16_t *y,
                                                           int32_t count, int32_t sa, int32_t sb) {
    for (int32_t i = 0; i < count; ++i) y[i] = et_sat16(et_rshift_round(a[i], sa) + et_rshift_round(b[i], sb));
}

__attribute__((noinline, unused)) static void et_qmask_grad_i16(const int16_t *g, const uint8_t *m, int16_t *y,
                                                                int32_t count) {
    for (int32_t i = 0; i < count; ++i) y[i] = (m[i >> 3] >> (i & 7)) & 1 ? g[i] : 0;
}

/* ---- a convolution's input gradient ------------------------------------------------------- */
/* input columns computed together (an int64 and an int32 accumulator each on the stack) */
#define ET_IGX_CHUNK 32

/* gx[n, c, y, x] = sat16(round(sum over (o, i, j) of g * w * mult[o] * 2^-shift)), a row chunk of
 * ET_IGX_CHUNK columns at a time: for each output channel o the int32 sum over the taps, then
 * times mult[o] into int64. Each tap's valid columns are a strided range found once (no division
 * per element), so the inner loop is a multiply-accumulate. */
__attribute__((noinline, unused)) static void et_iconv_grad_input(const et_iconv_p *P, const int16_t *g,
                                                                  const et_w8 *W, const int16_t *mult,
                                                                  int32_t shift, int16_t *gx) {
    const int32_t opg = P->o / P->groups, khkw = P->kh * P->kw;
    int64_t acc[ET_IGX_CHUNK];
    int32_t t[ET_IGX_CHUNK];
    for (int32_t n = 0; n < P->n; ++n)
        for (int32_t c = 0; c < P->c; ++c) {
            const int32_t grp = c / P->cg, cc = c % P->cg;
            for (int32_t yi = 0; yi < P->h; ++yi)
                for (int32_t x0 = 0; x0 < P->w; x0 += ET_IGX_CHUNK) {
                    const int32_t x1 = x0 + ET_IGX_CHUNK < P->w ? x0 + ET_IGX_CHUNK : P->w;
                    for (int32_t k = 0; k < x1 - x0; ++k) {
                        acc[k] = 0;
                        t[k] = 0;
                    }
                    for (int32_t o = grp * opg; o < (grp + 1) * opg; ++o) {
                        const int8_t *w = et_w8_taps(W, o, cc, P->cg, khkw);
                        int any = 0;
                        for (int32_t i = 0; i < P->kh; ++i) {
                            const int32_t yy = yi + P->ph - i * P->dh;
                            if (yy < 0 || yy % P->sh) continue;
                            const int32_t yo = yy / P->sh;
                            if (yo >= P->ho) continue;
                            const int16_t *grow = g + ((n * P->o + o) * P->ho + yo) * P->wo;
                            for (int32_t j = 0; j < P->kw; ++j) {
                                const int32_t wv = w[i * P->kw + j];
                                if (!wv) continue;
                                const int32_t off = P->pw - j * P->dw; /* xo * sw = x + off */
                                int32_t x = x0 > -off ? x0 : -off;
                                const int32_t r = (x + off) % P->sw;
                                if (r) x += P->sw - r;
                                const int32_t last = (P->wo - 1) * P->sw - off; /* xo <= wo - 1 */
                                const int32_t end = last < x1 - 1 ? last : x1 - 1;
                                if (x > end) continue;
                                any = 1;
                                const int16_t *gp = grow + (x + off) / P->sw;
                                for (; x <= end; x += P->sw) t[x - x0] += (int32_t)*gp++ * wv;
                            }
                        }
                        if (any) /* t back to zero as it is read */
                            for (int32_t k = 0; k < x1 - x0; ++k) {
                                acc[k] += (int64_t)t[k] * mult[o];
                                t[k] = 0;
                            }
                    }
                    int16_t *out = gx + ((n * P->c + c) * P->h + yi) * P->w;
                    for (int32_t k = 0; k < x1 - x0; ++k) out[x0 + k] = et_sat16(et_rshift_round(acc[k], shift));
                }
        }
}

/* ---- the updates ------------------------------------------------------------------------- */
/* SGD's settings in fixed point: momentum in Q16, lr * weight decay as mult * 2^-shift, the bounds */
typedef struct {
    int32_t momentum_q16, decay_mult, decay_shift, qmin, qmax;
} et_iopt_p;

/* w (at flat index `at` of the whole parameter) moved by -acc * mult * 2^-shift (+ its decay, through
 * the momentum buffer element m when there is one) in Q16, with stochastic rounding */
static inline int64_t et_iupdate(int64_t w, int64_t acc, int32_t mult, int32_t shift, const et_iopt_p *O,
                                 int32_t *m, uint32_t key, uint32_t at) {
    const int64_t bound = (int64_t)1 << 47;
    acc = acc < -bound ? -bound : acc > bound ? bound : acc;
    int64_t d = et_rshift_round(acc * mult, shift);
    if (O->decay_mult) d += et_rshift_round(w * O->decay_mult, O->decay_shift);
    if (m) {
        d += et_rshift_round((int64_t)*m * O->momentum_q16, 16);
        d = d < INT32_MIN ? INT32_MIN : d > INT32_MAX ? INT32_MAX : d;
        *m = (int32_t)d;
    }
    const int64_t v = (w * 65536 - d + et_uniform16(key, at)) >> 16;
    return v < O->qmin ? O->qmin : v > O->qmax ? O->qmax : v;
}

typedef struct {
    int32_t rows, cols;       /* the updated weight's (selected) rows and columns */
    int32_t full_cols;        /* columns of the whole weight */
    int32_t depthwise;        /* row r reads input channel r (else column c reads channel c) */
    int32_t dim;              /* -1: whole; 0 / 1: idx selects those rows / columns */
    int32_t split;            /* w holds the selected rows / columns only (in idx order) */
} et_iupd_p;

/* each weight element's gradient sum over (n, ho, wo) of g * (x - x_zero), applied at once; m: the
 * momentum buffer (the selected elements, in order) or 0 */
__attribute__((noinline, unused)) static void et_iconv_grad_weight_update(
    const et_iconv_p *P, const et_iupd_p *U, const et_iopt_p *O, const int8_t *x, const int16_t *g, int8_t *w,
    int32_t *m, const int16_t *mult, const int8_t *shift, const uint16_t *idx, uint32_t key) {
    for (int32_t r = 0; r < U->rows; ++r)
        for (int32_t cc = 0; cc < U->cols; ++cc) {
            const int32_t xc = U->depthwise ? r : cc;
            const int32_t row = U->dim == 0 ? idx[r] : r, col = U->dim == 1 ? idx[cc] : cc;
            for (int32_t i = 0; i < P->kh; ++i)
                for (int32_t j = 0; j < P->kw; ++j) {
                    int64_t acc = 0;
                    for (int32_t n = 0; n < P->n; ++n)
                        for (int32_t yo = 0; yo < P->ho; ++yo) {
                            const int32_t yi = yo * P->sh - P->ph + i * P->dh;
                            if (yi < 0 || yi >= P->h) continue;
                            const int16_t *gr = g + ((n * P->o + r) * P->ho + yo) * P->wo;
                            const int8_t *xr = x + ((n * P->c + xc) * P->h + yi) * P->w;
                            for (int32_t xo = 0; xo < P->wo; ++xo) {
                                const int32_t xi = xo * P->sw - P->pw + j * P->dw;
                                if (xi < 0 || xi >= P->w) continue;
                                acc += (int32_t)gr[xo] * ((int32_t)xr[xi] - P->x_zero);
                            }
                        }
                    const uint32_t at = (uint32_t)(((row * U->full_cols + col) * P->kh + i) * P->kw + j);
                    const int32_t sel = ((r * U->cols + cc) * P->kh + i) * P->kw + j;
                    const int32_t q = U->split ? sel : (int32_t)at;
                    w[q] = (int8_t)et_iupdate(w[q], acc, mult[r], shift[r], O, m ? m + sel : 0, key, at);
                }
        }
}

/* g: (n, rows, inner); bias entry idx[r] (or r; entry r of a split bias's selected part) moved by
 * the sum of g's channel r */
__attribute__((noinline, unused)) static void et_iconv_bias_update(
    int32_t *b, int32_t *m, const int16_t *g, int32_t n, int32_t rows, int32_t inner, const et_iopt_p *O,
    const int16_t *mult, const int8_t *shift, const uint16_t *idx, int32_t split, uint32_t key) {
    for (int32_t r = 0; r < rows; ++r) {
        int64_t acc = 0;
        for (int32_t ni = 0; ni < n; ++ni)
            for (int32_t k = 0; k < inner; ++k) acc += g[((int64_t)ni * rows + r) * inner + k];
        const uint32_t at = (uint32_t)(idx ? idx[r] : r);
        const int32_t q = split ? r : (int32_t)at;
        b[q] = (int32_t)et_iupdate(b[q], acc, mult[r], shift[r], O, m ? m + r : 0, key, at);
    }
}

#endif /* ET_IGRAD_H */
