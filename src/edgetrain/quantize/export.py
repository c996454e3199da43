"""Trained int8 parameters back to float tensors the original PyTorch model loads."""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from ..passes.fold import FoldedNorm
from .convert import QuantLayer


def dequantized_state(base: Mapping[str, np.ndarray], state: Mapping[str, np.ndarray],
                      layers: Mapping[str, QuantLayer], folds: Sequence[FoldedNorm]) -> dict[str, np.ndarray]:
    """The model's float tensors (`base`: as captured) with every quantized layer replaced
    by its current real values (w_scale * w, x_scale * w_scale * b). A batch norm folded
    into its convolution becomes the identity carrying the folded bias, so the original
    module computes what the folded int8 layer does."""
    out = {k: np.array(v, copy=True) for k, v in base.items()}
    real: dict[str, np.ndarray] = {}
    for layer in layers.values():
        w = state[layer.weight]
        s_w = np.asarray(layer.w_scales, dtype=np.float32)
        rows = np.asarray(layer.row_scales, dtype=np.float32)  # the weight's scale per row of its layout
        real[layer.weight] = (w.astype(np.float32) * rows.reshape((-1,) + (1,) * (w.ndim - 1)))
        real[layer.bias] = state[layer.bias].astype(np.float64) * layer.x.scale * s_w.astype(np.float64)
    for f in folds:
        if f.weight not in real:
            continue
        bias = real.pop(f.bias)
        out[f.mean] = np.zeros_like(base[f.mean])
        out[f.var] = np.full_like(base[f.var], 1.0 - f.eps)
        if f.norm_weight:
            out[f.norm_weight] = np.ones_like(base[f.norm_weight])
        if f.conv_bias:  # the conv keeps the bias; the norm adds nothing
            real[f.conv_bias] = bias
            if f.norm_bias:
                out[f.norm_bias] = np.zeros_like(base[f.norm_bias])
        elif f.norm_bias:
            out[f.norm_bias] = bias.astype(base[f.norm_bias].dtype)
        else:  # an affine-free norm cannot carry a bias: shift the running mean instead
            out[f.mean] = (-bias).astype(base[f.mean].dtype)
    for name, v in real.items():
        if name in out:
            out[name] = v.astype(out[name].dtype).reshape(out[name].shape)
    return out
