/* edgetrain C runtime: float weight gradients fused with their SGD update (ops/gradupdate.py,
 * ops/embedding_update.py). The whole weight gradient is never stored: a convolution's or a
 * linear layer's is computed one output row at a time into a scratch row R and applied to
 * that row of the weight (and momentum) before the next; an embedding's is summed for the
 * rows the batch touches only. The update is sgd_update's arithmetic, element by element:
 * d = g [+ wd * w]; [m = mu * m + d; d = m;] w = w - lr * d. Uses et_float_gemm.h
 * (et_conv2d_grad_weight: the host BLAS or the portable kernels) and et_float_nn.h (et_index_at). */
#ifndef ET_FLOAT_FUSED_H
#define ET_FLOAT_FUSED_H

#include <string.h>
#include "et_common.h"
#include "et_float_gemm.h" /* et_conv2d_grad_weight: the host BLAS or the portable kernels */
#include "et_float_nn.h"   /* et_index_at */

/* In the host's kernel object (ET_KERNEL_OBJECT: backends/c/kernel_lib.py) the fused update calls the weight
 * gradient through that kernel's own out-of-line wrapper, compiled once (inlined there it doubled the object's
 * longest compile); elsewhere (model.c, the firmware, emitted projects) it is inlined */
#ifdef ET_KERNEL_OBJECT
void etk_et_conv2d_grad_weight(const float *ET_RESTRICT X, const float *ET_RESTRICT GY, float *ET_RESTRICT GW, int N,
                               int C, int H, int Wd, int O, int HO, int WO, int KH, int KW, int SH, int SW, int PH,
                               int PW, int DH, int DW, int G);
#define ET_FUSED_GRAD_WEIGHT etk_et_conv2d_grad_weight
#else
#define ET_FUSED_GRAD_WEIGHT et_conv2d_grad_weight
#endif

#ifdef ET_STEP_GUARD
/* The checked step's guard inside the fused updates (the ctypes library only: backends/c/step_guard.py
 * sets it up around a conv2d/linear_grad_weight_update whose weight and momentum are double-buffered).
 * While `on`, et_sgd_row reads each row of W (and M) from the committed copy and writes its new values
 * to the same offset of the other copy, wo (mo), ORing 1 (W) or 2 (M) into `bad` when a new value is
 * not finite; the committed copy is never written, so a failed step keeps it by not flipping to the
 * other copy (step_guard.py). The same memory traffic as the update in place (read the row, write the
 * row), no backup: ResNet-18's 84 MB of weights and momenta were copied aside row by row before.
 * Weak: one definition in the library, whether the kernels are compiled with model.c or apart. */
typedef struct {
    const float *w, *m; /* the node's weight and momentum: the committed copies (m: 0 without momentum) */
    float *wo, *mo;     /* their other copies, where the new rows go */
    int on, bad;
} et_row_guard_t;
__attribute__((weak)) et_row_guard_t et_row_guard;

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif
#define ET_NONFINITE_BITS(u) (((u) & 0x7f800000u) == 0x7f800000u)

/* elements [i0, i1) of et_sgd_row out of place, one at a time: from W (M) into w2 (m2); returns
 * the non-finite flags (1: a new W value, 2: a new M value) */
static int et_sgd_span_out(const float *ET_RESTRICT W, const float *ET_RESTRICT M, const float *ET_RESTRICT D,
                           float *ET_RESTRICT w2, float *ET_RESTRICT m2, int i0, int i1, float lr, float mu,
                           float wd) {
    uint32_t bw = 0, bm = 0;
    for (int i = i0; i < i1; ++i) {
        float d = D ? D[i] : 0.f;
        if (wd != 0.f) d = d + wd * W[i];
        if (M) {
            d = mu * M[i] + d;
            m2[i] = d;
            uint32_t u;
            memcpy(&u, &d, 4);
            bm |= ET_NONFINITE_BITS(u);
        }
        const float w = W[i] - lr * d;
        w2[i] = w;
        uint32_t u;
        memcpy(&u, &w, 4);
        bw |= ET_NONFINITE_BITS(u);
    }
    return (bw ? 1 : 0) | (bm ? 2 : 0);
}

/* et_sgd_row's arithmetic out of place: the row at W (M) of the committed copy, its new values into
 * the other copy; returns the rows' non-finite flags (1: W, 2: M). Where the CPU has them the new
 * values go out with non-temporal stores from the other copy's 64-byte boundaries on: an ordinary
 * store would first read the line it fills (the other copy is not in cache), one more pass over
 * the state than the update in place makes. The vector steps compute the scalar ones' float
 * operations in the same order (a product, then a sum; no fused multiply-add): the same bits. */
static int et_sgd_row_out(const float *ET_RESTRICT W, const float *ET_RESTRICT M, const float *ET_RESTRICT D,
                          int len, float lr, float mu, float wd) {
    float *ET_RESTRICT w2 = et_row_guard.wo + (W - et_row_guard.w);
    float *ET_RESTRICT m2 = M ? et_row_guard.mo + (M - et_row_guard.m) : 0;
#if defined(__AVX512F__) || defined(__AVX2__)
    /* m2 sits at W's offset of its own copy: the same boundaries when both copies are so aligned */
    const int head = (int)(((64 - ((uintptr_t)w2 & 63)) & 63) / 4);
    if (head >= len || ((uintptr_t)w2 & 3) || (m2 && (((uintptr_t)m2 ^ (uintptr_t)w2) & 63)))
        return et_sgd_span_out(W, M, D, w2, m2, 0, len, lr, mu, wd);
    int bad = et_sgd_span_out(W, M, D, w2, m2, 0, head, lr, mu, wd), i = head;
#if defined(__AVX512F__)
    const __m512 vlr = _mm512_set1_ps(lr), vmu = _mm512_set1_ps(mu), vwd = _mm512_set1_ps(wd);
    const __m512i ex = _mm512_set1_epi32(0x7f800000);
    __mmask16 kw = 0, km = 0;
    for (; i + 16 <= len; i += 16) {
        const __m512 w0 = _mm512_loadu_ps(W + i);
        __m512 d = D ? _mm512_loadu_ps(D + i) : _mm512_setzero_ps();
        if (wd != 0.f) d = _mm512_add_ps(d, _mm512_mul_ps(vwd, w0));
        if (M) {
            d = _mm512_add_ps(_mm512_mul_ps(vmu, _mm512_loadu_ps(M + i)), d);
            _mm512_stream_ps(m2 + i, d);
            km |= _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(d), ex), ex);
        }
        const __m512 w = _mm512_sub_ps(w0, _mm512_mul_ps(vlr, d));
        _mm512_stream_ps(w2 + i, w);
        kw |= _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(w), ex), ex);
    }
    bad |= (kw ? 1 : 0) | (km ? 2 : 0);
#else
    const __m256 vlr = _mm256_set1_ps(lr), vmu = _mm256_set1_ps(mu), vwd = _mm256_set1_ps(wd);
    const __m256i ex = _mm256_set1_epi32(0x7f800000);
    __m256i aw = _mm256_setzero_si256(), am = _mm256_setzero_si256();
    for (; i + 8 <= len; i += 8) {
        const __m256 w0 = _mm256_loadu_ps(W + i);
        __m256 d = D ? _mm256_loadu_ps(D + i) : _mm256_setzero_ps();
        if (wd != 0.f) d = _mm256_add_ps(d, _mm256_mul_ps(vwd, w0));
        if (M) {
            d = _mm256_add_ps(_mm256_mul_ps(vmu, _mm256_loadu_ps(M + i)), d);
            _mm256_stream_ps(m2 + i, d);
            am = _mm256_or_si256(am, _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(d), ex), ex));
        }
        const __m256 w = _mm256_sub_ps(w0, _mm256_mul_ps(vlr, d));
        _mm256_stream_ps(w2 + i, w);
        aw = _mm256_or_si256(aw, _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(w), ex), ex));
    }
    bad |= (_mm256_testz_si256(aw, aw) ? 0 : 1) | (_mm256_testz_si256(am, am) ? 0 : 2);
#endif
    return bad | et_sgd_span_out(W, M, D, w2, m2, i, len, lr, mu, wd);
#else
    return et_sgd_span_out(W, M, D, w2, m2, 0, len, lr, mu, wd);
#endif
}

/* after a guarded node: its non-temporal stores ordered before whatever follows (another thread
 * reading the state after the step included) */
static void et_row_guard_fence(void) {
#if defined(__AVX512F__) || defined(__AVX2__)
    _mm_sfence();
#endif
}
#endif

/* one row of sgd_update: W (and M) updated in place from the gradient row D (D == 0: a zero gradient);
 * in the checked step, out of place into the other copies (et_row_guard), ET_SGD_CHUNK floats at a time
 * (on the host's threads: et_common.h's ET_PARALLEL_FOR) */
#define ET_SGD_CHUNK 4096
ET_INLINE void et_sgd_row(float *ET_RESTRICT W, float *ET_RESTRICT M, const float *ET_RESTRICT D, int len,
                          float lr, float mu, float wd) {
#ifdef ET_STEP_GUARD
    if (et_row_guard.on) { /* chunks of whole 64-byte lines (the vector steps compute the scalar ones' bits) */
        int bad = 0;
        ET_PARALLEL_FOR_OR((double)len * 4, bad)
        for (int i0 = 0; i0 < len; i0 += ET_SGD_CHUNK)
            bad |= et_sgd_row_out(W + i0, M ? M + i0 : 0, D ? D + i0 : 0, len - i0 < ET_SGD_CHUNK ? len - i0 : ET_SGD_CHUNK,
                                  lr, mu, wd);
        if (bad) __atomic_fetch_or(&et_row_guard.bad, bad, __ATOMIC_RELAXED); /* rows may be updated in parallel */
        return;
    }
#endif
    ET_PARALLEL_FOR((double)len * 4)
    for (int i = 0; i < len; ++i) {
        float d = D ? D[i] : 0.f;
        if (wd != 0.f) d = d + wd * W[i];
        if (M) {
            d = mu * M[i] + d;
            M[i] = d;
        }
        W[i] = W[i] - lr * d;
    }
}

#ifdef ET_BLAS
/* T ends as the fused op's (ops/gradupdate.py): the last block's B channels of GY (N x O x P), image after
 * image, where the batch has more than one image (the host paths that compute the whole gradient at once) */
ET_HOST_INLINE void et_fused_last_gy(float *ET_RESTRICT T, const float *ET_RESTRICT GY, int N, int O, int B,
                                     size_t P) {
    if (T && N > 1)
        for (int n = 0; n < N; ++n)
            memcpy(T + (size_t)n * B * P, GY + ((size_t)n * O + O - B) * P, (size_t)B * P * sizeof(float));
}
#endif

#ifdef ET_DNNL_ON
/* a oneDNN weight gradient's update (et_conv2d_grad_weight_update_dnnl) */
typedef struct {
    float *W, *M, *R;
    size_t len; /* a row's floats: C * K */
    int O, B, K; /* K: the kernel's taps, KH * KW */
    float lr, mu, wd;
} et_dnnl_sgd_t;

/* row o of W (and M) updated from its gradient row g; g copied into R when o is one of the last B rows */
ET_HOST_INLINE void et_dnnl_sgd_apply(const et_dnnl_sgd_t *u, int o, const float *g) {
    const size_t at = (size_t)o * u->len;
    et_sgd_row(u->W + at, u->M ? u->M + at : 0, g, (int)u->len, u->lr, u->mu, u->wd);
    if (o >= u->O - u->B) memcpy(u->R + (size_t)(o - (u->O - u->B)) * u->len, g, u->len * sizeof(float));
}

/* b gradient rows (all C * K floats of each) out of oneDNN's ABcd<b>b<b>a, into t as OIHW rows: gw holds the
 * rows' CB = C / b blocks of input channels in turn, block cb the element (row i, channel cb * b + j, tap k)
 * at (k * b + j) * b + i. b a constant where it is inlined (the loops then vectorize) */
ET_HOST_INLINE void et_dnnl_unblock(const float *ET_RESTRICT gw, float *ET_RESTRICT t, int b, int K, int CB,
                                    size_t len) {
    const int seg = b * K; /* a block's stretch of a row */
    for (int cb = 0; cb < CB; ++cb) {
        const float *ET_RESTRICT s = gw + (size_t)cb * b * seg;
        for (int i = 0; i < b; ++i)
            for (int j = 0; j < b; ++j)
                for (int k = 0; k < K; ++k)
                    t[(size_t)i * len + (size_t)cb * seg + j * K + k] = s[(k * b + j) * b + i];
    }
}

/* et_dnnl_sgd_piece's update from a gradient left in oneDNN's blocks of b x b channels (et_dnnl_entry.gw_block):
 * b rows at a time made OIHW rows in the thread's scratch slot 2 (b * C * K floats, in the core's caches) and
 * applied as the rows are, element by element: the same values, without oneDNN's reorder of the whole piece
 * first (docs/benchmarks.md, "The host step, fifth look"). The row groups split over
 * the library's threads where the piece runs outside a parallel loop (a convolution whole, in one piece) */
static void et_dnnl_sgd_blocks(const et_dnnl_sgd_t *u, int piece, int G, const float *gw, int b) {
    const int K = u->K, CB = (int)(u->len / ((size_t)b * K));
    ET_PARALLEL_FOR((double)G * u->len * 4)
    for (int q = 0; q < G / b; ++q) {
        float *t = et_scratch(2, (size_t)b * u->len);
        if (!t) continue; /* out of memory: et_scratch reported it (ET_ERROR_HOOK) */
        const float *s = gw + (size_t)q * b * u->len; /* the group's blocks */
        if (b == 16)
            et_dnnl_unblock(s, t, 16, K, CB, u->len);
        else
            et_dnnl_unblock(s, t, 8, K, CB, u->len);
        for (int i = 0; i < b; ++i) et_dnnl_sgd_apply(u, piece * G + q * b + i, t + (size_t)i * u->len);
    }
}

/* the update of one piece's rows, on its thread right after the piece (et_dnnl_run's epilogue): gw, the
 * piece's G gradient rows (or, with `block`, the piece's gradient in oneDNN's blocks: et_dnnl_sgd_blocks),
 * applied to their rows of W (and M), those of the last B rows copied into R. The rows split over the
 * library's threads where the piece runs outside a parallel loop (a convolution whole, in one piece), as
 * the whole gradient's rows did */
static void et_dnnl_sgd_piece(const void *ctx, int piece, int G, const float *gw, int block) {
    const et_dnnl_sgd_t *u = (const et_dnnl_sgd_t *)ctx;
    if (block) {
        et_dnnl_sgd_blocks(u, piece, G, gw, block);
        return;
    }
    ET_PARALLEL_FOR((double)G * u->len * 4)
    for (int r = 0; r < G; ++r) et_dnnl_sgd_apply(u, piece * G + r, gw + (size_t)r * u->len);
}

/* the one-group conv2d_grad_weight_update on oneDNN (et_float_dnnl.h, for the shapes it takes; the GEMM
 * path's below calls it first): the gradient a piece of output channels at a time (et_dnnl_conv_post), each
 * piece's rows applied by its thread while its caches hold them (the whole gradient is never stored); R and
 * T end as the op's (ops/gradupdate.py): the last block's gradient rows, and its rows of GY. Returns 0,
 * having done nothing, for a shape et_dnnl_conv leaves to the GEMM path */
ET_BLAS_FN int et_conv2d_grad_weight_update_dnnl(const float *ET_RESTRICT X, const float *ET_RESTRICT GY, float *W,
                                                 float *M, float *ET_RESTRICT R, float *ET_RESTRICT T, int B,
                                                 float lr, float mu, float wd, int N, int C, int H, int Wd, int O,
                                                 int HO, int WO, int KH, int KW, int SH, int SW, int PH, int PW,
                                                 int DH, int DW) {
    const size_t P = (size_t)HO * WO;
    const et_dnnl_sgd_t u = {W, M, R, (size_t)C * KH * KW, O, B, KH * KW, lr, mu, wd};
    if (!et_dnnl_conv_post(ET_DNNL_WEIGHTS, X, GY, 0, 0, N, C, H, Wd, O, HO, WO, KH, KW, SH, SW, PH, PW, DH, DW,
                           et_dnnl_sgd_piece, &u))
        return 0;
    et_fused_last_gy(T, GY, N, O, B, P);
    return 1;
}
#endif

#ifdef ET_BLAS
/* the one-group conv2d_grad_weight_update on et_float_wino.h's Winograd path (the shapes it takes): the whole
 * gradient into a scratch buffer (slot 4), then each row applied; R and T end as the op's (ops/gradupdate.py):
 * the last block's gradient rows, and its rows of GY. Returns 0, having done nothing, for another shape */
ET_BLAS_FN int et_conv2d_grad_weight_update_wino(const float *ET_RESTRICT X, const float *ET_RESTRICT GY, float *W,
                                                 float *M, float *ET_RESTRICT R, float *ET_RESTRICT T, int B,
                                                 float lr, float mu, float wd, int N, int C, int H, int Wd, int O,
                                                 int HO, int WO, int KH, int KW, int SH, int SW, int PH, int PW,
                                                 int DH, int DW) {
    const size_t P = (size_t)HO * WO, len = (size_t)C * KH * KW;
    float *GW = et_scratch(4, (size_t)O * len);
    if (!GW || !et_wino_grad_weight(X, GY, GW, N, C, H, Wd, O, HO, WO, KH, KW, SH, SW, PH, PW, DH, DW)) return 0;
    ET_PARALLEL_FOR((double)O * len * 4)
    for (int o = 0; o < O; ++o) et_sgd_row(W + o * len, M ? M + o * len : 0, GW + o * len, (int)len, lr, mu, wd);
    memcpy(R, GW + (size_t)(O - B) * len, (size_t)B * len * sizeof(float));
    et_fused_last_gy(T, GY, N, O, B, P);
    return 1;
}

/* the host BLAS build's one-group conv2d_grad_weight_update: the batch's im2col (at most this many
 * floats, a host scratch buffer like et_float_blas.h's blocks) is built once per call, and the
 * gradient computed a chunk of CH = B*len/O weight columns at a time for all O output rows (into
 * a host scratch of O x CH floats, as many as R's B x len), one GEMM per chunk, each chunk applied
 * to its columns of every row of W. A GEMM of all O rows over a chunk packs the batch's GY
 * (O x N*P) and CH rows of the im2col, where a block of B rows packed the whole im2col (len x N*P)
 * per block: ResNet-18's 512x512x3x3 gradient at 4x4, batch 8, 92 -> 169 GFLOP/s in its GEMMs.
 * R and T end as the op's (ops/gradupdate.py): the last block's gradient rows, and its rows of GY.
 * Returns 0, having done nothing, past that size or when R holds fewer than O floats. */
#define ET_FUSED_COL_FLOATS ((size_t)4 << 20)
ET_BLAS_FN int et_conv2d_grad_weight_update_blas(const float *ET_RESTRICT X, const float *ET_RESTRICT GY, float *W,
                                                 float *M, float *ET_RESTRICT R, float *ET_RESTRICT T, int B,
                                                 float lr, float mu, float wd, int N, int C, int H, int Wd, int O,
                                                 int HO, int WO, int KH, int KW, int SH, int SW, int PH, int PW,
                                                 int DH, int DW) {
    if (et_conv2d_grad_weight_update_wino(X, GY, W, M, R, T, B, lr, mu, wd, N, C, H, Wd, O, HO, WO, KH, KW, SH, SW, PH,
                                          PW, DH, DW))
        return 1;
#ifdef ET_DNNL_ON
    if (et_conv2d_grad_weight_update_dnnl(X, GY, W, M, R, T, B, lr, mu, wd, N, C, H, Wd, O, HO, WO, KH, KW, SH, SW, PH,
                                          PW, DH, DW))
        return 1;
#endif
    const size_t P = (size_t)HO * WO, NP = (size_t)N * P, len = (size_t)C * KH * KW, ch = (size_t)B * len / O;
    if (len * NP > ET_FUSED_COL_FLOATS || ch == 0) return 0;
    float *col = et_scratch(0, len * NP); /* col[(c*KH + ki)*KW + kj][n*P + p] */
    float *G = et_scratch(2, (size_t)O * ch); /* a chunk's gradient: G[o][j - j0] */
    const float *g = GY;                      /* GY as [O][N*P]: in place for one image, else gathered */
    if (N > 1) {
        float *t = et_scratch(1, (size_t)O * NP);
        if (t) et_batch_cols(GY, t, N, O, (int)P);
        g = t;
    }
    if (!col || !G || !g) return 0;
    et_im2col(X, col, 0, N, 0, HO, C, H, Wd, WO, KH, KW, SH, SW, PH, PW, DH, DW);
    for (size_t j0 = 0; j0 < len; j0 += ch) {
        const int cw = (int)(j0 + ch < len ? ch : len - j0);
        et_sgemm(0, 1, O, cw, (int)NP, g, (int)NP, col + j0 * NP, (int)NP, 0.f, G, cw);
        ET_PARALLEL_FOR((double)O * cw * 4)
        for (int o = 0; o < O; ++o)
            et_sgd_row(W + o * len + j0, M ? M + o * len + j0 : 0, G + (size_t)o * cw, cw, lr, mu, wd);
        for (int r = 0; r < B; ++r)
            memcpy(R + r * len + j0, G + (size_t)(O - B + r) * cw, (size_t)cw * sizeof(float));
    }
    et_fused_last_gy(T, GY, N, O, B, P);
    return 1;
}
#endif


/* conv2d_grad_weight_update: the gradient a block at a time (B rows of a one-group convolution, or B whole
 * groups), each block one sub-convolution of et_float_gemm.h's et_conv2d_grad_weight (the host BLAS or the
 * portable kernels) into R, then applied to its rows. A batch of more than one and more than one block: one
 * group, the block's channels of GY copied into T first (one sub-convolution of the whole batch); grouped,
 * the block run sample by sample (its channels are contiguous per sample), each share in T added into R */
ET_INLINE void et_conv2d_grad_weight_update(const float *ET_RESTRICT X, const float *ET_RESTRICT GY, float *W,
                                            float *M, float *ET_RESTRICT R, float *ET_RESTRICT T, int B, float lr,
                                            float mu, float wd, int N, int C, int H, int Wd, int O, int HO, int WO,
                                            int KH, int KW, int SH, int SW, int PH, int PW, int DH, int DW, int G) {
    const int cg = C / G, og = O / G, len = cg * KH * KW;
    const int rows = G == 1 ? B : B * og, bc = G == 1 ? C : B * cg, bg = G == 1 ? 1 : B;
    const size_t size = (size_t)rows * len, P = (size_t)HO * WO;
#ifdef ET_BLAS
    if (G == 1 && rows < O &&
        et_conv2d_grad_weight_update_blas(X, GY, W, M, R, T, B, lr, mu, wd, N, C, H, Wd, O, HO, WO, KH, KW, SH, SW,
                                          PH, PW, DH, DW))
        return;
#endif
    /* one call site of et_conv2d_grad_weight (four inlined copies took gcc half a minute): a block of `rows`
     * rows over bc channels in bg groups (every row at once when `rows` is O: bc is C and bg is G then). The
     * block of N images of one group reads GY's block copied contiguous into T; of N images of several groups
     * it runs image by image, the others' sums in T added to R */
    const int whole = rows == O, copied = !whole && N > 1 && G == 1, per_image = !whole && N > 1 && G != 1;
    for (int o0 = 0; o0 < O; o0 += rows) {
        const int c0 = G == 1 ? 0 : o0 / og * cg;
        if (copied)
            for (int n = 0; n < N; ++n)
                memcpy(T + (size_t)n * rows * P, GY + ((size_t)n * O + o0) * P, (size_t)rows * P * sizeof(float));
        for (int n = 0; n < (per_image ? N : 1); ++n) {
            ET_FUSED_GRAD_WEIGHT(X + ((size_t)n * C + c0) * H * Wd, copied ? T : GY + ((size_t)n * O + o0) * P,
                                  n ? T : R, per_image ? 1 : N, bc, H, Wd, rows, HO, WO, KH, KW, SH, SW, PH, PW, DH,
                                  DW, bg);
            if (n)
                for (size_t i = 0; i < size; ++i) R[i] += T[i];
        }
        et_sgd_row(W + (size_t)o0 * len, M ? M + (size_t)o0 * len : 0, R, (int)size, lr, mu, wd);
    }
}

/* linear_grad_weight_update: a block of B output rows at a time, each one et_dense_grad_weight (GY's block of
 * columns copied contiguous into GB when B < O), then applied to its rows */
ET_INLINE void et_dense_grad_weight_update(const float *ET_RESTRICT X, const float *ET_RESTRICT GY, float *W,
                                           float *M, float *ET_RESTRICT R, float *ET_RESTRICT GB, int B, float lr,
                                           float mu, float wd, int N, int K, int O) {
    for (int o0 = 0; o0 < O; o0 += B) {
        const float *g = GY;
        if (B < O) {
            for (int n = 0; n < N; ++n)
                for (int j = 0; j < B; ++j) GB[(size_t)n * B + j] = GY[(size_t)n * O + o0 + j];
            g = GB;
        }
        et_dense_grad_weight(X, g, R, N, K, B);
        et_sgd_row(W + (size_t)o0 * K, M ? M + (size_t)o0 * K : 0, R, B * K, lr, mu, wd);
    }
}

/* IDS[0..U) = the rows idx touches (padding_idx left out) in increasing order, IDS[U..slots) = -1; returns U */
ET_INLINE long et_touched_rows(const void *idx, int idx64, long count, long num, long padding_idx,
                               int32_t *ET_RESTRICT IDS, long slots) {
    long u = 0;
    for (long i = 0; i < count; ++i) {
        const int64_t k = et_index_at(idx, idx64, i);
        if (k < 0 || k >= num) {
            ET_ERROR_HOOK("embedding_grad_update: index out of range");
            continue;
        }
        if (k == padding_idx) continue;
        long lo = 0, hi = u; /* binary search of k in IDS[0..u) */
        while (lo < hi) {
            const long mid = (lo + hi) / 2;
            if (IDS[mid] < k) lo = mid + 1;
            else hi = mid;
        }
        if (lo < u && IDS[lo] == k) continue;
        memmove(IDS + lo + 1, IDS + lo, (size_t)(u - lo) * sizeof(int32_t));
        IDS[lo] = (int32_t)k;
        ++u;
    }
    for (long i = u; i < slots; ++i) IDS[i] = -1;
    return u;
}

/* embedding_grad_update (ops/embedding_update.py): each touched row's gradient summed into R in
 * the batch's order and applied; with momentum or weight decay (dense), every untouched row
 * gets dense SGD's step from a zero gradient */
ET_INLINE void et_embedding_grad_update(const float *ET_RESTRICT G, const void *idx, int idx64, float *W, float *M,
                                        float *ET_RESTRICT R, int32_t *ET_RESTRICT IDS, long count, long num,
                                        int width, long padding_idx, float lr, float mu, float wd, int dense) {
    const long slots = count > 0 ? count : 1;
    const long u_end = et_touched_rows(idx, idx64, count, num, padding_idx, IDS, slots);
    long u = 0;
    for (int j = 0; j < width; ++j) R[j] = 0.f;
    for (long r = 0; r < num; ++r) {
        float *w = W + (size_t)r * width, *m = M ? M + (size_t)r * width : 0;
        if (u < u_end && IDS[u] == r) {
            for (int j = 0; j < width; ++j) R[j] = 0.f;
            for (long i = 0; i < count; ++i)
                if (et_index_at(idx, idx64, i) == r) {
                    const float *g = G + (size_t)i * width;
                    for (int j = 0; j < width; ++j) R[j] += g[j];
                }
            et_sgd_row(w, m, R, width, lr, mu, wd);
            ++u;
        } else if (dense) {
            et_sgd_row(w, m, 0, width, lr, mu, wd);
        } else if (u >= u_end) {
            break; /* no touched row left and untouched rows stay as they are */
        } else {
            r = IDS[u] - 1; /* skip to the next touched row */
        }
    }
}

#endif /* ET_FLOAT_FUSED_H */
