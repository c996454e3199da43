"""A language model's head and its loss in vocabulary chunks: (T, V) logits are never whole.

- linear_cross_entropy(h, label, w[, bias]; chunk, ignore_index) -> the scalar loss
  F.cross_entropy(F.linear(h, w, bias).view(-1, V), label.view(-1), ignore_index=ignore_index):
  h (..., H), integer labels (...), w (V, H), bias (V,). The logits are computed `chunk`
  vocabulary rows at a time (R = prod(...) rows by chunk columns), each chunk folded into a
  running max and sum of exp per row (an online log-sum-exp) and the label's logit picked
  when it falls in the chunk.
- linear_qw_cross_entropy(h, label, wq, scale[, bias]; chunk, ignore_index, bits, in_features):
  the same with a frozen weight stored quantized (ops/qweights.py's layout), each chunk's rows
  dequantized as `dequantize` computes them; wq and scale take no gradient.
- linear[_qw]_cross_entropy_grad(g, <the forward's operands>; wants) -> (the gradients wanted
  among dh (..., H), dw (V, H), dbias (V,), in that order, then `logits` (R, chunk) and `stats`
  (R, 2)). When only dh is wanted (a frozen head: LoRA), one sweep over the chunks, as online
  softmax attention computes its output (`_one_sweep`): two GEMMs a chunk, as many as the
  unfused head computes over the whole vocabulary. Otherwise two sweeps over the chunks, the first recomputing each row's max and sum of exp
  (kept in `stats`, rounded to the dtype between chunks), the second the chunk's
  p = (softmax - one_hot) * g / count (0 at ignored rows) in `logits`, then dh += p @ w_chunk,
  dw[chunk] = p^T @ h, dbias[chunk] = the column sums of p. `wants` is a tuple of
  "h", "w", "bias". `logits` and `stats` are scratch that nothing reads: the memory planner
  counts them while the op runs (the pattern of ops/qfused.py). With attr `with_loss` True the
  op also gives the loss itself, as its last output, from the first sweep's max and sum of exp
  and the labels' logits: a training step then needs no forward op for the loss
  (passes/lm_head.py's loss_in_backward), one sweep of logits fewer.

Numerics as ops/loss.py's cross entropy: exp and log in float64 as the C runtime computes them
(ops/detmath.py), the loss a float64 sum divided by the counted labels (nan when none counts:
torch's answer), the gradient zero then. The chunk's logits are a GEMM in the dtype, so the C
kernels (runtime/et_float_lmloss.h, through the host BLAS where linked) agree with this
reference to float rounding, not bit for bit. The forward's own C kernel needs a chunk of
logits too: on the host's BLAS build it takes it from the per-thread kernel scratch (not in the
memory plan, as the im2col blocks); the portable build computes a logit at a time, no buffer.
"""
from __future__ import annotations

from math import prod
from typing import Optional

import numpy as np

from ..ir import TensorType
from .base import Cost, OpDef, register
from .detmath import exp_like_c, log_like_c
from .embedding import INDEX_DTYPES
from .loss import IGNORE_INDEX
from .qweights import FLOAT_DTYPES, stored_rows, dequantize

GRAD_NAMES = ("h", "w", "bias")


FORWARD_OPS = ("linear_cross_entropy", "linear_qw_cross_entropy")


class Operands:
    """The operands of a linear[_qw]_cross_entropy node (without the _grad's leading g) by role:
    h, label, the weight (w, or wq and scale when attrs carry `bits`), bias (or None)."""

    def __init__(self, xs, a):
        xs = list(xs)
        self.quantized = a.get("bits") is not None
        nw = 2 if self.quantized else 1
        if len(xs) not in (2 + nw, 3 + nw):
            raise ValueError(f"linear_cross_entropy: expected (h, label, {'wq, scale' if self.quantized else 'w'}"
                             f"[, bias]), got {len(xs)} operands")
        self.h, self.label, self.weight = xs[0], xs[1], tuple(xs[2:2 + nw])
        self.bias = xs[2 + nw] if len(xs) == 3 + nw else None


def _check(op: str, ts, a) -> tuple[Operands, int, str]:
    """The operand types of `op` (a forward op's name) by role, the vocabulary size and the float
    dtype, after checking them."""
    if (op == "linear_qw_cross_entropy") != (a.get("bits") is not None):
        raise ValueError(f"{op}: attrs bits and in_features are {'required' if 'qw' in op else 'not taken'}")
    o = Operands(ts, a)
    h, label = o.h, o.label
    if h.dtype not in FLOAT_DTYPES or h.rank < 1:
        raise ValueError(f"{op}: h must be a float32 or float64 tensor (..., hidden), got {h}")
    if o.quantized:
        v = stored_rows(op, o.weight[0], o.weight[1], a)
        if h.shape[-1] != a["in_features"]:
            raise ValueError(f"{op}: h {h} does not match a weight of {a['in_features']} inputs")
    else:
        (w,) = o.weight
        if w.rank != 2 or w.shape[1] != h.shape[-1] or w.dtype != h.dtype:
            raise ValueError(f"{op}: weight {w} should be {h.dtype} (vocabulary, {h.shape[-1]})")
        v = w.shape[0]
    if o.bias is not None and (o.bias.shape != (v,) or o.bias.dtype != h.dtype):
        raise ValueError(f"{op}: bias {o.bias} should be {h.dtype} ({v},)")
    if label.shape != h.shape[:-1] or label.dtype not in INDEX_DTYPES:
        raise ValueError(f"{op}: labels {label} should be integers of h's shape without its last "
                         f"dim {h.shape[:-1]}")
    chunk = a.get("chunk")
    if not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"{op}: attr chunk (vocabulary rows per chunk) must be a positive int, "
                         f"got {chunk!r}")
    return o, v, h.dtype


def chunk_of(node_or_attrs, vocab: int) -> int:
    """The chunk's vocabulary rows: attr `chunk`, at most the vocabulary."""
    a = getattr(node_or_attrs, "attrs", node_or_attrs)
    return min(int(a["chunk"]), vocab)


def _infer(op: str):
    def infer(ts, a):
        _, _, dt = _check(op, ts, a)
        return [TensorType((), dt)]
    return infer


# --- the reference ------------------------------------------------------------------------------
def _weight_rows_of(o: Operands, a, lo: int, hi: int, dtype) -> np.ndarray:
    if o.quantized:
        wq, scale = o.weight
        return dequantize(wq, scale, a["bits"], a["in_features"], rows=slice(lo, hi), dtype=np.dtype(dtype))
    return o.weight[0][lo:hi]


def _chunk_logits(o: Operands, a, h2, lo, hi):
    """The logits of vocabulary rows [lo, hi) of every row of h2, in the dtype."""
    z = h2 @ _weight_rows_of(o, a, lo, hi, h2.dtype).T
    return (z + o.bias[lo:hi] if o.bias is not None else z).astype(h2.dtype)


def _rows(o: Operands, a):
    h2 = o.h.reshape(-1, o.h.shape[-1])
    lab = o.label.reshape(-1).astype(np.int64)
    keep = lab != a.get("ignore_index", IGNORE_INDEX)
    vocab = o.weight[0].shape[0]
    if np.any(keep & ((lab < 0) | (lab >= vocab))):
        raise IndexError(f"linear_cross_entropy: a label out of range [0, {vocab})")
    return h2, lab, keep, vocab


def _online(stats_m, stats_s, z, round_to=None):
    """Fold a chunk's logits z (R, c) into the running max and sum of exp per row."""
    m = np.maximum(stats_m, z.max(axis=1).astype(np.float64))
    s = stats_s * exp_like_c(stats_m - m) + exp_like_c(z.astype(np.float64) - m[:, None]).sum(axis=1)
    return m, (s.astype(round_to).astype(np.float64) if round_to is not None else s)


def _ref(xs, a):
    o = Operands(xs, a)
    h2, lab, keep, vocab = _rows(o, a)
    c = chunk_of(a, vocab)
    m, s = np.full(len(h2), -np.inf), np.zeros(len(h2))
    picked = np.zeros(len(h2))
    for lo in range(0, vocab, c):
        z = _chunk_logits(o, a, h2, lo, min(lo + c, vocab))
        m, s = _online(m, s, z)
        inside = keep & (lab >= lo) & (lab < lo + z.shape[1])
        picked[inside] = z[inside, lab[inside] - lo]
    per = (m + log_like_c(np.where(keep, s, 1.0))) - picked
    count = int(keep.sum())
    with np.errstate(invalid="ignore", divide="ignore"):
        return [np.asarray(per[keep].sum() / np.float64(count), dtype=h2.dtype)]


def _one_sweep(xs, a):
    """The gradient of h alone (the head's weight and bias frozen) in one sweep, as online softmax
    attention computes its output: per chunk, the rows' new max m', alpha = exp(m - m'), and
    acc = acc * alpha + exp(z - m') @ w_chunk, s = s * alpha + the sum of exp(z - m') (acc, s and
    exp(z - m') rounded to the dtype as the C kernel keeps them); at the end
    dh = (acc / s - w[label]) * g / count on counted rows, 0 on ignored ones."""
    g, *rest = xs
    o = Operands(rest, a)
    h2, lab, keep, vocab = _rows(o, a)
    dt = h2.dtype
    c = chunk_of(a, vocab)
    rows = len(h2)
    m, s, picked = np.full(rows, -np.inf), np.zeros(rows), np.zeros(rows)
    acc = np.zeros_like(h2)
    p = np.zeros((rows, c), dt)
    for lo in range(0, vocab, c):
        hi = min(lo + c, vocab)
        z = _chunk_logits(o, a, h2, lo, hi)
        mn = np.maximum(m, z.max(axis=1).astype(np.float64))
        alpha = exp_like_c(m - mn) if lo else np.zeros(rows)
        p[:, :hi - lo] = exp_like_c(z.astype(np.float64) - mn[:, None]).astype(dt)
        s = (s * alpha + p[:, :hi - lo].astype(np.float64).sum(axis=1)).astype(dt).astype(np.float64)
        grew = mn != m
        acc[grew] *= alpha[grew, None].astype(dt)
        acc += p[:, :hi - lo] @ _weight_rows_of(o, a, lo, hi, dt)
        m = mn
        inside = keep & (lab >= lo) & (lab < hi)
        picked[inside] = z[inside, lab[inside] - lo]
    count = int(keep.sum())
    k = float(g) / count if count else 0.0
    dh = np.zeros_like(h2)
    for r in np.flatnonzero(keep):
        w_y = _weight_rows_of(o, a, int(lab[r]), int(lab[r]) + 1, dt)[0]
        dh[r] = ((acc[r].astype(np.float64) / s[r] - w_y.astype(np.float64)) * k).astype(dt)
    return dh, p, m, s, picked, keep, count


def _grad_ref(xs, a):
    g, *rest = xs
    o = Operands(rest, a)
    wants = a["wants"]
    if tuple(wants) == ("h",):
        dh, p, m, s, picked, keep, count = _one_sweep(xs, a)
        return _with_loss([dh.reshape(o.h.shape), p, np.stack([m, s], axis=1).astype(dh.dtype)], a, m, s, picked,
                          keep, count)
    h2, lab, keep, vocab = _rows(o, a)
    dt = h2.dtype
    c = chunk_of(a, vocab)
    m, s = np.full(len(h2), -np.inf), np.zeros(len(h2))
    picked = np.zeros(len(h2))
    for lo in range(0, vocab, c):  # sweep 1: each row's max and sum of exp, rounded as the C kernel keeps them
        z = _chunk_logits(o, a, h2, lo, min(lo + c, vocab))
        m, s = _online(m, s, z, round_to=dt)
        inside = keep & (lab >= lo) & (lab < lo + z.shape[1])
        picked[inside] = z[inside, lab[inside] - lo]
    count = int(keep.sum())
    k = float(g) / count if count else 0.0
    dh = np.zeros_like(h2) if "h" in wants else None
    dw = np.zeros((vocab, h2.shape[1]), dt) if "w" in wants else None
    db = np.zeros(vocab, dt) if "bias" in wants else None
    p = np.zeros((len(h2), c), dt)
    for lo in range(0, vocab, c):  # sweep 2: p, then the gradients of the chunk
        hi = min(lo + c, vocab)
        z = _chunk_logits(o, a, h2, lo, hi)
        q = exp_like_c(z.astype(np.float64) - m[:, None]) / np.where(keep, s, 1.0)[:, None]
        inside = keep & (lab >= lo) & (lab < hi)
        q[inside, lab[inside] - lo] -= 1.0
        p[:, :hi - lo] = np.where(keep[:, None], q * k, 0.0).astype(dt)
        pc = p[:, :hi - lo]
        if dh is not None:
            dh += pc @ _weight_rows_of(o, a, lo, hi, dt)
        if dw is not None:
            dw[lo:hi] = pc.T @ h2
        if db is not None:
            db[lo:hi] = pc.sum(axis=0)
    stats = np.stack([m, s], axis=1).astype(dt)
    outs = [x for x in (dh.reshape(o.h.shape) if dh is not None else None, dw, db) if x is not None]
    return _with_loss(outs + [p, stats], a, m, s, picked, keep, count)


def _with_loss(outs: list, a, m, s, picked, keep, count) -> list:
    """`outs`, then the loss from the rows' max and sum of exp when attr with_loss is set."""
    if not a.get("with_loss"):
        return outs
    per = (m + log_like_c(np.where(keep, s, 1.0))) - picked
    with np.errstate(invalid="ignore", divide="ignore"):
        return outs + [np.asarray(per[keep].sum() / np.float64(count), dtype=outs[0].dtype)]


# --- shapes, gradients, cost -----------------------------------------------------------------------
def _grad_infer(op: str):
    return lambda ts, a: _grad_types(op, ts, a)


def _grad_types(op: str, ts, a):
    g, *rest = ts
    o, v, dt = _check(op, rest, a)
    wants = a.get("wants")
    if not wants or set(wants) - set(GRAD_NAMES) or list(wants) != sorted(wants, key=GRAD_NAMES.index):
        raise ValueError(f"linear_cross_entropy_grad: attr wants must name some of {GRAD_NAMES} in order, "
                         f"got {wants!r}")
    if "w" in wants and o.quantized:
        raise ValueError("linear_cross_entropy_grad: a weight stored quantized is frozen; no gradient for it")
    if "bias" in wants and o.bias is None:
        raise ValueError("linear_cross_entropy_grad: no bias to differentiate")
    if g.shape != () or g.dtype != dt:
        raise ValueError(f"linear_cross_entropy_grad: the loss gradient {g} should be a {dt} scalar")
    h = o.h
    rows = prod(h.shape[:-1])
    shapes = {"h": h.shape, "w": (v, h.shape[-1]), "bias": (v,)}
    scratch = [TensorType((rows, chunk_of(a, v)), dt), TensorType((rows, 2), dt)]
    return [TensorType(shapes[n], dt) for n in wants] + scratch + ([TensorType((), dt)] if a.get("with_loss") else [])


def _vjp(e, node, grads, needs):
    o = Operands(node.inputs, node.attrs)
    wn = Operands(list(needs), node.attrs)  # the `needs` by role
    if o.quantized and any(wn.weight):
        raise ValueError("linear_cross_entropy: the quantized weight and its scales are frozen; no gradient is "
                         "computed for them")
    wants = tuple(n for n, want in zip(GRAD_NAMES, (wn.h, None if o.quantized else wn.weight[0], wn.bias)) if want)
    if grads[0] is None or not wants:
        return [None] * len(node.inputs)
    outs = e.emit_multi(node.op + "_grad", grads[0], *node.inputs, wants=wants, **node.attrs)
    by_name = dict(zip(wants, outs))
    result: list[Optional[object]] = [by_name.get("h"), None]
    result += [None] * len(o.weight) if o.quantized else [by_name.get("w")]
    return result + ([by_name.get("bias")] if o.bias is not None else [])


def _cost(node, gemms: int = 1) -> Cost:
    """`gemms` multiply-adds of R x H by H x V (plus a dequantized weight element each, when
    quantized), a few operations per logit; every operand and result touched once."""
    operands = node.inputs[1:] if node.op.endswith("_grad") else node.inputs
    o = Operands([v.type for v in operands], node.attrs)
    rows, hid = prod(o.h.shape[:-1]), o.h.shape[-1]
    vocab = o.weight[0].shape[0]
    deq = vocab * hid * gemms if o.quantized else 0
    touched = sum(v.type.nbytes for v in node.inputs) + sum(v.type.nbytes for v in node.outputs)
    return Cost(gemms * rows * vocab * hid + 4 * rows * vocab + deq, touched)


def _grad_cost(node) -> Cost:
    wants = node.attrs["wants"]
    if tuple(wants) == ("h",):
        return _cost(node, gemms=2)  # one sweep: the logits and dh
    return _cost(node, gemms=2 + ("h" in wants) + ("w" in wants))  # two sweeps of logits, dh, dw


register(OpDef("linear_cross_entropy", _infer("linear_cross_entropy"), _ref, _vjp, cost=_cost, num_inputs=(3, 4)))
register(OpDef("linear_qw_cross_entropy", _infer("linear_qw_cross_entropy"), _ref, _vjp, cost=_cost,
               num_inputs=(4, 5)))
register(OpDef("linear_cross_entropy_grad", _grad_infer("linear_cross_entropy"), _grad_ref, cost=_grad_cost,
               num_inputs=(4, 5)))
register(OpDef("linear_qw_cross_entropy_grad", _grad_infer("linear_qw_cross_entropy"), _grad_ref, cost=_grad_cost,
               num_inputs=(5, 6)))
