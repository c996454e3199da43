"""A convolution's weight gradient and its in-place integer SGD update as one op, one
output channel at a time: the whole weight gradient (float32, four times the int8
weight) is never stored, only one channel of it.

``qconv2d_grad_weight_update(x, g, w, step[, m]) -> (w'[, m'], scratch)`` is, by
definition,

    gw = qconv2d_grad_weight(x, g)           attributes under the prefix "gw_"
    w'[, m'] = qsgd_update(w, gw, step[, m])  attributes under the prefix "up_"

for a dense (groups 1) or depthwise convolution; for a linear layer (a 1x1 convolution of
an (o, k) weight) the (o, k, 1, 1) gradient is reshaped to (o, k) first (passes/fuse.py
fuses through that reshape). Row k of gw (output channel k, or the k-th selected channel
of a depthwise layer) depends on channel k of g only, and the update of row k reads row k
of gw only, so the kernel (and this reference) computes one row into `scratch` and
applies it before the next; with the attribute ROWS (1 when absent; passes/widen_scratch.py
raises it for a dense layer where the step's peak has room) a block of that many rows, which
share the reading of x. `w'` is `w` updated in place (and
`m'` the momentum buffer): `shares`, as for `qsgd_update`. The scratch row is the op's
last output, which nothing reads: the planners count it while the op runs.

Numerics: the update is elementwise the arithmetic of `qsgd_update`. A kernel that sums
a gradient row by itself rather than inside one matrix product may differ from the
unfused gradient in the last float32 bit.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..ir import TensorType
from .base import Cost, OpDef, count_attr, get_op, prefix_attrs, register, unprefix_attrs
from .qconv import qconv_grad_weight_ref
from .qoptim import qsgd_ref

#: the op's name (passes/fuse.py builds it from a qconv2d_grad_weight and its qsgd_update)
GRAD_UPDATE_OP = "qconv2d_grad_weight_update"
GW, UP = "gw_", "up_"
#: the attribute giving the gradient rows the scratch holds (1 when absent)
ROWS = "rows"


def rows_of(a: Mapping[str, Any], o: int) -> int:
    """The gradient rows a fused node's scratch holds: its ROWS attribute (1 when absent), at
    most the weight's o rows."""
    return min(count_attr(a, ROWS, 1, GRAD_UPDATE_OP), o)


def fuse_attrs(gw: Mapping[str, Any], up: Mapping[str, Any]) -> dict:
    return prefix_attrs({GW: gw, UP: up})


def split_attrs(a: Mapping[str, Any]) -> tuple[dict, dict]:
    gw, up = unprefix_attrs(a, GW, UP)
    return gw, up


def fusable(gw_attrs: Mapping[str, Any], x_channels: int) -> bool:
    """Dense, or depthwise over the channels of x (the only layouts done row by row)."""
    o = gw_attrs["weight_shape"][0]
    groups = int(gw_attrs["groups"])
    return groups == 1 or groups == x_channels == o


def _is_view(grad_shape, w_shape) -> bool:
    """Whether a weight of w_shape is the 4-d kernel of grad_shape with unit dims dropped: a
    linear layer's (o, k) of (o, k, 1, 1), a conv1d's (o, c, k) of (o, c, 1, k)."""
    return tuple(grad_shape) != tuple(w_shape) and tuple(d for d in grad_shape if d != 1) == \
        tuple(d for d in w_shape if d != 1) and grad_shape[:1] == w_shape[:1]


def _infer(ts, a):
    x, g, w, step = ts[:4]
    gw, up = split_attrs(a)
    (grad,) = get_op("qconv2d_grad_weight").infer([x, g], gw)
    if _is_view(grad.shape, w.shape):  # a linear layer's 1x1 convolution, a conv1d's (o, c, 1, k) kernel
        grad = grad.with_shape(w.shape)
    updated = get_op("qsgd_update").infer([w, grad, step, *ts[4:]], up)
    if not fusable(gw, x.shape[1]):
        raise ValueError(f"{GRAD_UPDATE_OP}: only dense or depthwise convolutions, got groups={gw['groups']}")
    return updated + [TensorType((rows_of(a, grad.shape[0]),) + grad.shape[1:], "float32")]


def qconv2d_grad_weight_update_ref(xs, a):
    """The reference computes the whole gradient with the unfused op's arithmetic, so the
    fused program is bit-identical to the unfused one; `scratch` is returned holding the
    last rows (tests/ops/test_fused_backward.py runs the row-by-row kernel's loop and checks it
    against this; nothing reads the scratch, whose bytes a kernel may leave otherwise)."""
    x, g, w, step = xs[:4]
    gw, up = split_attrs(a)
    grad = qconv_grad_weight_ref([x, g], gw)[0]
    if _is_view(grad.shape, w.shape):  # a linear layer's 1x1 convolution, a conv1d's (o, c, 1, k) kernel
        grad = grad.reshape(w.shape)
    return qsgd_ref([w, grad, step, *xs[4:]], up) + [grad[-rows_of(a, grad.shape[0]):].copy()]


def _cost(node) -> Cost:
    x, g = node.inputs[:2]
    gw, _ = split_attrs(node.attrs)
    macs = g.type.numel * int(np.prod(gw["weight_shape"][1:])) + 4 * int(np.prod(gw["weight_shape"]))
    return Cost(macs, sum(v.type.nbytes for v in node.inputs))


register(OpDef(GRAD_UPDATE_OP, _infer, qconv2d_grad_weight_update_ref, cost=_cost, shares=((0, 2), (1, 4)),
               mutates=True, num_inputs=(4, 5)))

__all__ = ["GRAD_UPDATE_OP", "ROWS", "fusable", "fuse_attrs", "qconv2d_grad_weight_update_ref", "rows_of",
           "split_attrs"]
