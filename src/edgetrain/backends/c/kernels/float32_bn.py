"""float32 kernels of train-mode batch norm (ops/norm.py: batch_norm_train, its gradients,
batch_norm_update_stats), calling runtime/et_float_bn.h with constant shapes."""
from __future__ import annotations

from math import prod

from ....ir import Node
from ..layout import CBackendError
from .context import EmitContext
from .registry import register

_NULL = "(const float *)0"


def _f32(node: Node, vals) -> None:
    for v in vals:
        if v.dtype != "float32":
            raise CBackendError(f"C kernel for {node.op}: {v} is {v.dtype}, only float32 is supported")


def _dims(x) -> str:
    """N, C, HW of a value whose channel dim is 1."""
    return f"{x.shape[0]}, {x.shape[1]}, {prod(x.shape[2:])}"


@register("batch_norm_train")
def _batch_norm_train(node, ctx: EmitContext):
    _f32(node, list(node.inputs) + list(node.outputs))
    x = node.inputs[0]
    w, b = (ctx.ptr(v) for v in node.inputs[1:3]) if len(node.inputs) == 3 else (_NULL, _NULL)
    return (f"{{ et_bn_train_fwd({ctx.ptr(x)}, {w}, {b}, {ctx.ptr(node.outputs[0])}, {_dims(x)}, "
            f"{ctx.c_double(node.attrs['eps'])}); }}")


@register("batch_norm_train_grad_input")
def _batch_norm_train_grad_input(node, ctx: EmitContext):
    _f32(node, list(node.inputs) + list(node.outputs))
    g, x = node.inputs[:2]
    w = ctx.ptr(node.inputs[2]) if len(node.inputs) == 3 else _NULL
    return (f"{{ et_bn_train_grad_input({ctx.ptr(g)}, {ctx.ptr(x)}, {w}, {ctx.ptr(node.outputs[0])}, {_dims(x)}, "
            f"{ctx.c_double(node.attrs['eps'])}); }}")


@register("batch_norm_train_grad_weight")
def _batch_norm_train_grad_weight(node, ctx: EmitContext):
    _f32(node, list(node.inputs) + list(node.outputs))
    g, x = node.inputs
    return (f"{{ et_bn_train_grad_weight({ctx.ptr(g)}, {ctx.ptr(x)}, {ctx.ptr(node.outputs[0])}, {_dims(x)}, "
            f"{ctx.c_double(node.attrs['eps'])}); }}")


@register("batch_norm_update_stats")
def _batch_norm_update_stats(node, ctx: EmitContext):
    rm, rv, x = node.inputs[:3]
    _f32(node, (rm, rv, x))
    tracked = f"(int64_t *){ctx.ptr(node.inputs[3])}" if len(node.inputs) == 4 else "(int64_t *)0"
    momentum = node.attrs.get("momentum")
    m = ctx.c_double(-1.0 if momentum is None else momentum)  # < 0: a cumulative average (momentum=None)
    return (f"{{ et_bn_update_stats((float *){ctx.ptr(rm)}, (float *){ctx.ptr(rv)}, {ctx.ptr(x)}, {tracked}, "
            f"{_dims(x)}, {m}); }}")
