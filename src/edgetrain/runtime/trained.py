"""The tensors a program trains, with what their stored numbers mean, out and back in.

Federated averaging (edgetrain.federated) and anything else that moves a program's update
between copies of it needs, per trained tensor, only the part the scheme trains (a sparse
scheme may train some channels of a weight), its storage dtype, and for an int8 program the
map from stored integers to real values:

    real = (q - zero) * scale

Weights are symmetric int8 per output channel (zero 0, scale w_scale[c]); biases are int32
on the accumulator's scale (zero 0, scale x_scale * w_scale[c]); float tensors are their own
real values (scale None). `range` is where an integer update keeps the value (the program's
own integer SGD clamps to it: passes/updates.py's INT_RANGES), so a value written back
stays one the program could have reached by training.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

import numpy as np

from ..passes.updates import INT_RANGES
from .compiled import CompiledProgram


@dataclass(frozen=True)
class TrainedTensor:
    """The trained part of one state tensor (`values`, a copy at its storage dtype)."""

    name: str
    values: np.ndarray
    #: the positions trained along `dim` (sorted), or None: the whole tensor
    index: Optional[tuple[int, ...]] = None
    dim: int = 0
    #: real = (values - zero) * scale; `scale` broadcasts against `values` (per output
    #: channel, already restricted to the trained channels); None: a float tensor
    scale: Optional[np.ndarray] = None
    zero: int = 0
    #: (lo, hi) of an integer tensor's values (the integer update's clamp); None for floats
    range: Optional[tuple[int, int]] = None

    @property
    def nbytes(self) -> int:
        """Bytes of the trained part at its storage dtype (what sending it costs)."""
        return int(self.values.nbytes)

    def real(self) -> np.ndarray:
        """The real values (float64)."""
        v = self.values.astype(np.float64)
        return v if self.scale is None else (v - self.zero) * self.scale

    def selection(self, ndim: int) -> tuple:
        """The index of the trained part in the whole tensor."""
        if self.index is None:
            return (slice(None),) * ndim
        return (slice(None),) * self.dim + (np.asarray(self.index, dtype=np.intp),)


def _real_scales(compiled: CompiledProgram) -> dict[str, np.ndarray]:
    """Per-output-channel scale of every integer parameter of an int8 program."""
    out = {}
    for layer in compiled.quant_layers.values():
        s_w = np.asarray(layer.w_scales, dtype=np.float64)
        out[layer.weight] = np.asarray(layer.row_scales, dtype=np.float64)  # per row of the weight's layout
        out[layer.bias] = np.float64(layer.x.scale) * s_w
    return out


def trained_tensors(compiled: CompiledProgram, state: Mapping[str, np.ndarray]) -> dict[str, TrainedTensor]:
    """{name: TrainedTensor} of every tensor `compiled` trains, in its trained order, read
    from `state` (a runner's)."""
    scales = _real_scales(compiled)
    out = {}
    for name, sel in compiled.trainable.items():
        full = np.asarray(state[name])
        index, dim = (tuple(int(i) for i in sel.index), int(sel.dim)) if sel is not None else (None, 0)
        part = TrainedTensor(name, full, index, dim)
        values = np.array(full[part.selection(full.ndim)], copy=True)
        scale = rng = None
        if str(full.dtype) in INT_RANGES:
            if name not in scales:
                raise ValueError(f"integer tensor {name!r} belongs to no quantized layer of the program")
            s = scales[name]
            if index is not None and dim == 0:
                s = s[np.asarray(index)]
            scale = s.reshape((-1,) + (1,) * (full.ndim - 1))
            rng = INT_RANGES[str(full.dtype)]
        out[name] = TrainedTensor(name, values, index, dim, scale, 0, rng)
    return out


def with_trained(compiled: CompiledProgram, state: Mapping[str, np.ndarray],
                 values: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """{name: new whole tensor} of `state`'s tensors with their trained parts replaced by
    `values` (each the trained part's shape and dtype, as `trained_tensors` gives them);
    ValueError naming the first that does not fit."""
    out = {}
    for name, v in values.items():
        if name not in compiled.trainable:
            raise ValueError(f"{name!r} is not a tensor this program trains "
                             f"(it trains {', '.join(list(compiled.trainable)[:6])}...)")
        full = np.asarray(state[name])
        sel = compiled.trainable[name]
        part = TrainedTensor(name, full, tuple(sel.index) if sel is not None else None,
                             int(sel.dim) if sel is not None else 0)
        idx = part.selection(full.ndim)
        want = full[idx].shape
        v = np.asarray(v)
        if v.shape != want or v.dtype != full.dtype:
            raise ValueError(f"trained tensor {name!r}: got {v.dtype}{tuple(v.shape)}, the program trains "
                             f"{full.dtype}{tuple(want)}")
        new = np.array(full, copy=True)
        new[idx] = v
        out[name] = new
    return out
