"""Normalization: batch norm on running statistics (eval) and on batch statistics (train), layer norm."""
from __future__ import annotations

import numpy as np

from ..ir import TensorType
from .base import NORM_TAG, Cost, OpDef, ParamOperands, register, same_dtype


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


register(OpDef("batch_norm", _bn_infer, _bn_ref, _vjp_bn, num_inputs=(3, 5), tags={NORM_TAG},
               params=ParamOperands("norm", weight=3, bias=4)))
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


register(OpDef("layer_norm", _ln_infer, _ln_ref, _vjp_ln, num_inputs=(1, 3), tags={NORM_TAG},
               params=ParamOperands("norm", weight=1, bias=2)))
register(OpDef("layer_norm_grad_input", lambda ts, a: [ts[1]], _ln_grad_input_ref, num_inputs=(2, 3)))
register(OpDef("layer_norm_grad_weight", lambda ts, a: [ts[1].with_shape(tuple(a["normalized_shape"]))],
               _ln_grad_weight_ref, num_inputs=(2, 2)))


# --- batch norm (train): batch statistics, and the running statistics' update ---------------
# torch's train-mode batch norm: y normalised with the batch's mean and biased variance over
# every dim but the channel dim 1; the running statistics then move towards the batch's mean
# and *unbiased* variance by `momentum` (a cumulative average, 1 / num_batches_tracked, when
# momentum is None), and num_batches_tracked counts the batches. The forward op is pure; the
# update is its own in-place op (as sgd_update), placed in the training step only, so a
# gradient graph or a recomputed forward never moves the statistics twice.
def _batch_stats(x):
    dims = _reduce_dims(x.ndim)
    mean = x.mean(axis=dims)
    var = ((x - _per_channel(mean, x.ndim)) ** 2).mean(axis=dims)
    return mean, var


def _bn_train_xhat(x, eps):
    mean, var = _batch_stats(x)
    rstd = 1.0 / np.sqrt(var + eps)
    return (x - _per_channel(mean, x.ndim)) * _per_channel(rstd, x.ndim), rstd


def _bn_train_infer(ts, a):
    x = ts[0]
    if x.rank < 2 or any(t.shape != (x.shape[1],) for t in ts[1:]) or len(ts) not in (1, 3):
        raise ValueError(f"batch_norm_train: operands {[str(t) for t in ts]} do not match (x[, w, b])")
    if x.numel // x.shape[1] < 2:
        raise ValueError(f"batch_norm_train: {x} has one value per channel; batch statistics need more "
                         f"(torch: 'Expected more than 1 value per channel when training')")
    return [TensorType(x.shape, same_dtype(ts, "batch_norm_train"))]


def _bn_train_ref(xs, a):
    x = xs[0]
    y, _ = _bn_train_xhat(x, a["eps"])
    if len(xs) == 3:
        y = y * _per_channel(xs[1], x.ndim) + _per_channel(xs[2], x.ndim)
    return [y.astype(x.dtype)]


def _vjp_bn_train(e, node, grads, needs):
    (g,) = grads
    x = node.inputs[0]
    eps = node.attrs["eps"]
    affine = node.inputs[1:2]
    gx = e.emit("batch_norm_train_grad_input", g, x, *affine, eps=eps) if needs[0] else None
    gw = e.emit("batch_norm_train_grad_weight", g, x, eps=eps) if len(needs) > 1 and needs[1] else None
    gb = e.emit("sum", g, dims=_reduce_dims(g.type.rank)) if len(needs) > 2 and needs[2] else None
    return [gx, gw, gb]


def _bn_train_grad_input_ref(xs, a):
    """Through the batch statistics: rstd * (gh - mean(gh) - xhat * mean(gh * xhat)), gh = g * w."""
    g, x = xs[:2]
    gh = g * _per_channel(xs[2], g.ndim) if len(xs) == 3 else g
    xhat, rstd = _bn_train_xhat(x, a["eps"])
    dims = _reduce_dims(x.ndim)
    gx = _per_channel(rstd, x.ndim) * (gh - gh.mean(axis=dims, keepdims=True)
                                       - xhat * (gh * xhat).mean(axis=dims, keepdims=True))
    return [gx.astype(g.dtype)]


def _bn_train_grad_weight_ref(xs, a):
    g, x = xs
    xhat, _ = _bn_train_xhat(x, a["eps"])
    return [np.sum(g * xhat, axis=_reduce_dims(x.ndim)).astype(g.dtype)]


def _bn_train_cost(node):
    x = node.inputs[0].type  # two passes for the statistics, one to normalise
    return Cost(macs=4 * x.numel, bytes=2 * x.nbytes + sum(v.type.nbytes for v in node.inputs[1:]) + x.nbytes)


def _bn_train_grad_cost(node):
    x = node.inputs[1].type  # statistics, two reductions, the result
    return Cost(macs=7 * x.numel, bytes=3 * (node.inputs[0].type.nbytes + x.nbytes) + node.outputs[0].type.nbytes)


register(OpDef("batch_norm_train", _bn_train_infer, _bn_train_ref, _vjp_bn_train, cost=_bn_train_cost,
               num_inputs=(1, 3)))
register(OpDef("batch_norm_train_grad_input", lambda ts, a: [ts[0]], _bn_train_grad_input_ref,
               cost=_bn_train_grad_cost, num_inputs=(2, 3)))
register(OpDef("batch_norm_train_grad_weight", lambda ts, a: [ts[0].with_shape((ts[0].shape[1],))],
               _bn_train_grad_weight_ref, cost=_bn_train_grad_cost, num_inputs=(2, 2)))


def _stats_infer(ts, a):
    """(running_mean, running_var, x[, num_batches_tracked]) -> the same statistics, updated."""
    if len(ts) < 3:
        raise ValueError("batch_norm_update_stats: needs (running_mean, running_var, x[, num_batches_tracked])")
    rm, rv, x = ts[:3]
    c = x.shape[1] if x.rank >= 2 else -1
    if rm.shape != (c,) or rv.shape != (c,) or rm.dtype != x.dtype or rv.dtype != x.dtype:
        raise ValueError(f"batch_norm_update_stats: statistics {rm}, {rv} do not match {x}'s channels")
    if x.numel // c < 2:
        raise ValueError(f"batch_norm_update_stats: {x} has one value per channel (no unbiased variance)")
    if len(ts) == 4 and (ts[3].shape != () or ts[3].dtype != "int64"):
        raise ValueError(f"batch_norm_update_stats: num_batches_tracked must be an int64 scalar, got {ts[3]}")
    if a.get("momentum") is None and len(ts) != 4:
        raise ValueError("batch_norm_update_stats: momentum=None (a cumulative average) needs num_batches_tracked")
    return [rm, rv] + list(ts[3:])


def _stats_ref(xs, a):
    rm, rv, x = xs[:3]
    mean, var = _batch_stats(x)
    n = x.size // x.shape[1]
    nbt = xs[3] + 1 if len(xs) == 4 else None
    m = a.get("momentum")
    if m is None:  # torch: exponential_average_factor = 1 / num_batches_tracked, after the increment
        m = 1.0 / float(nbt)
    outs = [(m * mean + (1.0 - m) * rm).astype(rm.dtype),
            (m * (var * (n / (n - 1.0))) + (1.0 - m) * rv).astype(rv.dtype)]
    return outs + ([np.asarray(nbt, dtype=np.int64)] if nbt is not None else [])


def _stats_cost(node):
    x = node.inputs[2].type
    return Cost(macs=3 * x.numel, bytes=2 * x.nbytes + 4 * node.inputs[0].type.nbytes)


register(OpDef("batch_norm_update_stats", _stats_infer, _stats_ref, cost=_stats_cost,
               shares=((0, 0), (1, 1), (2, 3)), mutates=True, num_inputs=(3, 4)))
