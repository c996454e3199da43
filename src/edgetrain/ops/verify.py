"""The IR verifier: single assignment, defined before use, re-inferred types, no read
after an in-place overwrite. Tests run it after every pass."""
from __future__ import annotations

from ..ir import Graph
from ..ir.printer import format_value, number_values
from .base import get_op


class VerificationError(ValueError):
    pass


def verify(g: Graph) -> Graph:
    """Check `g` and return it unchanged; raise VerificationError naming the node otherwise.
    Values are named as `str(g)` prints them (numbered per graph)."""
    def fmt(v):  # only on an error: numbering the values costs a pass over the graph
        return format_value(v, number_values(g))

    defined = set()
    names = set()
    for v in g.inputs:
        if v in defined:
            raise VerificationError(f"graph input {fmt(v)} listed twice")
        if not v.name or v.name in names:
            raise VerificationError(f"graph input {fmt(v)} needs a unique name")
        names.add(v.name)
        defined.add(v)
    clobbered = {}
    for i, n in enumerate(g.nodes):
        where = f"node {i} ({n.op})"
        try:
            opdef = get_op(n.op)
        except KeyError as err:
            raise VerificationError(f"{where}: {err}") from None
        lo_hi = opdef.num_inputs
        if lo_hi and not (lo_hi[0] <= len(n.inputs) and (lo_hi[1] is None or len(n.inputs) <= lo_hi[1])):
            raise VerificationError(f"{where}: takes {lo_hi} operands, got {len(n.inputs)}")
        for v in n.inputs:
            if v not in defined:
                raise VerificationError(f"{where}: uses {fmt(v)} before it is defined")
            if v in clobbered:
                raise VerificationError(f"{where}: reads {fmt(v)} after node {clobbered[v]} overwrote it in place")
        try:
            types = opdef.infer([v.type for v in n.inputs], n.attrs)
        except (ValueError, KeyError, TypeError) as err:
            raise VerificationError(f"{where}: shape rule failed: {err}") from None
        if [t for t in types] != [o.type for o in n.outputs]:
            raise VerificationError(f"{where}: outputs {[str(o.type) for o in n.outputs]} but the shape rule "
                                    f"gives {[str(t) for t in types]}")
        for o in n.outputs:
            if o in defined:
                raise VerificationError(f"{where}: assigns {fmt(o)} a second time")
            defined.add(o)
        if opdef.mutates:
            for _, j in opdef.shares:
                if j < len(n.inputs):
                    clobbered[n.inputs[j]] = i
    for name, v in zip(g.output_names, g.outputs):
        if v not in defined:
            raise VerificationError(f"output {name} = {fmt(v)} is never defined")
        if v in clobbered:
            raise VerificationError(f"output {name} = {fmt(v)} was overwritten in place by node {clobbered[v]}")
    if len(set(g.output_names)) != len(g.output_names):
        raise VerificationError("output names must be unique")
    return g
