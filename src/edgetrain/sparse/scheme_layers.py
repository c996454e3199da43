"""The layers and parameter arrays an update scheme is resolved on, as compile() sees them,
without building the training graph: what contribution analysis and the budgeted search
need to train exactly the channels the compiled program trains.

For quantize="int8", compile() resolves schemes on the float graph with batch norm folded
(the weights the device quantizes): channel norms come from the folded weights. For
float32 it resolves them on the captured graph (a convolution's bias is its batch norm's
scale and shift). `tests/sparse/test_scheme_layers.py` checks both against compile().
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

import numpy as np
import torch

from .. import pipeline
from ..autodiff import ChannelSelect
from ..trainable import Layer, SchemeError, UpdateScheme, find_layers, resolve_scheme, trainable_layers

QUANTIZE = (None, "int8")


@dataclass(frozen=True)
class SchemeLayers:
    layers: tuple[Layer, ...]  # every layer in forward order (find_layers)
    arrays: Mapping[str, np.ndarray]  # the parameters schemes are resolved on (folded for int8)
    frozen: frozenset  # parameters with requires_grad=False
    folded: bool  # batch norm was folded into some convolution (int8 only)

    @property
    def dense(self) -> tuple[Layer, ...]:
        """The conv and linear layers with a trainable parameter: `Sparse` numbers all but the
        last (the classifier)."""
        return tuple(layer for layer in trainable_layers(list(self.layers), self.frozen)
                     if layer.kind in ("conv", "linear"))

    @property
    def n_sparse_layers(self) -> int:
        """How many layers `Sparse` can name (0..n-1): the dense ones but the classifier."""
        return max(0, len(self.dense) - 1)

    def resolve(self, scheme: UpdateScheme) -> dict[str, Optional[ChannelSelect]]:
        """{parameter: None (whole) | ChannelSelect}: what compile() trains for `scheme`."""
        return resolve_scheme(scheme, list(self.layers), self.arrays, set(self.frozen))


def scheme_layers(model: torch.nn.Module, example_inputs: tuple, quantize: Optional[str] = "int8") -> SchemeLayers:
    """Capture `model` and return what compile(model, example_inputs, quantize=...) resolves
    update schemes on: the pipeline's front steps up to that graph (pipeline.LAYER_STEPS),
    without calibrating or quantizing."""
    if quantize not in QUANTIZE:
        raise SchemeError(f"quantize={quantize!r}: use None (float32) or 'int8'")
    b = pipeline.layer_front(model, tuple(example_inputs), pipeline.Options(quantize=quantize))
    params = dict(b.params)
    if quantize == "int8":
        used = {v.name for v in b.layer_graph.inputs}
        params = {k: v for k, v in b.layer_arrays.items() if k in used and k not in b.cap.buffers}
    return SchemeLayers(tuple(find_layers(b.layer_graph, set(params))), params, frozenset(b.cap.frozen_params),
                        bool(b.folds))
