"""int8 headroom: room for the layers an update scheme trains to grow beyond their pretrained range.

An int8 weight lives on its layer's per-channel scale, set so that the pretrained weights span
+-127 steps; an int8 activation on its calibrated range. Fine-tuning that must grow weights or
outputs several-fold (a new class's classifier row, a recurrent model's input projection) clips
there, and a clipped output passes no gradient. `with_headroom` rebuilds the int8 program with
every trained weight's scales H times wider (the pretrained weights then take 127 / H steps and
may grow H-fold before they clip) and every int8 tensor a trained layer makes (its output, and
what qadd / qcat / scale-keeping ops compute from it) on a range H times wider, at the cost of
their precision. Frozen layers, their outputs and the input's scale are untouched; H = 1 is the
program as it was."""
from __future__ import annotations

import math
import numbers
from typing import Mapping, Optional

import numpy as np

from ..ir import Value
from ..ops.fixed_point import INT32_MAX, INT32_MIN
from . import Quantized, quantize_folded
from .convert import LayerSpec, QuantizeError, layer_output, layer_weight, plan_quantization
from .qparams import WEIGHT_QMAX, QParams

#: the widest headroom: at WEIGHT_QMAX a channel's largest pretrained weight keeps one int8 step
MAX_HEADROOM = float(WEIGHT_QMAX)


def check_headroom(h) -> float:
    """`h` as a float when it is a finite number from 1 to MAX_HEADROOM; ValueError otherwise."""
    if isinstance(h, bool) or not isinstance(h, numbers.Real) or not math.isfinite(h) \
            or not 1 <= h <= MAX_HEADROOM:
        raise ValueError(f"int8_headroom must be a number from 1 to {MAX_HEADROOM:g} (how many times wider the "
                         f"trained layers' int8 weight scales and output ranges are; 1: as calibrated), got {h!r}")
    return float(h)


def widened_values(q: Quantized, trained: Mapping[str, object]) -> set[Value]:
    """The int8 values of `q`'s folded graph that carry a trained layer's output: the output of
    each layer whose weight is in `trained`, and every qadd / qcat / scale-keeping result of one."""
    plan = plan_quantization(q.folded, set(q.folded_arrays))
    producers = q.folded.producers()
    out: set[Value] = set()
    for n in q.folded.nodes:
        kind = plan.kinds.get(n)
        if kind == "qconv" and layer_weight(n, producers).name in trained:
            y = layer_output(plan, n)
            if y in plan.int8:
                out.add(y)
        elif kind in ("qadd", "qcat", "same") and any(v in out for v in n.inputs):
            out.add(n.out)
    return out


def with_headroom(q: Quantized, specs: Mapping[str, LayerSpec], trained: Mapping[str, object],
                  headroom: float) -> Quantized:
    """`q` rebuilt with `headroom` for the layers whose weights `trained` names (parameter ->
    None or a channel selection: a partly trained weight widens whole): their weight scales
    (published ones too: `spec_with_headroom`) and the ranges of the int8 values
    `widened_values` finds, `headroom` times wider. Every other scale, range and published
    parameter is kept as it is; headroom 1 returns `q`."""
    h = check_headroom(headroom)
    if h == 1:
        return q
    grown = [name for name in q.layers if name in trained]
    scales = {name: (np.asarray(q.layers[name].w_scales, dtype=np.float64) * h).astype(np.float32)
              for name in grown if name not in specs}
    published = {k: spec_with_headroom(s, h) if k in grown else s for k, s in specs.items()}
    wide = widened_values(q, trained)

    def ranges(graph, values):
        return {v: _wider(q.ranges[v], h) if v in wide else q.ranges[v] for v in values}

    return quantize_folded(q.folded, q.folded_arrays, q.folds, published, (), ranges, scales)


def spec_with_headroom(spec: LayerSpec, h: float) -> LayerSpec:
    """A published layer's parameters on weight scales `h` times wider (its int8 weight and int32
    bias rounded to them) and its published output range, if any, `h` times wider."""
    w = np.clip(np.round(spec.weight.astype(np.float64) / h), -WEIGHT_QMAX, WEIGHT_QMAX).astype(np.int8)
    b = np.clip(np.round(np.asarray(spec.bias, dtype=np.float64) / h), INT32_MIN, INT32_MAX).astype(np.int32)
    y: Optional[QParams] = spec.y
    if y is not None:
        y = QParams.from_range(*_wider(y.real_range, h))
    return LayerSpec(w, (np.asarray(spec.w_scales, dtype=np.float64) * h).astype(np.float32), b, spec.x, y)


def _wider(r: tuple[float, float], h: float) -> tuple[float, float]:
    lo, hi = r
    if not (math.isfinite(lo * h) and math.isfinite(hi * h)):
        raise QuantizeError(f"the range [{lo}, {hi}] widened {h:g} times is not finite")
    return lo * h, hi * h
