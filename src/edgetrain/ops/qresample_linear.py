"""int8 linear (1-D) and bilinear (2-D) upsampling: the integer semantics of qupsample in mode
"linear" (ops/qresample.py), int8 in, int8 out on the input's scale and zero point (as TFLite's
RESIZE_BILINEAR keeps them), with weights in fixed point.

Weights (computed once per output index, along each resampled dim, in exact rational
arithmetic: no float rounding, the same tables on every host and target; the C kernel reads
them as static tables):
- scale s, torch's (ATen's area_pixel_compute_scale) taken as an exact fraction:
  (in - 1) / (out - 1) with align_corners (0 when out == 1); else the float32 value
  float32(1 / scale_factor) when a scale factor was given (as torch and ops/resample.py's float
  reference compute it), else in / out;
- source coordinate real = s * dst (align_corners) or max(s * (dst + 1/2) - 1/2, 0), exactly;
- i0 = min(floor(real), in - 1), i1 = i0 + (i0 < in - 1), frac = clamp(real - i0, 0, 1);
- l1 = floor(frac * 2^F + 1/2) (frac rounded to F = WEIGHT_BITS fraction bits, half up),
  l0 = 2^F - l1: the two weights sum to exactly 2^F;
- out == in: the identity (i0 = i1 = dst, l0 = 2^F, l1 = 0), as torch copies.
A 1-D upsample is the 2-D one over rows of height 1 (row weights (2^F, 0)).

Interpolation, on the raw int8 levels q (weights summing to one make it commute with the affine
map q -> scale (q - zero), so the output keeps the input's scale and zero point):
  acc = l0h (l0w q[i0h, i0w] + l1w q[i0h, i1w]) + l1h (l0w q[i1h, i0w] + l1w q[i1h, i1w])
in int32 (Q2F: |acc| <= 128 * 2^(2F) = 2^29), y = acc / 2^(2F) rounded half away from zero.
The weights are non-negative and sum to 2^(2F), so y lies between the smallest and the largest
tap: no clamp is needed. Against torch's float bilinear on the dequantized input, y is within
0.5 level (the output rounding) plus the weights' rounding (at most 2^-(F+1) per weight, times
the largest difference of two taps, 255 levels: 0.06 level per dim): within one level.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

#: F, the fraction bits of one dim's weights: the 2-D product is Q(2F) and 128 * 2^(2F) = 2^29
#: keeps the int32 sum with its rounding term clear of overflow; each weight is within
#: 2^-12 of the exact one (0.06 level per dim on a 255-level step)
WEIGHT_BITS = 11
ONE = 1 << WEIGHT_BITS


@dataclass(frozen=True)
class FixedAxisMap:
    """Where each output index along one dim reads (i0, i1) and its weights l0 + l1 = 2^F (int64)."""

    i0: np.ndarray
    i1: np.ndarray
    l0: np.ndarray
    l1: np.ndarray


def _identity(n: int) -> FixedAxisMap:
    idx = np.arange(n, dtype=np.int64)
    return FixedAxisMap(idx, idx, np.full(n, ONE, np.int64), np.zeros(n, np.int64))


def exact_scale(size_in: int, size_out: int, scale: float, align_corners: bool) -> Fraction:
    """torch's source-coordinate scale of one dim, as an exact fraction."""
    if align_corners:
        return Fraction(size_in - 1, size_out - 1) if size_out > 1 else Fraction(0)
    if scale > 0:
        return Fraction(float(np.float32(1.0 / scale)))
    return Fraction(size_in, size_out)


def fixed_axis_map(size_in: int, size_out: int, scale: float, align_corners: bool) -> FixedAxisMap:
    """Source indices and Q(WEIGHT_BITS) weights of each output index along one dim."""
    if size_out == size_in:
        return _identity(size_out)
    s = exact_scale(size_in, size_out, scale, align_corners)
    i0, l1 = [], []
    for dst in range(size_out):
        real = s * dst if align_corners else max(s * (dst + Fraction(1, 2)) - Fraction(1, 2), Fraction(0))
        lo = min(real.__floor__(), size_in - 1)
        frac = min(max(real - lo, Fraction(0)), Fraction(1))
        i0.append(lo)
        l1.append((frac * ONE + Fraction(1, 2)).__floor__())
    i0a, l1a = np.array(i0, np.int64), np.array(l1, np.int64)
    return FixedAxisMap(i0a, i0a + (i0a < size_in - 1), ONE - l1a, l1a)


def fixed_plane_maps(a, in_shape) -> tuple[FixedAxisMap, FixedAxisMap]:
    """(rows, cols) maps of a linear upsample; a 1-D upsample has identity rows of height 1."""
    size, scales = tuple(a["size"]), tuple(a.get("scales") or (0.0,) * len(a["size"]))
    align = bool(a.get("align_corners", False))
    maps = [fixed_axis_map(int(in_shape[len(in_shape) - len(size) + i]), int(size[i]), float(scales[i]), align)
            for i in range(len(size))]
    return (maps[0], maps[1]) if len(maps) == 2 else (_identity(1), maps[0])


def round_shift(acc: np.ndarray, bits: int) -> np.ndarray:
    """acc / 2^bits rounded half away from zero (integers)."""
    half = 1 << (bits - 1)
    mag = (np.abs(acc) + half) >> bits
    return np.where(acc < 0, -mag, mag)


def qupsample_linear_ref(x: np.ndarray, a) -> np.ndarray:
    """The int8 linear / bilinear upsampling of `x` (int8) by the attributes of an upsample."""
    k = len(a["size"])
    lead = x.shape[:x.ndim - k]
    h, w = (1, x.shape[-1]) if k == 1 else x.shape[-2:]
    rows, cols = fixed_plane_maps(a, x.shape)
    p = x.reshape(-1, h, w).astype(np.int64)
    r0, r1 = p[:, rows.i0], p[:, rows.i1]
    t0 = r0[:, :, cols.i0] * cols.l0 + r0[:, :, cols.i1] * cols.l1
    t1 = r1[:, :, cols.i0] * cols.l0 + r1[:, :, cols.i1] * cols.l1
    acc = t0 * rows.l0[:, None] + t1 * rows.l1[:, None]
    return round_shift(acc, 2 * WEIGHT_BITS).astype(np.int8).reshape(lead + tuple(int(s) for s in a["size"]))
