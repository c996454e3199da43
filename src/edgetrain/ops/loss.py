"""Losses (a mean over the positions that count) and their gradients.

Every loss is computed as its C kernel (backends/c/runtime/et_float.h) computes it: in
float64 with the C runtime's exp and log (ops/detmath.py), sums in a fixed order (the
positions in memory order, the classes in order), rounded once to the input's dtype. So a
program's loss is the same number on every backend, and an int8 program's loss gradient
(rounded stochastically into its integers) is bit-identical in C and here.

- cross_entropy(logits, labels; class_dim, ignore_index): torch's F.cross_entropy with
  integer labels over the class dim `class_dim` of logits of any rank >= 2 (1 as torch:
  (N, C), (N, C, L), (N, C, H, W); the last dim for a sequence's (N, T, V)); labels are the
  logits' shape without the class dim. A position whose label is `ignore_index` counts
  neither in the sum nor in the mean's divisor; when every position is ignored the loss is
  nan and the gradient zero, as torch gives.
- bce_with_logits(x, t): F.binary_cross_entropy_with_logits, mean of
  max(x, 0) - x t + log(1 + exp(-|x|)) (the stable form; in float64, log(1 + e) for
  e = exp(-|x|) <= 1 is log1p(e) to float64 rounding).
- mse(a, b), l1(a, b): F.mse_loss, F.l1_loss (targets shaped like the output).
"""
from __future__ import annotations

from math import prod

import numpy as np

from ..ir import TensorType
from .base import Cost, OpDef, out_grad, register
from .detmath import exp_like_c, log_like_c
from .embedding import INDEX_DTYPES

#: torch's default ignore_index of F.cross_entropy
IGNORE_INDEX = -100
#: the float ops per element a loss kernel spends (exp, log, max, subtract, ...): a cost estimate
LOSS_OPS_PER_ELEMENT = 4


def _loss_cost(node) -> Cost:
    """Reads every operand once and runs a few operations per element of the first."""
    touched = sum(v.type.nbytes for v in node.inputs) + sum(v.type.nbytes for v in node.outputs)
    return Cost(macs=LOSS_OPS_PER_ELEMENT * node.inputs[-2 if len(node.inputs) == 3 else 0].type.numel,
                bytes=touched)


def _sequential_sum(values) -> float:
    """The float64 sum in order, as the C loop adds."""
    total = np.float64(0.0)
    for v in np.asarray(values, np.float64).ravel().tolist():
        total = total + v
    return total


# --- cross entropy over a class dim ---------------------------------------------------------
def ce_layout(shape, class_dim: int) -> tuple[int, int, int]:
    """(A, C, S): logits of `shape` seen as (A, C, S), the class dim in the middle; the kernel's
    positions run a-major then s."""
    return prod(shape[:class_dim]), shape[class_dim], prod(shape[class_dim + 1:])


def _ce_attrs(a) -> tuple[int, int]:
    return a.get("class_dim", 1), a.get("ignore_index", IGNORE_INDEX)


def _ce_infer(ts, a):
    logits, labels = ts
    d, _ = _ce_attrs(a)
    want = logits.shape[:d] + logits.shape[d + 1:] if logits.rank >= 2 and 0 < d < logits.rank else None
    if want is None or labels.shape != want or labels.dtype not in INDEX_DTYPES:
        raise ValueError(f"cross_entropy: expected logits of rank >= 2 with the classes in dim {d} and integer "
                         f"labels of their shape without it, got {logits} and {labels}")
    if logits.dtype not in ("float32", "float64"):
        raise ValueError(f"cross_entropy: logits must be float32 or float64, got {logits.dtype}")
    return [TensorType((), logits.dtype)]


def _ce_rows(logits, labels, a):
    """The logits as rows of classes (position order), the labels, and the counted positions."""
    d, ignore = _ce_attrs(a)
    n_a, c, s = ce_layout(logits.shape, d)
    rows = logits.reshape(n_a, c, s).transpose(0, 2, 1).reshape(n_a * s, c)
    lab = labels.reshape(n_a * s).astype(np.int64)
    return rows, lab, lab != ignore


def _ce_softmax_parts(rows):
    """max, exp(x - max) and the class-order sum of each row, in float64 as the C loop."""
    m = rows.max(axis=1).astype(np.float64)
    e = exp_like_c(rows.astype(np.float64) - m[:, None])
    s = np.zeros(len(rows))
    for k in range(rows.shape[1]):  # sequential, as the C loop
        s = s + e[:, k]
    return m, e, s


def _ce_ref(xs, a):
    """Sum over counted positions of max + log(sum exp(x - max)) - x[label], divided by their
    count (nan when there is none, as torch)."""
    logits, labels = xs
    rows, lab, keep = _ce_rows(logits, labels, a)
    m, _, s = _ce_softmax_parts(rows)
    picked = rows[np.arange(len(rows)), np.where(keep, lab, 0)].astype(np.float64)
    per = (m + log_like_c(s)) - picked
    with np.errstate(invalid="ignore", divide="ignore"):
        return [np.asarray(_sequential_sum(per[keep]) / np.float64(keep.sum()), dtype=logits.dtype)]


def _ce_grad_ref(xs, a):
    """(softmax - one_hot) * g / count at the counted positions, 0 at the ignored ones."""
    g, logits, labels = xs
    rows, lab, keep = _ce_rows(logits, labels, a)
    _, e, s = _ce_softmax_parts(rows)
    p = e / s[:, None]
    p[np.arange(len(rows)), np.where(keep, lab, 0)] -= 1.0
    count = int(keep.sum())
    scale = float(g) / count if count else 0.0
    p = np.where(keep[:, None], p * scale, 0.0).astype(logits.dtype)
    d, _ = _ce_attrs(a)
    n_a, c, s_ = ce_layout(logits.shape, d)
    return [p.reshape(n_a, s_, c).transpose(0, 2, 1).reshape(logits.shape)]


register(OpDef("cross_entropy", _ce_infer, _ce_ref,
               lambda e, n, g, nd: [e.emit("cross_entropy_grad", out_grad(g), *n.inputs, **n.attrs), None],
               cost=_loss_cost, num_inputs=(2, 2)))
register(OpDef("cross_entropy_grad", lambda ts, a: [ts[1]], _ce_grad_ref, cost=_loss_cost, num_inputs=(3, 3)))


# --- losses on targets shaped like the output ------------------------------------------------
def _same_shape_infer(name):
    def infer(ts, a):
        if ts[0].shape != ts[1].shape or ts[0].dtype != ts[1].dtype:
            raise ValueError(f"{name}: prediction {ts[0]} and target {ts[1]} differ")
        if ts[0].dtype not in ("float32", "float64"):
            raise ValueError(f"{name}: prediction must be float32 or float64, got {ts[0].dtype}")
        return [TensorType((), ts[0].dtype)]
    return infer


def _mean_ref(per_element):
    """A loss: the sequential float64 sum of per_element(a, b) over all elements / their count."""
    def ref(xs, a):
        p, t = xs
        return [np.asarray(_sequential_sum(per_element(p.astype(np.float64), t.astype(np.float64))) / p.size,
                           dtype=p.dtype)]
    return ref


def _mse_grad_ref(xs, a):
    g, pred, target = xs
    return [((pred - target) * (2.0 * g / pred.size)).astype(pred.dtype)]


def _l1_grad_ref(xs, a):
    """sign(a - b) * (g / n), sign(0) = 0 as torch; g / n in the dtype (the C kernel's float)."""
    g, pred, target = xs
    k = np.asarray(g, pred.dtype) / np.asarray(pred.size, pred.dtype)
    return [(np.sign(pred - target).astype(pred.dtype) * k).astype(pred.dtype)]


def _bce_parts(x):
    """e = exp(-|x|) and sigmoid(x) in float64 with the C runtime's exp."""
    e = exp_like_c(-np.abs(x))
    return e, np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def _bce_per_element(x, t):
    e, _ = _bce_parts(x)
    return (np.maximum(x, 0.0) - x * t) + log_like_c(1.0 + e)


def _bce_grad_ref(xs, a):
    """(sigmoid(x) - t) * g / n, in float64 with the C runtime's exp."""
    g, x, t = xs
    _, sig = _bce_parts(x.astype(np.float64))
    return [((sig - t.astype(np.float64)) * (float(g) / x.size)).astype(x.dtype)]


def _vjp_target_neg(grad_op):
    """d/dpred by `grad_op`, d/dtarget its negation (the loss depends on pred - target)."""
    def vjp(e, node, grads, needs):
        gp = e.emit(grad_op, grads[0], *node.inputs)
        return [gp if needs[0] else None, e.emit("neg", gp) if needs[1] else None]
    return vjp


def _vjp_bce(e, node, grads, needs):
    """Targets are labels: only the logits get a gradient."""
    return [e.emit("bce_with_logits_grad", grads[0], *node.inputs) if needs[0] else None, None]


register(OpDef("mse", _same_shape_infer("mse"), _mean_ref(lambda p, t: (p - t) ** 2), _vjp_target_neg("mse_grad"),
               cost=_loss_cost, num_inputs=(2, 2)))
register(OpDef("mse_grad", lambda ts, a: [ts[1]], _mse_grad_ref, num_inputs=(3, 3)))
register(OpDef("l1", _same_shape_infer("l1"), _mean_ref(lambda p, t: np.abs(p - t)), _vjp_target_neg("l1_grad"),
               cost=_loss_cost, num_inputs=(2, 2)))
register(OpDef("l1_grad", lambda ts, a: [ts[1]], _l1_grad_ref, num_inputs=(3, 3)))
register(OpDef("bce_with_logits", _same_shape_infer("bce_with_logits"), _mean_ref(_bce_per_element), _vjp_bce,
               cost=_loss_cost, num_inputs=(2, 2)))
register(OpDef("bce_with_logits_grad", lambda ts, a: [ts[1]], _bce_grad_ref, cost=_loss_cost, num_inputs=(3, 3)))
