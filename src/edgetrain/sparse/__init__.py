"""Update schemes: which parameters (and which of their channels) training updates."""
from .layers import Layer, find_layers
from .schemes import BiasOnly, Full, LastK, Sparse, UpdateScheme, resolve_scheme

__all__ = ["BiasOnly", "Full", "LastK", "Layer", "Sparse", "UpdateScheme", "find_layers", "resolve_scheme"]
