"""Core-aten -> IR converters of group and instance normalisation (they register into converters.CONVERTERS)."""
