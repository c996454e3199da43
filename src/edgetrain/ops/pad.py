"""pad: a constant border around a tensor (torch's constant_pad_nd with non-negative widths;
the frontend crops negative widths with `slice` first). Its gradient is the slice of the
output gradient that the input occupies (one `slice` per padded dim): no op of its own."""
from __future__ import annotations

import numpy as np

from .base import OpDef, register, zero_mac_cost


def _widths(rank: int, a) -> list[tuple[int, int]]:
    before, after = tuple(a["before"]), tuple(a["after"])
    if len(before) != rank or len(after) != rank:
        raise ValueError(f"pad: before {before} and after {after} need one width per dim of a rank-{rank} tensor")
    if any(w < 0 for w in before + after):
        raise ValueError(f"pad: widths must be >= 0, got before {before}, after {after}")
    return list(zip(before, after))


def _pad_infer(ts, a):
    x = ts[0]
    if x.dtype not in ("float32", "float64"):
        raise ValueError(f"pad: float operands only, got {x}")
    return [x.with_shape([d + b + e for d, (b, e) in zip(x.shape, _widths(x.rank, a))])]


def _pad_ref(xs, a):
    x = xs[0]
    out = np.pad(x, _widths(x.ndim, a), mode="constant", constant_values=float(a["value"]))
    return [np.asarray(out, dtype=x.dtype)]


def _vjp_pad(e, node, grads, needs):
    g = grads[0]
    for dim, (b, size) in enumerate(zip(node.attrs["before"], node.inputs[0].shape)):
        if g.shape[dim] != size:
            g = e.emit("slice", g, dim=dim, start=b, end=b + size, step=1)
    return [g]


register(OpDef("pad", _pad_infer, _pad_ref, _vjp_pad, cost=zero_mac_cost, num_inputs=(1, 1)))
