/* edgetrain C runtime: int8 pointwise activations (ops/qpointwise.py): qleaky_relu and its
 * backward. Header-only; needs et_int8.h (et_mbqm, et_clampi) included before it. */
#ifndef ET_INT8_POINTWISE_H
#define ET_INT8_POINTWISE_H
#include "et_int8.h"

/* y = zero + d for d = x - zero > 0, else zero + et_mbqm(d, mult, shift): the negative slope in
 * Q31 fixed point, gemmlowp's rounding (the reference's multiply_by_quantized_multiplier) */
static inline void et_qleaky_relu(const int8_t *x, int8_t *y, int32_t count, int32_t zero, int32_t mult,
                                  int32_t shift) {
    for (int32_t k = 0; k < count; k++) {
        const int32_t d = (int32_t)x[k] - zero;
        y[k] = (int8_t)et_clampi((d > 0 ? d : et_mbqm(d, mult, shift)) + zero, -128, 127);
    }
}

/* g where the output's mask bit is set (it was above the zero point), else g * slope (float32) */
static inline void et_qleaky_relu_grad(const float *g, const uint8_t *m, float *out, int32_t count, float slope) {
    for (int32_t k = 0; k < count; k++) out[k] = ((m[k >> 3] >> (k & 7)) & 1u) ? g[k] : g[k] * slope;
}

#endif
