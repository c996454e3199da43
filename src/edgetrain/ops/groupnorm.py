"""Group normalisation (instance normalisation is its one-channel-per-group case) and its backward ops.

group_norm(x[, w[, b]]; groups, eps): x is (N, C, *spatial); its C channels fall into `groups`
groups of C / groups consecutive channels, and each (sample, group) block of (C / groups) x
spatial values is normalised by its own mean and biased variance, in the input dtype's precision
(as torch's native_group_norm); then y = xhat * w[c] + b[c] per channel. Its affine weight and
bias are parameters as batch norm's and layer norm's (NORM_TAG), so update schemes can train them.

Backward: group_norm_grad_input (through the group statistics, as layer norm's:
rstd (gh - mean gh - xhat mean(gh xhat)) over each block, gh = g w) and group_norm_grad_weight
(the sum of g xhat over the samples and the spatial positions); the bias' gradient is a `sum`.
"""
from __future__ import annotations

import numpy as np

from ..ir import TensorType
from .base import NORM_TAG, Cost, OpDef, ParamOperands, register, same_dtype

#: the multiply-adds per element: the mean, the variance (two passes), the normalisation and affine
_FORWARD_MACS_PER_ELEMENT = 4
#: per element of the input gradient: the statistics (2), the two block sums (2), the result (3)
_GRAD_MACS_PER_ELEMENT = 7


def _check(x: TensorType, groups, op: str):
    if x.rank < 2:
        raise ValueError(f"{op}: input {x} must be (N, C, ...)")
    if not isinstance(groups, int) or groups < 1 or x.shape[1] % groups:
        raise ValueError(f"{op}: {groups} groups do not divide the {x.shape[1]} channels of {x}")


def _gn_infer(ts, a):
    x = ts[0]
    _check(x, a.get("groups"), "group_norm")
    if any(t.shape != (x.shape[1],) for t in ts[1:]):
        raise ValueError(f"group_norm: affine operands {[str(t) for t in ts[1:]]} must be ({x.shape[1]},)")
    return [TensorType(x.shape, same_dtype(ts, "group_norm"))]


def _per_channel(v, ndim):
    return v.reshape((1, -1) + (1,) * (ndim - 2))


def _blocks(x: np.ndarray, groups: int) -> np.ndarray:
    """x as (N, groups, C / groups * spatial): one row per normalised block."""
    return x.reshape(x.shape[0], groups, -1)


def group_xhat(x: np.ndarray, groups: int, eps: float):
    """(xhat shaped as x, rstd per block (N, groups, 1)), in x's dtype."""
    blk = _blocks(x, groups)
    mu = blk.mean(axis=2, keepdims=True)
    rstd = 1.0 / np.sqrt(((blk - mu) ** 2).mean(axis=2, keepdims=True) + x.dtype.type(eps))
    return ((blk - mu) * rstd).reshape(x.shape), rstd


def _gn_ref(xs, a):
    x = xs[0]
    y, _ = group_xhat(x, a["groups"], a["eps"])
    if len(xs) > 1:
        y = y * _per_channel(xs[1], x.ndim)
    if len(xs) > 2:
        y = y + _per_channel(xs[2], x.ndim)
    return [np.asarray(y, dtype=x.dtype)]


def _not_channel_dims(rank: int) -> tuple:
    return (0,) + tuple(range(2, rank))


def _vjp_gn(e, node, grads, needs):
    (g,) = grads
    x = node.inputs[0]
    attrs = {"groups": node.attrs["groups"], "eps": node.attrs["eps"]}
    weight = node.inputs[1:2]
    gx = e.emit("group_norm_grad_input", g, x, *weight, **attrs) if needs[0] else None
    gw = e.emit("group_norm_grad_weight", g, x, **attrs) if len(needs) > 1 and needs[1] else None
    gb = e.emit("sum", g, dims=_not_channel_dims(g.type.rank)) if len(needs) > 2 and needs[2] else None
    return [gx, gw, gb]


def _gn_grad_input_infer(ts, a):
    g, x = ts[:2]
    _check(x, a.get("groups"), "group_norm_grad_input")
    if g != x or any(t.shape != (x.shape[1],) for t in ts[2:]):
        raise ValueError(f"group_norm_grad_input: operands {[str(t) for t in ts]} do not match (g, x[, w])")
    return [x]


def _gn_grad_input_ref(xs, a):
    g, x = xs[:2]
    gh = g * _per_channel(xs[2], g.ndim) if len(xs) > 2 else g  # the gradient of xhat
    xhat, rstd = group_xhat(x, a["groups"], a["eps"])
    ghb, xhb = _blocks(gh, a["groups"]), _blocks(xhat, a["groups"])
    gx = rstd * (ghb - ghb.mean(axis=2, keepdims=True) - xhb * (ghb * xhb).mean(axis=2, keepdims=True))
    return [np.asarray(gx.reshape(x.shape), dtype=g.dtype)]


def _gn_grad_weight_infer(ts, a):
    g, x = ts
    _check(x, a.get("groups"), "group_norm_grad_weight")
    if g != x:
        raise ValueError(f"group_norm_grad_weight: the gradient {g} does not match the input {x}")
    return [x.with_shape((x.shape[1],))]


def _gn_grad_weight_ref(xs, a):
    g, x = xs
    xhat, _ = group_xhat(x, a["groups"], a["eps"])
    return [np.asarray(np.sum(g * xhat, axis=_not_channel_dims(x.ndim)), dtype=g.dtype)]


def _gn_cost(node):
    x = node.inputs[0].type
    affine = sum(v.type.nbytes for v in node.inputs[1:])
    return Cost(macs=_FORWARD_MACS_PER_ELEMENT * x.numel, bytes=2 * x.nbytes + affine + node.outputs[0].type.nbytes)


def _gn_grad_cost(node):
    g, x = node.inputs[0].type, node.inputs[1].type  # the statistics, two block sums, the result
    return Cost(macs=_GRAD_MACS_PER_ELEMENT * x.numel, bytes=3 * (g.nbytes + x.nbytes) + node.outputs[0].type.nbytes)


register(OpDef("group_norm", _gn_infer, _gn_ref, _vjp_gn, cost=_gn_cost, num_inputs=(1, 3), tags={NORM_TAG},
               params=ParamOperands("norm", weight=1, bias=2)))
register(OpDef("group_norm_grad_input", _gn_grad_input_infer, _gn_grad_input_ref, cost=_gn_grad_cost,
               num_inputs=(2, 3)))
register(OpDef("group_norm_grad_weight", _gn_grad_weight_infer, _gn_grad_weight_ref, cost=_gn_grad_cost,
               num_inputs=(2, 2)))
