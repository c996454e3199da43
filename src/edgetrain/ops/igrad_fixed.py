"""Fixed-point arithmetic of the integer-only backward (`backward="integer"`, ops/igrad.py).

A gradient tensor is int16 q standing for q * 2**e, one static exponent e per tensor (the
pass quantize/integer_backward.py chooses it). Every function works on numpy int64 arrays
and computes exactly what the C kernels (runtime/et_igrad.h) compute with int32 / int64
integers: arithmetic right shifts floor, as gcc's do on signed values.
"""
from __future__ import annotations

import math

import numpy as np

from .qoptim import hash_bits

INT16_MIN, INT16_MAX = -(2 ** 15), 2 ** 15 - 1
#: a per-channel multiplier's mantissa lies in [2**MULT_BITS, 2**(MULT_BITS + 1)): a product
#: of it with an int16 x int8 term (< 2**22) stays below 2**38, and sums of 2**24 of those in int64
MULT_BITS = 14
#: shifts stay within +-MAX_SHIFT (an int64 shifted further is 0; the C kernels store them as int8)
MAX_SHIFT = 62
#: the fraction bits of an update in weight steps: Q16 (stochastic rounding takes the top 16
#: bits of the counter hash as its uniform number)
UPDATE_FRAC = 16
#: an accumulator is clamped to +-2**ACC_CLAMP_BITS before a multiplier (< 2**15) applies, so
#: the product stays inside int64 (a clamped one moves the weight to its bound anyway)
ACC_CLAMP_BITS = 47


def rshift_round(v: np.ndarray, shift: np.ndarray | int) -> np.ndarray:
    """v * 2**-shift rounded half up (floor(v / 2**s + 1/2)); shift <= 0 shifts left."""
    v = np.asarray(v, dtype=np.int64)
    s = np.asarray(shift, dtype=np.int64)
    right = np.maximum(s, 0)
    half = np.where(right > 0, np.left_shift(np.int64(1), np.maximum(right - 1, 0)), 0)
    return np.where(s > 0, np.right_shift(v + half, right), np.left_shift(v, np.maximum(-s, 0)))


def saturate16(v: np.ndarray) -> np.ndarray:
    return np.clip(v, INT16_MIN, INT16_MAX).astype(np.int16)


def mantissa_shift(real: float, extra: int = 0) -> tuple[int, int]:
    """(m, s) with real * 2**extra ~= m * 2**-s, m in [2**MULT_BITS, 2**(MULT_BITS + 1)) (0, 0 for 0)."""
    if not math.isfinite(real) or real < 0:
        raise ValueError(f"an integer-backward multiplier must be finite and >= 0, got {real}")
    if real == 0.0:
        return 0, 0
    frac, exp = math.frexp(real)  # real = frac * 2**exp, frac in [0.5, 1)
    m = int(math.floor(frac * 2 ** (MULT_BITS + 1) + 0.5))
    s = MULT_BITS + 1 - exp - extra
    if m == 2 ** (MULT_BITS + 1):
        m, s = m // 2, s - 1
    if s > MAX_SHIFT:  # below one unit of any int64 product it scales: zero
        return 0, 0
    if s < -MAX_SHIFT:
        raise ValueError(f"an integer-backward multiplier {real} * 2**{extra} is too large for int64 fixed point")
    return m, s


def exponent_for(max_abs: float, target_bits: int) -> int:
    """The exponent e with max_abs / 2**e just below 2**target_bits."""
    if not max_abs > 0 or not math.isfinite(max_abs):
        return -24
    return int(math.ceil(math.log2(max_abs))) - target_bits


# --- exp and log in Q16 (the integer softmax cross entropy, ops/icross_entropy.py) --------
Q16 = 16
LOG2E_Q16 = int(round(math.log2(math.e) * 2 ** Q16))  # 94548
LN2_Q16 = int(round(math.log(2) * 2 ** Q16))  # 45426
TABLE_BITS = 8  # 256 table steps, linear interpolation between them
#: 2**(-j/256) in Q30, j = 0..256
EXP2_NEG_Q30 = tuple(int(round(2.0 ** (-j / 256) * 2 ** 30)) for j in range(257))
#: log2(1 + j/256) in Q16, j = 0..256
LOG2_1P_Q16 = tuple(int(round(math.log2(1 + j / 256) * 2 ** Q16)) for j in range(257))
#: exp(d) with d below -EXP_FLOOR (Q16 units) is under Q16's resolution: d is clamped there
EXP_FLOOR = 24 << Q16


def _interp(table: np.ndarray, f: np.ndarray) -> np.ndarray:
    """table[j] + (table[j + 1] - table[j]) * r / 256 (floored), f = j * 256 + r in [0, 2**16)."""
    j, r = f >> TABLE_BITS, f & ((1 << TABLE_BITS) - 1)
    lo, hi = table[j], table[j + 1]
    return lo + (((hi - lo) * r) >> TABLE_BITS)


def exp_q16(d: np.ndarray) -> np.ndarray:
    """exp(d / 2**16) in Q16 for d <= 0 (int64 in, int64 in [0, 2**16] out)."""
    d = np.maximum(np.asarray(d, np.int64), -EXP_FLOOR)
    u = -((d * LOG2E_Q16) >> Q16)  # -log2(e) * d >= 0, Q16
    whole, frac = u >> Q16, u & 0xFFFF
    v = _interp(np.asarray(EXP2_NEG_Q30, np.int64), frac)  # 2**-frac in Q30
    sh = np.minimum(whole + 14, 62)
    return v >> sh


def log2_q16(s: np.ndarray) -> np.ndarray:
    """log2(s) in Q16 of integers s >= 1 (int64 in and out)."""
    s = np.asarray(s, np.int64)
    b = np.zeros_like(s)
    t = s.copy()
    for k in (32, 16, 8, 4, 2, 1):  # b = floor(log2 s), as the C loop finds it
        big = t >= (np.int64(1) << k)
        b = np.where(big, b + k, b)
        t = np.where(big, t >> k, t)
    mant = np.where(b <= 30, s << np.maximum(30 - b, 0), s >> np.maximum(b - 30, 0))  # Q30 in [1, 2)
    frac = (mant - (1 << 30)) >> 14  # Q16
    return (b << Q16) + _interp(np.asarray(LOG2_1P_Q16, np.int64), frac)


def float_of_q16(q: np.ndarray) -> np.ndarray:
    """float32 q / 2**16 for 0 <= q < 2**24 (exact; the C kernel builds the bits with integers)."""
    return (np.asarray(q, np.int64).astype(np.float32) * np.float32(2.0 ** -Q16)).astype(np.float32)


def uniform16(seed: int, param_id: int, step: int, index: np.ndarray) -> np.ndarray:
    """The stochastic rounding's uniform number in Q16 (0..65535): the top 16 bits of
    ops/qoptim.py's counter hash, the bits the float update's u starts with."""
    return (hash_bits(seed, param_id, step, index) >> np.uint32(32 - UPDATE_FRAC)).astype(np.int64)
