/* edgetrain int8 qconv2d forward on RISC-V's vector extension (where __riscv_vector is defined:
 * rv32imafcv, V's embedded integer subset Zve32x; any VLEN): the pointwise (1x1, stride 1, no
 * padding, ungrouped) and depthwise rows of et_qconv_rows, vectorised across output pixels, which
 * NCHW lays out side by side, and their requantization in vectors.
 *
 * gcc 12 has no RVV intrinsics (and its auto-vectorizer emits no RVV code), so the kernels are
 * inline assembly. gcc 12 neither allocates nor knows the vector registers (it rejects them as
 * clobbers): they and vl / vtype / vxrm are live only inside these functions, which call nothing
 * between the statements that share them (the C library is built without V).
 *
 * Pointwise: 4 output channels a block, a vector of pixels at a time: for each input channel its
 * pixels are loaded once (vle8, sign-extended to 16 bits) and multiplied by each channel's weight
 * into 32-bit accumulators (vwmacc.vx: the 16 x 8 -> 32-bit product of int8 values is exact).
 * Depthwise: the interior pixels of an output row (all taps in the image) a vector at a time, one
 * (strided, for stride 2) load and vwmacc.vx per tap; the border pixels take RV32's scalar
 * et_dwp_pixel. The zero point is taken out once per output channel as x_zero times the sum of
 * its weights (exact in int32), so the sums are the reference's; the requantization
 * (et_rvv_qput) is et_qrow_put's integers in lanes: vsadd (et_addsat32), vsmul at rounding mode
 * rnu ((acc * mult + 2^30) >> 31), the rounding right shift with ties away from zero, the zero
 * point and the clamp, narrowed to int8. */
#ifndef ET_INT8_RVV_H
#define ET_INT8_RVV_H
#include <stdint.h>
#include "et_int8_core.h" /* et_qconv_p, et_rows8, et_w8, et_qconv_row, et_qrow_put */
#include "et_int8_rv32.h" /* et_dwp_pixel, ET_DWP_MAX: the scalar border pixels */

#if defined(__riscv_vector)
/* the most pixels one vector holds here (AVL is capped to it, so any VLEN works: VLEN 128 gives
 * 16 at 32-bit elements, LMUL 4) */
#define ET_RVV_VL 32

/* et_qrow_put(r, q + i, acc[i]) for i < n: in vectors where the output is int8 and the shift a
 * right shift (the common case; a left shift, a float output or mult = INT32_MIN, where vsmul
 * saturates and the reference wraps, take the scalar et_qrow_put) */
__attribute__((noinline, unused)) static void et_rvv_qput(const et_qrow *r, int32_t q, const int32_t *acc, int32_t n) {
    if (!r->y || r->shift > 0 || r->mult == INT32_MIN) {
        for (int32_t i = 0; i < n; i++) et_qrow_put(r, q + i, acc[i]);
        return;
    }
    int8_t *y = r->y + q;
    while (n > 0) {
        int32_t vl;
        __asm__ volatile(".option push\n.option arch, +zicsr\ncsrwi vxrm, 0\n.option pop\n" /* rnu */
                         "vsetvli %[vl], %[n], e32, m4, ta, ma\n"
                         "vle32.v v8, (%[a])\n"
                         "vsadd.vx v8, v8, %[bias]\n"
                         "vsmul.vx v8, v8, %[mult]\n"   /* hi = (acc * mult + 2^30) >> 31 */
                         "vsra.vx v12, v8, %[right]\n"  /* hi >> right */
                         "vand.vx v16, v8, %[mask]\n"   /* hi & mask */
                         "vsra.vi v20, v8, 31\n"
                         "vrsub.vx v20, v20, %[half]\n" /* half + (hi < 0) */
                         "vmslt.vv v0, v20, v16\n"
                         "vadc.vim v12, v12, 0, v0\n"   /* + ((hi & mask) > half + (hi < 0)) */
                         "vadd.vx v12, v12, %[yz]\n"
                         "vmax.vx v12, v12, %[lo]\n"
                         "vmin.vx v12, v12, %[hi]\n"
                         "vsetvli zero, zero, e16, m2, ta, ma\n"
                         "vnsrl.wi v4, v12, 0\n"
                         "vsetvli zero, zero, e8, m1, ta, ma\n"
                         "vnsrl.wi v2, v4, 0\n"
                         "vse8.v v2, (%[y])\n"
                         : [vl] "=&r"(vl)
                         : [n] "r"(n < ET_RVV_VL ? n : ET_RVV_VL), [a] "r"(acc), [y] "r"(y), [bias] "r"(r->bias),
                           [mult] "r"(r->mult), [right] "r"(r->right), [mask] "r"(r->mask), [half] "r"(r->half),
                           [yz] "r"(r->y_zero), [lo] "r"(r->qmin), [hi] "r"(r->qmax)
                         : "memory");
        acc += vl;
        y += vl;
        n -= vl;
    }
}

/* ---- pointwise ---------------------------------------------------------------------------- */
/* whether et_rvv_pw_rows runs this conv (a weight split by input channel takes RV32's rows) */
static inline int et_rvv_pw_ok(const et_qconv_p *P, const et_w8 *w) {
    return P->kh == 1 && P->kw == 1 && P->sh == 1 && P->sw == 1 && P->ph == 0 && P->pw == 0 && P->groups == 1 &&
           P->wo == P->w && (!w->map || w->dim == 0);
}

/* s[k * ET_RVV_VL + i] = init[k] + sum_c w_k[c] * xp[c * cs + i] for i < vl (returned: the
 * vector length taken, at most avl) for the 4 weight rows w0..w3 over cg input channels */
static inline __attribute__((always_inline)) int32_t et_rvv_pw_sums(const int8_t *xp, int32_t cs, int32_t cg,
                                                                    const int8_t *w0, const int8_t *w1,
                                                                    const int8_t *w2, const int8_t *w3,
                                                                    const int32_t *init, int32_t avl, int32_t *s) {
    int32_t vl;
    __asm__ volatile("vsetvli %[vl], %[n], e32, m4, ta, ma\n"
                     "vmv.v.x v8, %[z0]\n"
                     "vmv.v.x v12, %[z1]\n"
                     "vmv.v.x v16, %[z2]\n"
                     "vmv.v.x v20, %[z3]\n"
                     "vsetvli zero, zero, e16, m2, ta, ma\n" /* the same vl: SEW / LMUL unchanged */
                     : [vl] "=&r"(vl)
                     : [n] "r"(avl < ET_RVV_VL ? avl : ET_RVV_VL), [z0] "r"(init[0]), [z1] "r"(init[1]),
                       [z2] "r"(init[2]), [z3] "r"(init[3]));
    int32_t pairs = cg >> 1;
    if (pairs)
        __asm__ volatile("1:\n"
                         "vle8.v v0, (%[x])\n"
                         "add %[x], %[x], %[cs]\n"
                         "vle8.v v1, (%[x])\n"
                         "add %[x], %[x], %[cs]\n"
                         "vsext.vf2 v2, v0\n"
                         "vsext.vf2 v4, v1\n"
                         "lb t0, 0(%[w0])\n"
                         "lb t1, 1(%[w0])\n"
                         "vwmacc.vx v8, t0, v2\n"
                         "vwmacc.vx v8, t1, v4\n"
                         "lb t0, 0(%[w1])\n"
                         "lb t1, 1(%[w1])\n"
                         "vwmacc.vx v12, t0, v2\n"
                         "vwmacc.vx v12, t1, v4\n"
                         "lb t0, 0(%[w2])\n"
                         "lb t1, 1(%[w2])\n"
                         "vwmacc.vx v16, t0, v2\n"
                         "vwmacc.vx v16, t1, v4\n"
                         "lb t0, 0(%[w3])\n"
                         "lb t1, 1(%[w3])\n"
                         "vwmacc.vx v20, t0, v2\n"
                         "vwmacc.vx v20, t1, v4\n"
                         "addi %[w0], %[w0], 2\n"
                         "addi %[w1], %[w1], 2\n"
                         "addi %[w2], %[w2], 2\n"
                         "addi %[w3], %[w3], 2\n"
                         "addi %[p], %[p], -1\n"
                         "bnez %[p], 1b\n"
                         : [x] "+r"(xp), [w0] "+r"(w0), [w1] "+r"(w1), [w2] "+r"(w2), [w3] "+r"(w3), [p] "+r"(pairs)
                         : [cs] "r"(cs)
                         : "t0", "t1", "memory");
    if (cg & 1)
        __asm__ volatile("vle8.v v0, (%[x])\n"
                         "vsext.vf2 v2, v0\n"
                         "lb t0, 0(%[w0])\n"
                         "vwmacc.vx v8, t0, v2\n"
                         "lb t0, 0(%[w1])\n"
                         "vwmacc.vx v12, t0, v2\n"
                         "lb t0, 0(%[w2])\n"
                         "vwmacc.vx v16, t0, v2\n"
                         "lb t0, 0(%[w3])\n"
                         "vwmacc.vx v20, t0, v2\n"
                         :
                         : [x] "r"(xp), [w0] "r"(w0), [w1] "r"(w1), [w2] "r"(w2), [w3] "r"(w3)
                         : "t0", "memory");
    __asm__ volatile("vsetvli zero, zero, e32, m4, ta, ma\n"
                     "vse32.v v8, (%[s0])\n"
                     "vse32.v v12, (%[s1])\n"
                     "vse32.v v16, (%[s2])\n"
                     "vse32.v v20, (%[s3])\n"
                     :
                     : [s0] "r"(s), [s1] "r"(s + ET_RVV_VL), [s2] "r"(s + 2 * ET_RVV_VL), [s3] "r"(s + 3 * ET_RVV_VL)
                     : "memory");
    return vl;
}

/* output rows [r0, r1) of channels [o0, o1): blocks of 4 channels (a block of fewer repeats its
 * last weight row, computed, not stored) over the pixels of the rows that lie side by side in
 * the input (a ring buffer's rows up to its wrap), a vector at a time */
__attribute__((noinline, unused)) static void et_rvv_pw_rows(const et_qconv_p *P, et_rows8 x, int32_t xc_off,
                                                             const et_w8 *w, const int32_t *bias, et_rows8 y,
                                                             float *yf, int32_t yo_off, int32_t r0, int32_t r1,
                                                             int32_t o0, int32_t o1) {
    const int32_t cg = P->cg, wd = P->w, cs = x.cstride;
    int32_t s[4 * ET_RVV_VL];
    for (int32_t o = o0; o < o1; o += 4) {
        const int32_t no = o1 - o < 4 ? o1 - o : 4;
        const int8_t *wr[4];
        int32_t init[4];
        for (int32_t k = 0; k < 4; k++) {
            wr[k] = et_w8_taps(w, o + (k < no ? k : no - 1), 0, cg, 1);
            int32_t sum = 0;
            for (int32_t c = 0; c < cg; c++) sum += wr[k][c];
            init[k] = -P->x_zero * sum;
        }
        for (int32_t n = 0; n < P->n; n++)
            for (int32_t ha = r0; ha < r1;) {
                /* rows [ha, hb): side by side in x (before the ring buffer wraps) */
                const int32_t left = x.cap - ha % x.cap, hb = r1 - ha < left ? r1 : ha + left;
                const int8_t *xr = x.p + n * x.nstride - xc_off * cs + (ha % x.cap) * wd;
                const int32_t total = (hb - ha) * wd;
                int32_t ho = ha, q = 0; /* the output pixel of flat position f */
                et_qrow out[4];
                for (int32_t k = 0; k < no; k++) out[k] = et_qconv_row(P, y, yf, yo_off, n, o + k, ho, bias);
                for (int32_t f = 0; f < total;) {
                    const int32_t vl = et_rvv_pw_sums(xr + f, cs, cg, wr[0], wr[1], wr[2], wr[3], init, total - f, s);
                    for (int32_t i = 0; i < vl;) { /* the chunk's pixels, a row segment at a time */
                        if (q == wd) {
                            q = 0;
                            ++ho;
                            for (int32_t k = 0; k < no; k++) out[k] = et_qconv_row(P, y, yf, yo_off, n, o + k, ho, bias);
                        }
                        const int32_t m = vl - i < wd - q ? vl - i : wd - q;
                        for (int32_t k = 0; k < no; k++) et_rvv_qput(&out[k], q, s + k * ET_RVV_VL + i, m);
                        i += m;
                        q += m;
                    }
                    f += vl;
                }
                ha = hb;
            }
    }
}

/* ---- depthwise ---------------------------------------------------------------------------- */
/* s[i] = init + sum over the taps (i, j) of t[i * kw + j] * rp[i][(q0 + i') * sw + j - pw] for
 * the vl output pixels q0 + i' (every tap in the image); returns vl (at most avl) */
static inline int32_t et_rvv_dw_sums(const int8_t *const *rp, const int8_t *t, int32_t kh, int32_t kw, int32_t q0,
                                     int32_t sw, int32_t pw, int32_t init, int32_t avl, int32_t *s) {
    int32_t vl;
    __asm__ volatile("vsetvli %[vl], %[n], e32, m4, ta, ma\n"
                     "vmv.v.x v8, %[z]\n"
                     "vsetvli zero, zero, e16, m2, ta, ma\n"
                     : [vl] "=&r"(vl)
                     : [n] "r"(avl < ET_RVV_VL ? avl : ET_RVV_VL), [z] "r"(init));
    const int32_t c0 = q0 * sw - pw;
    for (int32_t i = 0; i < kh; i++) {
        const int8_t *xp = rp[i] + c0, *ti = t + i * kw;
        if (sw == 1)
            for (int32_t j = 0; j < kw; j++)
                __asm__ volatile("vle8.v v0, (%[x])\n"
                                 "vsext.vf2 v2, v0\n"
                                 "vwmacc.vx v8, %[w], v2\n"
                                 :
                                 : [x] "r"(xp + j), [w] "r"((int32_t)ti[j])
                                 : "memory");
        else
            for (int32_t j = 0; j < kw; j++)
                __asm__ volatile("vlse8.v v0, (%[x]), %[sw]\n"
                                 "vsext.vf2 v2, v0\n"
                                 "vwmacc.vx v8, %[w], v2\n"
                                 :
                                 : [x] "r"(xp + j), [sw] "r"(sw), [w] "r"((int32_t)ti[j])
                                 : "memory");
    }
    __asm__ volatile("vsetvli zero, zero, e32, m4, ta, ma\n"
                     "vse32.v v8, (%[s])\n"
                     :
                     : [s] "r"(s)
                     : "memory");
    return vl;
}

/* whether et_rvv_dw_rows runs this conv: RV32's depthwise condition (et_qconv_dwp_ok) */
static inline int et_rvv_dw_ok(const et_qconv_p *P) {
    return et_qconv_dwp_ok(P);
}

__attribute__((noinline, unused)) static void et_rvv_dw_rows(const et_qconv_p *P, et_rows8 x, int32_t xc_off,
                                                             const et_w8 *w, const int32_t *bias, et_rows8 y,
                                                             float *yf, int32_t yo_off, int32_t r0, int32_t r1,
                                                             int32_t o0, int32_t o1) {
    const int32_t opg = P->o / P->groups, kh = P->kh, kw = P->kw, khkw = kh * kw, sw = P->sw, pw = P->pw;
    int32_t qa, qb;
    et_interior_cols(P, &qa, &qb); /* et_int8_rv32.h */
    int32_t s[ET_RVV_VL];
    for (int32_t n = 0; n < P->n; n++)
        for (int32_t o = o0; o < o1; o++) {
            const int8_t *t = et_w8_taps(w, o, 0, 1, khkw);
            const int32_t init = -P->x_zero * et_tap_sum(t, khkw); /* et_int8_rv32.h */
            const int8_t *xc = x.p + n * x.nstride + (o / opg - xc_off) * x.cstride;
            for (int32_t ho = r0; ho < r1; ho++) {
                const int8_t *rp[ET_DWP_MAX];
                const int32_t rows = et_dwp_row_ptrs(P, xc, x.cap, ho, rp);
                const et_qrow out = et_qconv_row(P, y, yf, yo_off, n, o, ho, bias);
                const int fast = rows == kh;
                const int32_t a = fast ? qa : P->wo, b = fast ? qb : P->wo;
                for (int32_t q = 0; q < a; q++) et_qrow_put(&out, q, et_dwp_pixel(P, rp, t, q));
                for (int32_t q = a; q < b;) {
                    const int32_t vl = et_rvv_dw_sums(rp, t, kh, kw, q, sw, pw, init, b - q, s);
                    et_rvv_qput(&out, q, s, vl);
                    q += vl;
                }
                for (int32_t q = b; q < P->wo; q++) et_qrow_put(&out, q, et_dwp_pixel(P, rp, t, q));
            }
        }
}
#endif

#endif /* ET_INT8_RVV_H */
