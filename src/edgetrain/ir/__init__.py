"""The IR: values, nodes, graphs. Imports nothing else from edgetrain."""
from .graph import Graph, Node, new_value, values_of
from .types import DTYPE_BYTES, FLOAT_DTYPES, TensorType, Value

__all__ = ["DTYPE_BYTES", "FLOAT_DTYPES", "Graph", "Node", "TensorType", "Value", "new_value", "values_of"]
