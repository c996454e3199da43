/* edgetrain int8 training: the float32 backward of the int8 program (input, weight and bias
 * gradients of qconv2d), bit-identical to the numpy references in src/edgetrain/ops (qconv.py;
 * the qsgd update of qoptim.py is et_int8_update.h's). Kept apart from et_int8.h (the integer forward)
 * so the two are tuned independently; the numerics contract is et_int8.h's: every float32
 * sum runs in the reference's documented order, compiled with -ffp-contract=off.
 */
#ifndef ET_INT8_GRAD_H
#define ET_INT8_GRAD_H

#include "et_int8.h"
#if defined(__ARM_NEON)
/* aarch64 (and Armv7 NEON): a few loops below in 4 float32 lanes. Each lane runs the very
 * operations of the portable loop on its own element, in the same order: a multiply and an
 * add, each rounded (vmulq_f32, vaddq_f32; never vfmaq_f32), so the results stay bit-identical
 * to the reference (backends/c/cross.py checks them under qemu-aarch64). */
#include <arm_neon.h>
#endif

/* ---- backward (float32) ---------------------------------------------------------------- */
/* qconv2d_grad_input of a 1x1 kernel in gather form: each gx element (n, c, h, w) is one sum
 * over its group's output channels o, in ascending o, of wr[o, c] * g[n, o, ho, wo], started
 * from 0 (the reference's (o, i, j) order with one tap). Blocks of ET_GI_CB input channels x
 * ET_GI_PB pixels keep their sums in FPU registers across o: per o, ET_GI_CB weights and
 * ET_GI_PB gradients feed ET_GI_CB * ET_GI_PB multiplies and adds (separate, as the reference:
 * no fused multiply-add). The weight scales of ET_GI_OCHUNK output channels (et_fscale_at) are
 * computed once per chunk, image and tile of ET_GI_TILE pixels; the weights, widened to float and
 * scaled once per (o, c), image and tile, are held for the chunk (3.75 KB of stack with the
 * scales, the tile's masks 0.45 KB more); between chunks the partial sums wait in gx (stored
 * and reloaded exactly), so every sum still runs in ascending o. */
#define ET_GI_CB 4
#define ET_GI_PB 4
#define ET_GI_OCHUNK 192

/* wf[t * ET_GI_CB + k] = (float)w[o0 + t, c + k] * ws[t] for t < no, k < nc; 0 for k >= nc
 * (read from a zero byte). Unless the weight is split by output channel, column c + k is one
 * pointer and stride, so each output channel costs one scale load and four widenings. */
static const int8_t et_gi_zero = 0;
static inline void et_gi_widen(const et_w8 *w, int32_t o0, int32_t no, int32_t c, int32_t nc, int32_t cg,
                               const float *ws, float *ET_RESTRICT wf) {
    if (w->map && w->dim == 0) { /* split by output channel: row o is whole in one array */
        for (int32_t t = 0; t < no; t++) {
            const int8_t *row = et_w8_taps(w, o0 + t, c, cg, 1);
            const float s = ws[t];
            for (int32_t k = 0; k < ET_GI_CB; k++) wf[t * ET_GI_CB + k] = k < nc ? (float)row[k] * s : 0.0f;
        }
        return;
    }
    const int8_t *p[ET_GI_CB];
    int32_t st[ET_GI_CB];
    for (int32_t k = 0; k < ET_GI_CB; k++) { /* whole, or split by input channel */
        p[k] = k < nc ? et_w8_taps(w, o0, c + k, cg, 1) : &et_gi_zero;
        st[k] = k >= nc ? 0 : !w->map ? cg : (w->map[c + k] >= 0 ? w->nsel : w->nrest);
    }
    const int8_t *p0 = p[0], *p1 = p[1], *p2 = p[2], *p3 = p[3];
    for (int32_t t = 0; t < no; t++, wf += ET_GI_CB, p0 += st[0], p1 += st[1], p2 += st[2], p3 += st[3]) {
        const float s = ws[t];
        wf[0] = (float)*p0 * s;
        wf[1] = (float)*p1 * s;
        wf[2] = (float)*p2 * s;
        wf[3] = (float)*p3 * s;
    }
}

/* one output channel's step of a block: its ET_GI_CB weights W times its ET_GI_PB gradient
 * pixels G, each product added to its sum (a[k][q]) */
#define ET_GI_STEP(W, G)                                                                  \
    do {                                                                                  \
        const float g0 = (G)[0], g1 = (G)[1], g2 = (G)[2], g3 = (G)[3];                   \
        _Pragma("GCC unroll 4") for (int32_t k = 0; k < ET_GI_CB; k++) {                  \
            const float wk = (W)[k];                                                      \
            float p0 = wk * g0, p1 = wk * g1, p2 = wk * g2, p3 = wk * g3;                 \
            a[k][0] = a[k][0] + p0;                                                       \
            a[k][1] = a[k][1] + p1;                                                       \
            a[k][2] = a[k][2] + p2;                                                       \
            a[k][3] = a[k][3] + p3;                                                       \
        }                                                                                 \
    } while (0)

/* ET_GI_CB channels x ET_GI_PB pixels: gx[k * cs + q * xs] (k < nc) over the chunk's `no` output
 * channels (gradient pixels g[t * gs + q]), from 0 when `first`, else from gx's partial sums.
 * With a mask m (et_gi_masks), only the channels whose bit is set: the others' gradients are
 * zero at all four pixels, and a zero product added to a sum leaves it as it is (a sum started
 * from +0 is never -0 in round-to-nearest, and +0 + -0 = +0), so the sums are the dense loop's. */
static inline void et_gi_block4x4(const float *ET_RESTRICT wf, const float *g, int32_t gs, int32_t no,
                                  const uint32_t *m, float *gx, int32_t cs, int32_t xs, int32_t nc, int first) {
    float a[ET_GI_CB][ET_GI_PB];
#pragma GCC unroll 4
    for (int32_t k = 0; k < ET_GI_CB; k++)
#pragma GCC unroll 4
        for (int32_t q = 0; q < ET_GI_PB; q++) a[k][q] = (first || k >= nc) ? 0.0f : gx[k * cs + q * xs];
    if (m) {
        for (int32_t j = 0; j < (no + 31) / 32; j++)
            for (uint32_t b = m[j]; b; b &= b - 1) {
                const int32_t t = 32 * j + __builtin_ctz(b);
                ET_GI_STEP(wf + t * ET_GI_CB, g + t * gs);
            }
    } else {
        /* two output channels per loop trip (half the loop overhead); a compiler barrier (an
         * empty asm clobbering memory) between them keeps gcc from hoisting the second one's
         * loads above the first one's arithmetic: plainly unrolled, 16 sums and 16 operands
         * spill out of the 32 FPU registers */
        const float *wend = wf + (no & ~1) * ET_GI_CB;
        while (wf < wend) {
            ET_GI_STEP(wf, g);
            g += gs;
            __asm__ volatile("" ::: "memory");
            ET_GI_STEP(wf + ET_GI_CB, g);
            g += gs;
            wf += 2 * ET_GI_CB;
            __asm__ volatile("" ::: "memory");
        }
        if (no & 1) ET_GI_STEP(wf, g);
    }
#pragma GCC unroll 4
    for (int32_t k = 0; k < ET_GI_CB; k++)
        if (k < nc)
#pragma GCC unroll 4
            for (int32_t q = 0; q < ET_GI_PB; q++) gx[k * cs + q * xs] = a[k][q];
}
#undef ET_GI_STEP

#if defined(ET_INT8_HOST_PW)
/* The host's block (flat planes): ET_GI_CB channels x ET_GI_HPB consecutive pixels, each channel's
 * sums one vector of pixels (GCC's vector extension: the products and adds lane by lane, each
 * pixel's sum in ascending o as above; every product added: a dense loop). */
#define ET_GI_HPB 16
typedef float et_gi_v16 __attribute__((vector_size(64), aligned(4)));
static inline void et_gi_block_host(const float *ET_RESTRICT wf, const float *g, int32_t gs, int32_t no, float *gx,
                                    int32_t cs, int32_t nc, int first) {
    const et_gi_v16 zero = {0.0f};
    et_gi_v16 a0 = zero, a1 = zero, a2 = zero, a3 = zero;
    if (!first) {
        a0 = *(const et_gi_v16 *)gx;
        if (nc > 1) a1 = *(const et_gi_v16 *)(gx + cs);
        if (nc > 2) a2 = *(const et_gi_v16 *)(gx + 2 * cs);
        if (nc > 3) a3 = *(const et_gi_v16 *)(gx + 3 * cs);
    }
    for (int32_t t = 0; t < no; t++, wf += ET_GI_CB, g += gs) {
        const et_gi_v16 gv = *(const et_gi_v16 *)g;
        const et_gi_v16 p0 = wf[0] * gv, p1 = wf[1] * gv, p2 = wf[2] * gv, p3 = wf[3] * gv;
        a0 = a0 + p0;
        a1 = a1 + p1;
        a2 = a2 + p2;
        a3 = a3 + p3;
    }
    *(et_gi_v16 *)gx = a0;
    if (nc > 1) *(et_gi_v16 *)(gx + cs) = a1;
    if (nc > 2) *(et_gi_v16 *)(gx + 2 * cs) = a2;
    if (nc > 3) *(et_gi_v16 *)(gx + 3 * cs) = a3;
}
#endif

/* The gradient of a conv followed by a clamp (ReLU6's mask) is mostly zero (half to 7/8 of
 * each 1x1 expansion layer's in the paper's models). For the `nb` groups of ET_GI_PB pixels
 * g[k * ET_GI_PB ...] of a tile: bit t of m[k] is set when output channel t's gradient
 * (g[t * gs + ...]) is nonzero at one of the group's pixels (-0 counts as zero), live[k] counts
 * them. */
#define ET_GI_TILE 64
#define ET_GI_MW ((ET_GI_OCHUNK + 31) / 32)
static inline void et_gi_masks(const float *g, int32_t gs, int32_t no, int32_t nb, uint32_t (*m)[ET_GI_MW],
                               int32_t *live) {
    for (int32_t k = 0; k < nb; k++) {
        live[k] = 0;
        for (int32_t j = 0; j < ET_GI_MW; j++) m[k][j] = 0;
    }
    for (int32_t t = 0; t < no; t++, g += gs)
        for (int32_t k = 0; k < nb; k++) {
            uint32_t u[ET_GI_PB];
            memcpy(u, g + k * ET_GI_PB, sizeof u);
            if ((u[0] | u[1] | u[2] | u[3]) << 1) {
                m[k][t >> 5] |= 1u << (t & 31);
                live[k]++;
            }
        }
}

/* et_gi_block4x4 for one pixel */
static inline void et_gi_block4x1(const float *ET_RESTRICT wf, const float *g, int32_t gs, int32_t no,
                                  float *gx, int32_t cs, int32_t nc, int first) {
    float a0 = (first || nc < 1) ? 0.0f : gx[0], a1 = (first || nc < 2) ? 0.0f : gx[cs];
    float a2 = (first || nc < 3) ? 0.0f : gx[2 * cs], a3 = (first || nc < 4) ? 0.0f : gx[3 * cs];
    for (int32_t t = 0; t < no; t++, wf += ET_GI_CB, g += gs) {
        const float gv = g[0];
        float p0 = wf[0] * gv, p1 = wf[1] * gv, p2 = wf[2] * gv, p3 = wf[3] * gv;
        a0 = a0 + p0;
        a1 = a1 + p1;
        a2 = a2 + p2;
        a3 = a3 + p3;
    }
    gx[0] = a0;
    if (nc > 1) gx[cs] = a1;
    if (nc > 2) gx[2 * cs] = a2;
    if (nc > 3) gx[3 * cs] = a3;
}

static inline void et_qconv_grad_input_1x1(const et_qconv_p *P, const float *g, const et_w8 *w,
                                           const et_fscale *S, float *ET_RESTRICT gx) {
    const int32_t opg = P->o / P->groups, hw = P->h * P->w, howo = P->ho * P->wo;
    /* stride 1 and the same size: g's pixels map one to one onto gx's, as one flat row, taken in
     * tiles of ET_GI_TILE pixels whose groups skip the zero gradients (et_gi_masks) */
    const int flat = P->sh == 1 && P->sw == 1 && P->ho == P->h && P->wo == P->w;
    const int32_t rows = flat ? 1 : P->ho, cols = flat ? howo : P->wo, tile = flat ? ET_GI_TILE : cols;
    if (!flat) memset(gx, 0, sizeof(float) * (size_t)(P->n * P->c * hw)); /* the pixels no tap reaches */
    /* the host's threads: the images' tiles, each element's sum in one thread and in ascending o */
    ET_PARALLEL_FOR2((double)P->n * P->o * P->cg * howo)
    for (int32_t n = 0; n < P->n; n++)
        for (int32_t p0 = 0; p0 < cols; p0 += tile) {
            const int32_t np = cols - p0 < tile ? cols - p0 : tile, nb = flat ? np / ET_GI_PB : 0;
            float ws[ET_GI_OCHUNK];
            uint32_t m[ET_GI_TILE / ET_GI_PB][ET_GI_MW];
            int32_t live[ET_GI_TILE / ET_GI_PB];
            for (int32_t grp = 0; grp < P->groups; grp++)
                for (int32_t o0 = grp * opg; o0 < (grp + 1) * opg; o0 += ET_GI_OCHUNK) {
                    const int32_t no = (grp + 1) * opg - o0 < ET_GI_OCHUNK ? (grp + 1) * opg - o0 : ET_GI_OCHUNK;
                    const int first = o0 == grp * opg;
                    const float *go = g + (n * P->o + o0) * howo + p0;
                    for (int32_t t = 0; t < no; t++) ws[t] = et_fscale_at(S, o0 + t);
                    et_gi_masks(go, howo, no, nb, m, live);
                    for (int32_t c = 0; c < P->cg; c += ET_GI_CB) {
                        const int32_t nc = P->cg - c < ET_GI_CB ? P->cg - c : ET_GI_CB;
                        float *gxc = gx + (n * P->c + grp * P->cg + c) * hw + p0 * P->sw;
                        float wf[ET_GI_OCHUNK * ET_GI_CB];
                        et_gi_widen(w, o0, no, c, nc, P->cg, ws, wf);
                        for (int32_t r = 0; r < rows; r++) {
                            const float *gr = go + r * cols;
                            float *xr = gxc + r * P->sh * P->w;
                            int32_t q = 0;
#if defined(ET_INT8_HOST_PW)
                            if (flat)
                                for (; q + ET_GI_HPB <= np; q += ET_GI_HPB)
                                    et_gi_block_host(wf, gr + q, howo, no, xr + q, hw, nc, first);
#endif
                            for (; q + ET_GI_PB <= np; q += ET_GI_PB) {
                                /* a group with few zero channels takes the dense loop: a set bit
                                 * costs about a fifth of a channel's step more */
                                const int32_t k = q / ET_GI_PB;
                                const uint32_t *mk = k < nb && 6 * live[k] < 5 * no ? m[k] : 0;
                                et_gi_block4x4(wf, gr + q, howo, no, mk, xr + q * P->sw, hw, P->sw, nc, first);
                            }
                            for (; q < np; q++) et_gi_block4x1(wf, gr + q, howo, no, xr + q * P->sw, hw, nc, first);
                        }
                    }
                }
        }
}

/* qconv2d_grad_input: gx = conv-transpose(g, w * w_scale[o]); each gx element adds its
 * contributions in (o, i, j) order starting from 0 (ops/qconv.py: _grad_input_ref). 1x1
 * kernels without padding (every dense layer of the paper's models) take the register-blocked
 * gather above; the others scatter each (o, i, j) tap's products over gx in turn. S: the weight
 * scales per output channel (kernels/int8_scales.py). Out of line: one copy for every layer. */
__attribute__((noinline, unused)) ET_SMALL_ATTR static void et_qconv_grad_input_fs(const et_qconv_p *P,
                                                                                   const float *g, const et_w8 *w,
                                                                                   const et_fscale *S,
                                                                                   float *ET_RESTRICT gx) {
    if (P->kh == 1 && P->kw == 1 && P->ph == 0 && P->pw == 0) {
        et_qconv_grad_input_1x1(P, g, w, S, gx);
        return;
    }
    const int32_t opg = P->o / P->groups, khkw = P->kh * P->kw, hw = P->h * P->w, howo = P->ho * P->wo;
    memset(gx, 0, sizeof(float) * (size_t)(P->n * P->c * hw));
    for (int32_t n = 0; n < P->n; n++)
        for (int32_t o = 0; o < P->o; o++) {
            const int32_t c0 = (o / opg) * P->cg;
            const float *go = g + (n * P->o + o) * howo;
            const float so = et_fscale_at(S, o);
            for (int32_t i = 0; i < P->kh; i++)
                for (int32_t j = 0; j < P->kw; j++) {
                    int32_t lo, hi;
                    et_col_range(P, j, &lo, &hi);
                    for (int32_t c = 0; c < P->cg; c++) {
                        const float wr = (float)et_w8_taps(w, o, c, P->cg, khkw)[i * P->kw + j] * so;
                        float *gxc = gx + (n * P->c + c0 + c) * hw + j * P->dw - P->pw;
                        for (int32_t ho = 0; ho < P->ho; ho++) {
                            const int32_t h = ho * P->sh - P->ph + i * P->dh;
                            if (h < 0 || h >= P->h) continue;
                            float *gr = gxc + h * P->w;
                            const float *gi = go + ho * P->wo;
                            int32_t q = lo;
#if defined(__ARM_NEON)
                            if (P->sw == 1) { /* gr and gi lie in gx and g: distinct buffers */
                                const float32x4_t wv = vdupq_n_f32(wr);
                                for (; q + 4 <= hi; q += 4)
                                    vst1q_f32(gr + q, vaddq_f32(vld1q_f32(gr + q), vmulq_f32(wv, vld1q_f32(gi + q))));
                            }
#endif
                            for (; q < hi; q++) {
                                const float p = wr * gi[q];
                                gr[q * P->sw] = gr[q * P->sw] + p;
                            }
                        }
                    }
                }
        }
}

/* qconv2d_dw_grad_input by scattering each tap's products over the plane in (i, j) order (a
 * plane too large for et_qconv_dw_grad_input's padded copy) */
static inline void et_qconv_dw_grad_input_scatter(const et_qconv_p *P, const float *g, const et_w8 *w,
                                                  const et_fscale *S, float *gx, float *ET_RESTRICT plane) {
    const int32_t khkw = P->kh * P->kw, hw = P->h * P->w, howo = P->ho * P->wo;
    for (int32_t n = 0; n < P->n; n++)
        for (int32_t c = 0; c < P->c; c++) {
            const float *gc = g + (n * P->c + c) * howo;
            const int8_t *taps = et_w8_taps(w, c, 0, 1, khkw);
            const float sc = et_fscale_at(S, c);
            for (int32_t t = 0; t < hw; t++) plane[t] = 0.0f;
            for (int32_t i = 0; i < P->kh; i++)
                for (int32_t j = 0; j < P->kw; j++) {
                    const float wr = (float)taps[i * P->kw + j] * sc;
                    int32_t lo, hi;
                    et_col_range(P, j, &lo, &hi);
                    for (int32_t ho = 0; ho < P->ho; ho++) {
                        const int32_t h = ho * P->sh - P->ph + i * P->dh;
                        if (h < 0 || h >= P->h) continue;
                        float *pr = plane + h * P->w + j * P->dw - P->pw;
                        const float *gi = gc + ho * P->wo;
                        for (int32_t q = lo; q < hi; q++) {
                            const float p = wr * gi[q];
                            pr[q * P->sw] = pr[q * P->sw] + p;
                        }
                    }
                }
            memcpy(gx + (n * P->c + c) * hw, plane, sizeof(float) * (size_t)hw);
        }
}

/* The taps of one axis that reach gradient positions from input position `at`: the valid
 * ones (divisible by the stride, in range) are first, first + step, ... (count of them);
 * the gradient position of the first is *pos0 and drops by *dpos per step. */
#define ET_DWG_MAX 64  /* the largest plane side of the gather form */
#define ET_DWG_TAPS 49 /* and its largest kernel (7x7) */
/* whether a layer of the program is too large for the gather form, so that the scatter form is compiled:
 * model.c defines it from every depthwise layer's descriptor (backends/c/kernel_select.py's dwg_scatter,
 * which holds these bounds too); the paper's three models at 128x128 have none (0.85-0.86 KB less
 * Cortex-M code and tables, 60877e5). Undefined: compiled. */
#ifndef ET_DWG_SCATTER
#define ET_DWG_SCATTER 1
#endif
static inline int32_t et_gcd(int32_t a, int32_t b) {
    while (b) { const int32_t t = a % b; a = b; b = t; }
    return a;
}

static inline void et_dwg_axis(int32_t at, int32_t k, int32_t s, int32_t p, int32_t d, int32_t out, int8_t *first,
                               int8_t *count, int8_t *pos0) {
    int32_t f = -1, cnt = 0, q0 = 0;
    for (int32_t t = 0; t < k; t++) {
        const int32_t u = at + p - t * d;
        if (u % s != 0 || u < 0 || u / s >= out) continue;
        if (f < 0) { f = t; q0 = u / s; }
        cnt++;
    }
    *first = (int8_t)(f < 0 ? 0 : f);
    *count = (int8_t)cnt;
    *pos0 = (int8_t)q0;
}

/* The per-row and per-column tap progressions of a layer (et_dwg_axis), and per valid step
 * the tap's advance (si rows of kw taps, sj columns) and the gradient position's drop (sg, sq) */
typedef struct {
    int8_t rf[ET_DWG_MAX], rc[ET_DWG_MAX], r0[ET_DWG_MAX], cf[ET_DWG_MAX], cc[ET_DWG_MAX], c0[ET_DWG_MAX];
    int32_t si, sg, sj, sq;
} et_dwg_taps;

static inline void et_dwg_setup(const et_qconv_p *P, et_dwg_taps *T) {
    for (int32_t h = 0; h < P->h; h++) et_dwg_axis(h, P->kh, P->sh, P->ph, P->dh, P->ho, T->rf + h, T->rc + h, T->r0 + h);
    for (int32_t x = 0; x < P->w; x++) et_dwg_axis(x, P->kw, P->sw, P->pw, P->dw, P->wo, T->cf + x, T->cc + x, T->c0 + x);
    const int32_t gh = et_gcd(P->sh, P->dh), gw = et_gcd(P->sw, P->dw);
    T->si = (P->sh / gh) * P->kw;
    T->sg = (P->dh / gh) * P->wo;
    T->sj = P->sw / gw;
    T->sq = P->dw / gw;
}

/* One channel: out[h * W + x] = its taps' sum in (i, j) order, from 0 (wf: the float taps,
 * gc: the gradient plane) */
static inline void et_dwg_plane1(const et_qconv_p *P, const et_dwg_taps *T, const float *wf, const float *gc,
                                 float *out) {
    for (int32_t h = 0; h < P->h; h++) {
        const int32_t ni = T->rc[h];
        const float *wr = wf + T->rf[h] * P->kw, *gr = gc + T->r0[h] * P->wo;
        for (int32_t x = 0; x < P->w; x++) {
            const int32_t nj = T->cc[x];
            const float *wp = wr + T->cf[x], *gp = gr + T->c0[x];
            float acc = 0.0f;
            for (int32_t a = 0; a < ni; a++, wp += T->si, gp -= T->sg) {
                const float *wq = wp, *gq = gp;
                for (int32_t b = 0; b < nj; b++, wq += T->sj, gq -= T->sq) {
                    const float pr = *wq * *gq;
                    acc = acc + pr;
                }
            }
            out[h * P->w + x] = acc;
        }
    }
}

/* Four channels at once from interleaved copies (wi[t * 4 + k]: tap t of channel k, gi[q * 4 + k]:
 * gradient pixel q): each tap step is 4 weight and 4 gradient loads for 4 sums; outk: channel
 * k's plane (H*W) */
static inline void et_dwg_plane4(const et_qconv_p *P, const et_dwg_taps *T, const float *wi, const float *gi,
                                 float *out0, float *out1, float *out2, float *out3) {
    const int32_t si = 4 * T->si, sg = 4 * T->sg, sj = 4 * T->sj, sq = 4 * T->sq;
    for (int32_t h = 0; h < P->h; h++) {
        const int32_t ni = T->rc[h];
        const float *wr = wi + 4 * (T->rf[h] * P->kw), *gr = gi + 4 * (T->r0[h] * P->wo);
        for (int32_t x = 0; x < P->w; x++) {
            const int32_t nj = T->cc[x];
            const float *wp = wr + 4 * T->cf[x], *gp = gr + 4 * T->c0[x];
            float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
            for (int32_t a = 0; a < ni; a++, wp += si, gp -= sg) {
                const float *wq = wp, *gq = gp;
                for (int32_t b = 0; b < nj; b++, wq += sj, gq -= sq) {
                    const float p0 = wq[0] * gq[0], p1 = wq[1] * gq[1], p2 = wq[2] * gq[2], p3 = wq[3] * gq[3];
                    a0 = a0 + p0;
                    a1 = a1 + p1;
                    a2 = a2 + p2;
                    a3 = a3 + p3;
                }
            }
            const int32_t at = h * P->w + x;
            out0[at] = a0;
            out1[at] = a1;
            out2[at] = a2;
            out3[at] = a3;
        }
    }
}

#if defined(ET_INT8_HOST_PW)
/* The host's form (stride 1 or 2, no dilation), per (image, channel): the gradient plane copied into
 * a plane with a margin of kh rows and kw columns of zeros around it (WG = wo + 2 kw columns); then
 * for each phase (a, b) of gx (rows s u + a, columns s v + b), the taps (i, j) that reach it, in
 * ascending (i, j), each one long loop over the phase's rows as one flat row of WG columns: phase
 * element (u, v) adds wf[i, j] * g[u + di, v + dj], di = (a + ph - i) / s. A tap whose gradient
 * element lies in the margin adds w * 0 = +-0, which leaves every sum as it is (a sum started from
 * +0 is never -0), so each element is the gather form's sum: the same products in the same order. */
#define ET_DWG_HOST_BUF 8192 /* floats of the padded plane, and of a phase's sums */
static inline int et_dwg_host_ok(const et_qconv_p *P) {
    const int32_t wg = P->wo + 2 * P->kw;
    return P->sh == P->sw && (P->sh == 1 || P->sh == 2) && P->dh == 1 && P->dw == 1 && P->kh <= 7 && P->kw <= 7 &&
           (P->ho + 2 * P->kh + 1) * wg <= ET_DWG_HOST_BUF && ((P->h + 1) / P->sh + 1) * wg <= ET_DWG_HOST_BUF;
}

static void et_qconv_dw_grad_input_host(const et_qconv_p *P, const float *g, const et_w8 *w, const et_fscale *S,
                                        float *gx) {
    const int32_t s = P->sh, khkw = P->kh * P->kw, hw = P->h * P->w, howo = P->ho * P->wo, wg = P->wo + 2 * P->kw;
    const int32_t rows = P->ho + 2 * P->kh + 1;
    /* the host's threads: one (image, channel) per iteration (gx may be g: each reads its own plane first) */
    ET_PARALLEL_FOR2((double)P->n * P->c * hw * khkw)
    for (int32_t n = 0; n < P->n; n++)
        for (int32_t c = 0; c < P->c; c++) {
            float gp[ET_DWG_HOST_BUF], acc[ET_DWG_HOST_BUF], wf[ET_DWG_TAPS];
            const int8_t *taps = et_w8_taps(w, c, 0, 1, khkw);
            const float sc = et_fscale_at(S, c);
            for (int32_t t = 0; t < khkw; t++) wf[t] = (float)taps[t] * sc;
            const float *gc = g + (n * P->c + c) * howo;
            for (int32_t q = 0; q < rows * wg; q++) gp[q] = 0.0f;
            for (int32_t r = 0; r < P->ho; r++) memcpy(gp + (r + P->kh) * wg + P->kw, gc + r * P->wo, sizeof(float) * (size_t)P->wo);
            float *gxc = gx + (n * P->c + c) * hw;
            for (int32_t a = 0; a < s; a++)
                for (int32_t b = 0; b < s; b++) {
                    const int32_t hu = (P->h - a + s - 1) / s, wu = (P->w - b + s - 1) / s, m = hu * wg;
                    if (hu <= 0 || wu <= 0) continue;
                    for (int32_t q = 0; q < m; q++) acc[q] = 0.0f;
                    for (int32_t i = 0; i < P->kh; i++) {
                        if ((a + P->ph - i) % s) continue;
                        const int32_t di = (a + P->ph - i) / s;
                        for (int32_t j = 0; j < P->kw; j++) {
                            if ((b + P->pw - j) % s) continue;
                            const float wv = wf[i * P->kw + j];
                            const float *src = gp + (di + P->kh) * wg + (b + P->pw - j) / s + P->kw;
                            for (int32_t q = 0; q < m; q++) {
                                const float pr = wv * src[q];
                                acc[q] = acc[q] + pr;
                            }
                        }
                    }
                    for (int32_t u = 0; u < hu; u++) {
                        float *dst = gxc + (s * u + a) * P->w + b;
                        const float *au = acc + u * wg;
                        if (s == 1)
                            memcpy(dst, au, sizeof(float) * (size_t)wu);
                        else
                            for (int32_t v = 0; v < wu; v++) dst[2 * v] = au[v];
                    }
                }
        }
}
#endif

/* qconv2d_dw_grad_input: gx may be g's own storage (same shape); per element the
 * contributions add in (i, j) order, from 0; `plane` (H*W floats) ends holding the last
 * channel's gradient. Gather form: each element sums exactly its in-range taps in FPU
 * registers. Along each axis those taps are an arithmetic progression (found once per call
 * for every row and column), so the inner loop has no bounds checks; the scatter form spent
 * most of its time on per-tap ranges for planes of 4x4 or 8x8. Channels go 4 at a time
 * through interleaved stack copies of their taps and gradient planes (up to ET_DWG_PIX
 * pixels), read before any of their gx is written; the rest one at a time through `plane`. */
#define ET_DWG_PIX 64
__attribute__((noinline, unused)) static void et_qconv_dw_grad_input_fs(const et_qconv_p *P, const float *g,
                                                                        const et_w8 *w, const et_fscale *S,
                                                                        float *gx, float *ET_RESTRICT plane) {
    const int32_t khkw = P->kh * P->kw, hw = P->h * P->w, howo = P->ho * P->wo;
#if defined(ET_INT8_HOST_PW)
    if (et_dwg_host_ok(P)) {
        et_qconv_dw_grad_input_host(P, g, w, S, gx);
        memcpy(plane, gx + (P->n * P->c - 1) * hw, sizeof(float) * (size_t)hw);
        return;
    }
#endif
    if (ET_DWG_SCATTER && (P->h > ET_DWG_MAX || P->w > ET_DWG_MAX || khkw > ET_DWG_TAPS || P->ho > 127 || P->wo > 127)) {
        et_qconv_dw_grad_input_scatter(P, g, w, S, gx, plane);
        return;
    }
    et_dwg_taps T;
    et_dwg_setup(P, &T);
    const int32_t quads = howo <= ET_DWG_PIX ? P->c / 4 : 0; /* channels 4 q .. 4 q + 3 together */
    for (int32_t n = 0; n < P->n; n++) {
        /* the host's threads: the quads, each with its own copies */
        ET_PARALLEL_FOR((double)quads * 4 * howo * khkw)
        for (int32_t q4 = 0; q4 < quads; q4++) {
            const int32_t c = 4 * q4;
            float *gxc = gx + (n * P->c + c) * hw;
            const float *gc = g + (n * P->c + c) * howo;
            float wf[4 * ET_DWG_TAPS], gi[4 * ET_DWG_PIX];
            for (int32_t k = 0; k < 4; k++) {
                const int8_t *taps = et_w8_taps(w, c + k, 0, 1, khkw);
                const float sc = et_fscale_at(S, c + k);
                for (int32_t t = 0; t < khkw; t++) wf[t * 4 + k] = (float)taps[t] * sc;
                for (int32_t q = 0; q < howo; q++) gi[q * 4 + k] = gc[k * howo + q];
            }
            et_dwg_plane4(P, &T, wf, gi, gxc, gxc + hw, gxc + 2 * hw, gxc + 3 * hw);
        }
        /* the other channels one at a time through a plane: the thread's own copy when split */
        ET_PARALLEL_FOR((double)(P->c - 4 * quads) * howo * khkw)
        for (int32_t c = 4 * quads; c < P->c; c++) {
            ET_THREAD_ROW(float, pl, ET_DWG_MAX * ET_DWG_MAX, plane)
            float wf[ET_DWG_TAPS];
            const int8_t *taps = et_w8_taps(w, c, 0, 1, khkw);
            const float sc = et_fscale_at(S, c);
            for (int32_t t = 0; t < khkw; t++) wf[t] = (float)taps[t] * sc;
            et_dwg_plane1(P, &T, wf, g + (n * P->c + c) * howo, pl);
            memcpy(gx + (n * P->c + c) * hw, pl, sizeof(float) * (size_t)hw);
        }
    }
    memcpy(plane, gx + (P->n * P->c - 1) * hw, sizeof(float) * (size_t)hw);
}

/* the two input gradients of a weight stored whole (kernels/int8_params.py's weight_arg): the et_w8
 * built here, not at each of the graphs' calls */
__attribute__((noinline, unused)) ET_SMALL_ATTR static void et_qconv_grad_input_fs_w(const et_qconv_p *P,
                                                                                     const float *g, const int8_t *w,
                                                                                     const et_fscale *S, float *gx) {
    const et_w8 W = {w, 0, 0, 0, 0, 0, 0};
    et_qconv_grad_input_fs(P, g, &W, S, gx);
}
__attribute__((noinline, unused)) ET_SMALL_ATTR static void et_qconv_dw_grad_input_fs_w(const et_qconv_p *P,
                                                                                        const float *g, const int8_t *w,
                                                                                        const et_fscale *S, float *gx,
                                                                                        float *plane) {
    const et_w8 W = {w, 0, 0, 0, 0, 0, 0};
    et_qconv_dw_grad_input_fs(P, g, &W, S, gx, plane);
}

/* output rows [lo, hi) whose tap row i reads an in-range input row (et_col_range's rows) */
static inline void et_row_range(const et_qconv_p *P, int32_t i, int32_t *lo, int32_t *hi) {
    et_tap_range(i * P->dh - P->ph, P->sh, P->h, P->ho, lo, hi);
}

/* One tap (i, j) of a weight-gradient row: the gradient row o (image stride gn, row stride
 * gr), the tap's input of the group's channel 0 (image, row, column, channel strides), the
 * images, the in-range rows [r0, r1) and columns [q0, q1), and x_zero. */
typedef struct {
    const float *g;
    const int8_t *x;
    int32_t gn, gr, xn, xr, xs, cs, nimg, r0, r1, q0, q1, xz;
} et_gw_tap;

/* (float)x - x_zero for every int8 level x, indexed by x's byte: one load instead of a move to
 * the FPU, a conversion and a subtract per element (the same float: both are small integers,
 * so the subtraction is exact). Built when a call's x_zero differs from the last one's (once per
 * layer: 1 KB of static storage, beside the arena). */
static float et_gw_levels[256];
static int32_t et_gw_levels_zero = INT32_MIN;
static inline const float *et_gw_levels_of(int32_t x_zero) {
    if (et_gw_levels_zero != x_zero) {
        for (int32_t u = 0; u < 256; u++) et_gw_levels[u] = (float)(int8_t)(uint8_t)u - (float)x_zero;
        et_gw_levels_zero = x_zero;
    }
    return et_gw_levels;
}
/* before a layer's weight-gradient rows run on the host's threads: its table built by one thread,
 * which the rows then only read */
#ifdef _OPENMP
#define ET_GW_ROWS_PREPARE(x_zero) ((void)et_gw_levels_of(x_zero))
#else
#define ET_GW_ROWS_PREPARE(x_zero) ((void)0)
#endif

/* out[c * os] = scale * the sequential float32 sum over images, rows, columns of
 * g * (x - x_zero) for the tap's cg channels, from 0. ET_GW_CB channels at a time: each
 * gradient load serves four sums and each x element is read as its float once
 * (et_gw_levels_of). Out of line: the inner loop gets the registers to itself. */
#define ET_GW_CB 4
__attribute__((noinline)) static void et_gw_tap_sums(const et_gw_tap *T, int32_t cg, float scale, float *out,
                                                     int32_t os) {
    const float *ET_RESTRICT lv = et_gw_levels_of(T->xz);
    const int32_t xs = T->xs;
    for (int32_t c = 0; c < cg;) {
        const int8_t *xc = T->x + c * T->cs;
#if !defined(__ARM_NEON)
        if (cg - c >= 2 * ET_GW_CB) { /* 8 channels: each gradient load serves eight sums */
            float a[2 * ET_GW_CB] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
            const int32_t cs = T->cs;
            for (int32_t n = 0; n < T->nimg; n++)
                for (int32_t r = T->r0; r < T->r1; r++) {
                    const float *gp = T->g + n * T->gn + r * T->gr + T->q0, *ge = gp + (T->q1 - T->q0);
                    const int8_t *x0 = xc + n * T->xn + r * T->xr + T->q0 * xs, *x4 = x0 + 4 * cs;
                    for (; gp < ge; gp++, x0 += xs, x4 += xs) {
                        const float gv = *gp;
                        const float f0 = lv[(uint8_t)x0[0]], f1 = lv[(uint8_t)x0[cs]];
                        const float f2 = lv[(uint8_t)x0[2 * cs]], f3 = lv[(uint8_t)x0[3 * cs]];
                        const float f4 = lv[(uint8_t)x4[0]], f5 = lv[(uint8_t)x4[cs]];
                        const float f6 = lv[(uint8_t)x4[2 * cs]], f7 = lv[(uint8_t)x4[3 * cs]];
                        const float p0 = gv * f0, p1 = gv * f1, p2 = gv * f2, p3 = gv * f3;
                        const float p4 = gv * f4, p5 = gv * f5, p6 = gv * f6, p7 = gv * f7;
                        a[0] = a[0] + p0;
                        a[1] = a[1] + p1;
                        a[2] = a[2] + p2;
                        a[3] = a[3] + p3;
                        a[4] = a[4] + p4;
                        a[5] = a[5] + p5;
                        a[6] = a[6] + p6;
                        a[7] = a[7] + p7;
                    }
                }
            for (int32_t k = 0; k < 2 * ET_GW_CB; k++) out[(c + k) * os] = a[k] * scale;
            c += 2 * ET_GW_CB;
            continue;
        }
#endif
        if (cg - c >= ET_GW_CB) {
            float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
#if defined(__ARM_NEON)
            /* the four channels' sums in the lanes of one vector: lane k is a_k, the same
             * sequence of products and adds */
            float32x4_t av = vdupq_n_f32(0.0f);
            for (int32_t n = 0; n < T->nimg; n++)
                for (int32_t r = T->r0; r < T->r1; r++) {
                    const float *gp = T->g + n * T->gn + r * T->gr + T->q0, *ge = gp + (T->q1 - T->q0);
                    const int8_t *x0 = xc + n * T->xn + r * T->xr + T->q0 * xs;
                    const int32_t cs = T->cs;
                    for (; gp < ge; gp++, x0 += xs) {
                        float32x4_t f = vdupq_n_f32(lv[(uint8_t)x0[0]]);
                        f = vsetq_lane_f32(lv[(uint8_t)x0[cs]], f, 1);
                        f = vsetq_lane_f32(lv[(uint8_t)x0[2 * cs]], f, 2);
                        f = vsetq_lane_f32(lv[(uint8_t)x0[3 * cs]], f, 3);
                        av = vaddq_f32(av, vmulq_f32(vdupq_n_f32(*gp), f));
                    }
                }
            a0 = vgetq_lane_f32(av, 0), a1 = vgetq_lane_f32(av, 1), a2 = vgetq_lane_f32(av, 2);
            a3 = vgetq_lane_f32(av, 3);
#else
            for (int32_t n = 0; n < T->nimg; n++)
                for (int32_t r = T->r0; r < T->r1; r++) {
                    const float *gp = T->g + n * T->gn + r * T->gr + T->q0, *ge = gp + (T->q1 - T->q0);
                    const int8_t *x0 = xc + n * T->xn + r * T->xr + T->q0 * xs;
                    const int8_t *x1 = x0 + T->cs, *x2 = x1 + T->cs, *x3 = x2 + T->cs;
                    for (; gp < ge; gp++, x0 += xs, x1 += xs, x2 += xs, x3 += xs) {
                        const float gv = *gp;
                        const float f0 = lv[(uint8_t)*x0], f1 = lv[(uint8_t)*x1], f2 = lv[(uint8_t)*x2];
                        const float f3 = lv[(uint8_t)*x3];
                        const float p0 = gv * f0, p1 = gv * f1, p2 = gv * f2, p3 = gv * f3;
                        a0 = a0 + p0;
                        a1 = a1 + p1;
                        a2 = a2 + p2;
                        a3 = a3 + p3;
                    }
                }
#endif
            out[c * os] = a0 * scale;
            out[(c + 1) * os] = a1 * scale;
            out[(c + 2) * os] = a2 * scale;
            out[(c + 3) * os] = a3 * scale;
            c += ET_GW_CB;
        } else {
            float acc = 0.0f;
            for (int32_t n = 0; n < T->nimg; n++)
                for (int32_t r = T->r0; r < T->r1; r++) {
                    const float *gp = T->g + n * T->gn + r * T->gr + T->q0, *ge = gp + (T->q1 - T->q0);
                    const int8_t *x0 = xc + n * T->xn + r * T->xr + T->q0 * xs;
                    for (; gp < ge; gp++, x0 += xs) {
                        const float p = *gp * lv[(uint8_t)*x0];
                        acc = acc + p;
                    }
                }
            out[c * os] = acc * scale;
            c++;
        }
    }
}

/* Up to ET_GW_RB rows of a dense layer's weight gradient at once: the rows read the same x,
 * so each x element's float (et_gw_levels_of) serves every row's sums. out[ro[r] + c * os] =
 * scale[r] * the sequential float32 sum over images, rows, columns of g_r * (x - x_zero), from
 * 0, for the tap's cg channels; g_r = T->g + go[r] (row r's gradient plane). ET_GW_CB
 * channels x nr rows of sums in FPU registers (16 at most), each in the one-row order. */
#define ET_GW_RB 4
/* the tap's in-range pixels in the sums' order (images, rows, columns): gp row 0's gradient,
 * x0 the channel's input at xc, for `body` */
#define ET_GW_PIXELS(T, xc, ...)                                                                       \
    for (int32_t n = 0; n < (T)->nimg; n++)                                                            \
        for (int32_t r = (T)->r0; r < (T)->r1; r++) {                                                  \
            const float *gp = (T)->g + n * (T)->gn + r * (T)->gr + (T)->q0, *ge = gp + ((T)->q1 - (T)->q0); \
            const int8_t *x0 = (xc) + n * (T)->xn + r * (T)->xr + (T)->q0 * (T)->xs;                     \
            for (; gp < ge; gp++, x0 += (T)->xs) { __VA_ARGS__ }                                       \
        }
static inline __attribute__((always_inline)) void et_gw_tap_sums_rows_k(const et_gw_tap *T, int32_t cg, const int32_t *go,
                                                                       const float *scale, float *out, int32_t os,
                                                                       const int32_t *ro, const int nr) {
    const float *ET_RESTRICT lv = et_gw_levels_of(T->xz);
    const int32_t cs = T->cs;
    int32_t c = 0;
    for (; c + ET_GW_CB <= cg; c += ET_GW_CB) {
        float a[ET_GW_RB][ET_GW_CB] = {{0.0f}};
        ET_GW_PIXELS(T, T->x + c * cs, {
            const float f0 = lv[(uint8_t)x0[0]], f1 = lv[(uint8_t)x0[cs]];
            const float f2 = lv[(uint8_t)x0[2 * cs]], f3 = lv[(uint8_t)x0[3 * cs]];
            _Pragma("GCC unroll 4") for (int32_t j = 0; j < nr; j++) {
                const float gv = gp[go[j]];
                const float p0 = gv * f0, p1 = gv * f1, p2 = gv * f2, p3 = gv * f3;
                a[j][0] = a[j][0] + p0;
                a[j][1] = a[j][1] + p1;
                a[j][2] = a[j][2] + p2;
                a[j][3] = a[j][3] + p3;
            }
        });
#pragma GCC unroll 4
        for (int32_t j = 0; j < nr; j++)
#pragma GCC unroll 4
            for (int32_t k = 0; k < ET_GW_CB; k++) out[ro[j] + (c + k) * os] = a[j][k] * scale[j];
    }
    for (; c < cg; c++) {
        float a[ET_GW_RB] = {0.0f};
        ET_GW_PIXELS(T, T->x + c * cs, {
            const float f = lv[(uint8_t)*x0];
            _Pragma("GCC unroll 4") for (int32_t j = 0; j < nr; j++) {
                const float p = gp[go[j]] * f;
                a[j] = a[j] + p;
            }
        });
        for (int32_t j = 0; j < nr; j++) out[ro[j] + c * os] = a[j] * scale[j];
    }
}

/* out of line, once for 4 rows and once for 2: the loops get the registers to themselves. Three
 * rows take the 4-row loop with the third row twice (its gradient, scale and output): the fourth
 * row's sums are the third's, the same products in the same order, and write the same values to
 * the same places, so the rows' results are those of a 3-row loop (which cost a third copy of
 * the loops' code). */
__attribute__((noinline)) static void et_gw_tap_sums_rows(const et_gw_tap *T, int32_t cg, const int32_t *go, int32_t nr,
                                                          const float *scale, float *out, int32_t os, const int32_t *ro) {
    if (nr == 2) {
        et_gw_tap_sums_rows_k(T, cg, go, scale, out, os, ro, 2);
        return;
    }
    const int32_t go4[ET_GW_RB] = {go[0], go[1], go[2], go[nr - 1]}, ro4[ET_GW_RB] = {ro[0], ro[1], ro[2], ro[nr - 1]};
    const float scale4[ET_GW_RB] = {scale[0], scale[1], scale[2], scale[nr - 1]};
    et_gw_tap_sums_rows_k(T, cg, go4, scale4, out, os, ro4, 4);
}

#if defined(ET_INT8_HOST_PW)
/* The host: a flat 1x1 dense layer's rows (et_gw_tap_sums_rows' sums, the same products added in
 * the same order) with ET_GW_HCB input channels in the lanes of a vector. x lies channel by
 * channel, so per image the 16 channels' next 16 bytes are loaded and transposed in registers
 * (four stages of interleaves: afterwards vector v holds the bytes of pixel bitrev4(v)); each
 * pixel's bytes become floats, (float)x - x_zero (exact: small integers, et_gw_levels' values),
 * and every row's sums take their product, a multiply and an add lane by lane. A channel's sum
 * lives in one lane from the first pixel to the last (images, then pixels in order). The last
 * block of fewer than 16 channels reads zero bytes in its other lanes and stores only its own. */
#define ET_GW_HCB 16
/* the interleaves of one stage: vectors i and i + st (i's bit st clear), in units of `sz` bytes
 * (et_v16m: et_int8.h's shuffle masks) */
#define ET_GW_UNPAREN(...) __VA_ARGS__
#define ET_GW_ZIP(ST, LO, HI)                                                           \
    static inline __attribute__((always_inline)) void et_gw_zip##ST(et_v16b *v) {       \
        for (int32_t i = 0; i < 16; i++) {                                              \
            if (i & ST) continue;                                                       \
            const et_v16b a = v[i], b = v[i + ST];                                      \
            v[i] = __builtin_shuffle(a, b, (et_v16m){ET_GW_UNPAREN LO});                \
            v[i + ST] = __builtin_shuffle(a, b, (et_v16m){ET_GW_UNPAREN HI});           \
        }                                                                               \
    }
ET_GW_ZIP(1, (0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23),
          (8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31))
ET_GW_ZIP(2, (0, 1, 16, 17, 2, 3, 18, 19, 4, 5, 20, 21, 6, 7, 22, 23),
          (8, 9, 24, 25, 10, 11, 26, 27, 12, 13, 28, 29, 14, 15, 30, 31))
ET_GW_ZIP(4, (0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23),
          (8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31))
ET_GW_ZIP(8, (0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23),
          (8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31))
#undef ET_GW_ZIP
static inline __attribute__((always_inline)) void et_gw_bytes_t16(et_v16b *v) {
    et_gw_zip1(v);
    et_gw_zip2(v);
    et_gw_zip4(v);
    et_gw_zip8(v);
}

static inline __attribute__((always_inline)) void et_gw_flat_host_k(const et_gw_tap *T, int32_t cg, const int32_t *go,
                                                                   const float *scale, float *out, int32_t os,
                                                                   const int32_t *ro, const int nr) {
    static const uint8_t rev[16] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};
    const int32_t cs = T->cs, hw = T->q1 - T->q0;
    const float xz = (float)T->xz;
    for (int32_t c = 0; c < cg; c += ET_GW_HCB) {
        const int32_t nc = cg - c < ET_GW_HCB ? cg - c : ET_GW_HCB;
        et_gi_v16 a[ET_GW_RB];
#pragma GCC unroll 4
        for (int32_t j = 0; j < nr; j++) a[j] = (et_gi_v16){0.0f};
        for (int32_t n = 0; n < T->nimg; n++) {
            const int8_t *xb = T->x + c * cs + n * T->xn + T->q0;
            const float *gb = T->g + n * T->gn + T->q0;
            int32_t q = 0;
            for (; q + 16 <= hw; q += 16) {
                et_v16b v[16];
#pragma GCC unroll 16
                for (int32_t k = 0; k < 16; k++) {
                    v[k] = (et_v16b){0};
                    if (k < nc) memcpy(&v[k], xb + k * cs + q, 16);
                }
                et_gw_bytes_t16(v);
#pragma GCC unroll 16
                for (int32_t p = 0; p < 16; p++) {
                    et_v16i w;
                    et_widen16(&w, v[rev[p]]);
                    const et_gi_v16 f = __builtin_convertvector(w, et_gi_v16) - xz;
#pragma GCC unroll 4
                    for (int32_t j = 0; j < nr; j++) {
                        const et_gi_v16 pr = gb[go[j] + q + p] * f;
                        a[j] = a[j] + pr;
                    }
                }
            }
            for (; q < hw; q++) { /* the last pixels of a plane of other than 16k: a byte at a time */
                et_v16b b = {0};
                for (int32_t k = 0; k < nc; k++) b[k] = xb[k * cs + q];
                et_v16i w;
                et_widen16(&w, b);
                const et_gi_v16 f = __builtin_convertvector(w, et_gi_v16) - xz;
#pragma GCC unroll 4
                for (int32_t j = 0; j < nr; j++) {
                    const et_gi_v16 pr = gb[go[j] + q] * f;
                    a[j] = a[j] + pr;
                }
            }
        }
#pragma GCC unroll 4
        for (int32_t j = 0; j < nr; j++)
            for (int32_t k = 0; k < nc; k++) out[ro[j] + (c + k) * os] = a[j][k] * scale[j];
    }
}

/* out of line, for 1, 2 and 4 rows; three rows take the 4-row form with the third row twice (as
 * et_gw_tap_sums_rows) */
__attribute__((noinline)) static void et_gw_flat_host(const et_gw_tap *T, int32_t cg, const int32_t *go, int32_t nr,
                                                      const float *scale, float *out, int32_t os, const int32_t *ro) {
    if (nr == 1) {
        et_gw_flat_host_k(T, cg, go, scale, out, os, ro, 1);
    } else if (nr == 2) {
        et_gw_flat_host_k(T, cg, go, scale, out, os, ro, 2);
    } else {
        const int32_t go4[ET_GW_RB] = {go[0], go[1], go[2], go[nr - 1]};
        const int32_t ro4[ET_GW_RB] = {ro[0], ro[1], ro[2], ro[nr - 1]};
        const float scale4[ET_GW_RB] = {scale[0], scale[1], scale[2], scale[nr - 1]};
        et_gw_flat_host_k(T, cg, go4, scale4, out, os, ro4, 4);
    }
}
#endif

#if defined(ET_INT8_HOST_PW)
/* The host: the weight-gradient rows of a kxk layer (depthwise, grouped or dense; a block of up to
 * ET_GW_RB rows of a dense layer), every tap at once. Per input channel of the group, each image's
 * plane becomes floats (x - x_zero) with zeros in the padding (the reference's own padded plane);
 * then per output pixel, in order (images, rows, columns), each row's gradient times tap row i's kw
 * inputs (one vector load: lane j is tap (i, j)) is added to that row's vector of tap row i's sums.
 * So each element's sum takes every term of the reference's sum in its order, the padding's zero
 * terms included, a multiply and an add, each rounded; the taps' (and a 3x3 block's rows') sums run
 * side by side instead of one after another. Kernels up to ET_GW_KX_K x ET_GW_KX_K, no dilation,
 * padded planes up to ET_GW_KX_PLANE floats (128 KB on the stack; others take the tap loops below). */
#define ET_GW_KX_K 8
#define ET_GW_KX_PLANE 32768
typedef float et_gw_v8 __attribute__((vector_size(32), aligned(4)));
static inline int et_gw_kx_host_ok(const et_qconv_p *P) {
    return P->kh <= ET_GW_KX_K && P->kw <= ET_GW_KX_K && P->dh == 1 && P->dw == 1 &&
           (P->h + 2 * P->ph) * (P->w + 2 * P->pw) <= ET_GW_KX_PLANE;
}
/* one output row of nr gradient rows (gr + go[r]): pixel q's gradient times tap row i's inputs
 * (xr + i * rs + q * sw) into a[r][i], the sums in registers for the row (locals: gcc kept an array
 * element in memory across the pixels) */
static inline __attribute__((always_inline)) void et_gw_kx_row(et_gw_v8 (*a)[ET_GW_KX_K], const float *gr,
                                                               const int32_t *go, const int nr, const float *xr,
                                                               int32_t wo, int32_t sw, int32_t rs, const int kh) {
    et_gw_v8 s[ET_GW_RB][ET_GW_KX_K] = {{{0.0f}}}; /* (only [nr][kh] are used) */
#pragma GCC unroll 4
    for (int32_t r = 0; r < nr; r++)
#pragma GCC unroll 8
        for (int32_t i = 0; i < kh; i++) s[r][i] = a[r][i];
    for (int32_t q = 0; q < wo; q++) {
        const float *xp = xr + q * sw;
#pragma GCC unroll 4
        for (int32_t r = 0; r < nr; r++) {
            const float gv = gr[go[r] + q];
#pragma GCC unroll 8
            for (int32_t i = 0; i < kh; i++) {
                const et_gw_v8 pr = gv * *(const et_gw_v8 *)(xp + i * rs);
                s[r][i] = s[r][i] + pr;
            }
        }
    }
#pragma GCC unroll 4
    for (int32_t r = 0; r < nr; r++)
#pragma GCC unroll 8
        for (int32_t i = 0; i < kh; i++) a[r][i] = s[r][i];
}

/* rows sel[0] + go[r] / howo (r < nr) of the weight gradient: out[ro[r] + c * kh * kw + i * kw + j]
 * = scale[r] * the sum of tap (i, j) of the group's input channel c, xg its channel 0. Returns 0, having
 * done nothing, for a layer it does not take (et_gw_kx_host_ok: tested here, beside the plane's
 * accesses, so that the compiler sees their bounds in every copy it makes). */
__attribute__((noinline)) static int et_gw_kx_host(const et_qconv_p *P, const int8_t *xg, const float *g,
                                                   const int32_t *go, int32_t nr, const float *scale,
                                                   float *ET_RESTRICT out, const int32_t *ro) {
    if (!et_gw_kx_host_ok(P)) return 0;
    const int32_t hp = P->h + 2 * P->ph, wp = P->w + 2 * P->pw, hw = P->h * P->w, howo = P->ho * P->wo;
    const int32_t kh = P->kh, kw = P->kw, rs = wp, sw = P->sw;
    const float xz = (float)P->x_zero;
    float plane[ET_GW_KX_PLANE + ET_GW_KX_K]; /* the last vector load of a row may read 7 floats past it */
    /* the padding (rows and columns) and the slack, zeroed once: the planes' inputs overwrite the rest */
    for (int32_t i = hp * wp; i < hp * wp + ET_GW_KX_K; i++) plane[i] = 0.0f;
    for (int32_t r = 0; r < P->ph; r++)
        for (int32_t q = 0; q < wp; q++) plane[r * wp + q] = plane[(hp - 1 - r) * wp + q] = 0.0f;
    for (int32_t r = P->ph; r < hp - P->ph; r++)
        for (int32_t q = 0; q < P->pw; q++) plane[r * wp + q] = plane[r * wp + wp - 1 - q] = 0.0f;
    for (int32_t c = 0; c < P->cg; c++) {
        et_gw_v8 a[ET_GW_RB][ET_GW_KX_K] = {{{0.0f}}};
        for (int32_t n = 0; n < P->n; n++) {
            const int8_t *xn = xg + (n * P->c + c) * hw;
            for (int32_t r = 0; r < P->h; r++) {
                float *row = plane + (r + P->ph) * wp;
                const int8_t *xr = xn + r * P->w;
                int32_t q = 0;
                for (; q + 16 <= P->w; q += 16) {
                    et_v16i v;
                    et_load16(&v, xr + q);
                    const et_gi_v16 f = __builtin_convertvector(v, et_gi_v16) - xz;
                    memcpy(row + P->pw + q, &f, sizeof f);
                }
                for (; q < P->w; q++) row[P->pw + q] = (float)xr[q] - xz;
            }
            const float *gn = g + n * P->o * howo;
            for (int32_t ho = 0; ho < P->ho; ho++) {
                const float *gr = gn + ho * P->wo, *xr = plane + ho * P->sh * wp;
                if (kh == 3 && nr == 4) et_gw_kx_row(a, gr, go, 4, xr, P->wo, sw, rs, 3);
                else if (kh == 3 && nr == 2) et_gw_kx_row(a, gr, go, 2, xr, P->wo, sw, rs, 3);
                else
                    for (int32_t r = 0; r < nr; r++) {
                        if (kh == 3) et_gw_kx_row(a + r, gr, go + r, 1, xr, P->wo, sw, rs, 3);
                        else if (kh == 5) et_gw_kx_row(a + r, gr, go + r, 1, xr, P->wo, sw, rs, 5);
                        else if (kh == 7) et_gw_kx_row(a + r, gr, go + r, 1, xr, P->wo, sw, rs, 7);
                        else et_gw_kx_row(a + r, gr, go + r, 1, xr, P->wo, sw, rs, kh);
                    }
            }
        }
        for (int32_t r = 0; r < nr; r++)
            for (int32_t i = 0; i < kh; i++)
                for (int32_t j = 0; j < kw; j++) out[ro[r] + (c * kh + i) * kw + j] = a[r][i][j] * scale[r];
    }
    return 1;
}
#endif

/* whether gradient row g (n images image_stride apart, hw pixels each) is zero everywhere (-0
 * counts as zero) */
static inline int et_gw_row_zero(const float *g, int32_t n, int32_t image_stride, int32_t hw) {
    for (int32_t b = 0; b < n; b++, g += image_stride)
        for (int32_t q = 0; q < hw; q++) {
            uint32_t u;
            memcpy(&u, g + q, sizeof u);
            if (u << 1) return 0;
        }
    return 1;
}

/* Rows o0 .. o0 + nr - 1 of qconv2d_grad_weight into gw (row o0 + r at gw + r * CG*KH*KW floats):
 * each element is the sequential float32 sum over (n, ho, wo) of g * (x - x_zero), times S[o]
 * (the padded taps, zero terms, are skipped: adding +-0 to a sum that starts at +0 changes
 * nothing). x holds the layer input (C channels; group of o). A row whose gradient is zero at
 * every pixel (most rows of a layer before a clamp's mask, e.g. ReLU6's) sums only zero
 * terms: it is +0 * S[o] throughout, written without the sums. Per tap (i, j) the in-range
 * rows and columns are found once and one call sums every channel (et_gw_tap_sums), of up to
 * ET_GW_RB of the other rows at once for a dense layer (their x shared: et_gw_tap_sums_rows),
 * of one row otherwise. A 1x1 unpadded stride-1 kernel reads each plane as one row. */
static inline void et_qconv_grad_weight_rows(const et_qconv_p *P, const int8_t *x, const float *g, int32_t o0,
                                             int32_t nr, const et_fscale *S, float *ET_RESTRICT gw) {
    const int32_t opg = P->o / P->groups, hw = P->h * P->w, howo = P->ho * P->wo, khkw = P->kh * P->kw;
    const int32_t row_len = P->cg * khkw, block = P->groups == 1 ? ET_GW_RB : 1;
    const int flat = P->kh == 1 && P->kw == 1 && P->ph == 0 && P->pw == 0 && P->sh == 1 && P->sw == 1 &&
                     P->ho == P->h && P->wo == P->w;
    for (int32_t r = 0; r < nr;) {
        int32_t m = 0, sel[ET_GW_RB], go[ET_GW_RB], ro[ET_GW_RB];
        float scale[ET_GW_RB];
        for (; r < nr && m < block; r++) { /* the next rows with a nonzero gradient */
            const float s = et_fscale_at(S, o0 + r);
            if (et_gw_row_zero(g + (o0 + r) * howo, P->n, P->o * howo, howo)) {
                const float z = 0.0f * s;
                for (int32_t k = 0; k < row_len; k++) gw[r * row_len + k] = z;
                continue;
            }
            sel[m] = r;
            scale[m++] = s;
        }
        if (m == 0) continue;
        for (int32_t j = 0; j < m; j++) {
            go[j] = (sel[j] - sel[0]) * howo;
            ro[j] = (sel[j] - sel[0]) * row_len;
        }
        const int32_t o = o0 + sel[0];
        float *out = gw + sel[0] * row_len;
        et_gw_tap T = {g + o * howo, 0, P->o * howo, flat ? howo : P->wo, P->c * hw, flat ? hw : P->sh * P->w, P->sw,
                       hw, P->n, 0, 1, 0, howo, P->x_zero};
        const int8_t *xg = x + (o / opg) * P->cg * hw;
#if defined(ET_INT8_HOST_PW)
        if (!flat) { /* every tap at once, where et_gw_kx_host takes the layer */
            /* three rows: the 4-row form with the third row twice (as et_gw_tap_sums_rows) */
            const int32_t go4[ET_GW_RB] = {go[0], go[1], go[2], go[2]}, ro4[ET_GW_RB] = {ro[0], ro[1], ro[2], ro[2]};
            const float scale4[ET_GW_RB] = {scale[0], scale[1], scale[2], scale[2]};
            if (m == 3 ? et_gw_kx_host(P, xg, g + o * howo, go4, 4, scale4, out, ro4)
                       : et_gw_kx_host(P, xg, g + o * howo, go, m, scale, out, ro))
                continue;
        }
#endif
        for (int32_t i = 0; i < P->kh; i++) {
            if (!flat) et_row_range(P, i, &T.r0, &T.r1);
            for (int32_t j = 0; j < P->kw; j++) {
                if (!flat) et_col_range(P, j, &T.q0, &T.q1);
                T.x = xg + (i * P->dh - P->ph) * P->w + j * P->dw - P->pw; /* row r, column q: + r * xr + q * sw */
#if defined(ET_INT8_HOST_PW)
                if (flat && P->groups == 1) et_gw_flat_host(&T, P->cg, go, m, scale, out, khkw, ro);
                else
#endif
                if (m == 1) et_gw_tap_sums(&T, P->cg, scale[0], out + i * P->kw + j, khkw);
                else et_gw_tap_sums_rows(&T, P->cg, go, m, scale, out + i * P->kw + j, khkw, ro);
            }
        }
    }
}

/* row o of qconv2d_grad_weight into gw_row (CG*KH*KW floats) */
static inline void et_qconv_grad_weight_row(const et_qconv_p *P, const int8_t *x, const float *g, int32_t o,
                                            const et_fscale *S, float *ET_RESTRICT gw_row) {
    et_qconv_grad_weight_rows(P, x, g, o, 1, S, gw_row);
}

/* qconv2d_grad_bias: sequential float32 sum over (n, h, w), times scale[o] (out of line: one
 * copy for every layer) */
#define ET_GB_CH 8
__attribute__((noinline, unused)) static void et_qconv_grad_bias(const float *g, float *gb, int32_t n, int32_t o,
                                                                 int32_t hw, const et_fscale *scale) {
    int32_t k0 = 0;
#if defined(ET_INT8_HOST_PW)
    /* the host: ET_GB_CH channels an iteration, their sums side by side (each its own chain, in the
     * order below), the iterations on the threads */
    const int32_t blocks = o / ET_GB_CH;
    ET_PARALLEL_FOR((double)n * o * hw)
    for (int32_t q = 0; q < blocks; q++) {
        float acc[ET_GB_CH] = {0.0f};
        for (int32_t b = 0; b < n; b++) {
            const float *r = g + (b * o + q * ET_GB_CH) * hw;
            for (int32_t t = 0; t < hw; t++)
                for (int32_t j = 0; j < ET_GB_CH; j++) acc[j] = acc[j] + r[j * hw + t];
        }
        for (int32_t j = 0; j < ET_GB_CH; j++) gb[q * ET_GB_CH + j] = acc[j] * et_fscale_at(scale, q * ET_GB_CH + j);
    }
    k0 = blocks * ET_GB_CH;
#endif
    for (int32_t k = k0; k < o; k++) {
        float acc = 0.0f;
        for (int32_t b = 0; b < n; b++) {
            const float *r = g + (b * o + k) * hw;
            int32_t t = 0;
            for (; t + 4 <= hw; t += 4) { /* in order: the four adds one after another */
                acc = acc + r[t];
                acc = acc + r[t + 1];
                acc = acc + r[t + 2];
                acc = acc + r[t + 3];
            }
            for (; t < hw; t++) acc = acc + r[t];
        }
        gb[k] = acc * et_fscale_at(scale, k);
    }
}

#endif /* ET_INT8_GRAD_H */
