/* edgetrain C runtime: weights stored quantized (frozen="int8" / "int4"), dequantized on the
 * fly a row at a time; the layout is ops/qweights.py's (int8: per row scale; int4: two
 * nibbles a byte, low nibble first, a float32 scale per group of `group` inputs). The kernels
 * of ops/qweights.py are added by issue 32. */
#ifndef ET_FLOAT_QWEIGHTS_H
#define ET_FLOAT_QWEIGHTS_H
#include <stdint.h>

/* row `row` of a (out, in) weight stored with `bits` (8 or 4) into dst[0..in) */
#define ET_QW_ROW(SUF, T)                                                                          \
    static inline void et_qw_row_##SUF(T *dst, const int8_t *wq, const float *scale, int64_t row,  \
                                       int64_t in, int bits, int group) {                          \
        if (bits == 8) {                                                                           \
            const int8_t *q = wq + row * in;                                                       \
            const T s = (T)scale[row];                                                             \
            for (int64_t i = 0; i < in; ++i) dst[i] = (T)q[i] * s;                                 \
            return;                                                                                \
        }                                                                                          \
        const uint8_t *b = (const uint8_t *)wq + row * ((in + 1) / 2);                            \
        const float *sc = scale + row * ((in + group - 1) / group);                                \
        for (int64_t i = 0; i < in; ++i) {                                                         \
            int v = (i & 1) ? (b[i >> 1] >> 4) : (b[i >> 1] & 0xF);                              \
            v = v > 7 ? v - 16 : v;                                                                \
            dst[i] = (T)v * (T)sc[i / group];                                                      \
        }                                                                                          \
    }
ET_QW_ROW(f, float)
ET_QW_ROW(d, double)
#undef ET_QW_ROW

#endif
