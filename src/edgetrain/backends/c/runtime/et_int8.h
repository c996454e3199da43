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
#include "et_common.h"         /* ET_PARALLEL_FOR2: the host's threads */
#include "et_int8_core.h"      /* fixed point, the counter hash, operands, a qconv2d layer and its output rows */
#include "et_int8_scales.h"    /* the per-channel float32 factors of the backward and updates */
#include "et_int8_dsp.h"       /* on the Cortex-M DSP extension (else empty): GEMM columns, requantization, */
#include "et_int8_gemm.h"      /* the GEMM's rows and driver, */
#include "et_int8_dw.h"        /* depthwise: the fast paths of et_qconv_rows, et_qadd, et_qmask_pack */
#include "et_int8_rv32.h"      /* on RV32 (else empty): pointwise, depthwise, dense rows in registers */
#include "et_int8_rvv.h"       /* on RISC-V's vector extension (else empty): pointwise and depthwise rows */
#include "et_int8_pool.h"      /* int8 pooling and concatenation (ops/qpool.py) */

/* Output rows [r0, r1) of output channels [o0, o1) of a qconv2d. y (int8) or yf (float32,
 * float_out) is addressed like x: row ho of channel o of image n at
 * base + n*nstride + (o - yo_off)*cstride + (ho % cap)*wo; input channel k is channel
 * k - xc_off of x (a buffer holding some channels only); the weight, bias, mult, shift and
 * out_scale are indexed by the absolute output channel o. The output column range of each
 * tap column is computed once per call (ET_COL_TAPS columns at most, else per tap). */
#define ET_COL_TAPS 16
/* On a host-class CPU (x86, aarch64: wide vectors, flash no concern), a dense pointwise layer's rows
 * (1x1, stride 1, no padding) run ET_HOST_OB output channels at a time over runs of up to
 * ET_HOST_PLANE outputs that lie one after another in x's and y's rings: 16 outputs of the block's
 * channels at a time, their sums in vector registers over all input channels, each input byte loaded
 * once for the block. The sums are the generic path's (exact int32: any order gives the same
 * integers); the microcontrollers keep their own paths and their flash. */
#if defined(__x86_64__) || defined(__i386__) || defined(__aarch64__)
#define ET_INT8_HOST_PW 1
#define ET_HOST_OB 8
#define ET_HOST_PLANE 256
#define ET_HOST_PW_CG 1024 /* input channels at most: the block's weights as int32 on the stack */
static inline int et_qconv_host_pw_ok(const et_qconv_p *P) {
    return P->kh == 1 && P->kw == 1 && P->sh == 1 && P->sw == 1 && P->ph == 0 && P->pw == 0 && P->groups == 1 &&
           P->w == P->wo && P->h == P->ho && P->wo <= ET_HOST_PLANE && P->cg <= ET_HOST_PW_CG;
}
/* 16 int8 and 16 int32 lanes (GCC's vector extension; the loads need no alignment) */
typedef int8_t et_v16b __attribute__((vector_size(16), aligned(1)));
typedef int32_t et_v16i __attribute__((vector_size(64), aligned(4)));
/* *r = the 16 int8 lanes of v sign-extended to int32 (lane k to lane k). GCC 12 lowers
 * __builtin_convertvector of a vector it loaded from memory to a byte at a time (16 loads and
 * inserts), so the widening is the instruction made for it where there is one. (Results through a
 * pointer: a function that returned a 64-byte vector would change its ABI without AVX-512.) */
/* the host-only helpers below: always inlined into their callers (not `ET_INLINE`, which marks a kernel that
 * kernel_lib.py compiles out of line; et_float_blas.h's ET_HOST_INLINE, the same for the float kernels) */
#define ET_ALWAYS_INLINE static inline __attribute__((always_inline))
#if defined(__AVX512F__)
#include <immintrin.h>
ET_ALWAYS_INLINE void et_widen16(et_v16i *r, et_v16b v) { *r = (et_v16i)_mm512_cvtepi8_epi32((__m128i)v); }
#elif defined(__AVX2__)
#include <immintrin.h>
ET_ALWAYS_INLINE void et_widen16(et_v16i *r, et_v16b v) {
    const __m256i lo = _mm256_cvtepi8_epi32((__m128i)v), hi = _mm256_cvtepi8_epi32(_mm_srli_si128((__m128i)v, 8));
    memcpy(r, &lo, 32);
    memcpy((char *)r + 32, &hi, 32);
}
#elif defined(__aarch64__)
#include <arm_neon.h>
ET_ALWAYS_INLINE void et_widen16(et_v16i *r, et_v16b v) {
    int8x16_t b;
    memcpy(&b, &v, 16);
    const int16x8_t l = vmovl_s8(vget_low_s8(b)), h = vmovl_high_s8(b);
    const int32x4_t q[4] = {vmovl_s16(vget_low_s16(l)), vmovl_high_s16(l), vmovl_s16(vget_low_s16(h)),
                            vmovl_high_s16(h)};
    memcpy(r, q, 64);
}
#else
ET_ALWAYS_INLINE void et_widen16(et_v16i *r, et_v16b v) { *r = __builtin_convertvector(v, et_v16i); }
#endif
/* the same for the 16 bytes at p (any alignment) */
ET_ALWAYS_INLINE void et_load16(et_v16i *r, const int8_t *p) {
#if defined(__AVX512F__) || defined(__AVX2__)
    et_widen16(r, (et_v16b)_mm_loadu_si128((const __m128i *)p));
#else
    et_v16b v;
    memcpy(&v, p, 16);
    et_widen16(r, v);
#endif
}

/* the same for the 16 int16 at p */
ET_ALWAYS_INLINE void et_load16h(et_v16i *r, const int16_t *p) {
#if defined(__AVX512F__)
    *r = (et_v16i)_mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i *)p));
#elif defined(__AVX2__)
    const __m256i lo = _mm256_cvtepi16_epi32(_mm_loadu_si128((const __m128i *)p));
    const __m256i hi = _mm256_cvtepi16_epi32(_mm_loadu_si128((const __m128i *)(p + 8)));
    memcpy(r, &lo, 32);
    memcpy((char *)r + 32, &hi, 32);
#elif defined(__aarch64__)
    const int16x8_t l = vld1q_s16(p), h = vld1q_s16(p + 8);
    const int32x4_t q[4] = {vmovl_s16(vget_low_s16(l)), vmovl_high_s16(l), vmovl_s16(vget_low_s16(h)),
                            vmovl_high_s16(h)};
    memcpy(r, q, 64);
#else
    typedef int16_t v16h __attribute__((vector_size(32)));
    v16h v;
    memcpy(&v, p, 32);
    *r = __builtin_convertvector(v, et_v16i);
#endif
}

/* a phase plane's row of a stride-2 layer: pr[q] = xq[2 q] - xz for q in [lo, hi) (values in
 * [-255, 255]), 16 at a time: the even bytes of 32 taken by one shuffle and widened to int16. A row of
 * 17 or more ends with the 16 elements [hi - 16, hi) again, their 32 bytes read from one byte earlier
 * (the odd ones taken), so that nothing past xq[2 (hi - 1)] is read; a shorter row goes a byte at a
 * time. */
typedef int8_t et_v16m __attribute__((vector_size(16)));
typedef int16_t et_v16h __attribute__((vector_size(32), aligned(2)));
/* pr[0..16) = the 16 int8 lanes of e widened to int16, less xz */
static inline __attribute__((always_inline)) void et_widen16w(int16_t *pr, et_v16b e, int32_t xz) {
#if defined(__AVX2__)
    et_v16h v = (et_v16h)_mm256_cvtepi8_epi16((__m128i)e);
#elif defined(__aarch64__)
    int8x16_t eb;
    memcpy(&eb, &e, 16);
    const int16x8_t h2[2] = {vmovl_s8(vget_low_s8(eb)), vmovl_high_s8(eb)};
    et_v16h v;
    memcpy(&v, h2, 32);
#else
    et_v16h v = __builtin_convertvector(e, et_v16h);
#endif
    v -= (int16_t)xz;
    memcpy(pr, &v, sizeof v);
}
static inline __attribute__((always_inline)) void et_phase2_group(int16_t *pr, const int8_t *src, int32_t xz,
                                                                  const int odd) {
    et_v16b a, b;
    memcpy(&a, src, 16);
    memcpy(&b, src + 16, 16);
    const et_v16b e = odd ? __builtin_shuffle(a, b, (et_v16m){1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31})
                          : __builtin_shuffle(a, b, (et_v16m){0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30});
    et_widen16w(pr, e, xz);
}
/* the same at stride 1: pr[q] = xq[q] - xz, a row of 16 or more in groups of 16 bytes, the last
 * group [hi - 16, hi) overlapping the one before */
static inline __attribute__((always_inline)) void et_phase1_group(int16_t *pr, const int8_t *src, int32_t xz) {
    et_v16b e;
    memcpy(&e, src, 16);
    et_widen16w(pr, e, xz);
}
static inline void et_phase1_row(int16_t *pr, const int8_t *xq, int32_t lo, int32_t hi, int32_t xz) {
    if (hi - lo < 16) {
        for (int32_t q = lo; q < hi; q++) pr[q] = (int16_t)((int32_t)xq[q] - xz);
        return;
    }
    for (int32_t q = lo; q + 16 < hi; q += 16) et_phase1_group(pr + q, xq + q, xz);
    et_phase1_group(pr + hi - 16, xq + hi - 16, xz);
}
static inline void et_phase2_row(int16_t *pr, const int8_t *xq, int32_t lo, int32_t hi, int32_t xz) {
    if (hi - lo < 17) {
        for (int32_t q = lo; q < hi; q++) pr[q] = (int16_t)((int32_t)xq[2 * q] - xz);
        return;
    }
    for (int32_t q = lo; q + 16 < hi; q += 16) et_phase2_group(pr + q, xq + 2 * q, xz, 0); /* reads to xq[2q + 31] */
    et_phase2_group(pr + hi - 16, xq + 2 * (hi - 16) - 1, xz, 1);
}

/* the end of a run of rows from h0 (before r1, at most `rows`) that wraps in neither ring */
static inline int32_t et_host_run_end(int32_t h0, int32_t r1, int32_t rows, int32_t xcap, int32_t ycap) {
    int32_t h1 = h0 + rows < r1 ? h0 + rows : r1;
    const int32_t xe = h0 + xcap - et_ring(h0, xcap), ye = h0 + ycap - et_ring(h0, ycap);
    if (h1 > xe) h1 = xe;
    return h1 > ye ? ye : h1;
}

__attribute__((unused)) static void et_qconv_host_pw(const et_qconv_p *P, et_rows8 x, int32_t xc_off, const et_w8 *w,
                                                     const int32_t *bias, et_rows8 y, float *yf, int32_t yo_off,
                                                     int32_t r0, int32_t r1, int32_t o0, int32_t o1) {
    const int32_t wo = P->wo, rows = ET_HOST_PLANE / wo, cg = P->cg, xz = P->x_zero;
    const int32_t nb = (o1 - o0 + ET_HOST_OB - 1) / ET_HOST_OB;
    /* the host's threads: one (image, block of output channels) per iteration, its sums in one thread */
    ET_PARALLEL_FOR2((double)P->n * (o1 - o0) * (r1 - r0) * wo * cg)
    for (int32_t n = 0; n < P->n; n++)
        for (int32_t b = 0; b < nb; b++) {
            const int32_t ob = o0 + b * ET_HOST_OB, k = o1 - ob < ET_HOST_OB ? o1 - ob : ET_HOST_OB;
            int32_t acc[ET_HOST_OB][ET_HOST_PLANE], wt[ET_HOST_PW_CG][ET_HOST_OB];
            /* the block's weights, channel by channel (0 in the rows a block of fewer channels does not write) */
            for (int32_t c = 0; c < cg; c++)
                for (int32_t t = 0; t < ET_HOST_OB; t++) wt[c][t] = t < k ? *et_w8_taps(w, ob + t, c, cg, 1) : 0;
            for (int32_t h0 = r0, h1; h0 < r1; h0 = h1) {
                h1 = et_host_run_end(h0, r1, rows, x.cap, y.cap);
                const int32_t m = (h1 - h0) * wo;
                const int8_t *xb = x.p + n * x.nstride - xc_off * x.cstride + et_ring(h0, x.cap) * wo;
                int32_t q0 = 0;
                /* 16 outputs of every channel of the block at a time, their sums in registers over
                 * the input channels */
                for (; q0 + 16 <= m; q0 += 16) {
                    et_v16i a[ET_HOST_OB];
#pragma GCC unroll 8
                    for (int32_t t = 0; t < ET_HOST_OB; t++) a[t] = (et_v16i){0};
                    for (int32_t c = 0; c < cg; c++) {
                        et_v16i v;
                        et_load16(&v, xb + c * x.cstride + q0);
                        v -= xz;
#pragma GCC unroll 8
                        for (int32_t t = 0; t < ET_HOST_OB; t++) a[t] += wt[c][t] * v;
                    }
#pragma GCC unroll 8
                    for (int32_t t = 0; t < ET_HOST_OB; t++) *(et_v16i *)(acc[t] + q0) = a[t];
                }
                /* the rest of the outputs, channel by channel */
                for (int32_t t = 0; t < ET_HOST_OB; t++)
                    for (int32_t q = q0; q < m; q++) acc[t][q] = 0;
                for (int32_t c = 0; c < cg && q0 < m; c++) {
                    const int8_t *xr = xb + c * x.cstride;
                    for (int32_t q = q0; q < m; q++) {
                        const int32_t v = (int32_t)xr[q] - xz;
                        for (int32_t t = 0; t < ET_HOST_OB; t++) acc[t][q] += wt[c][t] * v;
                    }
                }
                /* rows h0..h1 lie one after another in y's ring: one requantized run a channel */
                for (int32_t t = 0; t < k; t++) {
                    const et_qrow out = et_qconv_row(P, y, yf, yo_off, n, ob + t, h0, bias);
                    et_qrow_put_n(&out, 0, acc[t], m);
                }
            }
        }
}

/* A kxk convolution on the host (stride 1 or 2, no dilation; depthwise, dense or grouped): per image
 * and block of output channels, a chunk of output rows at a time, the input rows of the block's cg
 * input channels copied once into s*s phase planes each of (x - x_zero) as int16, zero in the
 * padding: plane (c, a, b) holds channel c's padded row r*s + a, column q*s + b, so that tap (i, j)
 * of output (ho, wo) reads plane (c, i % s, j % s) at row ho + i / s, column wo + j / s. A plane is
 * WP = wo + (kw - 1) / s columns wide, and each (channel, tap, output channel) is one long loop over
 * the chunk's rows as one flat row of WP columns (the last (kw - 1) / s of each row are not outputs
 * and are not stored). A dense layer's blocks hold ET_HOST_KB output channels, which share the
 * planes; a depthwise or grouped layer's one. The int32 sums are the generic path's: exact, in any
 * order. */
#define ET_HOST_KX_OUT 2048  /* sums of a chunk (its rows x WP) for each output channel */
#define ET_HOST_KX_BUF 12288 /* int16 of a chunk's phase planes */
#define ET_HOST_KB 4
#define ET_HOST_KX_TAPS 512 /* (input channel, tap) pairs at most for the sums in registers below */
/* A chunk's sums, 16 outputs at a time in vector registers over every (input channel, tap) pair tp
 * of the block: acc[t][q] = sum over tp of wt[tp][t] * pl[toff[tp] + q], for the block's k output
 * channels (wt 0 past k). Exact int32 sums, so the order is free; each sum is stored once. */
static inline __attribute__((always_inline)) void et_host_kx_sums_k(const int16_t *pl, const int32_t *toff,
                                                                   const int32_t (*wt)[ET_HOST_KB], int32_t ntap,
                                                                   int32_t k, int32_t m,
                                                                   int32_t (*acc)[ET_HOST_KX_OUT], const int kk) {
    int32_t q = 0;
    for (; q + 16 <= m; q += 16) {
        et_v16i a[ET_HOST_KB];
#pragma GCC unroll 4
        for (int32_t t = 0; t < kk; t++) a[t] = (et_v16i){0};
        for (int32_t tp = 0; tp < ntap; tp++) {
            et_v16i v;
            et_load16h(&v, pl + toff[tp] + q);
#pragma GCC unroll 4
            for (int32_t t = 0; t < kk; t++) a[t] += wt[tp][t] * v;
        }
#pragma GCC unroll 4
        for (int32_t t = 0; t < kk; t++)
            if (t < k) memcpy(acc[t] + q, &a[t], sizeof a[t]);
    }
    for (; q < m; q++)
        for (int32_t t = 0; t < k; t++) {
            int32_t sum = 0;
            for (int32_t tp = 0; tp < ntap; tp++) sum += wt[tp][t] * (int32_t)pl[toff[tp] + q];
            acc[t][q] = sum;
        }
}
__attribute__((noinline)) static void et_host_kx_sums(const int16_t *pl, const int32_t *toff,
                                                      const int32_t (*wt)[ET_HOST_KB], int32_t ntap, int32_t k,
                                                      int32_t m, int32_t (*acc)[ET_HOST_KX_OUT]) {
    if (k == 1) et_host_kx_sums_k(pl, toff, wt, ntap, 1, m, acc, 1);
    else et_host_kx_sums_k(pl, toff, wt, ntap, k, m, acc, ET_HOST_KB);
}
static inline int32_t et_host_kx_wp(const et_qconv_p *P) { return P->wo + (P->kw - 1) / P->sw; }
/* the chunk's output rows: its sums and its planes (one more row than the taps read) within bounds */
static inline int32_t et_host_kx_rows(const et_qconv_p *P) {
    const int32_t s = P->sh, wp = et_host_kx_wp(P), by_out = ET_HOST_KX_OUT / wp;
    const int32_t by_buf = ET_HOST_KX_BUF / (P->cg * s * s * wp) - (P->kh - 1) / s - 1;
    return by_out < by_buf ? by_out : by_buf;
}
static inline int et_qconv_host_kx_ok(const et_qconv_p *P) {
    return P->sh == P->sw && (P->sh == 1 || P->sh == 2) && P->dh == 1 && P->dw == 1 && P->kh <= 7 && P->kw <= 7 &&
           et_host_kx_wp(P) <= ET_HOST_KX_OUT && et_host_kx_rows(P) >= 1;
}

__attribute__((unused)) static void et_qconv_host_kx(const et_qconv_p *P, et_rows8 x, int32_t xc_off, const et_w8 *w,
                                                     const int32_t *bias, et_rows8 y, float *yf, int32_t yo_off,
                                                     int32_t r0, int32_t r1, int32_t o0, int32_t o1) {
    const int32_t s = P->sh, wp = et_host_kx_wp(P), rows = et_host_kx_rows(P), khkw = P->kh * P->kw;
    const int32_t sl = s - 1; /* s is 1 or 2: / s is >> sl, % s is & sl (no divisions in the loops) */
    const int32_t xz = P->x_zero, wo = P->wo, cg = P->cg, opg = P->o / P->groups;
    const int32_t kb = P->groups == 1 ? ET_HOST_KB : 1, nb = (o1 - o0 + kb - 1) / kb;
    /* the host's threads: one (image, block of output channels) per iteration, its sums in one thread */
    ET_PARALLEL_FOR2((double)P->n * (o1 - o0) * (r1 - r0) * wo * cg * khkw)
    for (int32_t n = 0; n < P->n; n++)
        for (int32_t bk = 0; bk < nb; bk++) {
            const int32_t oa = o0 + bk * kb, k = o1 - oa < kb ? o1 - oa : kb;
            int16_t pl[ET_HOST_KX_BUF];
            int32_t acc[ET_HOST_KB][ET_HOST_KX_OUT];
            const int8_t *xg = x.p + n * x.nstride + ((oa / opg) * cg - xc_off) * x.cstride;
            /* the block's weights by (input channel, tap), for the sums in registers */
            const int32_t ntap = cg * khkw;
            int32_t wt[ET_HOST_KX_TAPS][ET_HOST_KB], toff[ET_HOST_KX_TAPS];
            if (ntap <= ET_HOST_KX_TAPS)
                for (int32_t c = 0; c < cg; c++)
                    for (int32_t e = 0; e < khkw; e++)
                        for (int32_t t = 0; t < ET_HOST_KB; t++)
                            wt[c * khkw + e][t] = t < k ? et_w8_taps(w, oa + t, c, cg, khkw)[e] : 0;
            for (int32_t ha = r0, hb; ha < r1; ha = hb) {
                hb = ha + rows < r1 ? ha + rows : r1;
                const int32_t nr = hb - ha + (P->kh - 1) / s + 1, psize = nr * wp, m = (hb - ha) * wp;
                /* the phase planes: nr rows each (one more than the taps read, for the last row's
                 * columns past WP) */
                for (int32_t c = 0; c < cg; c++)
                    for (int32_t a = 0; a < s; a++)
                        for (int32_t r = 0; r < nr; r++) {
                            const int32_t hi = (ha + r) * s + a - P->ph;
                            const int valid = hi >= 0 && hi < P->h;
                            const int8_t *xr = xg + c * x.cstride + et_ring(valid ? hi : 0, x.cap) * P->w;
                            for (int32_t b = 0; b < s; b++) {
                                int16_t *pr = pl + ((c * s + a) * s + b) * psize + r * wp;
                                /* columns [lo, hi2) read x (q * s + b - pw in [0, w)); the rest are padding */
                                const int32_t lo = P->pw > b ? (P->pw - b + s - 1) >> sl : 0;
                                int32_t hi2 = valid ? (P->w + P->pw - b + s - 1) >> sl : lo;
                                if (hi2 > wp) hi2 = wp;
                                const int8_t *xq = xr + b - P->pw;
                                for (int32_t q = 0; q < lo; q++) pr[q] = 0;
                                if (s == 1)
                                    et_phase1_row(pr, xq, lo, hi2, xz);
                                else
                                    et_phase2_row(pr, xq, lo, hi2, xz);
                                for (int32_t q = hi2 > lo ? hi2 : lo; q < wp; q++) pr[q] = 0;
                            }
                        }
                if (ntap <= ET_HOST_KX_TAPS) {
                    for (int32_t c = 0; c < cg; c++)
                        for (int32_t i = 0; i < P->kh; i++)
                            for (int32_t j = 0; j < P->kw; j++)
                                toff[(c * P->kh + i) * P->kw + j] =
                                    ((c * s + (i & sl)) * s + (j & sl)) * psize + (i >> sl) * wp + (j >> sl);
                    et_host_kx_sums(pl, toff, (const int32_t(*)[ET_HOST_KB])wt, ntap, k, m, acc);
                } else {
                    for (int32_t t = 0; t < k; t++)
                        for (int32_t q = 0; q < m; q++) acc[t][q] = 0;
                    for (int32_t c = 0; c < cg; c++)
                        for (int32_t i = 0; i < P->kh; i++)
                            for (int32_t j = 0; j < P->kw; j++) {
                                const int16_t *src = pl + ((c * s + i % s) * s + j % s) * psize + (i / s) * wp + j / s;
                                for (int32_t t = 0; t < k; t++) {
                                    const int32_t wv = et_w8_taps(w, oa + t, c, cg, khkw)[i * P->kw + j];
                                    if (wv == 0) continue;
                                    int32_t *at = acc[t];
                                    for (int32_t q = 0; q < m; q++) at[q] += wv * (int32_t)src[q];
                                }
                            }
                }
                /* each channel's rows side by side (WP -> wo columns), then one requantized run where
                 * the chunk's rows lie one after another in y's ring, else a row at a time */
                const int32_t run = et_ring_run(ha, hb - 1, y.cap) ? hb - ha : 1;
                for (int32_t t = 0; t < k; t++) {
                    for (int32_t u = 1; u < hb - ha && wp > wo; u++)
                        memmove(acc[t] + u * wo, acc[t] + u * wp, sizeof(int32_t) * (size_t)wo);
                    for (int32_t ho = ha; ho < hb; ho += run) {
                        const et_qrow out = et_qconv_row(P, y, yf, yo_off, n, oa + t, ho, bias);
                        et_qrow_put_n(&out, 0, acc[t] + (ho - ha) * wo, run * wo);
                    }
                }
            }
        }
}
#endif

/* et_qconv_rows handed to a target's kernel (the same arguments) */
#define ET_QCONV_ROWS_BY(fn)                                                  \
    do {                                                                      \
        fn(P, x, xc_off, w, bias, y, yf, yo_off, r0, r1, o0, o1);             \
        return;                                                               \
    } while (0)
static inline ET_SMALL_ATTR void et_qconv_rows(const et_qconv_p *P, et_rows8 x, int32_t xc_off, const et_w8 *w,
                                               const int32_t *bias, et_rows8 y, float *yf, int32_t yo_off,
                                               int32_t r0, int32_t r1, int32_t o0, int32_t o1) {
#if defined(__ARM_FEATURE_DSP)
    if (et_qconv_dw_ok(P)) ET_QCONV_ROWS_BY(et_qconv_dw_rows);
    if (et_qconv_gemm_ok(P, w)) ET_QCONV_ROWS_BY(et_qconv_gemm_rows);
#endif
#if defined(__riscv_vector)
    if (et_rvv_dw_ok(P)) ET_QCONV_ROWS_BY(et_rvv_dw_rows);
    if (et_rvv_pw_ok(P, w)) ET_QCONV_ROWS_BY(et_rvv_pw_rows);
#endif
#if defined(__riscv)
    if (et_qconv_dwp_ok(P)) ET_QCONV_ROWS_BY(et_qconv_dwp_rows);
    if (et_qconv_pw_ok(P, w)) ET_QCONV_ROWS_BY(et_qconv_pw_rows);
    if (et_qconv_kxk_ok(P, w)) ET_QCONV_ROWS_BY(et_qconv_kxk_rows);
#endif
#if defined(ET_INT8_HOST_PW)
    if (et_qconv_host_pw_ok(P)) ET_QCONV_ROWS_BY(et_qconv_host_pw);
    if (et_qconv_host_kx_ok(P)) ET_QCONV_ROWS_BY(et_qconv_host_kx);
#endif
    const int32_t opg = P->o / P->groups, khkw = P->kh * P->kw;
    int32_t col_lo[ET_COL_TAPS], col_hi[ET_COL_TAPS];
    for (int32_t j = 0; j < P->kw && j < ET_COL_TAPS; j++) et_col_range(P, j, &col_lo[j], &col_hi[j]);
    /* the host's threads (et_common.h): one (image, output channel) per iteration, its sums in one thread */
    ET_PARALLEL_FOR2((double)P->n * (o1 - o0) * (r1 - r0) * P->wo * P->cg * khkw)
    for (int32_t n = 0; n < P->n; n++)
        for (int32_t o = o0; o < o1; o++) {
            int32_t acc[ET_ACC_BLOCK];
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
#if defined(ET_INT8_HOST_PW) /* stride 2 as a constant: GCC vectorizes it on the host, not a variable stride */
                                else if (P->sw == 2)
                                    for (int32_t q = lo; q < hi2; q++)
                                        acc[q - b0] += wv * ((int32_t)xp[2 * q] - P->x_zero);
#endif
                                else
                                    for (int32_t q = lo; q < hi2; q++)
                                        acc[q - b0] += wv * ((int32_t)xp[q * P->sw] - P->x_zero);
                            }
                        }
                    }
                    const et_qrow out = et_qconv_row(P, y, yf, yo_off, n, o, ho, bias);
                    et_qrow_put_n(&out, b0, acc, b1 - b0);
                }
        }
}

#undef ET_QCONV_ROWS_BY

static inline et_rows8 et_whole8(const void *p, int32_t c, int32_t h, int32_t w) {
    et_rows8 r = {(int8_t *)p, c * h * w, h * w, h};
    return r;
}

/* A whole layer: x and y whole NCHW tensors (y 0 where the output is float32, at yf), every row and
 * channel. The graphs call it with six words where et_qconv_rows takes twelve and two structs:
 * 40-50 bytes of Cortex-M code less for each of the models' whole-tensor convolutions. */
__attribute__((noinline, unused)) static ET_SMALL_ATTR void et_qconv_whole(const et_qconv_p *P, const int8_t *x,
                                                                           const et_w8 *w, const int32_t *bias,
                                                                           int8_t *y, float *yf) {
    et_qconv_rows(P, et_whole8(x, P->c, P->h, P->w), 0, w, bias, et_whole8(y, P->o, P->ho, P->wo), yf, 0, 0, P->ho, 0,
                  P->o);
}
/* et_qconv_whole of a weight stored whole (kernels/int8_params.py's weight_arg): the et_w8 built here,
 * not at each of the graphs' calls */
__attribute__((noinline, unused)) static ET_SMALL_ATTR void et_qconv_whole_w(const et_qconv_p *P, const int8_t *x,
                                                                             const int8_t *w, const int32_t *bias,
                                                                             int8_t *y, float *yf) {
    const et_w8 W = {w, 0, 0, 0, 0, 0, 0};
    et_qconv_whole(P, x, &W, bias, y, yf);
}

/* qconv2d_pw_dw (kernels/int8.py): g of the pointwise layer's output channels at a time, its rows of
 * those channels into the ring t (cap rows a channel) as far as the depthwise layer's next r output
 * rows read, then those rows; x and y whole tensors. One call where the graph had the loops: 60-90
 * bytes of Cortex-M code less a block. */
__attribute__((noinline, unused)) static ET_SMALL_ATTR void et_qconv_pw_dw(const et_qconv_p *PW, const et_qconv_p *DW,
                                                                           const int8_t *x, const et_w8 *w1,
                                                                           const int32_t *b1, const et_w8 *w2,
                                                                           const int32_t *b2, int8_t *y, int8_t *t,
                                                                           int32_t g, int32_t r) {
    const int32_t c = PW->o, ho = DW->ho, ht = DW->h, wt = DW->w, sh = DW->sh;
    const int32_t span = (DW->kh - 1) * DW->dh + 1, cap = (r - 1) * sh + span < ht ? (r - 1) * sh + span : ht;
    const et_rows8 T = {t, g * cap * wt, cap * wt, cap};
    const et_rows8 X = et_whole8(x, PW->c, PW->h, PW->w), Y = et_whole8(y, DW->o, DW->ho, DW->wo);
    for (int32_t c0 = 0; c0 < c; c0 += g) {
        const int32_t c1 = c0 + g < c ? c0 + g : c;
        int32_t next = 0; /* the pointwise rows computed so far */
        for (int32_t r0 = 0; r0 < ho; r0 += r) {
            const int32_t r1 = r0 + r < ho ? r0 + r : ho;
            int32_t need = (r1 - 1) * sh - DW->ph + span;
            if (need > ht) need = ht;
            if (need > next) {
                et_qconv_rows(PW, X, 0, w1, b1, T, 0, c0, next, need, c0, c1);
                next = need;
            }
            et_qconv_rows(DW, T, c0, w2, b2, Y, 0, 0, r0, r1, c0, c1);
        }
    }
}

/* ---- qadd (TFLite quantized add), one row of all channels or a whole tensor --------------- */
typedef struct {
    int32_t a_zero, b_zero, y_zero, a_mult, a_shift, b_mult, b_shift, y_mult, y_shift, qmin, qmax;
} et_qadd_p;

#if defined(__ARM_FEATURE_DSP)
/* On the DSP extension, in 32 bits (et_qadd_fast, et_int8_dsp.h) when the shifts are right
 * shifts, y's multiplier is above 2^30 and the range is int8's (every qadd of the paper's
 * models); the same integers as below. */
static inline int et_qadd_fast_ok(const et_qadd_p *P) {
    return P->a_shift <= 0 && P->a_shift >= -30 && P->b_shift <= 0 && P->b_shift >= -30 && P->a_mult >= 0 &&
           P->b_mult >= 0 && P->y_shift <= -1 && P->y_shift >= -ET_RQ_MAX_RIGHT && P->y_mult > (1 << 30) &&
           P->qmin == -128 && P->qmax == 127;
}
#endif

static inline ET_SMALL_ATTR void et_qadd(const et_qadd_p *P, const int8_t *a, const int8_t *b, int8_t *y,
                                         int32_t count) {
#if defined(__ARM_FEATURE_DSP)
    if (et_qadd_fast_ok(P)) {
        et_qadd_fast(P->a_zero, P->a_mult, -P->a_shift, P->b_zero, P->b_mult, -P->b_shift, P->y_zero, P->y_mult,
                     -P->y_shift, a, b, y, count);
        return;
    }
#endif
    ET_PARALLEL_FOR(count)
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
#if defined(ET_INT8_HOST_PW)
/* the host's whole bytes, on the threads: without the bounds test of the loop below, GCC vectorizes
 * this one (the mask bytes of 64 elements a 64-byte vector). Returns the mask bytes written. */
static inline int32_t et_qmask_pack_host(const int8_t *y, uint8_t *m, int32_t count, int32_t lo, int32_t hi) {
    const int32_t bytes = count / 8;
    ET_PARALLEL_FOR(count)
    for (int32_t b = 0; b < bytes; b++) {
        uint32_t byte = 0;
        for (int32_t k = 0; k < 8; k++) byte |= (uint32_t)(y[8 * b + k] > lo && y[8 * b + k] < hi) << k;
        m[b] = (uint8_t)byte;
    }
    return bytes;
}
#endif

/* out of line: one copy for every layer */
__attribute__((noinline, unused)) static void et_qmask_pack(const int8_t *y, uint8_t *m, int32_t count, int32_t lo,
                                                            int32_t hi) {
    int32_t b = 0;
#if defined(__ARM_FEATURE_DSP)
    b = et_qmask_pack_dsp(y, m, count, lo, hi); /* the whole bytes of 8 elements */
#elif defined(ET_INT8_HOST_PW)
    b = et_qmask_pack_host(y, m, count, lo, hi);
#endif
    for (; b < (count + 7) / 8; b++) {
        uint32_t byte = 0;
        for (int32_t k = 0; k < 8 && b * 8 + k < count; k++) {
            int32_t v = y[b * 8 + k];
            byte |= (uint32_t)(v > lo && v < hi) << k;
        }
        m[b] = (uint8_t)byte;
    }
}

/* g times 1.0f or 0.0f, the float made from the bit's pattern (0x3F800000 or 0); eight
 * elements a mask byte, the bit spread to a word by one signed bit-field extract (SBFX); kept
 * out of line, so the unrolled loop is in flash once, not at every call */
__attribute__((noinline, unused)) static void et_qmask_grad(const float *g, const uint8_t *m, float *out,
                                                            int32_t count) {
    int32_t k = 0;
#if defined(ET_INT8_HOST_PW) /* the host: 16 elements (two mask bytes) a vector, on the threads */
    typedef uint32_t v16u __attribute__((vector_size(64)));
    typedef float v16f __attribute__((vector_size(64)));
    const int32_t pairs = count / 16;
    ET_PARALLEL_FOR(count)
    for (int32_t q = 0; q < pairs; q++) {
        const uint32_t two = (uint32_t)m[2 * q] | (uint32_t)m[2 * q + 1] << 8;
        const v16u lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
        const v16u bits = (0u - ((two >> lane) & 1u)) & 0x3F800000u;
        v16f f, gv;
        memcpy(&f, &bits, sizeof f);
        memcpy(&gv, g + 16 * q, sizeof gv);
        gv = gv * f;
        memcpy(out + 16 * q, &gv, sizeof gv);
    }
    k = 16 * pairs;
#endif
    for (; k + 8 <= count; k += 8) {
        const uint32_t byte = m[k >> 3];
#pragma GCC unroll 8
        for (int32_t j = 0; j < 8; j++) {
            const uint32_t bits = (uint32_t)((int32_t)(byte << (31 - j)) >> 31) & 0x3F800000u;
            float f;
            memcpy(&f, &bits, 4);
            out[k + j] = g[k + j] * f;
        }
    }
    for (; k < count; k++) {
        const uint32_t bits = (0u - ((uint32_t)(m[k >> 3] >> (k & 7)) & 1u)) & 0x3F800000u;
        float f;
        memcpy(&f, &bits, 4);
        out[k] = g[k] * f;
    }
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
