"""Normalization: batch norm on running statistics (eval), layer norm."""
from __future__ import annotations

import numpy as np

from ..ir import TensorType
from .base import OpDef, register, same_dtype


# --- batch norm (eval): y = (x - mean) / sqrt(var + eps) * w + b, channel dim 1 ----------------
def _per_channel(v, ndim):
    return v.reshape((1, -1) + (1,) * (ndim - 2))


def _bn_infer(ts, a):
    x = ts[0]
    if x.rank < 2 or any(t.shape != (x.shape[1],) for t in ts[1:]) or len(ts) not in (3, 5):
        raise ValueError(f"batch_norm: operands {[str(t) for t in ts]} do not match (x, mean, var[, w, b])")
    return [TensorType(x.shape, same_dtype(ts, "batch_norm"))]


def _bn_ref(xs, a):
    x, mean, var = xs[:3]
    y = (x - _per_channel(mean, x.ndim)) / np.sqrt(_per_channel(var, x.ndim) + a["eps"])
    if len(xs) == 5:
        y = y * _per_channel(xs[3], x.ndim) + _per_channel(xs[4], x.ndim)
    return [y.astype(x.dtype)]


def _reduce_dims(rank):
    return (0,) + tuple(range(2, rank))


def _vjp_bn(e, node, grads, needs):
    (g,) = grads
    x, mean, var = node.inputs[:3]
    eps = node.attrs["eps"]
    affine = node.inputs[3:4]
    gx = e.emit("batch_norm_grad_input", g, var, *affine, eps=eps) if needs[0] else None
    gw = e.emit("batch_norm_grad_weight", g, x, mean, var, eps=eps) if len(needs) > 3 and needs[3] else None
    gb = e.emit("sum", g, dims=_reduce_dims(g.type.rank)) if len(needs) > 4 and needs[4] else None
    return [gx, None, None, gw, gb]


def _bn_grad_input_ref(xs, a):
    g, var = xs[:2]
    scale = 1.0 / np.sqrt(var + a["eps"])
    if len(xs) == 3:
        scale = scale * xs[2]
    return [(g * _per_channel(scale, g.ndim)).astype(g.dtype)]


def _bn_grad_weight_ref(xs, a):
    g, x, mean, var = xs
    xhat = (x - _per_channel(mean, x.ndim)) / np.sqrt(_per_channel(var, x.ndim) + a["eps"])
    return [np.sum(g * xhat, axis=_reduce_dims(x.ndim)).astype(g.dtype)]


register(OpDef("batch_norm", _bn_infer, _bn_ref, _vjp_bn, num_inputs=(3, 5)))
register(OpDef("batch_norm_grad_input", lambda ts, a: [ts[0]], _bn_grad_input_ref, num_inputs=(2, 3)))
register(OpDef("batch_norm_grad_weight", lambda ts, a: [ts[2]], _bn_grad_weight_ref, num_inputs=(4, 4)))


# --- layer norm over the trailing `len(normalized_shape)` dims --------------------------------
def _ln_dims(x, a):
    return tuple(range(x.ndim - len(a["normalized_shape"]), x.ndim))


def _ln_infer(ts, a):
    x, k = ts[0], tuple(a["normalized_shape"])
    if x.shape[x.rank - len(k):] != k or any(t.shape != k for t in ts[1:]):
        raise ValueError(f"layer_norm: operands {[str(t) for t in ts]} do not match normalized_shape {k}")
    return [TensorType(x.shape, same_dtype(ts, "layer_norm"))]


def _ln_xhat(x, a):
    dims = _ln_dims(x, a)
    mu = x.mean(axis=dims, keepdims=True)
    rstd = 1.0 / np.sqrt(((x - mu) ** 2).mean(axis=dims, keepdims=True) + a["eps"])
    return (x - mu) * rstd, rstd


def _ln_ref(xs, a):
    y, _ = _ln_xhat(xs[0], a)
    if len(xs) > 1:
        y = y * xs[1]
    if len(xs) > 2:
        y = y + xs[2]
    return [y.astype(xs[0].dtype)]


def _vjp_ln(e, node, grads, needs):
    (g,) = grads
    x = node.inputs[0]
    attrs = {"normalized_shape": node.attrs["normalized_shape"], "eps": node.attrs["eps"]}
    weight = node.inputs[1:2]
    gx = e.emit("layer_norm_grad_input", g, x, *weight, **attrs) if needs[0] else None
    gw = e.emit("layer_norm_grad_weight", g, x, **attrs) if len(needs) > 1 and needs[1] else None
    lead = tuple(range(x.type.rank - len(attrs["normalized_shape"])))
    gb = (e.emit("sum", g, dims=lead) if lead else g) if len(needs) > 2 and needs[2] else None  # dims=() sums all
    return [gx, gw, gb]


def _ln_grad_input_ref(xs, a):
    g, x = xs[:2]
    gh = g * xs[2] if len(xs) > 2 else g  # gradient w.r.t. xhat
    xhat, rstd = _ln_xhat(x, a)
    dims = _ln_dims(x, a)
    gx = rstd * (gh - gh.mean(axis=dims, keepdims=True) - xhat * (gh * xhat).mean(axis=dims, keepdims=True))
    return [gx.astype(g.dtype)]


def _ln_grad_weight_ref(xs, a):
    g, x = xs
    xhat, _ = _ln_xhat(x, a)
    lead = tuple(range(x.ndim - len(a["normalized_shape"])))
    return [np.sum(g * xhat, axis=lead).astype(g.dtype)]


register(OpDef("layer_norm", _ln_infer, _ln_ref, _vjp_ln, num_inputs=(1, 3)))
register(OpDef("layer_norm_grad_input", lambda ts, a: [ts[1]], _ln_grad_input_ref, num_inputs=(2, 3)))
register(OpDef("layer_norm_grad_weight", lambda ts, a: [ts[1].with_shape(tuple(a["normalized_shape"]))],
               _ln_grad_weight_ref, num_inputs=(2, 2)))
