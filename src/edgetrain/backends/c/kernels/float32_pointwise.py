"""Float kernels of ops/pointwise.py and ops/select.py: runtime/et_float_pointwise.h."""
