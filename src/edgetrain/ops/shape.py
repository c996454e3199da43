"""Shape ops: reshape (a view), detach (a view without a gradient), permute, expand / sum_to, slice, cat,
index_select."""
from __future__ import annotations

import numpy as np

from .base import SAME_SCALE_TAG, Int8Rule, OpDef, broadcast_shapes, norm_dim, out_grad, register, zero_mac_cost


def _copy(x) -> np.ndarray:
    """A C-contiguous copy that keeps 0-d arrays 0-d (np.ascontiguousarray makes them 1-d)."""
    return np.array(x, order="C", copy=True)


def _reshape_infer(ts, a):
    shape = tuple(a["shape"])
    if int(np.prod(shape)) != ts[0].numel:
        raise ValueError(f"reshape: cannot view {ts[0].shape} as {shape}")
    return [ts[0].with_shape(shape)]


register(OpDef("reshape", _reshape_infer, lambda xs, a: [xs[0].reshape(a["shape"])],
               lambda e, n, g, nd: [e.emit("reshape", out_grad(g), shape=n.inputs[0].shape)],
               cost=zero_mac_cost, shares=((0, 0),), num_inputs=(1, 1), tags={SAME_SCALE_TAG},
               int8=Int8Rule("same", "reshape")))


# detach (torch's x.detach(), torch.no_grad results): x itself, through which no gradient passes
# (a stop-gradient: straight-through estimators, target networks, VQ-VAE's codebook losses)
register(OpDef("detach", lambda ts, a: [ts[0]], lambda xs, a: [xs[0].view()], lambda e, n, g, nd: [None],
               cost=zero_mac_cost, shares=((0, 0),), num_inputs=(1, 1), tags={SAME_SCALE_TAG},
               int8=Int8Rule("same", "detach")))


def _permute_infer(ts, a):
    perm = tuple(a["perm"])
    if sorted(perm) != list(range(ts[0].rank)):
        raise ValueError(f"permute: {perm} is not a permutation of {ts[0].rank} dims")
    return [ts[0].with_shape([ts[0].shape[p] for p in perm])]


def _vjp_permute(e, node, grads, needs):
    inverse = tuple(int(i) for i in np.argsort(node.attrs["perm"]))
    return [e.emit("permute", grads[0], perm=inverse)]


register(OpDef("permute", _permute_infer, lambda xs, a: [_copy(np.transpose(xs[0], a["perm"]))],
               _vjp_permute, cost=zero_mac_cost, num_inputs=(1, 1), tags={SAME_SCALE_TAG},
               int8=Int8Rule("same", "permute")))


def _expand_infer(ts, a):
    shape = tuple(a["shape"])
    if broadcast_shapes(ts[0].shape, shape) != shape:
        raise ValueError(f"expand: {ts[0].shape} does not broadcast to {shape}")
    return [ts[0].with_shape(shape)]


register(OpDef("expand", _expand_infer, lambda xs, a: [_copy(np.broadcast_to(xs[0], a["shape"]))],
               lambda e, n, g, nd: [e.sum_to(out_grad(g), n.inputs[0].shape)], cost=zero_mac_cost, num_inputs=(1, 1)))


def _sum_to_infer(ts, a):
    shape = tuple(a["shape"])
    if broadcast_shapes(ts[0].shape, shape) != ts[0].shape:
        raise ValueError(f"sum_to: {shape} does not broadcast to {ts[0].shape}")
    return [ts[0].with_shape(shape)]


def _sum_to_ref(xs, a):
    x, shape = xs[0], tuple(a["shape"])
    lead = x.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, d in enumerate(shape) if d == 1 and x.shape[lead + i] != 1)
    return [np.asarray(x.sum(axis=axes, keepdims=True).reshape(shape), dtype=x.dtype)]


register(OpDef("sum_to", _sum_to_infer, _sum_to_ref,
               lambda e, n, g, nd: [e.emit("expand", out_grad(g), shape=n.inputs[0].shape)], num_inputs=(1, 1)))


def _slice_params(shape, a):
    dim = norm_dim(a["dim"], len(shape))
    start, end, step = a["start"], a["end"], a["step"]
    return dim, range(*slice(start, end, step).indices(shape[dim]))


def _slice_infer(ts, a):
    dim, r = _slice_params(ts[0].shape, a)
    if a["step"] < 1:
        raise ValueError("slice: step must be >= 1")
    shape = list(ts[0].shape)
    shape[dim] = len(r)
    return [ts[0].with_shape(shape)]


def _slice_ref(xs, a):
    x = xs[0]
    dim, _ = _slice_params(x.shape, a)
    idx = [slice(None)] * x.ndim
    idx[dim] = slice(a["start"], a["end"], a["step"])
    return [_copy(x[tuple(idx)])]


def _vjp_slice(e, node, grads, needs):
    x = node.inputs[0]
    attrs = {k: node.attrs[k] for k in ("dim", "start", "end", "step")}
    return [e.emit("slice_grad", grads[0], input_shape=x.shape, **attrs)]


register(OpDef("slice", _slice_infer, _slice_ref, _vjp_slice, cost=zero_mac_cost, num_inputs=(1, 1)))


def _slice_grad_ref(xs, a):
    g = xs[0]
    out = np.zeros(a["input_shape"], dtype=g.dtype)
    idx = [slice(None)] * out.ndim
    idx[norm_dim(a["dim"], out.ndim)] = slice(a["start"], a["end"], a["step"])
    out[tuple(idx)] = g
    return [out]


register(OpDef("slice_grad", lambda ts, a: [ts[0].with_shape(a["input_shape"])], _slice_grad_ref,
               cost=zero_mac_cost, num_inputs=(1, 1)))


def _cat_infer(ts, a):
    dim = norm_dim(a["dim"], ts[0].rank)
    for t in ts[1:]:
        if t.rank != ts[0].rank or t.dtype != ts[0].dtype or any(
                t.shape[i] != ts[0].shape[i] for i in range(t.rank) if i != dim):
            raise ValueError(f"cat: incompatible operands {[str(t) for t in ts]} along dim {dim}")
    shape = list(ts[0].shape)
    shape[dim] = sum(t.shape[dim] for t in ts)
    return [ts[0].with_shape(shape)]


def _vjp_cat(e, node, grads, needs):
    dim = norm_dim(node.attrs["dim"], node.out.type.rank)
    out, start = [], 0
    for v, need in zip(node.inputs, needs):
        end = start + v.shape[dim]
        out.append(e.emit("slice", grads[0], dim=dim, start=start, end=end, step=1) if need else None)
        start = end
    return out


register(OpDef("cat", _cat_infer, lambda xs, a: [np.concatenate(xs, axis=a["dim"])], _vjp_cat,
               cost=zero_mac_cost, num_inputs=(1, None), int8=Int8Rule("qcat", "qcat")))


def _index_select_infer(ts, a):
    dim = norm_dim(a["dim"], ts[0].rank)
    idx = a["index"]
    if any(not 0 <= i < ts[0].shape[dim] for i in idx):
        raise ValueError(f"index_select: index out of range for dim of size {ts[0].shape[dim]}")
    shape = list(ts[0].shape)
    shape[dim] = len(idx)
    return [ts[0].with_shape(shape)]


def _index_select_grad_ref(xs, a):
    g = xs[0]
    out = np.zeros(a["input_shape"], dtype=g.dtype)
    idx = [slice(None)] * out.ndim
    idx[norm_dim(a["dim"], out.ndim)] = np.asarray(a["index"], dtype=np.int64)
    np.add.at(out, tuple(idx), g)
    return [out]


register(OpDef("index_select", _index_select_infer,
               lambda xs, a: [_copy(np.take(xs[0], np.asarray(a["index"], dtype=np.int64), axis=a["dim"]))],
               lambda e, n, g, nd: [e.emit("index_select_grad", out_grad(g), input_shape=n.inputs[0].shape,
                                           dim=n.attrs["dim"], index=n.attrs["index"])],
               cost=zero_mac_cost, num_inputs=(1, 1)))
register(OpDef("index_select_grad", lambda ts, a: [ts[0].with_shape(a["input_shape"])], _index_select_grad_ref,
               cost=zero_mac_cost, num_inputs=(1, 1)))
