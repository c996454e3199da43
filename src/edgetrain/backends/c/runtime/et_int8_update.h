/* edgetrain int8 training: the qsgd update of one row of a weight's (selected) gradient,
 * bit-identical to ops/qoptim.py (the counter hash of et_int8.h, stochastic rounding, the
 * integer bounds). Kept apart from et_int8_grad.h (the float32 backward); the numerics contract
 * is et_int8.h's: elementwise float32 arithmetic, compiled with -ffp-contract=off.
 */
#ifndef ET_INT8_UPDATE_H
#define ET_INT8_UPDATE_H

#include "et_int8.h"

/* ---- qsgd_update: one row of the (selected) gradient ----------------------------------- */
/* The optimizer's settings, the same for every parameter of a program (so the constant pool
 * keeps one copy of each kind); the parameter's number goes into the hash key at the call. */
typedef struct {
    float lr, momentum, weight_decay;
    int32_t qmin, qmax;
    uint32_t seed;
} et_qsgd_p;

/* floor(t) as an int32 for t < 2^31 already clamped to [qmin, qmax] (integers, so clamping
 * before the floor equals clamping after it). With an FPv5 FPU (the Cortex-M7's; the firmware
 * build defines ET_FPV5) one VRINTM, else the truncation corrected by one: the same integer for
 * every t (NaN included: both convert it alike). */
static inline int32_t et_floor_below(float t) {
#ifdef ET_FPV5
    return (int32_t)__builtin_floorf(t);
#else
    const int32_t i = (int32_t)t;
    return i - ((float)i > t);
#endif
}

/* the same for any t: t >= 2^31 (float(INT32_MAX)) is INT32_MAX */
static inline int32_t et_floor_level(float t) {
    if (t >= 2147483648.0f) return INT32_MAX;
    return et_floor_below(t);
}

/* Update one row of `len` gradient elements g (momentum row m, or 0), the gradient scaled by
 * the row's factor S[channel] (et_fscale_at). Element e is the full tensor's flat element
 * flat0 + e, or, with idx (dense weights trained on some input channels), flat0 + idx[e / khkw]
 * * khkw + e % khkw. It is stored at wq[flat] when `full` (the whole tensor in one array), else
 * at wq[pos0 + e] (a split weight's trained part, or a whole row). wq is int8 when w8, else
 * int32. Out of line: one copy for every update of a program, not one inlined per layer. */
__attribute__((noinline, unused)) static void et_qsgd_row(const et_qsgd_p *P, uint32_t key, void *wq, int32_t w8,
                                                          int32_t full, int32_t pos0, const float *g, float *m,
                                                          const et_fscale *S, int32_t channel, int32_t len,
                                                          uint32_t flat0, const uint16_t *idx, int32_t khkw) {
    const float scale = et_fscale_at(S, channel);
    /* the parameters in locals: the int8 stores below may alias P, so gcc would reload them */
    const float lr = P->lr, mom = P->momentum, wd = P->weight_decay;
    const float lo = (float)P->qmin, hi = (float)P->qmax;
    for (int32_t e = 0, j = 0, tap = 0; e < len; e++) { /* e = j * khkw + tap with idx */
        const uint32_t flat = idx ? flat0 + (uint32_t)idx[j] * (uint32_t)khkw + (uint32_t)tap : flat0 + (uint32_t)e;
        if (idx && ++tap == khkw) {
            tap = 0;
            j++;
        }
        const int32_t at = full ? (int32_t)flat : pos0 + e;
        const int32_t wi = w8 ? (int32_t)((int8_t *)wq)[at] : ((int32_t *)wq)[at];
        const float wf = (float)wi;
        float d = g[e] * scale;
        if (wd != 0.0f) d = d + wd * wf;
        if (m) {
            d = mom * m[e] + d;
            m[e] = d;
        }
        const float v = wf - lr * d;
        float t = v + et_uniform(key, flat);
        if (t < lo) t = lo;
        if (t > hi) t = hi;
        const int32_t q = et_floor_level(t);
        if (w8) ((int8_t *)wq)[at] = (int8_t)q;
        else ((int32_t *)wq)[at] = q;
    }
}

/* et_qsgd_row for the common updates, as kernels/int8_grad.py picks them: no momentum, no weight
 * decay, the bounds passes/updates.py gives (int8 +-127, int32 +-2^24), rows k0 .. k0 + rows - 1
 * of row_len elements stored one after another at w + k * row_len (a whole tensor, or a split
 * weight's trained part), row k being the tensor's row sel[k] (the selected output channels;
 * sel 0: row k) and its gradient at g + (k - k0) * row_len. The same operations in the same
 * order as et_qsgd_row; the bounds are constants below 2^31, so the floor needs no range test. */
#define ET_QSGD_PLAIN(NAME, T, BOUND)                                                                          \
    __attribute__((noinline, unused)) static void NAME(const et_qsgd_p *P, uint32_t key, T *w, const float *g, \
                                                       const et_fscale *S, const uint16_t *sel, int32_t k0,     \
                                                       int32_t rows, int32_t row_len) {                         \
        const float lr = P->lr;                                                                                 \
        for (int32_t k = k0; k < k0 + rows; k++, g += row_len) {                                                \
            const int32_t row = sel ? (int32_t)sel[k] : k;                                                      \
            const float scale = et_fscale_at(S, row);                                                           \
            const uint32_t flat0 = (uint32_t)row * (uint32_t)row_len;                                           \
            T *wr = w + k * row_len;                                                                            \
            for (int32_t e = 0; e < row_len; e++) {                                                             \
                const float wf = (float)wr[e];                                                                  \
                const float d = g[e] * scale;                                                                   \
                const float v = wf - lr * d;                                                                    \
                float t = v + et_uniform(key, flat0 + (uint32_t)e);                                             \
                if (t < -(BOUND)) t = -(BOUND);                                                                 \
                if (t > (BOUND)) t = (BOUND);                                                                   \
                wr[e] = (T)et_floor_below(t);                                                                   \
            }                                                                                                   \
        }                                                                                                       \
    }
ET_QSGD_PLAIN(et_qsgd_rows_i8, int8_t, 127.0f)
ET_QSGD_PLAIN(et_qsgd_rows_i32, int32_t, 16777216.0f)

#endif /* ET_INT8_UPDATE_H */
