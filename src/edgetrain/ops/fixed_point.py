"""Integer arithmetic of int8 inference as TFLite Micro and CMSIS-NN define it.

A real multiplier m > 0 becomes a Q31 mantissa and a power-of-two exponent
(`quantize_multiplier`); `multiply_by_quantized_multiplier` applies it to int32 values with
the rounding-doubling high multiply and the rounding right shift of gemmlowp. Every
function here works on numpy int64 arrays holding int32 values, so the host computes
exactly what a device's int32/int64 C code computes.
"""
from __future__ import annotations

import math

import numpy as np

INT32_MIN, INT32_MAX = -(2 ** 31), 2 ** 31 - 1
INT8_MIN, INT8_MAX = -128, 127
#: Q31: a mantissa in [0.5, 1) is stored as round(q * 2**31)
Q31_ONE = 2 ** 31
#: gemmlowp/TFLite add: inputs are shifted left by 20 bits before their multipliers apply,
#: which keeps 20 fractional bits of headroom for two int8 operands
ADD_LEFT_SHIFT = 20


def quantize_multiplier(real: float) -> tuple[int, int]:
    """(mantissa, shift) with real ≈ mantissa * 2**(shift - 31), mantissa in [2**30, 2**31)
    (TFLite's QuantizeMultiplier; the mantissa rounds half away from zero)."""
    if not math.isfinite(real) or real < 0:
        raise ValueError(f"a requantization multiplier must be finite and >= 0, got {real}")
    if real == 0.0:
        return 0, 0
    q, shift = math.frexp(real)
    mantissa = int(math.floor(q * Q31_ONE + 0.5))
    if mantissa == Q31_ONE:
        mantissa //= 2
        shift += 1
    if shift < -31:  # too small to represent: the product is always zero
        return 0, 0
    if shift > 30:
        raise ValueError(f"requantization multiplier {real} is too large for int32 fixed point")
    return mantissa, shift


def _trunc_div_pow2(x: np.ndarray, bits: int) -> np.ndarray:
    """x / 2**bits rounded toward zero (C integer division)."""
    return np.where(x >= 0, x >> bits, -((-x) >> bits))


def rounding_doubling_high_mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """gemmlowp SaturatingRoundingDoublingHighMul: round(a * b / 2**31) (half away from
    zero), for int32 a and 0 <= b < 2**31 (so the one saturating case never occurs)."""
    ab = a.astype(np.int64) * b
    nudge = np.where(ab >= 0, np.int64(1 << 30), np.int64(1 - (1 << 30)))
    return _trunc_div_pow2(ab + nudge, 31)


def rounding_divide_by_pow2(x: np.ndarray, exponent: np.ndarray) -> np.ndarray:
    """gemmlowp RoundingDivideByPOT: x / 2**exponent rounded half away from zero."""
    exponent = np.asarray(exponent, dtype=np.int64)
    mask = (np.int64(1) << exponent) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (x < 0)
    return (x >> exponent) + (remainder > threshold)


def multiply_by_quantized_multiplier(x: np.ndarray, mantissa, shift) -> np.ndarray:
    """TFLite MultiplyByQuantizedMultiplier(x, mantissa, shift) for int32 values `x`
    (int64 array), with per-element or broadcast `mantissa` and `shift`. A left shift that
    would leave int32 saturates (TFLite leaves it undefined)."""
    x = np.asarray(x, dtype=np.int64)
    mantissa = np.asarray(mantissa, dtype=np.int64)
    shift = np.asarray(shift, dtype=np.int64)
    left = np.maximum(shift, 0)
    right = np.maximum(-shift, 0)
    xl = np.clip(x << left, INT32_MIN, INT32_MAX)
    return rounding_divide_by_pow2(rounding_doubling_high_mul(xl, mantissa), right)


def div_round_half_away(total: np.ndarray, count: int) -> np.ndarray:
    """total / count rounded half away from zero, in integers (an average pool's mean)."""
    total = np.asarray(total, dtype=np.int64)
    mag = (np.abs(total) + count // 2) // count
    return np.where(total < 0, -mag, mag)


def saturate_int32(x: np.ndarray) -> np.ndarray:
    return np.clip(x, INT32_MIN, INT32_MAX)
