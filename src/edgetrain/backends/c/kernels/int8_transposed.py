"""C kernels of ops/qconv_transpose.py (int8 transposed convolution and its float32 input and
weight gradients): runtime/et_int8_transposed.h, bit-exact with the references. The bias
gradient is qconv2d_grad_bias's kernel (kernels/int8_grad.py)."""
from __future__ import annotations

from ....ir import Node
from ....ops.qconv import out_scales
from ..layout import CBackendError
from .int8_params import I32, block, c_floats, c_ints
from .registry import register


def _table(x_shape, w_shape, y_shape, a) -> str:
    """The et_int8_transposed.h geometry table P (ET_T_* order) of one layer."""
    n, c, h, w = x_shape
    ci, og, kh, kw = w_shape
    ho, wo = y_shape[2:]
    if ci != c:
        raise CBackendError(f"qconv_transpose2d: weight {tuple(w_shape)} does not match input {tuple(x_shape)}")
    s, p, d = a["stride"], a["padding"], a["dilation"]
    vals = (n, c, h, w, og * int(a["groups"]), og, kh, kw, ho, wo, *s, *p, *d, int(a["groups"]),
            int(a.get("x_zero", 0)), int(a.get("y_zero", 0)), int(a.get("qmin", -128)), int(a.get("qmax", 127)))
    return c_ints(I32, "P", vals)


def _check(node: Node, v, dtype: str):
    if v.dtype != dtype:
        raise CBackendError(f"C kernel for {node.op}: expected a {dtype} operand, got {v}")


@register("qconv_transpose2d")
def qconv_transpose2d(node: Node, ctx) -> str:
    x, w, b = node.inputs
    y = node.outputs[0]
    a = node.attrs
    _check(node, x, "int8")
    lines = [_table(x.shape, w.shape, y.shape, a)]
    if a.get("float_out"):
        lines.append(c_floats(ctx, "OS", out_scales(a)))
        call = f"et_qconv_transpose(P, {ctx.ptr(x)}, {ctx.ptr(w)}, {ctx.ptr(b)}, 0, 0, OS, 0, {ctx.ptr(y)});"
    else:
        lines += [c_ints(I32, "M", a["mult"]), c_ints("int8_t", "S", a["shift"])]
        call = f"et_qconv_transpose(P, {ctx.ptr(x)}, {ctx.ptr(w)}, {ctx.ptr(b)}, M, S, 0, {ctx.ptr(y)}, 0);"
    return block(lines + [call])


@register("qconv_transpose2d_grad_input")
def qconv_transpose2d_grad_input(node: Node, ctx) -> str:
    g, w = node.inputs
    a = node.attrs
    _check(node, g, "float32")
    return block([_table(a["input_shape"], w.shape, g.shape, a), c_floats(ctx, "WS", a["w_scales"]),
                  f"et_qconv_transpose_grad_input(P, {ctx.ptr(g)}, {ctx.ptr(w)}, WS, {ctx.ptr(node.outputs[0])});"])


@register("qconv_transpose2d_grad_weight")
def qconv_transpose2d_grad_weight(node: Node, ctx) -> str:
    x, g = node.inputs
    a = node.attrs
    _check(node, g, "float32")
    return block([_table(x.shape, a["weight_shape"], g.shape, a), c_floats(ctx, "SC", a["scales"]),
                  f"et_qconv_transpose_grad_weight(P, {ctx.ptr(x)}, {ctx.ptr(g)}, SC, {ctx.ptr(node.outputs[0])});"])
