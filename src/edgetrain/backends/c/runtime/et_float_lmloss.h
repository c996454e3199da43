/* edgetrain C runtime: kernels of ops/lmloss.py (issue 32). */
#ifndef ET_FLOAT_LMLOSS_H
#define ET_FLOAT_LMLOSS_H
#endif
