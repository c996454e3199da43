"""Float kernels of ops/pool_nd.py and ops/resample.py (3-D and adaptive pooling, upsampling): runtime/et_float_resample.h."""
