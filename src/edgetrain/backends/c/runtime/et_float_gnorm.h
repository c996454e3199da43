/* edgetrain C runtime: float kernels of gnorm (see kernels/float32_*.py). Header-only. */
#ifndef ET_FLOAT_GNORM_H
#define ET_FLOAT_GNORM_H
#include "et_common.h"

#endif
