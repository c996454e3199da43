"""2-D pooling: average (with or without padding in the count) and max, and their gradients."""
from __future__ import annotations

import numpy as np

from .base import SAME_SCALE_TAG, Int8Rule, OpDef, out_grad, register
from .conv import conv_out_hw, window_tap

_ONE = (1, 1)


def _geo(a):
    k = tuple(a["kernel"])
    return k, tuple(a["stride"]), tuple(a["padding"]), tuple(a.get("dilation", _ONE))


def _pool_infer(ts, a):
    x = ts[0]
    if x.rank != 4:
        raise ValueError(f"pool2d: expected a 4-D input, got {x}")
    k, s, p, d = _geo(a)
    if any(p[i] > k[i] // 2 for i in range(2)):
        raise ValueError(f"pool2d: padding {p} must be at most half the kernel {k}")
    return [x.with_shape(x.shape[:2] + conv_out_hw(x.shape[2:], k, s, p, d))]


def _pad(x, p, value):
    return np.pad(x, ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])), constant_values=value)


def fixed_avg_divisor(a) -> int:
    """Average pooling's divisor when it is one number: divisor_override, else the kernel area
    when padding counts; 0 when it is each window's count of real pixels (the rule every
    backend's average pooling reads)."""
    if a.get("divisor_override"):
        return int(a["divisor_override"])
    return int(a["kernel"][0] * a["kernel"][1]) if a.get("count_include_pad", True) else 0


def _avg_divisor(shape, a):
    """Per-output-position divisor (kernel area, or the count of real pixels)."""
    k, s, p, d = _geo(a)
    if fixed_avg_divisor(a):
        return float(fixed_avg_divisor(a))
    ho, wo = conv_out_hw(shape[2:], k, s, p, d)
    ones = _pad(np.ones((1, 1) + tuple(shape[2:])), p, 0.0)
    return sum(ones[window_tap(i, j, s, d, ho, wo)] for i in range(k[0]) for j in range(k[1]))


def _avg_ref(xs, a):
    x = xs[0]
    k, s, p, d = _geo(a)
    ho, wo = conv_out_hw(x.shape[2:], k, s, p, d)
    xp = _pad(x, p, 0.0)
    acc = sum(xp[window_tap(i, j, s, d, ho, wo)] for i in range(k[0]) for j in range(k[1]))
    return [(acc / _avg_divisor(x.shape, a)).astype(x.dtype)]


def _avg_grad_ref(xs, a):
    g = xs[0]
    shape = tuple(a["input_shape"])
    k, s, p, d = _geo(a)
    gs = g / _avg_divisor(shape, a)
    gxp = np.zeros(shape[:2] + (shape[2] + 2 * p[0], shape[3] + 2 * p[1]), dtype=g.dtype)
    for i in range(k[0]):
        for j in range(k[1]):
            gxp[window_tap(i, j, s, d, *g.shape[2:])] += gs
    return [gxp[:, :, p[0]:p[0] + shape[2], p[1]:p[1] + shape[3]].astype(g.dtype)]


def _max_ref(xs, a):
    x = xs[0]
    k, s, p, d = _geo(a)
    ho, wo = conv_out_hw(x.shape[2:], k, s, p, d)
    xp = _pad(x, p, -np.inf)
    out = np.full(x.shape[:2] + (ho, wo), -np.inf, dtype=x.dtype)
    for i in range(k[0]):
        for j in range(k[1]):
            np.maximum(out, xp[window_tap(i, j, s, d, ho, wo)], out=out)
    return [out]


def _max_grad_ref(xs, a):
    """Route each output gradient to the first maximal element of its window (as PyTorch)."""
    g, x = xs
    k, s, p, d = _geo(a)
    ho, wo = g.shape[2:]
    (y,) = _max_ref([x], a)
    xp = _pad(x, p, -np.inf)
    gxp = np.zeros(xp.shape, dtype=g.dtype)
    taken = np.zeros(y.shape, dtype=bool)
    for i in range(k[0]):
        for j in range(k[1]):
            hit = (xp[window_tap(i, j, s, d, ho, wo)] == y) & ~taken
            gxp[window_tap(i, j, s, d, ho, wo)] += np.where(hit, g, 0)
            taken |= hit
    return [gxp[:, :, p[0]:p[0] + x.shape[2], p[1]:p[1] + x.shape[3]]]


def _keys(node):
    return {k: v for k, v in node.attrs.items()}


register(OpDef("avg_pool2d", _pool_infer, _avg_ref,
               lambda e, n, g, nd: [e.emit("avg_pool2d_grad", out_grad(g), input_shape=n.inputs[0].shape, **_keys(n))],
               num_inputs=(1, 1), tags={SAME_SCALE_TAG}, int8=Int8Rule("same", "qavg_pool2d")))
register(OpDef("avg_pool2d_grad", lambda ts, a: [ts[0].with_shape(a["input_shape"])], _avg_grad_ref,
               num_inputs=(1, 1)))
register(OpDef("max_pool2d", _pool_infer, _max_ref,
               lambda e, n, g, nd: [e.emit("max_pool2d_grad", out_grad(g), n.inputs[0], **_keys(n))], num_inputs=(1, 1),
               tags={SAME_SCALE_TAG}, int8=Int8Rule("same", "qmax_pool2d")))
register(OpDef("max_pool2d_grad", lambda ts, a: [ts[1]], _max_grad_ref, num_inputs=(2, 2)))
