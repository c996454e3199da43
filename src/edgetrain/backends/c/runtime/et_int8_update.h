/* edgetrain int8 training: the qsgd update of one row of a weight's (selected) gradient,
 * bit-identical to ops/qoptim.py (the counter hash of et_int8.h, stochastic rounding, the
 * integer bounds). Kept apart from et_int8_grad.h (the float32 backward); the numerics contract
 * is et_int8.h's: elementwise float32 arithmetic, compiled with -ffp-contract=off.
 */
#ifndef ET_INT8_UPDATE_H
#define ET_INT8_UPDATE_H

#include "et_int8.h"

/* ---- qsgd_update: one row of the (selected) gradient ----------------------------------- */
typedef struct {
    float lr, momentum, weight_decay;
    int32_t qmin, qmax;
    uint32_t seed, param_id;
} et_qsgd_p;

/* Update one row of `len` gradient elements g (momentum row m, or 0). Element e is the
 * full tensor's flat element flat0 + e, or, with idx (dense weights trained on some input
 * channels), flat0 + idx[e / khkw] * khkw + e % khkw. It is stored at wq[flat] when
 * `full` (the whole tensor in one array), else at wq[pos0 + e] (a split weight's trained
 * part, or a whole row). wq is int8 when w8, else int32. */
/* floor(t) as an int32 for t already clamped to [qmin, qmax] (integers, so clamping before
 * the floor equals clamping after it); t >= 2^31 (float(INT32_MAX)) is INT32_MAX. With an FPv5
 * FPU (the Cortex-M7's; the firmware build defines ET_FPV5) one VRINTM, else the truncation
 * corrected by one: the same integer for every t (NaN included: both convert it alike). */
static inline int32_t et_floor_level(float t) {
    if (t >= 2147483648.0f) return INT32_MAX;
#ifdef ET_FPV5
    return (int32_t)__builtin_floorf(t);
#else
    const int32_t i = (int32_t)t;
    return i - ((float)i > t);
#endif
}

static inline void et_qsgd_row(const et_qsgd_p *P, uint32_t key, void *wq, int32_t w8, int32_t full,
                               int32_t pos0, const float *g, float *m, float scale, int32_t len, uint32_t flat0,
                               const uint16_t *idx, int32_t khkw) {
    /* the parameters in locals: the int8 stores below may alias P, so gcc would reload them */
    const float lr = P->lr, mom = P->momentum, wd = P->weight_decay;
    const float lo = (float)P->qmin, hi = (float)P->qmax;
    for (int32_t e = 0; e < len; e++) {
        const uint32_t flat = idx ? flat0 + (uint32_t)idx[e / khkw] * (uint32_t)khkw + (uint32_t)(e % khkw)
                                  : flat0 + (uint32_t)e;
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

#endif /* ET_INT8_UPDATE_H */
