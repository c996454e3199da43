"""int8 boundary and elementwise ops: quantize, dequantize, qadd, qmean, qclamp, and the
straight-through gradient mask they share.

Every int8 tensor stands for real = scale * (q - zero). Gradients flow as float32 with
respect to those real values, so quantize and dequantize pass them unchanged (rounding is
straight-through) and saturation at a clamp bound stops them (`qmask_grad`, reading the
bit mask `qmask_pack` saved in the forward pass instead of the int8 output itself; an int16
gradient of the integer-only backward, ops/igrad.py, is masked alike).
"""
from __future__ import annotations

import numpy as np

from ..ir import TensorType
from .base import OpDef, register, zero_mac_cost
from .fixed_point import ADD_LEFT_SHIFT, div_round_half_away, multiply_by_quantized_multiplier, quantize_multiplier
from .reduce import reduced_dims, reduce_infer


def _typed(dtype, src_dtypes, op):
    def infer(ts, a):
        if ts[0].dtype not in src_dtypes:
            raise ValueError(f"{op}: expected {' or '.join(src_dtypes)} input, got {ts[0]}")
        return [TensorType(ts[0].shape, dtype)]
    return infer


def quantize_ref(x, a):
    q = np.round(x.astype(np.float32) / np.float32(a["scale"])) + a["zero"]
    return np.clip(q, a["qmin"], a["qmax"]).astype(np.int8)


def dequantize_ref(q, a):
    return (q.astype(np.float32) - np.float32(a["zero"])) * np.float32(a["scale"])


#: a saturation mask keeps one bit per element (8 per byte), packed little-endian
MASK_BITS_PER_BYTE = 8


def mask_bytes(numel: int) -> int:
    return -(-numel // MASK_BITS_PER_BYTE)


def _pack_infer(ts, a):
    (y,) = ts
    if y.dtype != "int8":
        raise ValueError(f"qmask_pack: expected an int8 output, got {y}")
    return [TensorType((mask_bytes(y.numel),), "int8")]


def _pack_ref(xs, a):
    keep = (xs[0] > a["lo"]) & (xs[0] < a["hi"])
    return [np.packbits(keep.reshape(-1), bitorder="little").view(np.int8)]


def _mask_infer(ts, a):
    g, m = ts
    if g.dtype not in ("float32", "int16") or m.dtype != "int8" or m.shape != (mask_bytes(g.numel),):
        raise ValueError(f"qmask_grad: gradient {g} does not match packed mask {m}")
    return [g]


def _mask_ref(xs, a):
    g, m = xs
    keep = np.unpackbits(m.view(np.uint8), count=g.size, bitorder="little").reshape(g.shape)
    return [g * keep.astype(g.dtype)]


def emit_mask_grad(e, g, y, lo, hi):
    """The gradient `g` of int8 output `y` where `y` did not saturate at [lo, hi]: the
    forward keeps only a packed bit mask of `y` (1/8 of its bytes) for the backward."""
    return e.emit("qmask_grad", g, e.emit("qmask_pack", y, lo=lo, hi=hi))


def _vjp_masked(e, node, grads, needs):
    """The output's gradient where it did not saturate, to every input that needs one."""
    m = emit_mask_grad(e, grads[0], node.out, node.attrs["qmin"], node.attrs["qmax"])
    return [m if need else None for need in needs]


register(OpDef("quantize", _typed("int8", ("float32", "float64"), "quantize"), lambda xs, a: [quantize_ref(xs[0], a)],
               _vjp_masked, num_inputs=(1, 1)))
register(OpDef("dequantize", _typed("float32", ("int8",), "dequantize"), lambda xs, a: [dequantize_ref(xs[0], a)],
               lambda e, n, g, nd: [g[0]], num_inputs=(1, 1)))
register(OpDef("qmask_pack", _pack_infer, _pack_ref, num_inputs=(1, 1)))
register(OpDef("qmask_grad", _mask_infer, _mask_ref, num_inputs=(2, 2), inplace=((0, 0),)))


# --- qadd: TFLite's quantized add -------------------------------------------------------
def qadd_attrs(a_scale, a_zero, b_scale, b_zero, y_scale, y_zero, qmin=-128, qmax=127) -> dict:
    """Fixed-point multipliers of y = (sa (a - za) + sb (b - zb)) / sy + zy, as TFLite
    derives them: both inputs are brought to twice the larger input scale."""
    twice_max = 2.0 * max(a_scale, b_scale)
    am, ash = quantize_multiplier(a_scale / twice_max)
    bm, bsh = quantize_multiplier(b_scale / twice_max)
    ym, ysh = quantize_multiplier(twice_max / ((1 << ADD_LEFT_SHIFT) * y_scale))
    return dict(a_zero=int(a_zero), b_zero=int(b_zero), y_zero=int(y_zero), a_mult=am, a_shift=ash, b_mult=bm,
                b_shift=bsh, y_mult=ym, y_shift=ysh, qmin=int(qmin), qmax=int(qmax),
                a_scale=float(a_scale), b_scale=float(b_scale), y_scale=float(y_scale))


def qadd_ref(x, y, a):
    xa = multiply_by_quantized_multiplier((x.astype(np.int64) - a["a_zero"]) << ADD_LEFT_SHIFT, a["a_mult"],
                                          a["a_shift"])
    xb = multiply_by_quantized_multiplier((y.astype(np.int64) - a["b_zero"]) << ADD_LEFT_SHIFT, a["b_mult"],
                                          a["b_shift"])
    out = multiply_by_quantized_multiplier(xa + xb, a["y_mult"], a["y_shift"]) + a["y_zero"]
    return np.clip(out, a["qmin"], a["qmax"]).astype(np.int8)


def _qadd_infer(ts, a):
    x, y = ts
    if x.dtype != "int8" or y.dtype != "int8" or x.shape != y.shape:
        raise ValueError(f"qadd: expected two int8 tensors of one shape, got {x} and {y}")
    return [x]


register(OpDef("qadd", _qadd_infer, lambda xs, a: [qadd_ref(xs[0], xs[1], a)], _vjp_masked, num_inputs=(2, 2),
               stream_operands=(0, 1)))


# --- qmean: average over dims on one scale (global average pooling) ---------------------
def qmean_ref(x, a):
    dims = reduced_dims(x.ndim, a)
    count = int(np.prod([x.shape[d] for d in dims]))
    total = (x.astype(np.int64) - a["zero"]).sum(axis=dims, keepdims=a.get("keepdim", False))
    return np.clip(div_round_half_away(total, count) + a["zero"], -128, 127).astype(np.int8)


def _vjp_qmean(e, node, grads, needs):
    x = node.inputs[0]
    dims = reduced_dims(x.type.rank, node.attrs)
    kept = tuple(1 if i in dims else d for i, d in enumerate(x.shape))
    g = grads[0] if grads[0].shape == kept else e.emit("reshape", grads[0], shape=kept)
    count = x.type.numel // max(node.out.type.numel, 1)
    return [e.emit("mul", e.emit("expand", g, shape=x.shape), e.const(1.0 / count, "float32"))]


def _qmean_infer(ts, a):
    if ts[0].dtype != "int8":
        raise ValueError(f"qmean: expected an int8 input, got {ts[0]}")
    return reduce_infer(ts, a)


register(OpDef("qmean", _qmean_infer, lambda xs, a: [qmean_ref(xs[0], a)], _vjp_qmean, num_inputs=(1, 1)))

# --- qclamp: ReLU / ReLU6 on int8 (a clamp of the levels) -----------------------------------
register(OpDef("qclamp", _typed("int8", ("int8",), "qclamp"),
               lambda xs, a: [np.clip(xs[0], a["qmin"], a["qmax"]).astype(np.int8)], _vjp_masked,
               cost=zero_mac_cost, num_inputs=(1, 1)))
