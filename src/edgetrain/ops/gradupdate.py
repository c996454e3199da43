"""A float convolution's or linear layer's weight gradient and its in-place SGD update as one
op, a block of output rows at a time: the whole weight gradient (as large as the weight:
9.4 MB for ResNet-18's last convolutions) is never stored, only one block of it.

``conv2d_grad_weight_update(x, gy, w[, m]) -> (w'[, m'], rows[, second])`` and
``linear_grad_weight_update(x, gy, w[, m]) -> (w'[, m'], rows[, cols])`` are, by definition,

    gw = conv2d_grad_weight(x, gy) | linear_grad_weight(x, gy)   attributes under "gw_"
    w'[, m'] = sgd_update(w, gw[, m])                             attributes under "up_"

for a whole-weight update (no channel selection) of a gradient larger than one block
(passes/fuse.py leaves one that fits BLOCK_BYTES unfused: nothing to save, and the unfused
kernels stay as fast as they are). Row k of gw (output channel k) depends
on channel k of gy only (and on its group's input channels), and sgd_update is elementwise,
so the kernel computes a block of rows and applies it before the next. `w'` (and `m'`)
overwrite w (and m) in place: `shares`, as for sgd_update. The scratch outputs, which
nothing reads (the planners count them while the op runs):
- conv: `rows`, one block: `block` output rows of a one-group convolution, or the rows of
  `block` whole groups of a grouped one (conv_block picks the largest divisor that keeps it
  under BLOCK_BYTES, so that the C kernel runs each block as one sub-convolution through
  et_float_gemm.h's fast kernels); with a batch of more than one and more than one block,
  `second`: one-group, the block's channels of gy (copied contiguous, so that a block is one
  sub-convolution of the whole batch); grouped, one sample's share of the block's gradient
  (the kernel runs a block sample by sample and adds the shares into `rows`);
- linear: `rows`, one block of `block` rows (linear_block: the same rule), and when that is
  not all of them, `cols`: the block's columns of gy (n x block), copied contiguous so that
  each block is one et_dense_grad_weight (a GEMM on the host's BLAS).

Numerics: the reference computes the whole gradient with the unfused ops' arithmetic and
then the update, so a fused program is bit-identical to the unfused one in the reference
runtime; the scratch outputs hold what the C kernel leaves in them (the last block's rows,
the last sample's share of them). The C kernel (runtime/et_float_fused.h) sums in its own
order: equal within float tolerances.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

import numpy as np

from ..ir import TensorType
from .base import Cost, OpDef, get_op, register
from .qgradupdate import fuse_attrs, split_attrs  # the same gw_/up_ attribute split as the int8 op

#: gradient op -> the op fusing it with sgd_update (passes/fuse.fuse_weight_grad_update)
FLOAT_GRAD_UPDATE = {"conv2d_grad_weight": "conv2d_grad_weight_update",
                     "linear_grad_weight": "linear_grad_weight_update"}
#: a conv block's gradient rows stay under this many bytes (or hold one row / one group)
BLOCK_BYTES = 1024 * 1024


def conv_block(weight_shape, groups: int) -> int:
    """Rows per block (one-group convolution) or groups per block (grouped, depthwise): the
    largest divisor of the output channels (groups) whose rows fit BLOCK_BYTES, at least 1."""
    o, cg, kh, kw = weight_shape
    row, unit = cg * kh * kw * 4, (1 if groups == 1 else o // groups)
    count = o if groups == 1 else groups
    return max(d for d in range(1, count + 1) if count % d == 0 and (d == 1 or d * unit * row <= BLOCK_BYTES))


def linear_block(out_features: int, in_features: int) -> int:
    """Rows per block of a linear layer's gradient: the largest divisor of its output
    features whose rows fit BLOCK_BYTES, at least 1."""
    return conv_block((out_features, in_features, 1, 1), 1)


def block_rows(a: Mapping[str, Any], rows: int) -> range:
    """The output rows of a fused update's last block (`a` its attributes, `rows` the
    weight's output rows)."""
    gw, _ = split_attrs(a)
    groups, block = int(gw.get("groups", 1)), int(a["block"])
    size = block if groups == 1 else block * (rows // groups)
    return range(rows - size, rows)


def _grad_op(fused: str) -> str:
    return next(g for g, f in FLOAT_GRAD_UPDATE.items() if f == fused)


def _grad_ref(op: str, x, gy, a) -> np.ndarray:
    """The unfused gradient op's reference (the same numpy arithmetic)."""
    return get_op(op).ref([x, gy], a)[0]


def _infer_of(fused: str):
    grad_op = _grad_op(fused)

    def infer(ts, a):
        x, gy, w = ts[:3]
        gw, up = split_attrs(a)
        (grad,) = get_op(grad_op).infer([x, gy], gw)
        if up.get("index") is not None:
            raise ValueError(f"{fused}: a channel-selected update is not fused (index {up['index']})")
        updated = get_op("sgd_update").infer([w, grad, *ts[3:]], up)
        o, groups, block = grad.shape[0], int(gw.get("groups", 1)), int(a.get("block", 0))
        if block < 1 or (o if groups == 1 else groups) % block:
            raise ValueError(f"{fused}: block {block} does not divide {'the rows' if groups == 1 else 'the groups'}")
        rows = TensorType((len(block_rows(a, o)),) + grad.shape[1:], grad.dtype)
        if fused == "linear_grad_weight_update":  # and the block's columns of gy, when not all of them
            n = gy.numel // o
            return updated + [rows] + ([TensorType((n, block), gy.dtype)] if block < o else [])
        return updated + [rows] + [t for t in [_conv_second_scratch(x, gy, rows, a)] if t is not None]
    return infer


def _conv_second_scratch(x, gy, rows, a) -> Optional[TensorType]:
    """A conv's second scratch: none with a batch of one or a single block; else, one-group,
    the block's channels of gy for the whole batch (copied contiguous: one GEMM per block);
    grouped, one sample's share of the block's gradient (the kernel runs the block per sample)."""
    gw, _ = split_attrs(a)
    n, o = x.shape[0], gy.shape[1]
    if n == 1 or rows.shape[0] == o:
        return None
    if int(gw["groups"]) == 1:
        return TensorType((n, rows.shape[0]) + tuple(gy.shape[2:]), gy.dtype)
    return rows


def _ref_of(fused: str):
    grad_op = _grad_op(fused)

    def ref(xs, a):
        x, gy, w = xs[:3]
        gw, up = split_attrs(a)
        grad = _grad_ref(grad_op, x, gy, gw)
        updated = get_op("sgd_update").ref([w, grad, *xs[3:]], up)
        o = grad.shape[0]
        rows = np.asarray(block_rows(a, o))
        if fused == "linear_grad_weight_update":
            cols = [gy.reshape(-1, o)[:, rows].copy()] if rows.size < o else []
            return updated + [grad[rows].copy()] + cols
        second = []
        if x.shape[0] > 1 and rows.size < o:
            second = [gy[:, rows].copy() if int(gw["groups"]) == 1 else _grad_ref(grad_op, x[-1:], gy[-1:], gw)[rows]]
        return updated + [grad[rows].copy()] + second
    return ref


def _cost(node) -> Cost:
    """The gradient's MACs plus the update's, reading every operand once."""
    x, gy, w = node.inputs[:3]
    if node.op == "conv2d_grad_weight_update":
        gw, _ = split_attrs(node.attrs)
        macs = gy.type.numel * int(np.prod(gw["weight_shape"][1:]))
    else:
        macs = x.type.numel * gy.shape[-1]
    return Cost(macs + 2 * w.type.numel, sum(v.type.nbytes for v in node.inputs))


for _fused in FLOAT_GRAD_UPDATE.values():
    register(OpDef(_fused, _infer_of(_fused), _ref_of(_fused), cost=_cost, shares=((0, 2), (1, 3)), mutates=True,
                   num_inputs=(3, 4)))

__all__ = ["BLOCK_BYTES", "FLOAT_GRAD_UPDATE", "block_rows", "conv_block", "fuse_attrs", "linear_block",
           "split_attrs"]
