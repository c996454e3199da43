/* edgetrain C runtime: float kernels of pointwise (see kernels/float32_*.py). Header-only. */
#ifndef ET_FLOAT_POINTWISE_H
#define ET_FLOAT_POINTWISE_H
#include "et_common.h"

#endif
