"""The IR: values, nodes, graphs, the roles of graph inputs. Imports nothing else from edgetrain."""
from .graph import Graph, Node, new_value, values_of
from .roles import RAM_ROLES, Role, in_ram, ram_inputs, written_state
from .types import DTYPE_BYTES, FLOAT_DTYPES, TensorType, Value

__all__ = ["DTYPE_BYTES", "FLOAT_DTYPES", "RAM_ROLES", "Graph", "Node", "Role", "TensorType", "Value", "in_ram",
           "new_value", "ram_inputs", "values_of",
           "written_state"]
