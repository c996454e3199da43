/* edgetrain C runtime: the kernels of ops/lmloss.py (kernels/float32_lmloss.py emits their calls):
 * a language model's linear head and its cross entropy over the vocabulary, computed a chunk of
 * C vocabulary rows at a time so that the (R, V) logits are never whole.
 *
 * Operands: H (R, K) rows of the hidden state, the head's weight either W (V, K) in the element
 * type or stored quantized (wq, scale, bits, group: et_float_qweights.h's layout; W null), an
 * optional bias B (V,), labels (R,) int64 or int32 (lab64), `ignore` the ignored label.
 * - et_linear_ce: the mean over counted rows of log(sum_v exp(z_v)) - z_label, z = H W^T + B,
 *   with an online log-sum-exp: a running max and sum of exp per row, in double (et_exp, et_log).
 *   The host's float build with a BLAS (ET_BLAS): each chunk's logits one GEMM into et_scratch's
 *   buffers (the chunk's logits, the rows' running max and sum, the dequantized chunk of a
 *   quantized weight: host scratch, as the im2col blocks, not in the memory plan). Otherwise
 *   (float64, Cortex-M, no BLAS) a logit at a time, a row at a time: no buffer at all.
 * - et_linear_ce_grad: two sweeps over the chunks; the first keeps each row's running max and
 *   sum of exp in ST (R, 2) (rounded to the element type between chunks, as ops/lmloss.py's
 *   reference), the second writes the chunk's P = (softmax - one_hot) * g / count (0 at ignored
 *   rows) into Z (R, C) and adds its share to DH += P W_c, DW[c] = P^T H, DB[c] = sum_r P
 *   (any of DH, DW, DB null: not wanted). Z and ST are the op's scratch outputs (in the arena,
 *   counted by the memory plan). A quantized weight's chunk is dequantized into et_scratch on
 *   the BLAS build, ET_QW_CHUNK elements at a time into a stack buffer elsewhere.
 * A label outside [0, V) other than `ignore`: an error (ET_ERROR_HOOK), the row not counted.
 * Written once, instantiated for float (_f) and double (_d). Header-only. */
#ifndef ET_FLOAT_LMLOSS_H
#define ET_FLOAT_LMLOSS_H
#include <stdint.h>
#include <string.h>
#include "et_common.h"
#include "et_float_gemm.h"
#include "et_float_nn.h"
#include "et_float_qweights.h"

/* the et_scratch buffers of the BLAS forward: the chunk's logits, the rows' (max, sum) */
#define ET_LM_LOGITS_SLOT 1
#define ET_LM_STATS_SLOT 2

/* labels counted (not `ignore`, in range; an out-of-range one raises ET_ERROR_HOOK) */
ET_INLINE long et_lm_count(const void *lab, int lab64, long R, long V, int64_t ignore) {
    long count = 0;
    for (long r = 0; r < R; ++r) {
        const int64_t y = et_index_at(lab, lab64, r);
        if (y == ignore) continue;
        if (y < 0 || y >= V) {
            ET_ERROR_HOOK("linear_cross_entropy: label out of range");
            continue;
        }
        ++count;
    }
    return count;
}

/* the label of row r when it counts, else -1 */
ET_INLINE int64_t et_lm_label(const void *lab, int lab64, long r, long V, int64_t ignore) {
    const int64_t y = et_index_at(lab, lab64, r);
    return y == ignore || y < 0 || y >= V ? -1 : y;
}

#if defined(ET_BLAS)
/* the chunk's weight rows [v0, v0 + c): W's own, or dequantized into et_scratch slot 0 */
static inline const float *et_lm_chunk_w_f(const float *W, const int8_t *wq, const float *scale, int bits, int group,
                                           long v0, long c, long K) {
    if (W) return W + (size_t)v0 * K;
    float *wb = et_scratch(ET_QW_SCRATCH_SLOT, (size_t)c * (K > 0 ? K : 1));
    if (!wb) return 0;
    for (long i = 0; i < c; ++i) et_qw_decode_f(wb + (size_t)i * K, wq, scale, v0 + i, 0, K, K, bits, group);
    return wb;
}

/* Z (R, c) = H W_c^T (+ B_c) */
static inline void et_lm_gemm_f(const float *H, const float *Wc, const float *B, float *Z, long R, long K, long c) {
    if (B)
        for (long r = 0; r < R; ++r) memcpy(Z + (size_t)r * c, B, (size_t)c * sizeof(float));
    et_sgemm(0, 1, (int)R, (int)c, (int)K, H, (int)K, Wc, (int)K, B ? 1.f : 0.f, Z, (int)c);
}

static __attribute__((noinline, unused)) float et_linear_ce_blas(const float *H, const float *W, const int8_t *wq,
                                                                 const float *scale, int bits, int group,
                                                                 const float *B, const void *lab, int lab64, long R,
                                                                 long K, long V, long C, int64_t ignore) {
    const long count = et_lm_count(lab, lab64, R, V, ignore);
    float *Z = et_scratch(ET_LM_LOGITS_SLOT, (size_t)(R > 0 ? R : 1) * C);
    double *st = (double *)et_scratch(ET_LM_STATS_SLOT, (size_t)4 * (R > 0 ? R : 1));
    if (!Z || !st) return 0.f;
    double total = 0.0;
    for (long v0 = 0; v0 < V; v0 += C) {
        const long c = V - v0 < C ? V - v0 : C;
        const float *Wc = et_lm_chunk_w_f(W, wq, scale, bits, group, v0, c, K);
        if (!Wc) return 0.f;
        et_lm_gemm_f(H, Wc, B ? B + v0 : 0, Z, R, K, c);
        for (long r = 0; r < R; ++r) {
            const int64_t y = et_lm_label(lab, lab64, r, V, ignore);
            if (y < 0) continue;
            const float *z = Z + (size_t)r * c;
            float mz = z[0];
            for (long j = 1; j < c; ++j) mz = z[j] > mz ? z[j] : mz;
            double m = st[2 * r], s = st[2 * r + 1];
            const double mn = v0 == 0 || mz > m ? (double)mz : m;
            s = v0 == 0 ? 0.0 : s * et_exp(m - mn);
            for (long j = 0; j < c; ++j) s += et_exp((double)z[j] - mn);
            st[2 * r] = mn;
            st[2 * r + 1] = s;
            if (y >= v0 && y < v0 + c) total -= (double)z[y - v0];
        }
    }
    for (long r = 0; r < R; ++r)
        if (et_lm_label(lab, lab64, r, V, ignore) >= 0) total += st[2 * r] + et_log(st[2 * r + 1]);
    return (float)(total / (double)count);
}
#endif /* ET_BLAS */

#define ET_LM_T float
#define ET_LM(name) name##_f
#define ET_LM_IS_FLOAT 1
#include "et_float_lmloss.h"
#undef ET_LM_T
#undef ET_LM
#undef ET_LM_IS_FLOAT
#define ET_LM_T double
#define ET_LM(name) name##_d
#define ET_LM_IS_FLOAT 0
#include "et_float_lmloss.h"
#undef ET_LM_T
#undef ET_LM
#undef ET_LM_IS_FLOAT

#elif defined(ET_LM_T) /* ---- the kernels, for element type ET_LM_T ---------------------------- */

/* elements [k0, k1) of weight row v: a pointer into W, or dequantized into buf */
static inline const ET_LM_T *ET_LM(et_lm_span)(const ET_LM_T *W, const int8_t *wq, const float *scale, int bits,
                                               int group, long v, long k0, long k1, long K, ET_LM_T *buf) {
    if (W) return W + (size_t)v * K + k0;
    ET_LM(et_qw_span)(buf, wq, scale, v, k0, k1, K, bits, group);
    return buf;
}

/* Z (R, c) = H W_c^T (+ B_c) for vocabulary rows [v0, v0 + c), a weight row span at a time */
static inline void ET_LM(et_lm_logits)(const ET_LM_T *H, const ET_LM_T *W, const int8_t *wq, const float *scale,
                                       int bits, int group, const ET_LM_T *B, ET_LM_T *Z, long R, long K, long v0,
                                       long c) {
#if defined(ET_BLAS) && ET_LM_IS_FLOAT
    const float *Wc = et_lm_chunk_w_f(W, wq, scale, bits, group, v0, c, K);
    if (Wc) et_lm_gemm_f(H, Wc, B ? B + v0 : 0, Z, R, K, c);
#else
    ET_LM_T buf[ET_QW_CHUNK];
    for (long r = 0; r < R; ++r)
        for (long j = 0; j < c; ++j) Z[(size_t)r * c + j] = 0;
    for (long j = 0; j < c; ++j)
        for (long k0 = 0; k0 < K; k0 += ET_QW_CHUNK) {
            const long k1 = K - k0 < ET_QW_CHUNK ? K : k0 + ET_QW_CHUNK;
            const ET_LM_T *w = ET_LM(et_lm_span)(W, wq, scale, bits, group, v0 + j, k0, k1, K, buf);
            for (long r = 0; r < R; ++r) {
                const ET_LM_T *h = H + (size_t)r * K + k0;
                ET_LM_T acc = Z[(size_t)r * c + j];
                for (long k = 0; k < k1 - k0; ++k) acc += h[k] * w[k];
                Z[(size_t)r * c + j] = acc;
            }
        }
    if (B)
        for (long r = 0; r < R; ++r)
            for (long j = 0; j < c; ++j) Z[(size_t)r * c + j] += B[v0 + j];
#endif
}

/* DH (R, K) += Z (R, c) W_c, W_c the weight rows [v0, v0 + c), a span of a row at a time (the
 * portable kernels' GEMM; the BLAS build multiplies the whole chunk) */
static inline void ET_LM(et_lm_dh_add)(const ET_LM_T *Z, const ET_LM_T *W, const int8_t *wq, const float *scale,
                                       int bits, int group, ET_LM_T *DH, long R, long K, long v0, long c) {
    ET_LM_T buf[ET_QW_CHUNK];
    for (long j = 0; j < c; ++j)
        for (long k0 = 0; k0 < K; k0 += ET_QW_CHUNK) {
            const long k1 = K - k0 < ET_QW_CHUNK ? K : k0 + ET_QW_CHUNK;
            const ET_LM_T *w = ET_LM(et_lm_span)(W, wq, scale, bits, group, v0 + j, k0, k1, K, buf);
            for (long r = 0; r < R; ++r) {
                const ET_LM_T pj = Z[(size_t)r * c + j];
                ET_LM_T *dh = DH + (size_t)r * K + k0;
                for (long k = 0; k < k1 - k0; ++k) dh[k] += pj * w[k];
            }
        }
}

/* the mean cross entropy of the logits H W^T (+ B) against the labels */
static inline ET_LM_T ET_LM(et_linear_ce)(const ET_LM_T *H, const ET_LM_T *W, const int8_t *wq, const float *scale,
                                          int bits, int group, const ET_LM_T *B, const void *lab, int lab64, long R,
                                          long K, long V, long C, int64_t ignore) {
#if defined(ET_BLAS) && ET_LM_IS_FLOAT
    return et_linear_ce_blas(H, W, wq, scale, bits, group, B, lab, lab64, R, K, V, C, ignore);
#else
    (void)C;
    const long count = et_lm_count(lab, lab64, R, V, ignore);
    ET_LM_T buf[ET_QW_CHUNK];
    double total = 0.0;
    for (long r = 0; r < R; ++r) {
        const int64_t y = et_lm_label(lab, lab64, r, V, ignore);
        if (y < 0) continue;
        const ET_LM_T *h = H + (size_t)r * K;
        double m = 0.0, s = 0.0;
        for (long v = 0; v < V; ++v) {
            ET_LM_T z = 0;
            for (long k0 = 0; k0 < K; k0 += ET_QW_CHUNK) {
                const long k1 = K - k0 < ET_QW_CHUNK ? K : k0 + ET_QW_CHUNK;
                const ET_LM_T *w = ET_LM(et_lm_span)(W, wq, scale, bits, group, v, k0, k1, K, buf);
                for (long k = 0; k < k1 - k0; ++k) z += h[k0 + k] * w[k];
            }
            if (B) z += B[v];
            if (v == 0 || (double)z > m) { /* a new max: the sum so far rescaled */
                s = v == 0 ? 1.0 : s * et_exp(m - (double)z) + 1.0;
                m = (double)z;
            } else {
                s += et_exp((double)z - m);
            }
            if (v == y) total -= (double)z;
        }
        total += m + et_log(s);
    }
    return (ET_LM_T)(total / (double)count);
#endif
}

/* DH alone (a frozen head) in one sweep, as online softmax attention computes its output: per
 * chunk, each row's new max m', alpha = exp(m - m'), Z = exp(z - m'), ST's sum s = s alpha + the
 * sum of Z, DH = DH alpha (rows whose max grew) + Z W_c; at the end DH = (DH / s - W[label]) k on
 * counted rows (k = g / count), 0 on the others. *total gets sum(max + log s - the label's
 * logit) over counted rows. ops/lmloss.py's _one_sweep computes the same. */
static inline void ET_LM(et_linear_ce_grad_h)(double k, const ET_LM_T *H, const ET_LM_T *W, const int8_t *wq,
                                              const float *scale, int bits, int group, const ET_LM_T *B,
                                              const void *lab, int lab64, ET_LM_T *DH, ET_LM_T *Z, ET_LM_T *ST,
                                              double *total, long R, long K, long V, long C, int64_t ignore) {
    for (size_t i = 0; i < (size_t)R * K; ++i) DH[i] = 0;
    for (long v0 = 0; v0 < V; v0 += C) {
        const long c = V - v0 < C ? V - v0 : C;
#if defined(ET_BLAS) && ET_LM_IS_FLOAT
        const float *Wc = et_lm_chunk_w_f(W, wq, scale, bits, group, v0, c, K); /* dequantized once a chunk */
        if (!Wc) return;
        et_lm_gemm_f(H, Wc, B ? B + v0 : 0, Z, R, K, c);
#else
        ET_LM(et_lm_logits)(H, W, wq, scale, bits, group, B, Z, R, K, v0, c);
#endif
        for (long r = 0; r < R; ++r) {
            ET_LM_T *z = Z + (size_t)r * c;
            const int64_t y = et_lm_label(lab, lab64, r, V, ignore);
            if (y >= v0 && y < v0 + c) *total -= (double)z[y - v0];
            ET_LM_T mz = z[0];
            for (long j = 1; j < c; ++j) mz = z[j] > mz ? z[j] : mz;
            const double m = (double)ST[2 * r];
            const double mn = v0 == 0 || (double)mz > m ? (double)mz : m;
            const double alpha = v0 == 0 ? 0.0 : et_exp(m - mn);
            double s = 0.0;
            for (long j = 0; j < c; ++j) {
                z[j] = (ET_LM_T)et_exp((double)z[j] - mn);
                s += (double)z[j];
            }
            ST[2 * r] = (ET_LM_T)mn;
            ST[2 * r + 1] = (ET_LM_T)((v0 == 0 ? 0.0 : (double)ST[2 * r + 1] * alpha) + s);
            if (v0 > 0 && mn != m) {
                const ET_LM_T a = (ET_LM_T)alpha;
                ET_LM_T *dh = DH + (size_t)r * K;
                for (long kk = 0; kk < K; ++kk) dh[kk] *= a;
            }
        }
#if defined(ET_BLAS) && ET_LM_IS_FLOAT
        et_sgemm(0, 0, (int)R, (int)K, (int)c, Z, (int)c, Wc, (int)K, 1.f, DH, (int)K);
#else
        ET_LM(et_lm_dh_add)(Z, W, wq, scale, bits, group, DH, R, K, v0, c);
#endif
    }
    ET_LM_T buf[ET_QW_CHUNK];
    for (long r = 0; r < R; ++r) {
        ET_LM_T *dh = DH + (size_t)r * K;
        const int64_t y = et_lm_label(lab, lab64, r, V, ignore);
        if (y < 0) {
            for (long kk = 0; kk < K; ++kk) dh[kk] = 0;
            continue;
        }
        const double s = (double)ST[2 * r + 1];
        *total += (double)ST[2 * r] + et_log(s);
        for (long k0 = 0; k0 < K; k0 += ET_QW_CHUNK) {
            const long k1 = K - k0 < ET_QW_CHUNK ? K : k0 + ET_QW_CHUNK;
            const ET_LM_T *w = ET_LM(et_lm_span)(W, wq, scale, bits, group, y, k0, k1, K, buf);
            for (long kk = 0; kk < k1 - k0; ++kk)
                dh[k0 + kk] = (ET_LM_T)(((double)dh[k0 + kk] / s - (double)w[kk]) * k);
        }
    }
}

/* DH, DW, DB (each null when not wanted) of the loss above scaled by g; Z (R, C) and ST (R, 2):
 * the scratch the two sweeps write; LOSS (null: not wanted): the loss itself, from the first
 * sweep's max and sum of exp as ST keeps them (the op's attr with_loss) */
static inline void ET_LM(et_linear_ce_grad)(ET_LM_T g, const ET_LM_T *H, const ET_LM_T *W, const int8_t *wq,
                                            const float *scale, int bits, int group, const ET_LM_T *B,
                                            const void *lab, int lab64, ET_LM_T *DH, ET_LM_T *DW, ET_LM_T *DB,
                                            ET_LM_T *Z, ET_LM_T *ST, ET_LM_T *LOSS, long R, long K, long V, long C,
                                            int64_t ignore) {
    const long count = et_lm_count(lab, lab64, R, V, ignore);
    const double scale_g = count ? (double)g / (double)count : 0.0;
    double total = 0.0; /* minus the labels' logits, then plus each counted row's max + log(sum) */
    if (DH && !DW && !DB) {
        ET_LM(et_linear_ce_grad_h)(scale_g, H, W, wq, scale, bits, group, B, lab, lab64, DH, Z, ST, &total, R, K,
                                   V, C, ignore);
        if (LOSS) *LOSS = (ET_LM_T)(total / (double)count);
        return;
    }
    for (long v0 = 0; v0 < V; v0 += C) { /* sweep 1: each row's max and sum of exp */
        const long c = V - v0 < C ? V - v0 : C;
        ET_LM(et_lm_logits)(H, W, wq, scale, bits, group, B, Z, R, K, v0, c);
        for (long r = 0; r < R; ++r) {
            const ET_LM_T *z = Z + (size_t)r * c;
            if (LOSS) {
                const int64_t y = et_lm_label(lab, lab64, r, V, ignore);
                if (y >= v0 && y < v0 + c) total -= (double)z[y - v0];
            }
            ET_LM_T mz = z[0];
            for (long j = 1; j < c; ++j) mz = z[j] > mz ? z[j] : mz;
            const double m = (double)ST[2 * r];
            const double mn = v0 == 0 || (double)mz > m ? (double)mz : m;
            double s = v0 == 0 ? 0.0 : (double)ST[2 * r + 1] * et_exp(m - mn);
            for (long j = 0; j < c; ++j) s += et_exp((double)z[j] - mn);
            ST[2 * r] = (ET_LM_T)mn;
            ST[2 * r + 1] = (ET_LM_T)s;
        }
    }
    if (LOSS) {
        for (long r = 0; r < R; ++r)
            if (et_lm_label(lab, lab64, r, V, ignore) >= 0) total += (double)ST[2 * r] + et_log((double)ST[2 * r + 1]);
        *LOSS = (ET_LM_T)(total / (double)count);
    }
    if (DH)
        for (size_t i = 0; i < (size_t)R * K; ++i) DH[i] = 0;
    for (long v0 = 0; v0 < V; v0 += C) { /* sweep 2: P, then the chunk's gradients */
        const long c = V - v0 < C ? V - v0 : C;
        ET_LM(et_lm_logits)(H, W, wq, scale, bits, group, B, Z, R, K, v0, c);
        for (long r = 0; r < R; ++r) {
            ET_LM_T *p = Z + (size_t)r * c;
            const int64_t y = et_lm_label(lab, lab64, r, V, ignore);
            if (y < 0) {
                for (long j = 0; j < c; ++j) p[j] = 0;
                continue;
            }
            const double m = (double)ST[2 * r], s = (double)ST[2 * r + 1];
            for (long j = 0; j < c; ++j)
                p[j] = (ET_LM_T)((et_exp((double)p[j] - m) / s - (v0 + j == y ? 1.0 : 0.0)) * scale_g);
        }
        if (DB)
            for (long j = 0; j < c; ++j) {
                double t = 0.0;
                for (long r = 0; r < R; ++r) t += (double)Z[(size_t)r * c + j];
                DB[v0 + j] = (ET_LM_T)t;
            }
#if defined(ET_BLAS) && ET_LM_IS_FLOAT
        if (DH) {
            const float *Wc = et_lm_chunk_w_f(W, wq, scale, bits, group, v0, c, K);
            if (!Wc) return;
            et_sgemm(0, 0, (int)R, (int)K, (int)c, Z, (int)c, Wc, (int)K, 1.f, DH, (int)K);
        }
        if (DW) et_sgemm(1, 0, (int)c, (int)K, (int)R, Z, (int)c, H, (int)K, 0.f, DW + (size_t)v0 * K, (int)K);
#else
        if (DH) ET_LM(et_lm_dh_add)(Z, W, wq, scale, bits, group, DH, R, K, v0, c);
        if (DW)
            for (long j = 0; j < c; ++j) {
                ET_LM_T *dw = DW + (size_t)(v0 + j) * K;
                for (long k = 0; k < K; ++k) dw[k] = 0;
                for (long r = 0; r < R; ++r) {
                    const ET_LM_T pj = Z[(size_t)r * c + j];
                    const ET_LM_T *h = H + (size_t)r * K;
                    for (long k = 0; k < K; ++k) dw[k] += pj * h[k];
                }
            }
#endif
    }
}

#endif
