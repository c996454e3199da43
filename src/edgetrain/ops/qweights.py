"""Ops reading weights stored quantized (frozen="int8" / "int4"), dequantized on the fly.

The storage layout (docs/lora.md states it for users):
- int8: `wq` int8 (out, in), `scale` float32 (out,): w[o, i] = wq[o, i] * scale[o]; scale =
  max|w[o]| / 127 (1 for an all-zero row), wq = clamp(round_half_even(w / scale), -127, 127).
- int4: groups of GROUP (32) along the input dim, `scale` float32 (out, ceil(in / 32)): scale =
  max|w[o, group]| / 7 (1 for an all-zero group), q = clamp(round_half_even(w / scale), -8, 7);
  packed two to a byte, `wq` int8 (out, ceil(in / 2)): element i in byte i // 2, its low
  nibble for even i, high nibble for odd i, each a 4-bit two's complement number.
An embedding table (vocab, dim) is stored as a linear weight with out = vocab, in = dim.

The ops (attrs `bits` (8 or 4) and `in_features`; W = dequantize(wq, scale) in the float dtype
of the op's result, each element q * scale rounded once to it, as `dequantize` computes):
- linear_qw(x, wq, scale[, bias]): x @ W.T (+ bias), as `linear` on W; its input gradient is
  matmul_qw, its bias gradient a `sum` (a trained bias beside a frozen quantized weight);
  wq and scale are frozen (no gradient).
- matmul_qw(g, wq, scale): g (..., out) @ W -> (..., in): linear_qw's input gradient.
- embedding_qw(ids, wq, scale): rows `ids` of W (a frozen table: no gradient), in attr
  `dtype` (default: the scale's dtype; a float64 program keeps float32 scales).
Neither holds W whole: the reference dequantizes the weight (or the rows read) per call; the
C kernels (backends/c/runtime/et_float_qweights.h) a block of rows at a time.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from ..ir import TensorType
from .base import Cost, OpDef, register
from .embedding import INDEX_DTYPES

#: int4 group size along the input dimension
GROUP = 32
#: bits -> (largest |q|, clamp low, clamp high)
_LEVELS = {8: (127, -127, 127), 4: (7, -8, 7)}


def packed_cols(in_features: int, bits: int) -> int:
    """Bytes per row of the stored weight."""
    return in_features if bits == 8 else (in_features + 1) // 2


def scale_shape(out_features: int, in_features: int, bits: int) -> tuple[int, ...]:
    return (out_features,) if bits == 8 else (out_features, -(-in_features // GROUP))


def quantize_weight(w: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """(wq, scale) of a 2-D float weight (out, in) in the layout above."""
    if bits not in _LEVELS:
        raise ValueError(f"bits must be 8 or 4, got {bits}")
    w = np.asarray(w, dtype=np.float64)
    out, n = w.shape
    top, lo, hi = _LEVELS[bits]
    if bits == 8:
        groups = w.reshape(out, 1, n)
    else:
        pad = -n % GROUP
        groups = np.pad(w, ((0, 0), (0, pad))).reshape(out, -1, GROUP)
    amax = np.abs(groups).max(axis=2)
    scale = np.where(amax > 0, amax / top, 1.0).astype(np.float32)
    q = np.clip(np.round(groups / scale.astype(np.float64)[..., None]), lo, hi).astype(np.int8)  # half to even
    q = q.reshape(out, -1)[:, :n]
    if bits == 8:
        return q, scale.reshape(out)
    return pack_int4(q), scale


def pack_int4(q: np.ndarray) -> np.ndarray:
    """(out, in) int8 values in [-8, 7] -> (out, ceil(in / 2)) bytes, two nibbles each."""
    out, n = q.shape
    u = (np.pad(q, ((0, 0), (0, n % 2))).astype(np.int16) & 0xF).astype(np.uint8)
    return (u[:, 0::2] | (u[:, 1::2] << 4)).view(np.int8)


def unpack_int4(wq: np.ndarray, in_features: int) -> np.ndarray:
    """The (out, in) int8 values of packed `wq`."""
    u = wq.view(np.uint8)
    lo, hi = (u & 0xF).astype(np.int8), (u >> 4).astype(np.int8)
    q = np.stack([lo, hi], axis=-1).reshape(wq.shape[0], -1)[:, :in_features]
    return np.where(q > 7, q - 16, q).astype(np.int8)


def dequantize(wq: np.ndarray, scale: np.ndarray, bits: int, in_features: int,
               rows: Optional[slice] = None, dtype=np.float32) -> np.ndarray:
    """The float weight (rows `rows` of it, default all) the program computes with: each
    q * scale rounded once to `dtype` (float32 products in float32; float64 exact)."""
    rows = rows if rows is not None else slice(None)
    wq, scale = wq[rows], np.asarray(scale[rows], dtype=np.float32)
    if bits == 8:
        return (wq.astype(dtype) * scale.astype(dtype)[:, None]).astype(dtype)
    q = unpack_int4(wq, in_features)
    s = np.repeat(scale.astype(dtype), GROUP, axis=1)[:, :in_features]
    return (q.astype(dtype) * s).astype(dtype)


# --- the ops ----------------------------------------------------------------------------------
FLOAT_DTYPES = ("float32", "float64")


def stored_rows(op: str, wq: TensorType, scale: TensorType, a) -> int:
    """The stored weight's out_features, after checking (wq, scale) against attrs bits / in_features."""
    bits, n = a.get("bits"), a.get("in_features")
    if bits not in _LEVELS or not isinstance(n, int) or n < 1:
        raise ValueError(f"{op}: attrs bits={bits!r} (8 or 4) and in_features={n!r} (a positive int) are required")
    if wq.dtype != "int8" or wq.rank != 2 or wq.shape[1] != packed_cols(n, bits):
        raise ValueError(f"{op}: the stored weight {wq} should be int8 (out, {packed_cols(n, bits)}) for "
                         f"{n} inputs at {bits} bits")
    if scale.dtype not in FLOAT_DTYPES or scale.shape != scale_shape(wq.shape[0], n, bits):
        raise ValueError(f"{op}: the scales {scale} should be float {scale_shape(wq.shape[0], n, bits)}")
    return wq.shape[0]


def _weight(xs, a, dtype) -> np.ndarray:
    return dequantize(xs[1], xs[2], a["bits"], a["in_features"], dtype=np.dtype(dtype))


def _linear_qw_infer(ts, a):
    x, wq, scale = ts[:3]
    out = stored_rows("linear_qw", wq, scale, a)
    if x.dtype not in FLOAT_DTYPES or x.rank < 1 or x.shape[-1] != a["in_features"]:
        raise ValueError(f"linear_qw: input {x} does not match a weight of {a['in_features']} inputs")
    if len(ts) == 4 and (ts[3].shape != (out,) or ts[3].dtype != x.dtype):
        raise ValueError(f"linear_qw: bias {ts[3]} should be {x.dtype} ({out},)")
    return [TensorType(x.shape[:-1] + (out,), x.dtype)]


def _linear_qw_ref(xs, a):
    x = xs[0]
    y = x @ _weight(xs, a, x.dtype).T
    return [(y + xs[3] if len(xs) > 3 else y).astype(x.dtype)]


def _frozen_operands(op: str, needs, operands=(1, 2)):
    if any(i < len(needs) and needs[i] for i in operands):
        raise ValueError(f"{op}: the quantized weight and its scales are frozen; no gradient is computed for them")


def _vjp_linear_qw(e, node, grads, needs):
    (gy,) = grads
    _frozen_operands("linear_qw", needs)
    wq, scale = node.inputs[1:3]
    attrs = {"bits": node.attrs["bits"], "in_features": node.attrs["in_features"]}
    gx = e.emit("matmul_qw", gy, wq, scale, **attrs) if needs[0] else None
    lead = tuple(range(gy.type.rank - 1))
    gb = (e.emit("sum", gy, dims=lead) if lead else gy) if len(needs) > 3 and needs[3] else None
    return [gx, None, None, gb]


def _matmul_qw_infer(ts, a):
    g, wq, scale = ts
    out = stored_rows("matmul_qw", wq, scale, a)
    if g.dtype not in FLOAT_DTYPES or g.rank < 1 or g.shape[-1] != out:
        raise ValueError(f"matmul_qw: gradient {g} does not match a weight of {out} outputs")
    return [TensorType(g.shape[:-1] + (a["in_features"],), g.dtype)]


def _matmul_qw_ref(xs, a):
    g = xs[0]
    return [(g @ _weight(xs, a, g.dtype)).astype(g.dtype)]


def _embedding_qw_dtype(scale: TensorType, a) -> str:
    dt = a.get("dtype", scale.dtype)
    if dt not in FLOAT_DTYPES:
        raise ValueError(f"embedding_qw: dtype {dt!r} is not one of {FLOAT_DTYPES}")
    return dt


def _embedding_qw_infer(ts, a):
    ids, wq, scale = ts
    stored_rows("embedding_qw", wq, scale, a)
    if ids.dtype not in INDEX_DTYPES:
        raise ValueError(f"embedding_qw: indices {ids} must be one of {INDEX_DTYPES}")
    return [TensorType(ids.shape + (a["in_features"],), _embedding_qw_dtype(scale, a))]


def _embedding_qw_ref(xs, a):
    ids, wq, scale = xs
    if ids.size and (ids.min() < 0 or ids.max() >= wq.shape[0]):
        raise IndexError(f"embedding_qw: index out of range [0, {wq.shape[0]})")
    flat = ids.reshape(-1)
    dt = np.dtype(a.get("dtype", scale.dtype))
    rows = dequantize(wq[flat], scale[flat], a["bits"], a["in_features"], dtype=dt)
    return [rows.reshape(ids.shape + (a["in_features"],))]


def _vjp_embedding_qw(e, node, grads, needs):
    _frozen_operands("embedding_qw", needs)
    return [None, None, None]


def _qw_cost(node):
    """A GEMM's multiply-adds plus one per dequantized weight element; every operand read once."""
    wq = node.inputs[1].type
    n_w = wq.shape[0] * node.attrs["in_features"]
    rows = node.inputs[0].type.numel // node.inputs[0].shape[-1] if node.inputs[0].type.rank else 1
    return Cost(rows * n_w + n_w, sum(v.type.nbytes for v in node.inputs + node.outputs))


def _embedding_qw_cost(node):
    out = node.outputs[0].type
    return Cost(out.numel, 2 * out.nbytes + node.inputs[0].type.nbytes)


register(OpDef("linear_qw", _linear_qw_infer, _linear_qw_ref, _vjp_linear_qw, cost=_qw_cost, num_inputs=(3, 4)))
register(OpDef("matmul_qw", _matmul_qw_infer, _matmul_qw_ref, cost=_qw_cost, num_inputs=(3, 3)))
register(OpDef("embedding_qw", _embedding_qw_infer, _embedding_qw_ref, _vjp_embedding_qw, cost=_embedding_qw_cost,
               num_inputs=(3, 3)))
