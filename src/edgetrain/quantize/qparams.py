"""Quantization parameters: how a real tensor maps to int8, and how weights are quantized.

Activations are asymmetric per tensor: real = scale * (q - zero), q in [-128, 127], with
the real range widened to contain 0 (so zero padding and ReLU are exact). Weights are
symmetric per output channel: real = w_scale[c] * q, q in [-127, 127]. Biases are int32
on the accumulator's scale x_scale * w_scale[c].
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..ops.fixed_point import INT8_MAX, INT8_MIN, INT32_MAX, INT32_MIN

#: symmetric weights use [-127, 127], leaving -128 unused so that negation is exact
WEIGHT_QMAX = 127
#: a channel whose weights are all zero still gets a usable scale (and QAS a finite factor)
MIN_WEIGHT_RANGE = 1e-8
#: an activation that is constant during calibration still gets a usable scale
MIN_ACTIVATION_RANGE = 1e-6


@dataclass(frozen=True)
class QParams:
    """real = scale * (q - zero) for int8 q."""

    scale: float
    zero: int

    def __post_init__(self):
        if not (self.scale > 0 and math.isfinite(self.scale)):
            raise ValueError(f"a quantization scale must be finite and > 0, got {self.scale}")
        if not INT8_MIN <= self.zero <= INT8_MAX:
            raise ValueError(f"an int8 zero point must lie in [-128, 127], got {self.zero}")

    @staticmethod
    def from_range(lo: float, hi: float) -> "QParams":
        """The parameters covering [min(lo, 0), max(hi, 0)] with all 256 levels."""
        lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise ValueError(f"calibration range [{lo}, {hi}] is not finite")
        scale = max(hi - lo, MIN_ACTIVATION_RANGE) / (INT8_MAX - INT8_MIN)
        zero = int(np.clip(round(INT8_MIN - lo / scale), INT8_MIN, INT8_MAX))
        return QParams(scale, zero)

    def quantize(self, real, lo: int = INT8_MIN, hi: int = INT8_MAX) -> int:
        """The int8 level of a real number (clamped to [lo, hi])."""
        return int(np.clip(round(real / self.scale) + self.zero, lo, hi))

    @property
    def real_range(self) -> tuple[float, float]:
        return (INT8_MIN - self.zero) * self.scale, (INT8_MAX - self.zero) * self.scale


def quantize_weight(w: np.ndarray, scales: Optional[np.ndarray] = None) -> tuple[np.ndarray, np.ndarray]:
    """(int8 weight, float32 scale per output channel (dim 0)), symmetric: the scales cover
    each channel's largest magnitude, or are the given `scales` (values beyond them clamp)."""
    w = np.asarray(w, dtype=np.float32)
    if scales is None:
        flat = np.abs(w.reshape(w.shape[0], -1)).max(axis=1) if w.size else np.zeros(w.shape[0], np.float32)
        scales = (np.maximum(flat, MIN_WEIGHT_RANGE) / WEIGHT_QMAX).astype(np.float32)
    scales = np.asarray(scales, dtype=np.float32)
    if scales.shape != (w.shape[0],):
        raise ValueError(f"weight scales {scales.shape} do not match {w.shape[0]} output channels")
    q = np.round(w / scales.reshape((-1,) + (1,) * (w.ndim - 1)))
    return np.clip(q, -WEIGHT_QMAX, WEIGHT_QMAX).astype(np.int8), scales


def quantize_bias(b: np.ndarray, x_scale: float, w_scales: np.ndarray) -> np.ndarray:
    """int32 bias on the accumulator scale x_scale * w_scale[c]."""
    acc_scale = np.float64(x_scale) * np.asarray(w_scales, dtype=np.float64)
    q = np.round(np.asarray(b, dtype=np.float64) / acc_scale)
    return np.clip(q, INT32_MIN, INT32_MAX).astype(np.int32)
