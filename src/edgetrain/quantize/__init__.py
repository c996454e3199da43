"""int8 training: calibration, the int8 graph, QAS, and the way back to float weights."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np

from ..ir import Graph, Value
from ..passes.fold import FoldedNorm, fold_batchnorm
from .calibrate import CalibrationError, observe_ranges
from .convert import LayerSpec, QuantizeError, QuantLayer, assign_qparams, plan_quantization, quantize_graph
from .export import dequantized_state
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


def quantize_int8(g: Graph, arrays: Mapping[str, np.ndarray], specs: Mapping[str, LayerSpec],
                  calibration: Iterable[Sequence[np.ndarray]]) -> Quantized:
    """Fold batch norm, choose every int8 tensor's scale (published `specs` first, then
    calibration ranges over `calibration` batches), and build the int8 graph."""
    folded, farrays, folds = fold_batchnorm(g, arrays)
    plan = plan_quantization(folded, set(farrays))
    batches = list(calibration)

    def calibrate(values):
        return observe_ranges(folded, farrays, batches, values)

    qp = assign_qparams(folded, plan, specs, calibrate)
    graph, qarrays, layers = quantize_graph(folded, farrays, plan, qp, specs)
    return Quantized(folded, farrays, graph, qarrays, layers, tuple(folds), qp)


def qas_scales(layers: Mapping[str, QuantLayer], enabled: bool) -> dict[str, tuple[float, ...]]:
    """Per-output-channel gradient factors of the int parameters: w_scale^-2 for weights,
    (w_scale * x_scale)^-2 for biases (Quantization-Aware Scaling), or ones."""
    out = {}
    for layer in layers.values():
        s_w = np.asarray(layer.w_scales, dtype=np.float64)
        if enabled:
            out[layer.weight] = tuple(float(v) for v in s_w ** -2)
            out[layer.bias] = tuple(float(v) for v in (s_w * layer.x.scale) ** -2)
        else:
            out[layer.weight] = out[layer.bias] = (1.0,) * len(s_w)
    return out


__all__ = ["CalibrationError", "LayerSpec", "QParams", "QuantLayer", "QuantizeError", "Quantized", "SPEC_ATTR",
           "dequantized_state", "qas_scales", "quantize_bias", "quantize_int8", "quantize_weight"]
