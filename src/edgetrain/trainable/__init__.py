"""What a training step trains: the layers of a captured graph (layers.py) and the update
schemes that name them, resolved to the trainable selection {parameter: None (whole) |
ChannelSelect} (schemes.py). Below the pipeline, which resolves a scheme on its front; the
search for a sparse scheme and contribution analysis (sparse/) run the pipeline and sit above.
edgetrain.sparse re-exports these names."""
from .layers import Layer, find_layers
from .lora import LoRA, LoRAError, add_adapters
from .schemes import (BiasOnly, Full, LastK, SchemeError, Sparse, UpdateScheme, describe_selection, resolve_scheme,
                      trainable_layers)

__all__ = ["BiasOnly", "Full", "LastK", "Layer", "LoRA", "LoRAError", "SchemeError", "Sparse", "UpdateScheme", "describe_selection",
           "add_adapters", "find_layers", "resolve_scheme", "trainable_layers"]
