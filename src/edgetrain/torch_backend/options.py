"""The options of torch.compile(model, backend="edgetrain", options={...})."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Union

import numpy as np
import torch

from ..config import Budget
from ..sparse import BiasOnly, Full, LastK, Sparse, UpdateScheme

OPTION_KEYS = ("update", "quantize", "budget", "calibration", "specs", "backend")
#: what runs a float graph: the numpy reference runtime, or its nodes as C (backends/c/graph_lib.py)
RUNNERS = ("reference", "c")


@dataclass(frozen=True)
class Named:
    """Train exactly the parameters with these names (as in model.named_parameters()).
    Schemes are resolved per graph that TorchDynamo hands over, so LastK and Sparse count
    the layers of each graph; names mean the same in every graph of a model that graph
    breaks split."""

    names: frozenset


@dataclass(frozen=True)
class BackendOptions:
    update: Union[UpdateScheme, Named] = Full()
    budget: Optional[Budget] = None
    quantize: Optional[str] = None  # None (float32) or "int8" (int8.py)
    calibration: Optional[tuple] = None  # int8: batches (tuples of arrays) whose ranges set the scales
    specs: Optional[Mapping] = None  # int8: published parameters, weight name -> quantize.LayerSpec
    backend: str = "reference"  # float graphs: "reference" (numpy) or "c" (generated C, float32)


def parse_update(value: Any) -> Union[UpdateScheme, Named]:
    """An update scheme, its text ('full', 'bias', 'last:K'), or parameter names."""
    if isinstance(value, (Full, BiasOnly, LastK, Sparse, Named)):
        return value
    if isinstance(value, (list, tuple, set, frozenset)) and value and all(isinstance(n, str) for n in value):
        return Named(frozenset(value))
    if isinstance(value, str):
        t = value.strip().lower()
        if t == "full":
            return Full()
        if t in ("bias", "bias-only", "biasonly", "bias_only"):
            return BiasOnly()
        m = re.fullmatch(r"last[:_-]?(\d+)", t)
        if m:
            return LastK(int(m.group(1)))
    raise ValueError(f"options['update']={value!r}: use edgetrain.Full(), BiasOnly(), LastK(k), Sparse(...) "
                     f"one of 'full', 'bias', 'last:K', or a list of parameter names")


def parse_budget(value: Any) -> Optional[Budget]:
    """A Budget, a dict of its fields, or an SRAM size ('256KB' or a byte count)."""
    if value is None or isinstance(value, Budget):
        return value
    if isinstance(value, Mapping):
        unknown = set(value) - {"sram", "flash"}
        if unknown:
            raise ValueError(f"options['budget']: unknown keys {sorted(unknown)}; use 'sram' and 'flash'")
        return Budget(**value)
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        return Budget(sram=value)
    raise ValueError(f"options['budget']={value!r}: pass edgetrain.Budget(sram=..., flash=...), a dict of "
                     f"those, or an SRAM size such as '256KB'")


def parse_calibration(value: Any) -> Optional[tuple]:
    """Calibration batches: a tensor or array, a tuple of them (one per model input), or a
    list of either."""
    if value is None:
        return None

    def arrays(batch):
        parts = batch if isinstance(batch, tuple) else (batch,)
        out = []
        for p in parts:
            if isinstance(p, torch.Tensor):
                p = p.detach().cpu().numpy()
            if not isinstance(p, np.ndarray):
                raise ValueError(f"options['calibration']: a batch holds a {type(p).__name__}; use tensors "
                                 f"or arrays (a tuple of them for a model with several inputs)")
            out.append(p)
        return tuple(out)

    batches = value if isinstance(value, list) else [value]
    if not batches:
        raise ValueError("options['calibration'] is empty; give at least one batch, or leave it out to "
                         "calibrate on the first call's inputs")
    return tuple(arrays(b) for b in batches)


def parse_specs(value: Any) -> Optional[dict]:
    """Published int8 parameters: a module carrying them (`models.from_tiny_training`) or
    their dict (weight name -> quantize.LayerSpec)."""
    from ..quantize import SPEC_ATTR, LayerSpec

    if value is None:
        return None
    if isinstance(value, torch.nn.Module):
        if not hasattr(value, SPEC_ATTR):
            raise ValueError("options['specs']: this module carries no published int8 parameters "
                             "(edgetrain.models.from_tiny_training makes one that does)")
        value = getattr(value, SPEC_ATTR)
    if not isinstance(value, Mapping) or not all(isinstance(v, LayerSpec) for v in value.values()):
        raise ValueError("options['specs']: pass the pre-quantized module or its dict of weight name -> "
                         "edgetrain.quantize.LayerSpec")
    return dict(value)


def parse_options(options: Optional[Mapping[str, Any]]) -> BackendOptions:
    options = dict(options or {})
    unknown = sorted(set(options) - set(OPTION_KEYS))
    if unknown:
        raise ValueError(f"torch.compile(backend='edgetrain'): unknown options {unknown}; known: {list(OPTION_KEYS)}")
    quantize = options.get("quantize")
    if quantize not in (None, "int8"):
        raise ValueError(f"options['quantize']={quantize!r}: use None (float32) or 'int8'")
    for key in ("calibration", "specs"):
        if quantize is None and options.get(key) is not None:
            raise ValueError(f"options['{key}'] sets int8 scales; it needs options['quantize']='int8'")
    backend = options.get("backend", "reference")
    if backend not in RUNNERS:
        raise ValueError(f"options['backend']={backend!r}: use one of {RUNNERS}")
    if backend == "c" and quantize is not None:
        raise ValueError("options['backend']='c' runs float graphs; quantize='int8' graphs run on the reference "
                         "runtime (et.compile(..., quantize='int8', backend='c') builds the int8 program as C)")
    return BackendOptions(update=parse_update(options.get("update", Full())), backend=backend,
                          budget=parse_budget(options.get("budget")), quantize=quantize,
                          calibration=parse_calibration(options.get("calibration")),
                          specs=parse_specs(options.get("specs")))
