"""Float kernels of ops/conv_nd.py (conv3d, conv_transpose2d and their backward ops): runtime/et_float_conv_nd.h.

float32 only, as the conv2d kernels of kernels/float32.py; each emitter is one call with the
node's constant shapes and geometry."""
from __future__ import annotations

from ....ir import Node
from ....ops.conv import conv_out_hw
from .cloops import c_block
from .context import EmitContext
from .float32 import f32_only
from .registry import register

_NO_BIAS = "(const float *)0"


def _ints(*vals) -> str:
    return ", ".join(str(int(v)) for v in vals)


@register("conv_transpose2d")
def _conv_transpose2d(node: Node, ctx: EmitContext) -> str:
    f32_only(node)
    x, w = node.inputs[:2]
    b = ctx.ptr(node.inputs[2]) if len(node.inputs) > 2 else _NO_BIAS
    y = node.out
    a = node.attrs
    s, p, d = tuple(a["stride"]), tuple(a["padding"]), tuple(a["dilation"])
    n, ci, h, wd = x.shape
    co, ho, wo = y.shape[1:]
    # the conv2d this is the input gradient of gives back (h, wd) unless output padding reaches a further window
    exact = conv_out_hw((ho, wo), w.shape[2:], s, p, d) == (h, wd)
    geo = _ints(n, ci, h, wd, co, ho, wo, *w.shape[2:], *s, *p, *d, a["groups"], exact)
    return c_block(f"et_conv_transpose2d({ctx.ptr(x)}, {ctx.ptr(w)}, {b}, {ctx.ptr(y)}, {geo});")


def _conv3d_geo(xs, ws, ys, a) -> str:
    """N, C, D, H, W, O, DO, HO, WO, KD, KH, KW, SD, SH, SW, PD, PH, PW, DD, DH, DW, G."""
    return _ints(*xs, ys[1], *ys[2:], *ws[2:], *a["stride"], *a["padding"], *a["dilation"], a["groups"])


@register("conv3d")
def _conv3d(node: Node, ctx: EmitContext) -> str:
    f32_only(node)
    x, w = node.inputs[:2]
    b = ctx.ptr(node.inputs[2]) if len(node.inputs) > 2 else _NO_BIAS
    y = node.out
    geo = _conv3d_geo(x.shape, w.shape, y.shape, node.attrs)
    return c_block(f"et_conv3d({ctx.ptr(x)}, {ctx.ptr(w)}, {b}, {ctx.ptr(y)}, {geo});")


@register("conv3d_grad_input")
def _conv3d_grad_input(node: Node, ctx: EmitContext) -> str:
    f32_only(node)
    gy, w = node.inputs
    gx = node.out
    geo = _conv3d_geo(gx.shape, w.shape, gy.shape, node.attrs)
    return c_block(f"et_conv3d_grad_input({ctx.ptr(gy)}, {ctx.ptr(w)}, {ctx.ptr(gx)}, {geo});")


@register("conv3d_grad_weight")
def _conv3d_grad_weight(node: Node, ctx: EmitContext) -> str:
    f32_only(node)
    x, gy = node.inputs
    gw = node.out
    geo = _conv3d_geo(x.shape, gw.shape, gy.shape, node.attrs)
    return c_block(f"et_conv3d_grad_weight({ctx.ptr(x)}, {ctx.ptr(gy)}, {ctx.ptr(gw)}, {geo});")
