"""Float kernels of the shape ops of runtime/et_float_shape.h: pad, gather and gather_grad.
Each works on float32 (C float) and float64 (C double) values of any rank up to
ET_SHAPE_MAX_RANK; gather's index operand is int32 or int64. Shapes go to the C functions as
constant arrays declared in the emitted block."""
from __future__ import annotations

from ....ir import Node
from ..layout import CBackendError
from .context import EmitContext
from .registry import register

FLOATS = ("float32", "float64")
INDEX = ("int32", "int64")
#: ET_SHAPE_MAX_RANK of et_float_shape.h
MAX_RANK = 8
_SUFFIX = {"float32": "f", "float64": "d"}


def _float(node: Node, vals) -> str:
    dts = sorted({v.dtype for v in vals})
    if len(dts) != 1 or dts[0] not in FLOATS:
        raise CBackendError(f"C kernel for {node.op}: operands {[str(v.type) for v in vals]} must all be one of "
                            f"{FLOATS}")
    return dts[0]


def _rank(node: Node, shape) -> int:
    if not 1 <= len(shape) <= MAX_RANK:
        raise CBackendError(f"C kernel for {node.op}: rank {len(shape)} (1 to {MAX_RANK})")
    return len(shape)


def _longs(name: str, xs) -> str:
    return f"static const long {name}[] = {{{', '.join(str(int(x)) for x in xs)}}};"


def _index(node: Node, idx) -> int:
    if idx.dtype not in INDEX:
        raise CBackendError(f"C kernel for {node.op}: indices {idx} must be one of {INDEX}")
    return int(idx.dtype == "int64")


def _literal(ctx: EmitContext, dtype: str, x) -> str:
    return ctx.c_float(x) if dtype == "float32" else ctx.c_double(x)


@register("pad")
def _pad(node, ctx):
    x, y = node.inputs[0], node.out
    dt = _float(node, [x, y])
    if x.type.numel == 0:  # nothing to copy: the border only
        fill = _literal(ctx, dt, node.attrs["value"])
        return f"{{ for (long i = 0; i < {y.type.numel}; ++i) {ctx.ptr(y)}[i] = {fill}; }}"
    if len(x.shape) == 0:
        return f"{{ {ctx.ptr(y)}[0] = {ctx.ptr(x)}[0]; }}"
    rank = _rank(node, x.shape)
    return "{ " + " ".join([
        _longs("xs", x.shape), _longs("before", node.attrs["before"]), _longs("after", node.attrs["after"]),
        f"et_pad_{_SUFFIX[dt]}({ctx.ptr(x)}, {ctx.ptr(y)}, {rank}, xs, before, after, "
        f"{_literal(ctx, dt, node.attrs['value'])});"]) + " }"


def _gather_call(fn: str, node, ctx, src, idx, dst, xshape):
    dt = _float(node, [src, dst])
    rank = _rank(node, xshape)
    dim = node.attrs["dim"] % rank
    return "{ " + " ".join([
        _longs("xs", xshape), _longs("is", idx.shape),
        f"{fn}_{_SUFFIX[dt]}({ctx.ptr(src)}, {ctx.ptr(idx)}, {_index(node, idx)}, {ctx.ptr(dst)}, {rank}, xs, is, "
        f"{dim});"]) + " }"


@register("gather")
def _gather(node, ctx):
    x, idx = node.inputs
    return _gather_call("et_gather", node, ctx, x, idx, node.out, x.shape)


@register("gather_grad")
def _gather_grad(node, ctx):
    g, idx = node.inputs
    return _gather_call("et_gather_grad", node, ctx, g, idx, node.out, node.out.shape)
