"""LoRA: low-rank adapters added to the captured graph, the only tensors trained.

`LoRA(rank, alpha, targets, dropout)` is an update scheme. For each linear (and conv) layer
whose module name ends with one of `targets`, `add_adapters` rewrites y = layer(x) into
y = layer(x) + (alpha / rank) * B(A(dropout(x))) in the IR, with A initialised as peft does
(kaiming-uniform, a=sqrt(5)) and B zero; the base weights are frozen whatever their
requires_grad says. (Filled in by the LoRA work of issue 32.)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from ..ir import Graph


class LoRAError(ValueError):
    """A LoRA scheme that cannot apply to this model (no target matched, a bad rank)."""


@dataclass(frozen=True)
class LoRA:
    """Train low-rank adapters on the layers whose module names end with one of `targets`."""

    rank: int = 8
    alpha: float = 16
    targets: tuple = ("q_proj", "v_proj")
    dropout: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "targets", tuple(self.targets) if not isinstance(self.targets, str)
                           else (self.targets,))
        if not isinstance(self.rank, int) or self.rank < 1:
            raise LoRAError(f"LoRA needs rank >= 1, got {self.rank!r}")
        if not self.targets or not all(isinstance(t, str) and t for t in self.targets):
            raise LoRAError(f"LoRA targets must be non-empty module-name suffixes, got {self.targets!r}")
        if not 0.0 <= float(self.dropout) < 1.0:
            raise LoRAError(f"LoRA dropout must lie in [0, 1), got {self.dropout!r}")

    @property
    def scaling(self) -> float:
        return float(self.alpha) / self.rank


def add_adapters(g: Graph, state: Mapping[str, np.ndarray], scheme: LoRA,
                 seed: int = 0) -> tuple[Graph, dict[str, np.ndarray], tuple[str, ...]]:
    """`g` with an adapter on every targeted layer, the state with the adapters' initial
    values added, and the adapters' parameter names (the tensors the scheme trains)."""
    raise NotImplementedError("LoRA adapters: issue 32")
