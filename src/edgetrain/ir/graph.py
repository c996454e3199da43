"""Nodes and graphs. Immutable: passes build new graphs; the node order is the schedule."""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Iterable, Mapping

from .types import TensorType, Value

_ids = itertools.count(1)


def new_value(type: TensorType, name: str = "") -> Value:
    """A fresh value with a process-unique id (ids only need to be unique, not dense)."""
    return Value(next(_ids), type, name)


def _freeze(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    return v


@dataclass(frozen=True, eq=False)
class Node:
    """`outputs = op(*inputs; attrs)`. Nodes compare by identity."""

    op: str
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]
    attrs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "outputs", tuple(self.outputs))
        frozen = {k: _freeze(v) for k, v in dict(self.attrs).items()}
        object.__setattr__(self, "attrs", MappingProxyType(frozen))

    @property
    def out(self) -> Value:
        """The single output (most ops have one)."""
        if len(self.outputs) != 1:
            raise ValueError(f"{self.op} has {len(self.outputs)} outputs")
        return self.outputs[0]


@dataclass(frozen=True)
class Graph:
    """Named inputs, an ordered node list, named outputs."""

    inputs: tuple[Value, ...]
    nodes: tuple[Node, ...]
    outputs: tuple[Value, ...]
    output_names: tuple[str, ...]

    def __post_init__(self):
        for f in ("inputs", "nodes", "outputs", "output_names"):
            object.__setattr__(self, f, tuple(getattr(self, f)))
        if len(self.outputs) != len(self.output_names):
            raise ValueError("outputs and output_names differ in length")

    # --- lookups (derived, never stored) ---------------------------------------------
    def input(self, name: str) -> Value:
        for v in self.inputs:
            if v.name == name:
                return v
        raise KeyError(f"no graph input named {name!r}")

    def output(self, name: str) -> Value:
        return self.outputs[self.output_names.index(name)]

    def producers(self) -> dict[Value, Node]:
        return {o: n for n in self.nodes for o in n.outputs}

    def consumers(self) -> dict[Value, list[Node]]:
        users: dict[Value, list[Node]] = {}
        for n in self.nodes:
            for v in n.inputs:
                users.setdefault(v, []).append(n)
        return users

    def replace(self, **kw) -> "Graph":
        d = dict(inputs=self.inputs, nodes=self.nodes, outputs=self.outputs, output_names=self.output_names)
        d.update(kw)
        return Graph(**d)

    def named_outputs(self) -> dict[str, Value]:
        return dict(zip(self.output_names, self.outputs))

    def __str__(self) -> str:
        from .printer import format_graph

        return format_graph(self)


def values_of(nodes: Iterable[Node]) -> list[Value]:
    return [o for n in nodes for o in n.outputs]
