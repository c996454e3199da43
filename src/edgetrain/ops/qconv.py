"""int8 convolution (TFLite / CMSIS-NN semantics) and its float32 backward ops.

Forward, all in integers: acc = conv(x - x_zero, w) + bias (int32), then per output channel
y = clamp(MultiplyByQuantizedMultiplier(acc, mult[c], shift[c]) + y_zero, qmin, qmax).
ReLU and ReLU6 are this clamp. With `float_out` the layer returns real float32 logits
acc * x_scale * w_scale[c] instead (a classifier feeding the loss); with `acc_out` (the
integer-only backward's classifier, ops/icross_entropy.py) the int32 accumulators themselves.

Backward, in float32 on the real values the int8 tensors stand for (the straight-through
estimator: rounding passes the gradient, saturation stops it):
- qmask_grad     zero where the output sat at its clamp bounds (from its packed bit mask);
- qconv2d_grad_input   conv-transpose with the real weight w_scale[c] * w (never stored);
- qconv2d_grad_weight  d loss / d w_int = x_scale * w_scale[c] * conv_wgrad(x - x_zero, g);
- qconv2d_grad_bias    d loss / d b_int = x_scale * w_scale[c] * sum(g).
Gradients of int parameters are with respect to the integers themselves; QAS (in the
update) rescales them.
"""
from __future__ import annotations

import numpy as np

from ..ir import TensorType
from .base import ChannelSelect, Cost, OpDef, register
from .conv import (CONV_KEYS, conv2d_grad_input_ref, conv2d_ref, conv_cost, conv_geometry, conv_out_hw, im2col,
                   is_depthwise, pad_spatial)
from .fixed_point import INT8_MAX, INT8_MIN, multiply_by_quantized_multiplier, saturate_int32
from .qelementwise import emit_mask_grad


def _channel(v, ndim=4):
    """A per-output-channel tuple as an array broadcasting over NCHW (or (O, ...) weights)."""
    return np.asarray(v).reshape((1, -1) + (1,) * (ndim - 2))


def qconv_infer(ts, a):
    """The shape rule of qconv2d (int8 input and weight, int32 bias), shared by the fused ops built on it."""
    x, w, b = ts
    if x.dtype != "int8" or w.dtype != "int8" or b.dtype != "int32":
        raise ValueError(f"qconv2d: expected int8 input, int8 weight and int32 bias, got {x}, {w}, {b}")
    if x.rank != 4 or w.rank != 4 or b.shape != (w.shape[0],):
        raise ValueError(f"qconv2d: expected NCHW input, OIHW weight and (O,) bias, got {x}, {w}, {b}")
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    g = int(a["groups"])
    if c % g or o % g or cg != c // g:
        raise ValueError(f"qconv2d: input {x} and weight {w} disagree for groups={g}")
    for key in ("mult", "shift", "w_scales"):
        if len(a[key]) != o:
            raise ValueError(f"qconv2d: {key} has {len(a[key])} entries for {o} output channels")
    hw = conv_out_hw((h, wd), (kh, kw), tuple(a["stride"]), tuple(a["padding"]), tuple(a["dilation"]))
    dtype = "int32" if a.get("acc_out") else "float32" if a.get("float_out") else "int8"
    return [TensorType((n, o) + hw, dtype)]


#: float32 holds every integer up to 2**24 exactly
FLOAT32_EXACT = 2 ** 24


def accumulate(x, w, b, a) -> np.ndarray:
    """The int32 accumulator conv(x - x_zero, w) + b, computed exactly in floating point:
    float32 when no partial sum can pass 2**24 (fan-in * 255 * max|w|), else float64."""
    fan_in = int(np.prod(w.shape[1:]))
    bound = fan_in * (INT8_MAX - INT8_MIN) * int(np.abs(w.astype(np.int32)).max(initial=0))
    ft = np.float32 if bound < FLOAT32_EXACT else np.float64
    xc = x.astype(ft) - ft(a["x_zero"])
    acc = np.rint(conv2d_ref(xc, w.astype(ft), None, a)).astype(np.int64)
    return saturate_int32(acc + _channel(b.astype(np.int64)))


def out_scales(a) -> np.ndarray:
    """float32 x_scale * w_scale[c]: the real value of one accumulator step."""
    return (np.float64(a["x_scale"]) * np.asarray(a["w_scales"], dtype=np.float64)).astype(np.float32)


def qconv2d_ref(x, w, b, a):
    acc = accumulate(x, w, b, a)
    if a.get("acc_out"):  # the integer-only backward's logits: its loss rescales them (ops/icross_entropy.py)
        return acc.astype(np.int32)
    if a.get("float_out"):
        return acc.astype(np.float32) * _channel(out_scales(a))
    y = multiply_by_quantized_multiplier(acc, _channel(a["mult"]), _channel(a["shift"])) + a["y_zero"]
    return np.clip(y, a["qmin"], a["qmax"]).astype(np.int8)


def _real_weight(w, a):
    return w.astype(np.float32) * np.asarray(a["w_scales"], dtype=np.float32).reshape(-1, 1, 1, 1)


def _vjp_qconv(e, node, grads, needs):
    (gy,) = grads
    x, w, _ = node.inputs
    a = node.attrs
    geo = {k: a[k] for k in CONV_KEYS}
    g = gy if a.get("float_out") else emit_mask_grad(e, gy, node.out, a["qmin"], a["qmax"])
    gx = None
    if needs[0]:
        dw = is_depthwise(x.shape[1], w.shape[0], geo["groups"])
        op = "qconv2d_dw_grad_input" if dw else "qconv2d_grad_input"
        gx = e.emit_multi(op, g, w, input_shape=x.shape, w_scales=a["w_scales"], **geo)[0]
    gw = _weight_grad(e, x, w, g, a, geo, needs[1]) if needs[1] else None
    gb = e.emit("qconv2d_grad_bias", g, scales=tuple(float(s) for s in out_scales(a))) if needs[2] else None
    return [gx, gw, gb]


def _weight_grad(e, x, w, g, a, geo, select):
    scales = tuple(float(s) for s in out_scales(a))
    common = dict(x_zero=a["x_zero"])
    if not isinstance(select, ChannelSelect):  # the whole weight gradient
        return e.emit("qconv2d_grad_weight", x, g, weight_shape=w.shape, scales=scales, **common, **geo)
    idx = tuple(select.index)
    o, cg, kh, kw = w.shape
    xs = e.emit("index_select", x, dim=1, index=idx)
    if select.dim == 0 and is_depthwise(x.shape[1], o, geo["groups"]):
        gs = e.emit("index_select", g, dim=1, index=idx)
        return e.emit("qconv2d_grad_weight", xs, gs, weight_shape=(len(idx), 1, kh, kw),
                      scales=tuple(scales[i] for i in idx), **common, **{**geo, "groups": len(idx)})
    if select.dim == 1 and geo["groups"] == 1:
        return e.emit("qconv2d_grad_weight", xs, g, weight_shape=(o, len(idx), kh, kw), scales=scales,
                      **common, **geo)
    raise ValueError(f"channel selection on weight dim {select.dim} is only supported for dense (dim 1) "
                     f"and depthwise (dim 0) convolutions, not groups={geo['groups']}")


# --- The float32 backward in one summation order -------------------------------------------
# An int8 program's integers after an update depend on the last bit of its float32
# gradients (stochastic rounding), so every backend must add the same terms in the same
# order. The references below fix that order (backends/c/runtime/et_int8.h follows it):
# - an input-gradient element adds its terms w_real[o, c, i, j] * g[n, o, ho, wo] in
#   (o, i, j) order, starting from 0;
# - a weight-gradient element adds g[n, o, ho, wo] * (x - x_zero)[n, c, tap] and a bias
#   gradient g[n, o, h, w] sequentially over (n, ho, wo), then multiplies by its scale.
# Sequential sums are np.cumsum (a running float32 sum, element by element) over the
# product terms; a padded tap adds an exact zero, which changes no sum.

#: product terms materialised at once by the vectorised sums (16 MB of float32)
SUM_BLOCK = 1 << 22


def sequential_sum(terms: np.ndarray) -> np.ndarray:
    """Left-to-right float32 sum over the last axis (0 for no terms)."""
    if terms.shape[-1] == 0:
        return np.zeros(terms.shape[:-1], np.float32)
    return np.cumsum(terms, axis=-1, dtype=np.float32)[..., -1]


def _blocks(total: int, per_item: int):
    step = max(1, SUM_BLOCK // max(per_item, 1))
    return [(lo, min(lo + step, total)) for lo in range(0, total, step)]


def _grad_input_ref(xs, a):
    """d loss / d x: each element sums w_real * g over (o, i, j) in that order."""
    g, w = xs
    wr = _real_weight(w, a)
    s, p, d, groups = conv_geometry(a)
    n, c, h, wd = a["input_shape"]
    o, cg, kh, kw = w.shape
    if is_depthwise(c, o, groups):  # one term per tap: the (i, j) loop below is the order
        return [conv2d_grad_input_ref(g, wr, a)]
    ho, wo = g.shape[2:]
    opg = o // groups
    gxp = np.zeros((n, c, h + 2 * p[0], wd + 2 * p[1]), np.float32)
    for oc in range(o):
        c0 = (oc // opg) * cg
        for i in range(kh):
            for j in range(kw):
                tap = (slice(None), slice(c0, c0 + cg), slice(i * d[0], i * d[0] + s[0] * (ho - 1) + 1, s[0]),
                       slice(j * d[1], j * d[1] + s[1] * (wo - 1) + 1, s[1]))
                gxp[tap] += wr[None, oc, :, i, j, None, None] * g[:, oc:oc + 1]
    return [gxp[:, :, p[0]:p[0] + h, p[1]:p[1] + wd]]


def _dw_grad_input_ref(xs, a):
    """(gx, plane). The kernel works one channel at a time through the one-plane buffer
    `plane` (channel c of gx depends only on channel c of g), so it may write gx over g,
    which `inplace` lets the arena planner do. The reference computes all channels at once
    (bit-identical: each element is the same sum of the same products; the channel loop is
    checked against it in tests/ops/test_fused_backward.py) and returns the last channel
    as the plane."""
    gx = _grad_input_ref(xs, a)[0]
    return [gx, gx[:, -1:].copy()]


def _dw_grad_input_infer(ts, a):
    (gx,) = _grad_infer("input")(ts, a)
    n, c, h, wd = gx.shape
    if int(a["groups"]) != c or ts[1].shape[0] != c or ts[1].shape[1] != 1:
        raise ValueError(f"qconv2d_dw_grad_input: expected a depthwise weight over {c} channels, got {ts[1]}")
    return [gx, TensorType((n, 1, h, wd), "float32")]


def qconv_grad_weight_ref(xs, a):
    """d loss / d w_int: scales[o] * (sum over (n, ho, wo), in that order, of g * (x - x_zero))."""
    x, g = xs
    s, p, d, groups = conv_geometry(a)
    o, cg, kh, kw = a["weight_shape"]
    n, c = x.shape[:2]
    ho, wo = g.shape[2:]
    r = n * ho * wo
    xc = pad_spatial(x.astype(np.float32) - np.float32(a["x_zero"]), p)
    cols = im2col(xc, kh, kw, s, d, ho, wo).transpose(1, 2, 3, 0, 4, 5).reshape(c, kh * kw, r)  # terms last
    gr = g.transpose(1, 0, 2, 3).reshape(o, r)
    opg = o // groups
    gw = np.empty((o, cg, kh * kw), np.float32)
    if cg == 1 and opg == 1:  # depthwise-like: output channel k reads input channel k
        for lo, hi in _blocks(o, kh * kw * r):
            gw[lo:hi, 0] = sequential_sum(gr[lo:hi, None, :] * cols[lo:hi])
    else:
        for oc_lo, oc_hi in _blocks(o, cg * kh * kw * r):
            for grp in range(oc_lo // opg, (oc_hi - 1) // opg + 1):
                lo, hi = max(oc_lo, grp * opg), min(oc_hi, (grp + 1) * opg)
                xg = cols[grp * cg:(grp + 1) * cg]
                gw[lo:hi] = sequential_sum(gr[lo:hi, None, None, :] * xg[None])
    gw = gw.reshape(o, cg, kh, kw)
    return [gw * np.asarray(a["scales"], dtype=np.float32).reshape(-1, 1, 1, 1)]


def _grad_bias_ref(xs, a):
    """scales[o] * (sum over (n, h, w), in that order, of g)."""
    g = xs[0]
    total = sequential_sum(g.transpose(1, 0, 2, 3).reshape(g.shape[1], -1))
    return [total * np.asarray(a["scales"], dtype=np.float32)]


def _grad_infer(kind):
    def infer(ts, a):
        grad = ts[1] if kind == "weight" else ts[0]
        operand = {"weight": ts[0], "input": ts[-1], "bias": None}[kind]
        if grad.dtype != "float32" or operand is not None and operand.dtype != "int8":
            raise ValueError(f"qconv2d_grad_{kind}: expected a float32 gradient and int8 operands, got {ts}")
        shape = {"input": lambda: a["input_shape"], "weight": lambda: a["weight_shape"],
                 "bias": lambda: (ts[0].shape[1],)}[kind]()
        return [TensorType(tuple(shape), "float32")]
    return infer


def _qgrad_cost(node):
    """As many MACs as the forward convolution (see conv._grad_cost)."""
    grad_input = node.op in ("qconv2d_grad_input", "qconv2d_dw_grad_input")
    g = node.inputs[0] if grad_input else node.inputs[1]
    w_shape = node.inputs[1].shape if grad_input else node.attrs["weight_shape"]
    macs = g.type.numel * int(np.prod(w_shape[1:]))
    return Cost(macs, sum(v.type.nbytes for v in node.inputs + node.outputs))


register(OpDef("qconv2d", qconv_infer, lambda xs, a: [qconv2d_ref(xs[0], xs[1], xs[2], a)], _vjp_qconv,
               cost=conv_cost, num_inputs=(3, 3), stream_operands=(0,)))
register(OpDef("qconv2d_grad_input", _grad_infer("input"), _grad_input_ref, cost=_qgrad_cost, num_inputs=(2, 2)))
register(OpDef("qconv2d_dw_grad_input", _dw_grad_input_infer, _dw_grad_input_ref, cost=_qgrad_cost,
               num_inputs=(2, 2), inplace=((0, 0),)))
register(OpDef("qconv2d_grad_weight", _grad_infer("weight"), qconv_grad_weight_ref, cost=_qgrad_cost,
               num_inputs=(2, 2)))
register(OpDef("qconv2d_grad_bias", _grad_infer("bias"), _grad_bias_ref,
               cost=lambda n: Cost(n.inputs[0].type.numel, n.inputs[0].type.nbytes + n.outputs[0].type.nbytes),
               num_inputs=(1, 1)))

__all__ = ["INT8_MAX", "INT8_MIN", "accumulate", "out_scales", "qconv2d_ref"]
