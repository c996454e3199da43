"""The options of torch.compile(model, backend="edgetrain", options={...})."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Union

from ..config import Budget
from ..sparse import BiasOnly, Full, LastK, Sparse, UpdateScheme

OPTION_KEYS = ("update", "quantize", "budget")
QUANTIZE_MESSAGE = (
    "quantize='int8' is not available through torch.compile: an int8 edgetrain program owns its int8 weights "
    "and applies its own integer SGD update with Quantization-Aware Scaling, which a torch optimizer stepping "
    "float parameters cannot drive. Train int8 with edgetrain.compile(model, (x,), quantize='int8') and "
    "prog.step(x, y); torch.compile(backend='edgetrain') trains float32 (quantize=None).")


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


def parse_options(options: Optional[Mapping[str, Any]]) -> BackendOptions:
    options = dict(options or {})
    unknown = sorted(set(options) - set(OPTION_KEYS))
    if unknown:
        raise ValueError(f"torch.compile(backend='edgetrain'): unknown options {unknown}; known: {list(OPTION_KEYS)}")
    if options.get("quantize") is not None:
        if options["quantize"] == "int8":
            raise ValueError(QUANTIZE_MESSAGE)
        raise ValueError(f"options['quantize']={options['quantize']!r}: use None (float32)")
    return BackendOptions(update=parse_update(options.get("update", Full())),
                          budget=parse_budget(options.get("budget")))
