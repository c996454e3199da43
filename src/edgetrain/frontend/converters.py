"""The converter table of the frontend: aten op -> a function emitting its IR, the decorators
that fill it, and what every converter module shares (`Known` capture-time tensors, `unsupported`,
torch's dtype names). The converter modules (aten.py, aten_data.py, aten_layers.py) import this
one and register into it; the package's __init__ imports them all, so the table is full once any
part of the frontend is imported. `convert_node` translates one fx node through it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..ir import Value
from ..ops import Emitter
from .errors import UnsupportedOpError

#: torch dtypes -> the IR's dtype names
TORCH_DTYPES = {torch.float32: "float32", torch.float64: "float64", torch.int64: "int64",
                torch.int32: "int32", torch.int8: "int8", torch.bool: "bool"}
aten = torch.ops.aten
CONVERTERS: dict[Any, Callable] = {}
#: converters that read their first input's strides in torch (keyword `layout`)
LAYOUT_AWARE = (aten.as_strided.default, aten.as_strided_copy.default)
#: converters that take inputs known at capture time as torch tensors (constant indices, masks)
#: instead of graph Values; they also accept Values (torch.compile's graphs know none)
CONST_AWARE: dict[Any, Callable] = {}
#: converters that take a `Dynamic` operand (aten_dynamic.py: data-dependent shapes); any other
#: converter meeting one is refused by name
DYNAMIC_AWARE: set = set()


class Dynamic:
    """What an op with a data-dependent shape gives (x[mask], torch.unique_consecutive, their
    sizes): no Value, a stand-in that only aten_dynamic.py's patterns read. `what` says what it is."""

    what = "a data-dependent shape"


def registrar(table: dict) -> Callable:
    """A decorator factory: `@reg(op, ...)` puts the function in `table` under each op."""
    def register(*ops):
        def deco(fn):
            for op in ops:
                table[op] = fn
            return fn

        return deco

    return register


converts = registrar(CONVERTERS)


def const_aware(*ops):
    """Register a converter in CONVERTERS that also takes capture-time constants raw."""
    def deco(fn):
        for op in ops:
            CONVERTERS[op] = CONST_AWARE[op] = fn
        return fn

    return deco


@dataclass(frozen=True, eq=False)
class Known:
    """A tensor known at capture time, as a CONST_AWARE converter receives it: `tensor` to
    read, `value(t)` to put it (or a tensor derived from it) in the graph as a constant."""

    tensor: torch.Tensor
    make: Callable[[torch.Tensor], Value]

    @property
    def shape(self):
        return tuple(self.tensor.shape)

    def value(self, t: torch.Tensor = None) -> Value:
        return self.make(self.tensor if t is None else t)


def convert_node(e: Emitter, node, env: dict, known: dict = None, materialize: Callable = None):
    """Translate one fx node. Inputs computed at capture time (`known`) reach a CONST_AWARE
    converter as `Known` tensors, any other converter as Values (`materialize(name, tensor)`
    makes them)."""
    known = known or {}
    raw = node.target in CONST_AWARE

    def arg(a):
        if isinstance(a, torch.fx.Node):
            k = known.get(a.name)
            if a.name in known and not isinstance(k, torch.Tensor):
                return k  # a Python number (a shape, a scalar) or None
            if a.name in known and raw:
                return Known(k, lambda t, name=a.name: materialize(name, t))
            return env[a.name] if a.name in env else materialize(a.name, k)
        if isinstance(a, (list, tuple)):
            return type(a)(arg(x) for x in a)
        return a

    fn = CONVERTERS.get(node.target)
    if fn is None:
        raise UnsupportedOpError(f"unsupported op {node.target}")
    if node.target not in DYNAMIC_AWARE:
        dyn = _dynamic_operand((node.args, node.kwargs), env)
        if dyn is not None:
            raise UnsupportedOpError(f"unsupported op {node.target} of {dyn.what}, whose shape is known only "
                                     "at run time")
    kwargs = {k: arg(v) for k, v in node.kwargs.items()}
    if node.target in LAYOUT_AWARE:  # the strides torch gave the input (export records them)
        val = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
        if val is not None:
            kwargs["layout"] = (tuple(int(d) for d in val.stride()), int(val.storage_offset()))
    if raw and materialize is not None:  # a constant the converter derives (a causal mask)
        kwargs["constant"] = lambda t: materialize(node.name, t)
    return fn(e, *arg(tuple(node.args)), **kwargs)


def _dynamic_operand(args, env: dict):
    found = []
    torch.fx.node.map_arg(args, lambda a: found.append(env.get(a.name)))
    return next((v for v in found if isinstance(v, Dynamic)), None)


def unsupported(msg: str):
    """Refuse an op the IR cannot express (capture adds the model line)."""
    raise UnsupportedOpError(msg)


def as_pair(v):
    """A 2-d layer's stride / padding / kernel argument as a pair (an int or a 1- or 2-list)."""
    return tuple(v) * (2 // len(v)) if isinstance(v, (list, tuple)) else (int(v), int(v))
