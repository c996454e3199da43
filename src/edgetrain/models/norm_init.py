"""The zoo's random normalisation parameters (models/__init__.py `_init`, mlperf_tiny.py's
BatchNorm1d): eval-mode normalisation is then never the identity, so gradient tests exercise
all of it."""

#: batch-norm and layer-norm affine parameters: weight ~ U(range), bias ~ N(0, std)
NORM_SCALE_RANGE, NORM_SHIFT_STD = (0.5, 1.5), 0.1
#: batch-norm running statistics: mean ~ N(0, std), var ~ U(range)
BN_MEAN_STD, BN_VAR_RANGE = 0.1, (0.5, 1.5)
