"""Embedding lookup and its (dense) weight gradient."""
from __future__ import annotations

import numpy as np

from ..ir import TensorType
from .base import LAYER_TAG, Cost, OpDef, ParamOperands, register

INDEX_DTYPES = ("int64", "int32")


def _infer(ts, a):
    w, idx = ts
    if w.rank != 2 or idx.dtype not in INDEX_DTYPES:
        raise ValueError(f"embedding: expected a 2-D weight and integer indices, got {w} and {idx}")
    return [TensorType(idx.shape + (w.shape[1],), w.dtype)]


def _grad_ref(xs, a):
    g, idx = xs
    out = np.zeros((a["num_embeddings"], g.shape[-1]), dtype=g.dtype)
    flat = idx.reshape(-1)
    np.add.at(out, flat, g.reshape(-1, g.shape[-1]))
    if a.get("padding_idx", -1) >= 0:
        out[a["padding_idx"]] = 0
    return [out]


def _vjp(e, node, grads, needs):
    w, idx = node.inputs
    gw = e.emit("embedding_grad", grads[0], idx, num_embeddings=w.shape[0],
                padding_idx=node.attrs.get("padding_idx", -1)) if needs[0] else None
    return [gw, None]


def _check_ref(xs, a):
    w, idx = xs
    if idx.size and (idx.min() < 0 or idx.max() >= w.shape[0]):
        raise IndexError(f"embedding: index out of range [0, {w.shape[0]})")
    return [w[idx]]


register(OpDef("embedding", _infer, _check_ref, _vjp,
               cost=lambda n: Cost(0, 2 * n.outputs[0].type.nbytes + n.inputs[1].type.nbytes), num_inputs=(2, 2),
               tags={LAYER_TAG}, params=ParamOperands("embedding", weight=0)))
register(OpDef("embedding_grad", lambda ts, a: [ts[0].with_shape((a["num_embeddings"], ts[0].shape[-1]))],
               _grad_ref, num_inputs=(2, 2)))
