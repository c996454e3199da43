"""Softmax cross entropy and its gradient in integers (the integer-only backward's loss).

``icross_entropy(acc, label) {mult, shift, zero, grad_shift, class_dim, ignore_index} -> (loss, grad)``

`acc` is the classifier's int32 accumulator (qconv2d with `acc_out`) or its int8 logits (what
a dequantize would make real: `zero` their zero point), classes along dim 1; class k's logit
in Q16 is z = clamp(round((acc - zero) * mult[k] * 2**-shift[k]), +-2**30). Per position:
d = z - max z; e = exp_q16(d) (table and interpolation, ops/igrad_fixed.py); S = sum e;
p = floor(e * 2**15 / S) (Q15); the loss is ln(S / 2**16) - d[label] (Q16 log2 table times
ln 2). Over the positions whose label is not `ignore_index` (count of them):

- loss = floor(sum / count) in Q16, returned as the float32 it stands for (exact: the loss is
  kept below 256; the C kernel assembles the float's bits with integer operations);
- grad = sat16((p - onehot) * 2**grad_shift / count), C's truncating division: the gradient
  with respect to the real logits, in units of 2**(-15 - grad_shift).
"""
from __future__ import annotations

import numpy as np

from ..ir import TensorType
from .base import Cost, OpDef, register
from .igrad_fixed import LN2_Q16, Q16, exp_q16, float_of_q16, log2_q16, rshift_round, saturate16

#: logits in Q16 are clamped to +-2**30 (z - max z stays inside int32's range doubled: int64 in C)
LOGIT_BOUND = 2 ** 30
#: the loss in Q16 stays below 2**24: its float32 is exact
LOSS_MAX_Q16 = 2 ** 24 - 1
PROB_BITS = 15


def _infer(ts, a):
    z, y = ts
    if z.dtype not in ("int32", "int8") or z.rank < 2 or int(a.get("class_dim", 1)) != 1:
        raise ValueError(f"icross_entropy: expected int32 accumulators or int8 logits with classes in dim 1, got {z}")
    if y.shape != z.shape[:1] + z.shape[2:] or y.dtype != "int64":
        raise ValueError(f"icross_entropy: labels {y} do not match logits {z}")
    if len(a["mult"]) != z.shape[1] or len(a["shift"]) != z.shape[1]:
        raise ValueError(f"icross_entropy: {len(a['mult'])} multipliers for {z.shape[1]} classes")
    return [TensorType((), "float32"), TensorType(z.shape, "int16")]


def _trunc_div(v: np.ndarray, d: int) -> np.ndarray:
    return np.sign(v) * (np.abs(v) // d)


def icross_entropy_ref(xs, a):
    acc, label = xs
    k = acc.shape[1]
    bshape = (1, k) + (1,) * (acc.ndim - 2)
    m = np.asarray(a["mult"], np.int64).reshape(bshape)
    s = np.asarray(a["shift"], np.int64).reshape(bshape)
    z = np.clip(rshift_round((acc.astype(np.int64) - int(a.get("zero", 0))) * m, s), -LOGIT_BOUND, LOGIT_BOUND)
    z = np.moveaxis(z, 1, -1).reshape(-1, k)  # positions x classes
    lab = label.reshape(-1).astype(np.int64)
    valid = lab != int(a["ignore_index"])
    count = int(valid.sum())
    d = z - z.max(axis=1, keepdims=True)
    e = exp_q16(d)
    total = e.sum(axis=1)
    p = (e << PROB_BITS) // total[:, None]
    onehot = np.zeros_like(p)
    rows = np.nonzero(valid)[0]
    onehot[rows, lab[rows]] = 1 << PROB_BITS
    grad = np.where(valid[:, None], (p - onehot) << int(a["grad_shift"]), 0)
    grad = saturate16(_trunc_div(grad, max(count, 1)))
    ln = ((log2_q16(total) - (Q16 << Q16)) * LN2_Q16) >> Q16
    per = ln[rows] - d[rows, lab[rows]]
    loss = min(int(per.sum()) // count, LOSS_MAX_Q16) if count else 0
    grad = np.moveaxis(grad.reshape((acc.shape[0],) + acc.shape[2:] + (k,)), -1, 1)
    return [float_of_q16(np.int64(loss)), grad]


register(OpDef("icross_entropy", _infer, icross_entropy_ref, num_inputs=(2, 2),
               cost=lambda n: Cost(8 * n.inputs[0].type.numel, 3 * n.inputs[0].type.nbytes)))
