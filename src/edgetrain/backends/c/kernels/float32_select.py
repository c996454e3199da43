"""Kernels of ops/select.py (runtime/et_float_select.h): where, cumsum, index_put, index_get.

where and the two indexing ops are emitted as loops with constant bounds over their broadcast
operands, for every C type of layout.C_TYPES (masks and positions are bool, int32 or int64
tensors as often as float ones); cumsum calls et_float_select.h's float / double / int32 /
int64 instance. An index out of range of its dim is reported through ET_ERROR_HOOK and its
element skipped (index_put) or read as zero (index_get); the reference runtime raises there."""
from __future__ import annotations

from math import prod

from ....ir import Node
from ....ops.base import broadcast_shapes, norm_dim
from ....ops.select import indexed_shape
from ..layout import C_TYPES, CBackendError
from .cloops import broadcast_strides, c_block, contiguous_strides, loop_nest
from .context import EmitContext
from .registry import register

#: et_cumsum's instance per dtype
_CUMSUM = {"float32": "et_cumsum_f", "float64": "et_cumsum_d", "int32": "et_cumsum_i32", "int64": "et_cumsum_i64"}
#: integer sums done in the unsigned type of their width (wrapping around as numpy's, not undefined in C)
_UNSIGNED = {"int32": "uint32_t", "int64": "uint64_t", "int8": "uint8_t"}
_INDEX = ("int32", "int64")


def _ctype(node: Node, v) -> str:
    if v.dtype not in C_TYPES:
        raise CBackendError(f"C kernel for {node.op}: {v} has no C type")
    return C_TYPES[v.dtype]


@register("where")
def _where(node: Node, ctx: EmitContext) -> str:
    cond, a, b = node.inputs
    y = node.out
    if cond.dtype != "bool" or a.dtype != b.dtype or a.dtype != y.dtype:
        raise CBackendError(f"C kernel for where: operands {cond}, {a}, {b} must be (bool, T, T)")
    t = _ctype(node, y)
    sts = [broadcast_strides(v.shape, y.shape) for v in (cond, a, b)] + [contiguous_strides(y.shape)]
    return c_block(f"const uint8_t *C = {ctx.ptr(cond)}; const {t} *A = {ctx.ptr(a)}; const {t} *B = {ctx.ptr(b)}; "
                   f"{t} *Y = {ctx.ptr(y)};",
                   loop_nest(y.shape, sts, lambda o: f"Y[{o[3]}] = C[{o[0]}] ? A[{o[1]}] : B[{o[2]}];"))


@register("cumsum")
def _cumsum(node: Node, ctx: EmitContext) -> str:
    x, y = node.inputs[0], node.out
    if x.dtype not in _CUMSUM or y.dtype != x.dtype:
        raise CBackendError(f"C kernel for cumsum: {x} must be one of {sorted(_CUMSUM)}")
    if not x.shape:
        return c_block(f"*{ctx.ptr(y)} = *{ctx.ptr(x)};")
    dim = norm_dim(node.attrs["dim"], len(x.shape))
    outer, d, inner = prod(x.shape[:dim]), x.shape[dim], prod(x.shape[dim + 1:])
    return (f"{{ {_CUMSUM[x.dtype]}({ctx.ptr(x)}, {ctx.ptr(y)}, {outer}, {d}, {inner}, "
            f"{int(bool(node.attrs.get('reverse', False)))}); }}")


def _positions(node: Node, x, idx, first: int):
    """(the indexed shape S, stride sets over S: x's offset of the un-indexed dims, then one per
    index tensor, and C statements computing `p`, x's element, and `ok` from the offsets)."""
    for i in idx:
        if i.dtype not in _INDEX:
            raise CBackendError(f"C kernel for {node.op}: index {i} must be one of {_INDEX}")
    shape = indexed_shape(x.type, [i.type for i in idx], first, node.op)
    k, bshape = len(idx), broadcast_shapes(*[i.shape for i in idx])
    xs = contiguous_strides(x.shape)
    rest = len(x.shape) - first - k
    sets = [tuple(xs[:first]) + (0,) * len(bshape) + tuple(xs[first + k:])]
    sets += [(0,) * first + broadcast_strides(i.shape, bshape) + (0,) * rest for i in idx]

    def locate(o) -> str:
        lines = [f"long p = {o[0]}; int ok = 1;"]
        for j in range(len(idx)):
            lines.append(f"{{ const int64_t q = et_sel_position((int64_t)I{j}[{o[1 + j]}], {x.shape[first + j]}); "
                         f"if (q < 0) ok = 0; else p += (long)q * {xs[first + j]}; }}")
        return " ".join(lines)

    return shape, sets, locate


def _serial(nest: str) -> str:
    """A loop nest without its `omp simd` pragma: index_put's iterations may write one position
    twice (repeated indices), a dependence that simd execution would break."""
    return "\n".join(line for line in nest.splitlines() if line.strip() != "ET_SIMD")


def _index_decls(node: Node, ctx: EmitContext, idx) -> str:
    return " ".join(f"const {_ctype(node, i)} *I{j} = {ctx.ptr(i)};" for j, i in enumerate(idx))


@register("index_put")
def _index_put(node: Node, ctx: EmitContext) -> str:
    """Y = X, then each element of the values (broadcast to the indexed shape) written (or added)
    at its position, in row-major order of the indexed shape: a repeated position keeps the last
    value written, or the sum in that order."""
    x, v, idx = node.inputs[0], node.inputs[1], node.inputs[2:]
    y = node.out
    t = _ctype(node, y)
    accumulate = bool(node.attrs["accumulate"])
    if accumulate and y.dtype == "bool":
        raise CBackendError("C kernel for index_put: accumulate on a bool tensor")
    shape, sets, locate = _positions(node, x, idx, node.attrs["first"])
    sets = sets + [broadcast_strides(v.shape, shape)]
    vo = len(sets) - 1
    if not accumulate:
        put = "Y[p] = V[{}];"
    elif y.dtype in _UNSIGNED:
        put = f"Y[p] = ({t})(({_UNSIGNED[y.dtype]})Y[p] + ({_UNSIGNED[y.dtype]})V[{{}}]);"
    else:
        put = "Y[p] += V[{}];"
    lines = [f"const {t} *X = {ctx.ptr(x)}; const {t} *V = {ctx.ptr(v)}; {t} *Y = {ctx.ptr(y)}; "
             + _index_decls(node, ctx, idx),
             f"if (Y != X) memcpy(Y, X, {y.type.nbytes});"]
    if prod(shape):
        lines.append(_serial(loop_nest(shape, sets, lambda o: f"{locate(o)} if (ok) {put.format(o[vo])} else "
                                                               f"ET_ERROR_HOOK(\"index_put: index out of range\");")))
    return c_block(*lines)


@register("index_get")
def _index_get(node: Node, ctx: EmitContext) -> str:
    x, idx = node.inputs[0], node.inputs[1:]
    y = node.out
    t = _ctype(node, y)
    shape, sets, locate = _positions(node, x, idx, node.attrs["first"])
    sets = sets + [contiguous_strides(shape)]
    yo = len(sets) - 1
    lines = [f"const {t} *X = {ctx.ptr(x)}; {t} *Y = {ctx.ptr(y)}; " + _index_decls(node, ctx, idx)]
    if prod(shape):
        lines.append(loop_nest(shape, sets, lambda o: f"{locate(o)} if (ok) Y[{o[yo]}] = X[p]; else "
                                                       f"{{ Y[{o[yo]}] = 0; ET_ERROR_HOOK(\"index_get: index out of "
                                                       f"range\"); }}"))
    return c_block(*lines)
