"""Reductions over static dims: sum, mean, amax and amin (with keepdim).

amax / amin (torch.amax / torch.amin, and torch.max / torch.min without a dim) take the largest
/ smallest element of each slice, a NaN counting as both (it propagates, as in torch). Their
gradient is torch's: each slice's output gradient shared evenly among the elements equal to
its result, (g / count) where x equals it, else 0."""
from __future__ import annotations

import numpy as np

from .base import SAME_SCALE_TAG, Emitter, Int8Rule, OpDef, norm_dim, register


def reduced_dims(rank, a):
    """The sorted dims a reduction's attributes name (`dims`; none or empty: every dim)."""
    dims = a.get("dims")
    return tuple(range(rank)) if dims is None or len(dims) == 0 else tuple(sorted(norm_dim(d, rank) for d in dims))


def reduce_infer(ts, a):
    """The shape rule of a reduction over `reduced_dims` (kept as 1 with `keepdim`)."""
    t = ts[0]
    dims = reduced_dims(t.rank, a)
    shape = [1 if i in dims else d for i, d in enumerate(t.shape)] if a.get("keepdim", False) else [
        d for i, d in enumerate(t.shape) if i not in dims]
    return [t.with_shape(shape)]


def _broadcast_back(e: Emitter, g, node):
    """Reshape a reduced gradient to keepdim form and expand it to the input shape."""
    x = node.inputs[0]
    dims = reduced_dims(x.type.rank, node.attrs)
    kept = tuple(1 if i in dims else d for i, d in enumerate(x.shape))
    if g.shape != kept:
        g = e.emit("reshape", g, shape=kept)
    return e.emit("expand", g, shape=x.shape)


def _vjp_sum(e, node, grads, needs):
    return [_broadcast_back(e, grads[0], node)]


def _vjp_mean(e, node, grads, needs):
    x = node.inputs[0]
    n = x.type.numel // max(node.out.type.numel, 1)
    return [e.emit("mul", _broadcast_back(e, grads[0], node), e.const(1.0 / n, x.dtype))]


def _vjp_extreme(e, node, grads, needs):
    x = node.inputs[0]
    hit = e.emit("cast", e.emit("compare", x, _broadcast_back(e, node.out, node), cmp="eq"), dtype=x.dtype)
    count = e.emit("sum", hit, dims=node.attrs.get("dims"), keepdim=node.attrs.get("keepdim", False))
    return [e.emit("mul", _broadcast_back(e, e.emit("div", grads[0], count), node), hit)]


def _extreme_infer(name):
    def infer(ts, a):
        t = ts[0]
        if any(t.shape[d] == 0 for d in reduced_dims(t.rank, a)):
            raise ValueError(f"{name} over an empty dim of {t}: torch has no identity for it either")
        return reduce_infer(ts, a)

    return infer


def _reducer(fn):
    def ref(xs, a):
        x = xs[0]
        return [np.asarray(fn(x, axis=reduced_dims(x.ndim, a), keepdims=a.get("keepdim", False)), dtype=x.dtype)]

    return ref


register(OpDef("sum", reduce_infer, _reducer(np.sum), _vjp_sum, num_inputs=(1, 1)))
for _name, _fn in (("amax", np.amax), ("amin", np.amin)):
    register(OpDef(_name, _extreme_infer(_name), _reducer(_fn), _vjp_extreme, num_inputs=(1, 1)))
def is_global_mean(n) -> bool:
    """A mean over the two spatial dims of an NCHW tensor (global average pooling): the
    only mean quantize/convert.py runs in int8 (qmean)."""
    x = n.inputs[0]
    dims = tuple(sorted(d % 4 for d in (n.attrs.get("dims") or ()))) if x.type.rank == 4 else ()
    return dims == (2, 3)


register(OpDef("mean", reduce_infer, _reducer(np.mean), _vjp_mean, num_inputs=(1, 1), tags={SAME_SCALE_TAG},
               int8=Int8Rule("same", "qmean", applies=is_global_mean)))
