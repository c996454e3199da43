"""Readable text for graphs: one line per node, like a jaxpr."""
from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Optional

if TYPE_CHECKING:
    from .graph import Graph, Node

#: attributes longer than this are abbreviated when printing (channel index lists).
MAX_ATTR_CHARS = 40


def _fmt_attr(v) -> str:
    s = repr(v)
    return s if len(s) <= MAX_ATTR_CHARS else s[: MAX_ATTR_CHARS - 3] + "..."


def format_node(n: "Node") -> str:
    outs = ", ".join(f"{o} : {o.type}" for o in n.outputs)
    args = ", ".join(str(v) for v in n.inputs)
    attrs = ", ".join(f"{k}={_fmt_attr(v)}" for k, v in n.attrs.items())
    return f"{outs} = {n.op}({args})" + (f" {{{attrs}}}" if attrs else "")


def format_graph(g: "Graph", notes: Optional[Mapping[int, str]] = None) -> str:
    """The graph as text; `notes` (node index -> text, e.g. the model line a node came from)
    are appended to their nodes' lines as comments."""
    notes = notes or {}
    lines = ["graph("]
    lines += [f"    {v} : {v.type}," for v in g.inputs]
    lines.append(") {")
    lines += [f"  {i:4d}: {format_node(n)}" + (f"  # {notes[i]}" if i in notes else "") for i, n in enumerate(g.nodes)]
    lines.append("  return " + ", ".join(f"{name}={v}" for name, v in zip(g.output_names, g.outputs)))
    lines.append("}")
    return "\n".join(lines)
