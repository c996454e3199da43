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
 * slots 3-5 of et_float_blas.h's et_scratch. Pointwise convolutions (the MobileNets' bulk) and
 * small ones keep the GEMM path: there the reorders and a primitive's call cost more than they
 * save. Every primitive is made and runs on one OpenMP thread (the count is set to 1 around each
 * call, the primitive's making included, and restored: oneDNN fixes a primitive's threads when it
 * makes it), so the sums' order depends on the shape only, never on a thread count
 * (the threaded library's results stay the same at any count: et_common.h). Results differ from
 * the GEMM path's in the order of the float32 sums only.
 *
 * The table and the engine are the library's own (each loaded copy has its own) and
 * are touched by the calling thread only: the emitted code calls convolutions outside parallel
 * loops. Header-only (the table a weak symbol). */
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
/* a weight gradient of at least this many times its input's elements is asked for in OIHW, not in oneDNN's
 * blocked layout: oneDNN then sums it as a GEMM, which on ResNet-18's 512x512 layers at 4x4 (weights 36 times
 * their input at batch 8) took 3.2-3.3 ms against 4.2-4.3 ms for the blocked kernel and its reorder; at 4.5
 * times (the 256x256 layers at 8x8) the blocked kernel was the faster (2.8 against 3.2 ms) */
#ifndef ET_DNNL_PLAIN_GW
#define ET_DNNL_PLAIN_GW 16.0
#endif
/* primitives kept: a shape and kind each (ResNet-18 has 20 convolutions, 3 kinds) */
#ifndef ET_DNNL_ENTRIES
#define ET_DNNL_ENTRIES 256
#endif

enum { ET_DNNL_FWD = 0, ET_DNNL_FWD_BIAS = 1, ET_DNNL_DATA = 2, ET_DNNL_WEIGHTS = 3 };
#define ET_DNNL_KEY 16

/* one primitive: its two inputs and one output, each the program's array (`user`, a handle set
 * per call) reordered into or out of oneDNN's layout (`blk`, in a scratch buffer) where they differ */
typedef struct {
    int key[ET_DNNL_KEY]; /* kind, N, C, H, W, O, HO, WO, KH, KW, SH, SW, PH, PW, DH, DW */
    int ok;               /* 1 usable, -1 oneDNN refused the shape (the GEMM path runs it) */
    dnnl_primitive_t conv, re[3];
    dnnl_memory_t user[3], blk[3], bias;
    int arg[3];
    size_t size[3]; /* bytes of blk[i] */
} et_dnnl_entry;

/* the library's one table (weak: the kernel object's parts and model.c share it; hidden: each
 * loaded library keeps its own) */
typedef struct {
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    int failed; /* the engine could not be made: every convolution takes the GEMM path */
    int n;
    et_dnnl_entry e[ET_DNNL_ENTRIES];
} et_dnnl_table;
__attribute__((weak, visibility("hidden"))) et_dnnl_table et_dnnl;

/* the primitives made so far that oneDNN took (a test reads it through ctypes) */
__attribute__((weak)) int et_dnnl_primitives(void) {
    int n = 0;
    for (int i = 0; i < et_dnnl.n; ++i) n += et_dnnl.e[i].ok > 0;
    return n;
}

/* a reorder primitive from src to dst (both descriptions), or 0 */
static dnnl_primitive_t et_dnnl_reorder(const_dnnl_memory_desc_t src, const_dnnl_memory_desc_t dst) {
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t p = 0;
    if (dnnl_reorder_primitive_desc_create(&pd, src, et_dnnl.engine, dst, et_dnnl.engine, 0) != dnnl_success) return 0;
    if (dnnl_primitive_create(&p, pd) != dnnl_success) p = 0;
    dnnl_primitive_desc_destroy(pd);
    return p;
}

/* operand i of entry e: the program's array as `plain` (NCHW / OIHW) and the primitive's `want`:
 * a reorder and a buffer-backed memory where they differ. `in`: into the primitive (else out of it) */
static int et_dnnl_operand(et_dnnl_entry *e, int i, int arg, const_dnnl_memory_desc_t plain,
                           const_dnnl_memory_desc_t want, int in) {
    e->arg[i] = arg;
    if (dnnl_memory_create(&e->user[i], plain, et_dnnl.engine, DNNL_MEMORY_NONE) != dnnl_success) return 0;
    if (dnnl_memory_desc_equal(plain, want)) return 1;
    e->size[i] = dnnl_memory_desc_get_size(want);
    if (dnnl_memory_create(&e->blk[i], want, et_dnnl.engine, DNNL_MEMORY_NONE) != dnnl_success) return 0;
    e->re[i] = in ? et_dnnl_reorder(plain, want) : et_dnnl_reorder(want, plain);
    return e->re[i] != 0;
}

/* the primitive of entry e (its key set): 1, or 0 where oneDNN refuses it */
static int et_dnnl_create(et_dnnl_entry *e) {
    const int kind = e->key[0], N = e->key[1], C = e->key[2], H = e->key[3], Wd = e->key[4], O = e->key[5];
    const int HO = e->key[6], WO = e->key[7], KH = e->key[8], KW = e->key[9], SH = e->key[10], SW = e->key[11];
    const int PH = e->key[12], PW = e->key[13], DH = e->key[14], DW = e->key[15];
    /* the right and bottom padding that gives HO x WO (oneDNN's output size from its paddings) */
    const int PB = (HO - 1) * SH + (KH - 1) * DH + 1 - H - PH, PR = (WO - 1) * SW + (KW - 1) * DW + 1 - Wd - PW;
    const int pb = PB < 0 && PB + SH - 1 >= 0 ? 0 : PB, pr = PR < 0 && PR + SW - 1 >= 0 ? 0 : PR;
    if (pb < 0 || pr < 0) return 0;
    dnnl_dims_t src = {N, C, H, Wd}, wei = {O, C, KH, KW}, dst = {N, O, HO, WO}, bia = {O};
    dnnl_dims_t strides = {SH, SW}, dil = {DH - 1, DW - 1}, pl = {PH, PW}, pad_r = {pb, pr};
    dnnl_memory_desc_t s_plain = 0, w_plain = 0, d_plain = 0, b_md = 0, s_any = 0, w_any = 0, d_any = 0;
    dnnl_primitive_desc_t fwd = 0, pd = 0;
    int ok = dnnl_memory_desc_create_with_tag(&s_plain, 4, src, dnnl_f32, dnnl_nchw) == dnnl_success &&
             dnnl_memory_desc_create_with_tag(&w_plain, 4, wei, dnnl_f32, dnnl_oihw) == dnnl_success &&
             dnnl_memory_desc_create_with_tag(&d_plain, 4, dst, dnnl_f32, dnnl_nchw) == dnnl_success &&
             dnnl_memory_desc_create_with_tag(&b_md, 1, bia, dnnl_f32, dnnl_a) == dnnl_success &&
             dnnl_memory_desc_create_with_tag(&s_any, 4, src, dnnl_f32, dnnl_format_tag_any) == dnnl_success &&
             dnnl_memory_desc_create_with_tag(&w_any, 4, wei, dnnl_f32, dnnl_format_tag_any) == dnnl_success &&
             dnnl_memory_desc_create_with_tag(&d_any, 4, dst, dnnl_f32, dnnl_format_tag_any) == dnnl_success;
    /* the forward's description: the gradients' hint, and the forward itself */
    ok = ok && dnnl_convolution_forward_primitive_desc_create(
                   &fwd, et_dnnl.engine, dnnl_forward_training, dnnl_convolution_direct, s_any, w_any,
                   kind == ET_DNNL_FWD_BIAS ? b_md : 0, d_any, strides, dil, pl, pad_r, 0) == dnnl_success;
    if (ok && kind == ET_DNNL_DATA)
        ok = dnnl_convolution_backward_data_primitive_desc_create(&pd, et_dnnl.engine, dnnl_convolution_direct, s_any,
                                                                  w_any, d_any, strides, dil, pl, pad_r, fwd,
                                                                  0) == dnnl_success;
    else if (ok && kind == ET_DNNL_WEIGHTS) /* a gradient much larger than its input: written in OIHW itself */
        ok = dnnl_convolution_backward_weights_primitive_desc_create(
                 &pd, et_dnnl.engine, dnnl_convolution_direct, s_any,
                 (double)O * KH * KW >= ET_DNNL_PLAIN_GW * N * H * Wd ? w_plain : w_any, 0, d_any, strides, dil, pl,
                 pad_r, fwd, 0) == dnnl_success;
    else if (ok) {
        pd = fwd;
        fwd = 0;
    }
#define ET_DNNL_MD(q) dnnl_primitive_desc_query_md(pd, q, 0)
    if (ok && kind == ET_DNNL_DATA) /* GY, W -> GX */
        ok = et_dnnl_operand(e, 0, DNNL_ARG_DIFF_DST, d_plain, ET_DNNL_MD(dnnl_query_diff_dst_md), 1) &&
             et_dnnl_operand(e, 1, DNNL_ARG_WEIGHTS, w_plain, ET_DNNL_MD(dnnl_query_weights_md), 1) &&
             et_dnnl_operand(e, 2, DNNL_ARG_DIFF_SRC, s_plain, ET_DNNL_MD(dnnl_query_diff_src_md), 0);
    else if (ok && kind == ET_DNNL_WEIGHTS) /* X, GY -> GW */
        ok = et_dnnl_operand(e, 0, DNNL_ARG_SRC, s_plain, ET_DNNL_MD(dnnl_query_src_md), 1) &&
             et_dnnl_operand(e, 1, DNNL_ARG_DIFF_DST, d_plain, ET_DNNL_MD(dnnl_query_diff_dst_md), 1) &&
             et_dnnl_operand(e, 2, DNNL_ARG_DIFF_WEIGHTS, w_plain, ET_DNNL_MD(dnnl_query_diff_weights_md), 0);
    else if (ok) /* X, W (, B) -> Y */
        ok = et_dnnl_operand(e, 0, DNNL_ARG_SRC, s_plain, ET_DNNL_MD(dnnl_query_src_md), 1) &&
             et_dnnl_operand(e, 1, DNNL_ARG_WEIGHTS, w_plain, ET_DNNL_MD(dnnl_query_weights_md), 1) &&
             et_dnnl_operand(e, 2, DNNL_ARG_DST, d_plain, ET_DNNL_MD(dnnl_query_dst_md), 0) &&
             (kind != ET_DNNL_FWD_BIAS ||
              dnnl_memory_create(&e->bias, b_md, et_dnnl.engine, DNNL_MEMORY_NONE) == dnnl_success);
#undef ET_DNNL_MD
    ok = ok && dnnl_primitive_create(&e->conv, pd) == dnnl_success;
    dnnl_primitive_desc_destroy(pd);
    dnnl_primitive_desc_destroy(fwd);
    dnnl_memory_desc_t mds[] = {s_plain, w_plain, d_plain, b_md, s_any, w_any, d_any};
    for (size_t i = 0; i < sizeof mds / sizeof mds[0]; ++i) dnnl_memory_desc_destroy(mds[i]);
    return ok;
}

/* entry of this kind and shape, created at its first call; 0 where oneDNN does not take it */
static et_dnnl_entry *et_dnnl_find(int kind, int N, int C, int H, int Wd, int O, int HO, int WO, int KH, int KW,
                                   int SH, int SW, int PH, int PW, int DH, int DW) {
    const int key[ET_DNNL_KEY] = {kind, N, C, H, Wd, O, HO, WO, KH, KW, SH, SW, PH, PW, DH, DW};
    for (int i = 0; i < et_dnnl.n; ++i)
        if (!memcmp(et_dnnl.e[i].key, key, sizeof key)) return et_dnnl.e[i].ok > 0 ? &et_dnnl.e[i] : 0;
    if (et_dnnl.failed || et_dnnl.n == ET_DNNL_ENTRIES) return 0;
    if (!et_dnnl.engine) {
        if (dnnl_engine_create(&et_dnnl.engine, dnnl_cpu, 0) != dnnl_success ||
            dnnl_stream_create(&et_dnnl.stream, et_dnnl.engine, dnnl_stream_default_flags) != dnnl_success) {
            et_dnnl.failed = 1;
            return 0;
        }
    }
    et_dnnl_entry *e = &et_dnnl.e[et_dnnl.n++];
    memset(e, 0, sizeof *e);
    memcpy(e->key, key, sizeof key);
    e->ok = et_dnnl_create(e) ? 1 : -1;
    return e->ok > 0 ? e : 0;
}

/* run entry e on the program's arrays a, b (inputs) and out, bias B (the forward with bias only);
 * 0 on a failure (a scratch buffer not allocated, oneDNN's error) */
static int et_dnnl_run(et_dnnl_entry *e, const float *a, const float *b, float *out, const float *B) {
    void *h[3] = {(void *)a, (void *)b, out};
    dnnl_exec_arg_t args[4];
    int ok = 1;
    for (int i = 0; i < 3 && ok; ++i) {
        ok = dnnl_memory_set_data_handle(e->user[i], h[i]) == dnnl_success;
        args[i].arg = e->arg[i];
        args[i].memory = e->user[i];
        if (ok && e->blk[i]) {
            void *buf = et_scratch(3 + i, (e->size[i] + sizeof(float) - 1) / sizeof(float));
            ok = buf && dnnl_memory_set_data_handle(e->blk[i], buf) == dnnl_success;
            args[i].memory = e->blk[i];
        }
    }
    if (ok && B) ok = dnnl_memory_set_data_handle(e->bias, (void *)B) == dnnl_success;
    args[3].arg = DNNL_ARG_BIAS;
    args[3].memory = e->bias;
    for (int i = 0; i < 2 && ok; ++i)
        if (e->re[i]) {
            dnnl_exec_arg_t r[2] = {{DNNL_ARG_FROM, e->user[i]}, {DNNL_ARG_TO, e->blk[i]}};
            ok = dnnl_primitive_execute(e->re[i], et_dnnl.stream, 2, r) == dnnl_success;
        }
    ok = ok && dnnl_primitive_execute(e->conv, et_dnnl.stream, B ? 4 : 3, args) == dnnl_success;
    if (ok && e->re[2]) {
        dnnl_exec_arg_t r[2] = {{DNNL_ARG_FROM, e->blk[2]}, {DNNL_ARG_TO, e->user[2]}};
        ok = dnnl_primitive_execute(e->re[2], et_dnnl.stream, 2, r) == dnnl_success;
    }
    ok = ok && dnnl_stream_wait(et_dnnl.stream) == dnnl_success;
    return ok;
}

/* the convolution of this kind and shape on oneDNN: 1 done, 0 left to the GEMM path (a pointwise or
 * small convolution, a shape oneDNN refuses); a failure while running it is reported (ET_ERROR_HOOK) */
static int et_dnnl_conv(int kind, const float *a, const float *b, float *out, const float *B, int N, int C, int H,
                        int Wd, int O, int HO, int WO, int KH, int KW, int SH, int SW, int PH, int PW, int DH, int DW) {
    if (et_conv_pointwise(KH, KW, SH, SW, PH, PW, 1) || (double)N * O * HO * WO * C * KH * KW < ET_DNNL_MIN_MACS)
        return 0;
    /* oneDNN's kernels take their thread count when the primitive is made and run on it: one */
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    et_dnnl_entry *e = et_dnnl_find(kind, N, C, H, Wd, O, HO, WO, KH, KW, SH, SW, PH, PW, DH, DW);
    const int ok = e && et_dnnl_run(e, a, b, out, B);
    omp_set_num_threads(threads);
    if (e && !ok) ET_ERROR_HOOK("et_dnnl_conv: oneDNN failed to run a convolution");
    return e != 0;
}
#endif /* ET_DNNL_ON */
#endif /* ET_FLOAT_DNNL_H */
