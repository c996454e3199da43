"""The integer-only backward of an int8 program (`backward="integer"`): gradients as int16
with one static power-of-two exponent per tensor, int32 / int64 accumulators, and the SGD
update of the int8 weights and int32 biases in Q16 fixed point with stochastic rounding.
No float arithmetic anywhere: what an MCU without an FPU (RV32IMC, Cortex-M0+/M3) runs.
quantize/integer_backward.py rewrites a float-backward int8 program into these ops and
chooses every exponent, multiplier and shift; ops/igrad_fixed.py has the arithmetic.

- ``igrad_scale(g) {mult, shift}``: sat16(round(g * mult * 2**-shift)), one multiplier or
  one per channel (dim 1): a gradient moved to another exponent, or times a constant.
- ``igrad_add(a, b) {shift_a, shift_b}``: sat16(round(a * 2**-shift_a) + round(b * 2**-shift_b)).
- ``iconv_grad_input(g, w) {input_shape, geometry, mult, shift}``: the input gradient of a
  convolution, sat16(round(sum over (o, i, j) of g * w * mult[o] * 2**-shift)) in int64;
  mult[o] carries the weight scale of output channel o.
- ``iconv_grad_weight_update(x, g, w, step) {geometry, x_zero, weight_shape, mult, shift,
  qmin, qmax, seed, param_id, dim, index}``: the weight gradient acc = sum over (n, ho, wo) of
  g * (x - x_zero) (int64) and the update w' = clamp(floor(w - acc * mult[r] * 2**-shift[r] +
  u)) in Q16, u the top 16 bits of ops/qoptim.py's counter hash; each element is computed and
  applied alone, so no gradient is ever stored. ``index`` selects the updated channels along
  ``dim`` (x and g are then selected already), as qsgd_update's.
- ``iconv_bias_update(b, g, step) {mult, shift, qmin, qmax, seed, param_id, dim, index}``:
  acc = sum over (n, h, w) of g, the same update.

Both updates take SGD's momentum and weight decay as the float update does (ops/qoptim.py),
with the learning rate folded into the buffer: an optional int32 momentum buffer M (the
update's last operand and second result, in weight steps, Q16) and the attributes
`momentum_q16` = round(momentum * 2**16) and `decay_mult` / `decay_shift` (lr * weight_decay):

    d = acc * mult[r] * 2**-shift[r] + w * decay_mult * 2**-decay_shift     (each rounded, Q16)
    M' = sat32(round(M * momentum_q16 * 2**-16) + d);   w' = clamp(floor((w * 2**16 - M' + u) / 2**16))

(without a buffer, M' = d).
"""
from __future__ import annotations

import numpy as np

from typing import Optional

from ..ir import TensorType
from .base import Cost, OpDef, register
from .conv import conv_geometry, im2col, is_depthwise, pad_spatial, window_tap
from .fixed_point import INT32_MAX, INT32_MIN
from .igrad_fixed import ACC_CLAMP_BITS, UPDATE_FRAC, rshift_round, saturate16, uniform16


def _need(cond: bool, op: str, msg: str) -> None:
    if not cond:
        raise ValueError(f"{op}: {msg}")


def _per_channel(v, n: int, ndim: int, dim: int = 1) -> np.ndarray:
    a = np.asarray(v, np.int64)
    if a.size == 1:
        return a.reshape(())
    shape = [1] * ndim
    shape[dim] = n
    return a.reshape(shape)


# --- igrad_scale / igrad_add ----------------------------------------------------------------
def _scale_infer(ts, a):
    (g,) = ts
    _need(g.dtype == "int16", "igrad_scale", f"expected an int16 gradient, got {g}")
    _need(len(a["mult"]) in (1, g.shape[1] if g.rank > 1 else 1), "igrad_scale",
          f"{len(a['mult'])} multipliers for {g}")
    return [g]


def igrad_scale_ref(xs, a):
    g = xs[0].astype(np.int64)
    n = g.shape[1] if g.ndim > 1 else 1
    m, s = _per_channel(a["mult"], n, g.ndim), _per_channel(a["shift"], n, g.ndim)
    return [saturate16(rshift_round(g * m, s))]


def _add_infer(ts, a):
    x, y = ts
    _need(x == y and x.dtype == "int16", "igrad_add", f"expected two int16 gradients of one shape, got {x}, {y}")
    return [x]


def igrad_add_ref(xs, a):
    x, y = (v.astype(np.int64) for v in xs)
    return [saturate16(rshift_round(x, a["shift_a"]) + rshift_round(y, a["shift_b"]))]


# --- the convolution's input gradient -------------------------------------------------------
def _grad_input_infer(ts, a):
    g, w = ts
    _need(g.dtype == "int16" and w.dtype == "int8", "iconv_grad_input", f"expected int16 g, int8 w, got {g}, {w}")
    _need(len(a["mult"]) == w.shape[0], "iconv_grad_input", f"{len(a['mult'])} multipliers for {w}")
    return [TensorType(tuple(a["input_shape"]), "int16")]


def iconv_grad_input_ref(xs, a):
    g, w = xs
    s, p, d, groups = conv_geometry(a)
    n, c, h, wd = a["input_shape"]
    o, cg, kh, kw = w.shape
    ho, wo = g.shape[2:]
    gm = g.astype(np.int64) * np.asarray(a["mult"], np.int64).reshape(1, -1, 1, 1)
    w64 = w.astype(np.int64)
    acc = np.zeros((n, c, h + 2 * p[0], wd + 2 * p[1]), np.int64)
    opg = o // groups
    for i in range(kh):
        for j in range(kw):
            rows, cols = window_tap(i, j, s, d, ho, wo)[2:]
            if is_depthwise(c, o, groups):
                acc[:, :, rows, cols] += gm * w64[None, :, 0, i, j, None, None]
                continue
            for grp in range(groups):
                oc, ic = slice(grp * opg, (grp + 1) * opg), slice(grp * cg, (grp + 1) * cg)
                acc[:, ic, rows, cols] += np.einsum("nohw,oc->nchw", gm[:, oc], w64[oc, :, i, j])
    acc = acc[:, :, p[0]:p[0] + h, p[1]:p[1] + wd]
    return [saturate16(rshift_round(acc, int(a["shift"])))]


# --- the updates ----------------------------------------------------------------------------
def _selected_shape(w_shape, a):
    shape = list(w_shape)
    if a.get("index") is not None:
        shape[a["dim"]] = len(a["index"])
    return tuple(shape)


def _apply_update(w: np.ndarray, acc: np.ndarray, step: int, a, m: Optional[np.ndarray] = None) -> list:
    """[w with its selected elements moved by -acc * mult[r] * 2**-shift[r] (Q16, stochastic
    rounding), and the new momentum buffer when `m` is one]."""
    sel = (slice(None),) * len(w.shape) if a.get("index") is None else \
        (slice(None),) * a["dim"] + (np.asarray(a["index"], dtype=np.int64),)
    rows = acc.shape[0]
    mu, sh = _per_channel(a["mult"], rows, acc.ndim, 0), _per_channel(a["shift"], rows, acc.ndim, 0)
    bound = np.int64(1) << ACC_CLAMP_BITS
    d16 = rshift_round(np.clip(acc, -bound, bound) * mu, sh)
    ws = w[sel].astype(np.int64).reshape(acc.shape)
    if a.get("decay_mult"):
        d16 = d16 + rshift_round(ws * int(a["decay_mult"]), int(a["decay_shift"]))
    if m is not None:
        d16 = np.clip(rshift_round(m.astype(np.int64) * int(a["momentum_q16"]), UPDATE_FRAC) + d16, INT32_MIN,
                      INT32_MAX)
    flat = np.arange(w.size, dtype=np.int64).reshape(w.shape)[sel].reshape(acc.shape)
    u = uniform16(a["seed"], a["param_id"], step, flat)
    v = (ws << UPDATE_FRAC) - d16 + u
    out = w.copy()
    out[sel] = np.clip(v >> UPDATE_FRAC, a["qmin"], a["qmax"]).astype(w.dtype).reshape(out[sel].shape)
    return [out] + ([d16.astype(np.int32).reshape(m.shape)] if m is not None else [])


def _update_checks(op, w, step, rows, a, moms, grad_shape) -> list:
    _need(step.shape == () and step.dtype == "int32", op, f"step must be an int32 scalar, got {step}")
    _need(len(a["mult"]) == len(a["shift"]) == rows, op, f"{len(a['mult'])} multipliers for {rows} rows")
    _need(all(m.dtype == "int32" and m.numel == int(np.prod(grad_shape)) for m in moms), op,
          f"momentum buffer {moms} does not match the updated elements {grad_shape}")
    return [w] + list(moms)


def _weight_update_infer(ts, a):
    x, g, w, step = ts[:4]
    op = "iconv_grad_weight_update"
    _need(x.dtype == "int8" and g.dtype == "int16" and w.dtype == "int8", op, f"expected int8 x, int16 g, int8 w, "
          f"got {x}, {g}, {w}")
    ws = tuple(a["weight_shape"])
    _need(int(np.prod(ws)) == int(np.prod(_selected_shape(w.shape, a))), op,
          f"gradient shape {ws} does not match weight {w} (selected: {_selected_shape(w.shape, a)})")
    _need(int(a["groups"]) == 1 or int(a["groups"]) == x.shape[1] == ws[0], op, "only dense or depthwise layers")
    return _update_checks(op, w, step, ws[0], a, ts[4:], ws)


def weight_accumulator(x: np.ndarray, g: np.ndarray, a) -> np.ndarray:
    """int64 sum over (n, ho, wo) of g * (x - x_zero), shaped weight_shape."""
    s, p, d, groups = conv_geometry(a)
    o, cg, kh, kw = a["weight_shape"]
    n, c = x.shape[:2]
    ho, wo = g.shape[2:]
    xc = pad_spatial(x.astype(np.int64) - np.int64(a["x_zero"]), p)
    cols = im2col(xc, kh, kw, s, d, ho, wo).transpose(1, 2, 3, 0, 4, 5).reshape(c, kh * kw, n * ho * wo)
    gr = g.astype(np.int64).transpose(1, 0, 2, 3).reshape(o, -1)
    if groups == 1:
        acc = np.einsum("or,ckr->ock", gr, cols)
    else:  # depthwise: output channel k reads input channel k
        acc = np.einsum("or,okr->ok", gr, cols)[:, None]
    return acc.reshape(o, cg, kh, kw)


def iconv_grad_weight_update_ref(xs, a):
    x, g, w, step = xs[:4]
    acc = weight_accumulator(x, g, a).reshape(_selected_shape(w.shape, a))
    return _apply_update(w, acc, int(step), a, xs[4] if len(xs) > 4 else None)


def _bias_update_infer(ts, a):
    b, g, step = ts[:3]
    op = "iconv_bias_update"
    _need(b.dtype == "int32" and g.dtype == "int16", op, f"expected an int32 bias and an int16 gradient, got {b}, {g}")
    rows = _selected_shape(b.shape, a)[0]
    _need(g.shape[1] == rows, op, f"gradient {g} has {g.shape[1]} channels for {rows} updated bias entries")
    return _update_checks(op, b, step, rows, a, ts[3:], (rows,))


def iconv_bias_update_ref(xs, a):
    b, g, step = xs[:3]
    acc = g.astype(np.int64).transpose(1, 0, *range(2, g.ndim)).reshape(g.shape[1], -1).sum(axis=1)
    return _apply_update(b, acc, int(step), a, xs[3] if len(xs) > 3 else None)


def _conv_macs(node) -> Cost:
    g = node.inputs[0] if node.op == "iconv_grad_input" else node.inputs[1]
    w_shape = node.inputs[1].shape if node.op == "iconv_grad_input" else node.attrs["weight_shape"]
    return Cost(g.type.numel * int(np.prod(w_shape[1:])), sum(v.type.nbytes for v in node.inputs + node.outputs))


register(OpDef("igrad_scale", _scale_infer, igrad_scale_ref, num_inputs=(1, 1), inplace=((0, 0),)))
register(OpDef("igrad_add", _add_infer, igrad_add_ref, num_inputs=(2, 2), inplace=((0, 0), (0, 1))))
register(OpDef("iconv_grad_input", _grad_input_infer, iconv_grad_input_ref, cost=_conv_macs, num_inputs=(2, 2)))
register(OpDef("iconv_grad_weight_update", _weight_update_infer, iconv_grad_weight_update_ref, cost=_conv_macs,
               shares=((0, 2), (1, 4)), mutates=True, num_inputs=(4, 5)))
register(OpDef("iconv_bias_update", _bias_update_infer, iconv_bias_update_ref,
               cost=lambda n: Cost(n.inputs[1].type.numel, n.inputs[1].type.nbytes), shares=((0, 0), (1, 3)),
               mutates=True, num_inputs=(3, 4)))

__all__ = ["iconv_grad_input_ref", "iconv_grad_weight_update_ref", "weight_accumulator"]
