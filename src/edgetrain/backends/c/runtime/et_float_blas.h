/* edgetrain C runtime: the host's GEMM path for the float32 convolutions and dense layers
 * (included by et_float_gemm.h, which dispatches to it; et_conv_pointwise is defined in every build).
 *
 * With ET_BLAS defined (the host library when a BLAS is installed: backends/c/blas.py), every
 * convolution with one group runs as single-precision GEMMs over blocks of output pixels (whole
 * images side by side, or output rows of one image), each block's im2col matrix about 1 MiB so
 * that im2col, the GEMM and col2im pass it through the L2 cache; a block of one image reads and
 * writes the NCHW tensors in place through the GEMM's leading dimension, a block of several
 * images gathers them side by side (the weights are read once per block, not per image). The
 * forward writes W col, the weight gradient sums GY col^T over the blocks, the input gradient
 * sums W^T GY back by col2im. 1x1 stride-1 convolutions skip im2col; the gradients of those of
 * vertical stride 1 whose blocks hold one image build one kernel row's im2col only and take each
 * kernel row as a shifted window of it (KH GEMMs; a KH times smaller im2col and col2im). The
 * GEMM-path functions are not inlined: their arguments are run-time values, so gcc compiles each once per program
 * instead of once per call site. The scratch matrices live in three per-thread buffers that grow
 * to the largest layer and are kept (host only: malloc); et_float_gemm.h's host depthwise
 * kernels use them too. The ctypes library (built with OpenMP) cuts each GEMM into tiles fixed by its shape,
 * single-threaded BLAS calls run on its et_threads threads (et_common.h: the results do not depend on the count);
 * without OpenMP the BLAS runs on EDGETRAIN_BLAS_THREADS threads (environment, read at the first call; default 1:
 * an emitted project's `make main`). ET_BLAS_SGEMM / ET_BLAS_SET_THREADS name the library's functions
 * (cblas_sgemm and openblas_set_num_threads unless the build names prefixed ones).
 *
 * Layout: NCHW activations, weights [O][C/G][KH][KW], dense weights [O][K]. Header-only. */
#ifndef ET_FLOAT_BLAS_H
#define ET_FLOAT_BLAS_H
#include "et_float.h"

ET_INLINE int et_conv_pointwise(int KH, int KW, int SH, int SW, int PH, int PW, int G) {
    return KH == 1 && KW == 1 && SH == 1 && SW == 1 && PH == 0 && PW == 0 && G == 1;
}

#ifdef ET_BLAS
#include <stdlib.h>
#ifdef ET_BLAS_MKL
/* Intel MKL's CBLAS (the PyPI package mkl: LP64, 32-bit indices; it ships no headers): the two
 * functions used, declared as mkl_cblas.h and mkl_service.h declare them */
typedef enum { CblasRowMajor = 101, CblasColMajor = 102 } CBLAS_LAYOUT;
typedef enum { CblasNoTrans = 111, CblasTrans = 112, CblasConjTrans = 113 } CBLAS_TRANSPOSE;
void cblas_sgemm(const CBLAS_LAYOUT, const CBLAS_TRANSPOSE, const CBLAS_TRANSPOSE, const int, const int, const int,
                 const float, const float *, const int, const float *, const int, const float, float *, const int);
void MKL_Set_Num_Threads(int);
#define ET_BLAS_SGEMM cblas_sgemm
#define ET_BLAS_SET_THREADS MKL_Set_Num_Threads
#else
#include <cblas.h>
#endif
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

/* the threaded library's GEMM tiles (shape only): a GEMM of at least 2 x ET_SGEMM_TILE_MACS multiply-adds is cut
 * along the longer side of C into at most ET_SGEMM_MAX_TILES tiles of about ET_SGEMM_TILE_MACS multiply-adds or
 * more, at least ET_SGEMM_TILE_MIN rows or columns each (multiples of 16 columns or 8 rows). A tile is one more
 * BLAS call that packs the other operand again: on one core (MKL, mbv2's and ResNet's GEMM shapes) tiles of 4M
 * multiply-adds and 64 columns cost 0-6 % over the whole GEMM, tiles of 1M or 32 columns up to 25 %; smaller
 * GEMMs are one call (bench/step_speed.py --threads) */
#ifndef ET_SGEMM_TILE_MACS
#define ET_SGEMM_TILE_MACS (4.0 * 1024 * 1024)
#endif
#ifndef ET_SGEMM_MAX_TILES
#define ET_SGEMM_MAX_TILES 32
#endif
#ifndef ET_SGEMM_TILE_MIN
#define ET_SGEMM_TILE_MIN 64
#endif
/* C = A B (transposes as asked), row-major; the thread count set once per library (with OpenMP: one, at every
 * call, 3 ns with MKL: the BLAS's count is the process's; the library's et_threads run its tiles) */
static void et_sgemm(int ta, int tb, int M, int N, int K, const float *A, int lda, const float *B, int ldb,
                     float beta, float *Cm, int ldc) {
    static int threads_set = 0;
#ifdef _OPENMP
    ET_BLAS_SET_THREADS(1); /* the threads split the GEMM in fixed tiles below */
    threads_set = 1;
#endif
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
#ifdef _OPENMP
    /* on the library's threads (et_common.h): C in tiles (ET_SGEMM_TILE_MACS), one single-threaded BLAS call each,
     * taken by the threads in turn; the tiles depend on the shape only, so every element of C is the same call's on
     * any thread count (OpenBLAS's and MKL's own threading pick other kernels with their thread count) */
    const double macs = (double)M * N * K;
    const int want = macs >= ET_SGEMM_MAX_TILES * ET_SGEMM_TILE_MACS ? ET_SGEMM_MAX_TILES : (int)(macs / ET_SGEMM_TILE_MACS);
    int tm = M, tn = N;
    if (want >= 2 && N >= M) {
        tn = ((N + want - 1) / want + 15) / 16 * 16;
        tn = tn < ET_SGEMM_TILE_MIN ? ET_SGEMM_TILE_MIN : tn;
    } else if (want >= 2) {
        tm = ((M + want - 1) / want + 7) / 8 * 8;
        tm = tm < ET_SGEMM_TILE_MIN ? ET_SGEMM_TILE_MIN : tm;
    }
    const int nm = (M + tm - 1) / tm, nn = (N + tn - 1) / tn;
    if (nm * nn > 1) {
        ET_PARALLEL_FOR_TILES(macs)
        for (int t = 0; t < nm * nn; ++t) {
            const int i0 = t / nn * tm, j0 = t % nn * tn, mi = M - i0 < tm ? M - i0 : tm, nj = N - j0 < tn ? N - j0 : tn;
            ET_BLAS_SGEMM(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, mi, nj, K, 1.0f,
                          ta ? A + i0 : A + (size_t)i0 * lda, lda, tb ? B + (size_t)j0 * ldb : B + j0, ldb, beta,
                          Cm + (size_t)i0 * ldc + j0, ldc);
        }
        return;
    }
#endif
    ET_BLAS_SGEMM(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, 1.0f, A,
                  lda, B, ldb, beta, Cm, ldc);
}

/* per-thread scratch buffers: slots 0-2 the GEMM path's (and the host kernels' that share it), 3-5 the
 * oneDNN operands' in its own layouts, 6 its scratchpad (et_float_dnnl.h) */
#define ET_SCRATCH_SLOTS 7
/* scratch buffer `slot` of this thread, at least n floats (grown, never shrunk), on a 64-byte boundary: a cache
 * line, and a whole AVX-512 vector. malloc's 16 bytes (glibc) put oneDNN's operands and the kernels' rows across
 * lines: ResNet-18's step at batch 8 took about 5 % longer (docs/benchmarks.md, "The host step, fifth look") */
static float *et_scratch(int slot, size_t n) {
    static __thread float *buf[ET_SCRATCH_SLOTS];
    static __thread size_t cap[ET_SCRATCH_SLOTS];
    if (n > cap[slot]) {
        free(buf[slot]);
        buf[slot] = (float *)aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64); /* a multiple of the boundary */
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

/* the columns of a block whose im2col has CK rows and whose output (or output gradient) has O: its
 * im2col and its output each about ET_COL_BLOCK_FLOATS (a 1x1 convolution of 8 channels into 48 at
 * 64x64 had gathered its whole batch's 6 MiB output in scratch, then scattered it back) */
ET_HOST_INLINE long et_block_budget(int CK, int O) {
    const int rows = CK > O ? CK : O;
    long w = ET_COL_BLOCK_FLOATS / (rows > 0 ? rows : 1);
    if (w < (long)ET_BLOCK_COLS_PER_O * O) w = (long)ET_BLOCK_COLS_PER_O * O;
    if (w < ET_BLOCK_MIN_COLS) w = ET_BLOCK_MIN_COLS;
    return w;
}

/* blocks of about w columns: whole images per block (> 0), or minus the output rows of one image
 * per block (< 0) */
ET_HOST_INLINE int et_block_step_for(int N, int HO, int WO, long w) {
    const long P = (long)HO * WO;
    if (w >= P || WO <= 0) {
        const long k = P > 0 ? w / P : N;
        return (int)(k < N ? k : N);
    }
    const long r = w / WO;
    return -(int)(r > 0 ? r : 1);
}

ET_HOST_INLINE int et_block_step(int N, int HO, int WO, int CK, int O) {
    return et_block_step_for(N, HO, WO, et_block_budget(CK, O));
}

/* one block of a convolution's GEMM columns: images [n0, n1), their output rows [oh0, oh1) */
typedef struct {
    int n0, n1, oh0, oh1, cols, step;
} et_block;

/* the blocks of `step` (et_block_step_for); their bounds come from et_block_at */
ET_HOST_INLINE et_block et_blocks_of(int step) {
    et_block b = {0, 0, 0, 0, 0, step};
    return b;
}

ET_HOST_INLINE et_block et_blocks(int N, int HO, int WO, int CK, int O) {
    return et_blocks_of(et_block_step(N, HO, WO, CK, O));
}

/* the blocks by index, in order (images, then output rows within one): how many, and the i-th of them */
ET_HOST_INLINE int et_block_count(et_block b, int N, int HO) {
    if (N <= 0) return 0;
    if (b.step > 0) return (N + b.step - 1) / b.step;
    return N * (HO > 0 ? (HO - b.step - 1) / -b.step : 1);
}

ET_HOST_INLINE et_block et_block_at(et_block b, int i, int N, int HO, int WO) {
    if (b.step > 0) {
        b.n0 = i * b.step;
        b.n1 = b.n0 + b.step < N ? b.n0 + b.step : N;
        b.oh0 = 0;
        b.oh1 = HO;
    } else {
        const int r = -b.step, per = HO > 0 ? (HO + r - 1) / r : 1;
        b.n0 = i / per;
        b.n1 = b.n0 + 1;
        b.oh0 = i % per * r;
        b.oh1 = b.oh0 + r < HO ? b.oh0 + r : HO;
    }
    b.cols = (b.n1 - b.n0) * (b.oh1 - b.oh0) * WO;
    return b;
}

/* a convolution's nb blocks (of macs_per_col multiply-adds a column) run side by side on the host's threads when
 * there are two or more and each block's GEMM is one BLAS call anyway (et_sgemm tiles only a GEMM of
 * 2 x ET_SGEMM_TILE_MACS or more; the first block is the largest): shape only, so every block computes what it
 * computes on one thread; larger blocks run one after another, each GEMM on the threads in tiles */
ET_HOST_INLINE int et_blocks_side_by_side(et_block b, int nb, int N, int HO, int WO, double macs_per_col) {
    return nb >= 2 && macs_per_col * et_block_at(b, 0, N, HO, WO).cols < 2 * ET_SGEMM_TILE_MACS;
}

/* the pieces of a convolution's columns: its blocks (et_blocks), cut further into about macs / ET_PIECE_MACS
 * pieces (at most ET_MAX_PIECES; whole images, or output rows of one image, and at least ET_BLOCK_MIN_COLS
 * columns), which the threaded library runs side by side and the serial one in turn. Shape only: the same pieces
 * in both libraries and on any thread count. Most of mbv2's 1x1 convolutions at batch 8 had been one block of the
 * whole batch (1-5 M multiply-adds: a single BLAS call on one thread, its images gathered side by side and back);
 * a piece of one image reads and writes it in place */
#ifndef ET_PIECE_MACS
#define ET_PIECE_MACS (512.0 * 1024)
#endif
#ifndef ET_MAX_PIECES
#define ET_MAX_PIECES 16
#endif
ET_HOST_INLINE et_block et_pieces(int N, int HO, int WO, int CK, int O) {
    long w = et_block_budget(CK, O);
    const double macs = (double)N * HO * WO * CK * O;
    const int q = macs >= ET_MAX_PIECES * ET_PIECE_MACS ? ET_MAX_PIECES : (int)(macs / ET_PIECE_MACS);
    if (q >= 2) {
        const long NP = (long)N * HO * WO;
        long wq = (NP + q - 1) / q;
        if (wq < ET_BLOCK_MIN_COLS) wq = ET_BLOCK_MIN_COLS;
        if (wq < w) w = wq;
    }
    return et_blocks_of(et_block_step_for(N, HO, WO, w));
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

/* one kernel tap's im2col rows d[oh - oh0][ow] = x[oh + dy][ow + dx] (0 outside the H x WO plane)
 * of a convolution of strides 1 whose output is as wide as its input: consecutive output rows read
 * consecutive input rows, so the rows in the plane are one copy (from column a of the first to
 * column b of the last, the columns in the plane), their columns outside [a, b) zeroed after it,
 * instead of a copy per row (ResNet's 3x3 convolutions: 32 floats each) */
static void et_im2col_plane_rows(const float *ET_RESTRICT x, float *ET_RESTRICT d, int oh0, int oh1, int H, int WO,
                                 int dy, int dx, int a, int b) {
    int r0 = oh0 > -dy ? oh0 : -dy, r1 = oh1 < H - dy ? oh1 : H - dy;
    if (r0 > oh1) r0 = oh1;
    if (r1 < r0) r1 = r0;
    memset(d, 0, (size_t)(r0 - oh0) * WO * sizeof(float));
    memset(d + (size_t)(r1 - oh0) * WO, 0, (size_t)(oh1 - r1) * WO * sizeof(float));
    if (r1 == r0) return;
    float *o = d + (size_t)(r0 - oh0) * WO;
    memcpy(o + a, x + (size_t)(r0 + dy) * WO + dx + a, ((size_t)(r1 - r0 - 1) * WO + (b - a)) * sizeof(float));
    for (int r = 0; r < r1 - r0; ++r, o += WO) {
        for (int ow = 0; ow < a; ++ow) o[ow] = 0.f;
        for (int ow = b; ow < WO; ++ow) o[ow] = 0.f;
    }
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
                    if (SH == 1 && SW == 1 && Wd == WO && b > a) {
                        et_im2col_plane_rows(x, d, oh0, oh1, H, WO, ki * DH - PH, kj * DW - PW, a, b);
                        continue;
                    }
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

/* ---- kernel rows as shifted windows (a vertical stride of 1, one image per block) ----------
 * With a vertical stride of 1, kernel row ki of output row oh reads input row oh - PH + ki*DH:
 * tap row ki's im2col rows are tap row 0's moved down ki*DH input rows. So a block of one
 * image builds the im2col of one kernel row only (C*KW rows over the R = RO + (KH-1)*DH input
 * rows from oh0 - PH, KH times less to write and read than the full im2col) and runs one GEMM
 * per kernel row over a window of it (columns from ki*DH*WO, leading dimension R*WO) with that
 * kernel row's weights: the weight gradient per kernel row, the input gradient summed into the
 * overlapping windows (beta 1) and back by a one-kernel-row col2im. Blocks of several images
 * keep the full im2col. The forward keeps it too: with its sums in that order torchvision's
 * resnet50 (tests/realmodels/test_c_backend.py) moved every gradient before layer4 by ~1e-3 from
 * both references and none of layer4's, as a ReLU decision at its threshold does (layer3.5's
 * output holds a pre-ReLU value 7.8e-6 from it in float64); the gradients feed no threshold. */
ET_HOST_INLINE int et_row_windows(int pointwise, int KH, int SH, int step) {
    return !pointwise && SH == 1 && KH > 1 && step <= 1;
}

/* the blocks of a convolution whose im2col has CK rows; *windows set when they take kernel row
 * windows, whose blocks are then sized by their one-kernel-row im2col (CK / KH rows) */
ET_HOST_INLINE et_block et_conv_blocks(int N, int HO, int WO, int CK, int O, int pointwise, int KH, int SH,
                                       int *windows) {
    const et_block b = et_blocks(N, HO, WO, CK, O);
    *windows = et_row_windows(pointwise, KH, SH, b.step);
    if (!*windows) return b;
    const et_block w = et_blocks(N, HO, WO, CK / KH, O);
    return w.step <= 1 ? w : b;
}

/* input rows of a block of RO output rows that its kernel rows read */
ET_HOST_INLINE int et_window_rows(int RO, int KH, int DH) { return RO + (KH - 1) * DH; }

/* the block's one-kernel-row im2col in scratch 0: [C*KW][R*WO] from input row oh0 - PH */
static float *et_row_cols(const float *X, int n0, int oh0, int R, int C, int H, int Wd, int WO, int KW, int SW,
                          int PH, int PW, int DW) {
    float *m = et_scratch(0, (size_t)C * KW * R * WO);
    if (m) et_im2col(X, m, n0, n0 + 1, oh0 - PH, oh0 - PH + R, C, H, Wd, WO, 1, KW, 1, SW, 0, PW, 1, DW);
    return m;
}

/* WK[ki][o][c*KW + kj] = W[o][c][ki][kj] in scratch 2: each kernel row's weights as a matrix */
static const float *et_weights_by_row(const float *W, int O, int C, int KH, int KW) {
    float *m = et_scratch(2, (size_t)KH * O * C * KW);
    if (!m) return 0;
    for (int o = 0; o < O; ++o)
        for (int c = 0; c < C; ++c)
            for (int ki = 0; ki < KH; ++ki)
                memcpy(m + ((size_t)ki * O + o) * C * KW + (size_t)c * KW, W + (((size_t)o * C + c) * KH + ki) * KW,
                       (size_t)KW * sizeof(float));
    return m;
}

/* one block of et_conv_fwd_blas; 0 when out of memory */
static int et_conv_fwd_block(et_block b, const float *X, const float *W, const float *B, float *Y, int C, int H, int Wd,
                             int O, int HO, int WO, int KH, int KW, int SH, int SW, int PH, int PW, int DH, int DW) {
    const int P = HO * WO, CK = C * KH * KW, pw = et_conv_pointwise(KH, KW, SH, SW, PH, PW, 1);
    const int n0 = b.n0, n1 = b.n1, oh0 = b.oh0, oh1 = b.oh1, cols = b.cols;
    int ldb;
    const float *col = et_block_cols(X, pw, n0, n1, oh0, oh1, cols, C, H, Wd, WO, KH, KW, SH, SW, PH, PW, DH, DW, &ldb);
    if (!col) return 0;
    if (n1 - n0 == 1) { /* straight into the image's output rows */
        float *y = Y + (size_t)n0 * O * P + (size_t)oh0 * WO;
        if (B)
            for (int o = 0; o < O; ++o)
                for (int p = 0; p < cols; ++p) y[(size_t)o * P + p] = B[o];
        et_sgemm(0, 0, O, cols, CK, W, CK, col, ldb, B ? 1.f : 0.f, y, P);
        return 1;
    }
    float *out = et_scratch(1, (size_t)O * cols);
    if (!out) return 0;
    et_sgemm(0, 0, O, cols, CK, W, CK, col, ldb, 0.f, out, cols);
    et_batch_uncols(out, B, Y + (size_t)n0 * O * P, n1 - n0, O, P);
    return 1;
}

ET_BLAS_FN void et_conv_fwd_blas(const float *X, const float *W, const float *B, float *Y, int N, int C, int H, int Wd,
                                 int O, int HO, int WO, int KH, int KW, int SH, int SW, int PH, int PW, int DH, int DW) {
    const et_block b = et_pieces(N, HO, WO, C * KH * KW, O);
    const int nb = et_block_count(b, N, HO);
    const double per_col = (double)O * C * KH * KW;
    if (et_blocks_side_by_side(b, nb, N, HO, WO, per_col)) { /* the blocks' outputs are disjoint */
        ET_PARALLEL_FOR(per_col * N * HO * WO)
        for (int i = 0; i < nb; ++i)
            et_conv_fwd_block(et_block_at(b, i, N, HO, WO), X, W, B, Y, C, H, Wd, O, HO, WO, KH, KW, SH, SW, PH, PW,
                              DH, DW);
        return;
    }
    for (int i = 0; i < nb; ++i)
        if (!et_conv_fwd_block(et_block_at(b, i, N, HO, WO), X, W, B, Y, C, H, Wd, O, HO, WO, KH, KW, SH, SW, PH, PW,
                               DH, DW))
            return;
}

/* the weight gradient in pieces (et_pieces; side by side on the threads), when there are two or more, each one
 * BLAS call (et_blocks_side_by_side) and their partial gradients (in scratch 2) at most ET_PIECE_PARTIALS floats:
 * each piece's GY col^T into its own partial, then the partials summed in piece order, element by element. The
 * sums' order is the pieces', not the thread count's. Returns 0, having done nothing, otherwise (the blocks then
 * add into GW one after another) */
#ifndef ET_PIECE_PARTIALS
#define ET_PIECE_PARTIALS ((size_t)1 << 20)
#endif
static int et_conv_grad_weight_pieces(const float *X, const float *GY, float *GW, int N, int C, int H, int Wd, int O,
                                      int HO, int WO, int KH, int KW, int SH, int SW, int PH, int PW, int DH, int DW) {
    const int P = HO * WO, CK = C * KH * KW, pw = et_conv_pointwise(KH, KW, SH, SW, PH, PW, 1);
    const et_block b = et_pieces(N, HO, WO, CK, O);
    const int nb = et_block_count(b, N, HO);
    const size_t OCK = (size_t)O * CK;
    if (!et_blocks_side_by_side(b, nb, N, HO, WO, (double)OCK) || (size_t)nb * OCK > ET_PIECE_PARTIALS) return 0;
    float *part = et_scratch(2, (size_t)nb * OCK);
    if (!part) return 0;
    ET_PARALLEL_FOR((double)OCK * N * P)
    for (int i = 0; i < nb; ++i) {
        const et_block k = et_block_at(b, i, N, HO, WO);
        int ldb, lda;
        const float *col = et_block_cols(X, pw, k.n0, k.n1, k.oh0, k.oh1, k.cols, C, H, Wd, WO, KH, KW, SH, SW, PH, PW,
                                         DH, DW, &ldb);
        const float *gy = et_block_rows(GY, O, P, k.n0, k.n1, k.oh0, WO, k.cols, 1, &lda);
        if (col && gy)
            et_sgemm(0, 1, O, CK, k.cols, gy, lda, col, ldb, 0.f, part + (size_t)i * OCK, CK);
        else /* out of memory (et_scratch said so): this piece adds nothing rather than what the buffer held */
            memset(part + (size_t)i * OCK, 0, OCK * sizeof(float));
    }
    ET_PARALLEL_FOR((double)nb * OCK)
    for (size_t e = 0; e < OCK; ++e) {
        float s = part[e];
        for (int i = 1; i < nb; ++i) s += part[(size_t)i * OCK + e];
        GW[e] = s;
    }
    return 1;
}

ET_BLAS_FN void et_conv_grad_weight_blas(const float *X, const float *GY, float *GW, int N, int C, int H, int Wd, int O,
                                         int HO, int WO, int KH, int KW, int SH, int SW, int PH, int PW, int DH,
                                         int DW) {
    const int P = HO * WO, CK = C * KH * KW, CKW = C * KW, pw = et_conv_pointwise(KH, KW, SH, SW, PH, PW, 1);
    float beta = 0.f; /* GW = the first block's GY col^T, then the others' added */
    int windows;
    const et_block b = et_conv_blocks(N, HO, WO, CK, O, pw, KH, SH, &windows);
    const int nb = et_block_count(b, N, HO);
    /* kernel row windows: GK[ki][o][c*KW + kj] summed over the blocks, then put in GW's order */
    float *GK = windows ? et_scratch(2, (size_t)KH * O * CKW) : 0;
    if (GK) {
        for (int i = 0; i < nb; ++i) {
            const et_block k = et_block_at(b, i, N, HO, WO);
            const int n0 = k.n0, oh0 = k.oh0, cols = k.cols, R = et_window_rows(k.oh1 - oh0, KH, DH);
            const float *rc = et_row_cols(X, n0, oh0, R, C, H, Wd, WO, KW, SW, PH, PW, DW);
            if (!rc) return;
            const float *gy = GY + (size_t)n0 * O * P + (size_t)oh0 * WO;
            for (int ki = 0; ki < KH; ++ki)
                et_sgemm(0, 1, O, CKW, cols, gy, P, rc + (size_t)ki * DH * WO, R * WO, beta,
                         GK + (size_t)ki * O * CKW, CKW);
            beta = 1.f;
        }
        for (int o = 0; o < O; ++o)
            for (int c = 0; c < C; ++c)
                for (int ki = 0; ki < KH; ++ki)
                    memcpy(GW + (((size_t)o * C + c) * KH + ki) * KW, GK + ((size_t)ki * O + o) * CKW + (size_t)c * KW,
                           (size_t)KW * sizeof(float));
        if (beta == 0.f) memset(GW, 0, (size_t)O * CK * sizeof(float));
        return;
    }
    if (et_conv_grad_weight_pieces(X, GY, GW, N, C, H, Wd, O, HO, WO, KH, KW, SH, SW, PH, PW, DH, DW)) return;
    for (int i = 0; i < nb; ++i) {
        const et_block k = et_block_at(b, i, N, HO, WO);
        const int n0 = k.n0, n1 = k.n1, oh0 = k.oh0, oh1 = k.oh1, cols = k.cols;
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

/* one block of et_conv_grad_input_blas (WK: the weights by kernel row when its blocks take row windows); 0 when
 * out of memory */
static int et_conv_grad_input_block(et_block b, const float *GY, const float *W, const float *WK, float *GX, int C,
                                    int H, int Wd, int O, int HO, int WO, int KH, int KW, int SH, int SW, int PH,
                                    int PW, int DH, int DW) {
    const int P = HO * WO, CK = C * KH * KW, CKW = C * KW, pw = et_conv_pointwise(KH, KW, SH, SW, PH, PW, 1);
    const int n0 = b.n0, n1 = b.n1, oh0 = b.oh0, oh1 = b.oh1, cols = b.cols;
    int lda;
    const float *gy = et_block_rows(GY, O, P, n0, n1, oh0, WO, cols, 1, &lda);
    if (!gy) return 0;
    if (WK) { /* one image: each kernel row's W^T GY summed into its window, then its rows back */
        const int R = et_window_rows(oh1 - oh0, KH, DH);
        const size_t RW = (size_t)R * WO; /* kernel row 0's window: the first `cols` of each RW */
        float *rc = et_scratch(0, (size_t)CKW * RW);
        if (!rc) return 0;
        for (int r = 0; r < CKW; ++r) memset(rc + r * RW + cols, 0, (RW - cols) * sizeof(float));
        for (int ki = 0; ki < KH; ++ki)
            et_sgemm(1, 0, CKW, cols, O, WK + (size_t)ki * O * CKW, CKW, gy, lda, ki ? 1.f : 0.f,
                     rc + (size_t)ki * DH * WO, (int)RW);
        et_col2im(rc, GX, n0, n0 + 1, oh0 - PH, oh0 - PH + R, C, H, Wd, H, WO, 1, KW, 1, SW, 0, PW, 1, DW);
        return 1;
    }
    if (pw && n1 - n0 == 1) { /* straight into the image's input-gradient rows */
        et_sgemm(1, 0, C, cols, O, W, C, gy, lda, 0.f, GX + (size_t)n0 * C * P + (size_t)oh0 * WO, P);
        return 1;
    }
    float *col = et_scratch(0, (size_t)CK * cols);
    if (!col) return 0;
    et_sgemm(1, 0, CK, cols, O, W, CK, gy, lda, 0.f, col, cols); /* col = W^T GY */
    if (pw)
        et_batch_uncols(col, (const float *)0, GX + (size_t)n0 * C * P, n1 - n0, C, P);
    else
        et_col2im(col, GX, n0, n1, oh0, oh1, C, H, Wd, HO, WO, KH, KW, SH, SW, PH, PW, DH, DW);
    return 1;
}

ET_BLAS_FN void et_conv_grad_input_blas(const float *GY, const float *W, float *GX, int N, int C, int H, int Wd, int O,
                                        int HO, int WO, int KH, int KW, int SH, int SW, int PH, int PW, int DH, int DW) {
    const int CK = C * KH * KW, pw = et_conv_pointwise(KH, KW, SH, SW, PH, PW, 1);
    if (!pw) memset(GX, 0, (size_t)N * C * H * Wd * sizeof(float));
    int windows;
    et_block b = et_conv_blocks(N, HO, WO, CK, O, pw, KH, SH, &windows);
    const float *WK = windows ? et_weights_by_row(W, O, C, KH, KW) : 0;
    if (!windows) b = et_pieces(N, HO, WO, CK, O);
    const int nb = et_block_count(b, N, HO);
    /* side by side where the blocks write disjoint parts of GX: a 1x1 convolution's, or whole images (a block of
     * some output rows adds into the input rows its neighbours' windows reach too) */
    if ((pw || b.step > 0) && et_blocks_side_by_side(b, nb, N, HO, WO, (double)O * CK)) {
        ET_PARALLEL_FOR((double)O * CK * N * HO * WO)
        for (int i = 0; i < nb; ++i)
            et_conv_grad_input_block(et_block_at(b, i, N, HO, WO), GY, W, WK, GX, C, H, Wd, O, HO, WO, KH, KW, SH, SW,
                                     PH, PW, DH, DW);
        return;
    }
    for (int i = 0; i < nb; ++i)
        if (!et_conv_grad_input_block(et_block_at(b, i, N, HO, WO), GY, W, WK, GX, C, H, Wd, O, HO, WO, KH, KW, SH, SW,
                                      PH, PW, DH, DW))
            return;
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
#endif /* ET_BLAS */

#endif /* ET_FLOAT_BLAS_H */
