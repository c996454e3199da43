"""Split off the input transform of an int8 graph: the float prefix that turns the data
inputs into int8 (e.g. `quantize((x - 128) * s)`) runs once per element as the sample is
read in, so the training program proper takes the int8 tensor as its input and never
holds the float image (4x its size) in RAM: a microcontroller's camera gives uint8
pixels, and its training program starts from int8.

`split_input_transform(g, data_inputs)` returns (transform, rest) where `transform` maps
the data inputs to the int8 values (named `<input>:int8`, or `<input>:int8:<k>` when one
input is quantized more than once) and `rest` is `g` taking those as inputs; None when
there is nothing to split or the float data is also used after its quantization.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional

from ..ir import Graph, Node, Role, Value
from ..ir.graph import new_value

#: suffix of the int8 graph input that replaces a quantized data input
INT8_SUFFIX = ":int8"


@dataclass(frozen=True)
class InputSplit:
    transform: Graph  # data inputs -> int8 inputs of `rest` (output names = their input names)
    rest: Graph


def split_input_transform(g: Graph, data_inputs: Iterable[str]) -> Optional[InputSplit]:
    data = [g.input(name) for name in data_inputs]
    pure: set[Value] = set(data)  # computed from the data inputs and constants alone
    pure_nodes: list[Node] = []
    for n in g.nodes:
        if all(v in pure for v in n.inputs):
            pure_nodes.append(n)
            pure.update(n.outputs)
    boundary = [n.out for n in pure_nodes if n.op == "quantize" and n.out.dtype == "int8"]
    if not boundary:
        return None
    producer = {o: n for n in pure_nodes for o in n.outputs}
    prefix: set[Node] = set()
    stack = [producer[v] for v in boundary]
    while stack:
        n = stack.pop()
        if n not in prefix:
            prefix.add(n)
            stack += [producer[v] for v in n.inputs if v in producer]
    inside = {o for n in pure_nodes if n in prefix for o in n.outputs} | set(data)
    keep = set(boundary)
    for n in g.nodes:
        if n not in prefix and any(v in inside and v not in keep for v in n.inputs):
            return None  # the float data (or a float step of its transform) is needed later
    if any(v in inside and v not in keep for v in g.outputs):
        return None
    names, count = {}, {}
    for v in boundary:  # name each int8 input after the data input it comes from
        src = next(d for d in data if _depends_on(v, d, producer))
        k = count[src.name] = count.get(src.name, -1) + 1
        names[v] = src.name + INT8_SUFFIX + (f":{k}" if k else "")
    new = {v: new_value(v.type, names[v]) for v in boundary}
    transform = Graph(inputs=tuple(data), nodes=tuple(n for n in g.nodes if n in prefix),
                      outputs=tuple(boundary), output_names=tuple(names[v] for v in boundary),
                      roles=tuple(g.role(v) for v in data))
    rest_nodes = tuple(n if not any(v in new for v in n.inputs) else
                       Node(n.op, tuple(new.get(v, v) for v in n.inputs), n.outputs, n.attrs)
                       for n in g.nodes if n not in prefix)
    others = tuple(v for v in g.inputs if v not in set(data))
    rest = g.replace(inputs=tuple(new[v] for v in boundary) + others,
                     roles=(Role.DATA,) * len(boundary) + tuple(g.role(v) for v in others),
                     nodes=rest_nodes, outputs=tuple(new.get(v, v) for v in g.outputs))
    return InputSplit(transform, rest)


def _depends_on(v: Value, source: Value, producer: dict) -> bool:
    stack, seen = [v], set()
    while stack:
        u = stack.pop()
        if u == source:
            return True
        if u in producer and u not in seen:
            seen.add(u)
            stack += list(producer[u].inputs)
    return False
