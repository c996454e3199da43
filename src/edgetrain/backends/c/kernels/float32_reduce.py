"""float32 reductions: sum, mean, amax / amin over dims and sum_to (a broadcast gradient summed back),
as nested loops with constant bounds, kept dims outer and reduced dims inner, one float accumulator
per output element."""
from __future__ import annotations

from math import prod

import numpy as np

from .cloops import c_block, contiguous_strides, merge_dims
from .context import EmitContext
from .float32 import f32_only
from .registry import register


#: a reduction's start value and step: the sum, or the largest / smallest element (a NaN, which
#: compares false with everything, taken where it comes and kept: it propagates as in numpy and torch)
_ACCUMULATE = {"sum": ("0.0f", "s += v;"),
               "amax": (EmitContext.c_float(-np.inf), "s = (v > s || v != v) ? v : s;"),
               "amin": (EmitContext.c_float(np.inf), "s = (v < s || v != v) ? v : s;")}


def _reduce(x_shape, y_ptr, x_ptr, dims, scale_div=None, acc="sum") -> str:
    """y[kept] = sum (or `acc`: _ACCUMULATE) over dims of x; kept dims outer, reduced dims inner
    (float accumulator)."""
    dims = set(dims)
    st = contiguous_strides(x_shape)
    kept = [i for i in range(len(x_shape)) if i not in dims]
    red = [i for i in range(len(x_shape)) if i in dims]
    kshape = [x_shape[i] for i in kept]
    kst = contiguous_strides(kshape)
    rdims, (rst,) = merge_dims([x_shape[i] for i in red], [[st[i] for i in red]])
    kdims, (kx, ky) = merge_dims(kshape, [[st[i] for i in kept], list(kst)])
    lines = [f"const float *X = {x_ptr}; float *Y = {y_ptr};"]
    for j, d in enumerate(kdims):
        lines.append(f"for (int k{j} = 0; k{j} < {d}; ++k{j})")
    xo = " + ".join([f"k{j} * {s}" for j, s in enumerate(kx) if s] + ["0"])
    yo = " + ".join([f"k{j} * {s}" for j, s in enumerate(ky) if s] + ["0"])
    start, step = _ACCUMULATE[acc]
    inner = [f"const float *x = X + {xo}; float s = {start};"]
    for j, d in enumerate(rdims):
        if j == len(rdims) - 1 and acc == "sum":
            inner.append("ET_SIMD_SUM(s)")
        inner.append(f"for (int r{j} = 0; r{j} < {d}; ++r{j})")
    ro = " + ".join([f"r{j} * {s}" for j, s in enumerate(rst) if s] + ["0"])
    inner.append(f"{{ float v = x[{ro}]; {step} }}")
    div = f" / {scale_div}.0f" if scale_div else ""
    inner.append(f"Y[{yo}] = s{div};")
    lines.append("{ " + "\n".join(inner) + " }")
    return c_block(*lines)


def _red_dims(rank, a):
    d = a.get("dims")
    return tuple(range(rank)) if d is None or len(d) == 0 else tuple(sorted(x % rank for x in d))


@register("sum")
def _sum(node, ctx):
    f32_only(node)
    x = node.inputs[0]
    return _reduce(x.shape, ctx.ptr(node.out), ctx.ptr(x), _red_dims(len(x.shape), node.attrs))


@register("amax")
@register("amin")
def _amax_amin(node, ctx):
    f32_only(node)
    x = node.inputs[0]
    return _reduce(x.shape, ctx.ptr(node.out), ctx.ptr(x), _red_dims(len(x.shape), node.attrs), acc=node.op)


@register("mean")
def _mean(node, ctx):
    f32_only(node)
    x = node.inputs[0]
    dims = _red_dims(len(x.shape), node.attrs)
    n = prod(x.shape[i] for i in dims)
    return _reduce(x.shape, ctx.ptr(node.out), ctx.ptr(x), dims, scale_div=n)


@register("sum_to")
def _sum_to(node, ctx):
    f32_only(node)
    x, shape = node.inputs[0], tuple(node.attrs["shape"])
    lead = len(x.shape) - len(shape)
    dims = tuple(range(lead)) + tuple(lead + i for i, d in enumerate(shape) if d == 1 and x.shape[lead + i] != 1)
    return _reduce(x.shape, ctx.ptr(node.out), ctx.ptr(x), dims)
