"""Float kernels of ops/lmloss.py: runtime/et_float_lmloss.h. linear[_qw]_cross_entropy and their
gradients on float32 (C float, the _f instances; each chunk's logits through the host BLAS where the
library links one) and float64 (C double, _d) values; a weight stored quantized is int8 with float32
scales whatever the float type."""
from __future__ import annotations

from math import prod

from ....ir import Node
from ....ops.lmloss import Operands, chunk_of
from ....ops.loss import IGNORE_INDEX
from ....ops.qweights import GROUP
from ..layout import C_TYPES, CBackendError
from .context import EmitContext
from .float32_nn import float_dtype, index_type, instance_name
from .registry import register


def _args(node: Node, ctx: EmitContext, operands) -> tuple[str, str, str]:
    """(the C element type, 'H, W, wq, scale, bits, group, B, labels, lab64', 'R, K, V, C, ignore')."""
    o = Operands(operands, node.attrs)
    dt = float_dtype(node, [o.h] + ([] if o.quantized else list(o.weight)) + ([o.bias] if o.bias is not None else []))
    t = C_TYPES[dt]
    if o.quantized:
        wq, scale = o.weight
        if wq.dtype != "int8" or scale.dtype != "float32":
            raise CBackendError(f"C kernel for {node.op}: the stored weight {wq} must be int8 and its scales {scale} "
                                "float32")
        weight = f"(const {t} *)0, {ctx.ptr(wq)}, {ctx.ptr(scale)}, {int(node.attrs['bits'])}, {GROUP}"
        vocab = wq.shape[0]
    else:
        weight = f"{ctx.ptr(o.weight[0])}, (const int8_t *)0, (const float *)0, 0, {GROUP}"
        vocab = o.weight[0].shape[0]
    bias = ctx.ptr(o.bias) if o.bias is not None else f"(const {t} *)0"
    ops = f"{ctx.ptr(o.h)}, {weight}, {bias}, {ctx.ptr(o.label)}, {index_type(node, o.label)}"
    geo = (f"{prod(o.h.shape[:-1])}, {o.h.shape[-1]}, {vocab}, {chunk_of(node, vocab)}, "
           f"(int64_t){int(node.attrs.get('ignore_index', IGNORE_INDEX))}")
    return dt, ops, geo


@register("linear_cross_entropy")
@register("linear_qw_cross_entropy")
def _linear_cross_entropy(node, ctx):
    dt, ops, geo = _args(node, ctx, node.inputs)
    float_dtype(node, [node.out])
    return f"{{ *{ctx.ptr(node.out)} = {instance_name('et_linear_ce', dt)}({ops}, {geo}); }}"


@register("linear_cross_entropy_grad")
@register("linear_qw_cross_entropy_grad")
def _linear_cross_entropy_grad(node, ctx):
    g = node.inputs[0]
    dt, ops, geo = _args(node, ctx, node.inputs[1:])
    float_dtype(node, [g] + list(node.outputs))
    wants = node.attrs["wants"]
    by_name = dict(zip(wants, node.outputs))
    grads = ", ".join(ctx.ptr(by_name[n]) if n in by_name else f"({C_TYPES[dt]} *)0" for n in ("h", "w", "bias"))
    z, st = node.outputs[len(wants):len(wants) + 2]
    loss = ctx.ptr(node.outputs[-1]) if node.attrs.get("with_loss") else f"({C_TYPES[dt]} *)0"
    return (f"{{ {instance_name('et_linear_ce_grad', dt)}(*{ctx.ptr(g)}, {ops}, {grads}, {ctx.ptr(z)}, "
            f"{ctx.ptr(st)}, {loss}, {geo}); }}")
