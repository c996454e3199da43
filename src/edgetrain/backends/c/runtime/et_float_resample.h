/* edgetrain C runtime: float kernels of resample (see kernels/float32_*.py). Header-only. */
#ifndef ET_FLOAT_RESAMPLE_H
#define ET_FLOAT_RESAMPLE_H
#include "et_common.h"

#endif
