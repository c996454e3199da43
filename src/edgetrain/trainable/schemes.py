"""Update schemes and their resolution to {parameter: None (whole) | ChannelSelect}."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional, Union

import numpy as np

from ..autodiff import ChannelSelect
from .layers import Layer
from .lora import LoRA


class SchemeError(ValueError):
    pass


@dataclass(frozen=True)
class Full:
    """Train every parameter (that has requires_grad)."""


@dataclass(frozen=True)
class BiasOnly:
    """Train the biases of every layer with a trainable parameter (a conv's bias is its batch
    norm's scale and shift)."""


@dataclass(frozen=True)
class LastK:
    """Train weights and biases of the last k conv/linear layers with a trainable parameter
    (requires_grad; the classifier is one)."""

    k: int

    def __post_init__(self):
        if not isinstance(self.k, int) or self.k < 1:
            raise SchemeError(f"LastK needs k >= 1, got {self.k!r}")


@dataclass(frozen=True)
class Sparse:
    """The paper's sparse update: biases of the last `bias_last` layers, and for each layer
    index in `weights` the given ratio of its input channels (largest L2 norm first; for a
    depthwise convolution, its channels). Layers are the convolutions and linear layers
    with a trainable parameter (requires_grad), numbered from 0 in forward order without
    the classifier (the last of them), which is always trained; in the paper's MCU networks
    these are exactly the convolutions."""

    bias_last: int = 0
    weights: Mapping[int, float] = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "weights", {int(k): float(v) for k, v in dict(self.weights).items()})
        if self.bias_last < 0:
            raise SchemeError(f"bias_last must be >= 0, got {self.bias_last}")
        bad = {k: r for k, r in self.weights.items() if not 0.0 <= r <= 1.0}
        if bad:
            raise SchemeError(f"weight ratios must lie in [0, 1], got {bad}")

    def __hash__(self):
        return hash((self.bias_last, tuple(sorted(self.weights.items()))))


UpdateScheme = Union[Full, BiasOnly, LastK, Sparse, LoRA]


def channels_by_norm(w: np.ndarray, dim: int, ratio: float) -> tuple[int, ...]:
    """The `ratio` share (at least one) of positions along `dim` with the largest L2 norm,
    sorted; ties go to the lower index."""
    n = w.shape[dim]
    k = max(1, int(round(ratio * n)))
    norms = np.sqrt((np.moveaxis(w, dim, 0).reshape(n, -1).astype(np.float64) ** 2).sum(axis=1))
    order = np.argsort(-norms, kind="stable")
    return tuple(sorted(int(i) for i in order[:k]))


def trainable_layers(layers: list[Layer], frozen=frozenset()) -> list[Layer]:
    """The layers with a parameter that is not frozen (requires_grad=True): the ones update
    schemes count and choose from. A layer whose parameters are all frozen (a LoRA model's
    base weights, `features` frozen by hand) is never trained, so it takes no place."""
    return [layer for layer in layers if any(p not in frozen for p in layer.params)]


def resolve_scheme(scheme: UpdateScheme, layers: list[Layer], params: Mapping[str, np.ndarray],
                   frozen: set[str] = frozenset()) -> dict[str, Optional[ChannelSelect]]:
    """The parameters `scheme` trains, in parameter order, never a `frozen` one. BiasOnly,
    LastK and Sparse count only the layers with a trainable parameter (trainable_layers)."""
    chosen: dict[str, Optional[ChannelSelect]] = {}
    live = trainable_layers(layers, frozen)
    if isinstance(scheme, Full):
        chosen = {p: None for p in params}
    elif isinstance(scheme, BiasOnly):
        chosen = {b: None for layer in live for b in layer.bias}
    elif isinstance(scheme, LastK):
        dense = [layer for layer in live if layer.kind in ("conv", "linear")]
        if scheme.k > len(dense):
            raise SchemeError(f"LastK({scheme.k}): the model has only {len(dense)} conv/linear layers"
                              + _frozen_note(layers, live))
        chosen = {p: None for layer in dense[-scheme.k:] for p in layer.params}
    elif isinstance(scheme, Sparse):
        chosen = _resolve_sparse(scheme, live, params, _frozen_note(layers, live))
    else:
        raise SchemeError(f"unknown update scheme {scheme!r}; use Full(), BiasOnly(), LastK(k) or Sparse(...)")
    out = {p: chosen[p] for p in params if p in chosen and p not in frozen}
    if not out:
        raise SchemeError(f"{scheme} trains no parameter of this model" + _frozen_note(layers, live)
                          + (" (no trainable layer has a bias)" if isinstance(scheme, BiasOnly) else ""))
    return out


def _frozen_note(layers: list[Layer], live: list[Layer]) -> str:
    skipped = len(layers) - len(live)
    return f" with a trainable parameter ({skipped} layers with requires_grad=False skipped)" if skipped else ""


def describe_selection(layers: list[Layer], chosen: Mapping[str, Optional[ChannelSelect]]) -> str:
    """Which layers a resolved selection trains, in forward order: one 'kind:weight[ (part)]' each,
    e.g. "linear:fc.weight, conv:features.3.weight (bias only)"."""
    parts = []
    for layer in layers:
        mine = [p for p in layer.params if p in chosen]
        if not mine:
            continue
        partial = chosen.get(layer.weight) is not None
        what = " (bias only)" if layer.weight not in chosen else " (some channels)" if partial else ""
        parts.append(f"{layer.kind}:{layer.weight}{what}")
    return ", ".join(parts) if parts else "no layer"


def _resolve_sparse(scheme: Sparse, layers: list[Layer], params, note: str = "") -> dict[str, Optional[ChannelSelect]]:
    """`layers`: the trainable ones; `note` says how many frozen ones were skipped."""
    dense = [layer for layer in layers if layer.kind in ("conv", "linear")]
    if not dense:
        raise SchemeError("Sparse needs a model with conv or linear layers" + note)
    classifier = dense[-1]
    convs = dense[:-1]
    if scheme.bias_last > len(convs):
        raise SchemeError(f"bias_last={scheme.bias_last} but the model has {len(convs)} conv/linear layers "
                          f"besides the classifier{note}")
    bad = [i for i in scheme.weights if not 0 <= i < len(convs)]
    if bad:
        raise SchemeError(f"layer indices {bad} out of range: the model has {len(convs)} conv/linear layers "
                          f"(numbered 0..{len(convs) - 1}, classifier excluded){note}")
    chosen: dict[str, Optional[ChannelSelect]] = {p: None for p in classifier.params}
    for layer in convs[len(convs) - scheme.bias_last:] if scheme.bias_last else []:
        chosen.update({b: None for b in layer.bias})
    for i, ratio in scheme.weights.items():
        if ratio == 0:
            continue
        layer = convs[i]
        w = params[layer.weight]
        dim = 0 if layer.depthwise else 1
        if ratio >= 1 or w.shape[dim] == 1:
            chosen[layer.weight] = None
        else:
            chosen[layer.weight] = ChannelSelect(dim, channels_by_norm(w, dim, ratio))
    return chosen
