/* edgetrain C runtime: float kernels of conv_nd (see kernels/float32_*.py). Header-only. */
#ifndef ET_FLOAT_CONV_ND_H
#define ET_FLOAT_CONV_ND_H
#include "et_common.h"

#endif
