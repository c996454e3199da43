"""Float kernels of ops/qweights.py: runtime/et_float_qweights.h. (Filled in by issue 32.)"""
from __future__ import annotations
