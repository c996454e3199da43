"""float32 kernels of the weight gradients fused with their SGD update (ops/gradupdate.py,
ops/embedding_update.py; passes/fuse.fuse_weight_grad_update makes them): each a call of
runtime/et_float_fused.h with constant shapes, the update's constants (lr, momentum, weight
decay) as float literals, the scratch block or row (and the embedding's touched-row list) in
the arena as the op's last outputs."""
from __future__ import annotations

from ....ir import Node
from ....ops.embedding_update import split_attrs as split_embedding_attrs
from ....ops.gradupdate import split_attrs
from ..layout import CBackendError
from .cloops import c_block
from .float32 import conv_shape_args, f32_only
from .registry import register


def _update_args(node: Node, up, ctx) -> tuple[str, str]:
    """(W, M) pointers of the update (M a null pointer without momentum) and its constants."""
    w = node.inputs[2]
    st = ctx.state_of(w)
    if st is not None and st.kind == "split":
        raise CBackendError(f"{node.op}: {w.name} is stored split; the fused update takes whole weights only")
    m = f"{ctx.ptr(node.inputs[3])}" if len(node.inputs) > 3 else "(float *)0"
    consts = ", ".join(ctx.c_float(up.get(k) or 0.0) for k in ("lr", "momentum", "weight_decay"))
    return f"{ctx.ptr(w)}, {m}", consts


@register("conv2d_grad_weight_update")
def _conv2d_grad_weight_update(node, ctx):
    """One et_conv2d_grad_weight_update call: per block of rows (or groups), its gradient, then its update."""
    f32_only(node)
    x, gy = node.inputs[:2]
    gw, up = split_attrs(node.attrs)
    wm, consts = _update_args(node, up, ctx)
    shapes = conv_shape_args(x.shape, gw["weight_shape"], gy.shape, gw)
    n_up = 2 if len(node.inputs) > 3 else 1
    rows, *sample = node.outputs[n_up:]
    t = ctx.ptr(sample[0]) if sample else "(float *)0"
    return c_block(f"et_conv2d_grad_weight_update({ctx.ptr(x)}, {ctx.ptr(gy)}, {wm}, {ctx.ptr(rows)}, {t}, "
                   f"{int(node.attrs['block'])}, {consts}, {shapes});")


@register("linear_grad_weight_update")
def _linear_grad_weight_update(node, ctx):
    """One et_dense_grad_weight_update call: per block of output rows, its gradient, then its update."""
    f32_only(node)
    x, gy = node.inputs[:2]
    _, up = split_attrs(node.attrs)
    wm, consts = _update_args(node, up, ctx)
    k, o = x.shape[-1], gy.shape[-1]
    n = x.type.numel // k
    rows, *cols = node.outputs[2 if len(node.inputs) > 3 else 1:]
    gb = ctx.ptr(cols[0]) if cols else "(float *)0"
    return c_block(f"et_dense_grad_weight_update({ctx.ptr(x)}, {ctx.ptr(gy)}, {wm}, {ctx.ptr(rows)}, {gb}, "
                   f"{int(node.attrs['block'])}, {consts}, {n}, {k}, {o});")


@register("embedding_grad_update")
def _embedding_grad_update(node, ctx):
    """One et_embedding_grad_update call: the touched rows' gradients summed and applied; the
    untouched rows too (a zero gradient) when momentum or weight decay make their step non-zero."""
    g, idx = node.inputs[:2]
    f32_only(node, [g, *node.inputs[2:], *node.outputs[:-1]])
    if idx.dtype not in ("int32", "int64"):
        raise CBackendError(f"{node.op}: indices {idx} must be int32 or int64")
    gw, up = split_embedding_attrs(node.attrs)
    wm, consts = _update_args(node, up, ctx)
    num, width = node.inputs[2].shape
    dense = int(len(node.inputs) > 3 or bool(up.get("weight_decay")))
    row, ids = node.outputs[-2:]
    return c_block(f"et_embedding_grad_update({ctx.ptr(g)}, {ctx.ptr(idx)}, {int(idx.dtype == 'int64')}, {wm}, "
                   f"{ctx.ptr(row)}, {ctx.ptr(ids)}, {idx.type.numel}, {num}, {width}, "
                   f"{int(gw.get('padding_idx', -1))}, {consts}, {dense});")
