/* edgetrain C runtime: float kernels of the shape ops et_float.h and et_float_nn.h lack:
 * pad (a constant border), gather along a dim and its gradient (a scatter-add).
 *
 * Tensors are row-major of any rank up to ET_SHAPE_MAX_RANK, their shapes passed as arrays.
 * The kernels are written once and instantiated for float (suffix _f) and double (suffix _d):
 * this header includes itself once per element type with ET_SH_T / ET_SH defined. Header-only. */
#ifndef ET_FLOAT_SHAPE_H
#define ET_FLOAT_SHAPE_H
#include "et_common.h"
#include <string.h>

/* the highest rank of a tensor these kernels take (the emitters check it) */
#define ET_SHAPE_MAX_RANK 8

/* element i of an index operand: int64 (idx64 != 0) or int32 */
ET_INLINE int64_t et_shape_index(const void *idx, int idx64, long i) {
    return idx64 ? ((const int64_t *)idx)[i] : (int64_t)((const int32_t *)idx)[i];
}

/* row-major strides (in elements) of a shape */
ET_INLINE void et_shape_strides(int rank, const long *shape, long *strides) {
    long s = 1;
    for (int d = rank - 1; d >= 0; --d) { strides[d] = s; s *= shape[d]; }
}

/* the next multi-index of a counter over `shape` (the last dim fastest) */
ET_INLINE void et_shape_next(int rank, const long *shape, long *at) {
    for (int d = rank - 1; d >= 0; --d) {
        if (++at[d] < shape[d]) return;
        at[d] = 0;
    }
}

#define ET_SH_T float
#define ET_SH(name) name##_f
#include "et_float_shape.h"
#undef ET_SH_T
#undef ET_SH
#define ET_SH_T double
#define ET_SH(name) name##_d
#include "et_float_shape.h"
#undef ET_SH_T
#undef ET_SH

#elif defined(ET_SH_T) /* ---- the array kernels, for element type ET_SH_T ------------------------- */

/* Y = X with before[d] elements of `value` in front of dim d and after[d] behind it; X has
 * shape xs (rank >= 1), Y shape xs[d] + before[d] + after[d]. Each row of X (its last dim)
 * is copied once. */
static inline void
ET_SH(et_pad)(const ET_SH_T *X, ET_SH_T *Y, int rank, const long *xs, const long *before, const long *after,
              ET_SH_T value) {
    long ys[ET_SHAPE_MAX_RANK], ystr[ET_SHAPE_MAX_RANK], at[ET_SHAPE_MAX_RANK];
    long ny = 1, rows = 1;
    for (int d = 0; d < rank; ++d) {
        ys[d] = xs[d] + before[d] + after[d];
        ny *= ys[d];
        if (d < rank - 1) rows *= xs[d];
        at[d] = 0;
    }
    for (long i = 0; i < ny; ++i) Y[i] = value;
    const long inner = xs[rank - 1];
    if (inner == 0) return;
    et_shape_strides(rank, ys, ystr);
    for (long r = 0; r < rows; ++r) {
        long off = before[rank - 1];
        for (int d = 0; d < rank - 1; ++d) off += (at[d] + before[d]) * ystr[d];
        memcpy(Y + off, X + r * inner, (size_t)inner * sizeof(ET_SH_T));
        et_shape_next(rank - 1, xs, at);
    }
}

/* Y[i] = X[i with its coordinate along `dim` replaced by idx[i]]; Y and idx have shape is,
 * X shape xs (is[d] <= xs[d] for d != dim). An index out of range reports and reads 0. */
static inline void
ET_SH(et_gather)(const ET_SH_T *X, const void *idx, int idx64, ET_SH_T *Y, int rank, const long *xs,
                 const long *is, int dim) {
    long xstr[ET_SHAPE_MAX_RANK], at[ET_SHAPE_MAX_RANK];
    long n = 1;
    for (int d = 0; d < rank; ++d) { n *= is[d]; at[d] = 0; }
    et_shape_strides(rank, xs, xstr);
    for (long i = 0; i < n; ++i) {
        const int64_t k = et_shape_index(idx, idx64, i);
        if (k < 0 || k >= xs[dim]) {
            ET_ERROR_HOOK("gather: index out of range");
            Y[i] = 0;
        } else {
            long off = 0;
            for (int d = 0; d < rank; ++d) off += (d == dim ? (long)k : at[d]) * xstr[d];
            Y[i] = X[off];
        }
        et_shape_next(rank, is, at);
    }
}

/* GX of gather: zeros of shape xs, then each G[i] added at the position gather read it from
 * (in index order, so repeated indices accumulate) */
static inline void
ET_SH(et_gather_grad)(const ET_SH_T *G, const void *idx, int idx64, ET_SH_T *GX, int rank, const long *xs,
                      const long *is, int dim) {
    long xstr[ET_SHAPE_MAX_RANK], at[ET_SHAPE_MAX_RANK];
    long n = 1, nx = 1;
    for (int d = 0; d < rank; ++d) { n *= is[d]; nx *= xs[d]; at[d] = 0; }
    for (long i = 0; i < nx; ++i) GX[i] = 0;
    et_shape_strides(rank, xs, xstr);
    for (long i = 0; i < n; ++i) {
        const int64_t k = et_shape_index(idx, idx64, i);
        if (k < 0 || k >= xs[dim]) {
            ET_ERROR_HOOK("gather_grad: index out of range");
        } else {
            long off = 0;
            for (int d = 0; d < rank; ++d) off += (d == dim ? (long)k : at[d]) * xstr[d];
            GX[off] += G[i];
        }
        et_shape_next(rank, is, at);
    }
}

#endif /* ET_FLOAT_SHAPE_H */
