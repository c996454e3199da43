"""Linear layers and batched matrix products."""
from __future__ import annotations

import numpy as np

from ..ir import TensorType
from .base import LAYER_TAG, Cost, Int8Rule, OpDef, ParamOperands, broadcast_shapes, register, same_dtype


def _linear_infer(ts, a):
    x, w = ts[0], ts[1]
    if w.rank != 2 or x.rank < 1 or x.shape[-1] != w.shape[1]:
        raise ValueError(f"linear: input {x} does not match weight {w}")
    if len(ts) == 3 and ts[2].shape != (w.shape[0],):
        raise ValueError(f"linear: bias {ts[2]} should have shape ({w.shape[0]},)")
    return [TensorType(x.shape[:-1] + (w.shape[0],), same_dtype(ts, "linear"))]


def _linear_ref(xs, a):
    y = xs[0] @ xs[1].T
    return [y + xs[2] if len(xs) > 2 else y]


def _vjp_linear(e, node, grads, needs):
    (gy,) = grads
    x, w = node.inputs[:2]
    lead = tuple(range(gy.type.rank - 1))
    gx = None
    if needs[0]:  # matmul wants a matrix: a 1-D input's gradient goes through a (1, out) row
        gx = e.emit("matmul", gy if lead else e.emit("reshape", gy, shape=(1,) + gy.shape), w)
        gx = gx if lead else e.emit("reshape", gx, shape=x.shape)
    gw = e.emit("linear_grad_weight", x, gy) if needs[1] else None
    gb = (e.emit("sum", gy, dims=lead) if lead else gy) if len(needs) > 2 and needs[2] else None  # dims=() sums all
    return [gx, gw, gb]


def _mm_cost(node):
    a, b = node.inputs[:2]
    return Cost(node.outputs[0].type.numel * a.shape[-1] if node.op != "linear_grad_weight"
                else a.type.numel * b.shape[-1], sum(v.type.nbytes for v in node.inputs + node.outputs))


register(OpDef("linear", _linear_infer, _linear_ref, _vjp_linear, cost=_mm_cost, num_inputs=(2, 3), tags={LAYER_TAG},
               params=ParamOperands("linear", weight=1, bias=2), int8=Int8Rule("qconv", "qconv2d")))
register(OpDef("linear_grad_weight", lambda ts, a: [ts[0].with_shape((ts[1].shape[-1], ts[0].shape[-1]))],
               lambda xs, a: [xs[1].reshape(-1, xs[1].shape[-1]).T @ xs[0].reshape(-1, xs[0].shape[-1])],
               cost=_mm_cost, num_inputs=(2, 2)))


def _matmul_infer(ts, a):
    x, y = ts
    if x.rank < 2 or y.rank < 2 or x.shape[-1] != y.shape[-2]:
        raise ValueError(f"matmul: {x} @ {y} do not match")
    batch = broadcast_shapes(x.shape[:-2], y.shape[:-2])
    return [TensorType(batch + (x.shape[-2], y.shape[-1]), same_dtype(ts, "matmul"))]


def _swap_last(e, v):
    perm = tuple(range(v.type.rank - 2)) + (v.type.rank - 1, v.type.rank - 2)
    return e.emit("permute", v, perm=perm)


def _vjp_matmul(e, node, grads, needs):
    (g,) = grads
    a, b = node.inputs
    ga = e.sum_to(e.emit("matmul", g, _swap_last(e, b)), a.shape) if needs[0] else None
    gb = e.sum_to(e.emit("matmul", _swap_last(e, a), g), b.shape) if needs[1] else None
    return [ga, gb]


register(OpDef("matmul", _matmul_infer, lambda xs, a: [np.matmul(xs[0], xs[1])], _vjp_matmul,
               cost=_mm_cost, num_inputs=(2, 2)))
