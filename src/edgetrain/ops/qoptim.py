"""The in-place SGD update of an integer parameter (int8 weight or int32 bias).

``qsgd_update(w, g, step[, m]) -> (w'[, m'])``, all float arithmetic in float32:
d = scale[c] * g + weight_decay * w;  m' = momentum * m + d;  v = w - lr * m';
w' = clamp(floor(v + u), qmin, qmax)   with u ~ U[0, 1) per element.

`scale` is the per-output-channel gradient factor (QAS: w_scale^-2 for weights,
(w_scale * x_scale)^-2 for biases; 1 without QAS). Rounding is stochastic, so an update
smaller than one integer step still moves the weight with the right probability
(E[w'] = v inside the range) instead of being lost. u comes from a counter-based hash of
(seed, param_id, step, element index): no generator state, the same numbers on any device.
With ``index`` set, only the positions along ``dim`` are updated (g, m have that shape).
"""
from __future__ import annotations

import numpy as np

from .base import UPDATE_TAG, Cost, OpDef, register

#: murmur3's 32-bit finaliser constants and golden-ratio style odd multipliers for the key
_GOLDEN, _STEP_MUL, _PARAM_MUL = 0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D
_FMIX1, _FMIX2 = 0x85EBCA6B, 0xC2B2AE35
#: u takes the top 24 bits of the hash: exactly representable in float32
UNIFORM_BITS = 24


def hash_bits(seed: int, param_id: int, step: int, index: np.ndarray) -> np.ndarray:
    """The counter hash's uint32 of each element index (uint32 arithmetic, wrapping, as in C's
    et_hash32)."""
    u32 = np.uint32
    key = u32((seed + step * _STEP_MUL + param_id * _PARAM_MUL) & 0xFFFFFFFF)
    h = np.asarray(index, dtype=np.uint32) * u32(_GOLDEN) + key
    h ^= h >> u32(16)
    h *= u32(_FMIX1)
    h ^= h >> u32(13)
    h *= u32(_FMIX2)
    h ^= h >> u32(16)
    return h


def uniform_hash(seed: int, param_id: int, step: int, index: np.ndarray) -> np.ndarray:
    """float32 numbers in [0, 1): the hash's top UNIFORM_BITS bits."""
    h = hash_bits(seed, param_id, step, index)
    return (h >> np.uint32(32 - UNIFORM_BITS)).astype(np.float32) * np.float32(2.0 ** -UNIFORM_BITS)


def _selection(shape, a):
    if a.get("index") is None:
        return (slice(None),) * len(shape)
    return (slice(None),) * a["dim"] + (np.asarray(a["index"], dtype=np.int64),)


def _infer(ts, a):
    w, g, step = ts[:3]
    want = list(w.shape)
    if a.get("index") is not None:
        want[a["dim"]] = len(a["index"])
    if w.dtype not in ("int8", "int32") or g.dtype != "float32" or g.shape != tuple(want):
        raise ValueError(f"qsgd_update: gradient {g} does not match integer weight {w} (selected shape {want})")
    if step.shape != () or step.dtype != "int32":
        raise ValueError(f"qsgd_update: step must be an int32 scalar, got {step}")
    if any(t.shape != g.shape or t.dtype != "float32" for t in ts[3:]):
        raise ValueError(f"qsgd_update: momentum buffer {ts[3:]} does not match gradient {g}")
    if len(a["scale"]) != w.shape[0]:
        raise ValueError(f"qsgd_update: {len(a['scale'])} gradient scales for {w.shape[0]} output channels")
    return [w] + list(ts[3:])


def row_scales(a, rows=None) -> np.ndarray:
    """Per-row gradient factors: of the selected rows when the update selects dim 0."""
    scale = np.asarray(a["scale"], dtype=np.float32)
    if a.get("index") is not None and a["dim"] == 0:
        scale = scale[np.asarray(a["index"])]
    return scale if rows is None else scale[rows]


def _apply(wsel, g, m, u, scale, a):
    """(new integer values, new momentum) of the elements `wsel` (as float32)."""
    d = g * scale.reshape((-1,) + (1,) * (g.ndim - 1))
    if a["weight_decay"]:
        d = d + np.float32(a["weight_decay"]) * wsel
    if m is not None:
        d = np.float32(a["momentum"]) * m + d
    v = wsel - np.float32(a["lr"]) * d
    return np.clip(np.floor(v + u), a["qmin"], a["qmax"]), d.astype(np.float32)


def qsgd_ref(xs, a):
    w, g, step = xs[:3]
    sel = _selection(w.shape, a)
    flat_index = np.arange(w.size, dtype=np.int64).reshape(w.shape)[sel]
    u = uniform_hash(a["seed"], a["param_id"], int(step), flat_index)
    values, d = _apply(w[sel].astype(np.float32), g, xs[3] if len(xs) > 3 else None, u, row_scales(a), a)
    w_new = w.copy()
    w_new[sel] = values.astype(w.dtype)
    return [w_new] + ([d] if len(xs) > 3 else [])


register(OpDef("qsgd_update", _infer, qsgd_ref,
               cost=lambda n: Cost(4 * n.inputs[1].type.numel, 3 * n.inputs[1].type.nbytes),
               shares=((0, 0), (1, 3)), mutates=True, num_inputs=(3, 4), tags={UPDATE_TAG}, gradient_operand=1))
