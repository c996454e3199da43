"""Ops reading weights stored quantized (frozen="int8" / "int4"), dequantized on the fly.

The storage layout (docs/lora.md states it for users):
- int8: `wq` int8 (out, in), `scale` float32 (out,): w[o, i] = wq[o, i] * scale[o]; scale =
  max|w[o]| / 127 (1 for an all-zero row), wq = clamp(round_half_even(w / scale), -127, 127).
- int4: groups of GROUP (32) along the input dim, `scale` float32 (out, ceil(in / 32)): scale =
  max|w[o, group]| / 7 (1 for an all-zero group), q = clamp(round_half_even(w / scale), -8, 7);
  packed two to a byte, `wq` int8 (out, ceil(in / 2)): element i in byte i // 2, its low
  nibble for even i, high nibble for odd i, each a 4-bit two's complement number.
An embedding table (vocab, dim) is stored as a linear weight with out = vocab, in = dim.
(The OpDefs are filled in by issue 32.)
"""
from __future__ import annotations

from typing import Optional

import numpy as np

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
