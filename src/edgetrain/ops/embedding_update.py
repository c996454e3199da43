"""An embedding's weight gradient and its in-place SGD update as one op, materializing the
gradient of the rows the batch touches only: BERT-tiny's dense 30522 x 128 gradient
(15.6 MB) becomes one 128-float row and a list of the touched rows.

``embedding_grad_update(g, idx, w[, m]) -> (w'[, m'], row, ids)`` is, by definition,

    gw = embedding_grad(g, idx)          attributes under the prefix "gw_"
    w'[, m'] = sgd_update(w, gw[, m])    attributes under the prefix "up_"

The semantics are dense SGD's, exactly (also torch's `nn.Embedding(sparse=True)` under
`torch.optim.SGD`, whose sparse momentum buffer keeps decaying the rows it holds; torch
refuses weight decay with sparse gradients, dense SGD defines it):
- a touched row r (an index of the batch, other than padding_idx) gets
  d = sum of its gradient rows (in the batch's order) [+ weight_decay * w[r]];
  m[r] = momentum * m[r] + d; w[r] -= lr * m[r] (lr * d without momentum);
- an untouched row has a zero gradient: without momentum and weight decay it is left as
  it is (what dense SGD computes: w - lr * 0 == w); with either, it gets dense SGD's step
  from d = weight_decay * w[r] (the momentum keeps decaying: m = momentum * m + d,
  w -= lr * m), so its cost is dense but the gradient still is never stored.

Outputs: `w'` (and `m'`) overwrite w (and m) in place (`shares`); `row` (1 x width) is
the kernel's gradient row, left holding the last touched row's (zeros when no row is
touched); `ids` (int32, one per index) the touched rows in increasing order, then -1.
Nothing reads `row` or `ids`: the planners count them while the op runs.

The reference materializes the touched rows only and adds each row's gradients in the
batch's order, as embedding_grad's np.add.at does, so it is bit-identical to the unfused
embedding_grad + sgd_update.
"""
from __future__ import annotations

import numpy as np

from ..ir import TensorType
from .base import Cost, OpDef, get_op, register
from .qgradupdate import fuse_attrs, split_attrs  # the same gw_/up_ attribute split as the int8 op

EMBEDDING_GRAD_UPDATE = "embedding_grad_update"


def _infer(ts, a):
    g, idx, w = ts[:3]
    gw, up = split_attrs(a)
    (grad,) = get_op("embedding_grad").infer([g, idx], gw)
    if up.get("index") is not None:
        raise ValueError(f"{EMBEDDING_GRAD_UPDATE}: a channel-selected update is not fused")
    updated = get_op("sgd_update").infer([w, grad, *ts[3:]], up)
    return updated + [TensorType((1, grad.shape[1]), grad.dtype), TensorType((max(idx.numel, 1),), "int32")]


def touched_rows(idx: np.ndarray, padding_idx: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids, positions, slots): the touched rows in increasing order (padding_idx left out),
    the flat positions of idx that touch one, and each such position's index into ids."""
    flat = idx.reshape(-1).astype(np.int64)
    keep = np.flatnonzero(flat != padding_idx) if padding_idx >= 0 else np.arange(flat.size)
    ids, slots = np.unique(flat[keep], return_inverse=True)
    return ids, keep, slots.reshape(-1)


def embedding_grad_update_ref(xs, a):
    g, idx, w = xs[:3]
    m = xs[3] if len(xs) > 3 else None
    gw, up = split_attrs(a)
    num, width = w.shape
    if idx.size and (idx.min() < 0 or idx.max() >= num):
        raise IndexError(f"{EMBEDDING_GRAD_UPDATE}: index out of range [0, {num})")
    ids, keep, slots = touched_rows(idx, int(gw.get("padding_idx", -1)))
    rows = np.zeros((ids.size, width), dtype=g.dtype)
    np.add.at(rows, slots, g.reshape(-1, width)[keep])  # each row summed in the batch's order
    lr, mu, wd = up["lr"], up["momentum"], up["weight_decay"]
    w_new = w.copy()
    if m is None and not wd:  # untouched rows: w - lr * 0 == w
        w_new[ids] = w[ids] - lr * rows
        outs = [w_new]
    else:  # sgd_update's arithmetic on every row, d = 0 + wd * w where nothing was touched
        d = np.zeros_like(w) if not wd else np.zeros_like(w) + wd * w
        d[ids] = rows + wd * w[ids] if wd else rows
        if m is not None:
            d = mu * m + d
        w_new = (w - lr * d).astype(w.dtype)
        outs = [w_new] + ([d.astype(w.dtype)] if m is not None else [])
    row = rows[-1:].copy() if ids.size else np.zeros((1, width), dtype=g.dtype)
    ids_out = np.full(max(idx.size, 1), -1, dtype=np.int32)
    ids_out[:ids.size] = ids
    return outs + [row, ids_out]


def _cost(node) -> Cost:
    g, idx, w = node.inputs[:3]
    dense = len(node.inputs) > 3 or split_attrs(node.attrs)[1]["weight_decay"]
    touched = w.type.numel if dense else min(idx.type.numel, w.shape[0]) * w.shape[1]
    itemsize = w.type.nbytes // max(w.type.numel, 1)
    return Cost(g.type.numel + 2 * touched, g.type.nbytes + idx.type.nbytes + 3 * touched * itemsize)


register(OpDef(EMBEDDING_GRAD_UPDATE, _infer, embedding_grad_update_ref, cost=_cost, shares=((0, 2), (1, 3)),
               mutates=True, num_inputs=(3, 4)))

__all__ = ["EMBEDDING_GRAD_UPDATE", "embedding_grad_update_ref", "fuse_attrs", "split_attrs", "touched_rows"]
