"""int8 max pooling, average pooling and concatenation (TFLite / CMSIS-NN semantics) and
their float32 backward ops.

Forward, all in integers, on tensors standing for real = scale * (q - zero):
- qmax_pool2d   the max of the window's levels; the output keeps the input's scale and
                zero point (max commutes with the increasing map q -> scale (q - zero), so it
                is exact). A padded tap never wins (it is below every level).
- qavg_pool2d   TFLite's integer average on the input's scale: the window's sum of
                (q - zero) (a padded tap adds a real 0, i.e. nothing) divided by the count
                (kernel area, the number of real taps when `count_include_pad` is off, or
                `divisor_override`), rounded half away from zero, plus zero.
                With zero = 0 and the count of real taps (TFLite's padding never counts)
                this is TFLite's AveragePool int8 exactly; centring on the zero point makes
                padding counted by `count_include_pad` (PyTorch's default) add real zeros.
- qcat          TFLite's CONCATENATION: an input on the output's scale and zero point is
                copied (CMSIS-NN arm_concatenation_s8, the case the converter arranges);
                any other input is first requantized as TFLite's int8 -> int8 QUANTIZE does:
                clamp(MultiplyByQuantizedMultiplier(q - x_zero, mult, shift) + y_zero).
                (Multiplier 1.0 with equal zero points is exactly the copy.)

Backward, in float32 on the real values (the straight-through estimator of qelementwise.py):
- qmax_pool2d_grad  each output gradient goes to the first maximal level of its window in
                    (i, j) tap order (as PyTorch's max pool); an input element adds its terms
                    in tap order, starting from 0 (the C kernel finds a window's first
                    maximum again for each of its taps: no index tensor is stored);
- qavg_pool2d_grad  g / count spread over the window, added in tap order, starting from 0;
- qcat_grad         the slice of the output gradient an input produced, where the
                    output did not saturate when some input was requantized.
The average needs no mask (a mean of levels stays a level) unless `divisor_override`
is below the kernel area.
"""
from __future__ import annotations

import numpy as np

from ..ir import TensorType
from .base import Cost, OpDef, norm_dim, register, zero_mac_cost
from .conv import conv_out_hw, window_tap
from .fixed_point import INT8_MAX, INT8_MIN, multiply_by_quantized_multiplier, quantize_multiplier
from .pool import fixed_avg_divisor
from .qelementwise import emit_mask_grad

_ONE = (1, 1)
#: a padded tap of a max pool: below every int8 level, so it never wins a real window
PAD_BELOW_INT8 = INT8_MIN - 1
POOL_KEYS = ("kernel", "stride", "padding", "dilation")
AVG_KEYS = ("kernel", "stride", "padding", "count_include_pad", "divisor_override")


def _geo(a):
    return tuple(a["kernel"]), tuple(a["stride"]), tuple(a["padding"]), tuple(a.get("dilation", _ONE))


def _pool_infer(op, dtype):
    def infer(ts, a):
        x = ts[0]
        if x.dtype != dtype or x.rank != 4:
            raise ValueError(f"{op}: expected a 4-D {dtype} input, got {x}")
        k, s, p, d = _geo(a)
        if any(p[i] > k[i] // 2 for i in range(2)):
            raise ValueError(f"{op}: padding {p} must be at most half the kernel {k}")
        return [TensorType(x.shape[:2] + conv_out_hw(x.shape[2:], k, s, p, d), "int8")]
    return infer


def _padded(x, p, value):
    return np.pad(x, ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])), constant_values=value)


def _window_max(x, a):
    """int16 max over each window, a padded tap counting as PAD_BELOW_INT8."""
    k, s, p, d = _geo(a)
    ho, wo = conv_out_hw(x.shape[2:], k, s, p, d)
    xp = _padded(x.astype(np.int16), p, PAD_BELOW_INT8)
    out = np.full(x.shape[:2] + (ho, wo), PAD_BELOW_INT8, np.int16)
    for i in range(k[0]):
        for j in range(k[1]):
            np.maximum(out, xp[window_tap(i, j, s, d, ho, wo)], out=out)
    return out, xp


def qmax_pool2d_ref(x, a):
    return np.clip(_window_max(x, a)[0], INT8_MIN, INT8_MAX).astype(np.int8)


def _qmax_grad_ref(xs, a):
    g, x = xs
    k, s, p, d = _geo(a)
    ho, wo = g.shape[2:]
    y, xp = _window_max(x, a)
    gxp = np.zeros(xp.shape, np.float32)
    taken = np.zeros(y.shape, bool)
    zero = np.float32(0.0)
    for i in range(k[0]):
        for j in range(k[1]):
            tap = window_tap(i, j, s, d, ho, wo)
            hit = (xp[tap] == y) & ~taken
            gxp[tap] += np.where(hit, g, zero)
            taken |= hit
    return [gxp[:, :, p[0]:p[0] + x.shape[2], p[1]:p[1] + x.shape[3]]]


def avg_counts(shape, a) -> np.ndarray:
    """The divisor of each output position, int64 of shape (1, 1, ho, wo)."""
    k, s, p, d = _geo(a)
    ho, wo = conv_out_hw(shape[2:], k, s, p, d)
    if fixed_avg_divisor(a):
        return np.full((1, 1, ho, wo), fixed_avg_divisor(a), np.int64)
    ones = _padded(np.ones((1, 1) + tuple(shape[2:]), np.int64), p, 0)
    return sum(ones[window_tap(i, j, s, d, ho, wo)] for i in range(k[0]) for j in range(k[1]))


def qavg_pool2d_ref(x, a):
    k, s, p, d = _geo(a)
    ho, wo = conv_out_hw(x.shape[2:], k, s, p, d)
    xp = _padded(x.astype(np.int64) - a["zero"], p, 0)
    total = sum(xp[window_tap(i, j, s, d, ho, wo)] for i in range(k[0]) for j in range(k[1]))
    count = avg_counts(x.shape, a)
    mag = (np.abs(total) + count // 2) // count
    return np.clip(np.where(total < 0, -mag, mag) + a["zero"], INT8_MIN, INT8_MAX).astype(np.int8)


def _qavg_grad_ref(xs, a):
    g = xs[0]
    shape = tuple(a["input_shape"])
    k, s, p, d = _geo(a)
    ho, wo = g.shape[2:]
    gs = g / avg_counts(shape, a).astype(np.float32)
    gxp = np.zeros(shape[:2] + (shape[2] + 2 * p[0], shape[3] + 2 * p[1]), np.float32)
    for i in range(k[0]):
        for j in range(k[1]):
            gxp[window_tap(i, j, s, d, ho, wo)] += gs
    return [gxp[:, :, p[0]:p[0] + shape[2], p[1]:p[1] + shape[3]]]


def _vjp_qmax(e, node, grads, needs):
    x = node.inputs[0]
    return [e.emit("qmax_pool2d_grad", grads[0], x, **{k: node.attrs[k] for k in POOL_KEYS})]


def may_saturate_avg(a) -> bool:
    """A divisor below the kernel area can push a mean past the int8 levels."""
    k = tuple(a["kernel"])
    return bool(a.get("divisor_override")) and int(a["divisor_override"]) < k[0] * k[1]


def _vjp_qavg(e, node, grads, needs):
    g = grads[0]
    if may_saturate_avg(node.attrs):
        g = emit_mask_grad(e, g, node.out, INT8_MIN, INT8_MAX)
    return [e.emit("qavg_pool2d_grad", g, input_shape=node.inputs[0].shape,
                   **{k: node.attrs[k] for k in AVG_KEYS if k in node.attrs})]


def _pool_cost(node):
    """One comparison or addition per tap of every output element."""
    k = tuple(node.attrs["kernel"])
    return Cost(node.outputs[0].type.numel * k[0] * k[1], sum(v.type.nbytes for v in node.inputs + node.outputs))


def _grad_pool_cost(node):
    k = tuple(node.attrs["kernel"])
    return Cost(node.inputs[0].type.numel * k[0] * k[1], sum(v.type.nbytes for v in node.inputs + node.outputs))


def _qmax_grad_infer(ts, a):
    g, x = ts
    if g.dtype != "float32" or x.dtype != "int8" or x.rank != 4 or g.rank != 4:
        raise ValueError(f"qmax_pool2d_grad: expected a float32 gradient and the int8 input, got {g}, {x}")
    k, s, p, d = _geo(a)
    if g.shape != x.shape[:2] + conv_out_hw(x.shape[2:], k, s, p, d):
        raise ValueError(f"qmax_pool2d_grad: gradient {g} does not match the pooled {x}")
    return [TensorType(x.shape, "float32")]


def _qavg_grad_infer(ts, a):
    g = ts[0]
    shape = tuple(a["input_shape"])
    k, s, p, d = _geo(a)
    if g.dtype != "float32" or len(shape) != 4 or g.shape != shape[:2] + conv_out_hw(shape[2:], k, s, p, d):
        raise ValueError(f"qavg_pool2d_grad: gradient {g} does not match input shape {shape}")
    return [TensorType(shape, "float32")]


register(OpDef("qmax_pool2d", _pool_infer("qmax_pool2d", "int8"), lambda xs, a: [qmax_pool2d_ref(xs[0], a)],
               _vjp_qmax, cost=_pool_cost, num_inputs=(1, 1)))
register(OpDef("qmax_pool2d_grad", _qmax_grad_infer, _qmax_grad_ref, cost=_grad_pool_cost, num_inputs=(2, 2)))
register(OpDef("qavg_pool2d", _pool_infer("qavg_pool2d", "int8"), lambda xs, a: [qavg_pool2d_ref(xs[0], a)],
               _vjp_qavg, cost=_pool_cost, num_inputs=(1, 1)))
register(OpDef("qavg_pool2d_grad", _qavg_grad_infer, _qavg_grad_ref, cost=_grad_pool_cost, num_inputs=(1, 1)))


# --- qcat: TFLite CONCATENATION ------------------------------------------------------------------
def qcat_attrs(dim: int, x_scales, x_zeros, y_scale: float, y_zero: int) -> dict:
    """Attributes of a qcat of inputs on (x_scales[i], x_zeros[i]) into (y_scale, y_zero):
    each input's requantization multiplier x_scale / y_scale as TFLite derives it (an input
    on the output's parameters gets exactly 1.0 and is copied)."""
    mults, shifts = zip(*(quantize_multiplier(float(np.float64(s) / np.float64(y_scale))) for s in x_scales))
    return dict(dim=int(dim), x_zero=tuple(int(z) for z in x_zeros), mult=tuple(mults), shift=tuple(shifts),
                y_zero=int(y_zero), x_scale=tuple(float(s) for s in x_scales), y_scale=float(y_scale))


#: quantize_multiplier(1.0): the multiplier of an input copied as it is
IDENTITY_MULT, IDENTITY_SHIFT = quantize_multiplier(1.0)


def is_copy(a, i: int) -> bool:
    """Input i of a qcat is copied byte for byte (same scale and zero point as the output)."""
    return (a["mult"][i], a["shift"][i], a["x_zero"][i]) == (IDENTITY_MULT, IDENTITY_SHIFT, a["y_zero"])


def requantize_ref(x, zx, mult, shift, zy):
    y = multiply_by_quantized_multiplier(x.astype(np.int64) - zx, mult, shift) + zy
    return np.clip(y, INT8_MIN, INT8_MAX).astype(np.int8)


def qcat_ref(xs, a):
    parts = [requantize_ref(x, a["x_zero"][i], a["mult"][i], a["shift"][i], a["y_zero"]) for i, x in enumerate(xs)]
    return np.concatenate(parts, axis=a["dim"])


def _qcat_infer(ts, a):
    if not ts or any(t.dtype != "int8" for t in ts):
        raise ValueError(f"qcat: expected int8 inputs, got {[str(t) for t in ts]}")
    for key in ("x_zero", "mult", "shift"):
        if len(a[key]) != len(ts):
            raise ValueError(f"qcat: {key} has {len(a[key])} entries for {len(ts)} inputs")
    dim = norm_dim(a["dim"], ts[0].rank)
    for t in ts[1:]:
        if t.rank != ts[0].rank or any(t.shape[i] != ts[0].shape[i] for i in range(t.rank) if i != dim):
            raise ValueError(f"qcat: incompatible operands {[str(t) for t in ts]} along dim {dim}")
    shape = list(ts[0].shape)
    shape[dim] = sum(t.shape[dim] for t in ts)
    return [TensorType(tuple(shape), "int8")]


def _vjp_qcat(e, node, grads, needs):
    a = node.attrs
    g = grads[0]
    if not all(is_copy(a, i) for i in range(len(node.inputs))):
        g = emit_mask_grad(e, g, node.out, INT8_MIN, INT8_MAX)
    dim = norm_dim(a["dim"], node.out.type.rank)
    out, start = [], 0
    for v, need in zip(node.inputs, needs):
        end = start + v.shape[dim]
        out.append(e.emit("qcat_grad", g, dim=dim, start=start, end=end) if need else None)
        start = end
    return out


def _qcat_grad_infer(ts, a):
    g = ts[0]
    dim = norm_dim(a["dim"], g.rank)
    if g.dtype != "float32" or not 0 <= a["start"] < a["end"] <= g.shape[dim]:
        raise ValueError(f"qcat_grad: expected a float32 gradient with {a['start']}:{a['end']} inside dim {dim}, "
                         f"got {g}")
    shape = list(g.shape)
    shape[dim] = a["end"] - a["start"]
    return [TensorType(tuple(shape), "float32")]


def _qcat_grad_ref(xs, a):
    g = xs[0]
    idx = [slice(None)] * g.ndim
    idx[norm_dim(a["dim"], g.ndim)] = slice(a["start"], a["end"])
    return [np.ascontiguousarray(g[tuple(idx)])]


register(OpDef("qcat", _qcat_infer, lambda xs, a: [qcat_ref(xs, a)], _vjp_qcat, num_inputs=(1, None)))
register(OpDef("qcat_grad", _qcat_grad_infer, _qcat_grad_ref, cost=zero_mac_cost, num_inputs=(1, 1)))

__all__ = ["avg_counts", "is_copy", "qavg_pool2d_ref", "qcat_attrs", "qcat_ref", "qmax_pool2d_ref",
           "requantize_ref"]
