"""int8 training: calibration, the int8 graph, QAS, and the way back to float weights."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Optional, Sequence

import numpy as np

from ..ir import Graph, Value
from ..passes.fold import FoldedNorm, fold_batchnorm
from .calibrate import CalibrationError, observe_ranges
from .convert import LayerSpec, QuantizeError, QuantLayer, assign_qparams, plan_quantization, quantize_graph
from .export import dequantized_state
from .frozen import FROZEN, dequantized, quantize_frozen
from .qparams import QParams, quantize_bias, quantize_weight

#: the attribute of an nn.Module that carries published int8 parameters (a dict weight
#: name -> LayerSpec), set by edgetrain.models.from_tiny_training
SPEC_ATTR = "edgetrain_int8_spec"


@dataclass(frozen=True)
class Quantized:
    folded: Graph  # the float graph with batch norm folded (update schemes are resolved on it)
    folded_arrays: dict[str, np.ndarray]
    graph: Graph  # the int8 forward graph
    arrays: dict[str, np.ndarray]  # its parameters and buffers
    layers: dict[str, QuantLayer]  # by weight name
    folds: tuple[FoldedNorm, ...]
    qparams: dict[Value, QParams]  # of the folded graph's int8 values
    ranges: dict[Value, tuple[float, float]]  # the real ranges they were chosen for (not published ones)


#: ranges(folded graph, values) -> {value: (lo, hi)}: where the calibrated values' ranges come from
Ranges = Callable[[Graph, Sequence[Value]], Mapping[Value, tuple[float, float]]]


def quantize_int8(g: Graph, arrays: Mapping[str, np.ndarray], specs: Mapping[str, LayerSpec],
                  calibration: Iterable[Sequence[np.ndarray]], ranges: Optional[Ranges] = None,
                  weight_scales: Optional[Mapping[str, np.ndarray]] = None) -> Quantized:
    """Fold batch norm, choose every int8 tensor's scale (published `specs` first, then
    calibration ranges over `calibration` batches, or the ranges `ranges` gives), and build
    the int8 graph (weights on the scales `weight_scales` names, else on their own range)."""
    folded, farrays, folds = fold_batchnorm(g, arrays)
    return quantize_folded(folded, farrays, folds, specs, calibration, ranges, weight_scales)


def quantize_folded(folded: Graph, farrays: Mapping[str, np.ndarray], folds: Sequence[FoldedNorm],
                    specs: Mapping[str, LayerSpec], calibration: Iterable[Sequence[np.ndarray]],
                    ranges: Optional[Ranges] = None,
                    weight_scales: Optional[Mapping[str, np.ndarray]] = None) -> Quantized:
    """`quantize_int8` of a graph whose batch norms `fold_batchnorm` folded already (`folds`):
    the pipeline stages the folded graph before it quantizes it."""
    plan = plan_quantization(folded, set(farrays))
    batches = list(calibration) if ranges is None else []
    seen: dict[Value, tuple[float, float]] = {}

    def calibrate(values):
        got = observe_ranges(folded, farrays, batches, values) if ranges is None else dict(ranges(folded, values))
        seen.update(got)
        return got

    qp = assign_qparams(folded, plan, specs, calibrate)
    graph, qarrays, layers = quantize_graph(folded, farrays, plan, qp, specs, weight_scales)
    return Quantized(folded, farrays, graph, qarrays, layers, tuple(folds), qp, seen)


def qas_scales(layers: Mapping[str, QuantLayer], enabled: bool) -> dict[str, tuple[float, ...]]:
    """Per-output-channel gradient factors of the int parameters: w_scale^-2 for weights,
    (w_scale * x_scale)^-2 for biases (Quantization-Aware Scaling), or ones."""
    out = {}
    for layer in layers.values():
        s_w = np.asarray(layer.w_scales, dtype=np.float64)
        rows = np.asarray(layer.row_scales, dtype=np.float64)  # the weight's, per row of its layout
        if enabled:
            out[layer.weight] = tuple(float(v) for v in rows ** -2)
            out[layer.bias] = tuple(float(v) for v in (s_w * layer.x.scale) ** -2)
        else:
            out[layer.weight], out[layer.bias] = (1.0,) * len(rows), (1.0,) * len(s_w)
    return out


__all__ = ["CalibrationError", "FROZEN", "LayerSpec", "QParams", "QuantLayer", "QuantizeError", "Quantized",
           "SPEC_ATTR", "dequantized", "dequantized_state", "qas_scales", "quantize_bias", "quantize_folded",
           "quantize_frozen", "quantize_int8", "quantize_weight"]
