/* edgetrain C runtime: the host library's 3x3 stride-1 convolutions (one group, no dilation) as
 * Winograd F(4x4, 3x3) or F(2x2, 3x3) (included by et_float_gemm.h, which calls it before oneDNN and the
 * GEMM path for the forward, the input gradient and the weight gradient, and by et_float_fused.h's fused
 * weight gradient and update; each returns 0 for a shape it leaves to them).
 *
 * With ET_BLAS defined (the host library when a BLAS is installed: backends/c/blas.py), each 2x2
 * block of output pixels (a tile) is computed from the 4x4 input pixels under it as
 * Y = A^T [(G g G^T) .* (B^T d B)] A (Lavin and Gray, "Fast Algorithms for Convolutional Neural
 * Networks", 2016): 16 multiplies per input channel for 4 outputs instead of 36. Summed over the
 * input channels, the 16 elementwise products are 16 GEMMs, U[k] (O x C) times V[k] (C x tiles).
 * Where the convolution has enough 4x4 tiles (et_wino_tile: ET_WINO4_MIN_TILES), each 4x4 block of outputs
 * comes from the 6x6 input pixels under it in the same way with the paper's F(4x4, 3x3) matrices (the points
 * 0, 1, -1, 2, -2): 36 products for 16 outputs, 2.25 multiplies an output instead of F(2x2, 3x3)'s 4, and
 * transforms of 2.25 values an output instead of 4; its roundings are a few times F(2x2, 3x3)'s (the
 * transforms multiply by up to 8 and divide by 6 and 24). Everything below is written for both tile sizes,
 * m = 2 or 4 output pixels a side, kk = (m + 2)^2 products.
 * The input gradient of such a convolution is one too: the output gradient padded by 2 - P convolved
 * with the weights transposed and turned by 180 degrees (`flip`). The weight gradient is the adjoint:
 * dU[k] = dM[k] V[k]^T summed over the tiles (dM = A dY A^T per tile), then G^T dU G.
 *
 * The GEMMs run on oneDNN's matmul where the library has oneDNN, else on the BLAS
 * (et_wino_gemm_lib). The transforms are additions and halvings: the results are float32 sums in
 * another order than the direct convolution's, within a few float32 roundings of them
 * (tests/backends/c/test_wino.py), and the same on any thread count: the forward's and the input
 * gradient's tiles go in blocks fixed by the shape (whole tile rows, at least ET_WINO_BLOCK_TILES tiles,
 * about ET_WINO_BLOCK_BYTES of transforms), a block on one thread or the blocks in turn on all threads; the
 * weight gradient's blocks go one after another in a fixed order. Scratch: et_float_blas.h's slots 0-3
 * (and 4 for the fused update).
 *
 * It takes convolutions of at least ET_WINO_MIN_CH input and output channels, ET_WINO_MIN_MACS
 * multiply-adds and ET_WINO_MIN_TILES tiles (ResNet-18's 512-channel layers at 4x4 pixels and batch 8,
 * 32 tiles, were as fast on oneDNN: their weights' transform is most of their work), whose output rows
 * are at most ET_WINO_MAX_WIDTH pixels (a row's transforms are on the stack). ET_WINO=0 leaves it out
 * (oneDNN or the GEMM path compute every convolution, as before), ET_WINO_GRAD_WEIGHT=0 leaves the weight
 * gradients to them; et_wino_tune turns it off in a loaded library. Measured: docs/benchmarks.md,
 * "Winograd". Layout: NCHW activations, weights [O][C][3][3]. Header-only. */
#ifndef ET_FLOAT_WINO_H
#define ET_FLOAT_WINO_H
#include "et_float_blas.h"
#include "et_float_dnnl.h"

#ifdef ET_BLAS
/* 0: the path left out of the build */
#ifndef ET_WINO
#define ET_WINO 1
#endif
/* 0: the weight gradients left to oneDNN or the GEMM path */
#ifndef ET_WINO_GRAD_WEIGHT
#define ET_WINO_GRAD_WEIGHT 1
#endif
/* the convolutions taken: at least this many input and output channels, multiply-adds and tiles, output rows
 * of at most this many pixels */
#ifndef ET_WINO_MIN_CH
#define ET_WINO_MIN_CH 16
#endif
#ifndef ET_WINO_MIN_MACS
#define ET_WINO_MIN_MACS (2.0 * 1024 * 1024)
#endif
#ifndef ET_WINO_MIN_TILES
#define ET_WINO_MIN_TILES 64
#endif
#ifndef ET_WINO_MAX_WIDTH
#define ET_WINO_MAX_WIDTH 512
#endif
/* a block of tile rows: about this many bytes of transforms (the forward's and the input gradient's; the
 * weight gradient's), and at least this many tiles (narrower GEMMs ran slower on a Zen 5) */
#ifndef ET_WINO_BLOCK_BYTES
#define ET_WINO_BLOCK_BYTES (1024.0 * 1024)
#endif
#ifndef ET_WINO_GW_BLOCK_BYTES
#define ET_WINO_GW_BLOCK_BYTES (4.0 * 1024 * 1024)
#endif
#ifndef ET_WINO_BLOCK_TILES
#define ET_WINO_BLOCK_TILES 256
#endif
/* 0: F(2x2, 3x3) only. Else F(4x4, 3x3) for a forward or input gradient with at least ET_WINO4_MIN_TILES 4x4
 * tiles and a weight gradient with at least ET_WINO4_GW_MIN_TILES (et_wino_tile), its blocks at least
 * ET_WINO4_BLOCK_TILES tiles. On a Zen 5 (bench/wino_layers.py, batch 8), F(4x4, 3x3) took 0.71-0.85x
 * F(2x2, 3x3)'s time on ResNet-18's 64:32 and 128:16 layers (512 and 128 tiles) and 0.65x on the latter's
 * weight gradient; on the 256:8 layer (32 tiles) its forward took 1.02x and its input gradient 1.25x (the
 * weights' transform, 36 x 256 x 256 values, is most of their work), its weight gradient 0.66x: docs/benchmarks.md,
 * "Winograd F(4x4, 3x3)" */
#ifndef ET_WINO4
#define ET_WINO4 1
#endif
#ifndef ET_WINO4_MIN_TILES
#define ET_WINO4_MIN_TILES 128
#endif
#ifndef ET_WINO4_GW_MIN_TILES
#define ET_WINO4_GW_MIN_TILES 32
#endif
/* (blocks of at least 256 and 512 tiles took 1.03-1.14x as long on the 64:32 layer, one run, 64-tile chunks:
 * bench/wino_layers.py --layers 64:32 --cflags="-DET_WINO4_CHUNK=64 -DET_WINO4_BLOCK_TILES=256", and =512) */
#ifndef ET_WINO4_BLOCK_TILES
#define ET_WINO4_BLOCK_TILES 128
#endif
/* a block's kk products in this many calls of kk / ET_WINO_CALLS each (oneDNN's matmul: 16 calls of one
 * product took about a third longer than 1 of 16 or 4 of 4 on a Zen 5) */
#ifndef ET_WINO_CALLS
#define ET_WINO_CALLS 4
#endif
_Static_assert(ET_WINO_CALLS >= 1 && 16 % ET_WINO_CALLS == 0 && 36 % ET_WINO_CALLS == 0,
               "ET_WINO_CALLS must divide 16 and 36");
/* the products' rows (output channels; the weight gradient's rows of dU) in pieces, so that the calls that can
 * run at once number at least ET_WINO_SPREAD where the rows allow: pieces of at least ET_WINO_MIN_PIECE rows, a
 * multiple of 8. Fixed by the shape, like the blocks: the same calls on any thread count. Before, a convolution
 * of one or two blocks ran its products on at most 4 or 8 threads (docs/benchmarks.md, "The host step on 1 to 16
 * threads, second time"). On a Zen 5, ResNet-18's one-thread step took 1.13x as long as with whole products
 * with pieces of 32 rows strided in the whole products (6ed5670's form, -DET_WINO_MIN_PIECE=32), and with
 * pieces of 64 rows, each in matrices of its own (et_wino_row), as long */
#ifndef ET_WINO_SPREAD
#define ET_WINO_SPREAD 16
#endif
#ifndef ET_WINO_MIN_PIECE
#define ET_WINO_MIN_PIECE 64
#endif
/* oneDNN matmuls kept: a shape each */
#ifndef ET_WINO_ENTRIES
#define ET_WINO_ENTRIES 128
#endif

#ifdef ET_DNNL_ON
/* a oneDNN matmul of one shape (et_wino_products), plain row-major operands, its scratchpad the calling
 * thread's (blocks run on several threads at once) */
typedef struct {
    int b, M, K, N, tb; /* b products of M x K times K x N (tb: the second stored N x K) */
    dnnl_primitive_t mm;
    dnnl_memory_desc_t md[3], pad; /* the two operands and the result; the scratchpad */
    size_t pad_size;
} et_wino_mm;
#endif

/* this loaded library's setting (et_wino_tune), the GEMMs' library and the convolutions it has computed
 * (tests read them through ctypes) */
typedef struct {
    int off;
    int gemm; /* 0 not chosen yet, 1 the BLAS, 2 oneDNN's matmul */
    long calls, calls4; /* the convolutions computed, and those of them as F(4x4, 3x3) */
#ifdef ET_DNNL_ON
    int n;
    et_wino_mm mm[ET_WINO_ENTRIES];
#endif
} et_wino_table;
__attribute__((weak, visibility("hidden"))) et_wino_table et_wino;
/* turns this library's Winograd path on (1) or off (0; on where ET_WINO built it in), and sets its GEMMs'
 * library: 1 the BLAS, 2 oneDNN's matmul, 0 this CPU's choice (et_wino_gemm_lib); returns 0, changing
 * nothing, for oneDNN in a library without it */
__attribute__((weak)) int et_wino_tune(int on, int gemm) {
#ifndef ET_DNNL_ON
    if (gemm == 2) return 0;
#endif
    et_wino.off = !on;
    et_wino.gemm = gemm == 1 || gemm == 2 ? gemm : 0;
    return 1;
}
__attribute__((weak)) long et_wino_convolutions(void) { return et_wino.calls; }
__attribute__((weak)) long et_wino_convolutions4(void) { return et_wino.calls4; }
/* the GEMMs' library: 1 the BLAS, 2 oneDNN's matmul, 0 not chosen yet (no convolution on the path so far) */
__attribute__((weak)) int et_wino_gemms(void) { return et_wino.gemm; }

/* where the 16 GEMMs run: oneDNN's matmul where oneDNN is in the library, else the BLAS. On a Zen 5 core,
 * per layer of ResNet-18's 32x32 to 8x8 stages at batch 8 (bench/wino_layers.py), the path on oneDNN's
 * matmul took 0.60-0.70x its time on OpenBLAS (which takes its AVX2 kernels there) and, with oneDNN held to
 * AVX2 (ONEDNN_MAX_CPU_ISA=AVX2), 0.92-0.98x: docs/benchmarks.md, "Winograd" */
ET_HOST_INLINE int et_wino_gemm_lib(void) {
    if (!et_wino.gemm) {
#ifdef ET_DNNL_ON
        et_wino.gemm = 2;
#else
        et_wino.gemm = 1;
#endif
    }
    return et_wino.gemm;
}

/* a convolution this path takes: 3x3, stride 1, no dilation, padding 0-2, enough channels and work */
ET_HOST_INLINE int et_wino_fits(int N, int C, int O, int HO, int WO, int KH, int KW, int SH, int SW, int PH, int PW, int DH,
                                int DW, double macs) {
    return ET_WINO && KH == 3 && KW == 3 && SH == 1 && SW == 1 && DH == 1 && DW == 1 && PH >= 0 && PH <= 2 &&
           PW >= 0 && PW <= 2 && C >= ET_WINO_MIN_CH && O >= ET_WINO_MIN_CH && WO <= ET_WINO_MAX_WIDTH &&
           (double)N * ((HO + 1) / 2) * ((WO + 1) / 2) >= ET_WINO_MIN_TILES && macs >= ET_WINO_MIN_MACS && !et_wino.off;
}

/* the output tile's side for such a convolution, m: 4 (F(4x4, 3x3)) where it has at least `least` 4x4 tiles
 * (ET_WINO4_MIN_TILES, or ET_WINO4_GW_MIN_TILES for a weight gradient), else 2 (F(2x2, 3x3)); and its products,
 * kk = (m + 2)^2. Both depend on the shape only */
ET_HOST_INLINE int et_wino_tile(int N, int HO, int WO, int least) {
    return ET_WINO4 && (double)N * ((HO + 3) / 4) * ((WO + 3) / 4) >= least ? 4 : 2;
}
ET_HOST_INLINE int et_wino_kk(int m) { return (m + 2) * (m + 2); }

/* the rows of a piece of a product's R rows where `calls` calls of whole products can run at once: pieces
 * enough for ET_WINO_SPREAD calls, at least ET_WINO_MIN_PIECE rows each and a multiple of 8, the last one
 * shorter; R (one piece) where the calls are enough. Depends on the shape only */
ET_HOST_INLINE int et_wino_piece_rows(int R, int calls) {
    const int want = (ET_WINO_SPREAD + calls - 1) / calls;
    int rows = (R + want - 1) / want;
    rows = (rows + 7) / 8 * 8;
    if (rows < ET_WINO_MIN_PIECE) rows = ET_WINO_MIN_PIECE;
    return rows < R ? rows : R;
}

/* where row o of product k is in an array of kk products of R rows of X values held in pieces of pr rows:
 * piece p's kk products together, each its np rows (pr, the last piece's fewer), so that a piece's products
 * are whole matrices (oneDNN's matmul ran strided rows of a piece on a slower kernel). With one piece
 * (pr = R) it is [kk][R][X] */
ET_HOST_INLINE int et_wino_piece_n(int o, int R, int pr) { /* the rows of row o's piece */
    const int first = o / pr * pr;
    return R - first < pr ? R - first : pr;
}
ET_HOST_INLINE size_t et_wino_row(int kk, int k, int o, int R, int pr, size_t X) {
    const int first = o / pr * pr;
    return ((size_t)kk * first + (size_t)k * et_wino_piece_n(o, R, pr) + (o - first)) * X;
}

/* the distance from row o of product k to row o of product k + 1 in such an array */
ET_HOST_INLINE size_t et_wino_kstep(int o, int R, int pr, size_t X) { return (size_t)et_wino_piece_n(o, R, pr) * X; }

/* the calls of a block's products: ET_WINO_CALLS for each piece of pr of the R rows (et_wino_item) */
ET_HOST_INLINE int et_wino_items(int R, int pr) { return ET_WINO_CALLS * ((R + pr - 1) / pr); }

/* the weights' transform and the weight gradient's last one work on one output channel's runs of ET_WINO_RUN input
 * channels at a time: kk rows written (read) in order (a float each at 16 addresses O C apart, per pair, took 30 ns
 * on a 512 x 512 layer). F(4x4, 3x3)'s matrices hold sixths and twenty-fourths */
enum { ET_WINO_RUN = 64 };
#define ET_W4_S6 (1.f / 6)
#define ET_W4_S12 (1.f / 12)
#define ET_W4_S24 (1.f / 24)

/* U[k] = (G g G^T)[k] for a run of nc weights g (g[i][c]: tap i of the run's channel c) as F(2x2, 3x3): u is U[0]
 * at the run's first channel, ks the distance from U[k] to U[k + 1] */
ET_HOST_INLINE void et_wino2_weight_run(float (*ET_RESTRICT g)[ET_WINO_RUN], float *ET_RESTRICT u, size_t ks, int nc) {
    float t[12][ET_WINO_RUN];
    for (int j = 0; j < 3; ++j) /* G g: 4 rows of 3 */
        for (int c = 0; c < nc; ++c) {
            t[j][c] = g[j][c];
            t[3 + j][c] = 0.5f * (g[j][c] + g[3 + j][c] + g[6 + j][c]);
            t[6 + j][c] = 0.5f * (g[j][c] - g[3 + j][c] + g[6 + j][c]);
            t[9 + j][c] = g[6 + j][c];
        }
    for (int i = 0; i < 4; ++i) { /* (G g) G^T */
        float *u0 = u + (size_t)(4 * i) * ks, *u1 = u0 + ks, *u2 = u1 + ks, *u3 = u2 + ks;
        const float *a = t[3 * i], *b = t[3 * i + 1], *d = t[3 * i + 2];
        for (int c = 0; c < nc; ++c) {
            u0[c] = a[c];
            u1[c] = 0.5f * (a[c] + b[c] + d[c]);
            u2[c] = 0.5f * (a[c] - b[c] + d[c]);
            u3[c] = d[c];
        }
    }
}

/* the same as F(4x4, 3x3): 36 values */
ET_HOST_INLINE void et_wino4_weight_run(float (*ET_RESTRICT g)[ET_WINO_RUN], float *ET_RESTRICT u, size_t ks, int nc) {
    float t[18][ET_WINO_RUN];
    for (int j = 0; j < 3; ++j) /* G g: 6 rows of 3 */
        for (int c = 0; c < nc; ++c) {
            const float a = g[j][c], b = g[3 + j][c], d = g[6 + j][c];
            t[j][c] = 0.25f * a;
            t[3 + j][c] = -ET_W4_S6 * (a + b + d);
            t[6 + j][c] = -ET_W4_S6 * (a - b + d);
            t[9 + j][c] = ET_W4_S24 * a + ET_W4_S12 * b + ET_W4_S6 * d;
            t[12 + j][c] = ET_W4_S24 * a - ET_W4_S12 * b + ET_W4_S6 * d;
            t[15 + j][c] = d;
        }
    for (int i = 0; i < 6; ++i) { /* (G g) G^T: U[6 i + j] */
        float *u0 = u + (size_t)(6 * i) * ks, *u1 = u0 + ks, *u2 = u1 + ks, *u3 = u2 + ks, *u4 = u3 + ks, *u5 = u4 + ks;
        const float *a = t[3 * i], *b = t[3 * i + 1], *d = t[3 * i + 2];
        for (int c = 0; c < nc; ++c) {
            u0[c] = 0.25f * a[c];
            u1[c] = -ET_W4_S6 * (a[c] + b[c] + d[c]);
            u2[c] = -ET_W4_S6 * (a[c] - b[c] + d[c]);
            u3[c] = ET_W4_S24 * a[c] + ET_W4_S12 * b[c] + ET_W4_S6 * d[c];
            u4[c] = ET_W4_S24 * a[c] - ET_W4_S12 * b[c] + ET_W4_S6 * d[c];
            u5[c] = d[c];
        }
    }
}

/* U[k][o][c] = (G g G^T)[k] for the convolution's output channel o and input channel c (O x C, in pieces of
 * pr rows: et_wino_row), tiles of m x m outputs: g is W[o][c] or, with `flip`, W[c][o] turned by 180 degrees
 * (W then [C][O][3][3]) */
ET_HOST_INLINE void et_wino_weights(int m, const float *ET_RESTRICT W, float *ET_RESTRICT U, int O, int C, int flip,
                                    int pr) {
    const size_t OC = (size_t)O * C;
    const int kk = et_wino_kk(m);
    ET_PARALLEL_FOR(OC * 2.5 * kk)
    for (int o = 0; o < O; ++o)
        for (int c0 = 0; c0 < C; c0 += ET_WINO_RUN) {
            const int nc = C - c0 < ET_WINO_RUN ? C - c0 : ET_WINO_RUN;
            float g[9][ET_WINO_RUN];
            for (int c = 0; c < nc; ++c) {
                const float *w = flip ? W + ((size_t)(c0 + c) * O + o) * 9 : W + ((size_t)o * C + c0 + c) * 9;
                for (int i = 0; i < 9; ++i) g[i][c] = flip ? w[8 - i] : w[i];
            }
            float *u = U + et_wino_row(kk, 0, o, O, pr, C) + c0;
            if (m == 4) et_wino4_weight_run(g, u, et_wino_kstep(o, O, pr, C), nc);
            else et_wino2_weight_run(g, u, et_wino_kstep(o, O, pr, C), nc);
        }
}

/* V[k][c][t] = (B^T d B)[k] for the tiles of tile row ty of one input channel's plane Xc (H x Wd): Vt is
 * V[0][c] at the row's first tile, kstep the distance from V[k] to V[k + 1] (C x the block's tiles) */
ET_HOST_INLINE void et_wino_input_row(const float *ET_RESTRICT Xc, float *ET_RESTRICT Vt, size_t kstep, int H,
                                      int Wd, int TW, int ty, int PH, int PW) {
    const int L = 2 * TW + 2, n = Wd < L - PW ? Wd : L - PW; /* padded row length, input pixels in it */
    float d[4][ET_WINO_MAX_WIDTH + 4], w[4][ET_WINO_MAX_WIDTH + 4];
    for (int i = 0; i < 4; ++i) { /* the four input rows under the tile row, zero-padded */
        const int r = 2 * ty - PH + i;
        float *di = d[i];
        if (r < 0 || r >= H) {
            memset(di, 0, (size_t)L * sizeof(float));
            continue;
        }
        for (int j = 0; j < PW; ++j) di[j] = 0.f;
        memcpy(di + PW, Xc + (size_t)r * Wd, (size_t)n * sizeof(float));
        for (int j = PW + n; j < L; ++j) di[j] = 0.f;
    }
    ET_SIMD
    for (int j = 0; j < L; ++j) { /* B^T d, down each column */
        w[0][j] = d[0][j] - d[2][j];
        w[1][j] = d[1][j] + d[2][j];
        w[2][j] = d[2][j] - d[1][j];
        w[3][j] = d[1][j] - d[3][j];
    }
    for (int i = 0; i < 4; ++i) { /* (B^T d) B, along each row: V[4i + j] */
        const float *wi = w[i];
        float *v0 = Vt + (size_t)(4 * i) * kstep, *v1 = v0 + kstep, *v2 = v1 + kstep, *v3 = v2 + kstep;
        for (int tx = 0; tx < TW; ++tx) {
            const float a = wi[2 * tx], b = wi[2 * tx + 1], c = wi[2 * tx + 2], e = wi[2 * tx + 3];
            v0[tx] = a - c;
            v1[tx] = b + c;
            v2[tx] = c - b;
            v3[tx] = b - e;
        }
    }
}

/* F(4x4, 3x3)'s transforms (m = 4, 36 products), the paper's matrices (B^T 6x6, G 6x3, A^T 4x6). Its weights'
 * transform and its weight gradient's last one are et_wino4_weight_run and et_wino4_gw_run above. Its input,
 * output and output-gradient transforms take a chunk of the block's tile rows at a time
 * (et_wino4_chunk_rows: at least one row, at most ET_WINO4_CHUNK tiles where the rows are narrower; the rows
 * may be of two images), their loops over all of the chunk's tiles: a row of 4x4 tiles alone is a short loop
 * (8 tiles at 32 pixels), and its loads and stores are 4 pixels apart. Each tile's pixels are gathered from
 * (its outputs scattered to) padded copies of the rows under the chunk. Row by row (a version never committed)
 * it was slower than F(2x2, 3x3) on every layer of ResNet-18; on a Zen 5, chunks of 128 tiles gave those layers'
 * passes 0.90-1.00x the time of chunks of 64 and of 256 (two runs of bench/wino_layers.py --layers 64:32,128:16
 * with and without --cflags=-DET_WINO4_CHUNK=64, and =256) */
#ifndef ET_WINO4_CHUNK
#define ET_WINO4_CHUNK 128
#endif
enum {
    ET_W4_NT = ET_WINO4_CHUNK > ET_WINO_MAX_WIDTH / 4 ? ET_WINO4_CHUNK : ET_WINO_MAX_WIDTH / 4, /* a chunk's tiles */
    ET_W4_BUF = 6 * (4 * ET_W4_NT + 2 * ET_WINO4_CHUNK) /* a chunk's padded rows: 6 a tile row, 4 TW + 2 each */
};
ET_HOST_INLINE int et_wino4_chunk_rows(int TW) { return TW >= ET_WINO4_CHUNK ? 1 : ET_WINO4_CHUNK / TW; }
/* the chunks of a block's nr tile rows of TW tiles, et_wino4_chunk_rows(TW) rows each (the last fewer); chunk q's
 * first row (returned) and rows (*k) */
ET_HOST_INLINE int et_wino4_chunks(int nr, int TW) {
    const int kr = et_wino4_chunk_rows(TW);
    return (nr + kr - 1) / kr;
}
ET_HOST_INLINE int et_wino4_chunk(int q, int nr, int TW, int *k) {
    const int kr = et_wino4_chunk_rows(TW);
    *k = nr - q * kr < kr ? nr - q * kr : kr;
    return q * kr;
}

/* the chunk of k tile rows (of the block's rows, k at most et_wino4_chunk_rows) whose first is the block's row i0: its
 * tile rows are global row g0 + j = image (g0 + j) / TH, tile row (g0 + j) % TH; its tiles are the block's
 * i0 TW + t, t < k TW. idx[t]: tile t's first pixel in rows of `rows` x `len` floats a tile row */
ET_HOST_INLINE void et_wino4_index(int *ET_RESTRICT idx, int k, int TW, int rows, int len) {
    for (int j = 0, t = 0; j < k; ++j)
        for (int tx = 0; tx < TW; ++tx, ++t) idx[t] = j * rows * len + 4 * tx;
}

/* p[0, L) = the input row src (Wd pixels) padded by PW zeros on the left and zeros on the right; all zeros
 * without src (a row above or below the plane) */
ET_HOST_INLINE void et_wino4_pad_row(float *ET_RESTRICT p, const float *ET_RESTRICT src, int Wd, int L, int PW) {
    const int n = src ? (Wd < L - PW ? Wd : L - PW) : 0;
    for (int j = 0; j < PW && j < L; ++j) p[j] = 0.f;
    for (int j = 0; j < n; ++j) p[PW + j] = src[j];
    for (int j = (src ? PW + n : 0); j < L; ++j) p[j] = 0.f;
}

/* V[k][c][t] = (B^T d B)[k] for F(4x4, 3x3), input channel c's tiles in a chunk of k tile rows (et_wino4_index):
 * Vt is V[0][c] at the chunk's first tile, kstep the distance from V[k] to V[k + 1] */
ET_HOST_INLINE void et_wino4_input_chunk(const float *ET_RESTRICT X, float *ET_RESTRICT Vt, size_t kstep, int c, int C,
                                         int H, int Wd, int TH, int TW, int g0, int k, int PH, int PW) {
    const int L = 4 * TW + 2, nt = k * TW;
    float P[ET_W4_BUF], d[36][ET_W4_NT], w[36][ET_W4_NT];
    int idx[ET_W4_NT];
    for (int j = 0; j < k; ++j) { /* each tile row's six input rows, zero-padded */
        const int n = (g0 + j) / TH, ty = (g0 + j) % TH;
        const float *Xc = X + ((size_t)n * C + c) * H * Wd;
        for (int i = 0; i < 6; ++i) {
            const int r = 4 * ty - PH + i;
            et_wino4_pad_row(P + (size_t)(6 * j + i) * L, r >= 0 && r < H ? Xc + (size_t)r * Wd : 0, Wd, L, PW);
        }
    }
    et_wino4_index(idx, k, TW, 6, L);
    for (int a = 0; a < 6; ++a) /* each tile's 6x6 pixels */
        for (int b = 0; b < 6; ++b) {
            const float *p = P + a * L + b;
            float *da = d[6 * a + b];
            ET_SIMD
            for (int t = 0; t < nt; ++t) da[t] = p[idx[t]];
        }
    for (int j = 0; j < 6; ++j) { /* B^T d, down each column */
        const float *x0 = d[j], *x1 = d[6 + j], *x2 = d[12 + j], *x3 = d[18 + j], *x4 = d[24 + j], *x5 = d[30 + j];
        ET_SIMD
        for (int t = 0; t < nt; ++t) {
            const float d0 = x0[t], d1 = x1[t], d2 = x2[t], d3 = x3[t], d4 = x4[t], d5 = x5[t];
            w[j][t] = 4.f * (d0 - d2) + (d4 - d2);
            w[6 + j][t] = (d3 + d4) - 4.f * (d1 + d2);
            w[12 + j][t] = (d4 - d3) + 4.f * (d1 - d2);
            w[18 + j][t] = (d4 - d2) + 2.f * (d3 - d1);
            w[24 + j][t] = (d4 - d2) - 2.f * (d3 - d1);
            w[30 + j][t] = 4.f * (d1 - d3) + (d5 - d3);
        }
    }
    for (int i = 0; i < 6; ++i) { /* (B^T d) B, along each row: V[6 i + j] */
        const float *x0 = w[6 * i], *x1 = w[6 * i + 1], *x2 = w[6 * i + 2], *x3 = w[6 * i + 3], *x4 = w[6 * i + 4],
                    *x5 = w[6 * i + 5];
        float *v0 = Vt + (size_t)(6 * i) * kstep, *v1 = v0 + kstep, *v2 = v1 + kstep, *v3 = v2 + kstep,
              *v4 = v3 + kstep, *v5 = v4 + kstep;
        ET_SIMD
        for (int t = 0; t < nt; ++t) {
            const float d0 = x0[t], d1 = x1[t], d2 = x2[t], d3 = x3[t], d4 = x4[t], d5 = x5[t];
            v0[t] = 4.f * (d0 - d2) + (d4 - d2);
            v1[t] = (d3 + d4) - 4.f * (d1 + d2);
            v2[t] = (d4 - d3) + 4.f * (d1 - d2);
            v3[t] = (d4 - d2) + 2.f * (d3 - d1);
            v4[t] = (d4 - d2) - 2.f * (d3 - d1);
            v5[t] = 4.f * (d1 - d3) + (d5 - d3);
        }
    }
}

/* output channel o's 4x4 output tiles (those pixels below HO x WO) in a chunk of k tile rows from M[k][o][t]:
 * A^T m A, plus the bias b. Mt is M[0][o] at the chunk's first tile */
ET_HOST_INLINE void et_wino4_output_chunk(const float *ET_RESTRICT Mt, size_t kstep, float *ET_RESTRICT Y, float b,
                                          int o, int O, int HO, int WO, int TH, int TW, int g0, int k) {
    const int nt = k * TW;
    float s[24][ET_W4_NT], y[16][ET_W4_NT], row[ET_WINO_MAX_WIDTH + 4];
    for (int j = 0; j < 6; ++j) { /* A^T m, down each column: s[6 r + j] */
        const float *m0 = Mt + (size_t)j * kstep, *m1 = m0 + 6 * kstep, *m2 = m1 + 6 * kstep, *m3 = m2 + 6 * kstep,
                    *m4 = m3 + 6 * kstep, *m5 = m4 + 6 * kstep;
        ET_SIMD
        for (int t = 0; t < nt; ++t) {
            const float a = m1[t] + m2[t], d = m1[t] - m2[t], e = m3[t] + m4[t], f = m3[t] - m4[t];
            s[j][t] = m0[t] + a + e;
            s[6 + j][t] = d + 2.f * f;
            s[12 + j][t] = a + 4.f * e;
            s[18 + j][t] = d + 8.f * f + m5[t];
        }
    }
    for (int r = 0; r < 4; ++r) { /* (A^T m) A, along each row: y[4 r + q] */
        const float *p0 = s[6 * r], *p1 = s[6 * r + 1], *p2 = s[6 * r + 2], *p3 = s[6 * r + 3], *p4 = s[6 * r + 4],
                    *p5 = s[6 * r + 5];
        ET_SIMD
        for (int t = 0; t < nt; ++t) {
            const float a = p1[t] + p2[t], d = p1[t] - p2[t], e = p3[t] + p4[t], f = p3[t] - p4[t];
            y[4 * r][t] = p0[t] + a + e + b;
            y[4 * r + 1][t] = d + 2.f * f + b;
            y[4 * r + 2][t] = a + 4.f * e + b;
            y[4 * r + 3][t] = d + 8.f * f + p5[t] + b;
        }
    }
    for (int j = 0; j < k; ++j) { /* each tile row's output rows */
        const int n = (g0 + j) / TH, ty = (g0 + j) % TH;
        for (int r = 0; r < 4 && 4 * ty + r < HO; ++r) {
            for (int q = 0; q < 4; ++q) {
                const float *yq = y[4 * r + q] + (size_t)j * TW;
                for (int tx = 0; tx < TW; ++tx) row[4 * tx + q] = yq[tx];
            }
            float *out = Y + (((size_t)n * O + o) * HO + 4 * ty + r) * WO;
            for (int x = 0; x < WO; ++x) out[x] = row[x];
        }
    }
}

/* dM[k][o][t] = (A dy A^T)[k] for F(4x4, 3x3), output-gradient channel o's tiles in a chunk of k tile rows (the
 * adjoint of et_wino4_output_chunk: each tile's 4x4 output gradient, zero past HO x WO, over its 6x6 products).
 * Mt is dM[0][o] at the chunk's first tile */
ET_HOST_INLINE void et_wino4_grad_output_chunk(const float *ET_RESTRICT GY, float *ET_RESTRICT Mt, size_t kstep, int o,
                                               int O, int HO, int WO, int TH, int TW, int g0, int k) {
    const int nt = k * TW, W4 = 4 * TW;
    float P[ET_W4_BUF], e[16][ET_W4_NT], h[24][ET_W4_NT];
    int idx[ET_W4_NT];
    for (int j = 0; j < k; ++j) { /* each tile row's four output-gradient rows, zero past HO x WO */
        const int n = (g0 + j) / TH, ty = (g0 + j) % TH;
        const float *GYo = GY + ((size_t)n * O + o) * HO * WO;
        for (int r = 0; r < 4; ++r) {
            const int row = 4 * ty + r;
            et_wino4_pad_row(P + (size_t)(4 * j + r) * W4, row < HO ? GYo + (size_t)row * WO : 0, WO, W4, 0);
        }
    }
    et_wino4_index(idx, k, TW, 4, W4);
    for (int r = 0; r < 4; ++r) /* each tile's 4x4 output gradient */
        for (int q = 0; q < 4; ++q) {
            const float *p = P + r * W4 + q;
            float *er = e[4 * r + q];
            ET_SIMD
            for (int t = 0; t < nt; ++t) er[t] = p[idx[t]];
        }
    for (int r = 0; r < 4; ++r) { /* dy A^T, along each row: h[6 r + j] */
        const float *p0 = e[4 * r], *p1 = e[4 * r + 1], *p2 = e[4 * r + 2], *p3 = e[4 * r + 3];
        ET_SIMD
        for (int t = 0; t < nt; ++t) {
            const float ev1 = p0[t] + p2[t], od1 = p1[t] + p3[t], ev2 = p0[t] + 4.f * p2[t],
                        od2 = 2.f * p1[t] + 8.f * p3[t];
            h[6 * r][t] = p0[t];
            h[6 * r + 1][t] = ev1 + od1;
            h[6 * r + 2][t] = ev1 - od1;
            h[6 * r + 3][t] = ev2 + od2;
            h[6 * r + 4][t] = ev2 - od2;
            h[6 * r + 5][t] = p3[t];
        }
    }
    for (int j = 0; j < 6; ++j) { /* A (dy A^T), down each column: dM[6 i + j] */
        float *m0 = Mt + (size_t)j * kstep, *m1 = m0 + 6 * kstep, *m2 = m1 + 6 * kstep, *m3 = m2 + 6 * kstep,
              *m4 = m3 + 6 * kstep, *m5 = m4 + 6 * kstep;
        const float *h0 = h[j], *h1 = h[6 + j], *h2 = h[12 + j], *h3 = h[18 + j];
        ET_SIMD
        for (int t = 0; t < nt; ++t) {
            const float ev1 = h0[t] + h2[t], od1 = h1[t] + h3[t], ev2 = h0[t] + 4.f * h2[t], od2 = 2.f * h1[t] + 8.f * h3[t];
            m0[t] = h0[t];
            m1[t] = ev1 + od1;
            m2[t] = ev1 - od1;
            m3[t] = ev2 + od2;
            m4[t] = ev2 - od2;
            m5[t] = h3[t];
        }
    }
}


/* tile rows a block holds: about `bytes` of transforms (kk values a tile for each of C + O channels), at
 * least ET_WINO_BLOCK_TILES tiles (ET_WINO4_BLOCK_TILES for m = 4) and one row, at most all `rows` */
ET_HOST_INLINE int et_wino_rows_per_block(int m, int C, int O, int TW, int rows, double bytes) {
    const int least = m == 4 ? ET_WINO4_BLOCK_TILES : ET_WINO_BLOCK_TILES;
    int per = (int)(bytes / ((double)et_wino_kk(m) * (C + O) * TW * sizeof(float)));
    if (per * TW < least) per = (least + TW - 1) / TW;
    return per < 1 ? 1 : per > rows ? rows : per;
}

/* V (kk x C x the block's tiles) for the block of tile rows [r0, r0 + nr) of X (N x C x H x Wd), TH tile
 * rows an image: et_wino_input_row for each channel and row (et_wino4_input_chunk for each channel and chunk
 * for m = 4), on the threads (et_common.h ET_PARALLEL_FOR2) */
ET_HOST_INLINE void et_wino_input_block(int m, const float *ET_RESTRICT X, float *ET_RESTRICT V, int C, int H,
                                        int Wd, int TH, int TW, int r0, int nr, int PH, int PW) {
    const int T = nr * TW;
    const size_t vk = (size_t)C * T;
    if (m == 4) {
        const int chunks = et_wino4_chunks(nr, TW);
        ET_PARALLEL_FOR2((double)C * T * 36 * 4)
        for (int c = 0; c < C; ++c)
            for (int q = 0; q < chunks; ++q) {
                int k;
                const int i0 = et_wino4_chunk(q, nr, TW, &k);
                et_wino4_input_chunk(X, V + (size_t)c * T + (size_t)i0 * TW, vk, c, C, H, Wd, TH, TW, r0 + i0, k, PH,
                                     PW);
            }
        return;
    }
    ET_PARALLEL_FOR2((double)C * T * 16 * 4)
    for (int c = 0; c < C; ++c)
        for (int i = 0; i < nr; ++i) {
            const int n = (r0 + i) / TH, ty = (r0 + i) % TH;
            et_wino_input_row(X + ((size_t)n * C + c) * H * Wd, V + (size_t)c * T + (size_t)i * TW, vk, H, Wd, TW, ty,
                              PH, PW);
        }
}

/* the output rows 2 ty and 2 ty + 1 (those below HO) of output channel o from M[k][o][t]: A^T m A, plus
 * the bias b */
ET_HOST_INLINE void et_wino_output_row(const float *ET_RESTRICT Mt, size_t kstep, float *ET_RESTRICT Yo, float b,
                                       int HO, int WO, int TW, int ty) {
    float s[2][4][ET_WINO_MAX_WIDTH / 2 + 1], y[ET_WINO_MAX_WIDTH + 2];
    for (int j = 0; j < 4; ++j) { /* A^T m, down each column */
        const float *m0 = Mt + (size_t)j * kstep, *m1 = m0 + 4 * kstep, *m2 = m1 + 4 * kstep, *m3 = m2 + 4 * kstep;
        float *s0 = s[0][j], *s1 = s[1][j];
        ET_SIMD
        for (int tx = 0; tx < TW; ++tx) {
            s0[tx] = m0[tx] + m1[tx] + m2[tx];
            s1[tx] = m1[tx] - m2[tx] - m3[tx];
        }
    }
    for (int r = 0; r < 2 && 2 * ty + r < HO; ++r) { /* (A^T m) A, along each row */
        const float *a = s[r][0], *c = s[r][1], *d = s[r][2], *e = s[r][3];
        for (int tx = 0; tx < TW; ++tx) {
            y[2 * tx] = a[tx] + c[tx] + d[tx] + b;
            y[2 * tx + 1] = c[tx] - d[tx] - e[tx] + b;
        }
        float *out = Yo + (size_t)(2 * ty + r) * WO;
        for (int j = 0; j < WO; ++j) out[j] = y[j];
    }
}

#ifdef ET_DNNL_ON
/* the matmul of this shape, made at its first call (on one thread: oneDNN fixes a primitive's thread count
 * when it is made), or 0 (oneDNN refused it, or the table is full) */
static et_wino_mm *et_wino_find_mm(int b, int M, int K, int N, int tb) {
    for (int i = 0; i < et_wino.n; ++i) {
        const et_wino_mm *e = &et_wino.mm[i];
        if (e->b == b && e->M == M && e->K == K && e->N == N && e->tb == tb) return e->mm ? &et_wino.mm[i] : 0;
    }
    if (et_wino.n == ET_WINO_ENTRIES) return 0;
    if (!et_dnnl_engine()) return 0;
    et_wino_mm *e = &et_wino.mm[et_wino.n++];
    memset(e, 0, sizeof *e);
    e->b = b, e->M = M, e->K = K, e->N = N, e->tb = tb;
    const dnnl_dims_t da = {b, M, K}, dv = {b, K, N}, dc = {b, M, N};
    dnnl_primitive_attr_t attr = 0;
    dnnl_primitive_desc_t pd = 0;
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    const int ok = dnnl_memory_desc_create_with_tag(&e->md[0], 3, da, dnnl_f32, dnnl_abc) == dnnl_success &&
                   dnnl_memory_desc_create_with_tag(&e->md[1], 3, dv, dnnl_f32, tb ? dnnl_acb : dnnl_abc) ==
                       dnnl_success &&
                   dnnl_memory_desc_create_with_tag(&e->md[2], 3, dc, dnnl_f32, dnnl_abc) == dnnl_success &&
                   dnnl_primitive_attr_create(&attr) == dnnl_success &&
                   dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) == dnnl_success &&
                   dnnl_matmul_primitive_desc_create(&pd, et_dnnl.engine, e->md[0], e->md[1], 0, e->md[2], attr) ==
                       dnnl_success &&
                   dnnl_memory_desc_clone(&e->pad, dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0)) ==
                       dnnl_success &&
                   dnnl_primitive_create(&e->mm, pd) == dnnl_success;
    omp_set_num_threads(threads);
    if (ok) e->pad_size = dnnl_memory_desc_get_size(e->pad);
    else e->mm = 0;
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (attr) dnnl_primitive_attr_destroy(attr);
    return e->mm ? e : 0;
}

/* C = A B on matmul e, on the calling thread's stream and scratchpad, on one thread: 1 done */
static int et_wino_run_mm(const et_wino_mm *e, const float *A, const float *B, float *Cm) {
    dnnl_stream_t s = et_dnnl_thread_stream();
    void *pad = e->pad_size ? et_dnnl_scratch(6, e->pad_size) : 0;
    dnnl_memory_t m[4] = {0, 0, 0, 0};
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    int ok = s && (!e->pad_size || pad) &&
             dnnl_memory_create(&m[0], e->md[0], et_dnnl.engine, (void *)A) == dnnl_success &&
             dnnl_memory_create(&m[1], e->md[1], et_dnnl.engine, (void *)B) == dnnl_success &&
             dnnl_memory_create(&m[2], e->md[2], et_dnnl.engine, Cm) == dnnl_success &&
             dnnl_memory_create(&m[3], e->pad, et_dnnl.engine, pad) == dnnl_success;
    if (ok) {
        const dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, m[0]}, {DNNL_ARG_WEIGHTS, m[1]}, {DNNL_ARG_DST, m[2]},
                                         {DNNL_ARG_SCRATCHPAD, m[3]}};
        ok = dnnl_primitive_execute(e->mm, s, 4, args) == dnnl_success && dnnl_stream_wait(s) == dnnl_success;
    }
    omp_set_num_threads(threads);
    for (int i = 0; i < 4; ++i)
        if (m[i]) dnnl_memory_destroy(m[i]);
    return ok;
}
#endif

/* b products C[k] (M x N) = A[k] (M x K) B[k] (K x N; with `tb`, B[k] is stored N x K and read transposed),
 * one after another, each operand's matrices contiguous, on et_wino_gemm_lib's library: one call of a
 * oneDNN matmul for all b, or b BLAS calls (et_sgemm, one call each inside a parallel loop, its tiles
 * outside one). An element's sum is the same call's on any thread count. Returns 0 where oneDNN failed */
ET_HOST_INLINE int et_wino_products(const float *A, const float *B, float *Cm, int b, int M, int K, int N, int tb) {
#ifdef ET_DNNL_ON
    if (et_wino_gemm_lib() == 2) {
        const et_wino_mm *e = et_wino_find_mm(b, M, K, N, tb);
        if (e) return et_wino_run_mm(e, A, B, Cm);
        /* oneDNN refused the shape: the BLAS computes it */
    }
#endif
    for (int k = 0; k < b; ++k)
        et_sgemm(0, tb, M, N, K, A + (size_t)k * M * K, K, B + (size_t)k * K * N, tb ? K : N, 0.f,
                 Cm + (size_t)k * M * N, N);
    return 1;
}

/* makes the matmul of this shape where the products run on oneDNN, before the products run on the threads:
 * the table of matmuls is changed by the calling thread only (the emitted code calls convolutions outside
 * parallel loops) */
ET_HOST_INLINE void et_wino_prepare(int b, int M, int K, int N, int tb) {
#ifdef ET_DNNL_ON
    if (et_wino_gemm_lib() == 2) (void)et_wino_find_mm(b, M, K, N, tb);
#else
    (void)b, (void)M, (void)K, (void)N, (void)tb;
#endif
}

/* the products of a block (kk of A (R x K) times B (K x N)), for its item i of ET_WINO_CALLS x the pieces of
 * pr rows: kk / ET_WINO_CALLS products of one piece. A (kk x R x K) and C (kk x R x N) are held in pieces
 * (et_wino_row), B is [kk][K][N] ([kk][N][K] with tb) */
ET_HOST_INLINE int et_wino_item(int kk, const float *A, const float *B, float *Cm, int R, int K, int N, int tb, int pr,
                                int i) {
    const int Q = kk / ET_WINO_CALLS; /* products a call */
    const int pieces = (R + pr - 1) / pr, q = i / pieces, o = i % pieces * pr;
    return et_wino_products(A + et_wino_row(kk, q * Q, o, R, pr, K), B + (size_t)q * Q * K * N,
                            Cm + et_wino_row(kk, q * Q, o, R, pr, N), Q, et_wino_piece_n(o, R, pr), K, N, tb);
}

/* makes the matmuls of et_wino_item's calls with rows in pieces of pr (see et_wino_prepare) */
ET_HOST_INLINE void et_wino_prepare_items(int kk, int R, int K, int N, int tb, int pr) {
    et_wino_prepare(kk / ET_WINO_CALLS, pr, K, N, tb);
    if (R % pr) et_wino_prepare(kk / ET_WINO_CALLS, R % pr, K, N, tb);
}

/* the output's transform for the block of tile rows [r0, r0 + nr) from its products M (kk x O x its tiles, in
 * pieces of pr rows), on the threads (et_common.h ET_PARALLEL_FOR2) */
ET_HOST_INLINE void et_wino_output_block(int m, const float *ET_RESTRICT M, const float *ET_RESTRICT B,
                                         float *ET_RESTRICT Y, int O, int HO, int WO, int TH, int TW, int r0, int nr,
                                         int pr) {
    const int T = nr * TW;
    if (m == 4) {
        const int chunks = et_wino4_chunks(nr, TW);
        ET_PARALLEL_FOR2((double)O * T * 36 * 4)
        for (int o = 0; o < O; ++o)
            for (int q = 0; q < chunks; ++q) {
                int k;
                const int i0 = et_wino4_chunk(q, nr, TW, &k);
                et_wino4_output_chunk(M + et_wino_row(36, 0, o, O, pr, T) + (size_t)i0 * TW, et_wino_kstep(o, O, pr, T),
                                      Y, B ? B[o] : 0.f, o, O, HO, WO, TH, TW, r0 + i0, k);
            }
        return;
    }
    ET_PARALLEL_FOR2((double)O * T * 16 * 4)
    for (int o = 0; o < O; ++o)
        for (int i = 0; i < nr; ++i) {
            const int n = (r0 + i) / TH, ty = (r0 + i) % TH;
            et_wino_output_row(M + et_wino_row(16, 0, o, O, pr, T) + (size_t)i * TW, et_wino_kstep(o, O, pr, T),
                               Y + ((size_t)n * O + o) * HO * WO, B ? B[o] : 0.f, HO, WO, TW, ty);
        }
}

/* one block of tile rows [r0, r0 + nr) of et_wino_conv, its transforms in V and M: the input's transform,
 * the kk products (ET_WINO_CALLS calls for each piece of pr rows), the output's transform. Its loops run on
 * the threads where it is not itself inside a parallel loop (et_common.h ET_PARALLEL_WORTH): either way every
 * element is computed alike. Returns 0 where oneDNN failed */
ET_HOST_INLINE int et_wino_block(int m, const float *ET_RESTRICT X, const float *ET_RESTRICT U,
                                 const float *ET_RESTRICT B, float *ET_RESTRICT Y, float *ET_RESTRICT V,
                                 float *ET_RESTRICT M, int C, int H, int Wd, int O, int HO, int WO, int PH, int PW,
                                 int TH, int TW, int r0, int nr, int pr) {
    const int T = nr * TW, items = et_wino_items(O, pr), kk = et_wino_kk(m);
    int bad = 0;
    et_wino_input_block(m, X, V, C, H, Wd, TH, TW, r0, nr, PH, PW);
    ET_PARALLEL_FOR_OR((double)kk * O * C * T, bad)
    for (int i = 0; i < items; ++i) bad |= !et_wino_item(kk, U, V, M, O, C, T, 0, pr, i);
    et_wino_output_block(m, M, B, Y, O, HO, WO, TH, TW, r0, nr, pr);
    return !bad;
}

/* Y (N x O x HO x WO) = the 3x3 stride-1 convolution of X (N x C x H x Wd) padded by PH, PW, plus B
 * (per output channel, or none); W is [O][C][3][3], or with `flip` [C][O][3][3] turned by 180 degrees
 * (the input gradient's). HO = H + 2 PH - 2, WO = Wd + 2 PW - 2. Its tiles are m x m outputs (et_wino_tile:
 * F(4x4, 3x3) or F(2x2, 3x3)). The weights' transform is shared; then the
 * tiles go in blocks of whole tile rows (at least ET_WINO_BLOCK_TILES tiles, about ET_WINO_BLOCK_BYTES of V and
 * M: a block's transforms and products in this core's caches), fixed by the shape, and each block's products
 * in calls of pieces of rows (et_wino_piece_rows: ET_WINO_SPREAD calls in all where O allows). With at least
 * as many blocks as threads each block runs on one thread (its V and M in that thread's scratch slots 1 and
 * 2), else the blocks' input transforms, then all their calls of products at once on the threads, then their
 * output transforms (every block's V and M in slots 1 and 2): the same operations on each element either way */
ET_BLAS_FN void et_wino_conv(const float *ET_RESTRICT X, const float *ET_RESTRICT W, const float *ET_RESTRICT B,
                             float *ET_RESTRICT Y, int N, int C, int H, int Wd, int O, int HO, int WO, int PH, int PW,
                             int flip) {
    const int m = et_wino_tile(N, HO, WO, ET_WINO4_MIN_TILES), kk = et_wino_kk(m);
    const int TH = (HO + m - 1) / m, TW = (WO + m - 1) / m, rows = N * TH;
    const int per = et_wino_rows_per_block(m, C, O, TW, rows, ET_WINO_BLOCK_BYTES);
    const int blocks = (rows + per - 1) / per, pr = et_wino_piece_rows(O, blocks * ET_WINO_CALLS);
    float *U = et_scratch(0, (size_t)kk * O * C);
    if (!U) return;
    ++et_wino.calls;
    et_wino.calls4 += m == 4;
    et_wino_weights(m, W, U, O, C, flip, pr);
    et_wino_prepare_items(kk, O, C, per * TW, 0, pr);
    et_wino_prepare_items(kk, O, C, (rows - (blocks - 1) * per) * TW, 0, pr); /* the last block's */
    int bad = 0;
#ifdef _OPENMP
    const int each = blocks >= et_threads; /* a block a thread */
#else
    const int each = 0;
#endif
    if (each) {
        ET_PARALLEL_FOR_OR((double)N * O * HO * WO * C * 4, bad)
        for (int blk = 0; blk < blocks; ++blk) {
            const int r0 = blk * per, nr = rows - r0 < per ? rows - r0 : per;
            float *V = et_scratch(1, (size_t)kk * C * nr * TW), *M = et_scratch(2, (size_t)kk * O * nr * TW);
            bad |= !V || !M || !et_wino_block(m, X, U, B, Y, V, M, C, H, Wd, O, HO, WO, PH, PW, TH, TW, r0, nr, pr);
        }
    } else {
        /* block b's V and M at b per TW tiles: each block's calls see what they would see in a slot of their own */
        const size_t tiles = (size_t)rows * TW, bt = (size_t)per * TW;
        float *V = et_scratch(1, kk * C * tiles), *M = et_scratch(2, kk * O * tiles);
        const int items = et_wino_items(O, pr);
        if (V && M) {
            for (int blk = 0; blk < blocks; ++blk) {
                const int r0 = blk * per, nr = rows - r0 < per ? rows - r0 : per;
                et_wino_input_block(m, X, V + kk * C * blk * bt, C, H, Wd, TH, TW, r0, nr, PH, PW);
            }
            ET_PARALLEL_FOR_OR((double)kk * O * C * tiles, bad)
            for (int j = 0; j < blocks * items; ++j) {
                const int blk = j / items, r0 = blk * per, T = (rows - r0 < per ? rows - r0 : per) * TW;
                bad |= !et_wino_item(kk, U, V + kk * C * blk * bt, M + kk * O * blk * bt, O, C, T, 0, pr, j % items);
            }
            for (int blk = 0; blk < blocks; ++blk) {
                const int r0 = blk * per, nr = rows - r0 < per ? rows - r0 : per;
                et_wino_output_block(m, M + kk * O * blk * bt, B, Y, O, HO, WO, TH, TW, r0, nr, pr);
            }
        }
        bad |= !V || !M;
    }
    if (bad) ET_ERROR_HOOK("et_wino_conv: out of memory, or oneDNN failed to run a matmul");
}

/* the convolution on this path: 1 done, 0 left to oneDNN or the GEMM path */
ET_HOST_INLINE int et_wino_forward(const float *X, const float *W, const float *B, float *Y, int N, int C, int H,
                                   int Wd, int O, int HO, int WO, int KH, int KW, int SH, int SW, int PH, int PW, int DH,
                                   int DW) {
    if (!et_wino_fits(N, C, O, HO, WO, KH, KW, SH, SW, PH, PW, DH, DW, (double)N * O * HO * WO * C * 9)) return 0;
    et_wino_conv(X, W, B, Y, N, C, H, Wd, O, HO, WO, PH, PW, 0);
    return 1;
}

/* the input gradient GX (N x C x H x Wd) of such a convolution from GY (N x O x HO x WO): GY padded by
 * 2 - P convolved with the weights transposed and turned */
ET_HOST_INLINE int et_wino_grad_input(const float *GY, const float *W, float *GX, int N, int C, int H, int Wd, int O,
                                      int HO, int WO, int KH, int KW, int SH, int SW, int PH, int PW, int DH, int DW) {
    if (!et_wino_fits(N, C, O, H, Wd, KH, KW, SH, SW, PH, PW, DH, DW, (double)N * O * HO * WO * C * 9)) return 0;
    et_wino_conv(GY, W, (const float *)0, GX, N, O, HO, WO, C, H, Wd, 2 - PH, 2 - PW, 1);
    return 1;
}

/* dM[k][o][t] = (A dy A^T)[k] for the tiles of tile row ty of output-gradient channel o (the adjoint of
 * et_wino_output_row: each tile's 2x2 output gradient, zero past HO x WO, spread over its 4x4 products) */
ET_HOST_INLINE void et_wino_grad_output_row(const float *ET_RESTRICT GYo, float *ET_RESTRICT Mt, size_t kstep, int HO,
                                            int WO, int TW, int ty) {
    float e[2][ET_WINO_MAX_WIDTH + 2], h[2][4][ET_WINO_MAX_WIDTH / 2 + 1];
    for (int r = 0; r < 2; ++r) {
        const int row = 2 * ty + r;
        for (int j = 0; j < 2 * TW; ++j) e[r][j] = row < HO && j < WO ? GYo[(size_t)row * WO + j] : 0.f;
        for (int tx = 0; tx < TW; ++tx) { /* dy A^T, along each row */
            const float p = e[r][2 * tx], q = e[r][2 * tx + 1];
            h[r][0][tx] = p;
            h[r][1][tx] = p + q;
            h[r][2][tx] = p - q;
            h[r][3][tx] = -q;
        }
    }
    for (int j = 0; j < 4; ++j) { /* A (dy A^T), down each column: dM[4i + j] */
        float *m0 = Mt + (size_t)j * kstep, *m1 = m0 + 4 * kstep, *m2 = m1 + 4 * kstep, *m3 = m2 + 4 * kstep;
        const float *h0 = h[0][j], *h1 = h[1][j];
        ET_SIMD
        for (int tx = 0; tx < TW; ++tx) {
            m0[tx] = h0[tx];
            m1[tx] = h0[tx] + h1[tx];
            m2[tx] = h0[tx] - h1[tx];
            m3[tx] = -h1[tx];
        }
    }
}

/* a run of nc channels' G^T dU G (3x3) as F(2x2, 3x3): u is dU[0] at the run's first channel, ks the distance
 * from dU[k] to dU[k + 1], w the first channel's 9 weights */
ET_HOST_INLINE void et_wino2_gw_run(const float *ET_RESTRICT u, size_t ks, float *ET_RESTRICT w, int nc) {
    float t[12][ET_WINO_RUN];
    for (int j = 0; j < 4; ++j) { /* G^T dU: 3 rows of 4 */
        const float *u0 = u + (size_t)j * ks, *u1 = u0 + 4 * ks, *u2 = u1 + 4 * ks, *u3 = u2 + 4 * ks;
        for (int c = 0; c < nc; ++c) {
            t[j][c] = u0[c] + 0.5f * (u1[c] + u2[c]);
            t[4 + j][c] = 0.5f * (u1[c] - u2[c]);
            t[8 + j][c] = 0.5f * (u1[c] + u2[c]) + u3[c];
        }
    }
    for (int c = 0; c < nc; ++c) /* (G^T dU) G */
        for (int i = 0; i < 3; ++i) {
            const float a = t[4 * i][c], b = t[4 * i + 1][c], d = t[4 * i + 2][c], f = t[4 * i + 3][c];
            w[9 * c + 3 * i] = a + 0.5f * (b + d);
            w[9 * c + 3 * i + 1] = 0.5f * (b - d);
            w[9 * c + 3 * i + 2] = 0.5f * (b + d) + f;
        }
}

/* the same as F(4x4, 3x3): from 36 values */
ET_HOST_INLINE void et_wino4_gw_run(const float *ET_RESTRICT u, size_t ks, float *ET_RESTRICT w, int nc) {
    float t[18][ET_WINO_RUN];
    for (int j = 0; j < 6; ++j) { /* G^T dU: 3 rows of 6 */
        const float *u0 = u + (size_t)j * ks, *u1 = u0 + 6 * ks, *u2 = u1 + 6 * ks, *u3 = u2 + 6 * ks, *u4 = u3 + 6 * ks,
                    *u5 = u4 + 6 * ks;
        for (int c = 0; c < nc; ++c) {
            const float a = u1[c] + u2[c], d = u1[c] - u2[c], e = u3[c] + u4[c], f = u3[c] - u4[c];
            t[j][c] = 0.25f * u0[c] - ET_W4_S6 * a + ET_W4_S24 * e;
            t[6 + j][c] = ET_W4_S12 * f - ET_W4_S6 * d;
            t[12 + j][c] = ET_W4_S6 * (e - a) + u5[c];
        }
    }
    for (int c = 0; c < nc; ++c) /* (G^T dU) G */
        for (int i = 0; i < 3; ++i) {
            const float p0 = t[6 * i][c], p1 = t[6 * i + 1][c], p2 = t[6 * i + 2][c], p3 = t[6 * i + 3][c],
                        p4 = t[6 * i + 4][c], p5 = t[6 * i + 5][c];
            const float a = p1 + p2, d = p1 - p2, e = p3 + p4, f = p3 - p4;
            w[9 * c + 3 * i] = 0.25f * p0 - ET_W4_S6 * a + ET_W4_S24 * e;
            w[9 * c + 3 * i + 1] = ET_W4_S12 * f - ET_W4_S6 * d;
            w[9 * c + 3 * i + 2] = ET_W4_S6 * (e - a) + p5;
        }
}

/* GW[o][c] = G^T dU[o][c] G (3x3) from dU[k][o][c] (O x C each, in pieces of pr rows: et_wino_row), tiles of
 * m x m outputs */
ET_HOST_INLINE void et_wino_grad_weights(int m, const float *ET_RESTRICT dU, float *ET_RESTRICT GW, int O, int C,
                                         int pr) {
    const size_t OC = (size_t)O * C;
    const int kk = et_wino_kk(m);
    ET_PARALLEL_FOR(OC * 2.5 * kk)
    for (int o = 0; o < O; ++o)
        for (int c0 = 0; c0 < C; c0 += ET_WINO_RUN) {
            const int nc = C - c0 < ET_WINO_RUN ? C - c0 : ET_WINO_RUN;
            const float *u = dU + et_wino_row(kk, 0, o, O, pr, C) + c0;
            float *w = GW + ((size_t)o * C + c0) * 9;
            if (m == 4) et_wino4_gw_run(u, et_wino_kstep(o, O, pr, C), w, nc);
            else et_wino2_gw_run(u, et_wino_kstep(o, O, pr, C), w, nc);
        }
}

/* dM (kk x O x the block's tiles, in pieces of pr rows) for the block of tile rows [r0, r0 + nr) of GY
 * (N x O x HO x WO): et_wino_grad_output_row for each channel and row (et_wino4_grad_output_chunk for each
 * channel and chunk for m = 4), on the threads (et_common.h ET_PARALLEL_FOR2) */
ET_HOST_INLINE void et_wino_grad_output_block(int m, const float *ET_RESTRICT GY, float *ET_RESTRICT dM, int O, int HO,
                                              int WO, int TH, int TW, int r0, int nr, int pr) {
    const int T = nr * TW;
    if (m == 4) {
        const int chunks = et_wino4_chunks(nr, TW);
        ET_PARALLEL_FOR2((double)O * T * 36 * 4)
        for (int o = 0; o < O; ++o)
            for (int q = 0; q < chunks; ++q) {
                int k;
                const int i0 = et_wino4_chunk(q, nr, TW, &k);
                et_wino4_grad_output_chunk(GY, dM + et_wino_row(36, 0, o, O, pr, T) + (size_t)i0 * TW,
                                           et_wino_kstep(o, O, pr, T), o, O, HO, WO, TH, TW, r0 + i0, k);
            }
        return;
    }
    ET_PARALLEL_FOR2((double)O * T * 16 * 4)
    for (int o = 0; o < O; ++o)
        for (int i = 0; i < nr; ++i) {
            const int n = (r0 + i) / TH, ty = (r0 + i) % TH;
            et_wino_grad_output_row(GY + ((size_t)n * O + o) * HO * WO, dM + et_wino_row(16, 0, o, O, pr, T) +
                                    (size_t)i * TW, et_wino_kstep(o, O, pr, T), HO, WO, TW, ty);
        }
}

/* GW (O x C x 3 x 3) = the weight gradient of such a convolution of X (N x C x H x Wd, padded by PH, PW)
 * from GY (N x O x HO x WO): dU[k] = sum over the tiles of dM[k] V[k]^T, then G^T dU G. The tiles go in
 * blocks fixed by the shape, one after another (each block's transforms, then its products on the threads,
 * ET_WINO_CALLS calls for each piece of dU's rows: et_wino_piece_rows), the first block's products into dU,
 * each later one's into P and then added to dU: the sums' order is the same on any thread count */
ET_BLAS_FN void et_wino_gw(const float *ET_RESTRICT X, const float *ET_RESTRICT GY, float *ET_RESTRICT GW, int N,
                           int C, int H, int Wd, int O, int HO, int WO, int PH, int PW) {
    const int m = et_wino_tile(N, HO, WO, ET_WINO4_GW_MIN_TILES), kk = et_wino_kk(m);
    const int TH = (HO + m - 1) / m, TW = (WO + m - 1) / m, rows = N * TH;
    const size_t OC = (size_t)O * C;
    const int per = et_wino_rows_per_block(m, C, O, TW, rows, ET_WINO_GW_BLOCK_BYTES);
    const int pr = et_wino_piece_rows(O, ET_WINO_CALLS), items = et_wino_items(O, pr);
    float *dU = et_scratch(0, kk * OC), *V = et_scratch(1, (size_t)kk * C * per * TW),
          *dM = et_scratch(2, (size_t)kk * O * per * TW), *P = rows > per ? et_scratch(3, kk * OC) : dU;
    if (!dU || !V || !dM || !P) return;
    ++et_wino.calls;
    et_wino.calls4 += m == 4;
    int bad = 0;
    for (int r0 = 0; r0 < rows; r0 += per) {
        const int nr = rows - r0 < per ? rows - r0 : per, T = nr * TW;
        float *out = r0 ? P : dU;
        et_wino_input_block(m, X, V, C, H, Wd, TH, TW, r0, nr, PH, PW);
        et_wino_grad_output_block(m, GY, dM, O, HO, WO, TH, TW, r0, nr, pr);
        et_wino_prepare_items(kk, O, T, C, 1, pr);
        ET_PARALLEL_FOR_OR((double)kk * OC * T, bad)
        for (int i = 0; i < items; ++i) bad |= !et_wino_item(kk, dM, V, out, O, T, C, 1, pr, i);
        if (r0) {
            ET_PARALLEL_FOR_SIMD((double)kk * OC)
            for (size_t i = 0; i < kk * OC; ++i) dU[i] += P[i];
        }
    }
    if (bad) ET_ERROR_HOOK("et_wino_gw: oneDNN failed to run a matmul");
    et_wino_grad_weights(m, dU, GW, O, C, pr);
}

/* the weight gradient on this path: 1 done, 0 left to oneDNN or the GEMM path */
ET_HOST_INLINE int et_wino_grad_weight(const float *X, const float *GY, float *GW, int N, int C, int H, int Wd, int O,
                                       int HO, int WO, int KH, int KW, int SH, int SW, int PH, int PW, int DH, int DW) {
    if (!ET_WINO_GRAD_WEIGHT ||
        !et_wino_fits(N, C, O, HO, WO, KH, KW, SH, SW, PH, PW, DH, DW, (double)N * O * HO * WO * C * 9))
        return 0;
    et_wino_gw(X, GY, GW, N, C, H, Wd, O, HO, WO, PH, PW);
    return 1;
}

#endif /* ET_BLAS */
#endif /* ET_FLOAT_WINO_H */
