"""Selection and scans: where with a tensor condition, cumsum, index_put, and their VJPs.

- where(cond, a, b): a where the boolean cond holds, else b, the three broadcast together
  (torch.where; masked_fill is a where with a scalar). Gradients: where(cond, g, 0) to a and
  where(cond, 0, g) to b, each summed back to its operand's shape.
- cumsum(x; dim, reverse): running sums along dim (reverse: from the end, the VJP of cumsum).
  Float sums accumulate in float64 and each result is rounded once, as torch's CPU kernel
  does (its accumulator type for float is double); integer sums wrap around as numpy's.
- index_put(x, values, i0, i1, ...; first, accumulate): x with values written (or, with
  accumulate, added) at the positions the index tensors name along dims first, first + 1, ...
  (torch's x.index_put((None, ..., i0, i1, ...), values, accumulate)); the index tensors
  broadcast together to B, and values broadcast to the indexed shape
  x.shape[:first] + B + x.shape[first + k:]. Negative indices count from the end.
  index_get(x, i0, ...; first) reads that indexed shape (x[..., i0, i1, ...]): the values'
  gradient of index_put, whose own gradient is an accumulating index_put into zeros.
"""
from __future__ import annotations

import numpy as np

from ..ir import FLOAT_DTYPES, TensorType
from .base import Cost, OpDef, broadcast_shapes, norm_dim, register, same_dtype, zero_mac_cost

INDEX_DTYPES = ("int32", "int64")


# --- where ------------------------------------------------------------------------------------
def _where_infer(ts, a):
    cond, x, y = ts
    if cond.dtype != "bool":
        raise ValueError(f"where: the condition {cond} must be bool")
    return [TensorType(broadcast_shapes(cond.shape, x.shape, y.shape), same_dtype([x, y], "where"))]


def _where_ref(xs, a):
    cond, x, y = xs
    return [np.array(np.where(cond, x, y), dtype=x.dtype, order="C")]


def _vjp_where(e, node, grads, needs):
    (g,) = grads
    cond, a, b = node.inputs
    zero = e.const(0.0, g.dtype)
    ga = e.sum_to(e.emit("where", cond, g, zero), a.shape) if needs[1] else None
    gb = e.sum_to(e.emit("where", cond, zero, g), b.shape) if needs[2] else None
    return [None, ga, gb]


register(OpDef("where", _where_infer, _where_ref, _vjp_where, num_inputs=(3, 3),
               cost=lambda n: Cost(0, sum(v.type.nbytes for v in n.inputs) + n.outputs[0].type.nbytes)))


# --- cumsum -----------------------------------------------------------------------------------
def _cumsum_infer(ts, a):
    x = ts[0]
    if x.dtype not in FLOAT_DTYPES + INDEX_DTYPES:
        raise ValueError(f"cumsum: {x} must be one of {FLOAT_DTYPES + INDEX_DTYPES}")
    norm_dim(a["dim"], x.rank)
    return [x]


def cumsum_like_torch(x: np.ndarray, dim: int, reverse: bool = False) -> np.ndarray:
    """Running sums of x along dim (from the end with reverse); float in a float64 accumulator."""
    if x.ndim == 0:
        return x.copy()
    axis = norm_dim(dim, x.ndim)
    acc = np.float64 if x.dtype.kind == "f" else x.dtype
    src = np.flip(x, axis) if reverse else x
    out = np.cumsum(src, axis=axis, dtype=acc)
    out = np.flip(out, axis) if reverse else out
    return np.array(out, dtype=x.dtype, order="C")


def _cumsum_ref(xs, a):
    return [cumsum_like_torch(xs[0], a["dim"], a.get("reverse", False))]


def _vjp_cumsum(e, node, grads, needs):
    return [e.emit("cumsum", grads[0], dim=node.attrs["dim"], reverse=not node.attrs.get("reverse", False))]


register(OpDef("cumsum", _cumsum_infer, _cumsum_ref, _vjp_cumsum, num_inputs=(1, 1)))


# --- index_put, index_get ---------------------------------------------------------------------
def indexed_shape(x: TensorType, idx, first: int, op: str) -> tuple:
    """x.shape[:first] + (the index tensors' broadcast shape) + x.shape[first + k:]."""
    k = len(idx)
    if k < 1 or not isinstance(first, int) or first < 0 or first + k > x.rank:
        raise ValueError(f"{op}: {k} index tensors from dim {first} do not fit {x}")
    for t in idx:
        if t.dtype not in INDEX_DTYPES:
            raise ValueError(f"{op}: index {t} must be one of {INDEX_DTYPES}")
    return x.shape[:first] + broadcast_shapes(*[t.shape for t in idx]) + x.shape[first + k:]


def _key(xs_idx, first: int) -> tuple:
    return (slice(None),) * first + tuple(np.asarray(i, dtype=np.int64) for i in xs_idx)


def _index_put_infer(ts, a):
    x, v = ts[:2]
    shape = indexed_shape(x, ts[2:], a["first"], "index_put")
    if v.dtype != x.dtype or broadcast_shapes(v.shape, shape) != shape:
        raise ValueError(f"index_put: values {v} do not broadcast to the indexed {x.dtype}{list(shape)}")
    return [x]


def _index_put_ref(xs, a):
    x, v = xs[:2]
    key = _key(xs[2:], a["first"])
    out = np.array(x, order="C", copy=True)
    vals = np.broadcast_to(v, out[key].shape)
    if a["accumulate"]:
        np.add.at(out, key, vals)  # repeated positions add up, in index order
    else:
        out[key] = vals  # a repeated position keeps its last value
    return [out]


def _vjp_index_put(e, node, grads, needs):
    (g,) = grads
    v, idx = node.inputs[1], node.inputs[2:]
    first = node.attrs["first"]
    gx = None
    if needs[0]:
        gx = g if node.attrs["accumulate"] else \
            e.emit("index_put", g, e.const(0.0, g.dtype), *idx, first=first, accumulate=False)
    gv = e.sum_to(e.emit("index_get", g, *idx, first=first), v.shape) if needs[1] else None
    return [gx, gv] + [None] * len(idx)


def _index_get_infer(ts, a):
    return [ts[0].with_shape(indexed_shape(ts[0], ts[1:], a["first"], "index_get"))]


def _index_get_ref(xs, a):
    return [np.array(xs[0][_key(xs[1:], a["first"])], dtype=xs[0].dtype, order="C")]


def _vjp_index_get(e, node, grads, needs):
    x, idx = node.inputs[0], node.inputs[1:]
    zeros = e.emit("expand", e.const(0.0, x.dtype), shape=x.shape)
    gx = e.emit("index_put", zeros, grads[0], *idx, first=node.attrs["first"], accumulate=True) if needs[0] else None
    return [gx] + [None] * len(idx)


def _index_put_cost(node):
    """The copy of x, and one read (and add) per written element."""
    x, written = node.inputs[0].type, node.inputs[1].type
    return Cost(macs=written.numel if node.attrs["accumulate"] else 0,
                bytes=2 * x.nbytes + written.nbytes + sum(v.type.nbytes for v in node.inputs[2:]))


register(OpDef("index_put", _index_put_infer, _index_put_ref, _vjp_index_put, cost=_index_put_cost,
               num_inputs=(3, None)))
register(OpDef("index_get", _index_get_infer, _index_get_ref, _vjp_index_get, cost=zero_mac_cost,
               num_inputs=(2, None)))
