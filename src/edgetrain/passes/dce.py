"""Dead code elimination: keep only the nodes the graph outputs need."""
from __future__ import annotations

from ..ir import Graph
from ..ops import get_op


def eliminate_dead_code(g: Graph) -> Graph:
    live = set(g.outputs)
    kept = []
    for n in reversed(g.nodes):
        if any(o in live for o in n.outputs) or get_op(n.op).mutates:
            kept.append(n)
            live.update(n.inputs)
    return g.replace(nodes=tuple(reversed(kept)))
