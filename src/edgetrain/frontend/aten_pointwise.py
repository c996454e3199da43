"""Core-aten -> IR converters of the activations of ops/pointwise.py and of where, cumsum and index_put (they register into converters.CONVERTERS)."""
