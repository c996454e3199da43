"""Kernels of the ops that compute booleans and positions from data at run time (ops/compare.py):
`compare` (a padding mask `ids != pad`), `argmax` (the last real token of each row) and
`topk_indices` (torch.topk, sort). They take operands of any C type of layout.C_TYPES; compare
writes bools as uint8_t 0 / 1, argmax and topk_indices int64_t positions. Integer add / sub / mul
(the index arithmetic around them) are the binary kernels of kernels/float32.py."""
from __future__ import annotations

from math import prod

from ....ir import Node
from ....ops.base import norm_dim
from ..layout import C_TYPES, CBackendError
from .cloops import broadcast_strides, c_block, contiguous_strides, loop_nest
from .context import EmitContext
from .registry import register

#: C operators of compare's attr `cmp` (IEEE semantics: NaN compares unequal to everything, as numpy)
_COMPARE = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_FLOATS = ("float32", "float64")


def _ctype(node: Node, v) -> str:
    if v.dtype not in C_TYPES:
        raise CBackendError(f"C kernel for {node.op}: {v} has no C type")
    return C_TYPES[v.dtype]


@register("compare")
def _compare(node: Node, ctx: EmitContext) -> str:
    a, b = node.inputs
    y = node.out
    if a.dtype != b.dtype or y.dtype != "bool":
        raise CBackendError(f"C kernel for compare: operands {a}, {b} must have one dtype and give bool, got {y}")
    t, sym = _ctype(node, a), _COMPARE[node.attrs["cmp"]]
    sts = [broadcast_strides(a.shape, y.shape), broadcast_strides(b.shape, y.shape), contiguous_strides(y.shape)]
    return c_block(f"const {t} *A = {ctx.ptr(a)}; const {t} *B = {ctx.ptr(b)}; uint8_t *Y = {ctx.ptr(y)};",
                   loop_nest(y.shape, sts, lambda o: f"Y[{o[2]}] = (uint8_t)(A[{o[0]}] {sym} B[{o[1]}]);"))


@register("argmax")
def _argmax(node: Node, ctx: EmitContext) -> str:
    """For each (outer, inner) position, the first k along the dim with the largest x; a NaN
    is larger than everything (the first NaN wins), as in torch and numpy."""
    x, y = node.inputs[0], node.out
    if y.dtype != "int64":
        raise CBackendError(f"C kernel for argmax: the result {y} must be int64")
    t = _ctype(node, x)
    dim = node.attrs.get("dim")
    if dim is None or not x.shape:
        outer, d, inner = 1, x.type.numel, 1
    else:
        dim = norm_dim(dim, len(x.shape))
        outer, d, inner = prod(x.shape[:dim]), x.shape[dim], prod(x.shape[dim + 1:])
    return c_block(f"const {t} *X = {ctx.ptr(x)}; int64_t *Y = {ctx.ptr(y)};",
                   f"for (long o = 0; o < {outer}; ++o) for (long j = 0; j < {inner}; ++j) {{",
                   f"  const {t} *x = X + o * {d * inner} + j; {t} m = x[0]; int64_t best = 0;",
                   f"  for (long k = 1; k < {d}; ++k) {{",
                   f"    const {t} v = x[k * {inner}];",
                   f"    if ({'v > m || (v != v && m == m)' if x.dtype in _FLOATS else 'v > m'}) "
                   "{ m = v; best = k; }",
                   "  }",
                   f"  Y[o * {inner} + j] = best;",
                   "}")


@register("topk_indices")
def _topk_indices(node: Node, ctx: EmitContext) -> str:
    """For each (outer, inner) position, the k positions along the dim with the largest (smallest)
    x in that order, kept sorted in the output itself as each element is read (an insertion: k
    compares an element at most); an element goes before another only if strictly better, so equal
    values keep the order of their positions, and a NaN is better than every number for the largest,
    worse for the smallest: the reference's stable sort."""
    x, y = node.inputs[0], node.out
    if y.dtype != "int64":
        raise CBackendError(f"C kernel for topk_indices: the result {y} must be int64")
    t = _ctype(node, x)
    dim = norm_dim(node.attrs["dim"], len(x.shape))
    k, largest = int(node.attrs["k"]), bool(node.attrs["largest"])
    outer, d, inner = prod(x.shape[:dim]), x.shape[dim], prod(x.shape[dim + 1:])
    cmp = ">" if largest else "<"
    if x.dtype in _FLOATS:  # (a NaN: the best for the largest, the worst for the smallest)
        better = f"(a {cmp} b || (a != a && b == b))" if largest else f"(a {cmp} b || (b != b && a == a))"
    else:
        better = f"(a {cmp} b)"
    return c_block(f"const {t} *X = {ctx.ptr(x)}; int64_t *Y = {ctx.ptr(y)};",
                   f"for (long o = 0; o < {outer}; ++o) for (long j = 0; j < {inner}; ++j) {{",
                   f"  const {t} *x = X + o * {d * inner} + j; int64_t *y = Y + o * {k * inner} + j; long n = 0;",
                   f"  for (long i = 0; i < {d}; ++i) {{",
                   f"    const {t} a = x[i * {inner}];",
                   "    long p;",
                   f"    if (n == {k}) {{ const {t} b = x[y[({k} - 1) * {inner}] * {inner}]; if (!{better}) continue; "
                   f"p = {k} - 1; }} else p = n++;",
                   f"    while (p > 0) {{ const {t} b = x[y[(p - 1) * {inner}] * {inner}]; if (!{better}) break; "
                   f"y[p * {inner}] = y[(p - 1) * {inner}]; --p; }}",
                   f"    y[p * {inner}] = i;",
                   "  }",
                   "}")
