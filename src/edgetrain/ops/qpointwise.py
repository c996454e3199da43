"""int8 pointwise activations: qleaky_relu (TFLite's LEAKY_RELU on int8) and its backward.

qleaky_relu(x; zero, negative_slope) keeps its input's scale and zero point (a slope in (0, 1)
keeps every result inside the input's range): with d = x - zero,
    y = zero + d                                          where d > 0,
    y = zero + MultiplyByQuantizedMultiplier(d, m, s)     elsewhere,
m and s the Q31 fixed point of the slope (`slope_multiplier`; gemmlowp's rounding, half away
from zero, as every requantization of fixed_point.py). The slope being positive, y > zero
exactly where x > zero, so the backward reads the sign from a packed bit mask of the output
(qmask_pack over (zero, 128)) and `qleaky_relu_grad(g, mask; negative_slope)` passes g where the
bit is set and g * slope (float32) elsewhere, as torch's leaky_relu backward (slope at 0).
"""
from __future__ import annotations

import numpy as np

from .base import OpDef, register
from .fixed_point import INT8_MAX, INT8_MIN, multiply_by_quantized_multiplier, quantize_multiplier
from .qelementwise import mask_bytes

#: the mask's upper bound: above every int8 level, so only the lower one (the zero point) cuts
MASK_NO_UPPER = INT8_MAX + 1


def slope_multiplier(slope: float) -> tuple[int, int]:
    """(mantissa, shift) of the negative slope as TFLite's quantized multiplier."""
    if not 0.0 < slope < 1.0:
        raise ValueError(f"qleaky_relu: the negative slope must be in (0, 1), got {slope}")
    return quantize_multiplier(float(slope))


def qleaky_relu_ref(x: np.ndarray, a) -> np.ndarray:
    mult, shift = slope_multiplier(a["negative_slope"])
    d = x.astype(np.int64) - a["zero"]
    neg = multiply_by_quantized_multiplier(np.minimum(d, 0), mult, shift)
    return np.clip(np.where(d > 0, d, neg) + a["zero"], INT8_MIN, INT8_MAX).astype(np.int8)


def _qleaky_infer(ts, a):
    if ts[0].dtype != "int8":
        raise ValueError(f"qleaky_relu: expected an int8 input, got {ts[0]}")
    slope_multiplier(a["negative_slope"])
    return [ts[0]]


def _vjp_qleaky(e, node, grads, needs):
    mask = e.emit("qmask_pack", node.out, lo=int(node.attrs["zero"]), hi=MASK_NO_UPPER)
    return [e.emit("qleaky_relu_grad", grads[0], mask, negative_slope=node.attrs["negative_slope"])]


def _grad_infer(ts, a):
    g, m = ts
    if g.dtype != "float32" or m.dtype != "int8" or m.shape != (mask_bytes(g.numel),):
        raise ValueError(f"qleaky_relu_grad: gradient {g} does not match packed mask {m}")
    return [g]


def qleaky_relu_grad_ref(g: np.ndarray, m: np.ndarray, a) -> np.ndarray:
    keep = np.unpackbits(m.view(np.uint8), count=g.size, bitorder="little").reshape(g.shape).astype(bool)
    return np.where(keep, g, g * np.float32(a["negative_slope"])).astype(np.float32)


register(OpDef("qleaky_relu", _qleaky_infer, lambda xs, a: [qleaky_relu_ref(xs[0], a)], _vjp_qleaky,
               num_inputs=(1, 1), inplace=((0, 0),)))
register(OpDef("qleaky_relu_grad", _grad_infer, lambda xs, a: [qleaky_relu_grad_ref(xs[0], xs[1], a)],
               num_inputs=(2, 2), inplace=((0, 0),)))
