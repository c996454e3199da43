"""Float kernels of ops/groupnorm.py: runtime/et_float_gnorm.h. group_norm, its input gradient
and its weight gradient on float32 (C float, the _f instances) and float64 (C double, _d)
values of shape (N, C, *spatial); the spatial dims are one run of S values per channel."""
from __future__ import annotations

from math import prod

from ....ir import Node
from ..layout import C_TYPES
from .context import EmitContext
from .float32_nn import float_dtype, instance_name
from .registry import register


def _geometry(node: Node, x) -> str:
    """'N, C, G, S' of the (N, C, *spatial) operand x."""
    n, c = x.shape[:2]
    return f"{n}, {c}, {int(node.attrs['groups'])}, {prod(x.shape[2:])}"


def _null(dtype: str) -> str:
    return f"(const {C_TYPES[dtype]} *)0"


def _optional(node: Node, ctx: EmitContext, i: int, dtype: str) -> str:
    return ctx.ptr(node.inputs[i]) if len(node.inputs) > i else _null(dtype)


@register("group_norm")
def _group_norm(node, ctx):
    dt = float_dtype(node)
    x = node.inputs[0]
    return (f"{{ {instance_name('et_group_norm', dt)}({ctx.ptr(x)}, {_optional(node, ctx, 1, dt)}, "
            f"{_optional(node, ctx, 2, dt)}, {ctx.ptr(node.out)}, {_geometry(node, x)}, "
            f"{ctx.c_double(node.attrs['eps'])}); }}")


@register("group_norm_grad_input")
def _group_norm_grad_input(node, ctx):
    dt = float_dtype(node)
    g, x = node.inputs[:2]
    return (f"{{ {instance_name('et_group_norm_grad_input', dt)}({ctx.ptr(g)}, {ctx.ptr(x)}, {_optional(node, ctx, 2, dt)}, "
            f"{ctx.ptr(node.out)}, {_geometry(node, x)}, {ctx.c_double(node.attrs['eps'])}); }}")


@register("group_norm_grad_weight")
def _group_norm_grad_weight(node, ctx):
    dt = float_dtype(node)
    g, x = node.inputs
    return (f"{{ {instance_name('et_group_norm_grad_weight', dt)}({ctx.ptr(g)}, {ctx.ptr(x)}, {ctx.ptr(node.out)}, "
            f"{_geometry(node, x)}, {ctx.c_double(node.attrs['eps'])}); }}")
