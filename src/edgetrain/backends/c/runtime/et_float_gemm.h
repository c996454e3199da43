/* edgetrain C runtime: the float32 convolutions (forward, input and weight gradients) and dense
 * layers (linear, its weight gradient, matmul) the emitted code calls, in one of two builds:
 *
 * - ET_BLAS defined (the host library when a BLAS is installed: backends/c/blas.py): every
 *   convolution with one group as single-precision GEMMs over blocks of output pixels (whole
 *   images side by side, or output rows of one image), each block's im2col matrix about 1 MiB so
 *   that im2col, the GEMM and col2im pass it through the L2 cache; a block of one image reads and
 *   writes the NCHW tensors in place through the GEMM's leading dimension, a block of several
 *   images gathers them side by side (the weights are read once per block, not per image). The
 *   forward writes W col, the weight gradient sums GY col^T over the blocks, the input gradient
 *   sums W^T GY back by col2im. 1x1 stride-1 convolutions skip im2col. Depthwise convolutions
 *   run on the padded-plane kernels below;
 *   other grouped ones keep the direct kernels of et_float.h. The GEMM-path functions are not
 *   inlined: their arguments are run-time values, so gcc compiles each once per program
 *   instead of once per call site. The scratch matrices live in two per-thread
 *   buffers that grow to the largest layer and are kept (host only: malloc).
 *   The BLAS runs on EDGETRAIN_BLAS_THREADS threads (environment, read at the first call;
 *   default 1). ET_BLAS_SGEMM / ET_BLAS_SET_THREADS name the library's functions (cblas_sgemm
 *   and openblas_set_num_threads unless the build names prefixed ones).
 * - otherwise (Cortex-M, emitted projects, the sanitizer build): the dependency-free kernels of
 *   et_float.h, called exactly as before (pointwise as a per-image register-blocked GEMM, the
 *   rest as direct convolutions), always inlined with the call site's constant shapes.
 *
 * Layout: NCHW activations, weights [O][C/G][KH][KW], dense weights [O][K]. Header-only. */
#ifndef ET_FLOAT_GEMM_H
#define ET_FLOAT_GEMM_H
#include "et_float.h"

ET_INLINE int et_conv_pointwise(int KH, int KW, int SH, int SW, int PH, int PW, int G) {
    return KH == 1 && KW == 1 && SH == 1 && SW == 1 && PH == 0 && PW == 0 && G == 1;
}

#ifdef ET_BLAS
#include <stdlib.h>
#include <cblas.h>
#ifndef ET_BLAS_SGEMM
#define ET_BLAS_SGEMM cblas_sgemm
#endif
#ifndef ET_BLAS_SET_THREADS
#define ET_BLAS_SET_THREADS openblas_set_num_threads
#endif
#define ET_BLAS_FN static __attribute__((noinline, unused))
/* the host-only helpers below: always inlined into the kernels that call them (not themselves
 * kernels of kernel_lib.py, which wraps the `ET_INLINE void` functions every build defines) */
#define ET_HOST_INLINE static inline __attribute__((always_inline))

/* C = A B (transposes as asked), row-major; the thread count set once per library */
static void et_sgemm(int ta, int tb, int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                     float beta, float *Cm, int ldc) {
    static int threads_set = 0;
    if (!threads_set) {
        const char *e = getenv("EDGETRAIN_BLAS_THREADS");
        const int t = e ? atoi(e) : 1;
        ET_BLAS_SET_THREADS(t > 0 ? t : 1);
        threads_set = 1;
    }
    if (M <= 0 || N <= 0) return;
    if (K <= 0) { /* an empty sum: beta C */
        for (int i = 0; i < M; ++i)
            for (int j = 0; j < N; ++j) Cm[(size_t)i * ldc + j] = beta == 0.f ? 0.f : beta * Cm[(size_t)i * ldc + j];
        return;
    }
    ET_BLAS_SGEMM(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, 1.0f, A,
                  lda, B, ldb, beta, Cm, ldc);
}

/* one of two per-thread scratch buffers of at least n floats (grown, never shrunk) */
static float *et_scratch(int slot, size_t n) {
    static __thread float *buf[2];
    static __thread size_t cap[2];
    if (n > cap[slot]) {
        free(buf[slot]);
        buf[slot] = (float *)malloc(n * sizeof(float));
        if (!buf[slot]) {
            cap[slot] = 0;
            ET_ERROR_HOOK("et_scratch: out of memory");
            return 0;
        }
        cap[slot] = n;
    }
    return buf[slot];
}

/* ---- the GEMMs of a convolution, block by block ----------------------------------------
 * The columns (output pixels) of a step's GEMMs are cut into blocks: several whole images, or
 * a range of output rows of one image. A block's im2col matrix is written, read by its GEMM and
 * summed back (col2im) while it is still in this core's L2 cache, instead of the whole batch's
 * (9x the input for a 3x3 convolution) going through memory twice. A block of one image reads
 * and writes the NCHW tensors in place through the GEMM's leading dimension (no gather, no
 * scatter); a block of several images gathers them side by side. */

/* floats of one block's im2col matrix: 1 MiB, half the L2 of a current x86 core */
#define ET_COL_BLOCK_FLOATS (256 * 1024)
/* a block spans at least this many columns per weight row: every block's GEMM packs the weights
 * (O x CK) again, which a narrower block would do more often than its cache saves */
#define ET_BLOCK_COLS_PER_O 2
/* and at least this many columns (a GEMM narrower than that runs far below the peak) */
#define ET_BLOCK_MIN_COLS 64

/* whole images per block (> 0), or minus the output rows of one image per block (< 0) */
ET_HOST_INLINE int et_block_step(int N, int HO, int WO, int CK, int O) {
    long w = ET_COL_BLOCK_FLOATS / (CK > 0 ? CK : 1);
    if (w < (long)ET_BLOCK_COLS_PER_O * O) w = (long)ET_BLOCK_COLS_PER_O * O;
    if (w < ET_BLOCK_MIN_COLS) w = ET_BLOCK_MIN_COLS;
    const long P = (long)HO * WO;
    if (w >= P || WO <= 0) {
        const long k = P > 0 ? w / P : N;
        return (int)(k < N ? k : N);
    }
    const long r = w / WO;
    return -(int)(r > 0 ? r : 1);
}

/* one block of a convolution's GEMM columns: images [n0, n1), their output rows [oh0, oh1) */
typedef struct {
    int n0, n1, oh0, oh1, cols, step;
} et_block;

ET_HOST_INLINE et_block et_blocks(int N, int HO, int WO, int CK, int O) {
    et_block b = {0, 0, 0, 0, 0, et_block_step(N, HO, WO, CK, O)};
    return b;
}

/* b moved to its first block (b fresh from et_blocks) or the next; 0 past the last */
ET_HOST_INLINE int et_block_next(et_block *b, int N, int HO, int WO) {
    const int imgs = b->step > 0 ? b->step : 1, rows = b->step > 0 ? HO : -b->step;
    if (b->n1 == 0) {
        b->n0 = b->oh0 = 0;
    } else if (b->oh1 < HO) {
        b->oh0 = b->oh1;
    } else {
        b->n0 = b->n1;
        b->oh0 = 0;
    }
    if (b->n0 >= N) return 0;
    b->n1 = b->n0 + imgs < N ? b->n0 + imgs : N;
    b->oh1 = b->oh0 + rows < HO ? b->oh0 + rows : HO;
    b->cols = (b->n1 - b->n0) * (b->oh1 - b->oh0) * WO;
    return 1;
}

/* dst[r][n*P + p] = src[n][r][p] for R rows of P per image: the images side by side */
static void et_batch_cols(const float *ET_RESTRICT src, float *ET_RESTRICT dst, int N, int R, int P) {
    for (int n = 0; n < N; ++n)
        for (int r = 0; r < R; ++r)
            memcpy(dst + (size_t)r * N * P + (size_t)n * P, src + ((size_t)n * R + r) * P, (size_t)P * sizeof(float));
}

/* dst[n][r][p] = src[r][n*P + p] (+ bias[r]): the inverse of et_batch_cols */
static void et_batch_uncols(const float *ET_RESTRICT src, const float *ET_RESTRICT bias, float *ET_RESTRICT dst,
                            int N, int R, int P) {
    for (int n = 0; n < N; ++n)
        for (int r = 0; r < R; ++r) {
            const float *s = src + (size_t)r * N * P + (size_t)n * P;
            float *d = dst + ((size_t)n * R + r) * P;
            if (bias) {
                const float b = bias[r];
                for (int p = 0; p < P; ++p) d[p] = s[p] + b;
            } else {
                memcpy(d, s, (size_t)P * sizeof(float));
            }
        }
}

/* a block of T's [n][R][P] as a GEMM operand of R rows: one image in place (*ld = P), several
 * gathered into scratch `slot` (*ld = cols); 0 when out of memory */
static const float *et_block_rows(const float *T, int R, int P, int n0, int n1, int oh0, int WO, int cols, int slot,
                                  int *ld) {
    if (n1 - n0 == 1) {
        *ld = P;
        return T + (size_t)n0 * R * P + (size_t)oh0 * WO;
    }
    float *m = et_scratch(slot, (size_t)R * cols);
    if (m) et_batch_cols(T + (size_t)n0 * R * P, m, n1 - n0, R, P);
    *ld = cols;
    return m;
}

/* col[(c*KH + ki)*KW + kj][(n - n0)*RO*WO + (oh - oh0)*WO + ow] = X[n][c][oh*SH - PH + ki*DH][ow*SW - PW + kj*DW]
 * (0 outside) for the block's images n and output rows oh (RO = oh1 - oh0) */
static void et_im2col(const float *ET_RESTRICT X, float *ET_RESTRICT col, int n0, int n1, int oh0, int oh1, int C,
                      int H, int Wd, int WO, int KH, int KW, int SH, int SW, int PH, int PW, int DH, int DW) {
    const size_t RW = (size_t)(oh1 - oh0) * WO, ld = (size_t)(n1 - n0) * RW;
    for (int n = n0; n < n1; ++n)
        for (int c = 0; c < C; ++c) {
            const float *x = X + ((size_t)n * C + c) * H * Wd;
            for (int ki = 0; ki < KH; ++ki)
                for (int kj = 0; kj < KW; ++kj) {
                    float *d = col + ((size_t)(c * KH + ki) * KW + kj) * ld + (n - n0) * RW;
                    const int ow0 = et_lo(PW, kj, DW, SW), ow1 = et_hi(Wd, PW, kj, DW, SW, WO);
                    const int a = ow0 < WO ? ow0 : WO, b = ow1 > a ? ow1 : a;
                    for (int oh = oh0; oh < oh1; ++oh, d += WO) {
                        const int ih = oh * SH - PH + ki * DH;
                        if (ih < 0 || ih >= H) {
                            memset(d, 0, (size_t)WO * sizeof(float));
                            continue;
                        }
                        const float *xr = x + (size_t)ih * Wd - PW + kj * DW;
                        for (int ow = 0; ow < a; ++ow) d[ow] = 0.f;
                        if (SW == 1) {
                            if (b > a) memcpy(d + a, xr + a, (size_t)(b - a) * sizeof(float));
                        } else {
                            for (int ow = a; ow < b; ++ow) d[ow] = xr[(size_t)ow * SW];
                        }
                        for (int ow = b; ow < WO; ++ow) d[ow] = 0.f;
                    }
                }
        }
}

/* GX[n][c][ih][iw] += the block's col entries et_im2col would read from there */
static void et_col2im(const float *ET_RESTRICT col, float *ET_RESTRICT GX, int n0, int n1, int oh0, int oh1, int C,
                      int H, int Wd, int HO, int WO, int KH, int KW, int SH, int SW, int PH, int PW, int DH, int DW) {
    const size_t RW = (size_t)(oh1 - oh0) * WO, ld = (size_t)(n1 - n0) * RW;
    for (int n = n0; n < n1; ++n)
        for (int c = 0; c < C; ++c) {
            float *gx = GX + ((size_t)n * C + c) * H * Wd;
            for (int ki = 0; ki < KH; ++ki) {
                const int lo = et_lo(PH, ki, DH, SH), hi = et_hi(H, PH, ki, DH, SH, HO);
                const int r0 = lo > oh0 ? lo : oh0, r1 = hi < oh1 ? hi : oh1;
                for (int kj = 0; kj < KW; ++kj) {
                    const float *s = col + ((size_t)(c * KH + ki) * KW + kj) * ld + (n - n0) * RW;
                    const int ow0 = et_lo(PW, kj, DW, SW), ow1 = et_hi(Wd, PW, kj, DW, SW, WO);
                    for (int oh = r0; oh < r1; ++oh) {
                        const float *sr = s + (size_t)(oh - oh0) * WO;
                        float *xr = gx + (size_t)(oh * SH - PH + ki * DH) * Wd - PW + kj * DW;
                        if (SW == 1) {
                            for (int ow = ow0; ow < ow1; ++ow) xr[ow] += sr[ow];
                        } else {
                            for (int ow = ow0; ow < ow1; ++ow) xr[(size_t)ow * SW] += sr[ow];
                        }
                    }
                }
            }
        }
}

/* the block's columns of X as the [CK][cols] GEMM operand: X itself (1x1 stride 1) or its
 * im2col in scratch 0; 0 when out of memory */
static const float *et_block_cols(const float *X, int pointwise, int n0, int n1, int oh0, int oh1, int cols, int C,
                                  int H, int Wd, int WO, int KH, int KW, int SH, int SW, int PH, int PW, int DH, int DW,
                                  int *ld) {
    if (pointwise) return et_block_rows(X, C, H * Wd, n0, n1, oh0, WO, cols, 0, ld);
    float *m = et_scratch(0, (size_t)C * KH * KW * cols);
    if (m) et_im2col(X, m, n0, n1, oh0, oh1, C, H, Wd, WO, KH, KW, SH, SW, PH, PW, DH, DW);
    *ld = cols;
    return m;
}

ET_BLAS_FN void et_conv_fwd_blas(const float *X, const float *W, const float *B, float *Y, int N, int C, int H, int Wd,
                                 int O, int HO, int WO, int KH, int KW, int SH, int SW, int PH, int PW, int DH, int DW) {
    const int P = HO * WO, CK = C * KH * KW, pw = et_conv_pointwise(KH, KW, SH, SW, PH, PW, 1);
    for (et_block b = et_blocks(N, HO, WO, CK, O); et_block_next(&b, N, HO, WO);) {
        const int n0 = b.n0, n1 = b.n1, oh0 = b.oh0, oh1 = b.oh1, cols = b.cols;
        int ldb;
        const float *col = et_block_cols(X, pw, n0, n1, oh0, oh1, cols, C, H, Wd, WO, KH, KW, SH, SW, PH, PW, DH, DW,
                                         &ldb);
        if (!col) return;
        if (n1 - n0 == 1) { /* straight into the image's output rows */
            float *y = Y + (size_t)n0 * O * P + (size_t)oh0 * WO;
            if (B)
                for (int o = 0; o < O; ++o)
                    for (int p = 0; p < cols; ++p) y[(size_t)o * P + p] = B[o];
            et_sgemm(0, 0, O, cols, CK, W, CK, col, ldb, B ? 1.f : 0.f, y, P);
        } else {
            float *out = et_scratch(1, (size_t)O * cols);
            if (!out) return;
            et_sgemm(0, 0, O, cols, CK, W, CK, col, ldb, 0.f, out, cols);
            et_batch_uncols(out, B, Y + (size_t)n0 * O * P, n1 - n0, O, P);
        }
    }
}

ET_BLAS_FN void et_conv_grad_weight_blas(const float *X, const float *GY, float *GW, int N, int C, int H, int Wd, int O,
                                         int HO, int WO, int KH, int KW, int SH, int SW, int PH, int PW, int DH,
                                         int DW) {
    const int P = HO * WO, CK = C * KH * KW, pw = et_conv_pointwise(KH, KW, SH, SW, PH, PW, 1);
    float beta = 0.f; /* GW = the first block's GY col^T, then the others' added */
    for (et_block b = et_blocks(N, HO, WO, CK, O); et_block_next(&b, N, HO, WO);) {
        const int n0 = b.n0, n1 = b.n1, oh0 = b.oh0, oh1 = b.oh1, cols = b.cols;
        int ldb, lda;
        const float *col = et_block_cols(X, pw, n0, n1, oh0, oh1, cols, C, H, Wd, WO, KH, KW, SH, SW, PH, PW, DH, DW,
                                         &ldb);
        const float *gy = et_block_rows(GY, O, P, n0, n1, oh0, WO, cols, 1, &lda);
        if (!col || !gy) return;
        et_sgemm(0, 1, O, CK, cols, gy, lda, col, ldb, beta, GW, CK);
        beta = 1.f;
    }
    if (beta == 0.f) memset(GW, 0, (size_t)O * CK * sizeof(float)); /* no columns: a zero gradient */
}

ET_BLAS_FN void et_conv_grad_input_blas(const float *GY, const float *W, float *GX, int N, int C, int H, int Wd, int O,
                                        int HO, int WO, int KH, int KW, int SH, int SW, int PH, int PW, int DH, int DW) {
    const int P = HO * WO, CK = C * KH * KW, pw = et_conv_pointwise(KH, KW, SH, SW, PH, PW, 1);
    if (!pw) memset(GX, 0, (size_t)N * C * H * Wd * sizeof(float));
    for (et_block b = et_blocks(N, HO, WO, CK, O); et_block_next(&b, N, HO, WO);) {
        const int n0 = b.n0, n1 = b.n1, oh0 = b.oh0, oh1 = b.oh1, cols = b.cols;
        int lda;
        const float *gy = et_block_rows(GY, O, P, n0, n1, oh0, WO, cols, 1, &lda);
        if (!gy) return;
        if (pw && n1 - n0 == 1) { /* straight into the image's input-gradient rows */
            et_sgemm(1, 0, C, cols, O, W, C, gy, lda, 0.f, GX + (size_t)n0 * C * P + (size_t)oh0 * WO, P);
            continue;
        }
        float *col = et_scratch(0, (size_t)CK * cols);
        if (!col) return;
        et_sgemm(1, 0, CK, cols, O, W, CK, gy, lda, 0.f, col, cols); /* col = W^T GY */
        if (pw)
            et_batch_uncols(col, (const float *)0, GX + (size_t)n0 * C * P, n1 - n0, C, P);
        else
            et_col2im(col, GX, n0, n1, oh0, oh1, C, H, Wd, HO, WO, KH, KW, SH, SW, PH, PW, DH, DW);
    }
}

/* Y[n][o] = B[o] + sum_k X[n][k] W[o][k] */
ET_BLAS_FN void et_linear_blas(const float *X, const float *W, const float *B, float *Y, int N, int K, int O) {
    if (B)
        for (int n = 0; n < N; ++n) memcpy(Y + (size_t)n * O, B, (size_t)O * sizeof(float));
    et_sgemm(0, 1, N, O, K, X, K, W, K, B ? 1.f : 0.f, Y, O);
}

/* GW[o][k] = sum_n GY[n][o] X[n][k] */
ET_BLAS_FN void et_linear_grad_weight_blas(const float *X, const float *GY, float *GW, int N, int K, int O) {
    et_sgemm(1, 0, O, K, N, GY, O, X, K, 0.f, GW, K);
}

/* C[i][j] = sum_k A[i][k] B[k][j] */
ET_BLAS_FN void et_matmul_blas(const float *A, const float *B, float *Cm, int M, int K, int N) {
    et_sgemm(0, 0, M, N, K, A, K, B, N, 0.f, Cm, N);
}

/* ---- depthwise convolutions (one input and one output channel per group) on the host:
 * each input plane is copied once, zero-padded and split into SW column phases, into a
 * scratch matrix XP[SW][HP][LP] (padded row r, padded column j*SW + ph), so that every tap
 * of every output row reads one contiguous run: tap (ki, kj) of output (oh, ow) is
 * XP[(kj*DW) % SW][oh*SH + ki*DH][(kj*DW) / SW + ow]. The output row is summed over the taps in
 * registers (the taps unrolled at the call site's constant kernel size). The input gradient
 * accumulates into a phase matrix of the same shape, which is then cropped into GX. */
ET_HOST_INLINE int et_dw_rows(int HO, int KH, int SH, int DH) { return (HO - 1) * SH + (KH - 1) * DH + 1; }

/* XP (SW phases of HP x LP) from the plane x (H x Wd) padded by (PH, PW) */
ET_HOST_INLINE void et_dw_phases(const float *ET_RESTRICT x, float *ET_RESTRICT XP, int H, int Wd, int PH, int PW,
                                 int SW, int HP, int LP) {
    const int r0 = PH < HP ? PH : HP, r1 = PH + H < HP ? PH + H : HP;
    for (int ph = 0; ph < SW; ++ph) {
        const int j0l = et_lo(PW, ph, 1, SW), j0 = j0l < LP ? j0l : LP, j1h = et_hi(Wd, PW, ph, 1, SW, LP);
        const int j1 = j1h > j0 ? j1h : j0;
        float *p = XP + (size_t)ph * HP * LP;
        memset(p, 0, (size_t)r0 * LP * sizeof(float));
        for (int r = r0; r < r1; ++r) {
            const float *xr = x + (size_t)(r - PH) * Wd + ph - PW;
            float *d = p + (size_t)r * LP;
            for (int j = 0; j < j0; ++j) d[j] = 0.f;
            for (int j = j0; j < j1; ++j) d[j] = xr[(size_t)j * SW];
            for (int j = j1; j < LP; ++j) d[j] = 0.f;
        }
        if (r1 < HP) memset(p + (size_t)r1 * LP, 0, (size_t)(HP - r1) * LP * sizeof(float));
    }
}

ET_HOST_INLINE void et_dw_fwd(const float *ET_RESTRICT X, const float *ET_RESTRICT W, const float *ET_RESTRICT B,
                              float *ET_RESTRICT Y, int N, int C, int H, int Wd, int HO, int WO, int SH, int SW,
                              int PH, int PW, int DH, int DW, int KH, int KW) {
    const int HP = et_dw_rows(HO, KH, SH, DH), LP = ET_ROW_LEN(WO, KW, SW, DW);
    float *XP = et_scratch(0, (size_t)SW * HP * LP);
    if (!XP) return;
    for (int n = 0; n < N; ++n)
        for (int c = 0; c < C; ++c) {
            et_dw_phases(X + ((size_t)n * C + c) * H * Wd, XP, H, Wd, PH, PW, SW, HP, LP);
            const float *w = W + (size_t)c * KH * KW;
            const float b = B ? B[c] : 0.f;
            float *y = Y + ((size_t)n * C + c) * HO * WO;
            for (int oh = 0; oh < HO; ++oh, y += WO) {
                const float *rows = XP + (size_t)oh * SH * LP;
                ET_SIMD
                for (int ow = 0; ow < WO; ++ow) {
                    float s = b;
                    for (int ki = 0; ki < KH; ++ki)
                        for (int kj = 0; kj < KW; ++kj)
                            s += w[ki * KW + kj] *
                                 rows[((size_t)((kj * DW) % SW) * HP + ki * DH) * LP + (kj * DW) / SW + ow];
                    y[ow] = s;
                }
            }
        }
}

ET_HOST_INLINE void et_dw_grad_weight(const float *ET_RESTRICT X, const float *ET_RESTRICT GY, float *ET_RESTRICT GW,
                                      int N, int C, int H, int Wd, int HO, int WO, int SH, int SW, int PH, int PW,
                                      int DH, int DW, int KH, int KW) {
    /* per tap, a row of WO partial sums accumulated over the batch and the output rows (vector
     * multiply-adds, no horizontal sum per row), summed once per channel */
    const int HP = et_dw_rows(HO, KH, SH, DH), LP = ET_ROW_LEN(WO, KW, SW, DW), T = KH * KW;
    float *XP = et_scratch(0, (size_t)SW * HP * LP), *ACC = et_scratch(1, (size_t)T * WO);
    if (!XP || !ACC) return;
    for (int c = 0; c < C; ++c) {
        memset(ACC, 0, (size_t)T * WO * sizeof(float));
        for (int n = 0; n < N; ++n) {
            et_dw_phases(X + ((size_t)n * C + c) * H * Wd, XP, H, Wd, PH, PW, SW, HP, LP);
            const float *g = GY + ((size_t)n * C + c) * HO * WO;
            for (int oh = 0; oh < HO; ++oh, g += WO)
                for (int ki = 0; ki < KH; ++ki)
                    for (int kj = 0; kj < KW; ++kj) {
                        const float *ET_RESTRICT r =
                            XP + ((size_t)((kj * DW) % SW) * HP + oh * SH + ki * DH) * LP + (kj * DW) / SW;
                        float *ET_RESTRICT a = ACC + (size_t)(ki * KW + kj) * WO;
                        ET_SIMD
                        for (int ow = 0; ow < WO; ++ow) a[ow] += g[ow] * r[ow];
                    }
        }
        for (int t = 0; t < T; ++t) {
            const float *a = ACC + (size_t)t * WO;
            float s = 0.f;
            ET_SIMD_SUM(s)
            for (int ow = 0; ow < WO; ++ow) s += a[ow];
            GW[(size_t)c * T + t] = s;
        }
    }
}

ET_HOST_INLINE void et_dw_grad_input(const float *ET_RESTRICT GY, const float *ET_RESTRICT W, float *ET_RESTRICT GX,
                                     int N, int C, int H, int Wd, int HO, int WO, int SH, int SW, int PH, int PW,
                                     int DH, int DW, int KH, int KW) {
    const int HP = et_dw_rows(HO, KH, SH, DH), LP = ET_ROW_LEN(WO, KW, SW, DW);
    float *GP = et_scratch(0, (size_t)SW * HP * LP);
    if (!GP) return;
    for (int n = 0; n < N; ++n)
        for (int c = 0; c < C; ++c) {
            memset(GP, 0, (size_t)SW * HP * LP * sizeof(float));
            const float *w = W + (size_t)c * KH * KW, *g = GY + ((size_t)n * C + c) * HO * WO;
            for (int oh = 0; oh < HO; ++oh, g += WO)
                for (int ki = 0; ki < KH; ++ki)
                    for (int kj = 0; kj < KW; ++kj) {
                        float *ET_RESTRICT r = GP + ((size_t)((kj * DW) % SW) * HP + oh * SH + ki * DH) * LP +
                                               (kj * DW) / SW;
                        const float wv = w[ki * KW + kj];
                        ET_SIMD
                        for (int ow = 0; ow < WO; ++ow) r[ow] += wv * g[ow];
                    }
            /* the crop: input column iw is padded column iw + PW = j*SW + ph, row ih is padded row ih + PH */
            float *gx = GX + ((size_t)n * C + c) * H * Wd;
            for (int ih = 0; ih < H; ++ih) {
                float *gr = gx + (size_t)ih * Wd;
                if (ih + PH >= HP) {
                    memset(gr, 0, (size_t)Wd * sizeof(float));
                    continue;
                }
                for (int ph = 0; ph < SW; ++ph) {
                    const float *src = GP + ((size_t)ph * HP + ih + PH) * LP;
                    const int j0 = et_lo(PW, ph, 1, SW), j1 = et_hi(Wd, PW, ph, 1, SW, (Wd + PW) / SW + 1);
                    for (int j = j0; j < j1; ++j) gr[j * SW + ph - PW] = j < LP ? src[j] : 0.f;
                }
            }
        }
}

/* GX of a stride-1 depthwise convolution whose padding is at most its dilated kernel's reach
 * ((K-1)*D >= P): the forward kernel on GY padded by (K-1)*D - P, with the taps flipped */
ET_HOST_INLINE void et_dw_grad_input_s1(const float *ET_RESTRICT GY, const float *ET_RESTRICT W, float *ET_RESTRICT GX,
                                        int N, int C, int H, int Wd, int HO, int WO, int SH, int SW, int PH, int PW,
                                        int DH, int DW, int KH, int KW) {
    const int T = KH * KW;
    float *WF = et_scratch(1, (size_t)C * T);
    if (!WF) return;
    for (int c = 0; c < C; ++c)
        for (int t = 0; t < T; ++t) WF[(size_t)c * T + t] = W[(size_t)c * T + (T - 1 - t)];
    et_dw_fwd(GY, WF, (const float *)0, GX, N, C, HO, WO, H, Wd, 1, 1, (KH - 1) * DH - PH, (KW - 1) * DW - PW, DH, DW,
              KH, KW);
    (void)SH;
    (void)SW;
}

/* the depthwise kernels specialised for the common kernel sizes (3, 5, 7: the taps unrolled),
 * else with run-time sizes: the kernels may be compiled once, out of line (kernel_lib.py) */
#define ET_DW_SPECIALISE(fn, KH, KW, ...)                                                                   \
    do {                                                                                                   \
        if ((KH) == 3 && (KW) == 3) fn(__VA_ARGS__, 3, 3);                                                  \
        else if ((KH) == 5 && (KW) == 5) fn(__VA_ARGS__, 5, 5);                                             \
        else if ((KH) == 7 && (KW) == 7) fn(__VA_ARGS__, 7, 7);                                             \
        else fn(__VA_ARGS__, KH, KW);                                                                      \
    } while (0)
#endif /* ET_BLAS */

/* ---- what the emitted code calls ------------------------------------------------------- */
ET_INLINE void et_conv2d(const float *ET_RESTRICT X, const float *ET_RESTRICT W, const float *ET_RESTRICT B,
                         float *ET_RESTRICT Y, int N, int C, int H, int Wd, int O, int HO, int WO, int KH, int KW,
                         int SH, int SW, int PH, int PW, int DH, int DW, int G) {
#ifdef ET_BLAS
    if (G == 1) {
        et_conv_fwd_blas(X, W, B, Y, N, C, H, Wd, O, HO, WO, KH, KW, SH, SW, PH, PW, DH, DW);
        return;
    }
    if (G == C && G == O) {
        ET_DW_SPECIALISE(et_dw_fwd, KH, KW, X, W, B, Y, N, C, H, Wd, HO, WO, SH, SW, PH, PW, DH, DW);
        return;
    }
#endif
    if (et_conv_pointwise(KH, KW, SH, SW, PH, PW, G)) {
        for (int n = 0; n < N; ++n)
            et_gemm_wx(W, X + (size_t)n * C * H * Wd, B, Y + (size_t)n * O * H * Wd, O, C, H * Wd, C, 1);
        return;
    }
    et_conv_fwd(X, W, B, Y, N, C, H, Wd, O, HO, WO, KH, KW, SH, SW, PH, PW, DH, DW, G);
}

ET_INLINE void et_conv2d_grad_input(const float *ET_RESTRICT GY, const float *ET_RESTRICT W, float *ET_RESTRICT GX,
                                    int N, int C, int H, int Wd, int O, int HO, int WO, int KH, int KW, int SH, int SW,
                                    int PH, int PW, int DH, int DW, int G) {
#ifdef ET_BLAS
    if (G == 1) {
        et_conv_grad_input_blas(GY, W, GX, N, C, H, Wd, O, HO, WO, KH, KW, SH, SW, PH, PW, DH, DW);
        return;
    }
    if (G == C && G == O) {
        if (SH == 1 && SW == 1 && (KH - 1) * DH >= PH && (KW - 1) * DW >= PW)
            ET_DW_SPECIALISE(et_dw_grad_input_s1, KH, KW, GY, W, GX, N, C, H, Wd, HO, WO, SH, SW, PH, PW, DH, DW);
        else
            ET_DW_SPECIALISE(et_dw_grad_input, KH, KW, GY, W, GX, N, C, H, Wd, HO, WO, SH, SW, PH, PW, DH, DW);
        return;
    }
#endif
    if (et_conv_pointwise(KH, KW, SH, SW, PH, PW, G)) {
        for (int n = 0; n < N; ++n)
            et_gemm_wx(W, GY + (size_t)n * O * H * Wd, (const float *)0, GX + (size_t)n * C * H * Wd, C, O, H * Wd, 1,
                       C);
        return;
    }
    if (SH == 1 && SW == 1) {
        et_conv_grad_input_s1(GY, W, GX, N, C, H, Wd, O, HO, WO, KH, KW, PH, PW, DH, DW, G);
        return;
    }
    et_conv_grad_input(GY, W, GX, N, C, H, Wd, O, HO, WO, KH, KW, SH, SW, PH, PW, DH, DW, G);
}

ET_INLINE void et_conv2d_grad_weight(const float *ET_RESTRICT X, const float *ET_RESTRICT GY, float *ET_RESTRICT GW,
                                     int N, int C, int H, int Wd, int O, int HO, int WO, int KH, int KW, int SH, int SW,
                                     int PH, int PW, int DH, int DW, int G) {
#ifdef ET_BLAS
    if (G == 1) {
        et_conv_grad_weight_blas(X, GY, GW, N, C, H, Wd, O, HO, WO, KH, KW, SH, SW, PH, PW, DH, DW);
        return;
    }
    if (G == C && G == O) {
        ET_DW_SPECIALISE(et_dw_grad_weight, KH, KW, X, GY, GW, N, C, H, Wd, HO, WO, SH, SW, PH, PW, DH, DW);
        return;
    }
#endif
    if (et_conv_pointwise(KH, KW, SH, SW, PH, PW, G)) {
        for (int n = 0; n < N; ++n)
            et_gemm_abt(GY + (size_t)n * O * H * Wd, X + (size_t)n * C * H * Wd, GW, O, C, H * Wd, n > 0);
        return;
    }
    et_conv_grad_weight(X, GY, GW, N, C, H, Wd, O, HO, WO, KH, KW, SH, SW, PH, PW, DH, DW, G);
}

ET_INLINE void et_dense(const float *ET_RESTRICT X, const float *ET_RESTRICT W, const float *ET_RESTRICT B,
                        float *ET_RESTRICT Y, int N, int K, int O) {
#ifdef ET_BLAS
    et_linear_blas(X, W, B, Y, N, K, O);
#else
    et_linear(X, W, B, Y, N, K, O);
#endif
}

ET_INLINE void et_dense_grad_weight(const float *ET_RESTRICT X, const float *ET_RESTRICT GY, float *ET_RESTRICT GW,
                                    int N, int K, int O) {
#ifdef ET_BLAS
    et_linear_grad_weight_blas(X, GY, GW, N, K, O);
#else
    et_linear_grad_weight(X, GY, GW, N, K, O);
#endif
}

ET_INLINE void et_dense_matmul(const float *ET_RESTRICT A, const float *ET_RESTRICT B, float *ET_RESTRICT Cm, int M,
                               int K, int N) {
#ifdef ET_BLAS
    et_matmul_blas(A, B, Cm, M, K, N);
#else
    et_matmul(A, B, Cm, M, K, N);
#endif
}

#endif /* ET_FLOAT_GEMM_H */
