"""Core-aten -> IR converters of 3-D and adaptive pooling and of upsampling (they register into converters.CONVERTERS)."""
