"""Comparisons, argmax and topk_indices: ops whose results are booleans or positions, computed at run
time from the data (a padding mask `ids != pad`, the last real token of each row, the k nearest
points of a point cloud), never differentiated: a comparison or an argmax is piecewise constant, so
torch gives its inputs no gradient through it, and neither does autodiff here (their outputs are
bool and int64, which build_backward never differentiates; vjp None says so to the op table)."""
from __future__ import annotations

import numpy as np

from ..ir import TensorType
from .base import Cost, OpDef, broadcast_shapes, norm_dim, register, same_dtype

#: the comparisons of `compare`'s attr `cmp`, as numpy functions (torch's eq, ne, lt, le, gt, ge)
COMPARISONS = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
               "gt": np.greater, "ge": np.greater_equal}


def _compare_infer(ts, a):
    if a.get("cmp") not in COMPARISONS:
        raise ValueError(f"compare: cmp must be one of {sorted(COMPARISONS)}, got {a.get('cmp')!r}")
    same_dtype(ts, "compare")  # the frontend casts mixed operands to torch's promoted dtype
    return [TensorType(broadcast_shapes(ts[0].shape, ts[1].shape), "bool")]


def _compare_ref(xs, a):
    return [np.asarray(COMPARISONS[a["cmp"]](xs[0], xs[1]), dtype=bool)]


def _argmax_dims(shape, a) -> tuple:
    """The output shape of argmax over attr `dim` (None: over all elements, flattened)."""
    dim, keep = a.get("dim"), a.get("keepdim", False)
    if not shape:  # a scalar: dim 0 or -1, as torch allows
        if dim not in (None, 0, -1):
            raise ValueError(f"argmax: dim {dim} out of range for a scalar")
        return ()
    if dim is None:
        return (1,) * len(shape) if keep else ()
    d = norm_dim(dim, len(shape))
    return tuple(1 if i == d else s for i, s in enumerate(shape) if keep or i != d)


def _argmax_infer(ts, a):
    if 0 in ts[0].shape:
        raise ValueError(f"argmax of an empty tensor {ts[0]}")
    return [TensorType(_argmax_dims(ts[0].shape, a), "int64")]


def _argmax_ref(xs, a):
    x = xs[0]
    dim = a.get("dim")
    axis = None if dim is None or x.ndim == 0 else norm_dim(dim, x.ndim)
    out = np.argmax(x, axis=axis)  # the first maximum, a NaN counting as the maximum: as torch
    return [np.asarray(out, dtype=np.int64).reshape(_argmax_dims(x.shape, a))]


register(OpDef("compare", _compare_infer, _compare_ref, vjp=None, num_inputs=(2, 2)))
register(OpDef("argmax", _argmax_infer, _argmax_ref, vjp=None, num_inputs=(1, 1),
               cost=lambda n: Cost(n.inputs[0].type.numel, n.inputs[0].type.nbytes + n.outputs[0].type.nbytes)))


# --- topk_indices -----------------------------------------------------------------------------
def _topk_infer(ts, a):
    x = ts[0]
    if not x.shape:
        raise ValueError("topk_indices of a 0-d tensor: torch.topk / sort take one along a dim")
    d = norm_dim(a["dim"], x.rank)
    if not 1 <= a["k"] <= x.shape[d]:
        raise ValueError(f"topk_indices: k={a['k']} outside 1..{x.shape[d]} (dim {d} of {x})")
    return [TensorType(tuple(a["k"] if i == d else s for i, s in enumerate(x.shape)), "int64")]


def _topk_ref(xs, a):
    """The positions of the k largest (`largest`) or smallest along dim, in that order; equal
    values in the order of their positions (a stable sort), a NaN larger than every number (first
    among the largest, last among the smallest, as torch's sort and topk)."""
    x = np.moveaxis(xs[0], norm_dim(a["dim"], xs[0].ndim), -1)
    if x.dtype.kind == "f":
        key = np.lexsort((-x, ~np.isnan(x)), axis=-1) if a["largest"] else np.argsort(x, axis=-1, kind="stable")
    else:  # (~v reverses the order of integers and never overflows)
        v = x.astype(np.int64)
        key = np.argsort(~v if a["largest"] else v, axis=-1, kind="stable")
    return [np.ascontiguousarray(np.moveaxis(key[..., :a["k"]], -1, norm_dim(a["dim"], xs[0].ndim)), dtype=np.int64)]


#: topk_indices(x; k, dim, largest): what torch.topk, sort and argsort index x with (their values are
#: a gather of x at these positions, which carries the gradient as torch's does)
register(OpDef("topk_indices", _topk_infer, _topk_ref, vjp=None, num_inputs=(1, 1),
               cost=lambda n: Cost(n.inputs[0].type.numel * n.attrs["k"],
                                   n.inputs[0].type.nbytes + n.outputs[0].type.nbytes)))
