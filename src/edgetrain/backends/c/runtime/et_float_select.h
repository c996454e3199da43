/* edgetrain C runtime: kernels of selection and scans (kernels/float32_select.py): cumsum for
 * float (_f), double (_d), int32 (_i32) and int64 (_i64) values, and the wrapping of an index
 * of index_put / index_get. where, index_put and index_get themselves are emitted as loops with
 * constant bounds (their operands broadcast).
 *
 * cumsum of X viewed as [outer][D][inner], along D (from its end when `reverse`): float and
 * double sums accumulate in double, each result rounded once (torch's CPU kernel accumulates
 * float in double); integer sums wrap around in the unsigned type of their width, as numpy's.
 * This header includes itself once per element type with ET_SEL_T (the element type),
 * ET_SEL_ACC (the accumulator's type) and ET_SEL (the name's suffix) defined. Header-only. */
#ifndef ET_FLOAT_SELECT_H
#define ET_FLOAT_SELECT_H
#include "et_common.h"

/* index q of a dim of `size` (negative: from the end) as a position in [0, size), or -1 when out of range */
ET_INLINE int64_t et_sel_position(int64_t q, int64_t size) {
    if (q < 0) q += size;
    return q >= 0 && q < size ? q : -1;
}

#define ET_SEL_T float
#define ET_SEL_ACC double
#define ET_SEL(name) name##_f
#include "et_float_select.h"
#undef ET_SEL_T
#undef ET_SEL_ACC
#undef ET_SEL
#define ET_SEL_T double
#define ET_SEL_ACC double
#define ET_SEL(name) name##_d
#include "et_float_select.h"
#undef ET_SEL_T
#undef ET_SEL_ACC
#undef ET_SEL
#define ET_SEL_T int32_t
#define ET_SEL_ACC uint32_t
#define ET_SEL(name) name##_i32
#include "et_float_select.h"
#undef ET_SEL_T
#undef ET_SEL_ACC
#undef ET_SEL
#define ET_SEL_T int64_t
#define ET_SEL_ACC uint64_t
#define ET_SEL(name) name##_i64
#include "et_float_select.h"
#undef ET_SEL_T
#undef ET_SEL_ACC
#undef ET_SEL

#elif defined(ET_SEL_T) /* ---- cumsum, for element type ET_SEL_T ------------------------------- */

static inline void
ET_SEL(et_cumsum)(const ET_SEL_T *X, ET_SEL_T *Y, long outer, long D, long inner, int reverse) {
    for (long o = 0; o < outer; ++o)
        for (long t = 0; t < inner; ++t) {
            const size_t base = (size_t)o * D * inner + t;
            ET_SEL_ACC s = 0;
            for (long k = 0; k < D; ++k) {
                const size_t i = base + (size_t)(reverse ? D - 1 - k : k) * inner;
                s += (ET_SEL_ACC)X[i];
                Y[i] = (ET_SEL_T)s;
            }
        }
}

#endif /* ET_FLOAT_SELECT_H */
