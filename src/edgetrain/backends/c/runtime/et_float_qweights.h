/* edgetrain C runtime: weights stored quantized (frozen="int8" / "int4"), dequantized on the
 * fly; the layout is ops/qweights.py's (int8: per row scale; int4: two nibbles a byte, low
 * nibble first, a float32 scale per group of `group` inputs). Each element is q * scale rounded
 * once to the kernel's type, as ops/qweights.py's dequantize computes it.
 *
 * The kernels of ops/qweights.py (kernels/float32_qweights.py emits their calls), written once
 * and instantiated for float (_f) and double (_d): this header includes itself once per element
 * type with ET_QW_T / ET_QW defined.
 * - linear_qw: Y = X W^T (+ B); matmul_qw: GX = G W; embedding_qw: rows of W.
 * - The host's float32 build with a BLAS (ET_BLAS): W is dequantized a block of about 1 MiB
 *   (ET_QW_BLOCK_FLOATS; at least ET_QW_MIN_LINES rows or columns, at most 4 MiB) at a time into
 *   et_scratch's buffer (the conv GEMMs' per-thread scratch: malloc'd, grown to the largest
 *   request and kept: never more than max(4 MiB, one row or column of W)) and each block
 *   multiplied by et_sgemm: rows of W for linear_qw (a block of output columns), columns of W
 *   for matmul_qw (a block of input-gradient columns; a block of rows would make rank-R updates
 *   of the whole GX). Not counted by the memory plan (host scratch, as the im2col blocks).
 * - Otherwise (float64, the Cortex-M and emitted-project builds, no BLAS): the portable loops
 *   dequantize ET_QW_CHUNK elements of one row at a time into a buffer on the stack (256 B as
 *   float); no other memory.
 * embedding_qw dequantizes each row read straight into its output. Header-only. */
#ifndef ET_FLOAT_QWEIGHTS_H
#define ET_FLOAT_QWEIGHTS_H
#include <stdint.h>
#include <string.h>
#include "et_common.h"
#include "et_float_gemm.h"
#include "et_float_nn.h"

/* row `row` of a (out, in) weight stored with `bits` (8 or 4) into dst[0..in) */
#define ET_QW_ROW(SUF, T)                                                                          \
    static inline void et_qw_row_##SUF(T *dst, const int8_t *wq, const float *scale, int64_t row,  \
                                       int64_t in, int bits, int group) {                          \
        if (bits == 8) {                                                                           \
            const int8_t *q = wq + row * in;                                                       \
            const T s = (T)scale[row];                                                             \
            for (int64_t i = 0; i < in; ++i) dst[i] = (T)q[i] * s;                                 \
            return;                                                                                \
        }                                                                                          \
        const uint8_t *b = (const uint8_t *)wq + row * ((in + 1) / 2);                            \
        const float *sc = scale + row * ((in + group - 1) / group);                                \
        for (int64_t i = 0; i < in; ++i) {                                                         \
            int v = (i & 1) ? (b[i >> 1] >> 4) : (b[i >> 1] & 0xF);                              \
            v = v > 7 ? v - 16 : v;                                                                \
            dst[i] = (T)v * (T)sc[i / group];                                                      \
        }                                                                                          \
    }
ET_QW_ROW(f, float)
ET_QW_ROW(d, double)
#undef ET_QW_ROW


/* dst[0..k1-k0) = elements [k0, k1) of row `row` of a (out, in) weight stored with `bits` */
#define ET_QW_SPAN(SUF, T)                                                                         \
    static inline void et_qw_span_##SUF(T *dst, const int8_t *wq, const float *scale, int64_t row,  \
                                        int64_t k0, int64_t k1, int64_t in, int bits, int group) { \
        if (bits == 8) {                                                                           \
            const int8_t *q = wq + row * in;                                                       \
            const T s = (T)scale[row];                                                             \
            for (int64_t i = k0; i < k1; ++i) dst[i - k0] = (T)q[i] * s;                           \
            return;                                                                                \
        }                                                                                          \
        const uint8_t *b = (const uint8_t *)wq + row * ((in + 1) / 2);                            \
        const float *sc = scale + row * ((in + group - 1) / group);                                \
        for (int64_t i = k0; i < k1; ++i) {                                                        \
            int v = (i & 1) ? (b[i >> 1] >> 4) : (b[i >> 1] & 0xF);                              \
            v = v > 7 ? v - 16 : v;                                                                \
            dst[i - k0] = (T)v * (T)sc[i / group];                                                 \
        }                                                                                          \
    }
ET_QW_SPAN(f, float)
ET_QW_SPAN(d, double)
#undef ET_QW_SPAN

/* elements of a row the portable kernels dequantize at a time (a stack buffer) */
#define ET_QW_CHUNK 64
/* floats of W the BLAS kernels aim to dequantize at a time: 1 MiB, as et_float_blas.h's im2col
 * blocks (half the L2 of a current x86 core) */
#define ET_QW_BLOCK_FLOATS (256 * 1024)
/* ... but at least this many rows (linear_qw) or columns (matmul_qw) a block, up to
 * ET_QW_MAX_FLOATS: every block's GEMM packs X or G again, whole, and a block of few lines spends
 * more on that than on its multiply-adds (linear_qw of 4864 inputs: 53 rows a 1 MiB block, 40 %
 * slower than the float linear) */
#define ET_QW_MIN_LINES 64
/* the most floats a block takes (4 MiB): the buffer's bound whatever the layer */
#define ET_QW_MAX_FLOATS (1024 * 1024)
/* the et_scratch buffer the BLAS kernels dequantize into */
#define ET_QW_SCRATCH_SLOT 0

#if defined(ET_BLAS)
/* lines (rows or columns of W, each `len` floats) a block holds, in [1, total] */
ET_HOST_INLINE long et_qw_block_lines(long len, long total) {
    len = len > 0 ? len : 1;
    long lines = ET_QW_BLOCK_FLOATS / len, most = ET_QW_MAX_FLOATS / len;
    if (lines < ET_QW_MIN_LINES) lines = ET_QW_MIN_LINES < most ? ET_QW_MIN_LINES : most;
    return lines < 1 ? 1 : lines > total ? total : lines;
}

/* dst[0..k1-k0) = elements [k0, k1) of row `row`: as et_qw_span_f, a group at a time with its
 * scale, two nibbles a byte without branches (the compiler vectorises the loops) */
ET_HOST_INLINE void et_qw_decode_f(float *ET_RESTRICT dst, const int8_t *wq, const float *scale, long row, long k0,
                                   long k1, long in, int bits, int group) {
    if (bits == 8) {
        const int8_t *q = wq + (size_t)row * in;
        const float s = scale[row];
        for (long i = k0; i < k1; ++i) dst[i - k0] = (float)q[i] * s;
        return;
    }
    const uint8_t *b = (const uint8_t *)wq + (size_t)row * ((in + 1) / 2);
    const float *sc = scale + (size_t)row * ((in + group - 1) / group);
    for (long i = k0; i < k1;) {
        const long end = (i / group + 1) * group < k1 ? (i / group + 1) * group : k1;
        const float s = sc[i / group];
        if (i & 1) { /* an odd start: the high nibble of its byte */
            dst[i - k0] = (float)((int)((b[i >> 1] >> 4) ^ 8) - 8) * s;
            ++i;
        }
        const long pairs = (end - i) / 2;
        const uint8_t *p = b + (i >> 1);
        float *d = dst + (i - k0);
        for (long j = 0; j < pairs; ++j) {
            d[2 * j] = (float)((int)((p[j] & 0xF) ^ 8) - 8) * s;
            d[2 * j + 1] = (float)((int)((p[j] >> 4) ^ 8) - 8) * s;
        }
        i += 2 * pairs;
        if (i < end) { /* an odd end: the low nibble */
            dst[i - k0] = (float)((int)((b[i >> 1] & 0xF) ^ 8) - 8) * s;
            ++i;
        }
    }
}

/* Y = X W^T (+ B): W's rows dequantized a block at a time, each block's output columns one GEMM */
static __attribute__((noinline, unused)) void et_linear_qw_blas(const float *X, const int8_t *wq, const float *scale,
                                                                const float *B, float *Y, long N, long K, long O,
                                                                int bits, int group) {
    if (N <= 0 || O <= 0) return;
    const long R = et_qw_block_lines(K, O);
    float *wb = et_scratch(ET_QW_SCRATCH_SLOT, (size_t)R * (K > 0 ? K : 1));
    if (!wb) return;
    for (long r0 = 0; r0 < O; r0 += R) {
        const long r = O - r0 < R ? O - r0 : R;
        for (long i = 0; i < r; ++i) et_qw_decode_f(wb + (size_t)i * K, wq, scale, r0 + i, 0, K, K, bits, group);
        if (B)
            for (long n = 0; n < N; ++n) memcpy(Y + (size_t)n * O + r0, B + r0, (size_t)r * sizeof(float));
        et_sgemm(0, 1, (int)N, (int)r, (int)K, X, (int)K, wb, (int)K, B ? 1.f : 0.f, Y + r0, (int)O);
    }
}

/* GX = G W: W's columns dequantized a block at a time, each block's GX columns one GEMM */
static __attribute__((noinline, unused)) void et_matmul_qw_blas(const float *G, const int8_t *wq, const float *scale,
                                                                float *GX, long N, long K, long O, int bits,
                                                                int group) {
    if (N <= 0 || K <= 0) return;
    const long C = et_qw_block_lines(O, K);
    float *wb = et_scratch(ET_QW_SCRATCH_SLOT, (size_t)C * (O > 0 ? O : 1));
    if (!wb) return;
    for (long k0 = 0; k0 < K; k0 += C) {
        const long c = K - k0 < C ? K - k0 : C;
        for (long o = 0; o < O; ++o) et_qw_decode_f(wb + (size_t)o * c, wq, scale, o, k0, k0 + c, K, bits, group);
        et_sgemm(0, 0, (int)N, (int)c, (int)O, G, (int)O, wb, (int)c, 0.f, GX + k0, (int)K);
    }
}
#endif /* ET_BLAS */

#define ET_QW_T float
#define ET_QW(name) name##_f
#define ET_QW_IS_FLOAT 1
#include "et_float_qweights.h"
#undef ET_QW_T
#undef ET_QW
#undef ET_QW_IS_FLOAT
#define ET_QW_T double
#define ET_QW(name) name##_d
#define ET_QW_IS_FLOAT 0
#include "et_float_qweights.h"
#undef ET_QW_T
#undef ET_QW
#undef ET_QW_IS_FLOAT

#elif defined(ET_QW_T) /* ---- the kernels, for element type ET_QW_T ---------------------------- */

/* Y[n][o] = sum_k X[n][k] W[o][k] (+ B[o]) for the (O, K) weight stored with `bits` */
static inline void ET_QW(et_linear_qw)(const ET_QW_T *X, const int8_t *wq, const float *scale, const ET_QW_T *B,
                                       ET_QW_T *Y, long N, long K, long O, int bits, int group) {
#if defined(ET_BLAS) && ET_QW_IS_FLOAT
    et_linear_qw_blas(X, wq, scale, B, Y, N, K, O, bits, group);
#else
    ET_QW_T w[ET_QW_CHUNK];
    for (long o = 0; o < O; ++o) {
        for (long n = 0; n < N; ++n) Y[(size_t)n * O + o] = 0;
        for (long k0 = 0; k0 < K; k0 += ET_QW_CHUNK) {
            const long k1 = K - k0 < ET_QW_CHUNK ? K : k0 + ET_QW_CHUNK;
            ET_QW(et_qw_span)(w, wq, scale, o, k0, k1, K, bits, group);
            for (long n = 0; n < N; ++n) {
                const ET_QW_T *x = X + (size_t)n * K + k0;
                ET_QW_T s = Y[(size_t)n * O + o];
                for (long k = 0; k < k1 - k0; ++k) s += x[k] * w[k];
                Y[(size_t)n * O + o] = s;
            }
        }
        if (B)
            for (long n = 0; n < N; ++n) Y[(size_t)n * O + o] += B[o];
    }
#endif
}

/* GX[n][k] = sum_o G[n][o] W[o][k] for the (O, K) weight stored with `bits` */
static inline void ET_QW(et_matmul_qw)(const ET_QW_T *G, const int8_t *wq, const float *scale, ET_QW_T *GX, long N,
                                       long K, long O, int bits, int group) {
#if defined(ET_BLAS) && ET_QW_IS_FLOAT
    et_matmul_qw_blas(G, wq, scale, GX, N, K, O, bits, group);
#else
    ET_QW_T w[ET_QW_CHUNK];
    for (size_t i = 0; i < (size_t)N * K; ++i) GX[i] = 0;
    for (long o = 0; o < O; ++o)
        for (long k0 = 0; k0 < K; k0 += ET_QW_CHUNK) {
            const long k1 = K - k0 < ET_QW_CHUNK ? K : k0 + ET_QW_CHUNK;
            ET_QW(et_qw_span)(w, wq, scale, o, k0, k1, K, bits, group);
            for (long n = 0; n < N; ++n) {
                const ET_QW_T g = G[(size_t)n * O + o];
                ET_QW_T *gx = GX + (size_t)n * K + k0;
                for (long k = 0; k < k1 - k0; ++k) gx[k] += g * w[k];
            }
        }
#endif
}

/* Y[i] = row idx[i] of the (num, width) table stored with `bits`; an index out of range: an
 * error (ET_ERROR_HOOK) and a zero row */
static inline void ET_QW(et_embedding_qw)(const void *idx, int idx64, const int8_t *wq, const float *scale,
                                          ET_QW_T *Y, long count, long num, long width, int bits, int group) {
    for (long i = 0; i < count; ++i) {
        const int64_t k = et_index_at(idx, idx64, i);
        ET_QW_T *y = Y + (size_t)i * width;
        if (k < 0 || k >= num) {
            ET_ERROR_HOOK("embedding_qw: index out of range");
            for (long j = 0; j < width; ++j) y[j] = 0;
            continue;
        }
        ET_QW(et_qw_row)(y, wq, scale, k, width, bits, group);
    }
}

#endif
