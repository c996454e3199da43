"""Float kernels of ops/lmloss.py: runtime/et_float_lmloss.h. (Filled in by issue 32.)"""
from __future__ import annotations
