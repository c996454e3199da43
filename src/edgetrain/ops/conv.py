"""2-D convolution (any stride, padding, dilation, groups) and its two backward ops.

Kernels are numpy: im2col + batched matmul per group, and a tap loop for depthwise
convolutions (one input and one output channel per group), which im2col handles slowly.
"""
from __future__ import annotations

import numpy as np

from ..ir import TensorType
from .base import LAYER_TAG, ChannelSelect, Cost, Int8Rule, OpDef, ParamOperands, register, same_dtype

CONV_KEYS = ("stride", "padding", "dilation", "groups")


def conv_out_hw(hw, kernel, stride, padding, dilation):
    out = [(hw[i] + 2 * padding[i] - dilation[i] * (kernel[i] - 1) - 1) // stride[i] + 1 for i in range(2)]
    if min(out) < 1:
        raise ValueError(f"conv2d: input {tuple(hw)} too small for kernel {tuple(kernel)} "
                         f"(stride {stride}, padding {padding}, dilation {dilation})")
    return tuple(out)


def conv_geometry(a):
    """(stride, padding, dilation, groups) of a conv2d-like op's attributes (qconv2d reads them too)."""
    return tuple(a["stride"]), tuple(a["padding"]), tuple(a["dilation"]), int(a["groups"])


def _conv_infer(ts, a):
    x, w = ts[0], ts[1]
    s, p, d, g = conv_geometry(a)
    if x.rank != 4 or w.rank != 4:
        raise ValueError(f"conv2d: expected 4-D input and weight, got {x} and {w}")
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    if c % g or o % g or cg != c // g:
        raise ValueError(f"conv2d: input {x} and weight {w} disagree for groups={g}")
    if len(ts) == 3 and ts[2].shape != (o,):
        raise ValueError(f"conv2d: bias {ts[2]} should have shape ({o},)")
    same_dtype(ts, "conv2d")
    return [TensorType((n, o) + conv_out_hw((h, wd), (kh, kw), s, p, d), x.dtype)]


def pad_spatial(x, p):
    """x (NCHW) zero-padded by p = (ph, pw) on both sides of H and W."""
    return np.pad(x, ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1]))) if any(p) else x


def window_tap(i, j, s, d, ho, wo):
    """The strided window of the padded input seen by kernel tap (i, j)."""
    return (slice(None), slice(None), slice(i * d[0], i * d[0] + s[0] * (ho - 1) + 1, s[0]),
            slice(j * d[1], j * d[1] + s[1] * (wo - 1) + 1, s[1]))


def im2col(xp, kh, kw, s, d, ho, wo):
    """The (n, c, kh, kw, ho, wo) patches of a padded input, one kernel tap at a time."""
    n, c = xp.shape[:2]
    cols = np.empty((n, c, kh, kw, ho, wo), dtype=xp.dtype)
    for i in range(kh):
        for j in range(kw):
            cols[:, :, i, j] = xp[window_tap(i, j, s, d, ho, wo)]
    return cols


def is_depthwise(cin, cout, g):
    """Whether a convolution is depthwise: one group per channel, as many outputs as inputs."""
    return g == cin == cout and g > 1


def conv2d_ref(x, w, b, a):
    s, p, d, g = conv_geometry(a)
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    ho, wo = conv_out_hw((h, wd), (kh, kw), s, p, d)
    xp = pad_spatial(x, p)
    if is_depthwise(c, o, g):
        y = np.zeros((n, o, ho, wo), dtype=x.dtype)
        for i in range(kh):
            for j in range(kw):
                y += xp[window_tap(i, j, s, d, ho, wo)] * w[None, :, 0, i, j, None, None]
    else:
        cols = im2col(xp, kh, kw, s, d, ho, wo).reshape(n, g, cg * kh * kw, ho * wo)
        y = np.matmul(w.reshape(1, g, o // g, cg * kh * kw), cols).reshape(n, o, ho, wo)
    if b is not None:
        y += b[None, :, None, None]
    return y


def conv2d_grad_input_ref(gy, w, a):
    s, p, d, g = conv_geometry(a)
    n, c, h, wd = a["input_shape"]
    o, cg, kh, kw = w.shape
    ho, wo = gy.shape[2:]
    gxp = np.zeros((n, c, h + 2 * p[0], wd + 2 * p[1]), dtype=gy.dtype)
    if is_depthwise(c, o, g):
        for i in range(kh):
            for j in range(kw):
                gxp[window_tap(i, j, s, d, ho, wo)] += gy * w[None, :, 0, i, j, None, None]
    else:
        wg = w.reshape(g, o // g, cg * kh * kw).transpose(0, 2, 1)
        cols = np.matmul(wg[None], gy.reshape(n, g, o // g, ho * wo)).reshape(n, c, kh, kw, ho, wo)
        for i in range(kh):
            for j in range(kw):
                gxp[window_tap(i, j, s, d, ho, wo)] += cols[:, :, i, j]
    return gxp[:, :, p[0]:p[0] + h, p[1]:p[1] + wd]


def conv2d_grad_weight_ref(x, gy, a):
    s, p, d, g = conv_geometry(a)
    o, cg, kh, kw = a["weight_shape"]
    n, c = x.shape[:2]
    ho, wo = gy.shape[2:]
    xp = pad_spatial(x, p)
    if is_depthwise(c, o, g):
        gw = np.empty((o, 1, kh, kw), dtype=x.dtype)
        for i in range(kh):
            for j in range(kw):
                gw[:, 0, i, j] = np.einsum("nchw,nchw->c", xp[window_tap(i, j, s, d, ho, wo)], gy)
        return gw
    cols = im2col(xp, kh, kw, s, d, ho, wo).reshape(n, g, cg * kh * kw, ho * wo)
    gw = np.matmul(gy.reshape(n, g, o // g, ho * wo), cols.transpose(0, 1, 3, 2)).sum(axis=0)
    return gw.reshape(o, cg, kh, kw)


def conv_cost(node):
    """MACs and bytes moved of a convolution node (its float and int8 forms alike)."""
    w, y = node.inputs[1], node.outputs[0]
    macs = y.type.numel * int(np.prod(w.shape[1:]))
    return Cost(macs, sum(v.type.nbytes for v in node.inputs + node.outputs))


def _grad_cost(node):
    """Each backward conv does as many MACs as the forward conv it differentiates."""
    a = node.attrs
    if node.op == "conv2d_grad_input":
        gy, w = node.inputs
        macs = gy.type.numel * int(np.prod(w.shape[1:]))
    else:
        x, gy = node.inputs
        macs = gy.type.numel * int(np.prod(a["weight_shape"][1:]))
    return Cost(macs, sum(v.type.nbytes for v in node.inputs + node.outputs))


def _vjp_conv(e, node, grads, needs):
    (gy,) = grads
    x, w = node.inputs[:2]
    geo = {k: node.attrs[k] for k in CONV_KEYS}
    gx = e.emit("conv2d_grad_input", gy, w, input_shape=x.shape, **geo) if needs[0] else None
    gw = None
    if needs[1]:
        if not isinstance(needs[1], ChannelSelect):  # the whole weight gradient
            gw = e.emit("conv2d_grad_weight", x, gy, weight_shape=w.shape, **geo)
        else:
            gw = _partial_weight_grad(e, x, w, gy, geo, needs[1])
    gb = e.emit("sum", gy, dims=(0, 2, 3)) if len(needs) > 2 and needs[2] else None
    return [gx, gw, gb]


def _partial_weight_grad(e, x, w, gy, geo, select):
    """Weight gradient of the selected channels only: input channels (weight dim 1) of a
    dense conv, or channels (weight dim 0) of a depthwise conv."""
    idx = tuple(select.index)
    o, cg, kh, kw = w.shape
    xs = e.emit("index_select", x, dim=1, index=idx)
    if select.dim == 0 and is_depthwise(x.shape[1], o, geo["groups"]):
        gys = e.emit("index_select", gy, dim=1, index=idx)
        return e.emit("conv2d_grad_weight", xs, gys, weight_shape=(len(idx), 1, kh, kw),
                      **{**geo, "groups": len(idx)})
    if select.dim == 1 and geo["groups"] == 1:
        return e.emit("conv2d_grad_weight", xs, gy, weight_shape=(o, len(idx), kh, kw), **geo)
    raise ValueError(f"channel selection on weight dim {select.dim} is only supported for dense (dim 1) "
                     f"and depthwise (dim 0) convolutions, not groups={geo['groups']}")


register(OpDef("conv2d", _conv_infer,
               lambda xs, a: [conv2d_ref(xs[0], xs[1], xs[2] if len(xs) > 2 else None, a)],
               _vjp_conv, cost=conv_cost, num_inputs=(2, 3), tags={LAYER_TAG},
               params=ParamOperands("conv", weight=1, bias=2), int8=Int8Rule("qconv", "qconv2d")))
register(OpDef("conv2d_grad_input", lambda ts, a: [ts[0].with_shape(a["input_shape"])],
               lambda xs, a: [conv2d_grad_input_ref(xs[0], xs[1], a)], cost=_grad_cost, num_inputs=(2, 2)))
register(OpDef("conv2d_grad_weight", lambda ts, a: [ts[0].with_shape(a["weight_shape"])],
               lambda xs, a: [conv2d_grad_weight_ref(xs[0], xs[1], a)], cost=_grad_cost, num_inputs=(2, 2)))
