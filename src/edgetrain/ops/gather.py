"""gather along a dim (torch.gather): out[i] = x[i with its coordinate along `dim` replaced by
index[i]]; index has x's rank and, along the other dims, at most x's sizes. Its gradient
gather_grad adds each output gradient back where it was read from (a scatter-add: repeated
indices accumulate), which is also torch's scatter_add (frontend/aten_select.py); gather_grad's
own gradient is a gather."""
from __future__ import annotations

import numpy as np

from .base import OpDef, norm_dim, register, zero_mac_cost

INDEX_DTYPES = ("int32", "int64")


def _check(x_shape, idx_type, dim: int) -> int:
    if idx_type.dtype not in INDEX_DTYPES:
        raise ValueError(f"gather: index must be one of {INDEX_DTYPES}, got {idx_type}")
    if idx_type.rank != len(x_shape):
        raise ValueError(f"gather: index {idx_type} must have the rank of the input {tuple(x_shape)}")
    dim = norm_dim(dim, len(x_shape))
    if any(i > s for d, (i, s) in enumerate(zip(idx_type.shape, x_shape)) if d != dim):
        raise ValueError(f"gather: index {idx_type.shape} exceeds the input {tuple(x_shape)} off dim {dim}")
    return dim


def _gather_infer(ts, a):
    x, idx = ts
    _check(x.shape, idx, a["dim"])
    return [x.with_shape(idx.shape)]


def _positions(idx: np.ndarray, dim: int) -> tuple:
    """numpy fancy indices of the elements gather reads: idx along dim, the output's own
    coordinates along the other dims."""
    grid: list[np.ndarray] = list(np.indices(idx.shape, sparse=True))
    grid[dim] = idx.astype(np.int64)
    return tuple(grid)


def _gather_ref(xs, a):
    x, idx = xs
    dim = norm_dim(a["dim"], x.ndim)
    return [np.array(x[_positions(idx, dim)], dtype=x.dtype, order="C")]


def _gather_grad_ref(xs, a):
    g, idx = xs
    out = np.zeros(a["input_shape"], dtype=g.dtype)
    np.add.at(out, _positions(idx, norm_dim(a["dim"], out.ndim)), g)
    return [out]


def _gather_grad_infer(ts, a):
    g, idx = ts
    _check(a["input_shape"], idx, a["dim"])
    return [g.with_shape(a["input_shape"])]


def _vjp_gather(e, node, grads, needs):
    x, idx = node.inputs
    gx = e.emit("gather_grad", grads[0], idx, input_shape=x.shape, dim=node.attrs["dim"]) if needs[0] else None
    return [gx, None]


register(OpDef("gather", _gather_infer, _gather_ref, _vjp_gather, cost=zero_mac_cost, num_inputs=(2, 2)))
def _vjp_gather_grad(e, node, grads, needs):  # (scatter_add of a model: gather is its gradient, as torch's)
    g, idx = node.inputs
    return [e.emit("gather", grads[0], idx, dim=node.attrs["dim"]) if needs[0] else None, None]


register(OpDef("gather_grad", _gather_grad_infer, _gather_grad_ref, _vjp_gather_grad, num_inputs=(2, 2)))
