"""Losses (mean over the batch) and their gradients."""
from __future__ import annotations

import numpy as np

from ..ir import TensorType
from .base import OpDef, register
from .detmath import exp_like_c, log_like_c
from .embedding import INDEX_DTYPES


def _ce_infer(ts, a):
    logits, labels = ts
    if logits.rank != 2 or labels.shape != (logits.shape[0],) or labels.dtype not in INDEX_DTYPES:
        raise ValueError(f"cross_entropy: expected logits (N, C) and integer labels (N,), got {logits} and {labels}")
    return [TensorType((), logits.dtype)]


def _ce_ref(xs, a):
    """mean over rows of max + log(sum exp(x - max)) - x[label], in float64 with the C
    runtime's exp and log, sums in class and row order, rounded once to the logits' dtype:
    the generated C computes exactly this, so the loss of a program is the same number on
    every backend (an int8 program's loss bit for bit)."""
    logits, labels = xs
    n = len(labels)
    m = logits.max(axis=1).astype(np.float64)
    e = exp_like_c(logits.astype(np.float64) - m[:, None])
    s = np.zeros(n)
    for k in range(logits.shape[1]):  # sequential, as the C loop
        s = s + e[:, k]
    rows = (m + log_like_c(s)) - logits[np.arange(n), labels].astype(np.float64)
    total = 0.0
    for r in rows:  # sequential, as the C loop
        total += float(r)
    return [np.asarray(total / n, dtype=logits.dtype)]


def _ce_grad_ref(xs, a):
    """(softmax - one_hot) * g / N. Computed in float64 with the C runtime's exp, the max
    subtracted first, the row sum in class order, rounded once to the logits' dtype: the
    generated C computes exactly this, so an int8 program's gradients (rounded
    stochastically into its integers) are bit-identical in C and here."""
    g, logits, labels = xs
    n, c = logits.shape
    x = logits.astype(np.float64)
    e = exp_like_c(x - logits.max(axis=1).astype(np.float64)[:, None])
    s = np.zeros(n)
    for k in range(c):  # sequential, as the C loop
        s = s + e[:, k]
    p = e / s[:, None]
    p[np.arange(n), labels] -= 1.0
    return [(p * (float(g) / n)).astype(logits.dtype)]


def _mse_infer(ts, a):
    if ts[0].shape != ts[1].shape or ts[0].dtype != ts[1].dtype:
        raise ValueError(f"mse: prediction {ts[0]} and target {ts[1]} differ")
    return [TensorType((), ts[0].dtype)]


def _mse_grad_ref(xs, a):
    g, pred, target = xs
    return [((pred - target) * (2.0 * g / pred.size)).astype(pred.dtype)]


def _vjp_mse(e, node, grads, needs):
    gp = e.emit("mse_grad", grads[0], *node.inputs)
    return [gp if needs[0] else None, e.emit("neg", gp) if needs[1] else None]  # d/dtarget = -d/dpred


register(OpDef("cross_entropy", _ce_infer, _ce_ref,
               lambda e, n, g, nd: [e.emit("cross_entropy_grad", g[0], *n.inputs), None], num_inputs=(2, 2)))
register(OpDef("cross_entropy_grad", lambda ts, a: [ts[1]], _ce_grad_ref, num_inputs=(3, 3)))
register(OpDef("mse", _mse_infer, lambda xs, a: [np.asarray(((xs[0] - xs[1]) ** 2).mean(), dtype=xs[0].dtype)],
               _vjp_mse, num_inputs=(2, 2)))
register(OpDef("mse_grad", lambda ts, a: [ts[1]], _mse_grad_ref, num_inputs=(3, 3)))
