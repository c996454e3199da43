"""int8 upsampling, adaptive and 3-D max pooling (the int8 rules of ops/resample.py's upsample
and ops/pool_nd.py's adaptive_max_pool2d and max_pool3d), and their float32 backward ops.

Forward, on the int8 levels, the output on the input's scale and zero point (as TFLite's
RESIZE_NEAREST_NEIGHBOR and MAX_POOL_2D keep them):
- qupsample             nearest modes: each output level is a copy of its source level
                        (torch's source indices, ops/resample.py); linear (1-D) and bilinear
                        (2-D): the interpolation of the levels with fixed-point weights of
                        torch's source coordinates, rounded (ops/qresample_linear.py);
- qadaptive_max_pool2d  the max level of each of torch's adaptive windows (max commutes with
                        the increasing map q -> scale (q - zero): exact);
- qmax_pool3d           the max level of each 3-D window (a padded tap never wins: the
                        shape rule keeps a real voxel in every window).
Backward, in float32 on the real values (the straight-through estimator of qelementwise.py):
- qupsample_grad             each output gradient added to its source, outputs in row-major order;
                             linear: times torch's float32 weights, as upsample_grad (the
                             straight-through estimator passes the weights' fixed-point rounding,
                             as it passes the output's: it equals the gradient of torch's
                             fake-quantized float bilinear);
- qadaptive_max_pool2d_grad  each output gradient added to its window's first maximal level
                             ((h, w) order), outputs in row-major order;
- qmax_pool3d_grad           the same with 3-D windows (taps in (d, h, w) order).
Both start from zeros and add in that order: the C kernels add in the same order (bit-exact).
"""
from __future__ import annotations

import numpy as np

from ..ir import TensorType
from .base import Cost, OpDef, get_op, out_grad, register
from .pool_nd import max_pool3d_ref, pool3d_infer, adaptive_max_grad, geo3, max3_grad_in_output_order, \
    max_adaptive_window, pool3d_out
from .qresample_linear import qupsample_linear_ref
from .resample import UPSAMPLE_ATTRS, upsample_cost, upsample_grad

GRAD_DTYPE = "float32"


def _int8_input(op, t):
    if t.dtype != "int8":
        raise ValueError(f"{op}: expected an int8 input, got {t}")


def _qup_infer(ts, a):
    _int8_input("qupsample", ts[0])
    return get_op("upsample").infer(ts, a)


def _qup_ref(xs, a):
    if a["mode"] == "linear":
        return [qupsample_linear_ref(xs[0], a)]
    return get_op("upsample").ref(xs, a)


def _qup_vjp(e, node, grads, needs):
    return [e.emit("qupsample_grad", grads[0], input_shape=node.inputs[0].shape,
                   **{k: node.attrs[k] for k in UPSAMPLE_ATTRS if k in node.attrs})]


def _qup_grad_infer(ts, a):
    if ts[0].dtype != GRAD_DTYPE:
        raise ValueError(f"qupsample_grad: expected a {GRAD_DTYPE} gradient, got {ts[0]}")
    return get_op("upsample_grad").infer(ts, a)


def _qup_grad_ref(xs, a):
    return [upsample_grad(xs[0], a["input_shape"], a, GRAD_DTYPE)]


def _qamax_infer(ts, a):
    _int8_input("qadaptive_max_pool2d", ts[0])
    return get_op("adaptive_max_pool2d").infer(ts, a)


def _qamax_grad_infer(ts, a):
    g, x = ts
    if g.dtype != GRAD_DTYPE or x.dtype != "int8" or g.shape != x.shape[:-2] + tuple(a["output_size"]):
        raise ValueError(f"qadaptive_max_pool2d_grad: expected a {GRAD_DTYPE} gradient of the pooled int8 input, "
                         f"got {g}, {x}")
    return [TensorType(x.shape, GRAD_DTYPE)]


def _qamax_cost(node):
    """One comparison per tap of every output element (the largest window's taps)."""
    x = node.inputs[-1]
    oh, ow = node.attrs["output_size"]
    taps = max_adaptive_window(x.shape[-2], int(oh)) * max_adaptive_window(x.shape[-1], int(ow))
    out = node.outputs[0] if node.outputs[0].type.numel < x.type.numel else node.inputs[0]
    return Cost(out.type.numel * taps, sum(v.type.nbytes for v in node.inputs + node.outputs))


register(OpDef("qupsample", _qup_infer, _qup_ref, _qup_vjp, cost=upsample_cost, num_inputs=(1, 1)))
register(OpDef("qupsample_grad", _qup_grad_infer, _qup_grad_ref, cost=upsample_cost, num_inputs=(1, 1)))
register(OpDef("qadaptive_max_pool2d", _qamax_infer, lambda xs, a: get_op("adaptive_max_pool2d").ref(xs, a),
               lambda e, n, g, nd: [e.emit("qadaptive_max_pool2d_grad", out_grad(g), n.inputs[0],
                                           output_size=tuple(n.attrs["output_size"]))],
               cost=_qamax_cost, num_inputs=(1, 1)))
register(OpDef("qadaptive_max_pool2d_grad", _qamax_grad_infer,
               lambda xs, a: [adaptive_max_grad(xs[0], xs[1], a, GRAD_DTYPE)], cost=_qamax_cost, num_inputs=(2, 2)))


# --- 3-D max pooling ---------------------------------------------------------------------------------
POOL3_KEYS = ("kernel", "stride", "padding", "dilation")


def _qmax3_infer(ts, a):
    _int8_input("qmax_pool3d", ts[0])
    return pool3d_infer(ts, a)


def _qmax3_ref(xs, a):
    return [max_pool3d_ref([xs[0].astype(np.float32)], a)[0].astype(np.int8)]


def _qmax3_grad_infer(ts, a):
    g, x = ts
    k, s, p, d = geo3(a)
    if g.dtype != GRAD_DTYPE or x.dtype != "int8" or x.rank != 5 or \
            g.shape != x.shape[:2] + pool3d_out(x.shape[2:], k, s, p, d):
        raise ValueError(f"qmax_pool3d_grad: expected a {GRAD_DTYPE} gradient of the pooled int8 input, got {g}, {x}")
    return [TensorType(x.shape, GRAD_DTYPE)]


def _qmax3_cost(node):
    k = tuple(node.attrs["kernel"])
    out = min((v for v in node.inputs + node.outputs), key=lambda v: v.type.numel)
    return Cost(out.type.numel * k[0] * k[1] * k[2], sum(v.type.nbytes for v in node.inputs + node.outputs))


register(OpDef("qmax_pool3d", _qmax3_infer, _qmax3_ref,
               lambda e, n, g, nd: [e.emit("qmax_pool3d_grad", out_grad(g), n.inputs[0],
                                           **{k: n.attrs[k] for k in POOL3_KEYS if k in n.attrs})],
               cost=_qmax3_cost, num_inputs=(1, 1)))
register(OpDef("qmax_pool3d_grad", _qmax3_grad_infer,
               lambda xs, a: [max3_grad_in_output_order(xs[0], xs[1], a, GRAD_DTYPE)], cost=_qmax3_cost,
               num_inputs=(2, 2)))
