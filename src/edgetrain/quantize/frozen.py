"""Frozen weights stored below float32: `et.compile(..., frozen="int8" | "int4")`.

(Filled in by the quantized-base work of issue 32.) Every frozen linear / embedding weight is
stored quantized and dequantized on the fly inside the kernels; `dequantized(model, frozen)`
gives the PyTorch model with the values the program computes with.
"""
from __future__ import annotations

from typing import Callable, Mapping, Optional

import numpy as np

from ..ir import Graph

FROZEN = (None, "int8", "int4")


def quantize_frozen(g: Graph, state: Mapping[str, np.ndarray], trainable: Mapping, mode: str
                    ) -> tuple[Graph, dict[str, np.ndarray], Callable]:
    """`g` with every frozen linear / embedding weight read from its quantized form, the
    state holding those forms instead of the float weights, and the export: state -> the
    state under the original names, each quantized weight dequantized."""
    raise NotImplementedError("frozen weights stored quantized: issue 32")


def dequantized(model, frozen: Optional[str]):
    """A copy of `model` whose weights are the values a program compiled with `frozen` computes with."""
    raise NotImplementedError("frozen weights stored quantized: issue 32")
