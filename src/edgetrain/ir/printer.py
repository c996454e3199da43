"""Readable text for graphs: one line per node, like a jaxpr.

Values are numbered per graph, in order of appearance (the graph's inputs, then each node's
outputs): `%0<x>`, `%1`, ... A value's `id` is unique within the process and depends on what
was built before, so it is never printed; the same model prints the same text whatever was
compiled before it. A value printed without its graph (`str(value)`) reads `%?<name> : f32[..]`.
Each input line ends with the input's role (`# parameter`, `# optimizer state of %3`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Optional

if TYPE_CHECKING:
    from .graph import Graph, Node
    from .types import Value

#: attributes longer than this are abbreviated when printing (channel index lists).
MAX_ATTR_CHARS = 40


def _fmt_attr(v) -> str:
    s = repr(v)
    return s if len(s) <= MAX_ATTR_CHARS else s[: MAX_ATTR_CHARS - 3] + "..."


def number_values(g: "Graph") -> dict["Value", int]:
    """Each value of `g` -> its number in the printed text: the inputs, then the nodes' outputs
    in node order. A value read or returned but never defined (a malformed graph, as the
    verifier reports it) is numbered where it first appears, so every value has a number."""
    numbers: dict["Value", int] = {}

    def see(v: "Value") -> None:
        if v not in numbers:
            numbers[v] = len(numbers)

    for v in g.inputs:
        see(v)
    for n in g.nodes:
        for v in n.inputs:
            see(v)
        for v in n.outputs:
            see(v)
    for v in g.outputs:
        see(v)
    return numbers


def format_value(v: "Value", numbers: Optional[Mapping["Value", int]] = None) -> str:
    """`%3<name>` with the value's number in `numbers` (from number_values); without a number,
    `%?<name> : type`, readable outside any graph."""
    name = f"<{v.name}>" if v.name else ""
    if numbers is not None and v in numbers:
        return f"%{numbers[v]}{name}"
    return f"%?{name} : {v.type}"


def format_node(n: "Node", numbers: Optional[Mapping["Value", int]] = None) -> str:
    """One node as `outs = op(args) {attrs}`; values numbered by `numbers` (the node's graph's
    number_values); without it, the node is numbered on its own (inputs, then outputs)."""
    if numbers is None:
        numbers = {}
        for v in (*n.inputs, *n.outputs):
            numbers.setdefault(v, len(numbers))
    outs = ", ".join(f"{format_value(o, numbers)} : {o.type}" for o in n.outputs)
    args = ", ".join(format_value(v, numbers) for v in n.inputs)
    attrs = ", ".join(f"{k}={_fmt_attr(v)}" for k, v in n.attrs.items())
    return f"{outs} = {n.op}({args})" + (f" {{{attrs}}}" if attrs else "")


def format_graph(g: "Graph", notes: Optional[Mapping[int, str]] = None) -> str:
    """The graph as text; `notes` (node index -> text, e.g. the model line a node came from)
    are appended to their nodes' lines as comments."""
    notes = notes or {}
    numbers = number_values(g)
    lines = ["graph("]
    owner = dict(g.owners)
    for v, role in zip(g.inputs, g.roles):
        of = f" of {format_value(owner[v], numbers)}" if v in owner else ""
        lines.append(f"    {format_value(v, numbers)} : {v.type},  # {role.value}{of}")
    lines.append(") {")
    lines += [f"  {i:4d}: {format_node(n, numbers)}" + (f"  # {notes[i]}" if i in notes else "")
              for i, n in enumerate(g.nodes)]
    lines.append("  return " + ", ".join(f"{name}={format_value(v, numbers)}"
                                         for name, v in zip(g.output_names, g.outputs)))
    lines.append("}")
    return "\n".join(lines)
