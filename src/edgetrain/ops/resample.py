"""Upsampling (nearest, nearest-exact, linear / bilinear) over the last one or two dims, and its
backward op.

`upsample(x, mode, size, scales, align_corners)`: `size` the output sizes of the last
len(size) dims (1 or 2); `scales[i]` the scale factor the user gave for that dim (0.0: none).
Each output index reads source indices computed with torch's exact arithmetic (ATen's
UpSample.h), so the same input pixels and weights are taken:
- nearest:        scale = float32(1 / scale_factor) if given else float32(in) / out;
                  src = min(floor(float32(dst) * scale), in - 1) (dst when out == in,
                  dst >> 1 when out == 2 in);
- nearest_exact:  src = min(floor(float32((dst + 0.5) * scale)), in - 1);
- linear:         in the input's float type T: scale = (in - 1) / (out - 1) with align_corners
                  (0 when out == 1), else T(1 / scale_factor) if given, else T(in) / out;
                  real = scale * dst (align_corners) or max(scale * (dst + 0.5) - 0.5, 0);
                  i0 = min(floor(real), in - 1), i1 = i0 + (i0 < in - 1),
                  l1 = clamp(real - i0, 0, 1), l0 = 1 - l1 (i0 = i1 = dst, l = (1, 0) when
                  out == in); y = l0h (l0w x[i0h, i0w] + l1w x[i0h, i1w]) + l1h (...).
A 1-d upsample is the 2-d one over rows of height 1 (identity weights (1, 0) on that dim).
The gradient adds each output's gradient times its weights into its sources, output by output.
In the int8 graph every mode keeps its input's scale: qupsample (ops/qresample.py; linear with
fixed-point weights, ops/qresample_linear.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .base import SAME_SCALE_TAG, Cost, Int8Rule, OpDef, register

MODES = ("nearest", "nearest_exact", "linear")
#: the attributes of an upsample (its gradient adds input_shape)
UPSAMPLE_ATTRS = ("mode", "size", "scales", "align_corners")
#: the source taps per output element along one dim (linear: two; nearest: one)
LINEAR_TAPS = 2


@dataclass(frozen=True)
class AxisMap:
    """Where each output index along one dim reads: i0, i1 and weights l0, l1 (nearest: i1 = i0, l = (1, 0))."""

    i0: np.ndarray
    i1: np.ndarray
    l0: np.ndarray
    l1: np.ndarray


def _nearest_scale(size_in: int, size_out: int, scale: float) -> np.float32:
    return np.float32(1.0 / scale) if scale > 0 else np.float32(size_in) / np.float32(size_out)


def _identity(n: int, dtype) -> AxisMap:
    idx = np.arange(n, dtype=np.int64)
    return AxisMap(idx, idx, np.ones(n, dtype), np.zeros(n, dtype))


def axis_map(mode: str, size_in: int, size_out: int, scale: float, align_corners: bool, dtype) -> AxisMap:
    """torch's source indices and weights along one dim (weights in `dtype`, torch's opmath type)."""
    dtype = np.dtype(dtype)
    dst = np.arange(size_out, dtype=np.int64)
    if mode in ("nearest", "nearest_exact"):
        s = _nearest_scale(size_in, size_out, scale)
        if mode == "nearest" and size_out == size_in:
            src = dst
        elif mode == "nearest" and size_out == 2 * size_in:
            src = dst >> 1
        elif mode == "nearest":
            src = np.floor(dst.astype(np.float32) * s).astype(np.int64)
        else:
            src = np.floor(((dst + 0.5) * np.float64(s)).astype(np.float32)).astype(np.int64)
        src = np.minimum(src, size_in - 1)
        return AxisMap(src, src, np.ones(size_out, dtype), np.zeros(size_out, dtype))
    if size_out == size_in:
        return _identity(size_out, dtype)
    t = dtype.type
    if align_corners:
        s = t(size_in - 1) / t(size_out - 1) if size_out > 1 else t(0)
        real = s * dst.astype(dtype)
    else:
        s = t(1.0 / scale) if scale > 0 else t(size_in) / t(size_out)
        real = np.maximum(s * (dst.astype(dtype) + t(0.5)) - t(0.5), t(0))
    i0 = np.minimum(np.floor(real.astype(np.float32)).astype(np.int64), size_in - 1)
    l1 = np.minimum(np.maximum(real - i0.astype(dtype), t(0)), t(1)).astype(dtype)
    i1 = i0 + (i0 < size_in - 1)
    return AxisMap(i0, i1, (t(1) - l1).astype(dtype), l1)


def plane_maps(a, in_shape, dtype) -> tuple[AxisMap, AxisMap]:
    """(rows, cols) maps of an upsample; a 1-d upsample has identity rows of height 1."""
    size, scales = tuple(a["size"]), tuple(a.get("scales") or (0.0,) * len(a["size"]))
    mode, align = a["mode"], bool(a.get("align_corners", False))
    maps = [axis_map(mode, in_shape[len(in_shape) - len(size) + i], size[i], float(scales[i]), align, dtype)
            for i in range(len(size))]
    return (maps[0], maps[1]) if len(maps) == 2 else (_identity(1, dtype), maps[0])


def _plane(shape, k: int) -> tuple[int, int, int]:
    """(leading, H, W) of a shape whose last k (1 or 2) dims are resampled."""
    lead = shape[:len(shape) - k]
    hw = (1,) + tuple(shape[-1:]) if k == 1 else tuple(shape[-2:])
    return int(np.prod(lead, dtype=np.int64)), hw[0], hw[1]


def _check(a, rank: int):
    k = len(a["size"])
    if a["mode"] not in MODES:
        raise ValueError(f"upsample: mode {a['mode']!r} is not one of {MODES}")
    if k not in (1, 2) or rank < k + 1 or min(a["size"]) < 1:
        raise ValueError(f"upsample: output size {tuple(a['size'])} of the last 1 or 2 dims of a rank-{rank} input")
    if len(a.get("scales") or (0.0,) * k) != k:
        raise ValueError(f"upsample: scales {a.get('scales')} must have one entry per resampled dim ({k})")


def _infer(ts, a):
    x = ts[0]
    _check(a, x.rank)
    return [x.with_shape(x.shape[:x.rank - len(a["size"])] + tuple(int(s) for s in a["size"]))]


def _ref(xs, a):
    x = xs[0]
    k = len(a["size"])
    n, h, w = _plane(x.shape, k)
    rows, cols = plane_maps(a, x.shape, x.dtype)
    p = x.reshape(n, h, w)
    if a["mode"] != "linear":  # a copy (no weights: an inf stays an inf)
        return [np.ascontiguousarray(p[:, rows.i0][:, :, cols.i0]).reshape(x.shape[:x.ndim - k] + tuple(a["size"]))]
    r0, r1 = p[:, rows.i0], p[:, rows.i1]
    t0 = r0[:, :, cols.i0] * cols.l0 + r0[:, :, cols.i1] * cols.l1
    t1 = r1[:, :, cols.i0] * cols.l0 + r1[:, :, cols.i1] * cols.l1
    y = t0 * rows.l0[:, None] + t1 * rows.l1[:, None]
    return [y.astype(x.dtype).reshape(x.shape[:x.ndim - k] + tuple(a["size"]))]


def upsample_grad(g, in_shape, a, dtype) -> np.ndarray:
    """Each output's gradient times its weights added into its sources, outputs in row-major
    order, the terms of one output in (i0h i0w, i0h i1w, i1h i0w, i1h i1w) order (nearest: the
    gradient itself into its one source). `g` may be any float dtype: the sums are in `dtype`."""
    k = len(a["size"])
    n, h, w = _plane(tuple(in_shape), k)
    rows, cols = plane_maps(a, in_shape, dtype)
    gp = g.reshape(n, len(rows.i0), len(cols.i0))
    gx = np.zeros((n, h * w), dtype=dtype)
    for i in range(len(rows.i0)):
        for j in range(len(cols.i0)):
            if a["mode"] != "linear":  # nearest: the gradient to its one source
                gx[:, rows.i0[i] * w + cols.i0[j]] += gp[:, i, j]
                continue
            for ih, lh in ((rows.i0[i], rows.l0[i]), (rows.i1[i], rows.l1[i])):
                for iw, lw in ((cols.i0[j], cols.l0[j]), (cols.i1[j], cols.l1[j])):
                    gx[:, ih * w + iw] += gp[:, i, j] * (lh * lw)
    return gx.reshape(tuple(in_shape))


def _grad_ref(xs, a):
    g = xs[0]
    return [upsample_grad(g, a["input_shape"], a, g.dtype)]


def _grad_infer(ts, a):
    g = ts[0]
    shape = tuple(a["input_shape"])
    _check(a, len(shape))
    if g.shape != shape[:len(shape) - len(a["size"])] + tuple(a["size"]):
        raise ValueError(f"upsample_grad: gradient {g} does not match input shape {shape} and size {a['size']}")
    return [g.with_shape(shape)]


def upsample_cost(node):
    """LINEAR_TAPS ** dims multiply-adds per output element (linear), one copy (nearest)."""
    taps = LINEAR_TAPS ** len(node.attrs["size"]) if node.attrs["mode"] == "linear" else 0
    big = max(v.type.numel for v in node.inputs + node.outputs)
    return Cost(big * taps, sum(v.type.nbytes for v in node.inputs + node.outputs))


def _vjp(e, node, grads, needs):
    return [e.emit("upsample_grad", grads[0], input_shape=node.inputs[0].shape, **dict(node.attrs))]


register(OpDef("upsample", _infer, _ref, _vjp, cost=upsample_cost, num_inputs=(1, 1), tags={SAME_SCALE_TAG},
               int8=Int8Rule("same", "qupsample")))
register(OpDef("upsample_grad", _grad_infer, _grad_ref, cost=upsample_cost, num_inputs=(1, 1)))
