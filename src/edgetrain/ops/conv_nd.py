"""Convolutions beyond 2-D and transposed convolutions (conv3d, conv_transpose2d) and their backward ops.

conv_transpose2d is the input gradient of a conv2d (ops/conv.py) whose input has the transposed
convolution's output shape: its forward reuses conv2d_grad_input_ref, and its VJP is a conv2d
(input gradient) and a conv2d_grad_weight with the roles of input and output gradient swapped
(the weight layout (C_in, C_out / groups, kH, kW) is conv2d's (O, C / groups, kH, kW) of that
conv2d). conv3d computes as conv2d does: im2col (one kernel tap at a time) + a matmul per group.
"""
from __future__ import annotations

import itertools

import numpy as np

from ..ir import TensorType
from .base import LAYER_TAG, ChannelSelect, Cost, Int8Rule, OpDef, ParamOperands, register, same_dtype
from .conv import CONV_KEYS, conv2d_grad_input_ref, conv_cost, conv_geometry, is_depthwise

#: spatial dims of conv3d (D, H, W)
SPATIAL_3D = 3


# --- conv_transpose2d ------------------------------------------------------------------------------
def conv_transpose_out_hw(hw, kernel, stride, padding, dilation, output_padding):
    """The output sides of a transposed convolution (torch's formula)."""
    out = [(hw[i] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (kernel[i] - 1) + output_padding[i] + 1
           for i in range(len(hw))]
    if min(out) < 1:
        raise ValueError(f"conv_transpose2d: input {tuple(hw)} gives an empty output for kernel {tuple(kernel)} "
                         f"(stride {stride}, padding {padding}, dilation {dilation})")
    return tuple(out)


def _transposed_infer(ts, a):
    x, w = ts[0], ts[1]
    s, p, d, g = conv_geometry(a)
    op = tuple(a["output_padding"])
    if x.rank != 4 or w.rank != 4:
        raise ValueError(f"conv_transpose2d: expected 4-D input and weight, got {x} and {w}")
    n, c, h, wd = x.shape
    ci, og, kh, kw = w.shape
    if c % g or ci != c:
        raise ValueError(f"conv_transpose2d: input {x} and weight {w} disagree for groups={g}")
    if any(op[i] >= max(s[i], d[i]) for i in range(2)):
        raise ValueError(f"conv_transpose2d: output_padding {op} must be smaller than stride {s} or dilation {d}")
    if len(ts) == 3 and ts[2].shape != (og * g,):
        raise ValueError(f"conv_transpose2d: bias {ts[2]} should have shape ({og * g},)")
    same_dtype(ts, "conv_transpose2d")
    return [TensorType((n, og * g) + conv_transpose_out_hw((h, wd), (kh, kw), s, p, d, op), x.dtype)]


def transposed_as_conv(a, out_shape):
    """The conv2d attributes of the convolution a transposed one is the input gradient of."""
    return {**{k: a[k] for k in CONV_KEYS}, "input_shape": tuple(out_shape)}


def conv_transpose2d_ref(x, w, b, a):
    og, g = w.shape[1], int(a["groups"])
    s, p, d, _ = conv_geometry(a)
    hw = conv_transpose_out_hw(x.shape[2:], w.shape[2:], s, p, d, tuple(a["output_padding"]))
    y = conv2d_grad_input_ref(x, w, transposed_as_conv(a, (x.shape[0], og * g) + hw))
    if b is not None:
        y += b[None, :, None, None]
    return y


def _transposed_cost(node):
    """Each input element meets C_out / groups * kH * kW weights."""
    x, w = node.inputs[:2]
    return Cost(x.type.numel * int(np.prod(w.shape[1:])), sum(v.type.nbytes for v in node.inputs + node.outputs))


def _vjp_transposed(e, node, grads, needs):
    """y = conv2d_grad_input(x, w): gx = conv2d(gy, w) (cut to x's sides where output padding
    reaches a further row of windows), gw = conv2d_grad_weight(gy, x), gb = sum of gy."""
    (gy,) = grads
    x, w = node.inputs[:2]
    geo = {k: node.attrs[k] for k in CONV_KEYS}
    gx = None
    if needs[0]:
        gx = e.emit("conv2d", gy, w, **geo)
        for dim in (2, 3):
            if gx.shape[dim] != x.shape[dim]:
                gx = e.emit("slice", gx, dim=dim, start=0, end=x.shape[dim], step=1)
    gw = None
    if needs[1]:
        gy_w = _single_tap_rows(e, gy, x, w, geo)
        gw = (e.emit("conv2d_grad_weight", gy_w, x, weight_shape=w.shape, **geo)
              if not isinstance(needs[1], ChannelSelect)  # the conv2d's: its input is gy, its output gradient x
              else partial_weight_grad(e, "conv2d_grad_weight", gy_w, w, x, geo, needs[1]))
    gb = e.emit("sum", gy, dims=(0, 2, 3)) if len(needs) > 2 and needs[2] else None
    return [gx, gw, gb]


def _single_tap_rows(e, gy, x, w, geo):
    """gy cut to x's sides in each dim where a 1-tap kernel at stride 1 without padding maps row i
    of x to row i of y alone (the rows output padding adds past them meet no weight): the weight
    gradient's conv2d then has the consistent geometry a pointwise kernel assumes."""
    for dim in (2, 3):
        i = dim - 2
        if gy.shape[dim] > x.shape[dim] and w.shape[dim] == 1 and geo["stride"][i] == 1 and geo["padding"][i] == 0:
            gy = e.emit("slice", gy, dim=dim, start=0, end=x.shape[dim], step=1)
    return gy


register(OpDef("conv_transpose2d", _transposed_infer,
               lambda xs, a: [conv_transpose2d_ref(xs[0], xs[1], xs[2] if len(xs) > 2 else None, a)],
               _vjp_transposed, cost=_transposed_cost, num_inputs=(2, 3), tags={LAYER_TAG},
               params=ParamOperands("conv", weight=1, bias=2), int8=Int8Rule("qconv", "qconv_transpose2d")))


# --- conv3d --------------------------------------------------------------------------------------
def conv3d_geometry(a):
    """(stride, padding, dilation, groups) of a conv3d-like op's attributes."""
    return tuple(a["stride"]), tuple(a["padding"]), tuple(a["dilation"]), int(a["groups"])


def conv_out_dhw(dhw, kernel, stride, padding, dilation):
    out = [(dhw[i] + 2 * padding[i] - dilation[i] * (kernel[i] - 1) - 1) // stride[i] + 1
           for i in range(SPATIAL_3D)]
    if min(out) < 1:
        raise ValueError(f"conv3d: input {tuple(dhw)} too small for kernel {tuple(kernel)} "
                         f"(stride {stride}, padding {padding}, dilation {dilation})")
    return tuple(out)


def _conv3d_infer(ts, a):
    x, w = ts[0], ts[1]
    s, p, d, g = conv3d_geometry(a)
    if x.rank != 5 or w.rank != 5:
        raise ValueError(f"conv3d: expected 5-D input and weight, got {x} and {w}")
    n, c = x.shape[:2]
    o, cg = w.shape[:2]
    if c % g or o % g or cg != c // g:
        raise ValueError(f"conv3d: input {x} and weight {w} disagree for groups={g}")
    if len(ts) == 3 and ts[2].shape != (o,):
        raise ValueError(f"conv3d: bias {ts[2]} should have shape ({o},)")
    same_dtype(ts, "conv3d")
    return [TensorType((n, o) + conv_out_dhw(x.shape[2:], w.shape[2:], s, p, d), x.dtype)]


def _pad3(x, p):
    return np.pad(x, ((0, 0), (0, 0)) + tuple((q, q) for q in p)) if any(p) else x


def _tap3(tap, s, d, out):
    """The strided window of the padded input seen by kernel tap (i, j, k)."""
    return (slice(None), slice(None)) + tuple(slice(tap[i] * d[i], tap[i] * d[i] + s[i] * (out[i] - 1) + 1, s[i])
                                              for i in range(SPATIAL_3D))


def _taps(kernel):
    return itertools.product(*(range(k) for k in kernel))


def _im2col3(xp, kernel, s, d, out):
    """The (n, c, kd, kh, kw, do, ho, wo) patches of a padded input."""
    cols = np.empty(xp.shape[:2] + tuple(kernel) + tuple(out), dtype=xp.dtype)
    for t in _taps(kernel):
        cols[(slice(None), slice(None)) + t] = xp[_tap3(t, s, d, out)]
    return cols


def conv3d_ref(x, w, b, a):
    s, p, d, g = conv3d_geometry(a)
    n = x.shape[0]
    o, cg = w.shape[:2]
    kernel = w.shape[2:]
    out = conv_out_dhw(x.shape[2:], kernel, s, p, d)
    k = cg * int(np.prod(kernel))
    cols = _im2col3(_pad3(x, p), kernel, s, d, out).reshape(n, g, k, int(np.prod(out)))
    y = np.matmul(w.reshape(1, g, o // g, k), cols).reshape((n, o) + out)
    if b is not None:
        y += b.reshape((1, o, 1, 1, 1))
    return y


def conv3d_grad_input_ref(gy, w, a):
    s, p, d, g = conv3d_geometry(a)
    n, c = a["input_shape"][:2]
    dhw = a["input_shape"][2:]
    o, cg = w.shape[:2]
    kernel = w.shape[2:]
    out = gy.shape[2:]
    wg = w.reshape(g, o // g, cg * int(np.prod(kernel))).transpose(0, 2, 1)
    cols = np.matmul(wg[None], gy.reshape(n, g, o // g, int(np.prod(out)))).reshape((n, c) + tuple(kernel) + out)
    gxp = np.zeros((n, c) + tuple(dhw[i] + 2 * p[i] for i in range(SPATIAL_3D)), dtype=gy.dtype)
    for t in _taps(kernel):
        gxp[_tap3(t, s, d, out)] += cols[(slice(None), slice(None)) + t]
    return gxp[(slice(None), slice(None)) + tuple(slice(p[i], p[i] + dhw[i]) for i in range(SPATIAL_3D))]


def conv3d_grad_weight_ref(x, gy, a):
    s, p, d, g = conv3d_geometry(a)
    o, cg = a["weight_shape"][:2]
    kernel = tuple(a["weight_shape"][2:])
    n = x.shape[0]
    out = gy.shape[2:]
    cols = _im2col3(_pad3(x, p), kernel, s, d, out).reshape(n, g, cg * int(np.prod(kernel)), int(np.prod(out)))
    gw = np.matmul(gy.reshape(n, g, o // g, int(np.prod(out))), cols.transpose(0, 1, 3, 2)).sum(axis=0)
    return gw.reshape(tuple(a["weight_shape"]))


def _conv3d_grad_cost(node):
    """Each backward conv does as many MACs as the forward conv it differentiates."""
    if node.op == "conv3d_grad_input":
        gy, w = node.inputs
        wshape = w.shape
    else:
        gy = node.inputs[1]
        wshape = node.attrs["weight_shape"]
    return Cost(gy.type.numel * int(np.prod(wshape[1:])), sum(v.type.nbytes for v in node.inputs + node.outputs))


def _vjp_conv3d(e, node, grads, needs):
    (gy,) = grads
    x, w = node.inputs[:2]
    geo = {k: node.attrs[k] for k in CONV_KEYS}
    gx = e.emit("conv3d_grad_input", gy, w, input_shape=x.shape, **geo) if needs[0] else None
    gw = None
    if needs[1]:
        gw = (e.emit("conv3d_grad_weight", x, gy, weight_shape=w.shape, **geo)
              if not isinstance(needs[1], ChannelSelect)
              else partial_weight_grad(e, "conv3d_grad_weight", x, w, gy, geo, needs[1]))
    gb = e.emit("sum", gy, dims=(0, 2, 3, 4)) if len(needs) > 2 and needs[2] else None
    return [gx, gw, gb]


def partial_weight_grad(e, op, x, w, gy, geo, select):
    """Weight gradient (`op`: conv2d_grad_weight or conv3d_grad_weight, of input x and output
    gradient gy) of the selected channels only, as conv2d's VJP does: input channels (weight
    dim 1) of a dense conv, or channels (weight dim 0) of a depthwise conv."""
    idx = tuple(select.index)
    o, cg = w.shape[:2]
    xs = e.emit("index_select", x, dim=1, index=idx)
    if select.dim == 0 and is_depthwise(x.shape[1], o, geo["groups"]):
        gys = e.emit("index_select", gy, dim=1, index=idx)
        return e.emit(op, xs, gys, weight_shape=(len(idx), 1) + tuple(w.shape[2:]),
                      **{**geo, "groups": len(idx)})
    if select.dim == 1 and geo["groups"] == 1:
        return e.emit(op, xs, gy, weight_shape=(o, len(idx)) + tuple(w.shape[2:]), **geo)
    raise ValueError(f"{op}: channel selection on weight dim {select.dim} is only supported for dense (dim 1) "
                     f"and depthwise (dim 0) convolutions, not groups={geo['groups']}")


register(OpDef("conv3d", _conv3d_infer, lambda xs, a: [conv3d_ref(xs[0], xs[1], xs[2] if len(xs) > 2 else None, a)],
               _vjp_conv3d, cost=conv_cost, num_inputs=(2, 3), tags={LAYER_TAG},
               params=ParamOperands("conv", weight=1, bias=2)))
register(OpDef("conv3d_grad_input", lambda ts, a: [ts[0].with_shape(a["input_shape"])],
               lambda xs, a: [conv3d_grad_input_ref(xs[0], xs[1], a)], cost=_conv3d_grad_cost, num_inputs=(2, 2)))
register(OpDef("conv3d_grad_weight", lambda ts, a: [ts[0].with_shape(a["weight_shape"])],
               lambda xs, a: [conv3d_grad_weight_ref(xs[0], xs[1], a)], cost=_conv3d_grad_cost, num_inputs=(2, 2)))
