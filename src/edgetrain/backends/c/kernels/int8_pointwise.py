"""int8 kernels of ops/qpointwise.py: runtime/et_int8_pointwise.h (qleaky_relu, its backward)."""
from __future__ import annotations

from ....ir import Node
from ....ops.qpointwise import slope_multiplier
from .int8_params import block, c_int
from .registry import register


@register("qleaky_relu")
def qleaky_relu(node: Node, ctx) -> str:
    x = node.inputs[0]
    mult, shift = slope_multiplier(node.attrs["negative_slope"])
    return block([f"et_qleaky_relu({ctx.ptr(x)}, {ctx.ptr(node.outputs[0])}, {x.type.numel}, "
                  f"{c_int(node.attrs['zero'])}, {c_int(mult)}, {c_int(shift)});"])


@register("qleaky_relu_grad")
def qleaky_relu_grad(node: Node, ctx) -> str:
    g, m = node.inputs
    return block([f"et_qleaky_relu_grad({ctx.ptr(g)}, (const uint8_t *){ctx.ptr(m)}, {ctx.ptr(node.outputs[0])}, "
                  f"{g.type.numel}, {ctx.c_float(node.attrs['negative_slope'])});"])
