/* edgetrain C runtime: the int8 programs' per-channel float32 factors (weight scales, gradient
 * and QAS factors of the backward and updates) stored as a fit to the forward's requantization
 * multipliers plus packed fixes (backends/c/kernels/int8_scales.py writes them and checks every
 * channel bit for bit). Included by et_int8.h. Header-only. */
#ifndef ET_INT8_SCALES_H
#define ET_INT8_SCALES_H
#include <stdint.h>
#include "et_int8_core.h" /* et_rq_mult_at, et_rq_shift_at: packed multipliers */

/* ---- per-channel float32 factors of the backward and updates (kernels/int8_scales.py) ----
 * value[c] = the float32 k * b[c] (inv_sq 0) or k / (b[c] * b[c]) (inv_sq 1), its bit pattern
 * moved by fix[c], a signed field of fix_bits (2, 4 or 8; 0: no fix) bits packed from the lowest
 * bit of fix[0] up; b[c] = base[c], or, with base 0, the layer's requantization multiplier
 * (float)mult[c] (rounded to nearest) times 2^shift[c] (exact; packed as et_qconv_p's where shift is 0:
 * et_rq_mult_at, with shift0). The compiler checked, channel by channel, that this is
 * the table's value exactly, so a layer's gradient and update factors take a quarter byte to a
 * byte a channel beside the forward's multipliers instead of four. A table kept whole is
 * {table, 0, 0, 0, 1.0f, 0, 0}. */
typedef struct {
    const float *base;
    const int32_t *mult;
    const int8_t *shift;
    const uint8_t *fix;
    float k;
    int8_t inv_sq, fix_bits, shift0; /* in the 4 bytes after k: the struct stays 24 bytes on 32-bit targets */
} et_fscale;

/* 2^k as a float32 for k in [-126, 127] (from its exponent bits: exact, no libm) */
static inline float et_pow2f(int32_t k) {
    union { uint32_t i; float f; } u = {(uint32_t)(k + 127) << 23};
    return u.f;
}

static inline float et_fscale_at(const et_fscale *S, int32_t c) {
    const float b = S->base ? S->base[c]
                            : (float)et_rq_mult_at(S->mult, S->shift, c) *
                                  et_pow2f(et_rq_shift_at(S->mult, S->shift, S->shift0, c));
    union { float f; int32_t i; } u;
    u.f = S->inv_sq ? S->k / (b * b) : S->k * b;
    if (S->fix_bits) {
        const int32_t bit = c * S->fix_bits; /* the field's lowest bit */
        const uint32_t field = (uint32_t)S->fix[bit >> 3] << (32 - S->fix_bits - (bit & 7));
        u.i += (int32_t)field >> (32 - S->fix_bits); /* sign-extended */
    }
    return u.f;
}

#endif /* ET_INT8_SCALES_H */
