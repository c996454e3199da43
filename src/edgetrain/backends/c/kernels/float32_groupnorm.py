"""Float kernels of ops/groupnorm.py: runtime/et_float_gnorm.h."""
