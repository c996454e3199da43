"""A convolution's weight gradient and its in-place integer SGD update as one op, one
output channel at a time: the whole weight gradient (float32, four times the int8
weight) is never stored, only one channel of it.

``qconv2d_grad_weight_update(x, g, w, step[, m]) -> (w'[, m'], scratch)`` is, by
definition,

    gw = qconv2d_grad_weight(x, g)           attributes under the prefix "gw_"
    w'[, m'] = qsgd_update(w, gw, step[, m])  attributes under the prefix "up_"

for a dense (groups 1) or depthwise convolution. Row k of gw (output channel k, or the
k-th selected channel of a depthwise layer) depends on channel k of g only, and the
update of row k reads row k of gw only, so the kernel (and this reference) computes one
row into `scratch` and applies it before the next. `w'` is `w` updated in place (and
`m'` the momentum buffer): `shares`, as for `qsgd_update`. The scratch row is the op's
last output, which nothing reads: the planners count it while the op runs.

Numerics: the update is elementwise the same arithmetic as `qsgd_update`; a gradient
row is summed by itself rather than inside one matrix product, so it can differ from
the unfused gradient in the last float32 bit (and a stochastic rounding in one integer
step).
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..ir import TensorType
from .base import Cost, OpDef, get_op, register
from .qconv import _grad_weight_ref
from .qoptim import qsgd_rows

FUSED_OP = "qconv2d_grad_weight_update"
GW, UP = "gw_", "up_"


def fuse_attrs(gw: Mapping[str, Any], up: Mapping[str, Any]) -> dict:
    return {**{GW + k: v for k, v in gw.items()}, **{UP + k: v for k, v in up.items()}}


def split_attrs(a: Mapping[str, Any]) -> tuple[dict, dict]:
    def part(prefix):
        return {k[len(prefix):]: v for k, v in a.items() if k.startswith(prefix)}
    return part(GW), part(UP)


def fusable(gw_attrs: Mapping[str, Any], x_channels: int) -> bool:
    """Dense, or depthwise over the channels of x (the only layouts done row by row)."""
    o = gw_attrs["weight_shape"][0]
    groups = int(gw_attrs["groups"])
    return groups == 1 or groups == x_channels == o


def _infer(ts, a):
    x, g, w, step = ts[:4]
    gw, up = split_attrs(a)
    (grad,) = get_op("qconv2d_grad_weight").infer([x, g], gw)
    updated = get_op("qsgd_update").infer([w, grad, step, *ts[4:]], up)
    if not fusable(gw, x.shape[1]):
        raise ValueError(f"{FUSED_OP}: only dense or depthwise convolutions, got groups={gw['groups']}")
    return updated + [TensorType((1,) + grad.shape[1:], "float32")]


def _row_attrs(gw: Mapping[str, Any], depthwise: bool, k: int) -> dict:
    o, cg, kh, kw = gw["weight_shape"]
    return {**gw, "weight_shape": (1, cg, kh, kw), "scales": (gw["scales"][k],),
            **({"groups": 1} if depthwise else {})}


def qconv2d_grad_weight_update_ref(xs, a):
    x, g, w, step = xs[:4]
    m = xs[4] if len(xs) > 4 else None
    gw, up = split_attrs(a)
    depthwise = int(gw["groups"]) > 1
    w_new = w.copy()
    m_new = None if m is None else m.copy()
    scratch = np.zeros((1,) + tuple(gw["weight_shape"][1:]), np.float32)
    for k in range(gw["weight_shape"][0]):
        xk = x[:, k:k + 1] if depthwise else x
        scratch[...] = _grad_weight_ref([xk, g[:, k:k + 1]], _row_attrs(gw, depthwise, k))[0]
        d = qsgd_rows(w_new, scratch, int(step), None if m is None else m[k:k + 1], up, k, k + 1)
        if m_new is not None:
            m_new[k:k + 1] = d
    return [w_new] + ([m_new] if m is not None else []) + [scratch]


def _cost(node) -> Cost:
    x, g = node.inputs[:2]
    gw, _ = split_attrs(node.attrs)
    macs = g.type.numel * int(np.prod(gw["weight_shape"][1:])) + 4 * int(np.prod(gw["weight_shape"]))
    return Cost(macs, sum(v.type.nbytes for v in node.inputs))


register(OpDef(FUSED_OP, _infer, qconv2d_grad_weight_update_ref, cost=_cost, shares=((0, 2), (1, 4)),
               mutates=True, num_inputs=(4, 5)))

__all__ = ["FUSED_OP", "fusable", "fuse_attrs", "qconv2d_grad_weight_update_ref", "split_attrs"]
