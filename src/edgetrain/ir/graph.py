"""Nodes and graphs. Immutable: passes build new graphs; the node order is the schedule."""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Iterable, Mapping, Optional

from .printer import format_graph
from .roles import Role
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
    """Named inputs, an ordered node list, named outputs.

    `roles[i]` is the role of `inputs[i]` (ir/roles.py: data, label, parameter, ...); left
    out, every input is data, which keeps graphs built by hand in tests short. `owners` pairs
    each optimizer-state input with the parameter input it belongs to. Passes that add an
    input give its role; `replace` keeps the roles of the inputs it keeps."""

    inputs: tuple[Value, ...]
    nodes: tuple[Node, ...]
    outputs: tuple[Value, ...]
    output_names: tuple[str, ...]
    roles: tuple[Role, ...] = ()
    owners: tuple[tuple[Value, Value], ...] = ()  # (optimizer-state input, its parameter input)

    def __post_init__(self):
        for f in ("inputs", "nodes", "outputs", "output_names", "roles", "owners"):
            object.__setattr__(self, f, tuple(getattr(self, f)))
        if len(self.outputs) != len(self.output_names):
            raise ValueError("outputs and output_names differ in length")
        if not self.roles:
            object.__setattr__(self, "roles", (Role.DATA,) * len(self.inputs))
        if len(self.roles) != len(self.inputs):
            raise ValueError(f"{len(self.inputs)} inputs but {len(self.roles)} roles")
        bad = [r for r in self.roles if not isinstance(r, Role)]
        if bad:
            raise TypeError(f"roles must be ir.Role members, got {bad[0]!r}")
        object.__setattr__(self, "owners", tuple((s, p) for s, p in self.owners))

    # --- lookups (derived, never stored) ---------------------------------------------
    def input(self, name: str) -> Value:
        for v in self.inputs:
            if v.name == name:
                return v
        raise KeyError(f"no graph input named {name!r}")

    def role(self, v: Value) -> Role:
        """The role of graph input `v`."""
        for u, r in zip(self.inputs, self.roles):
            if u == v:
                return r
        raise KeyError(f"{v} is not an input of this graph")

    def roles_by_input(self) -> dict[Value, Role]:
        return dict(zip(self.inputs, self.roles))

    def inputs_with(self, *roles: Role) -> tuple[Value, ...]:
        """The inputs whose role is one of `roles`, in input order."""
        return tuple(v for v, r in zip(self.inputs, self.roles) if r in roles)

    def the_input(self, role: Role) -> Optional[Value]:
        """The one input of a role a graph has at most one of (label, step, page store), or None."""
        found = self.inputs_with(role)
        if len(found) > 1:
            raise ValueError(f"the graph has {len(found)} {role.value} inputs")
        return found[0] if found else None

    def owner(self, state: Value) -> Value:
        """The parameter input that optimizer-state input `state` belongs to."""
        for s, p in self.owners:
            if s == state:
                return p
        raise KeyError(f"{state} has no owning parameter")

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
        """This graph with some fields replaced. New `inputs` without `roles` keep each kept
        input's role (an input this graph lacks needs its role given: KeyError); `owners`
        keep the pairs whose two values are still inputs."""
        d: dict[str, Any] = dict(inputs=self.inputs, nodes=self.nodes, outputs=self.outputs,
                                 output_names=self.output_names, roles=self.roles, owners=self.owners)
        d.update(kw)
        if "inputs" in kw and "roles" not in kw:
            known = self.roles_by_input()
            new = [v for v in d["inputs"] if v not in known]
            if new:
                raise KeyError(f"Graph.replace: give the role of the new input {new[0]}")
            d["roles"] = tuple(known[v] for v in d["inputs"])
        if "inputs" in kw and "owners" not in kw:
            kept = set(d["inputs"])
            d["owners"] = tuple((s, p) for s, p in self.owners if s in kept and p in kept)
        return Graph(**d)

    def with_inputs(self, added: Mapping[Value, Role], owners: Iterable[tuple[Value, Value]] = ()) -> "Graph":
        """This graph with inputs `added` (value -> role) appended, and optimizer-state pairs."""
        return self.replace(inputs=self.inputs + tuple(added), roles=self.roles + tuple(added.values()),
                            owners=self.owners + tuple(owners))

    def named_outputs(self) -> dict[str, Value]:
        return dict(zip(self.output_names, self.outputs))

    def __str__(self) -> str:
        return format_graph(self)


def values_of(nodes: Iterable[Node]) -> list[Value]:
    return [o for n in nodes for o in n.outputs]
