/* edgetrain int8 depthwise qconv2d on the Cortex-M DSP extension (included by et_int8.h after
 * et_int8_dsp.h, whose words, packing and requantization it uses, where __ARM_FEATURE_DSP is
 * defined).
 *
 * The input rows of one channel are copied into a small stack ring of rows padded with the
 * input zero point, so no tap tests a bound (a padded tap adds w * x_zero, which the
 * zero-point term of the accumulator's start takes back); 3x3 at stride 1 two pixels at a
 * time (each tap row's word gives both pixels' pairs, the middle taps by __smlabb/__smlatt),
 * 5x5..7x7 at stride 1 two pixels from two words per tap row (__smladx for the odd pixel's
 * shifted pairs), at stride 2 two pixels from the same words (shifted pairs joined from two
 * words' halves), other sizes a pixel at a time over the row's words. Same integers as the
 * portable loop of et_int8.h. */
#ifndef ET_INT8_DW_H
#define ET_INT8_DW_H
#include <stdint.h>
#include <string.h>
#include "et_int8_core.h" /* et_qconv_p, et_rows8, et_w8 */
#include "et_int8_dsp.h"  /* the words, packing and requantization */
#include "et_int8_mve.h"  /* Helium (the Cortex-M55; else empty): et_mve_dw_row */
#if defined(__ARM_FEATURE_DSP)

/* ---- depthwise ------------------------------------------------------------------------------
 * One channel at a time; its input rows copied into a ring of 4 or 8 stack rows (row hi in
 * slot hi & (slots - 1), kept while the next output rows read it), each padded with x_zero: pw
 * bytes before the row and at least 4 after, so a tap row's words never test a bound; a row
 * outside the image is a row of x_zero. When all the rows a call's output rows read fit the
 * stack buffer, they are copied once per channel at a fixed stride instead (no ring
 * bookkeeping per output row). The weights are packed once per channel; the row kernels are
 * compiled for channels on the fast requantization path (the others a pixel at a time,
 * et_dw_row_slow), the 5x5 / 7x7 rows and any other kernel's as one copy whose tap-row loop is
 * not unrolled (copies with the tap-row count a constant saved proxyless-w0.3 and mcunet-5fps
 * 0.62 / 0.63 M est. M7 cycles a step for 2.0 KB of code: 86095a4, docs/benchmarks.md, "Cortex-M
 * flash, fourth round"). On the fast path,
 * with the rows copied at a fixed stride and the output rows one after another, a square 3x3,
 * 5x5 or 7x7 channel runs all its output rows as one loop of pixel pairs instead
 * (et_dw_plane: no set-up per row, which cost as much as a row of 4x4 and 8x8
 * planes). */
#define ET_DW_TAPS 8
#define ET_DW_PAD 1024 /* stack bytes for the ring and the x_zero row */

/* The program's depthwise kernels by shape, a bit each: model.c defines ET_DW_KERNELS from its
 * layers (backends/c/kernel_select.py) before it includes the runtime, so the paths of the shapes
 * it lacks are not compiled (the paper's models have 3x3 only, or 3x3, 5x5 and 7x7: most of
 * et_qconv_dw_rows' code is the paths of other shapes and of the row loops). Undefined: every
 * path. A layer whose shape is not in it takes the general convolution (et_qconv_dw_ok), so a
 * wrong set costs time, not results. */
#define ET_DW_K3 1
#define ET_DW_K5 2
#define ET_DW_K7 4
#define ET_DW_KOTHER 8 /* any other kh x kw */
#ifndef ET_DW_KERNELS
#define ET_DW_KERNELS (ET_DW_K3 | ET_DW_K5 | ET_DW_K7 | ET_DW_KOTHER)
#endif
#define ET_DW_HAS(bit) ((ET_DW_KERNELS & (bit)) != 0)
static inline int32_t et_dw_kernel(int32_t kh, int32_t kw) {
    if (kh != kw) return ET_DW_KOTHER;
    return kh == 3 ? ET_DW_K3 : kh == 5 ? ET_DW_K5 : kh == 7 ? ET_DW_K7 : ET_DW_KOTHER;
}
/* The whole-plane loops (et_dw3_plane_s1 ... et_dw7_plane_s2 below) by kernel and stride, a bit each:
 * model.c defines ET_DW_PLANES from its layers (backends/c/kernel_select.py's PLANE_BIT) and only those
 * loops are compiled; a layer of another kernel and stride takes the rows (the same bytes). Undefined:
 * every loop. */
#define ET_DW_P3S1 1
#define ET_DW_P3S2 2
#define ET_DW_P5S1 4
#define ET_DW_P5S2 8
#define ET_DW_P7S1 16
#define ET_DW_P7S2 32
#ifndef ET_DW_PLANES
#define ET_DW_PLANES 63
#endif
/* the plane bit of a 3x3 (three), 5x5 (five) or 7x7 kernel at stride sw (1 or 2) */
static inline int32_t et_dw_plane_bit(int three, int five, int32_t sw) {
    return (three ? ET_DW_P3S1 : five ? ET_DW_P5S1 : ET_DW_P7S1) << (sw == 2);
}
/* whether a layer that et_qconv_dw_ok took (its shape in the set) has the shape `bit`: a constant
 * where the set is that shape alone or lacks it, so the other shapes' paths are not compiled */
#define ET_DW_IS(bit, kh, kw) (ET_DW_KERNELS == (bit) || (ET_DW_HAS(bit) && et_dw_kernel(kh, kw) == (bit)))

static inline int32_t et_dw_row_bytes(const et_qconv_p *P) { return (P->w + 2 * P->pw + 4 + 3) & ~3; }
static inline int32_t et_dw_slots(const et_qconv_p *P) { return P->kh <= 4 ? 4 : 8; }

static inline int et_qconv_dw_ok(const et_qconv_p *P) {
    return P->cg == 1 && ET_DW_HAS(et_dw_kernel(P->kh, P->kw)) && P->kh <= ET_DW_TAPS && P->kw <= ET_DW_TAPS &&
           P->dh == 1 && P->dw == 1 && (et_dw_slots(P) + 1) * et_dw_row_bytes(P) <= ET_DW_PAD;
}

/* n bytes, a word at a time (unaligned both sides); the empty asm keeps gcc from turning the
 * loop into a call to memmove, whose set-up costs more than these short rows */
static inline void et_copy8(int8_t *d, const int8_t *s, int32_t n) {
    int32_t k = 0;
    for (; k + 4 <= n; k += 4) {
        uint32_t v;
        memcpy(&v, s + k, 4);
        __asm__("" : "+r"(v));
        memcpy(d + k, &v, 4);
    }
    for (; k < n; k++) d[k] = s[k];
}

/* n rows of w bytes that follow each other at src into dst at a stride of rb: rows of 4 and 8
 * bytes (the paper's 4x4 and 8x8 planes) a word or two each, without et_copy8's loop set-up */
static inline void et_copy_rows(int8_t *dst, int32_t rb, const int8_t *src, int32_t w, int32_t n) {
    if (w == 4)
        for (int32_t j = 0; j < n; j++, src += 4, dst += rb) {
            uint32_t v;
            memcpy(&v, src, 4);
            __asm__("" : "+r"(v)); /* a word load and store, not a call to memcpy */
            memcpy(dst, &v, 4);
        }
    else if (w == 8)
        for (int32_t j = 0; j < n; j++, src += 8, dst += rb) {
            uint32_t v, u;
            memcpy(&v, src, 4);
            memcpy(&u, src + 4, 4);
            __asm__("" : "+r"(v), "+r"(u));
            memcpy(dst, &v, 4);
            memcpy(dst + 4, &u, 4);
        }
    else
        for (int32_t j = 0; j < n; j++, src += w, dst += rb) et_copy8(dst, src, w);
}

/* one depthwise channel: its packed taps and requantization */
typedef struct {
    int32_t wpk[ET_DW_TAPS][2][2]; /* per tap row the pairs (t0, t2), (t1, t3), (t4, t6), (t5, t7) */
    int32_t e0, e1, e2, m01, m2;   /* 3x3: (t0, t2) of each row, (t1 of row 0, t1 of row 1), t1 of row 2 */
    et_rq r;
} et_dwc;

/* output pixel q's sum s on the fast requantization path (the row's first element at y[at]) */
#define ET_DW_PUT(q, s) (y[at + (q)] = (int8_t)et_rq_fast(&c->r, (s)))

/* 3x3 at stride 2: pixels q, q + 1 from the words x[2q..2q+7] of tap rows r0, r1, r2 (the rows
 * end in >= 4 pad bytes): q is (t0, t2).(x0, x2) + t1 x1, q + 1 is t0 x2 + t1 x3 + t2 x4; the
 * sums from init to *o0, *o1 */
static inline __attribute__((always_inline)) void et_dw3_pair_s2(const int8_t *r0, const int8_t *r1, const int8_t *r2,
                                                                 int32_t e0, int32_t e1, int32_t e2, int32_t m01,
                                                                 int32_t m2, int32_t init, int32_t *o0, int32_t *o1) {
    const uint32_t v0 = (uint32_t)et_ld32s(r0), v1 = (uint32_t)et_ld32s(r1), v2 = (uint32_t)et_ld32s(r2);
    const int32_t a0 = __sxtb16((int32_t)v0), b0 = et_sxtb16_ror8(v0), c0 = __sxtb16(et_ld32s(r0 + 4));
    const int32_t a1 = __sxtb16((int32_t)v1), b1 = et_sxtb16_ror8(v1), c1 = __sxtb16(et_ld32s(r1 + 4));
    const int32_t a2 = __sxtb16((int32_t)v2), b2 = et_sxtb16_ror8(v2), c2 = __sxtb16(et_ld32s(r2 + 4));
    int32_t s0 = __smlad(e0, a0, init), s1 = __smlabt(e0, a0, init);
    s0 = __smlabb(m01, b0, s0);
    s1 = __smlabt(m01, b0, s1);
    s1 = __smlatb(e0, c0, s1);
    s0 = __smlad(e1, a1, s0);
    s1 = __smlabt(e1, a1, s1);
    s0 = __smlatb(m01, b1, s0);
    s1 = __smlatt(m01, b1, s1);
    s1 = __smlatb(e1, c1, s1);
    s0 = __smlad(e2, a2, s0);
    s1 = __smlabt(e2, a2, s1);
    s0 = __smlabb(m2, b2, s0);
    s1 = __smlabt(m2, b2, s1);
    s1 = __smlatb(e2, c2, s1);
    *o0 = s0;
    *o1 = s1;
}

/* 3x3: at stride 1 pixels q, q + 1 from one word x[q..q+3] per tap row, (x0, x2) . (t0, t2)
 * and t1 x1 for q, (x1, x3) . (t0, t2) and t1 x2 for q + 1; at stride 2 from two words
 * x[2q..2q+7], the odd pixel by single 16-bit products; the last odd pixel one at a time */
static inline __attribute__((always_inline)) void et_dw3_row(const int8_t *const *rows, const et_dwc *c, int32_t wo,
                                                             int32_t sw, int8_t *y, int32_t at) {
    const int8_t *p0 = rows[0], *p1 = rows[1], *p2 = rows[2];
    const int32_t e0 = c->e0, e1 = c->e1, e2 = c->e2, m01 = c->m01, m2 = c->m2, init = c->r.init;
    int32_t q = 0;
    if (sw == 1)
        for (; q + 2 <= wo; q += 2) {
            const uint32_t v0 = (uint32_t)et_ld32s(p0 + q), v1 = (uint32_t)et_ld32s(p1 + q),
                           v2 = (uint32_t)et_ld32s(p2 + q);
            const int32_t a0 = __sxtb16((int32_t)v0), b0 = et_sxtb16_ror8(v0);
            const int32_t a1 = __sxtb16((int32_t)v1), b1 = et_sxtb16_ror8(v1);
            const int32_t a2 = __sxtb16((int32_t)v2), b2 = et_sxtb16_ror8(v2);
            int32_t s0 = __smlad(e0, a0, init), s1 = __smlad(e0, b0, init);
            s0 = __smlabb(m01, b0, s0);
            s1 = __smlabt(m01, a0, s1);
            s0 = __smlad(e1, a1, s0);
            s1 = __smlad(e1, b1, s1);
            s0 = __smlatb(m01, b1, s0);
            s1 = __smlatt(m01, a1, s1);
            s0 = __smlad(e2, a2, s0);
            s1 = __smlad(e2, b2, s1);
            s0 = __smlabb(m2, b2, s0);
            s1 = __smlabt(m2, a2, s1);
            ET_DW_PUT(q, s0);
            ET_DW_PUT(q + 1, s1);
        }
    else if (sw == 2) /* pixels q, q + 1 from x[2q..2q+7] per tap row (et_dw3_pair_s2) */
        for (; q + 2 <= wo; q += 2) {
            int32_t s0, s1;
            et_dw3_pair_s2(p0 + 2 * q, p1 + 2 * q, p2 + 2 * q, e0, e1, e2, m01, m2, init, &s0, &s1);
            ET_DW_PUT(q, s0);
            ET_DW_PUT(q + 1, s1);
        }
    for (; q < wo; q++) {
        const int32_t k = q * sw;
        const uint32_t v0 = (uint32_t)et_ld32s(p0 + k), v1 = (uint32_t)et_ld32s(p1 + k), v2 = (uint32_t)et_ld32s(p2 + k);
        int32_t s0 = __smlad(e0, __sxtb16((int32_t)v0), init);
        s0 = __smlabb(m01, et_sxtb16_ror8(v0), s0);
        s0 = __smlad(e1, __sxtb16((int32_t)v1), s0);
        s0 = __smlatb(m01, et_sxtb16_ror8(v1), s0);
        s0 = __smlad(e2, __sxtb16((int32_t)v2), s0);
        s0 = __smlabb(m2, et_sxtb16_ror8(v2), s0);
        ET_DW_PUT(q, s0);
    }
}

/* kw 5..7, stride 1: pixels q, q + 1 from the two words x[q..q+7] of each tap row, whose
 * pairs are a0 = (x0, x2), b0 = (x1, x3), a1 = (x4, x6), b1 = (x5, x7): pixel q is
 * (t0, t2).a0 + (t1, t3).b0 + (t4, t6).a1 + (t5, t7).b1; pixel q + 1 is (t0, t2).b0 +
 * (t4, t6).b1 + t1 x2 + t3 x4 (__smladx with (x4, x2)) + t5 x6 (t7 = 0). Stride 2: pixel q + 1
 * reads x2..x8 of the same words, (t0, t2).(x2, x4) + (t1, t3).(x3, x5) + (t4, t6).(x6, x8) +
 * t5 x7, the shifted pairs joined from two words' halves (x8: a third word, kw = 7 only; t6 = 0
 * below that). Tap row i's words start at rows[i] + off, or without rows at x + i * rb + off;
 * the pair's sums from init go to *o0, *o1. */
static inline __attribute__((always_inline)) void et_dwk_tap_row(const int8_t *p, const int32_t (*wpk)[2],
                                                                 const int32_t sw, const int seven, int32_t *s0p,
                                                                 int32_t *s1p) {
    int32_t s0 = *s0p, s1 = *s1p;
    const uint32_t v0 = (uint32_t)et_ld32s(p), v1 = (uint32_t)et_ld32s(p + 4);
    const int32_t a0 = __sxtb16((int32_t)v0), b0 = et_sxtb16_ror8(v0);
    const int32_t a1 = __sxtb16((int32_t)v1), b1 = et_sxtb16_ror8(v1);
    const int32_t e0 = wpk[0][0], d0 = wpk[0][1], e1 = wpk[1][0], d1 = wpk[1][1];
    s0 = __smlad(e0, a0, s0);
    s0 = __smlad(d0, b0, s0);
    s0 = __smlad(e1, a1, s0);
    s0 = __smlad(d1, b1, s0);
    if (sw == 1) {
        const int32_t c0 = et_pkhbt(a1, a0); /* (x4, x2) */
        s1 = __smlad(e0, b0, s1);
        s1 = __smladx(d0, c0, s1);
        s1 = __smlad(e1, b1, s1);
        s1 = __smlabt(d1, a1, s1);
    } else {
        const int32_t c02 = (int32_t)(((uint32_t)a0 >> 16) | ((uint32_t)a1 << 16)); /* (x2, x4) */
        const int32_t c13 = (int32_t)(((uint32_t)b0 >> 16) | ((uint32_t)b1 << 16)); /* (x3, x5) */
        s1 = __smlad(e0, c02, s1);
        s1 = __smlad(d0, c13, s1);
        if (seven) {
            const int32_t a2 = __sxtb16(et_ld32s(p + 8));
            s1 = __smlad(e1, (int32_t)(((uint32_t)a1 >> 16) | ((uint32_t)a2 << 16)), s1); /* (x6, x8) */
        } else {
            s1 = __smlabt(e1, a1, s1);
        }
        s1 = __smlabt(d1, b1, s1);
    }
    *s0p = s0;
    *s1p = s1;
}
/* the pair's tap rows: unrolled where kh is a constant (the planes), a loop where it is not (the
 * rows of 5x5, 7x7 and other kernels, at four sites: `unroll 8` unrolls a loop whose count is not
 * a constant too, with code for the remainder) */
static inline __attribute__((always_inline)) void et_dwk_pair(const int8_t *const *rows, const int8_t *x, int32_t rb,
                                                              int32_t off, const et_dwc *c, int32_t kh, const int32_t sw,
                                                              const int seven, int32_t init, int32_t *o0, int32_t *o1) {
    int32_t s0 = init, s1 = init;
    if (__builtin_constant_p(kh)) {
#pragma GCC unroll 8
        for (int32_t i = 0; i < kh; i++)
            et_dwk_tap_row((rows ? rows[i] : x + i * rb) + off, c->wpk[i], sw, seven, &s0, &s1);
    } else {
#pragma GCC unroll 1
        for (int32_t i = 0; i < kh; i++)
            et_dwk_tap_row((rows ? rows[i] : x + i * rb) + off, c->wpk[i], sw, seven, &s0, &s1);
    }
    *o0 = s0;
    *o1 = s1;
}

/* A square 3x3, 5x5 or 7x7 channel on the fast path over `nr` output rows, as the row kernels'
 * pixel pairs (et_dw3_pair_s2, et_dwk_pair), when the input rows lie at a fixed stride rb (x:
 * the first output row's top tap row) and the output rows follow each other (y), wo even: the
 * rows' pairs run as one loop, a row's end reached by a counter and the next row's start by a
 * pointer jump, so a row costs no set-up (the paper's planes of 4x4 and 8x8 have rows of 2 and
 * 4 pairs). The taps and the start are doubled (2 t fits an int16 lane, 2 |sum| < 2^30), so the
 * sums are et_level2's operand 2 * sum as they are. 3x3 at strides 1 and 2 is written in
 * assembly: the loops need 14 registers (gcc's allocation spilled values every pair); the
 * multiplier and shift of the requantization and the row counts are read from the stack. */
static inline __attribute__((always_inline)) void et_dw_plane(const int8_t *x, int32_t rb, int32_t nr, int32_t wo,
                                                              const int32_t sw, const int32_t kh, const et_dwc *c,
                                                              int8_t *y) {
    const int three = kh == 3; /* the taps doubled: 3x3's packed words, or the taps of each row */
    const int32_t e0 = three ? __sadd16(c->e0, c->e0) : 0, e1 = three ? __sadd16(c->e1, c->e1) : 0;
    const int32_t e2 = three ? __sadd16(c->e2, c->e2) : 0, m01 = three ? __sadd16(c->m01, c->m01) : 0;
    const int32_t m2 = three ? 2 * c->m2 : 0, init = 2 * c->r.init;
    et_dwc dd;
    for (int32_t i = 0; !three && i < kh; i++)
        for (int32_t k = 0; k < 2; k++) {
            dd.wpk[i][k][0] = __sadd16(c->wpk[i][k][0], c->wpk[i][k][0]);
            dd.wpk[i][k][1] = __sadd16(c->wpk[i][k][1], c->wpk[i][k][1]);
        }
    int32_t mult = c->r.mult, add = c->r.add, right = c->r.right, half = wo / 2, left = half;
    int32_t jump = sw * rb - sw * wo; /* the end of a row's pixels to the next output row's */
    const int8_t *end = y + nr * wo;
    if (three) {
        /* the row's pair count in m2's upper half, which the products never read (smlabb and
         * smlabt take its lower one): it counts up from 2^16 - half (half < ET_DW_PAD, the rows
         * held) and carries out at the row's end (a counter of its own would be a 15th register) */
        const int32_t reset = (int32_t)((uint32_t)(0x10000 - half) << 16);
        int32_t m2c = (int32_t)(((uint32_t)m2 & 0xffffu) | (uint32_t)reset);
        int32_t v, a, s0, s1;
/* after a pair's sums: et_level2 of each (add + hi, less the sign, >> right, saturated), x on by
 * STEP bytes, the row's next pair or the next row (reset, jump), until y reaches end; then both
 * loops' operands, the same registers and stack slots */
#define ET_DW3_PAIR_END(STEP)                                                                               \
    "ldr %[a], %[mult]\n\t"                                                                                 \
    "smmlar %[v], %[s0], %[a], %[add]\n\t"                                                                  \
    "sub %[v], %[v], %[s0], lsr #31\n\t"                                                                    \
    "ldr %[s0], %[right]\n\t"                                                                               \
    "asr %[v], %[v], %[s0]\n\t"                                                                             \
    "ssat %[v], #8, %[v]\n\t"                                                                               \
    "strb %[v], [%[y]], #1\n\t"                                                                             \
    "smmlar %[v], %[s1], %[a], %[add]\n\t"                                                                  \
    "sub %[v], %[v], %[s1], lsr #31\n\t"                                                                    \
    "asr %[v], %[v], %[s0]\n\t"                                                                             \
    "ssat %[v], #8, %[v]\n\t"                                                                               \
    "strb %[v], [%[y]], #1\n\t"                                                                             \
    "add %[x], %[x], #" STEP "\n\t"                                                                         \
    "adds %[m2], %[m2], #0x10000\n\t" /* the row's next pair, or the next row */                          \
    "bcc 1b\n\t"                                                                                            \
    "ldr %[v], %[reset]\n\t"                                                                                \
    "add %[m2], %[m2], %[v]\n\t"                                                                            \
    "ldr %[v], %[jump]\n\t"                                                                                 \
    "add %[x], %[x], %[v]\n\t"                                                                              \
    "ldr %[v], %[end]\n\t"                                                                                  \
    "cmp %[y], %[v]\n\t"                                                                                    \
    "blo 1b\n\t"                                                                                            \
    : [x] "+r"(x), [y] "+r"(y), [v] "=&r"(v), [a] "=&r"(a), [s0] "=&r"(s0), [s1] "=&r"(s1), [m2] "+r"(m2c) \
    : [rb] "r"(rb), [e0] "r"(e0), [e1] "r"(e1), [e2] "r"(e2), [m01] "r"(m01), [init] "r"(init),           \
      [add] "r"(add), [mult] "m"(mult), [right] "m"(right), [reset] "m"(reset), [jump] "m"(jump),        \
      [end] "m"(end)                                                                                        \
    : "cc", "memory"
        if (sw == 1)
            __asm__ volatile(
                "1:\n\t"
                "ldr %[v], [%[x]]\n\t" /* top tap row: a = (x0, x2), v = (x1, x3) */
                "sxtb16 %[a], %[v]\n\t"
                "sxtb16 %[v], %[v], ror #8\n\t"
                "smlad %[s0], %[e0], %[a], %[init]\n\t"
                "smlad %[s1], %[e0], %[v], %[init]\n\t"
                "smlabb %[s0], %[m01], %[v], %[s0]\n\t"
                "smlabt %[s1], %[m01], %[a], %[s1]\n\t"
                "ldr %[v], [%[x], %[rb]]\n\t" /* middle */
                "sxtb16 %[a], %[v]\n\t"
                "sxtb16 %[v], %[v], ror #8\n\t"
                "smlad %[s0], %[e1], %[a], %[s0]\n\t"
                "smlad %[s1], %[e1], %[v], %[s1]\n\t"
                "smlatb %[s0], %[m01], %[v], %[s0]\n\t"
                "smlatt %[s1], %[m01], %[a], %[s1]\n\t"
                "ldr %[v], [%[x], %[rb], lsl #1]\n\t" /* bottom */
                "sxtb16 %[a], %[v]\n\t"
                "sxtb16 %[v], %[v], ror #8\n\t"
                "smlad %[s0], %[e2], %[a], %[s0]\n\t"
                "smlad %[s1], %[e2], %[v], %[s1]\n\t"
                "smlabb %[s0], %[m2], %[v], %[s0]\n\t"
                "smlabt %[s1], %[m2], %[a], %[s1]\n\t" ET_DW3_PAIR_END("2"));
        else /* stride 2: et_dw3_pair_s2's products, the words x[2q..2q+3] and x[2q+4..2q+7] of each row */
            __asm__ volatile(
                "1:\n\t"
                "ldr %[a], [%[x], #4]\n\t" /* top tap row: (x4, x6), then (x0, x2) and (x1, x3) */
                "sxtb16 %[a], %[a]\n\t"
                "smlatb %[s1], %[e0], %[a], %[init]\n\t"
                "ldr %[v], [%[x]]\n\t"
                "sxtb16 %[a], %[v]\n\t"
                "smlad %[s0], %[e0], %[a], %[init]\n\t"
                "smlabt %[s1], %[e0], %[a], %[s1]\n\t"
                "sxtb16 %[a], %[v], ror #8\n\t"
                "smlabb %[s0], %[m01], %[a], %[s0]\n\t"
                "smlabt %[s1], %[m01], %[a], %[s1]\n\t"
                "add %[a], %[x], %[rb]\n\t" /* middle */
                "ldr %[v], [%[a], #4]\n\t"
                "ldr %[a], [%[a]]\n\t"
                "sxtb16 %[v], %[v]\n\t"
                "smlatb %[s1], %[e1], %[v], %[s1]\n\t"
                "sxtb16 %[v], %[a]\n\t"
                "smlad %[s0], %[e1], %[v], %[s0]\n\t"
                "smlabt %[s1], %[e1], %[v], %[s1]\n\t"
                "sxtb16 %[v], %[a], ror #8\n\t"
                "smlatb %[s0], %[m01], %[v], %[s0]\n\t"
                "smlatt %[s1], %[m01], %[v], %[s1]\n\t"
                "add %[a], %[x], %[rb], lsl #1\n\t" /* bottom */
                "ldr %[v], [%[a], #4]\n\t"
                "ldr %[a], [%[a]]\n\t"
                "sxtb16 %[v], %[v]\n\t"
                "smlatb %[s1], %[e2], %[v], %[s1]\n\t"
                "sxtb16 %[v], %[a]\n\t"
                "smlad %[s0], %[e2], %[v], %[s0]\n\t"
                "smlabt %[s1], %[e2], %[v], %[s1]\n\t"
                "sxtb16 %[v], %[a], ror #8\n\t"
                "smlabb %[s0], %[m2], %[v], %[s0]\n\t"
                "smlabt %[s1], %[m2], %[v], %[s1]\n\t" ET_DW3_PAIR_END("4"));
#undef ET_DW3_PAIR_END
        return;
    }
    while (y < end) {
        int32_t s0, s1;
        et_dwk_pair(0, x, rb, 0, &dd, kh, sw, kh == 7, init, &s0, &s1);
        y[0] = (int8_t)et_level2(s0, mult, add, right);
        y[1] = (int8_t)et_level2(s1, mult, add, right);
        y += 2;
        x += 2 * sw;
        if (--left == 0) {
            left = half;
            x += jump;
        }
    }
}

/* the planes out of line, once for each kernel and stride: the loops get the registers to
 * themselves (inlined into et_qconv_dw_rows, the channel loop's values crowd them; the 3x3
 * loops' 14 registers could not be found there in every program) */
#define ET_DW_PLANE(NAME, SW, KH)                                                                              \
    static __attribute__((noinline, unused)) void NAME(const int8_t *x, int32_t rb, int32_t nr, int32_t wo,  \
                                                       const et_dwc *c, int8_t *y) {                         \
        et_dw_plane(x, rb, nr, wo, SW, KH, c, y);                                                           \
    }
ET_DW_PLANE(et_dw3_plane_s1, 1, 3)
ET_DW_PLANE(et_dw3_plane_s2, 2, 3)
ET_DW_PLANE(et_dw5_plane_s1, 1, 5)
ET_DW_PLANE(et_dw5_plane_s2, 2, 5)
ET_DW_PLANE(et_dw7_plane_s1, 1, 7)
ET_DW_PLANE(et_dw7_plane_s2, 2, 7)
#undef ET_DW_PLANE

/* a row of kw <= 8: pixel pairs at stride 1 and 2 (kw 5..7: et_dwk_pair); any other kw or
 * stride a pixel at a time over the tap rows' words */
static inline __attribute__((always_inline)) void et_dwk_row(const int8_t *const *rows, const et_dwc *c, int32_t kh,
                                                             int32_t kw, int32_t words, int32_t wo, int32_t sw,
                                                             int8_t *y, int32_t at) {
    int32_t q = 0;
    if (sw == 1 && words == 2 && kw <= 7)
        for (; q + 2 <= wo; q += 2) {
            int32_t s0, s1;
            et_dwk_pair(rows, 0, 0, q, c, kh, 1, 0, c->r.init, &s0, &s1);
            ET_DW_PUT(q, s0);
            ET_DW_PUT(q + 1, s1);
        }
    if (sw == 2 && words == 2 && kw <= 7) {
        const int seven = kw == 7;
        for (; q + 2 <= wo; q += 2) {
            int32_t s0, s1;
            et_dwk_pair(rows, 0, 0, 2 * q, c, kh, 2, seven, c->r.init, &s0, &s1);
            ET_DW_PUT(q, s0);
            ET_DW_PUT(q + 1, s1);
        }
    }
    for (; q < wo; q++) {
        int32_t s = c->r.init;
        for (int32_t i = 0; i < kh; i++) {
            const int8_t *xp = rows[i] + q * sw;
            for (int32_t k = 0; k < words; k++) {
                const uint32_t u = (uint32_t)et_ld32s(xp + 4 * k);
                s = __smlad(c->wpk[i][k][0], __sxtb16((int32_t)u), s);
                s = __smlad(c->wpk[i][k][1], et_sxtb16_ror8(u), s);
            }
        }
        ET_DW_PUT(q, s);
    }
}
#undef ET_DW_PUT

/* A row of a channel off the fast requantization path (a float output, or a channel whose
 * requantization et_rq_make could not put on it): a pixel at a time over the taps, each sum
 * through the general path (et_rq_put). Out of line and cold, once for every shape: such
 * channels are rare (of the paper's three models, a few of proxyless-w0.3's), and SIMD rows
 * compiled for them as well as for the fast path took 0.5-3.4 KB of a model's flash. The same
 * integer sums as the SIMD rows. */
static __attribute__((noinline, cold)) void et_dw_row_slow(const int8_t *const *rows, const int8_t *taps,
                                                           const et_rq *r, const et_qconv_p *P, const int32_t *bias,
                                                           int32_t o, int8_t *y, float *yf, int32_t at) {
    const int32_t kh = P->kh, kw = P->kw, sw = P->sw;
    for (int32_t q = 0; q < P->wo; q++) {
        int32_t s = r->init;
        for (int32_t i = 0; i < kh; i++)
            for (int32_t j = 0; j < kw; j++) s += taps[i * kw + j] * rows[i][q * sw + j];
        et_rq_put(P, bias, r, o, s, y, yf, at + q);
    }
}

/* the taps of one channel packed (3x3 into registers' worth, others per tap row) */
static inline void et_dw_pack(const int8_t *taps, int32_t kh, int32_t kw, et_dwc *c) {
    if (kh == 3 && kw == 3) {
        c->e0 = et_pack16(taps[0], taps[2]);
        c->e1 = et_pack16(taps[3], taps[5]);
        c->e2 = et_pack16(taps[6], taps[8]);
        c->m01 = et_pack16(taps[1], taps[4]);
        c->m2 = taps[7];
        return;
    }
    for (int32_t i = 0; i < kh; i++) {
        int8_t t[8] = {0, 0, 0, 0, 0, 0, 0, 0}; /* the row, zero past kw */
        for (int32_t j = 0; j < kw; j++) t[j] = taps[i * kw + j];
        c->wpk[i][0][0] = et_pack16(t[0], t[2]);
        c->wpk[i][0][1] = et_pack16(t[1], t[3]);
        c->wpk[i][1][0] = et_pack16(t[4], t[6]);
        c->wpk[i][1][1] = et_pack16(t[5], t[7]);
    }
}

static ET_DSP_NOINLINE void et_qconv_dw_rows(const et_qconv_p *P, et_rows8 x, int32_t xc_off, const et_w8 *w,
                                             const int32_t *bias, et_rows8 y, float *yf, int32_t yo_off, int32_t r0,
                                             int32_t r1, int32_t o0, int32_t o1) {
    const int32_t kh = P->kh, kw = P->kw, khkw = kh * kw, words = (kw + 3) / 4, opg = P->o / P->groups;
    const int32_t rb = et_dw_row_bytes(P), mask = et_dw_slots(P) - 1, wo = P->wo, sw = P->sw;
    const int three = ET_DW_IS(ET_DW_K3, kh, kw), five = ET_DW_IS(ET_DW_K5, kh, kw);
    const int seven = ET_DW_IS(ET_DW_K7, kh, kw);
    /* the input rows of the call's output rows, when they fit, copied once per channel at a
     * fixed stride (rows outside the image stay x_zero); else the ring */
    const int32_t first = r0 * P->sh - P->ph, nrows = (r1 - 1 - r0) * P->sh + kh;
    const int block = nrows * rb <= ET_DW_PAD;
    int8_t pad[ET_DW_PAD] __attribute__((aligned(4)));
    int8_t *zrow = pad + (mask + 1) * rb;
    memset(pad, (uint8_t)P->x_zero, (size_t)(block ? nrows * rb : (mask + 2) * rb));
    int8_t *yp = yf ? 0 : y.p;
    /* the block's rows in the image, [j0, j1), and whether they follow each other in x's ring */
    const int32_t j0 = first < 0 ? -first : 0, j1 = nrows < P->h - first ? nrows : P->h - first;
    const int x_run = block && j1 > j0 && et_ring_run(first + j0, first + j1 - 1, x.cap);
#if defined(__ARM_FEATURE_MVE)
    const int plane = 0; /* the Helium rows instead (et_mve_dw_row) */
#else
    /* a channel on the fast path as one loop of pixel pairs (et_dw_plane): the output rows in a
     * row of the ring (a whole tensor's, or no wrap among them) */
    const int plane = block && (wo & 1) == 0 && (sw == 1 || sw == 2) && (three || five || seven) &&
                      (ET_DW_PLANES & et_dw_plane_bit(three, five, sw)) && et_ring_run(r0, r1 - 1, y.cap);
#endif
    et_dwc c;
    for (int32_t n = 0; n < P->n; n++)
        for (int32_t o = o0; o < o1; o++) {
            const int8_t *taps = et_w8_taps(w, o, 0, 1, khkw);
            c.r = et_rq_make(P, bias, o, khkw, et_wsum(taps, khkw), yf);
            et_dw_pack(taps, kh, kw, &c);
            const int8_t *xc = x.p + n * x.nstride + (o / opg - xc_off) * x.cstride;
            int32_t held[ET_DW_TAPS];
            for (int32_t i = 0; i <= mask; i++) held[i] = -1;
            if (x_run)
                et_copy_rows(pad + j0 * rb + P->pw, rb, xc + et_ring(first + j0, x.cap) * P->w, P->w, j1 - j0);
            else
                for (int32_t j = j0; block && j < j1; j++)
                    et_copy8(pad + j * rb + P->pw, xc + et_ring(first + j, x.cap) * P->w, P->w);
            if (__builtin_expect(plane && c.r.fast, 1)) {
                int8_t *yr = yp + n * y.nstride + (o - yo_off) * y.cstride + et_ring(r0, y.cap) * wo;
                /* a loop left out (ET_DW_PLANES) is never called: `plane` is 0 for its layers */
#define ET_DW_PLANE_CALL(BIT, NAME)                                                                    \
    do {                                                                                             \
        if (ET_DW_PLANES & (BIT)) NAME(pad, rb, r1 - r0, wo, &c, yr);                                \
    } while (0)
                if (three && sw == 1) ET_DW_PLANE_CALL(ET_DW_P3S1, et_dw3_plane_s1);
                else if (three) ET_DW_PLANE_CALL(ET_DW_P3S2, et_dw3_plane_s2);
                else if (five) {
                    if (sw == 1) ET_DW_PLANE_CALL(ET_DW_P5S1, et_dw5_plane_s1);
                    else ET_DW_PLANE_CALL(ET_DW_P5S2, et_dw5_plane_s2);
                } else if (seven) {
                    if (sw == 1) ET_DW_PLANE_CALL(ET_DW_P7S1, et_dw7_plane_s1);
                    else ET_DW_PLANE_CALL(ET_DW_P7S2, et_dw7_plane_s2);
                }
#undef ET_DW_PLANE_CALL
                continue;
            }
            for (int32_t ho = r0; ho < r1; ho++) {
                const int8_t *rows[ET_DW_TAPS];
                for (int32_t i = 0; block && i < kh; i++) rows[i] = pad + ((ho - r0) * P->sh + i) * rb;
                for (int32_t i = 0; !block && i < kh; i++) {
                    const int32_t hi = ho * P->sh - P->ph + i;
                    if (hi < 0 || hi >= P->h) {
                        rows[i] = zrow;
                        continue;
                    }
                    int8_t *slot = pad + (hi & mask) * rb;
                    if (held[hi & mask] != hi) {
                        et_copy8(slot + P->pw, xc + et_ring(hi, x.cap) * P->w, P->w);
                        held[hi & mask] = hi;
                    }
                    rows[i] = slot;
                }
                const int32_t at = n * y.nstride + (o - yo_off) * y.cstride + et_ring(ho, y.cap) * wo;
#if defined(__ARM_FEATURE_MVE)
                if (et_mve_dw_ok(sw)) { /* four pixels a vector (et_int8_mve.h) */
                    et_mve_dw_row(rows, taps, &c.r, kh, kw, wo, sw, P, bias, o, yp, yf, at);
                    continue;
                }
#endif
                if (!c.r.fast) et_dw_row_slow(rows, taps, &c.r, P, bias, o, yp, yf, at);
                else if (three) et_dw3_row(rows, &c, wo, sw, yp, at);
                else if (five || seven || ET_DW_HAS(ET_DW_KOTHER)) et_dwk_row(rows, &c, kh, kw, words, wo, sw, yp, at);
            }
        }
}
#endif /* __ARM_FEATURE_DSP */
#endif /* ET_INT8_DW_H */
