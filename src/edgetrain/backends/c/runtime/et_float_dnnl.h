/* edgetrain C runtime: the host library's dense float32 convolutions on oneDNN (included by
 * et_float_gemm.h, which calls it first for one-group convolutions; it returns 0 for a shape it
 * leaves to the GEMM path of et_float_blas.h).
 *
 * With ET_DNNL defined (the host library where the PyPI package onednn-cpu-gomp is installed, on
 * top of ET_BLAS: backends/c/blas.py), a one-group convolution that is not a 1x1 at stride 1 and
 * has at least ET_DNNL_MIN_MACS multiply-adds runs as oneDNN's direct convolution: the forward,
 * the input gradient and the weight gradient, each a primitive created at the shape's first call
 * and kept (a table of ET_DNNL_ENTRIES by shape and kind). oneDNN picks its own blocked layouts
 * for the CPU (AVX-512 / AVX2 JIT kernels, whatever OPENBLAS_CORETYPE says); the operands are
 * reordered from and to the program's NCHW / OIHW arrays around each call, through scratch
 * slots 3-5 of et_float_blas.h's et_scratch (6: the primitive's scratchpad; 2: a piece of a weight
 * gradient that et_float_fused.h's fused update applies at once, never storing the whole). A weight gradient
 * that oneDNN sums in its blocked layout of 16 x 16 (AVX-512) or 8 x 8 (AVX2) channel blocks goes to the fused
 * update as it is, which makes it OIHW rows 16 (8) at a time (no oneDNN reorder of the piece first). Pointwise
 * convolutions (the MobileNets' bulk) and small ones keep the GEMM path: there the reorders and a
 * primitive's call cost more than they save.
 *
 * A convolution runs in pieces of ET_DNNL_PIECE channels (its output channels; the input gradient's
 * input channels), each a call of the same primitive on one thread: the shared input (X, or GY for
 * the input gradient) is reordered once, then each piece reorders its slices, runs and writes its
 * slice of the output (the threaded library's forward and input gradient of few channels also in groups of
 * images: ET_DNNL_SPREAD). The threaded library runs the pieces on its threads (ET_PARALLEL_FOR_OR:
 * et_common.h), the serial one in turn. Every primitive is made and runs on one OpenMP thread (the
 * count is set to 1 around each call, the primitive's making included, and restored: oneDNN fixes a
 * primitive's threads when it makes it), and no sum spans two pieces, so the sums' order depends on
 * the shape only, never on a thread count (the threaded library's results stay the same at any count:
 * et_common.h). Results differ from the GEMM path's in the order of the float32 sums only.
 *
 * ET_DNNL_MIN_MACS, ET_DNNL_PIECE, ET_DNNL_GW_PIECE and ET_DNNL_GW_BLOCKS below are build-time defaults that
 * et_dnnl_tune replaces at run time, before the library's first convolution (the tests run every setting on one
 * build of the library, tests/backends/c/test_dnnl.py).
 *
 * The table and the engine are the library's own (each loaded copy has its own); the table is
 * touched by the calling thread only (the emitted code calls convolutions outside parallel loops),
 * a piece's memories and stream are its thread's own. Header-only (the table a weak symbol). */
#ifndef ET_FLOAT_DNNL_H
#define ET_FLOAT_DNNL_H
#include "et_common.h"
#include "et_float_blas.h" /* et_conv_pointwise */

/* oneDNN runs on top of the BLAS build only: ET_DNNL in a build without ET_BLAS (one that took the BLAS's
 * flags out, as the portable builds of the tests do) is ignored */
#if defined(ET_DNNL) && defined(ET_BLAS)
#define ET_DNNL_ON 1
#endif

#ifdef ET_DNNL_ON
#include <stdlib.h>
#include <string.h>
#include <oneapi/dnnl/dnnl.h>
/* libgomp's (oneDNN's OpenMP runtime; the serial library is not built with -fopenmp) */
int omp_get_max_threads(void);
void omp_set_num_threads(int);

/* the smallest convolution (multiply-adds of the forward) that runs on oneDNN */
#ifndef ET_DNNL_MIN_MACS
#define ET_DNNL_MIN_MACS (4.0 * 1024 * 1024)
#endif
/* the channels of one piece: a convolution's output channels (the forward, the weight gradient) or input
 * channels (the input gradient), a multiple of this, are computed this many at a time, each piece a
 * primitive's call of its own on one thread (the threaded library's pieces run in parallel); a count that is
 * not a multiple runs whole. A piece's sums are whole (no sum spans two pieces), so the pieces' results do not
 * depend on how many threads run them (the serial library runs the same pieces in turn). On
 * ResNet-18's 3x3 layers at batch 8 a piece of 32 took what the whole did, within 5 %, but the input gradient
 * of the 512x512 layers at 4x4, which took 2.0 ms in pieces against 5.9 ms whole (oneDNN 3.2, one thread).
 * Weight gradients are asked for in oneDNN's layout: in OIHW oneDNN sums them as GEMMs, which in pieces of
 * 32 took 4 times as long on those layers (35 against 8.5 ms per step in all). The serial library, whose
 * pieces run in turn, takes pieces of 64: ResNet-18's step at batch 8 took less than in pieces of 32
 * (docs/benchmarks.md, "The host step, fifth look"); the threaded library keeps 32, so that the 64-channel
 * layers run on two threads, whatever their count (its results are the same on any), and more in groups of
 * images (ET_DNNL_SPREAD), its weight gradients in pieces of 16 (ET_DNNL_GW_PIECE) */
#ifndef ET_DNNL_PIECE
#ifdef _OPENMP
#define ET_DNNL_PIECE 32
#else
#define ET_DNNL_PIECE 64
#endif
#endif
/* the channels of a weight gradient's piece (its output channels; a multiple of 16 keeps the fused update's
 * reading of oneDNN's blocks): the threaded library's are half its other pieces (16 by default), since the weight
 * gradient cannot run in groups of images (its sums span the batch); on a 16-core Xeon ResNet-18's step at
 * batch 8 took 43.6 ms on 16 threads with them, 51.1 ms with pieces of 32, and the same on one thread
 * (docs/benchmarks.md, "The host step on 1 to 16 threads"). The serial library's are its other pieces */
#if defined(_OPENMP)
#define ET_DNNL_GW_OF(piece) ((piece) > 1 ? (piece) / 2 : (piece))
#else
#define ET_DNNL_GW_OF(piece) (piece)
#endif
#ifndef ET_DNNL_GW_PIECE
#define ET_DNNL_GW_PIECE ET_DNNL_GW_OF(ET_DNNL_PIECE)
#endif
/* the pieces the threaded library wants of a forward or an input gradient at least: one whose channels make fewer
 * pieces also runs in groups of images (the batch's smallest divisor that gives this many, else single images),
 * each group with its own slice of the shared input, reordered group by group, and a primitive made for the group's
 * images; no sum spans two images, and the groups depend on the shape only, so the results do not depend on the
 * thread count either. ResNet-18's 64-channel layers at batch 8 made 2 pieces: on 16 threads they ran on 2. The
 * weight gradient (its sums span the batch) is never split by images. The serial library runs the whole batch */
#ifndef ET_DNNL_SPREAD
#ifdef _OPENMP
#define ET_DNNL_SPREAD 16
#else
#define ET_DNNL_SPREAD 1
#endif
#endif
/* 1: a weight gradient that oneDNN sums in whole blocks of 16 x 16 or 8 x 8 channels goes to its fused update in
 * them (et_dnnl_entry.gw_block); 0: reordered into OIHW rows first, as any other (what the tests check the
 * blocks' update against, setting it at run time: et_dnnl_tune) */
#ifndef ET_DNNL_GW_BLOCKS
#define ET_DNNL_GW_BLOCKS 1
#endif
/* primitives kept: a shape and kind each (ResNet-18 has 20 convolutions, 3 kinds) */
#ifndef ET_DNNL_ENTRIES
#define ET_DNNL_ENTRIES 256
#endif

enum { ET_DNNL_FWD = 0, ET_DNNL_FWD_BIAS = 1, ET_DNNL_DATA = 2, ET_DNNL_WEIGHTS = 3 };
#define ET_DNNL_KEY 17

/* one primitive, a piece's: its first input (shared by the pieces: the whole X, or GY for the input
 * gradient), its second input and its output (the piece's slices of the program's arrays), each the
 * program's layout (`user`) reordered into or out of oneDNN's (`blk`) where they differ. The memories here
 * hold the layouts and serve the shared input's reorder; a piece's call makes its own (pieces run on
 * several threads at once), with its thread's scratch buffers and scratchpad */
typedef struct {
    int key[ET_DNNL_KEY]; /* kind, N, C, H, W, O, HO, WO, KH, KW, SH, SW, PH, PW, DH, DW, P: C (the input
                             gradient) or O (the others) are the piece's channels, P the whole's */
    int ok;               /* 1 usable, -1 oneDNN refused the shape (the GEMM path runs it) */
    int gw_block;         /* b where the weight gradient's output is oneDNN's ABcd<b>b<b>a (b = 16 or 8) without
                             padding (the piece's channels and C multiples of b), which an epilogue takes as is: a
                             block of b output x b input channels for each kernel tap in turn; else 0 */
    dnnl_primitive_t conv, re[3];
    dnnl_memory_t user[3], blk[3], bias;
    dnnl_memory_desc_t pad; /* the primitive's scratchpad (user-managed: pieces run concurrently) */
    int arg[3];
    size_t size[3], pad_size; /* bytes of blk[i], of the scratchpad */
} et_dnnl_entry;

/* the library's one table (weak: the kernel object's parts and model.c share it; hidden: each
 * loaded library keeps its own) */
typedef struct {
    dnnl_engine_t engine;
    int failed; /* the engine could not be made: every convolution takes the GEMM path */
    int n;
    /* 1: the settings below are set (by et_dnnl_tune, or from the macros at the first convolution) */
    int tuned;
    double min_macs;
    int piece, gw_piece, gw_blocks;
    et_dnnl_entry e[ET_DNNL_ENTRIES];
} et_dnnl_table;
__attribute__((weak, visibility("hidden"))) et_dnnl_table et_dnnl;

/* Sets this loaded library's smallest convolution on oneDNN, its pieces' channels, its weight gradients'
 * pieces' channels and whether those go to the fused update in oneDNN's blocks, in place of the macros
 * (a negative value keeps the macro's; a weight gradient's piece then follows the piece as ET_DNNL_GW_PIECE
 * does): one build then runs every setting, as the tests do through ctypes. Only before the first primitive
 * is made (they are made for the pieces): returns 0, changing nothing, after it. */
__attribute__((weak)) int et_dnnl_tune(double min_macs, int piece, int gw_piece, int gw_blocks) {
    if (et_dnnl.n) return 0;
    et_dnnl.min_macs = min_macs >= 0 ? min_macs : ET_DNNL_MIN_MACS;
    et_dnnl.piece = piece > 0 ? piece : ET_DNNL_PIECE;
    et_dnnl.gw_piece = gw_piece > 0 ? gw_piece : piece > 0 ? ET_DNNL_GW_OF(piece) : ET_DNNL_GW_PIECE;
    et_dnnl.gw_blocks = gw_blocks >= 0 ? gw_blocks != 0 : ET_DNNL_GW_BLOCKS;
    et_dnnl.tuned = 1;
    return 1;
}

/* the primitives made so far that oneDNN took, and of them the weight gradients in blocks (tests read them
 * through ctypes) */
__attribute__((weak)) int et_dnnl_primitives(void) {
    int n = 0;
    for (int i = 0; i < et_dnnl.n; ++i) n += et_dnnl.e[i].ok > 0;
    return n;
}
__attribute__((weak)) int et_dnnl_blocked_gradients(void) {
    int n = 0;
    for (int i = 0; i < et_dnnl.n; ++i) n += et_dnnl.e[i].ok > 0 && et_dnnl.e[i].gw_block > 0;
    return n;
}

/* the calling thread's stream (a piece's primitives run on their thread's own) */
static dnnl_stream_t et_dnnl_thread_stream(void) {
    static __thread dnnl_stream_t s;
    if (!s && dnnl_stream_create(&s, et_dnnl.engine, dnnl_stream_default_flags) != dnnl_success) s = 0;
    return s;
}

/* a reorder primitive from src to dst (both descriptions) that needs no scratchpad, or 0 */
static dnnl_primitive_t et_dnnl_reorder(const_dnnl_memory_desc_t src, const_dnnl_memory_desc_t dst,
                                        const_dnnl_primitive_attr_t attr) {
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t p = 0;
    if (dnnl_reorder_primitive_desc_create(&pd, src, et_dnnl.engine, dst, et_dnnl.engine, attr) != dnnl_success)
        return 0;
    if (dnnl_memory_desc_get_size(dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0)) != 0 ||
        dnnl_primitive_create(&p, pd) != dnnl_success)
        p = 0;
    dnnl_primitive_desc_destroy(pd);
    return p;
}

/* operand i of entry e: the program's array as `plain` (NCHW / OIHW, or a slice of one) and the primitive's
 * `want`: a reorder and a buffer-backed memory where they differ. `in`: into the primitive (else out of it) */
static int et_dnnl_operand(et_dnnl_entry *e, int i, int arg, const_dnnl_memory_desc_t plain,
                           const_dnnl_memory_desc_t want, int in, const_dnnl_primitive_attr_t attr) {
    e->arg[i] = arg;
    if (dnnl_memory_create(&e->user[i], plain, et_dnnl.engine, DNNL_MEMORY_NONE) != dnnl_success) return 0;
    if (dnnl_memory_desc_equal(plain, want)) return 1;
    e->size[i] = dnnl_memory_desc_get_size(want);
    if (dnnl_memory_create(&e->blk[i], want, et_dnnl.engine, DNNL_MEMORY_NONE) != dnnl_success) return 0;
    e->re[i] = in ? et_dnnl_reorder(plain, want, attr) : et_dnnl_reorder(want, plain, attr);
    return e->re[i] != 0;
}

/* b where a weight gradient of dims wei (O, C, KH, KW) laid out as `got` is ABcd<b>b<b>a without padding
 * (b = 16 or 8, O and C multiples of it): the layouts et_float_fused.h's update reads; else 0 */
static int et_dnnl_gw_block(const_dnnl_memory_desc_t got, const dnnl_dims_t wei) {
    for (int b = 16; et_dnnl.gw_blocks && b >= 8; b /= 2) {
        dnnl_memory_desc_t t = 0;
        const int same = wei[0] % b == 0 && wei[1] % b == 0 &&
                         dnnl_memory_desc_create_with_tag(&t, 4, wei, dnnl_f32,
                                                          b == 16 ? dnnl_ABcd16b16a : dnnl_ABcd8b8a) == dnnl_success &&
                         dnnl_memory_desc_equal(t, got);
        dnnl_memory_desc_destroy(t);
        if (same) return b;
    }
    return 0;
}

/* a 4-d description: dims d, its second dimension a slice of `whole` (its strides those of d with whole
 * in its place) */
static int et_dnnl_slice_md(dnnl_memory_desc_t *md, const dnnl_dims_t d, int whole) {
    dnnl_dims_t s = {(dnnl_dim_t)whole * d[2] * d[3], d[2] * d[3], d[3], 1};
    return dnnl_memory_desc_create_with_strides(md, 4, d, dnnl_f32, s) == dnnl_success;
}

/* the primitive of entry e (its key set): 1, or 0 where oneDNN refuses it */
static int et_dnnl_create(et_dnnl_entry *e) {
    const int kind = e->key[0], N = e->key[1], C = e->key[2], H = e->key[3], Wd = e->key[4], O = e->key[5];
    const int HO = e->key[6], WO = e->key[7], KH = e->key[8], KW = e->key[9], SH = e->key[10], SW = e->key[11];
    const int PH = e->key[12], PW = e->key[13], DH = e->key[14], DW = e->key[15], P = e->key[16];
    /* the right and bottom padding that gives HO x WO (oneDNN's output size from its paddings) */
    const int PB = (HO - 1) * SH + (KH - 1) * DH + 1 - H - PH, PR = (WO - 1) * SW + (KW - 1) * DW + 1 - Wd - PW;
    const int pb = PB < 0 && PB + SH - 1 >= 0 ? 0 : PB, pr = PR < 0 && PR + SW - 1 >= 0 ? 0 : PR;
    if (pb < 0 || pr < 0) return 0;
    dnnl_dims_t src = {N, C, H, Wd}, wei = {O, C, KH, KW}, dst = {N, O, HO, WO}, bia = {O};
    dnnl_dims_t strides = {SH, SW}, dil = {DH - 1, DW - 1}, pl = {PH, PW}, pad_r = {pb, pr};
    dnnl_memory_desc_t s_plain = 0, w_plain = 0, d_plain = 0, b_md = 0, s_any = 0, w_any = 0, d_any = 0;
    dnnl_primitive_desc_t fwd = 0, pd = 0;
    dnnl_primitive_attr_t attr = 0;
    /* the piece's slices: of the input gradient and the weights' input channels (the input gradient's
     * pieces), of the output's (or its gradient's) channels (the others'; their weight rows are whole) */
    const int data = kind == ET_DNNL_DATA;
    int ok = dnnl_primitive_attr_create(&attr) == dnnl_success &&
             dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) == dnnl_success &&
             (data ? et_dnnl_slice_md(&s_plain, src, P)
                   : dnnl_memory_desc_create_with_tag(&s_plain, 4, src, dnnl_f32, dnnl_nchw) == dnnl_success) &&
             (data ? et_dnnl_slice_md(&w_plain, wei, P)
                   : dnnl_memory_desc_create_with_tag(&w_plain, 4, wei, dnnl_f32, dnnl_oihw) == dnnl_success) &&
             (data ? dnnl_memory_desc_create_with_tag(&d_plain, 4, dst, dnnl_f32, dnnl_nchw) == dnnl_success
                   : et_dnnl_slice_md(&d_plain, dst, P)) &&
             dnnl_memory_desc_create_with_tag(&b_md, 1, bia, dnnl_f32, dnnl_a) == dnnl_success &&
             dnnl_memory_desc_create_with_tag(&s_any, 4, src, dnnl_f32, dnnl_format_tag_any) == dnnl_success &&
             dnnl_memory_desc_create_with_tag(&w_any, 4, wei, dnnl_f32, dnnl_format_tag_any) == dnnl_success &&
             dnnl_memory_desc_create_with_tag(&d_any, 4, dst, dnnl_f32, dnnl_format_tag_any) == dnnl_success;
    /* the forward's description: the gradients' hint, and the forward itself */
    ok = ok && dnnl_convolution_forward_primitive_desc_create(
                   &fwd, et_dnnl.engine, dnnl_forward_training, dnnl_convolution_direct, s_any, w_any,
                   kind == ET_DNNL_FWD_BIAS ? b_md : 0, d_any, strides, dil, pl, pad_r, attr) == dnnl_success;
    if (ok && kind == ET_DNNL_DATA)
        ok = dnnl_convolution_backward_data_primitive_desc_create(&pd, et_dnnl.engine, dnnl_convolution_direct, s_any,
                                                                  w_any, d_any, strides, dil, pl, pad_r, fwd,
                                                                  attr) == dnnl_success;
    else if (ok && kind == ET_DNNL_WEIGHTS)
        ok = dnnl_convolution_backward_weights_primitive_desc_create(&pd, et_dnnl.engine, dnnl_convolution_direct,
                                                                     s_any, w_any, 0, d_any, strides, dil, pl, pad_r,
                                                                     fwd, attr) == dnnl_success;
    else if (ok) {
        pd = fwd;
        fwd = 0;
    }
#define ET_DNNL_MD(q) dnnl_primitive_desc_query_md(pd, q, 0)
    if (ok && kind == ET_DNNL_DATA) /* GY, W -> GX */
        ok = et_dnnl_operand(e, 0, DNNL_ARG_DIFF_DST, d_plain, ET_DNNL_MD(dnnl_query_diff_dst_md), 1, attr) &&
             et_dnnl_operand(e, 1, DNNL_ARG_WEIGHTS, w_plain, ET_DNNL_MD(dnnl_query_weights_md), 1, attr) &&
             et_dnnl_operand(e, 2, DNNL_ARG_DIFF_SRC, s_plain, ET_DNNL_MD(dnnl_query_diff_src_md), 0, attr);
    else if (ok && kind == ET_DNNL_WEIGHTS) /* X, GY -> GW */
        ok = et_dnnl_operand(e, 0, DNNL_ARG_SRC, s_plain, ET_DNNL_MD(dnnl_query_src_md), 1, attr) &&
             et_dnnl_operand(e, 1, DNNL_ARG_DIFF_DST, d_plain, ET_DNNL_MD(dnnl_query_diff_dst_md), 1, attr) &&
             et_dnnl_operand(e, 2, DNNL_ARG_DIFF_WEIGHTS, w_plain, ET_DNNL_MD(dnnl_query_diff_weights_md), 0, attr);
    else if (ok) /* X, W (, B) -> Y */
        ok = et_dnnl_operand(e, 0, DNNL_ARG_SRC, s_plain, ET_DNNL_MD(dnnl_query_src_md), 1, attr) &&
             et_dnnl_operand(e, 1, DNNL_ARG_WEIGHTS, w_plain, ET_DNNL_MD(dnnl_query_weights_md), 1, attr) &&
             et_dnnl_operand(e, 2, DNNL_ARG_DST, d_plain, ET_DNNL_MD(dnnl_query_dst_md), 0, attr) &&
             (kind != ET_DNNL_FWD_BIAS ||
              dnnl_memory_create(&e->bias, b_md, et_dnnl.engine, DNNL_MEMORY_NONE) == dnnl_success);
    if (ok && kind == ET_DNNL_WEIGHTS && e->blk[2])
        e->gw_block = et_dnnl_gw_block(ET_DNNL_MD(dnnl_query_diff_weights_md), wei);
    ok = ok && dnnl_memory_desc_clone(&e->pad, ET_DNNL_MD(dnnl_query_scratchpad_md)) == dnnl_success;
#undef ET_DNNL_MD
    if (ok) e->pad_size = dnnl_memory_desc_get_size(e->pad);
    ok = ok && dnnl_primitive_create(&e->conv, pd) == dnnl_success;
    dnnl_primitive_desc_destroy(pd);
    dnnl_primitive_desc_destroy(fwd);
    dnnl_primitive_attr_destroy(attr);
    dnnl_memory_desc_t mds[] = {s_plain, w_plain, d_plain, b_md, s_any, w_any, d_any};
    for (size_t i = 0; i < sizeof mds / sizeof mds[0]; ++i) dnnl_memory_desc_destroy(mds[i]);
    return ok;
}

/* the library's CPU engine, made at the first call; 0 if it could not be made (then never tried again: every
 * convolution takes the GEMM path) */
static dnnl_engine_t et_dnnl_engine(void) {
    if (!et_dnnl.engine && !et_dnnl.failed && dnnl_engine_create(&et_dnnl.engine, dnnl_cpu, 0) != dnnl_success) {
        et_dnnl.engine = 0;
        et_dnnl.failed = 1;
    }
    return et_dnnl.engine;
}

/* entry of this kind and shape, created at its first call; 0 where oneDNN does not take it */
static et_dnnl_entry *et_dnnl_find(const int key[ET_DNNL_KEY]) {
    for (int i = 0; i < et_dnnl.n; ++i)
        if (!memcmp(et_dnnl.e[i].key, key, sizeof et_dnnl.e[i].key)) return et_dnnl.e[i].ok > 0 ? &et_dnnl.e[i] : 0;
    if (et_dnnl.n == ET_DNNL_ENTRIES || !et_dnnl_engine()) return 0;
    et_dnnl_entry *e = &et_dnnl.e[et_dnnl.n++];
    memset(e, 0, sizeof *e);
    memcpy(e->key, key, sizeof e->key);
    e->ok = et_dnnl_create(e) ? 1 : -1;
    return e->ok > 0 ? e : 0;
}

/* a memory of m's layout (an entry's) over buf, or 0 */
static dnnl_memory_t et_dnnl_over(dnnl_memory_t m, void *buf) {
    const_dnnl_memory_desc_t md;
    dnnl_memory_t r = 0;
    if (dnnl_memory_get_memory_desc(m, &md) != dnnl_success ||
        dnnl_memory_create(&r, md, et_dnnl.engine, buf) != dnnl_success)
        return 0;
    return r;
}

/* the calling thread's scratch buffer `slot` (et_float_blas.h's et_scratch) of at least `bytes` */
static void *et_dnnl_scratch(int slot, size_t bytes) {
    return et_scratch(slot, (bytes + sizeof(float) - 1) / sizeof(float));
}

/* run reorder p from `from` to `to` on stream s */
static int et_dnnl_move(dnnl_primitive_t p, dnnl_stream_t s, dnnl_memory_t from, dnnl_memory_t to) {
    dnnl_exec_arg_t r[2] = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
    return dnnl_primitive_execute(p, s, 2, r) == dnnl_success;
}

/* one piece of entry e on the calling thread: the shared input s0 (already in the primitive's layout), the
 * piece's input b and output out (the program's arrays at the piece's slice), bias B (or 0); `keep`: the output
 * left in the primitive's layout, in the thread's scratch slot 5 (et_dnnl_kept), out unused; 0 on a failure */
static int et_dnnl_piece(et_dnnl_entry *e, const void *s0, const float *b, float *out, const float *B, int keep) {
    dnnl_stream_t s = et_dnnl_thread_stream();
    if (!s) return 0;
    /* m: the shared input, the piece's input and output as the program's, in the primitive's layout,
     * the bias, the scratchpad */
    dnnl_memory_t m[7] = {0};
    int ok = (m[0] = et_dnnl_over(e->blk[0] ? e->blk[0] : e->user[0], (void *)s0)) &&
             (m[1] = et_dnnl_over(e->user[1], (void *)b)) && (keep || (m[2] = et_dnnl_over(e->user[2], out)));
    for (int i = 1; i < 3 && ok; ++i)
        if (e->blk[i]) {
            void *buf = et_dnnl_scratch(3 + i, e->size[i]);
            ok = buf && (m[2 + i] = et_dnnl_over(e->blk[i], buf));
        }
    if (ok && B) ok = (m[5] = et_dnnl_over(e->bias, (void *)B)) != 0;
    if (ok && e->pad_size) {
        void *buf = et_dnnl_scratch(6, e->pad_size);
        ok = buf && dnnl_memory_create(&m[6], e->pad, et_dnnl.engine, buf) == dnnl_success;
    }
    dnnl_memory_t in = e->blk[1] ? m[3] : m[1], res = e->blk[2] ? m[4] : m[2];
    dnnl_exec_arg_t args[5] = {{e->arg[0], m[0]}, {e->arg[1], in}, {e->arg[2], res}};
    int n = 3;
    if (B) args[n++] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, m[5]};
    if (e->pad_size) args[n++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, m[6]};
    ok = ok && (!e->re[1] || et_dnnl_move(e->re[1], s, m[1], in));
    ok = ok && dnnl_primitive_execute(e->conv, s, n, args) == dnnl_success;
    ok = ok && (!e->re[2] || keep || et_dnnl_move(e->re[2], s, res, m[2]));
    ok = ok && dnnl_stream_wait(s) == dnnl_success;
    for (int i = 0; i < 7; ++i) dnnl_memory_destroy(m[i]);
    return ok;
}

/* a piece's output left in the primitive's layout by et_dnnl_piece(..., keep = 1) on this thread */
static const float *et_dnnl_kept(const et_dnnl_entry *e) {
    return (const float *)et_dnnl_scratch(5, e->size[2]);
}

/* a weight gradient's epilogue, run on a piece's thread right after the piece: `piece` of G output channels,
 * its gradient gw: with block 0 its rows (G x C*KH*KW floats, OIHW), else in oneDNN's ABcd<block>b<block>a
 * (et_dnnl_entry.gw_block) */
typedef void (*et_dnnl_post_fn)(const void *ctx, int piece, int G, const float *gw, int block);

/* entry e's `pieces` pieces in each of `groups` groups of images: group g's shared input, a + g * astep, reordered
 * once (all groups' into the calling thread's scratch slot 3, one after the other), then piece p of group g on
 * b + p * step1 into out + g * ostep + p * step2 (bias B + p * G); with `post` (a weight gradient's epilogue, one
 * group), piece p's output goes to its thread's scratch slot 2 instead (step2 floats, while the thread's caches
 * hold it; left in oneDNN's blocks where e->gw_block says the epilogue reads them) and post(ctx, p, G, that,
 * block) runs next (after a piece that ran); 0 on a failure */
static int et_dnnl_run(et_dnnl_entry *e, const float *a, const float *b, float *out, const float *B, int groups,
                       size_t astep, size_t ostep, int pieces, size_t step1, size_t step2, int G, double work,
                       et_dnnl_post_fn post, const void *ctx) {
    const char *s0 = (const char *)a;
    size_t s0step = astep * sizeof(float); /* bytes from one group's shared input to the next's */
    if (e->re[0]) { /* a reorder's result is the same on any number of threads: the library's count */
        s0step = (e->size[0] + 63) / 64 * 64;
        char *buf = (char *)et_dnnl_scratch(3, s0step * (size_t)groups);
        dnnl_stream_t s = et_dnnl_thread_stream();
#ifdef _OPENMP
        omp_set_num_threads(et_threads);
#endif
        int ok = buf && s;
        for (int g = 0; g < groups && ok; ++g)
            ok = dnnl_memory_set_data_handle(e->user[0], (void *)(a + g * astep)) == dnnl_success &&
                 dnnl_memory_set_data_handle(e->blk[0], buf + g * s0step) == dnnl_success &&
                 et_dnnl_move(e->re[0], s, e->user[0], e->blk[0]) && dnnl_stream_wait(s) == dnnl_success;
        omp_set_num_threads(1);
        if (!ok) return 0;
        s0 = buf;
    }
    int failed = 0;
    (void)work;
    /* one piece: no parallel loop around it, so that its epilogue's own loop can use the threads */
    ET_PARALLEL_FOR_OR(groups * pieces > 1 ? work : 0., failed)
    for (int q = 0; q < groups * pieces; ++q) {
        const int g = q / pieces, p = q % pieces, block = post ? e->gw_block : 0;
        float *o = block ? 0 : post ? et_scratch(2, step2) : out + g * ostep + p * step2;
        const int ok = (block || o) && et_dnnl_piece(e, s0 + g * s0step, b + p * step1, o,
                                                     B ? B + (size_t)p * G : 0, block > 0);
        if (ok && post) post(ctx, p, G, block ? et_dnnl_kept(e) : o, block);
        failed |= !ok;
    }
    return !failed;
}

/* the groups of images a forward or an input gradient of N images in `pieces` pieces runs in (ET_DNNL_SPREAD) */
static int et_dnnl_groups(int N, int pieces) {
    for (int d = 1; d < N; ++d)
        if (N % d == 0 && d * pieces >= ET_DNNL_SPREAD) return d;
    return N;
}

/* the convolution of this kind and shape on oneDNN: 1 done, 0 left to the GEMM path (a pointwise or
 * small convolution, a shape oneDNN refuses); a failure while running it is reported (ET_ERROR_HOOK).
 * With `post` (the weight gradient only), each piece's gradient rows go to it instead of `out` (et_dnnl_run) */
static int et_dnnl_conv_post(int kind, const float *a, const float *b, float *out, const float *B, int N, int C,
                             int H, int Wd, int O, int HO, int WO, int KH, int KW, int SH, int SW, int PH, int PW,
                             int DH, int DW, et_dnnl_post_fn post, const void *ctx) {
    const double macs = (double)N * O * HO * WO * C * KH * KW;
    if (!et_dnnl.tuned) et_dnnl_tune(-1, -1, -1, -1); /* the macros' settings */
    if (et_conv_pointwise(KH, KW, SH, SW, PH, PW, 1) || macs < et_dnnl.min_macs) return 0;
    /* the split channels: the input gradient's input channels, the others' output channels */
    const int data = kind == ET_DNNL_DATA, P = data ? C : O;
    const int piece = kind == ET_DNNL_WEIGHTS ? et_dnnl.gw_piece : et_dnnl.piece, G = P % piece ? P : piece;
    /* the groups of images (the weight gradient's sums span the batch: one), and a group's images */
    const int groups = kind == ET_DNNL_WEIGHTS ? 1 : et_dnnl_groups(N, P / G), n = N / groups;
    const int key[ET_DNNL_KEY] = {kind, n, data ? G : C, H, Wd, data ? O : G, HO, WO, KH, KW,
                                  SH, SW, PH, PW, DH, DW, P};
    /* the pieces' steps along the second input (W, or GY for the weight gradient) and the output */
    const size_t step1 = (size_t)G * (data ? KH * KW : kind == ET_DNNL_WEIGHTS ? HO * WO : C * KH * KW);
    const size_t step2 = (size_t)G * (data ? H * Wd : kind == ET_DNNL_WEIGHTS ? C * KH * KW : HO * WO);
    /* a group's steps along the shared input (X, or GY for the input gradient) and the output */
    const size_t astep = (size_t)n * (size_t)(data ? O * HO * WO : C * H * Wd);
    const size_t ostep = (size_t)n * (size_t)(data ? C * H * Wd : O * HO * WO);
    /* oneDNN's kernels take their thread count when the primitive is made and run on it: one */
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    et_dnnl_entry *e = et_dnnl_find(key);
    const int ok = e && et_dnnl_run(e, a, b, out, B, groups, astep, ostep, P / G, step1, step2, G, macs, post, ctx);
    omp_set_num_threads(threads);
    if (e && !ok) ET_ERROR_HOOK("et_dnnl_conv: oneDNN failed to run a convolution");
    return e != 0;
}

static int et_dnnl_conv(int kind, const float *a, const float *b, float *out, const float *B, int N, int C, int H,
                        int Wd, int O, int HO, int WO, int KH, int KW, int SH, int SW, int PH, int PW, int DH, int DW) {
    return et_dnnl_conv_post(kind, a, b, out, B, N, C, H, Wd, O, HO, WO, KH, KW, SH, SW, PH, PW, DH, DW, 0, 0);
}
#endif /* ET_DNNL_ON */
#endif /* ET_FLOAT_DNNL_H */
