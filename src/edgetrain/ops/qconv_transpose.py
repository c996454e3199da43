"""int8 transposed convolution (TFLite's TRANSPOSE_CONV int8) and its float32 backward ops.

Forward, all in integers, as qconv2d (ops/qconv.py): the int32 accumulator
acc = conv_transpose(x - x_zero, w) + bias, then per output channel
y = clamp(MultiplyByQuantizedMultiplier(acc, mult[c], shift[c]) + y_zero, qmin, qmax) (a following
ReLU / ReLU6 is this clamp), or with `float_out` the real float32 acc * x_scale * w_scale[c].
The weight keeps torch's layout (C_in, C_out / groups, kH, kW): output channel
c = group * (C_out / groups) + j reads weight column j of its group's input channels; `w_scales`
has one entry per output channel (the converter, quantize/convert.py, gives the output channels
of one group one scale, so that each stored weight row has one: see its docstring).

Backward, in float32 on the real values (straight-through, as qconv2d's; a saturated output
passes no gradient: qmask_grad), every sum in one documented order that the C kernels
(backends/c/runtime/et_int8_transposed.h) follow:
- qconv_transpose2d_grad_input: gx[n, ci, iy, ix] adds w_real[ci, j, ky, kx] * g[n, c, oy, ox]
  in (j, ky, kx) order from 0 (oy = iy * stride - padding + ky * dilation: a conv2d of g with the
  real weight), w_real = float32(w) * float32(w_scale[c]);
- qconv_transpose2d_grad_weight: d loss / d w_int[ci, j, ky, kx] = scales[c] * (the sum over
  (n, iy, ix), in that order, of g[n, c, oy, ox] * (x - x_zero)[n, ci, iy, ix]);
- the bias gradient is qconv2d_grad_bias (scales[c] * the sum of g over (n, oy, ox)).
Taps outside the output add nothing (an exact zero would change no sum that starts at +0).
"""
from __future__ import annotations

import numpy as np

from ..ir import TensorType
from .base import Cost, OpDef, register
from .conv import CONV_KEYS, conv_geometry
from .conv_nd import conv_transpose2d_ref, conv_transpose_out_hw
from .fixed_point import INT8_MAX, INT8_MIN, multiply_by_quantized_multiplier, saturate_int32
from .qconv import FLOAT32_EXACT, out_scales, sequential_sum
from .qelementwise import emit_mask_grad

#: the int8 op and its backward ops
QCONV_TRANSPOSE_OP = "qconv_transpose2d"
GRAD_INPUT_OP, GRAD_WEIGHT_OP = "qconv_transpose2d_grad_input", "qconv_transpose2d_grad_weight"
#: the attributes that fix a transposed convolution's geometry
TRANSPOSED_KEYS = CONV_KEYS + ("output_padding",)


def _channel(v):
    return np.asarray(v).reshape(1, -1, 1, 1)


def _geometry(a):
    s, p, d, g = conv_geometry(a)
    return s, p, d, g, tuple(a.get("output_padding", (0, 0)))


def _infer(ts, a):
    x, w, b = ts
    if x.dtype != "int8" or w.dtype != "int8" or b.dtype != "int32":
        raise ValueError(f"{QCONV_TRANSPOSE_OP}: expected int8 input, int8 weight and int32 bias, got {x}, {w}, {b}")
    if x.rank != 4 or w.rank != 4:
        raise ValueError(f"{QCONV_TRANSPOSE_OP}: expected NCHW input and (C_in, C_out/groups, kH, kW) weight, "
                         f"got {x}, {w}")
    s, p, d, g, op = _geometry(a)
    n, c, h, wd = x.shape
    ci, og, kh, kw = w.shape
    if c % g or ci != c:
        raise ValueError(f"{QCONV_TRANSPOSE_OP}: input {x} and weight {w} disagree for groups={g}")
    if any(op[i] >= max(s[i], d[i]) for i in range(2)):
        raise ValueError(f"{QCONV_TRANSPOSE_OP}: output_padding {op} must be smaller than stride {s} or dilation {d}")
    o = og * g
    if b.shape != (o,):
        raise ValueError(f"{QCONV_TRANSPOSE_OP}: bias {b} should have shape ({o},)")
    for key in ("mult", "shift", "w_scales"):
        if len(a[key]) != o:
            raise ValueError(f"{QCONV_TRANSPOSE_OP}: {key} has {len(a[key])} entries for {o} output channels")
    hw = conv_transpose_out_hw((h, wd), (kh, kw), s, p, d, op)
    return [TensorType((n, o) + hw, "float32" if a.get("float_out") else "int8")]


def transposed_accumulate(x, w, b, a) -> np.ndarray:
    """The int32 accumulator conv_transpose(x - x_zero, w) + b, computed exactly in floating point:
    float32 when no partial sum can pass 2**24 (C_in / groups * kH * kW * 255 * max|w|), else float64."""
    fan_in = (w.shape[0] // int(a["groups"])) * int(np.prod(w.shape[2:]))
    bound = fan_in * (INT8_MAX - INT8_MIN) * int(np.abs(w.astype(np.int32)).max(initial=0))
    ft = np.float32 if bound < FLOAT32_EXACT else np.float64
    xc = x.astype(ft) - ft(a["x_zero"])
    acc = np.rint(conv_transpose2d_ref(xc, w.astype(ft), None, a)).astype(np.int64)
    return saturate_int32(acc + _channel(b.astype(np.int64)))


def qconv_transpose2d_ref(x, w, b, a):
    acc = transposed_accumulate(x, w, b, a)
    if a.get("float_out"):
        return acc.astype(np.float32) * _channel(out_scales(a))
    y = multiply_by_quantized_multiplier(acc, _channel(a["mult"]), _channel(a["shift"])) + a["y_zero"]
    return np.clip(y, a["qmin"], a["qmax"]).astype(np.int8)


def output_channel_of_weight(w_shape, groups: int) -> np.ndarray:
    """(C_in, C_out / groups) array: the output channel each weight column of each row feeds."""
    ci, og = w_shape[:2]
    cg = ci // groups
    return (np.arange(ci)[:, None] // cg) * og + np.arange(og)[None, :]


def _vjp(e, node, grads, needs):
    """A ChannelSelect of the weight is answered with the whole gradient (autodiff narrows it)."""
    (gy,) = grads
    x, w, _ = node.inputs
    a = node.attrs
    geo = {k: a[k] for k in TRANSPOSED_KEYS}
    g = gy if a.get("float_out") else emit_mask_grad(e, gy, node.out, a["qmin"], a["qmax"])
    scales = tuple(float(s) for s in out_scales(a))
    gx = e.emit(GRAD_INPUT_OP, g, w, input_shape=x.shape, w_scales=a["w_scales"], **geo) if needs[0] else None
    gw = (e.emit(GRAD_WEIGHT_OP, x, g, weight_shape=w.shape, scales=scales, x_zero=a["x_zero"], **geo)
          if needs[1] else None)
    gb = e.emit("qconv2d_grad_bias", g, scales=scales) if needs[2] else None
    return [gx, gw, gb]


def _padded_taps(g, a, in_hw):
    """(gp, tap): g zero-padded by `padding` on both sides, and tap(ky, kx) the (n, C_out, H, W)
    window of gp that input position (iy, ix) meets through kernel tap (ky, kx)."""
    s, p, d, _, _ = _geometry(a)
    h, wd = in_hw
    gp = np.pad(g, ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1]))) if any(p) else g

    def tap(ky, kx):
        return gp[:, :, ky * d[0]:ky * d[0] + s[0] * (h - 1) + 1:s[0], kx * d[1]:kx * d[1] + s[1] * (wd - 1) + 1:s[1]]
    return tap


def _grad_input_ref(xs, a):
    """d loss / d x: each element sums w_real * g over (j, ky, kx) in that order."""
    g, w = xs
    n, c, h, wd = a["input_shape"]
    ci, og, kh, kw = w.shape
    groups = int(a["groups"])
    cg = ci // groups
    oc = output_channel_of_weight(w.shape, groups)
    wr = w.astype(np.float32) * np.asarray(a["w_scales"], dtype=np.float32)[oc][:, :, None, None]
    tap = _padded_taps(g, a, (h, wd))
    taps = np.stack([tap(ky, kx) for ky in range(kh) for kx in range(kw)], axis=-1)  # n, C_out, H, W, kh*kw
    gx = np.empty((n, c, h, wd), np.float32)
    for k in range(c):  # one input channel's terms at a time: n * H * W * (C_out / groups) * kH * kW
        grp = k // cg
        terms = taps[:, grp * og:(grp + 1) * og] * wr[k].reshape(1, og, 1, 1, kh * kw)  # n, og, H, W, taps
        gx[:, k] = sequential_sum(terms.transpose(0, 2, 3, 1, 4).reshape(n, h, wd, og * kh * kw))
    return [gx]


def _grad_weight_ref(xs, a):
    """d loss / d w_int: scales[c] * (the sum over (n, iy, ix), in that order, of g * (x - x_zero))."""
    x, g = xs
    ci, og, kh, kw = a["weight_shape"]
    groups = int(a["groups"])
    cg = ci // groups
    n, _, h, wd = x.shape
    xc = (x.astype(np.float32) - np.float32(a["x_zero"])).transpose(1, 0, 2, 3).reshape(ci, n * h * wd)
    tap = _padded_taps(g, a, (h, wd))
    gw = np.empty((ci, og, kh, kw), np.float32)
    for ky in range(kh):
        for kx in range(kw):
            gt = tap(ky, kx).transpose(1, 0, 2, 3).reshape(og * groups, n * h * wd)
            for grp in range(groups):
                rows = slice(grp * cg, (grp + 1) * cg)
                gw[rows, :, ky, kx] = sequential_sum(gt[None, grp * og:(grp + 1) * og] * xc[rows, None])
    scales = np.asarray(a["scales"], dtype=np.float32)[output_channel_of_weight((ci, og), groups)]
    return [gw * scales[:, :, None, None]]


def _grad_infer(kind):
    def infer(ts, a):
        grad, operand = (ts[0], ts[1]) if kind == "input" else (ts[1], ts[0])
        if grad.dtype != "float32" or operand.dtype != "int8":
            raise ValueError(f"qconv_transpose2d_grad_{kind}: expected a float32 gradient and an int8 operand, "
                             f"got {ts}")
        return [TensorType(tuple(a["input_shape"] if kind == "input" else a["weight_shape"]), "float32")]
    return infer


def _cost(node):
    """Each input element meets C_out / groups * kH * kW weights (as many MACs in each backward op)."""
    w_shape = node.attrs["weight_shape"] if node.op == GRAD_WEIGHT_OP else node.inputs[1].shape
    x_numel = node.inputs[0].type.numel if node.op != GRAD_INPUT_OP else node.outputs[0].type.numel
    return Cost(x_numel * int(np.prod(w_shape[1:])), sum(v.type.nbytes for v in node.inputs + node.outputs))


register(OpDef(QCONV_TRANSPOSE_OP, _infer, lambda xs, a: [qconv_transpose2d_ref(xs[0], xs[1], xs[2], a)], _vjp, cost=_cost,
               num_inputs=(3, 3)))
register(OpDef(GRAD_INPUT_OP, _grad_infer("input"), _grad_input_ref, cost=_cost, num_inputs=(2, 2)))
register(OpDef(GRAD_WEIGHT_OP, _grad_infer("weight"), _grad_weight_ref, cost=_cost, num_inputs=(2, 2)))

__all__ = ["GRAD_INPUT_OP", "GRAD_WEIGHT_OP", "QCONV_TRANSPOSE_OP", "TRANSPOSED_KEYS", "output_channel_of_weight",
           "qconv_transpose2d_ref", "transposed_accumulate"]
