"""Float kernels of ops/conv_nd.py (conv3d, conv_transpose2d and their backward ops): runtime/et_float_conv_nd.h."""
